"""Threads per graph: one streaming tick's wall and CPU time on one thread, on all, and as chosen.

    python -m bench threads [--codecs snac,mimi] [--streams 1,2,3,4,8] [--threads 2] [--ticks 40]

For each codec (SNAC 24 kHz with 4-frame ticks, Mimi with one-frame ticks, both random
weights on the CPU) and each number of streams stepped together, three contexts decode the
same codes: one thread, --threads threads with every graph on all of them
(``CODECRT_THREAD_WORK=0``), and --threads threads with codecrt's choice per graph
(native/src/threads.c; the column "auto" says what it chose). Prints the median tick wall
time, and the process's CPU time per tick, over --ticks steady ticks after 10 warm-up ticks.
The choice is right where "auto" matches the better of the first two in CPU time without
losing much wall time where the tick is short of its period, and picks all threads where
their wall time gain is large.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import scratch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402

WARMUP = 10


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def model_for(codec: str, tmp: Path) -> tuple[str, int, float]:
    """(GGUF path, frames per tick, tick period in ms)."""
    if codec == "snac":
        from bench.stream import build

        _, gguf = build("24khz", tmp)
        return str(gguf), 4, 4 * 512 / 24.0
    from codecd.convert.random_mimi import write_random_mimi

    return str(write_random_mimi(tmp / "mimi.gguf", seed=0)), 1, 80.0


def codes_for(codecrt: Any, model: Any, codec: str, frames: int, rng: np.random.Generator):
    """(levels, strides) of `frames` random frames."""
    if codec == "snac":
        return reference.random_codes(model.info, frames, None, rng), list(model.info.level_strides)
    return [rng.integers(0, 2048, frames).astype(np.uint32) for _ in range(8)], [1] * 8


def run(codecrt: Any, model: Any, codec: str, chunk: int, n: int, threads: int, ticks: int,
        forced: bool) -> tuple[float, float, int]:
    """(median tick wall ms, CPU ms per tick, threads of the last tick)."""
    old = os.environ.get("CODECRT_THREAD_WORK")
    if forced:
        os.environ["CODECRT_THREAD_WORK"] = "0"  # read when the context is made
    try:
        ctx = codecrt.Context(model, device="cpu", n_threads=threads, stream_chunk_frames=chunk)
    finally:
        if forced:
            if old is None:
                del os.environ["CODECRT_THREAD_WORK"]
            else:
                os.environ["CODECRT_THREAD_WORK"] = old
    rng = np.random.default_rng(0)
    with ctx:
        streams = [ctx.stream() for _ in range(n)]
        levels, strides = codes_for(codecrt, model, codec, chunk * (ticks + WARMUP), rng)
        walls, cpu = [], 0.0
        for k in range(ticks + WARMUP):
            f = k * chunk
            for s in streams:
                s.push([lv[f // st:(f + chunk) // st] for lv, st in zip(levels, strides)])
            c0, t0 = cpu_s(), time.perf_counter()
            ctx.step(streams)
            w, c = time.perf_counter() - t0, cpu_s() - c0
            for s in streams:
                s.pull()
            if k >= WARMUP:
                walls.append(w)
                cpu += c
        used = ctx.stats.last_threads
        for s in streams:
            s.close()
    return 1000 * float(np.median(walls)), 1000 * cpu / ticks, used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="snac,mimi")
    ap.add_argument("--streams", default="1,2,3,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ticks", type=int, default=40)
    args = ap.parse_args()

    import codecrt

    tmp = scratch(prefix="codecd-bench-")
    cpu_name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                     if line.startswith("model name")), platform.processor())
    print(f"# threads per graph, {cpu_name}, {os.cpu_count()} CPUs, codecrt {codecrt.version()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    T = args.threads
    for codec in args.codecs.split(","):
        gguf, chunk, period = model_for(codec, tmp)
        print(f"\n## {codec}, {chunk}-frame ticks (period {period:.1f} ms): median tick wall ms "
              f"(CPU ms per tick)")
        print(f"| streams | 1 thread | {T} threads, every graph | {T} threads, auto | auto chose |")
        print("|---:|---:|---:|---:|---:|")
        with codecrt.Model(gguf) as model:
            for n in (int(x) for x in args.streams.split(",")):
                one = run(codecrt, model, codec, chunk, n, 1, args.ticks, forced=True)
                every = run(codecrt, model, codec, chunk, n, T, args.ticks, forced=True)
                auto = run(codecrt, model, codec, chunk, n, T, args.ticks, forced=False)
                cells = [f"{w:.1f} ({c:.1f})" for w, c, _ in (one, every, auto)]
                print(f"| {n} | {' | '.join(cells)} | {auto[2]} |", flush=True)


if __name__ == "__main__":
    main()
