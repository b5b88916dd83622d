"""S3Gen real-time stream capacity: N FlowStreams stepped together by ``codecrt.step_flows`` (issue 19).

The capacity table of ``python -m bench s3gen --capacity 1,10,30``. Each row runs N
FlowStreams (the same random voice, their own random tokens and seeds) on one
context, with the FlowStream's default chunking (a first chunk of ``first_chunk``
tokens, then ``chunk`` tokens, each with 3 tokens of lookahead), in ticks:

* starts together: every tick gives every stream its next chunk's tokens (plus the
  lookahead) and steps all of them in one ``step_flows`` call, which batches the
  flows of equal shape (all of them here, up to CODECRT_MAX_FLOW_BATCH per graph)
  and the vocoder calls of equal length. A later tick's budget is the audio that
  the stream's previous chunk gave, but at least ``chunk`` tokens' worth (1 s at
  25 tokens/s: after the short first chunk a listener's buffer or a token source
  ahead of real time covers the rest, as before): the streams are real time while
  the p99 of the later ticks' walls over their budgets stays at most 1;
* starts staggered over one chunk period (``--stagger G``): the streams are in G
  phases, a tick steps one phase (N / G streams, every stream once per G ticks),
  and its budget is that budget / G.

``--chunk-growth F`` (and ``--max-chunk``) give the streams FlowStream's growing
chunks (CosyVoice's ``stream_scale_factor``): each tick gives a phase the tokens of
its next chunk's ceiling, so chunk k takes ``min(max_chunk, chunk * F**(k-1))``
tokens, as from a token source ahead of real time; a grown chunk recomputes the
flow once for more audio, and its tick has that much more budget.

Time to first audio is the tick that decodes a stream's first chunk (the slowest
such tick of the row) plus the 3 lookahead tokens it waits for at 25 tokens/s:
what a listener waits after the first chunk's last token arrives, tokens coming
in real time. The flow recomputes every token so far at each chunk (full
attention), so a tick costs more the longer the streams have run: --seconds sets
the utterance, and the p99 is that of its last chunks.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mimi import cpu_s, load, machine, ms

TOKENS_PER_S = 25
SAMPLES_PER_TOKEN = 960
SAMPLE_RATE = 24000
LOOKAHEAD = 3  # tokens of right context a chunk waits for (codecrt's FlowStream.LOOKAHEAD)


@dataclass
class Row:
    """One capacity measurement: N streams, G phases, their ticks."""

    model: str
    n: int
    phases: int
    chunks: int = 0                      # later chunks decoded per stream (after the first)
    of_chunks: int = 0                   # later chunks the utterance has
    first: list[float] = field(default_factory=list)   # walls of the ticks with first chunks
    later: list[float] = field(default_factory=list)   # walls of the ticks with later chunks
    budgets: list[float] = field(default_factory=list)  # each later tick's budget, s
    cpu: list[float] = field(default_factory=list)     # process CPU seconds per later tick
    wall: float = 0.0
    audio_s: float = 0.0                 # audio emitted by all streams
    graphs: int = 0
    reservations: int = 0
    recreations: int = 0
    compute_mib: float = 0.0
    largest_batch: int = 0
    #: every tick in order: (wall s, reservations the context made in it, graphs it built)
    ticks: list[tuple[float, int, int]] = field(default_factory=list)

    def budget_ms(self, chunk: int) -> float:
        """The smallest budget of a later tick (every one with chunks of ``chunk`` tokens)."""
        return 1000.0 * min(self.budgets) if self.budgets else 1000.0 * chunk / TOKENS_PER_S / self.phases

    def load(self) -> float:
        """The p99 of the later ticks' walls over their budgets: real time while at most 1."""
        return float(np.percentile(np.divide(self.later, self.budgets), 99)) if self.later else float("nan")

    def real_time(self) -> bool:
        return bool(self.later) and self.load() <= 1.0


def flow_defaults(codecrt: Any) -> tuple[int, int]:
    """The FlowStream's default first chunk and chunk, in tokens."""
    p = inspect.signature(codecrt.FlowStream).parameters
    return int(p["first_chunk"].default), int(p["chunk"].default)


def run_row(codecrt: Any, ctx: Any, voice: Any, name: str, n: int, phases: int, seconds: float,
            max_row_s: float, seed: int, growth: dict[str, Any] | None = None) -> Row:
    """N streams in ``phases`` phases through a whole utterance (or until ``max_row_s``);
    ``growth``: FlowStream's chunk_growth and max_chunk (none: chunks of ``chunk``)."""
    first, chunk = flow_defaults(codecrt)
    n_tok = first + chunk * max(1, math.ceil((seconds * TOKENS_PER_S - first) / chunk))
    tokens = np.random.default_rng(seed).integers(0, 6561, (n, n_tok)).astype(np.int32)
    fss = [codecrt.FlowStream(ctx, voice, seed=seed + i, **(growth or {})) for i in range(n)]
    n_chunks = len(chunk_plan(fss[0], n_tok)) - 1
    groups = [list(range(g, n, phases)) for g in range(phases)]
    pushed = [0] * n
    hops = [0] * phases  # tokens of each phase's previous chunk
    emitted = 0
    row = Row(name, n, phases, of_chunks=n_chunks)
    st0 = ctx.stats
    t_row = time.perf_counter()
    try:
        for s in range(phases * (n_chunks + 1)):
            g, k = s % phases, s // phases
            due = [fss[i] for i in groups[g]]
            sk = ctx.stats
            c0, t0 = cpu_s(), time.perf_counter()
            # a phase's streams are in step: its first stream's next chunk is every one's
            done0 = due[0].tokens_decoded
            target = min(n_tok, done0 + due[0].next_chunk + LOOKAHEAD)
            for i in groups[g]:
                fss[i].push(tokens[i, pushed[i]:target])
                pushed[i] = target
                if target == n_tok:
                    fss[i].finish()
            tick = codecrt.step_flows(ctx, due)
            got = sum(fs.pull().size for fs in due)
            dt = time.perf_counter() - t0
            if tick.errors or tick.stepped != len(due):
                raise RuntimeError(f"{name} N={n} tick {s}: {tick.stepped} of {len(due)} stepped, "
                                   f"errors {tick.errors}")
            emitted += got
            sk1 = ctx.stats
            row.ticks.append((dt, sk1.reservations - sk.reservations, sk1.graphs_built - sk.graphs_built))
            row.largest_batch = max(row.largest_batch, tick.largest_batch)
            if k == 0:
                row.first.append(dt)
            else:
                row.later.append(dt)
                row.budgets.append(max(hops[g], chunk) / TOKENS_PER_S / phases)
                row.cpu.append(cpu_s() - c0)
            hops[g] = due[0].tokens_decoded - done0
            row.chunks = k
            if g == phases - 1 and k >= 3 and time.perf_counter() - t_row > max_row_s:
                break
        row.wall = time.perf_counter() - t_row
        st = ctx.stats
    finally:
        for fs in fss:
            fs.close()
    if row.chunks == n_chunks and emitted != n * n_tok * SAMPLES_PER_TOKEN:
        raise RuntimeError(f"{name} N={n}: {emitted} samples, not {n * n_tok * SAMPLES_PER_TOKEN}")
    row.audio_s = emitted / SAMPLE_RATE
    row.graphs = st.graphs_built - st0.graphs_built
    row.reservations = st.reservations - st0.reservations
    row.recreations = st.sched_recreations - st0.sched_recreations
    row.compute_mib = sum(st.compute_buffer_bytes) / 2**20
    return row


def chunk_plan(fs: Any, n_tok: int) -> list[int]:
    """The tokens of each chunk of an ``n_tok``-token utterance given to ``fs`` (a FlowStream
    not started) a chunk's ceiling at a time, as run_row gives them: the last chunk takes what
    is left once the rest fits in its ceiling and the lookahead."""
    plan: list[int] = []
    while sum(plan) < n_tok:
        hop = fs.chunk_ceiling(len(plan))
        rest = n_tok - sum(plan)
        plan.append(rest if rest <= hop + LOOKAHEAD else hop)
    return plan


def growth_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """FlowStream's chunk_growth and max_chunk from --chunk-growth and --max-chunk (none: 1)."""
    if args.chunk_growth <= 1.0:
        return None
    return {"chunk_growth": args.chunk_growth, "max_chunk": args.max_chunk or None}


def capacity(codecrt: Any, model: Any, voice: Any, name: str, prec: str, args: argparse.Namespace,
             counts: list[int]) -> tuple[list[Row], str]:
    """Every row of one model: a warm-up pass, then N streams together and staggered for each N
    of ``counts``; a start mode stops at its first N that misses real time."""
    _, chunk = flow_defaults(codecrt)
    ctx = codecrt.Context(model, device=args.device, n_threads=args.threads, precision=prec)
    rows: list[Row] = []
    notes = []
    try:
        from codecrt._native import lib

        limit = max(1, min(int(lib.CODECRT_MAX_FLOW_BATCH), ctx.max_batch))
        warm_n = min(max(counts), limit)
        t0 = time.perf_counter()
        try:
            run_row(codecrt, ctx, voice, name, warm_n, 1, args.seconds, args.max_row_s, 1000, growth_of(args))
            warm = f"{time.perf_counter() - t0:.1f} s (untimed)"
        except (RuntimeError, codecrt.CodecrtError) as e:
            warm = f"failed ({type(e).__name__}: {e})"
        notes.append(f"{name}: warm-up pass of {warm_n} stream{'s' * (warm_n > 1)} {warm}; "
                     f"weights {model.info.weight_bytes / 2**20:.0f} MiB, "
                     f"on the device {ctx.stats.weight_bytes / 2**20:.0f} MiB (device weights or BF16 packs)")
        modes = [1] + ([args.stagger] if args.stagger > 1 else [])
        for g in modes:
            for n in counts:
                phases = min(g, n)
                if g > 1 and phases < 2:
                    continue
                try:
                    row = run_row(codecrt, ctx, voice, name, n, phases, args.seconds, args.max_row_s, 0,
                                  growth_of(args))
                except (RuntimeError, codecrt.CodecrtError) as e:
                    notes.append(f"{name} {starts(phases)} N={n}: "
                                 f"failed ({type(e).__name__}: {e}); larger N skipped")
                    print(notes[-1], flush=True)
                    break
                rows.append(row)
                # as it comes, so that a run cut short still tells what it measured
                print(f"capacity row: {name} {prec} {starts(phases)} N={n}: "
                      f"tick p99 {ms(row.later or [0.0], 99):.1f} ms, "
                      f"budget {row.budget_ms(chunk):.0f} ms or more, load {row.load():.2f}, real time {'yes' if row.real_time() else 'no'}, "
                      f"first tick {1000 * max(row.first):.1f} ms, {row.wall:.1f} s", flush=True)
                if not row.real_time():
                    bigger = [c for c in counts if c > n]
                    if bigger:
                        notes.append(f"{name} {starts(row.phases)}: N={','.join(map(str, bigger))} skipped "
                                     f"(N={n} missed real time)")
                    break
    finally:
        ctx.close()
    return rows, "\n".join(notes)


def starts(phases: int) -> str:
    return "together" if phases == 1 else f"staggered/{phases}"


def print_capacity(rows: list[Row], notes: list[str], codecrt: Any, args: argparse.Namespace,
                   prec: str) -> None:
    first, chunk = flow_defaults(codecrt)
    chunk_ms = 1000.0 * chunk / TOKENS_PER_S
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print()
    print(f"## real-time capacity, {prec}: N FlowStreams stepped by codecrt.step_flows, "
          f"{args.seconds:.1f} s utterances after a {args.prompt:.1f} s prompt")
    print(f"{machine(args.device)} · device {args.device}, {args.threads} threads · codecrt {codecrt.version()} · "
          f"{stamp} · load average {load()} · `{' '.join(sys.argv)}`")
    g = growth_of(args)
    grown = ("" if g is None else
             f", growing by {g['chunk_growth']:g} a chunk up to {g['max_chunk'] or codecrt.FlowStream.default_max_chunk(chunk)} tokens "
             "(each tick gives a phase its next chunk's ceiling)")
    print(f"first chunk {first} tokens ({1000 * first / TOKENS_PER_S:.0f} ms of audio), later chunks {chunk} "
          f"tokens ({chunk_ms:.0f} ms){grown}, {LOOKAHEAD} tokens of lookahead; a tick steps every stream "
          f"(together) or one of G phases (staggered/G); a later tick's budget is the audio of the phase's "
          f"previous chunk, at least {chunk_ms:.0f} ms, over G (budget ms: the smallest); load = the p99 of "
          f"tick / budget, real time while <= 1; tick ms and CPU ms "
          f"over the later chunks' ticks; x RT aggregate = audio of all streams / the row's wall time; TTFA = slowest first-chunk tick + {LOOKAHEAD} lookahead tokens "
          f"({1000 * LOOKAHEAD / TOKENS_PER_S:.0f} ms)")
    print("| model | starts | N | chunks | tick ms median | p99 | budget ms | load | real time | x RT aggregate "
          "| first tick ms | TTFA ms | CPU ms / tick | largest batch | graphs built | reservations "
          "| recreations | compute buffers MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cut = "" if r.chunks == r.of_chunks else f" of {r.of_chunks} (cut)"
        later = r.later or [float("nan")]
        print(f"| {r.model} | {starts(r.phases)} | {r.n} | {r.chunks}{cut} | {ms(later, 50):.1f} | {ms(later, 99):.1f} | "
              f"{r.budget_ms(chunk):.0f} | {r.load():.2f} | {'yes' if r.real_time() else 'no'} | "
              f"{r.audio_s / r.wall:.1f} | {1000 * max(r.first):.1f} | "
              f"{1000 * max(r.first) + 1000 * LOOKAHEAD / TOKENS_PER_S:.1f} | "
              f"{1000 * float(np.mean(r.cpu or [float('nan')])):.1f} | {r.largest_batch} | {r.graphs} | {r.reservations} | "
              f"{r.recreations} | {r.compute_mib:.0f} |")
    for line in notes:
        if line:
            print(line)
    # which ticks are slow: the later chunks' (the flow recomputes every token so far) or the
    # ones that re-planned compute buffers
    for r in rows:
        print(f"{r.model} {starts(r.phases)} N={r.n}: ticks ms (reservations, graphs built): " +
              ", ".join(f"{1e3 * w:.0f} ({k}, {b})" for w, k, b in r.ticks))
    for model in dict.fromkeys(r.model for r in rows):
        best: dict[str, int] = {}
        for r in rows:
            if r.model == model and r.real_time():
                mode = "together" if r.phases == 1 else "staggered"
                best[mode] = max(best.get(mode, 0), r.n)
        said = ", ".join(f"{k} {v}" for k, v in best.items()) or "none of the rows"
        print(f"largest N in real time, {model} {prec}: {said}")
