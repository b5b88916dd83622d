"""Where an offline decode's time goes on the GPU: CUDA kernels by name, against wall time.

    python -m bench.gpu.profile_decode [--kind dac-44khz] [--batch 16] [--seconds 2] [--repeat 3] [--torch]

A full-size model with seeded random weights (``snac-24khz``: the demo SNAC; ``dac-24khz``,
``dac-44khz``: ``codecd.convert.random_dac``) decodes a batch of random codes; after a warm
decode (graph built and reserved), --repeat decodes are recorded with torch.profiler, whose
CUPTI tracing sees every kernel launched in the process, ggml's included. Prints the wall
time per decode, the summed kernel time per decode, and the kernels that take the most
time, with their launch counts (the tick profile, ``bench/gpu/profile_tick.py``, does the
same for streams). With --torch (SNAC only) the PyTorch reference (the ``snac`` package,
weight norm folded, as ``bench offline`` times it) decodes the same codes under the same
profiler afterwards, so the two kernel tables sit side by side.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def model_path(kind: str) -> str:
    d = Path(tempfile.mkdtemp())
    if kind == "snac-24khz":
        from codecd.config import build_demo_model

        return str(build_demo_model(d / "snac24.gguf", seed=1))
    from codecd.convert.random_dac import write_random_dac

    path = d / f"{kind}.gguf"
    write_random_dac(kind[len("dac-"):], path, seed=1)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--kind", default="dac-44khz", choices=("snac-24khz", "dac-24khz", "dac-44khz"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--torch", action="store_true", help="also profile the PyTorch reference (snac-24khz)")
    args = ap.parse_args()
    if args.torch and args.kind != "snac-24khz":
        ap.error("--torch profiles the snac package's decoder: use --kind snac-24khz")

    from torch.profiler import ProfilerActivity, profile

    from bench.gpu.profile_tick import cuda_kernels, kernel_totals, print_kernels

    import codecrt

    ref = None
    if args.torch:
        from bench.gpu.offline import build_models

        ref, model = build_models(args.device)
    else:
        model = codecrt.Model(model_path(args.kind))
    info = model.info
    frames = int(round(args.seconds * info.sample_rate / info.hop_length))
    frames -= frames % info.frame_multiple
    rng = np.random.default_rng(0)
    levels = [rng.integers(0, size, (args.batch, frames // stride)).astype(np.int32)
              for size, stride in zip(info.codebook_sizes, info.level_strides)]
    with codecrt.Context(model, device=args.device, max_batch=args.batch) as ctx:
        ctx.decode(levels)  # warm: graphs built and reserved
        walls = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                ctx.decode(levels)
                walls.append(time.perf_counter() - t0)
        st = ctx.stats
    kernels = cuda_kernels(prof)
    busy, launches = kernel_totals(kernels, args.repeat)
    wall = 1000 * float(np.median(walls))
    audio = args.batch * frames * info.hop_length / info.sample_rate
    print(f"\n## {args.kind} offline: batch {args.batch} x {frames} frames "
          f"({audio:.1f} s of audio), {args.device}")
    print(f"wall per decode {wall:.1f} ms ({audio / wall * 1000:.0f}x real time); kernel time "
          f"{busy:.1f} ms ({100 * busy / wall:.0f} % of wall); {launches:.0f} kernel launches per "
          f"decode; graphs built {st.graphs_built}, computes {st.computes // (args.repeat + 1)} per decode, "
          f"compute buffers {sum(st.compute_buffer_bytes) / 2**20:.0f} MiB")
    print_kernels(kernels, args.repeat, args.top, "decode")
    model.close()
    if ref is not None:
        profile_reference(ref, levels, args, audio)


def profile_reference(ref, levels, args, audio: float) -> None:
    """The snac package's decode of the same codes, profiled the same way."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import reference
    from bench.gpu.offline import tf32_mode
    from bench.gpu.profile_tick import cuda_kernels, kernel_totals, print_kernels

    tf32 = tf32_mode()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    codes = [torch.from_numpy(lv.astype(np.int64)).to(args.device) for lv in levels]
    with torch.inference_mode(), reference.noise_disabled():
        ref.decode(codes)  # warm: cuDNN's algorithm choice, the allocator's pool
        sync()
        walls = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                ref.decode(codes)
                sync()
                walls.append(time.perf_counter() - t0)
    kernels = cuda_kernels(prof)
    busy, launches = kernel_totals(kernels, args.repeat)
    wall = 1000 * float(np.median(walls))
    print(f"\n## PyTorch (snac package) on the same codes, {args.device}, "
          f"TF32 {tf32}")
    print(f"wall per decode {wall:.1f} ms ({audio / wall * 1000:.0f}x real time); kernel time "
          f"{busy:.1f} ms ({100 * busy / wall:.0f} % of wall); {launches:.0f} kernel launches per decode")
    print_kernels(kernels, args.repeat, args.top, "decode")


if __name__ == "__main__":
    main()
