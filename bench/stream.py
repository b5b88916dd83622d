"""Streaming: latency, compute against offline, tick time per batch, real-time capacity.

    python -m bench stream [--threads 2] [--chunk 4] [--streams 1,8,32,128]

Prints, for SNAC with random weights on the CPU:
  * the algorithmic latency of exact streaming per configuration;
  * compute per second of audio, streamed (chunk by chunk) against one offline decode;
  * the wall time of one tick for N streams stepped together, and the number of
    real-time SNAC 24 kHz streams it sustains (tick time under the chunk's duration);
  * the same for the Orpheus-style sliding window (decode the last 28 tokens every
    7 and keep samples 2048:4096) with the PyTorch reference, in the same run.
Needs the test extra (torch, snac).
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench import scratch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build(cfg_name: str, tmp: Path):
    from codecd.convert import convert

    cfg = reference.CONFIGS[cfg_name]
    ref = reference.build_reference_snac(cfg, seed=2)
    folder = reference.save_released_layout(ref, cfg, tmp / cfg_name)
    return ref, convert(folder, tmp / f"{cfg_name}.gguf", progress=False)


def stream_all(ctx, levels, strides, step_frames):
    """Push `step_frames` frames at a time, tick after each push; return the PCM."""
    s = ctx.stream()
    out = []
    n = len(levels[-1]) * strides[-1]
    for f in range(0, n, step_frames):
        s.push([lv[f // st:(f + step_frames) // st] for lv, st in zip(levels, strides)])
        s.decode_ready()
        out.append(s.pull())
    s.finish()
    s.decode_ready()
    out.append(s.pull())
    s.close()
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=4, help="frames per tick (4 = one Orpheus group)")
    ap.add_argument("--streams", default="1,8,32,128")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    # codecrt first: torch's bundled libgomp has libgomp.so.1 as its name, so whichever loads
    # first is the process's OpenMP, and codecrt asks it for passive waits (docs/runtime.md)
    import codecrt
    import torch

    torch.set_num_threads(args.threads)
    tmp = scratch(prefix="codecd-bench-")
    rng = np.random.default_rng(0)

    print(f"# exact streaming, SNAC random weights, {args.threads} threads, "
          f"{platform.machine()}, codecrt {codecrt.version()}, torch {torch.__version__}")
    print("\n## algorithmic latency (output lags the last pushed frame by this)")
    print("| config | frames per tick | latency (samples) | latency (ms) |")
    print("|---|---:|---:|---:|")
    ref24 = gguf24 = None
    for name in ("24khz", "32khz", "44khz"):
        ref, gguf = build(name, tmp)
        with codecrt.Model(gguf) as m:
            chunk = max(args.chunk, m.info.frame_multiple)
            with codecrt.Context(m, device="cpu", n_threads=args.threads, stream_chunk_frames=chunk) as ctx:
                with ctx.stream() as s:
                    lat = s.info.latency_samples
            print(f"| SNAC {name} | {chunk} | {lat} | {1000 * lat / m.info.sample_rate:.1f} |")
        if name == "24khz":
            ref24, gguf24 = ref, gguf

    m = codecrt.Model(gguf24)
    info = m.info
    hop, sr = info.hop_length, info.sample_rate
    n_frames = int(args.seconds * sr / hop) // 4 * 4
    audio_s = n_frames * hop / sr
    levels = reference.random_codes(info, n_frames, None, rng)
    strides = info.level_strides

    print(f"\n## compute per second of audio, SNAC 24 kHz, {audio_s:.1f} s utterance")
    print("| mode | CPU s per audio s | wall s per audio s | vs offline (CPU) |")
    print("|---|---:|---:|---:|")
    with codecrt.Context(m, device="cpu", n_threads=args.threads, max_frames=n_frames,
                         stream_chunk_frames=args.chunk) as ctx:
        ctx.decode(levels)
        c0, t0 = cpu_s(), time.perf_counter()
        offline = ctx.decode(levels)
        off_cpu, off_wall = cpu_s() - c0, time.perf_counter() - t0
        stream_all(ctx, levels, strides, args.chunk)  # warm-up
        c0, t0 = cpu_s(), time.perf_counter()
        streamed = stream_all(ctx, levels, strides, args.chunk)
        st_cpu, st_wall = cpu_s() - c0, time.perf_counter() - t0
    assert len(streamed) == len(offline)
    diff = float(np.abs(streamed - offline).max())
    print(f"| offline decode | {off_cpu / audio_s:.3f} | {off_wall / audio_s:.3f} | 1.00 |")
    print(f"| exact streaming, {args.chunk} frames per tick | {st_cpu / audio_s:.3f} | "
          f"{st_wall / audio_s:.3f} | {st_cpu / off_cpu:.2f} |")

    # the Orpheus window with the reference: 28 tokens = 4 groups = 16 frames per step
    from torch.nn.utils import parametrize

    for mod in ref24.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)
    codes_t = [torch.from_numpy(lv.astype(np.int64))[None] for lv in levels]
    steps = []
    with torch.inference_mode():
        for g in range(4, n_frames // 4 + 1):  # Orpheus decodes once count > 27, every 7 tokens
            f1 = g * 4
            steps.append([c[:, (f1 - 16) // st:f1 // st] for c, st in zip(codes_t, strides)])
        ref24.decode(steps[0])
        c0, t0 = cpu_s(), time.perf_counter()
        for cs in steps:
            ref24.decode(cs)[..., 2048:4096]
        w_cpu, w_wall = cpu_s() - c0, time.perf_counter() - t0
    w_audio = len(steps) * 2048 / sr
    print(f"| Orpheus 28-token window, PyTorch reference | {w_cpu / w_audio:.3f} | "
          f"{w_wall / w_audio:.3f} | {w_cpu / off_cpu * audio_s / w_audio:.2f} |")
    print(f"\nstreamed vs offline: max |difference| = {diff:.2e} over {len(offline)} samples")

    print(f"\n## one tick ({args.chunk} frames = {1000 * args.chunk * hop / sr:.1f} ms of audio per stream)")
    print("| streams per tick | tick wall time (ms) | audio per tick wall second | real-time streams |")
    print("|---:|---:|---:|---:|")
    chunk_ms = 1000 * args.chunk * hop / sr
    sustained = 0
    for n in [int(x) for x in args.streams.split(",")]:
        ticks = 6
        with codecrt.Context(m, device="cpu", n_threads=args.threads, max_batch=n, max_streams=n,
                             batch_bucket=True, stream_chunk_frames=args.chunk) as ctx:
            ss = [ctx.stream() for _ in range(n)]
            part = [lv[: (ticks + 1) * args.chunk // st] for lv, st in zip(levels, strides)]
            for s in ss:
                s.push(part)
            ctx.step(ss)  # warm-up: builds and reserves the graph for this batch
            times = []
            for _ in range(ticks):
                t0 = time.perf_counter()
                k = ctx.step(ss)
                times.append(time.perf_counter() - t0)
                assert k == n
                for s in ss:
                    s.pull()
            for s in ss:
                s.close()
        tick_ms = 1000 * float(np.median(times))
        rt = n * chunk_ms / tick_ms
        if tick_ms < chunk_ms:
            sustained = max(sustained, n)
        print(f"| {n} | {tick_ms:.1f} | {rt:.1f} s | {'yes' if tick_ms < chunk_ms else 'no'} ({rt:.1f}x) |")
    print(f"\nreal-time SNAC 24 kHz streams sustained (largest N tested with tick < {chunk_ms:.1f} ms): "
          f"{sustained}; throughput bound: {max(0.0, rt):.1f} streams at {n} per tick")
    print(f"Orpheus window with PyTorch: {1 / (w_wall / w_audio):.2f}x real time for one stream "
          f"(sustains {int(1 / (w_wall / w_audio))} stream(s))")
    m.close()


if __name__ == "__main__":
    main()
