"""``codecd serve --fronts F``: the serve load test through one daemon with F front processes.

    python -m bench fronts --spawn demo --fronts 1,2 --n 8,16 [--serve-arg=--threads=1]
    python -m bench fronts --spawn demo --fronts 2 --n 1 --kill-worker 3   # recovery
    python -m bench fronts --spawn demo --fronts 1,4,8 --n 256,512,768,1000,1200 \\
        --per-conn 8 --client-procs 8 --serve-arg=--devices=cuda:0 ...       (bench/gpu/run.sh)
    ... --server-cpus 0-7     the daemon on CPUs 0-7, the load generator on the rest
    python -m bench fronts --spawn mimi --model mimi --fronts 4 --n 512,768 ...  # Mimi (issue 20)
    python -m bench fronts --spawn mimi --model mimi --fronts 1 --n 1 --kill-worker 2  # Mimi recovery

For each F, one ``codecd serve --fronts F`` is started (``--spawn``: a GGUF path or
``demo``) and the load of ``python -m bench serve`` (real-time Orpheus-id streams,
7 tokens per message, starts spread over a frame period, or ``--ramp S`` seconds) runs at each N through
it (``--spawn mimi`` / ``qwen3``: the released-size decoder with random weights, streams of
8 / 16 codebooks in the levels layout, one 80 ms frame a JSON message). One row per (F, N):
time to first audio p50/p99, inter-chunk gap p99, underruns with no buffer and with
``codecd play``'s 200 ms jitter buffer (``primed_play``: the player starts once 200 ms of
audio is buffered and plays on after an underrun), busy
refusals and errors, websocket messages per second (token messages in + audio messages out,
counted at the clients), the worker's tick time p99 and mean batch (recent ticks, from
``/metrics``), and CPU (cores = CPU seconds / wall seconds) of main, of each front, and of
the worker. A second table splits the worker's ticks into their parts (``codecd.anatomy``),
for the mean tick and the slowest tenth. After the tables, per row: where the late frames of
the 200 ms buffer fall (arrival time, frame index, connections); when ``codecd play`` starts
playing after the first tokens, and the late frames of the fixed-delay player on the same
arrivals; and, with ``CODECD_TICK_TRACE=PATH`` in the bench's environment (the daemon
inherits it), the worker's rounds by what started them and the share of stream-steps that
missed their round (``trace_summary``). The criterion is the serve suite's (p99 gap exceeds
the period by less than one period, no refusals, no errors) plus zero underruns with the
200 ms buffer; the last lines name the largest N that meets it per F.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve import (  # noqa: E402
    ORPHEUS,
    Load,
    RunResult,
    levels_load,
    log_summary,
    run_load,
    spawn_server,
)

PRIME_S = 0.2
UNANSWERED: list[str] = []  # /metrics requests the daemon did not answer, printed after the rows


def light_model() -> Path:
    """A random SNAC with the 24 kHz layout (hop 512, strides 4/2/1, 4096 codes) and 64 decoder
    channels, written once under the system's temp dir."""
    return small_snac24("light", latent_dim=32, decoder_dim=64)


def levels_model(kind: str, codebooks: int = 0) -> tuple[Path, Load]:
    """The released-size Mimi (``codebooks`` of its 32 per stream, default 8 as Moshi sends) or
    Qwen3 tokenizer decoder (default 16 codebooks) with seeded random weights, written once under
    the system's temp dir, and the load its streams send (one 80 ms frame per message)."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"codecd-bench-{kind}.gguf"
    if kind == "mimi":
        from codecd.convert.random_mimi import write_random_mimi as write
        load = levels_load(codebooks or 8, 2048)
    else:
        from codecd.convert.random_qwen3 import write_random_qwen3 as write
        load = levels_load(codebooks or 16, 2048)
    if not path.exists():
        write(path, seed=1)
    return path, load


def small_snac24(name: str, latent_dim: int, decoder_dim: int) -> Path:
    """A random SNAC with the 24 kHz layout and the given widths (a cheaper decode than the
    real one), written once under the system's temp dir."""
    import tempfile

    from codecd.config import DEMO_SNAC
    from codecd.convert.random_snac import write_random_snac

    path = Path(tempfile.gettempdir()) / f"codecd-bench-{name}-snac24.gguf"
    if not path.exists():
        write_random_snac(path, dict(DEMO_SNAC, latent_dim=latent_dim, decoder_dim=decoder_dim),
                          name=f"snac_{name}_random")
    return path


def _cpu(pid: int) -> float:
    tck = os.sysconf("SC_CLK_TCK")
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = raw[raw.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / tck


def _children(pid: int) -> dict[str, list[int]]:
    """The daemon's children by role: "front" and "worker" pids."""
    out: dict[str, list[int]] = {"front": [], "worker": []}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2:].split()[1]) != pid:
            continue
        if b"codecd.front" in cmd:
            out["front"].append(int(d))
        elif b"codecd.worker" in cmd:
            out["worker"].append(int(d))
    return out


def late_frames(r: RunResult, prime_s: float = PRIME_S,
                sample_rate: int = ORPHEUS.sample_rate) -> list[tuple[float, int, int]]:
    """The underruns of a player that starts ``prime_s`` after the first frame (and again
    after each underrun): frames that arrive after the audio before them has played out.
    One (arrival time.monotonic(), frame index, connection index) per underrun."""
    out = []
    for s in r.streams:
        if not s.gaps:
            continue
        frame_s = s.samples / (len(s.gaps) + 1) / sample_rate
        t = 0.0
        start, played = prime_s, 0.0  # playout clock: starts at `start`, has `played` queued
        for i, g in enumerate(s.gaps):
            t += g
            played += frame_s
            if t > start + played:  # the buffer ran dry before this frame came
                out.append((s.t_first + t, i + 1, s.conn))
                start, played = t + prime_s, 0.0
    return out


def primed_play(r: RunResult, prime_s: float = PRIME_S, sample_rate: int = ORPHEUS.sample_rate
                ) -> tuple[list[float], list[tuple[float, int, int]]]:
    """``codecd play``'s player (``JitterBuffer``: it starts once ``prime_s`` of audio is
    buffered, and after an underrun plays on as audio comes, without priming again), fed each
    stream's frames as they arrived: (seconds from each stream's first tokens sent to its
    playback start; one (arrival time.monotonic(), frame index, connection) per frame that
    came after the audio before it had played out). The criterion's 200 ms buffer.

    ``late_frames`` is the other player: it starts ``prime_s`` after the first frame, however
    little that frame holds. Where a stream's first audio comes early (an express tick) and
    the frames after it keep the cadence, that player has up to a period less in hand for
    the rest of the stream; this one waits for the audio instead."""
    starts: list[float] = []
    late: list[tuple[float, int, int]] = []
    prime = prime_s * sample_rate
    for s in r.streams:
        if s.ttfa is None or not s.sizes:
            continue
        arrivals = np.cumsum([0.0, *s.gaps])  # from the first frame
        got = 0  # samples arrived
        start = played = None  # playout from `start` (s), `played` samples out before it
        for i, (t, n) in enumerate(zip(arrivals, s.sizes)):
            if start is None:
                got += n
                if got >= prime or i == len(s.sizes) - 1:
                    start, played = float(t), 0
                    starts.append(s.ttfa + float(t))
                continue
            if t > start + (got - played) / sample_rate:  # ran dry before this frame came
                late.append((s.t_first + float(t), i, s.conn))
                start, played = float(t), got  # plays on from here
            got += n
    return starts, late


def late_summary(r: RunResult, late: list[tuple[float, int, int]], n_frames: int) -> str:
    """Where a row's late frames (200 ms buffer) fall, to tell a stall of the whole daemon
    (many streams late at one moment) from one connection's or one edge's: their arrival
    in 100 ms bins from the row's first audio (the fullest bins), their frame index in the
    stream (first, last, between) and how many connections they touch."""
    if not late:
        return "none"
    t0 = min(s.t_first for s in r.streams if s.ttfa is not None)
    bins = Counter(int((t - t0) * 10) for t, _, _ in late)
    top = bins.most_common(4)
    first = sum(i <= 2 for _, i, _ in late)
    last = sum(i >= n_frames - 2 for _, i, _ in late)
    conns = len({c for _, _, c in late})
    return (f"{len(late)} late at " + ", ".join(f"{b / 10:.1f}-{(b + 1) / 10:.1f} s: {k}" for b, k in top)
            + f" (of {len(bins)} bins); frame index <= 2: {first}, within 2 of the end: {last}, "
            f"between: {len(late) - first - last}; {conns} connection(s)")


def trace_summary(prefix: str, t0: float, t1: float) -> str:
    """The tick trace (CODECD_TICK_TRACE=prefix in the daemon's environment: docs/server.md)
    of the rounds that started between t0 and t1 (time.monotonic(), the machine's clock):
    rounds by what started them, and in the steady rounds (at least 90 % of the row's most
    open streams, express rounds aside, less the first and last 3, where streams are still
    starting or ending) the stream-steps missed: streams open but not in the round, whose audio
    then comes a period later, or sooner from a catch-up tick (tick_catch_up; their steps in
    those ticks are counted, over the whole row)."""
    rows = []
    for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".worker*")):
        for line in path.read_text().splitlines():
            f = line.split()
            if len(f) == 7 and not line.startswith("#") and t0 <= float(f[0]) <= t1:
                rows.append((int(f[3]), int(f[4]), f[6]))
    if not rows:
        return "tick trace: no rounds"
    by = Counter(trig for _, _, trig in rows)
    top = max(o for o, _, _ in rows)
    steady = [(o, s) for o, s, trig in rows
              if trig not in ("express", "catch-up") and o >= 0.9 * top][3:-3]
    opened = sum(o for o, _ in steady)
    missed = sum(o - s for o, s in steady if o > s)
    share = f"{100 * missed / opened:.1f} %" if opened else "-"
    caught = sum(s for _, s, trig in rows if trig == "catch-up")
    return (f"tick trace: {len(rows)} rounds (" + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
            + f"); steady rounds {len(steady)}, stream-steps missed {missed} of {opened} ({share}); "
            f"stream-steps in catch-up ticks {caught}")


def tick_stats(url: str) -> tuple[float, float]:
    """(tick p99 ms, mean batch) of the recent ticks, from /metrics."""
    m = _metrics(url)
    return m.get("tick_p99_ms", 0.0), m.get("batch", 0.0)


def _metrics(url: str) -> dict[str, float]:
    """What the rows use of /metrics: tick p99 (ms), mean batch, and the counters whose
    differences over a run give the worker's time per phase, its ticks and its graphs."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as e:  # a row still prints, without the daemon's side, and says so
        UNANSWERED.append(f"/metrics unanswered at {time.strftime('%H:%M:%S')}: {e}")
        print(UNANSWERED[-1], file=sys.stderr, flush=True)
        return out
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        v = float(value) if value and not line.startswith("#") else 0.0
        if name.startswith("codecd_tick_seconds_p99{"):
            out["tick_p99_ms"] = max(out.get("tick_p99_ms", 0.0), 1e3 * v)
        elif name.startswith("codecd_batch_size_recent{"):
            out["batch"] = max(out.get("batch", 0.0), v)
        elif name.startswith("codecd_worker_phase_seconds_total{"):
            phase = name.split('phase="')[1].split('"')[0]
            out[phase] = out.get(phase, 0.0) + v
        elif name.startswith(("codecd_tick_part_seconds{", "codecd_tick_part_mean{")):
            which = name.split('ticks="')[1].split('"')[0]
            part = name.split('part="')[1].split('"')[0]
            scale = 1e3 if name.startswith("codecd_tick_part_seconds") else 1.0
            out[f"{which}.{part}"] = max(out.get(f"{which}.{part}", 0.0), scale * v)
        elif name.startswith(("codecd_front_loop_late_seconds_bucket{",
                              "codecd_front_gc_pause_seconds_bucket{")):
            kind = "loop" if "loop_late" in name else "gc"
            le = name.split('le="')[1].split('"')[0]
            out[f"{kind}.{le}"] = out.get(f"{kind}.{le}", 0.0) + v  # summed over the fronts
        elif name.startswith("codecd_ticks_total{"):
            out["ticks"] = out.get("ticks", 0.0) + v
        elif name.startswith("codecd_graph_total{") and 'counter="computes"' in name:
            out["computes"] = out.get("computes", 0.0) + v
    return out


def stall_note(m0: dict[str, float], m1: dict[str, float]) -> str:
    """The fronts' stalls over a run (codecd.stalls, summed over the fronts): how many of their
    event loops' 5 ms wake-ups came more than 5 and 20 ms late and the largest lateness's
    bucket, and the same for their garbage collections."""
    parts = []
    for kind, what in (("loop", "event-loop wake-ups"), ("gc", "collections")):
        les = sorted((k.split(".", 1)[1] for k in m1 if k.startswith(kind + ".")),
                     key=lambda le: float(le))
        if not les:
            return "the fronts' stalls: not in /metrics (one front, or an older daemon)"
        cum = {le: m1.get(f"{kind}.{le}", 0.0) - m0.get(f"{kind}.{le}", 0.0) for le in les}
        total = cum[les[-1]]
        over5 = total - cum.get("0.005", 0.0)
        over20 = total - cum.get("0.02", 0.0)
        if total <= 0:
            parts.append(f"{what}: none")
            continue
        top = next((le for i, le in enumerate(les) if cum[le] == total), les[-1])
        lo = next((les[i - 1] for i, le in enumerate(les) if le == top and i > 0), "0")
        parts.append(f"{what} {int(total)}, over 5 ms {int(over5)}, over 20 ms {int(over20)}, "
                     f"largest in ({1e3 * float(lo):g}, {1e3 * float(top):g}] ms")
    return "the fronts' stalls (all fronts): " + "; ".join(parts)


def phase_cell(m0: dict[str, float], m1: dict[str, float]) -> tuple[str, str]:
    """(the worker's ms per tick in ingest/step/collect/flush, graphs computed per tick) over a
    run, from two /metrics snapshots."""
    ticks = m1.get("ticks", 0.0) - m0.get("ticks", 0.0)
    if ticks <= 0:
        return "-", "-"
    ms = [1e3 * (m1.get(k, 0.0) - m0.get(k, 0.0)) / ticks
          for k in ("ingest", "step", "collect", "flush")]
    graphs = (m1.get("computes", 0.0) - m0.get("computes", 0.0)) / ticks
    return " / ".join(f"{x:.1f}" for x in ms), f"{graphs:.2f}"


ANATOMY_PARTS = ("total", "launch", "acquire", "inputs", "enqueue", "overlap", "wait", "collect",
                 "gc", "late", "graphs", "grew", "batch")
ANATOMY_HEADER = ("| fronts | N | ticks | " + " | ".join(
    f"{p}{' ms' if p not in ('graphs', 'grew', 'batch') else ''}" for p in ANATOMY_PARTS)
    + " |\n|---|---|---|" + "---|" * len(ANATOMY_PARTS))


def anatomy_rows(nf: int, n: int, m: dict[str, float]) -> list[str]:
    """The worker's tick anatomy (codecd.anatomy, the last 1,024 ticks of the busiest model)
    as two rows: the mean tick and the mean of the slowest tenth."""
    rows = []
    for which in ("all", "slowest"):
        cells = " | ".join(f"{m.get(f'{which}.{p}', 0.0):.1f}" for p in ANATOMY_PARTS)
        rows.append(f"| {nf} | {n} | {which} | {cells} |")
    return rows


def _cpu_list(text: str) -> set[int]:
    """CPUs of a taskset-style list ("0-7,12")."""
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def _serve_value(args: list[str], flag: str, default: str) -> str:
    """The value of ``--flag=V`` (or ``--flag V``) among codecd serve's arguments."""
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return default


def levels_feed(n: int, ticks: int, load: Load, rng) -> Callable[[int, list], None]:
    """``bench.worker.run_runtime_alone``'s feed for a levels model (Mimi, Qwen3): one frame of
    ``load.codebooks`` codes pushed per stream per tick."""
    import codecrt

    k = load.codebooks
    codes = rng.integers(0, load.codebook_size, (4 + ticks, n, k), dtype=np.int32)
    n_levels = np.full(n, k, dtype=np.uint32)
    lengths = np.ones(n * k, dtype=np.uint32)

    def feed(t: int, ss: list) -> None:
        # one packed push of all N, as the worker pushes a tick's PUSH records
        errors = codecrt.push_many(ss, n_levels, lengths, codes[t].ravel())
        if errors:
            raise RuntimeError(f"tick {t}: push failed: {next(iter(errors.values()))}")
    return feed


def runtime_alone(source: str, ns: list[int], serve_args: list[str], ticks: int,
                  load: Load = ORPHEUS) -> dict[int, float]:
    """N -> p99 tick (s) of the runtime alone (``bench.worker.run_runtime_alone``, with
    ``levels_feed`` for a levels model: N streams stepped in one process, one ``push_many``
    and one ``pull_many`` of all N a tick, as the worker does) on the daemon's device, threads and batch limit, so that the daemon's largest N has
    the runtime's beside it."""
    import numpy as np

    from bench.worker import model_path, run_runtime_alone

    path = source if load.layout == "levels" else model_path(source)
    device = _serve_value(serve_args, "--devices", "auto").split(",")[0]
    threads = int(_serve_value(serve_args, "--threads", "0"))
    max_batch = int(_serve_value(serve_args, "--max-batch", "0"))
    bucket = _serve_value(serve_args, "--batch-shapes", "auto") == "pow2"  # as the daemon: auto is exact
    rng = np.random.default_rng(0)
    out = {}
    for n in ns:
        levels = load.layout == "levels"
        t = run_runtime_alone(path, n, ticks, device, threads, rng, max_batch=max_batch or n,
                              batch_bucket=bucket, chunk_frames=1 if levels else 0,
                              feed=levels_feed(n, ticks, load, rng) if levels else None)
        out[n] = float(np.percentile(t, 99))
        print(f"runtime alone: {n} streams on {device}, tick p99 {1e3 * out[n]:.1f} ms",
              file=sys.stderr, flush=True)
    return out


def runtime_capacity(measure: Callable[[list[int]], dict[int, float]], ns: list[int], period: float,
                     limit: int, step: float = 1.125) -> tuple[dict[int, float], bool]:
    """The runtime alone at the rows' N (``measure``: N list -> p99 tick s each), then, while the
    largest is in real time, at N a ``step`` larger (at least one more; a multiple of 8 from 64
    up) up to ``limit``: the rows' N alone would put the ratio's denominator at the largest N the daemon was tried with, not
    at what the runtime holds (an H100 on 2026-12-06: the rows stopped at 1,600, the runtime held
    2,000). Returns (N -> p99 s, whether a miss bounds the largest real-time N)."""
    alone = dict(measure(ns))
    n = max(ns)
    while alone[n] < period and n < limit:
        m = max(n + 1, math.ceil(round(n * step, 6)))
        n = min(limit, -(-m // 8) * 8 if m >= 64 else m)
        alone.update(measure([n]))
    return alone, alone[n] >= period


async def _first_audio(url: str, model: str, n_frames: int = 8, load: Load = ORPHEUS) -> bool:
    """One stream of ``n_frames`` random frames (SNAC's three levels, or ``load.codebooks``
    codebooks of a levels model); True at its first audio, False on an error."""
    import json

    import numpy as np
    from websockets.asyncio.client import connect

    rng = np.random.default_rng(0)
    async with connect(url + "/", open_timeout=5) as ws:
        await ws.recv()
        start = {"type": "start", "stream_id": "r", "model": model, "layout": "levels"}
        if load.layout == "levels":
            start["codebooks"] = load.codebooks
        await ws.send(json.dumps(start))
        if load.layout == "levels":
            levels = [rng.integers(0, load.codebook_size, n_frames).tolist()
                      for _ in range(load.codebooks)]
        else:
            levels = [rng.integers(0, 4096, n_frames // s).tolist() for s in (4, 2, 1)]
        await ws.send(json.dumps({"type": "tokens", "stream_id": "r", "levels": levels}))
        await ws.send(json.dumps({"type": "end", "stream_id": "r"}))
        while True:
            m = await ws.recv()
            if isinstance(m, bytes):
                return True
            if json.loads(m)["type"] in ("error", "done"):
                return False


def restart_times(url: str, daemon_pid: int, model: str, kills: int, gap_s: float,
                  load: Load = ORPHEUS) -> list[float]:
    """SIGKILL the worker ``kills`` times, ``gap_s`` apart: seconds from each kill to the
    first audio of a new stream (retried while the daemon answers busy)."""
    import asyncio
    import signal

    out = []
    for _ in range(kills):
        (worker,) = _children(daemon_pid)["worker"]
        t0 = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        while True:
            try:
                if asyncio.run(_first_audio(url, model, load=load)):
                    break
            except Exception:  # noqa: BLE001 - refused upgrade (503) while restarting
                pass
            if time.monotonic() - t0 > 120:
                raise SystemExit("no audio within 120 s of the kill")
            time.sleep(0.05)
        out.append(time.monotonic() - t0)
        time.sleep(gap_s)
    return out


HEADER = ("| fronts | N | TTFA p50 ms | TTFA p99 ms | gap p99 ms | underruns | underruns 200 ms "
          "| busy | errors | msgs/s | tick p99 ms | batch | graphs/tick "
          "| worker ms/tick ingest / step / collect / flush | CPU main | CPU per front "
          "| CPU worker | ok |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
          "---|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spawn", required=True, metavar="SOURCE",
                    help="model source: a GGUF, demo, or light (SNAC 24 kHz layout and rates, "
                    "64 decoder channels: a cheap decode, so the fronts are what is measured); "
                    "mimi or qwen3: the released-size decoder with random weights, streams of "
                    "8 (Mimi) or 16 (Qwen3) codebooks in the levels layout, one 80 ms frame a "
                    "message (give --model the same name)")
    ap.add_argument("--model", default="snac_24khz")
    ap.add_argument("--codebooks", type=int, default=0,
                    help="codebooks per stream with --spawn mimi / qwen3 (default 8 / 16)")
    ap.add_argument("--fronts", default="1,2", help="comma-separated front counts")
    ap.add_argument("--n", default="8,16", help="comma-separated stream counts")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for codecd serve (repeatable)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--per-conn", type=int, default=1)
    ap.add_argument("--ramp", type=float, default=0.0, metavar="S",
                    help="start each row's streams over S seconds (default: over one frame period)")
    ap.add_argument("--client-procs", type=int, default=1)
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("--server-log", default="", metavar="PATH",
                    help="the spawned daemon's log file (its port is added to the name; default: a temporary file); its warnings and errors are printed after the rows")
    ap.add_argument("--repeat", type=int, default=1, help="runs per (fronts, N)")
    ap.add_argument("--kill-worker", type=int, default=0, metavar="K",
                    help="after the load: SIGKILL the worker K times and time a new stream's "
                    "first audio after each (recovery)")
    ap.add_argument("--kill-gap", type=float, default=3.0, help="seconds between the kills")
    ap.add_argument("--runtime-ticks", type=int, default=20,
                    help="ticks of the runtime alone per N, timed after the daemon rows on the "
                    "same device (0: skip); the ratio daemon/runtime is printed")
    ap.add_argument("--runtime-max", type=int, default=0, metavar="N",
                    help="while the runtime alone holds the largest N, try it 12.5%% larger up to "
                    "N streams, so that the ratio's denominator is what it holds (default: twice "
                    "the largest N; the largest N: no probe)")
    ap.add_argument("--server-cpus", default="", metavar="LIST",
                    help="CPUs for the daemon (taskset's list form, e.g. 0-7); the load "
                    "generator then runs on the others, so that it takes no core from the daemon")
    args = ap.parse_args()
    source = args.spawn
    server_cpus = _cpu_list(args.server_cpus) if args.server_cpus else set()
    client_cpus = os.sched_getaffinity(0) - server_cpus
    load = ORPHEUS
    if args.spawn == "light":
        args.spawn = str(light_model())
    elif args.spawn in ("mimi", "qwen3"):
        path, load = levels_model(args.spawn, args.codebooks)
        args.spawn = str(path)
    period = load.period
    base_args = list(args.serve_arg)
    rows: list[str] = []
    best: dict[int, int] = {}
    recov: list[str] = []
    anatomy: list[str] = []
    logs: list[str] = []
    lates: list[str] = []  # where each row's late frames fall (and its tick trace's summary)
    trace = os.environ.get("CODECD_TICK_TRACE")  # the daemon inherits it
    print(HEADER, file=sys.stderr, flush=True)
    for nf in (int(x) for x in args.fronts.split(",")):
        args.serve_arg = [*base_args, f"--fronts={nf}"]
        if server_cpus:  # the daemon inherits this affinity, the clients the one after
            os.sched_setaffinity(0, server_cpus)
        proc, url = spawn_server(args.spawn, args)
        if server_cpus:
            os.sched_setaffinity(0, client_cpus)
        try:
            kids = _children(proc.pid)
            for n in (int(x) for x in args.n.split(",")):
                for _ in range(args.repeat):
                    pids = [proc.pid, *kids["front"], *kids["worker"]]
                    c0 = {p: _cpu(p) for p in pids}
                    m0 = _metrics(url)
                    t_row = time.monotonic()
                    r = run_load([url], args.model, n, args.seconds, args.speed, args.per_conn,
                                 None, [], args.ramp + args.seconds / args.speed + 120.0,
                                 args.client_procs, load, ramp=args.ramp)
                    c1 = {p: _cpu(p) for p in pids}
                    cores = {p: (c1[p] - c0[p]) / r.wall for p in pids}
                    m1 = _metrics(url)
                    p99, batch = m1.get("tick_p99_ms", 0.0), m1.get("batch", 0.0)
                    phases, graphs = phase_cell(m0, m1)
                    msgs = sum(len(s.gaps) + 1 for s in r.streams if s.ttfa is not None)
                    n_frames = max(1, int(round(args.seconds / period)))  # per stream
                    msgs += n * n_frames
                    starts, late = primed_play(r, sample_rate=load.sample_rate)
                    bu = len(late)
                    notes = [late_summary(r, late, n_frames)]
                    g_first, g_later = r.gap_p99_split()
                    notes.append(f"gap p99 after the first audio {1e3 * g_first:.1f} ms, "
                                 f"later gaps {1e3 * g_later:.1f} ms")
                    notes.append(f"the clients' sends behind their schedule: p99 "
                                 f"{1e3 * r.send_lag(99):.1f} ms, largest {1e3 * r.send_lag(100):.1f} "
                                 f"ms (codes sent late reach the daemon late: the load "
                                 f"generator's lag, not the daemon's)")
                    if starts:
                        fixed = late_frames(r, sample_rate=load.sample_rate)
                        notes.append(f"codecd play starts playing p50 "
                                     f"{1e3 * np.percentile(starts, 50):.1f} ms, p99 "
                                     f"{1e3 * np.percentile(starts, 99):.1f} ms after the first "
                                     f"tokens; a player that starts {1e3 * PRIME_S:.0f} ms after "
                                     f"the first frame would have {len(fixed)} late frames")
                    if args.ramp > 0:
                        notes.append(f"starts over {args.ramp:g} s; the later half's TTFA p50 "
                                     f"{1e3 * r.ttfa_later_half(50):.1f} ms, p99 "
                                     f"{1e3 * r.ttfa_later_half(99):.1f} ms")
                    notes.append(stall_note(m0, m1))
                    if trace:
                        notes.append(trace_summary(trace, t_row, time.monotonic()))
                    notes = [f"fronts {nf}, N {n}: {x}" for x in notes]
                    lates.extend(notes)
                    ok = r.ok and bu == 0
                    if ok:
                        best[nf] = max(best.get(nf, 0), n)
                    fronts = " ".join(f"{cores[p]:.2f}" for p in kids["front"])
                    row = (f"| {nf} | {n} | {1e3 * r.ttfa(50):.1f} | {1e3 * r.ttfa(99):.1f} | "
                           f"{1e3 * r.gap_p99():.1f} | {r.underruns} | {bu} | {r.refused} | "
                           f"{r.errors} | {msgs / r.wall:.0f} | {p99:.1f} | {batch:.1f} | "
                           f"{graphs} | {phases} | "
                           f"{cores[proc.pid]:.2f} | {fronts} | "
                           f"{sum(cores[p] for p in kids['worker']):.2f} | "
                           f"{'yes' if ok else 'no'} |")
                    rows.append(row)
                    anatomy.extend(anatomy_rows(nf, n, m1))
                    print(row, file=sys.stderr, flush=True)
                    print("\n".join(notes), file=sys.stderr, flush=True)
                    time.sleep(1.0)
            if args.kill_worker:
                ts = restart_times(url, proc.pid, args.model, args.kill_worker, args.kill_gap,
                                   load)
                recov.append(f"fronts {nf}: worker SIGKILL -> a new stream's first audio: "
                             + ", ".join(f"{t:.2f} s" for t in ts))
                print(recov[-1], file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            logs.append(f"fronts {nf}: " + log_summary(proc))
    print(f"\n{args.seconds:g} s utterances of {load.describe()} at {args.speed:g}x real time, "
          f"{args.per_conn} stream(s) per connection, clients in {args.client_procs} "
          f"process(es); frame period {1e3 * period:.1f} ms; starts over "
          f"{max(period, args.ramp):g} s; one daemon per row group\n")
    print(HEADER)
    for row in rows:
        print(row)
    print("\nwhere the worker's ticks go (codecd_tick_part_*: the last 1,024 ticks of the daemon, "
          "so a row includes earlier rows' ticks when they were fewer; launch = step_begin, "
          "overlap = the fronts' pushes read while the device computes, wait = step_end, "
          "late = start behind the tick boundary)\n")
    print(ANATOMY_HEADER)
    for row in anatomy:
        print(row)
    print("\nlate frames with the 200 ms buffer: arrival from the row's first audio (100 ms "
          "bins, the fullest), frame index, connections\n")
    for line in lates:
        print(line)
    for nf, n in sorted(best.items()):
        print(f"fronts {nf}: largest N meeting the criterion (and 0 underruns at 200 ms): {n}")
    for line in recov:
        print(line)
    for line in logs:
        print(line)
    for line in UNANSWERED:
        print(line)
    if args.runtime_ticks:
        ns = [int(x) for x in args.n.split(",")]
        src = source if source not in ("light", "mimi", "qwen3") else args.spawn
        alone, bounded = runtime_capacity(
            lambda sizes: runtime_alone(src, sizes, base_args, args.runtime_ticks, load), ns, period,
            args.runtime_max or 2 * max(ns))
        ok_n = [n for n, t in alone.items() if t < period]
        best_rt = max(ok_n, default=0)
        print("\n| N | runtime alone tick p99 ms | real time |\n|---|---|---|")
        for n, t in sorted(alone.items()):
            print(f"| {n} | {1e3 * t:.1f} | {'yes' if t < period else 'no'} |")
        held = f"{best_rt}" if bounded or not best_rt else f"at least {best_rt} (the largest tried)"
        print(f"runtime alone: largest N in real time (tick p99 < {1e3 * period:.1f} ms): {held}")
        for nf in (int(x) for x in args.fronts.split(",")):
            d = best.get(nf, 0)
            ratio = f"{'at most ' if not bounded else ''}{d / best_rt:.2f}" if best_rt else "-"
            print(f"fronts {nf}: daemon/runtime = {d}/{best_rt} = {ratio} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
