"""Offline SNAC 24 kHz decode, codecrt against PyTorch, side by side in one run (issue 19).

    python -m bench offline [--device cuda:0] [--batches 1,16,256,1024] [--item-seconds 2]
                            [--long-seconds 60] [--layouts time,channels] [--repeat 3]

Random weights (`tests/reference.py`), the same codes for every column. For each
item size and batch: codecrt in each offline graph layout asked for
(`CODECRT_OFFLINE_LAYOUT`: `time` = time fastest, one transpose per residual
unit, the stream graphs' layout; `channels` = channels fastest, two transposes
per unit on a GPU; `auto` = the context's default for the device) and the
reference `snac` package (weight norm folded, noise off as codecrt's
`noise=False`), best of --repeat decodes after a warm-up, in seconds of audio
per second. TF32: both runtimes follow the process, so the table states it:
on (ggml's default, cuBLAS TF32 math; torch told to allow TF32 in cuDNN and
cuBLAS) unless NVIDIA_TF32_OVERRIDE=0 turns it off for both. Also max |codecrt
- PyTorch| per row, so a fast wrong graph shows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402

LAYOUT_NAMES = {"time": "time fastest", "channels": "channels fastest", "auto": "default"}


def build_models(device: str) -> tuple[Any, Any]:
    """The seeded random SNAC 24 kHz reference on `device` (weight norm folded) and codecrt's Model of it."""
    from torch.nn.utils import parametrize

    import codecrt
    from codecd.convert import convert

    tmp = Path(tempfile.mkdtemp(prefix="codecd-gpu-"))
    cfg = reference.SNAC_24KHZ
    ref = reference.build_reference_snac(cfg, seed=1)
    gguf = convert(reference.save_released_layout(ref, cfg, tmp / "snac24"), tmp / "snac24.gguf",
                   progress=False)
    for mod in ref.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)
    return ref.eval().to(device), codecrt.Model(gguf)


def tf32_mode() -> str:
    """What TF32 the process runs with, for both runtimes (see the module docstring)."""
    import torch

    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return "off for both (NVIDIA_TF32_OVERRIDE=0)"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return "on for both (ggml's cuBLAS TF32 math; torch allow_tf32 for cuBLAS and cuDNN)"


def best_of(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> tuple[float, Any]:
    """Best wall time of `repeat` calls after one warm-up, and the last result."""
    out = fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times), out


def rt(x: float) -> str:
    """A real-time factor: whole numbers from 100 up (GPU), two decimals below (CPU)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def offline_table(model: Any, ref: Any, device: str, items: list[tuple[float, int]], layouts: list[str],
                  repeat: int = 3, seed: int = 0) -> None:
    """Print the markdown table: one row per (item seconds, batch), codecrt per layout, PyTorch."""
    import torch

    import codecrt

    info = model.info
    sr, hop = info.sample_rate, info.hop_length
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = np.random.default_rng(seed)
    frames = {s: int(s * sr / hop) // 4 * 4 for s, _ in items}
    heads = [f"codecrt {LAYOUT_NAMES[lay]} (x RT)" for lay in layouts]
    print("| audio per item (s) | batch | " + " | ".join(heads) + " | PyTorch (x RT) | best codecrt / PyTorch"
          " | max abs diff, codecrt vs PyTorch |")
    print("|---:|---:|" + "---:|" * (len(heads) + 3))
    saved = os.environ.get("CODECRT_OFFLINE_LAYOUT")
    ctxs = {}
    try:
        for lay in layouts:  # the variable is read when a context is created
            os.environ["CODECRT_OFFLINE_LAYOUT"] = lay
            ctxs[lay] = codecrt.Context(model, device=device, max_batch=max(b for _, b in items),
                                        max_frames=max(frames.values()))
    finally:
        if saved is None:
            os.environ.pop("CODECRT_OFFLINE_LAYOUT", None)
        else:
            os.environ["CODECRT_OFFLINE_LAYOUT"] = saved
    try:
        for seconds, b in items:
            n = frames[seconds]
            levels = reference.random_codes(info, n, b, rng)
            audio = b * n * hop / sr
            ours, rates, outs = [], [], []
            for lay in layouts:
                try:
                    t, got = best_of(partial(ctxs[lay].decode, levels), repeat, lambda: None)
                    rates.append(audio / t)
                    ours.append(rt(audio / t))
                    outs.append(np.asarray(got).reshape(b, -1))
                except codecrt.CodecrtError as e:  # refused (too large): say so, go on
                    ours.append(f"refused: {e}")
            theirs, ratio, diff = "-", "-", "-"
            try:
                codes = [torch.from_numpy(lv.astype(np.int64)).to(device) for lv in levels]
                with torch.inference_mode(), reference.noise_disabled():
                    t, want = best_of(partial(ref.decode, codes), repeat, sync)
                want = want.reshape(b, -1).float().cpu().numpy()
                theirs = rt(audio / t)
                if rates:
                    ratio = f"{max(rates) / (audio / t):.2f}"
                    diff = f"{max(float(np.abs(o - want).max()) for o in outs):.1e}"
                del want, codes
            except torch.OutOfMemoryError:
                theirs = "OOM"
            if cuda:
                torch.cuda.empty_cache()
            print(f"| {seconds:g} | {b} | " + " | ".join(ours) + f" | {theirs} | {ratio} | {diff} |", flush=True)
    finally:
        for c in ctxs.values():
            c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batches", default="1,16,256,1024")
    ap.add_argument("--item-seconds", type=float, default=2.0)
    ap.add_argument("--long-seconds", type=float, default=60.0, help="one more row: batch 1 of this length (0: none)")
    ap.add_argument("--layouts", default="time,channels", help="codecrt offline layouts: time, channels, auto")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    bad = [x for x in layouts if x not in LAYOUT_NAMES]
    if bad or not layouts:
        ap.error(f"--layouts takes {', '.join(LAYOUT_NAMES)}; got {args.layouts!r}")
    items = [(args.item_seconds, int(b)) for b in args.batches.split(",") if b]
    if args.long_seconds > 0:
        items.append((args.long_seconds, 1))

    import torch

    import codecrt

    torch_device = "cuda" if args.device.startswith("cuda") else "cpu"
    tf32 = tf32_mode() if torch_device == "cuda" else "n/a (CPU)"
    ref, model = build_models(torch_device)
    name = torch.cuda.get_device_name(0) if torch_device == "cuda" else "CPU"
    print(f"# SNAC 24 kHz offline decode on {name} ({args.device}), codecrt {codecrt.version()}, "
          f"torch {torch.__version__}, f32 weights and activations, TF32 {tf32}; "
          f"best of {args.repeat}, seconds of audio per second")
    offline_table(model, ref, args.device, items, layouts, args.repeat)
    model.close()


if __name__ == "__main__":
    main()
