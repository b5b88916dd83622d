"""Offline decode speed of WavTokenizer, NeuCodec, XCodec2 and DAC: codecrt against the PyTorch reference.

Both decode the same random codes in the same process, alternately, best of --repeat. codecrt
decodes a full-size random-weight model (``codecd.convert.random_vocos``, ``random_dac``); the reference
(``tests/references``: outetts' vendored WavTokenizer, the neucodec, xcodec2 and dac packages) is built
with its own seeded weights, when its package is importable (``--no-torch`` skips it). Weights do
not change the work; parity is the tests' job (tests/codecs/test_wavtokenizer.py, tests/codecs/test_neucodec.py).

    python -m bench vocos [--device cpu|cuda:0] [--threads 1,2] [--seconds 10] [--batch 1,8]
                          [--kinds wavtokenizer-75,neucodec] [--repeat 3] [--no-torch]
                          [--precision f32,bf16] [--reference-bf16]

Prints a markdown table per thread count: wall seconds per decode (and the process's CPU
seconds, the steadier figure on a shared machine) and x real time for each side, the
speed-up in wall and in CPU time, and for each codecrt precision after the first its relative
L2 distance to the first's output (``--precision f32,bf16``: BF16 products against F32, which
the tests hold within 1e-4 of the reference). The reference is timed once per row group.
``--reference-bf16`` adds a row per codec: the reference under ``torch.autocast(bfloat16)``
(PyTorch's own BF16) against codecrt's BF16, with the autocast output's relative L2 to the
reference's F32 output.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench import scratch

ROOT = Path(__file__).resolve().parent.parent
for sub in ("daemon", "tests", "bindings"):
    if str(ROOT / sub) not in sys.path:
        sys.path.append(str(ROOT / sub))

#: kind -> (reference module, its config name, package it needs)
REFERENCES = {
    "wavtokenizer-75": ("references.wavtokenizer", "75token", "outetts"),
    "wavtokenizer-40": ("references.wavtokenizer", "40token", "outetts"),
    "neucodec": ("references.neucodec", "24khz", "neucodec"),
    "xcodec2": ("references.xcodec2", "16khz", "xcodec2"),
    "dac-24khz": ("references.dac", "24khz", "dac"),
    "dac-44khz": ("references.dac", "44khz", "dac"),
}


def best(f: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(wall s, process CPU s) of the fastest of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        sync()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return min(times)


def torch_decoder(kind: str, device: str, threads: int, bf16: bool = False):
    """(decode(codes [B, T]) callable, sync) for the reference on device, or None if unavailable;
    ``bf16``: the decode under ``torch.autocast(device, bfloat16)``, PyTorch's own reduced
    precision (oneDNN's BF16 kernels on a CPU, AMX where it has them)."""
    mod_name, cfg_name, package = REFERENCES[kind]
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec(package) is None:
        return None
    import torch

    torch.set_num_threads(threads)
    ref = importlib.import_module(mod_name)
    model = ref.build_reference(ref.CONFIGS[cfg_name], 3).to(device)
    dev = torch.device(device)

    def decode(codes: np.ndarray):
        t = torch.as_tensor(codes.astype(np.int64), device=dev)
        with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            if kind.startswith("dac"):  # codes [B, n_q, T]
                return model.decode(model.quantizer.from_codes(t)[0])
            if kind.startswith("wavtokenizer"):
                feats = model.codes_to_features(t[None])
                return model(feats, bandwidth_id=torch.tensor([0], device=dev))
            return model.decode_code(t[:, None, :])

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return decode, sync


def bench_rows(codecrt, m, kind: str, B: int, T: int, args, threads: int, precisions: list[str], ref) -> None:
    """One row per precision for batch B: codecrt's time and error, the reference's time once."""
    nq = m.info.n_levels  # codes [B, n_q, T]; one level but for DAC
    codes = np.random.default_rng(B).integers(0, m.info.codebook_sizes[0], (B, nq, T)).astype(np.int32)
    lv = [np.ascontiguousarray(codes[:, q]) for q in range(nq)]
    if nq == 1:
        codes = codes[:, 0]
    audio = B * args.seconds
    torch_t = None
    first = None
    codecrt_bf16 = None
    for prec in precisions:
        head = f"| {kind} | {B} | {T} | {prec} |"
        try:
            ctx = codecrt.Context(m, device=args.device, n_threads=threads, max_batch=64, precision=prec)
        except codecrt.CodecrtError as e:  # BF16 off AVX512-BF16 CPUs, or on a GPU
            print(f"{head} unavailable: {e.message} | | | | | |", flush=True)
            continue
        with ctx:
            try:
                out = ctx.decode(lv)             # warm: graph built and reserved (and BF16 weights packed)
            except codecrt.TooLargeError as e:   # one graph: attention over the whole utterance
                print(f"{head} too large: {e.message} | | | | | |", flush=True)
                return
            tc, cc = best(lambda c=lv, x=ctx: x.decode(c), args.repeat, lambda: None)
        if ref is not None and torch_t is None:
            decode, sync = ref
            decode(codes[..., : min(T, 20)])
            sync()
            torch_t = best(lambda c=codes, f=decode: f(c), args.repeat, sync)
        err = "-" if first is None else f"{np.linalg.norm(out - first) / np.linalg.norm(first):.1e}"
        first = out if first is None else first
        if prec == "bf16":
            codecrt_bf16 = (tc, cc)
        row = f"{head} {tc:.3f} ({cc:.2f}) | {audio / tc:.1f} |"
        if torch_t is not None:
            tr, cr = torch_t
            row += f" {tr:.3f} ({cr:.2f}) | {audio / tr:.1f} | {tr / tc:.2f}x ({cr / cc:.2f}x) | {err} |"
        else:
            row += f" - | - | - | {err} |"
        print(row, flush=True)
    if ref is not None and args.reference_bf16 and codecrt_bf16 is not None:
        decode, sync = torch_decoder(kind, args.device, threads, bf16=True)
        want = ref[0](codes).float().cpu().numpy()
        got = decode(codes).float().cpu().numpy()
        tr, cr = best(lambda c=codes, f=decode: f(c), args.repeat, sync)
        tc, cc = codecrt_bf16
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"| {kind} | {B} | {T} | PyTorch autocast bf16 vs codecrt bf16 | {tc:.3f} ({cc:.2f}) | {audio / tc:.1f} |"
              f" {tr:.3f} ({cr:.2f}) | {audio / tr:.1f} | {tr / tc:.2f}x ({cr / cc:.2f}x) | {err:.1e} to PyTorch F32 |",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", default="2", help="CPU thread counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--kinds", default=",".join(REFERENCES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--precision", default="f32", help="codecrt precisions, comma-separated: f32, bf16, bf16x3")
    ap.add_argument("--reference-bf16", action="store_true",
                    help="with bf16 among --precision: also time the reference under torch.autocast(bfloat16) "
                    "and print it against codecrt's BF16, with its error to the reference's F32 output")
    args = ap.parse_args(argv)

    import codecrt
    from codecd.convert.random_dac import write_random_dac
    from codecd.convert.random_vocos import write_random_vocos

    tmp = scratch(prefix="codecd-vocos-bench-")
    precisions = args.precision.split(",")
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"\ndevice {args.device}, {threads} CPU threads, {args.seconds:g} s of codes, best of {args.repeat}\n")
        print("| codec | batch | frames | precision | codecrt wall s (CPU s) | codecrt x RT | PyTorch wall s (CPU s) | "
              "PyTorch x RT | speed-up wall (CPU) | rel L2 vs first |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for kind in args.kinds.split(","):
            path = tmp / f"{kind}.gguf"
            if not path.exists():
                if kind.startswith("dac-"):
                    write_random_dac(kind[len("dac-"):], path, seed=1)
                else:
                    write_random_vocos(kind, path, seed=1)
            ref = None
            if not args.no_torch:
                try:
                    ref = torch_decoder(kind, args.device, threads)
                    why = "torch or its package is not installed"
                except (ImportError, AttributeError, RuntimeError) as e:  # installed, not importable
                    why = f"{type(e).__name__}: {e}"
                if ref is None:
                    print(f"| {kind} | no PyTorch reference here ({why}): codecrt only |")
            with codecrt.Model(str(path)) as m:
                T = int(round(args.seconds * m.info.sample_rate / m.info.hop_length))
                for B in (int(b) for b in args.batch.split(",")):
                    bench_rows(codecrt, m, kind, B, T, args, threads, precisions, ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
