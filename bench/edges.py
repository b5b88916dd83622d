"""Streams that start and end together: the ticks at a stream's edges against the steady ones.

    python -m bench edges [--streams 8,16,24] [--seconds 3] [--device cpu] [--threads 2] [--repeat 2]

N SNAC streams (the demo model: SNAC 24 kHz shapes, random weights) on one context, 4 frames
(85.3 ms) a tick, every stream given its codes a tick at a time and finished together, as the
fronts bench's clients do; each tick is ``codecrt.step`` over all N and a pull of each. Per N:
the median tick of the steady middle, the ticks at the start (whose streams have no state
yet) and at the end (whose streams flush what their decoder holds back), and the graphs each
built. The runtime-alone rows of ``bench fronts`` time steady ticks only; a daemon whose streams
all end together also pays the end's ticks (docs/benchmarks.md, "Daemon against runtime on
this CPU").
"""

from __future__ import annotations

import argparse
import datetime
import time

import numpy as np

from .mimi import load, machine

FRAMES_PER_TICK = 4   # SNAC 24 kHz: 4 frames = 85.3 ms
STRIDES = (4, 2, 1)   # frames per code of each level
EDGE = 3              # ticks reported at each edge


def run(ctx, n: int, frames: int, rng: np.random.Generator) -> list[tuple[float, int]]:
    """(wall ms, graphs built) of every tick of N streams of ``frames`` frames."""
    ss = [ctx.stream() for _ in range(n)]
    codes = [[rng.integers(0, 4096, frames // st, dtype=np.int32) for st in STRIDES] for _ in range(n)]
    ticks: list[tuple[float, int]] = []
    n_ticks = frames // FRAMES_PER_TICK
    try:
        for t in range(n_ticks + 8):  # the codes a tick at a time, then the flush's ticks
            if all(s.done for s in ss):
                break
            for s, c in zip(ss, codes):
                if t < n_ticks:
                    s.push([lv[t * FRAMES_PER_TICK // st:(t + 1) * FRAMES_PER_TICK // st]
                            for lv, st in zip(c, STRIDES)])
                elif t == n_ticks:
                    s.finish()
            g0, t0 = ctx.stats.graphs_built, time.perf_counter()
            ctx.step(ss)
            for s in ss:
                s.pull()
            ticks.append((1000 * (time.perf_counter() - t0), ctx.stats.graphs_built - g0))
        if not all(s.done for s in ss):
            raise RuntimeError(f"N={n}: a stream is not done {len(ticks)} ticks in")
    finally:
        for s in ss:
            s.close()
    return ticks


def main() -> int:
    import codecrt
    from codecd.config import ensure_demo_model

    ap = argparse.ArgumentParser(prog="python -m bench edges", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="8,16,24", help="comma-separated stream counts")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs per N on one context; the last is reported")
    args = ap.parse_args()
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    frames = FRAMES_PER_TICK * max(2 * EDGE + 1, round(args.seconds * 24000 / 512 / FRAMES_PER_TICK))
    rng = np.random.default_rng(1)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## ticks at the edges: N SNAC 24 kHz streams (demo model) started and finished together, "
          f"{frames} frames ({frames * 512 / 24000:.2f} s) each, {FRAMES_PER_TICK} frames a tick")
    print(f"{machine(args.device)} · device {args.device}, {args.threads} threads · codecrt {codecrt.version()} · "
          f"{stamp} · load average {load()} · run {args.repeat} of {args.repeat} on one context "
          "(graphs built: in that run)")
    print(f"| N | steady median ms | steady p99 ms | first {EDGE} ticks ms | last {EDGE} ticks ms "
          "| end / steady | graphs built (first, last ticks) |")
    print("|---:|---:|---:|---|---|---:|---|")
    with codecrt.Model(str(ensure_demo_model())) as model:
        for n in counts:
            with codecrt.Context(model, device=args.device, n_threads=args.threads, max_batch=n,
                                 max_streams=n) as ctx:
                for _ in range(args.repeat):
                    ticks = run(ctx, n, frames, rng)
            walls = [w for w, _ in ticks]
            steady = walls[EDGE:-EDGE]
            med = float(np.median(steady))
            first, last = ticks[:EDGE], ticks[-EDGE:]
            print(f"| {n} | {med:.1f} | {float(np.percentile(steady, 99)):.1f} | "
                  f"{', '.join(f'{w:.1f}' for w, _ in first)} | {', '.join(f'{w:.1f}' for w, _ in last)} | "
                  f"{max(w for w, _ in last) / med:.2f} | "
                  f"{', '.join(str(g) for _, g in first)}; {', '.join(str(g) for _, g in last)} |", flush=True)
    return 0
