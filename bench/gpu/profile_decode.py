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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    audio = args.batch * frames * info.hop_length / info.sample_rate
    with codecrt.Context(model, device=args.device, max_batch=args.batch) as ctx:
        kernels, wall = profiled_runs(lambda: ctx.decode(levels), args.repeat)
        st = ctx.stats
    print(f"\n## {args.kind} offline: batch {args.batch} x {frames} frames "
          f"({audio:.1f} s of audio), {args.device}")
    report(kernels, wall, audio, args,
           f"; graphs built {st.graphs_built}, computes {st.computes // (args.repeat + 1)} per decode, "
           f"compute buffers {sum(st.compute_buffer_bytes) / 2**20:.0f} MiB")
    model.close()
    if ref is not None:
        profile_reference(ref, levels, args, audio)


def profiled_runs(run: Callable[[], Any], repeat: int) -> tuple[dict[str, list[float]], float]:
    """``run`` once to warm (graphs built and reserved, cuDNN's algorithm chosen, allocator
    pools), then ``repeat`` times under torch.profiler: the CUDA kernels by name and the
    median wall time (ms) of a run (``run`` waits for its device work)."""
    from torch.profiler import ProfilerActivity, profile

    from bench.gpu.profile_tick import cuda_kernels

    run()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            t0 = time.perf_counter()
            run()
            walls.append(time.perf_counter() - t0)
    return cuda_kernels(prof), 1000 * float(np.median(walls))


def report(kernels: dict[str, list[float]], wall: float, audio: float, args: argparse.Namespace,
           extra: str = "") -> None:
    """A decoder's summary line (wall, real-time factor, kernel time, launches) and its kernels."""
    from bench.gpu.profile_tick import kernel_totals, print_kernels

    busy, launches = kernel_totals(kernels, args.repeat)
    print(f"wall per decode {wall:.1f} ms ({audio / wall * 1000:.0f}x real time); kernel time "
          f"{busy:.1f} ms ({100 * busy / wall:.0f} % of wall); {launches:.0f} kernel launches per "
          f"decode{extra}")
    print_kernels(kernels, args.repeat, args.top, "decode")


def profile_reference(ref: Any, levels: list[Any], args: argparse.Namespace, audio: float) -> None:
    """The snac package's decode of the same codes, profiled the same way."""
    import torch

    import reference
    from bench.gpu.offline import tf32_mode

    tf32 = tf32_mode()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    codes = [torch.from_numpy(lv.astype(np.int64)).to(args.device) for lv in levels]

    def run() -> None:
        ref.decode(codes)
        sync()

    with torch.inference_mode(), reference.noise_disabled():
        kernels, wall = profiled_runs(run, args.repeat)
    print(f"\n## PyTorch (snac package) on the same codes, {args.device}, TF32 {tf32}")
    report(kernels, wall, audio, args)


if __name__ == "__main__":
    main()
