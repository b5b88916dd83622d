"""Where a streaming tick's time goes on the GPU: CUDA kernels by name, against wall time.

    python -m bench profile [--codec snac|mimi|s3gen-turbo|s3gen-orig] [--streams 256] [--chunks 4,16] [--ticks 5]

SNAC 24 kHz with random weights (the demo model: codecd.config.build_demo_model), or the
released-size Mimi with random weights and 8 codebooks per stream (codecd.convert.random_mimi;
a chunk is then a number of 80 ms frames), or Chatterbox S3Gen with random weights (Turbo or
the original flow; N FlowStreams stepped by codecrt.step_flows after a 3 s prompt, the ticks
profiled being their third and later 1 s chunks: --chunks and the frames do not apply). For each chunk size, N streams are stepped together; a few warm ticks are then recorded with
torch.profiler, whose CUPTI tracing sees every kernel launched in the process,
ggml's included. Prints the wall time per tick, the summed kernel time per tick
(the rest is host work, launches and synchronisation), and the kernels that
take the most time, with their launch counts per tick.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--chunks", default="4,16")
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--codec", choices=("snac", "mimi", "s3gen-turbo", "s3gen-orig"), default="snac")
    args = ap.parse_args()
    if args.codec.startswith("s3gen"):
        profile_s3gen(args)
        return

    from torch.profiler import ProfilerActivity, profile

    import codecrt
    from codecd.config import build_demo_model

    if args.codec == "mimi":
        from codecd.convert.random_mimi import write_random_mimi

        path = str(write_random_mimi(Path(tempfile.mkdtemp()) / "mimi.gguf", seed=1))
    else:
        path = build_demo_model(Path(tempfile.mkdtemp()) / "snac24.gguf", seed=1)
    model = codecrt.Model(path)
    info = model.info
    rng = np.random.default_rng(0)
    n = args.streams
    for chunk in (int(c) for c in args.chunks.split(",")):
        with codecrt.Context(model, device=args.device, max_batch=n, max_streams=n,
                             batch_bucket=True, stream_chunk_frames=chunk) as ctx:
            total = chunk * (args.ticks + 8)
            if args.codec == "mimi":  # Moshi's 8 of the 32 codebooks, one code per frame
                levels = [rng.integers(0, info.codebook_sizes[q], total).astype(np.int32) for q in range(8)]
            else:
                levels = [rng.integers(0, size, total // stride).astype(np.int32)
                          for size, stride in zip(info.codebook_sizes, info.level_strides)]
            ss = [ctx.stream() for _ in range(n)]
            for s in ss:
                s.push(levels)
            for _ in range(4):
                ctx.step(ss)
                for s in ss:
                    s.pull()
            walls = []
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(args.ticks):
                    t0 = time.perf_counter()
                    ctx.step(ss)
                    walls.append(time.perf_counter() - t0)
                    for s in ss:
                        s.pull()
            st = ctx.stats
            for s in ss:
                s.close()
        kernels = cuda_kernels(prof)
        busy, launches = kernel_totals(kernels, args.ticks)
        wall = 1000 * float(np.median(walls))
        print(f"\n## {args.codec}: {n} streams, {chunk} frames per tick "
              f"({1000 * chunk * info.hop_length / info.sample_rate:.1f} ms of audio)")
        print(f"wall per tick {wall:.2f} ms; kernel time per tick {busy:.2f} ms "
              f"({100 * busy / wall:.0f} % of wall); {launches:.0f} kernel launches per tick; "
              f"graphs built {st.graphs_built}, splits {getattr(st, 'graph_splits', '?')}")
        print_kernels(kernels, args.ticks, args.top, "tick")
    model.close()


def profile_s3gen(args: argparse.Namespace) -> None:
    """One S3Gen tick (every stream's next 1 s chunk, one step_flows call) by kernel, against its
    wall and the process's CPU time: a tick whose kernels fill a small part of its wall is bound by
    the host (graph building, ops the device lacks) rather than by the GPU's arithmetic."""
    from torch.profiler import ProfilerActivity, profile

    import codecrt
    from bench.s3gen import random_gguf, s3ref
    from bench.s3gen_capacity import LOOKAHEAD, flow_defaults

    meanflow = args.codec == "s3gen-turbo"
    model = codecrt.Model(str(random_gguf(meanflow)))
    voice = codecrt.Voice(model, **s3ref.random_voice(1, 75))
    first, chunk = flow_defaults(codecrt)
    n = args.streams
    n_tok = first + chunk * (3 + args.ticks)
    tokens = np.random.default_rng(3).integers(0, 6561, (n, n_tok)).astype(np.int32)
    with codecrt.Context(model, device=args.device) as ctx:
        fss = [codecrt.FlowStream(ctx, voice, seed=i) for i in range(n)]
        walls, cpus = [], []
        pushed = 0  # tokens each stream has been given

        def tick(k: int) -> None:
            nonlocal pushed
            target = min(n_tok, first + chunk * k + LOOKAHEAD)
            for i, fs in enumerate(fss):
                fs.push(tokens[i, pushed:target])
            pushed = target
            c0, t0 = time.process_time(), time.perf_counter()
            got = codecrt.step_flows(ctx, fss)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            if got.errors or got.stepped != n:
                raise RuntimeError(f"tick {k}: {got.stepped} of {n} stepped, errors {got.errors}")
            for fs in fss:
                fs.pull()

        for k in range(3):  # the first chunk and two later ones: their graphs built and reserved
            tick(k)
        walls.clear()
        cpus.clear()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for k in range(3, 3 + args.ticks):
                tick(k)
        st = ctx.stats
        for fs in fss:
            fs.close()
    kernels = cuda_kernels(prof)
    busy, launches = kernel_totals(kernels, args.ticks)
    wall, cpu = 1000 * float(np.median(walls)), 1000 * float(np.median(cpus))
    print(f"\n## {args.codec}: {n} streams, one {chunk}-token chunk each per tick "
          f"(ticks at chunks 3 to {2 + args.ticks}, {model.info.default_steps} flow steps)")
    print(f"wall per tick {wall:.1f} ms; process CPU per tick {cpu:.1f} ms; kernel time per tick {busy:.1f} ms "
          f"({100 * busy / wall:.0f} % of wall); {launches:.0f} kernel launches per tick; "
          f"graphs built {st.graphs_built}, splits {getattr(st, 'graph_splits', '?')}, "
          f"backends {', '.join(getattr(st, 'backends', []) or ['?'])}")
    print_kernels(kernels, args.ticks, args.top, "tick")
    voice.close()
    model.close()


def cuda_kernels(prof) -> dict[str, list[float]]:
    """Kernel name -> the device µs of each of its launches in a torch.profiler trace."""
    import torch

    kernels: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels[ev.name].append(ev.device_time_total if hasattr(ev, "device_time_total")
                                    else ev.cuda_time_total)
    return kernels


def kernel_totals(kernels: dict[str, list[float]], runs: int) -> tuple[float, float]:
    """Kernel ms and launches per run (tick) over ``runs``."""
    return (sum(sum(v) for v in kernels.values()) / runs / 1000,
            sum(len(v) for v in kernels.values()) / runs)


def print_kernels(kernels: dict[str, list[float]], runs: int, top: int, per: str) -> None:
    """The ``top`` kernels by time: ms and launches per ``per`` (tick, decode) over ``runs``."""
    busy, _ = kernel_totals(kernels, runs)
    print(f"| kernel | ms per {per} | % of kernel time | launches per {per} |")
    print("|---|---:|---:|---:|")
    for name, ts in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]:
        t = sum(ts) / runs / 1000
        print(f"| {name[:90]} | {t:.3f} | {100 * t / busy:.1f} | {len(ts) / runs:.0f} |")


if __name__ == "__main__":
    main()
