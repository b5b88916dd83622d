"""Offline decode throughput: codecrt against the PyTorch reference, same machine, same run.

    python -m bench decode [--threads 2] [--seconds 10] [--batches 1,8,32] [--repeat 3]

Prints a table of seconds of audio decoded per second of wall time (x real
time) for SNAC 24 kHz with random weights: codecrt with f32 and f16 weights,
and the reference `snac` package (f32, weight norm folded, torch with the same
thread count). Needs the test extra (torch, snac).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bench import scratch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402


def best_of(fn, repeat: int) -> float:
    fn()  # warm-up: graph build and reservation, torch's first-call costs
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="audio per sequence at batch 1")
    ap.add_argument("--batch-seconds", type=float, default=2.0, help="audio per sequence at batch > 1")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()

    # codecrt first: torch's bundled libgomp has libgomp.so.1 as its name, so whichever loads
    # first is the process's OpenMP, and codecrt asks it for passive waits (docs/runtime.md)
    import codecrt
    import torch
    from codecd.convert import convert

    torch.set_num_threads(args.threads)
    cfg = reference.SNAC_24KHZ
    tmp = scratch(prefix="codecd-bench-")
    ref = reference.build_reference_snac(cfg, seed=1)
    folder = reference.save_released_layout(ref, cfg, tmp / "snac24")
    ggufs = {dt: convert(folder, tmp / f"snac24-{dt}.gguf", dtype=dt, progress=False)
             for dt in ("f32", "f16")}
    # the reference with weight norm folded, as the brief's baseline
    from torch.nn.utils import parametrize

    for mod in ref.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)
    ref.eval()

    rng = np.random.default_rng(0)
    hop, sr = 512, 24000
    rows = []
    models = {dt: codecrt.Model(p) for dt, p in ggufs.items()}
    for b in [int(x) for x in args.batches.split(",")]:
        secs = args.seconds if b == 1 else args.batch_seconds
        n_frames = max(4, int(secs * sr / hop) // 4 * 4)
        audio_s = b * n_frames * hop / sr
        levels = reference.random_codes(models["f32"].info, n_frames, b, rng)
        row = {"batch": b, "audio_s": audio_s}
        for dt, m in models.items():
            with codecrt.Context(m, device="cpu", n_threads=args.threads, max_batch=b,
                                 max_frames=n_frames) as ctx:
                row[dt] = audio_s / best_of(lambda lv=levels, c=ctx: c.decode(lv), args.repeat)
        if not args.no_reference:
            codes = [torch.from_numpy(lv.astype(np.int64)) for lv in levels]
            with torch.inference_mode(), reference.noise_disabled():
                row["torch"] = audio_s / best_of(lambda cs=codes: ref.decode(cs), args.repeat)
        rows.append(row)

    print(f"# SNAC 24 kHz offline decode, random weights, {args.threads} threads, "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"codecrt {codecrt.version()}")
    print("| batch | audio per decode (s) | codecrt f32 (x RT) | codecrt f16 (x RT) "
          "| PyTorch f32 (x RT) | f32 / PyTorch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        t = r.get("torch")
        ratio = f"{r['f32'] / t:.2f}" if t else "-"
        tt = f"{t:.2f}" if t else "-"
        print(f"| {r['batch']} | {r['audio_s']:.1f} | {r['f32']:.2f} | {r['f16']:.2f} | {tt} | {ratio} |")
    for m in models.values():
        m.close()


if __name__ == "__main__":
    main()
