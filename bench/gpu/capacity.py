"""GPU capacity: offline throughput and real-time stream capacity, codecrt against PyTorch.

    python -m bench gpu [--device cuda:0] [--batches 1,4,16,64,256,1024]
                        [--streams 64,256,512,1024,1536,2048]

SNAC 24 kHz with random weights. Prints markdown tables:
  * offline throughput (seconds of audio per second) for each batch, codecrt
    against the reference `snac` package on the same GPU (f32, weight norm folded);
  * streaming: per-tick time (median, p99) for N streams stepped together
    (4 frames = 85.3 ms of audio per tick), the largest N whose p99 tick stays
    under the tick period, time to first audio at that load, and the achieved
    compute rate (9.7 GFLOP per second of audio);
  * the Orpheus-style unbatched PyTorch window decode (28 tokens every 7) on the
    same GPU: time per step and the streams it sustains.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402

GFLOP_PER_AUDIO_S = 9.7


def _ticks(model, args, info, rng, n: int):
    """n streams in one context stepped together: the seconds of each of args.ticks steady
    ticks and the context's stats. TooLargeError where n streams' tick is not one graph."""
    import codecrt

    chunk = args.chunk
    with codecrt.Context(model, device=args.device, max_batch=n, max_streams=n,
                         batch_bucket=True, stream_chunk_frames=chunk) as ctx:
        levels = reference.random_codes(info, chunk * (args.ticks + 6), None, rng)
        ss = [ctx.stream() for _ in range(n)]
        for s in ss:
            s.push(levels)
        for _ in range(4):  # warm-up, edge ticks, first compute of the steady shape
            ctx.step(ss)
            for s in ss:
                s.pull()
        times = []
        for _ in range(args.ticks):
            t0 = time.perf_counter()
            ctx.step(ss)
            times.append(time.perf_counter() - t0)
            for s in ss:
                s.pull()
        st = ctx.stats
        for s in ss:
            s.close()
    return times, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batches", default="1,4,16,64,256,1024")
    ap.add_argument("--streams", default="64,256,512,1024,1536,2048")
    ap.add_argument("--item-seconds", type=float, default=2.0)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=4, help="frames per streaming tick (4 = 85 ms at 24 kHz)")
    args = ap.parse_args()

    import torch

    import codecrt

    from .offline import build_models, offline_table

    ref, model = build_models("cuda")
    info = model.info
    sr, hop = info.sample_rate, info.hop_length
    rng = np.random.default_rng(0)
    print(f"# SNAC 24 kHz on {torch.cuda.get_device_name(0)}, codecrt {codecrt.version()}, "
          f"torch {torch.__version__}")

    # ------------------------------------------------------------- offline
    print("\n## offline throughput (seconds of audio per second; every layout: python -m bench offline)")
    batches = [int(b) for b in args.batches.split(",") if b]
    if batches:
        offline_table(model, ref, args.device, [(args.item_seconds, b) for b in batches], ["auto"])

    # ----------------------------------------------------------- streaming
    chunk = args.chunk
    period = chunk * hop / sr
    print(f"\n## streaming ticks ({chunk} frames = {1000 * period:.1f} ms of audio per stream per tick)")
    print("| streams | tick median (ms) | tick p99 (ms) | real time? | achieved TFLOP/s | state (MiB) |")
    print("|---:|---:|---:|---|---:|---:|")
    best = None
    stream_counts = [int(n) for n in args.streams.split(",")]
    for n in stream_counts:
        try:
            times, st = _ticks(model, args, info, rng, n)
        except codecrt.TooLargeError as e:  # one graph's tensors past ggml's int32 elements
            print(f"| {n} | - | - | no: not one graph ({e}) | - | - |", flush=True)
            continue
        med, p99 = 1000 * float(np.median(times)), 1000 * float(np.percentile(times, 99))
        ok = p99 < 1000 * period
        tflops = n * GFLOP_PER_AUDIO_S * period / (med / 1000) / 1000
        if ok:
            best = (n, med, p99)
        print(f"| {n} | {med:.1f} | {p99:.1f} | {'yes' if ok else 'no'} | {tflops:.1f} | "
              f"{st.state_bytes / 2**20:.0f} |", flush=True)

    if best:
        n, med, p99 = best
        lat = None
        with codecrt.Context(model, device=args.device, max_batch=n, max_streams=n + 1,
                             batch_bucket=True, stream_chunk_frames=chunk) as ctx:
            first = ctx.stream()
            lat = first.info.latency_samples
            first.close()
        need = -(-(lat + 1) // (chunk * hop))  # ticks of input before the first sample
        print(f"\nlargest real-time load: {n} streams (p99 tick {p99:.1f} ms < {1000 * period:.1f} ms)")
        print(f"time to first audio at that load: {need} chunks of tokens ({need * 1000 * period:.0f} ms "
              f"of audio, the algorithmic latency {1000 * lat / sr:.0f} ms rounded up to ticks) plus "
              f"one tick ({p99:.1f} ms p99) once they have arrived")

    # --------------------------------------------- Orpheus window, PyTorch
    levels = reference.random_codes(info, 16 * 40, None, rng)
    codes = [torch.from_numpy(lv.astype(np.int64)).cuda()[None] for lv in levels]
    strides = info.level_strides
    with torch.inference_mode():
        windows = [[c[:, (f - 16) // s:f // s] for c, s in zip(codes, strides)]
                   for f in range(16, 16 * 40, 4)]
        for w in windows[:5]:
            ref.decode(w)[..., 2048:4096].cpu()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for w in windows:
            ref.decode(w)[..., 2048:4096].cpu()
        step = (time.perf_counter() - t0) / len(windows)
    orpheus_step = 4 * hop / sr  # the window advances one 7-token group (4 frames) at a time
    sustained = int(orpheus_step / step)
    print(f"\n## Orpheus window decode, PyTorch, unbatched: {1000 * step:.2f} ms per "
          f"{1000 * orpheus_step:.1f} ms step -> "
          f"{sustained} real-time streams on this GPU")
    if best:
        print(f"codecrt / Orpheus-window streams: {best[0] / max(sustained, 1):.1f}x")
    model.close()


if __name__ == "__main__":
    main()
