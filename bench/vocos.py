"""Offline decode speed of WavTokenizer, NeuCodec and XCodec2: codecrt against the PyTorch reference.

Both decode the same random codes in the same process, alternately, best of --repeat. codecrt
decodes a full-size random-weight model (``codecd.convert.random_vocos``); the reference
(``tests/references``: outetts' vendored WavTokenizer, the neucodec and xcodec2 packages) is built
with its own seeded weights, when its package is importable (``--no-torch`` skips it). Weights do
not change the work; parity is the tests' job (tests/test_wavtokenizer.py, tests/test_neucodec.py).

    python -m bench vocos [--device cpu|cuda:0] [--threads 1,2] [--seconds 10] [--batch 1,8]
                          [--kinds wavtokenizer-75,neucodec] [--repeat 3] [--no-torch]

Prints a markdown table per thread count: wall seconds per decode (and the process's CPU
seconds, the steadier figure on a shared machine) and x real time for each side, and the
speed-up in wall time.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

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


def torch_decoder(kind: str, device: str, threads: int):
    """(decode(codes [B, T]) callable, sync) for the reference on device, or None if unavailable."""
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
        with torch.inference_mode():
            if kind.startswith("wavtokenizer"):
                feats = model.codes_to_features(t[None])
                return model(feats, bandwidth_id=torch.tensor([0], device=dev))
            return model.decode_code(t[:, None, :])

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return decode, sync


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", default="2", help="CPU thread counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--kinds", default=",".join(REFERENCES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)

    import codecrt
    from codecd.convert.random_vocos import write_random_vocos

    tmp = Path(tempfile.mkdtemp(prefix="codecd-vocos-bench-"))
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"\ndevice {args.device}, {threads} CPU threads, {args.seconds:g} s of codes, best of {args.repeat}\n")
        print("| codec | batch | frames | codecrt wall s (CPU s) | codecrt x RT | PyTorch wall s (CPU s) | "
              "PyTorch x RT | speed-up |")
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.kinds.split(","):
            path = tmp / f"{kind}.gguf"
            if not path.exists():
                write_random_vocos(kind, path, seed=1)
            ref = None if args.no_torch else torch_decoder(kind, args.device, threads)
            with codecrt.Model(str(path)) as m, codecrt.Context(m, device=args.device, n_threads=threads,
                                                                max_batch=64) as ctx:
                T = int(round(args.seconds * m.info.sample_rate / m.info.hop_length))
                for B in (int(b) for b in args.batch.split(",")):
                    codes = np.random.default_rng(B).integers(0, m.info.codebook_sizes[0], (B, T)).astype(np.int32)
                    try:
                        ctx.decode([codes])              # warm: graph built and reserved
                    except codecrt.TooLargeError as e:   # one graph: attention over the whole utterance
                        print(f"| {kind} | {B} | {T} | too large: {e.message} | | | | |", flush=True)
                        continue
                    tc, cc = best(lambda c=codes: ctx.decode([c]), args.repeat, lambda: None)
                    audio = B * args.seconds
                    row = f"| {kind} | {B} | {T} | {tc:.3f} ({cc:.2f}) | {audio / tc:.1f} |"
                    if ref is not None:
                        decode, sync = ref
                        decode(codes[:, : min(T, 20)])
                        sync()
                        tr, cr = best(lambda c=codes, f=decode: f(c), args.repeat, sync)
                        row += f" {tr:.3f} ({cr:.2f}) | {audio / tr:.1f} | {tr / tc:.2f}x |"
                    else:
                        row += " - | - | - |"
                    print(row, flush=True)
    for p in tmp.glob("*.gguf"):
        p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
