"""GPU streaming check: streamed against offline on the GPU and against the CPU, per chunk size.

    python -m bench check [--device cuda:0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402


def stream(ctx, levels, chunk_pushes=1):
    s = ctx.stream()
    s.push(levels)
    s.finish()
    while ctx.step([s]):
        pass
    out = s.pull()
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    import codecrt
    from codecd.convert import convert

    tmp = Path(tempfile.mkdtemp())
    cfg = reference.SNAC_24KHZ
    ref = reference.build_reference_snac(cfg, seed=1)
    gguf = convert(reference.save_released_layout(ref, cfg, tmp / "s"), tmp / "s.gguf", progress=False)
    m = codecrt.Model(gguf)
    levels = reference.random_codes(m.info, 64, None, np.random.default_rng(0))
    print(f"TF32 override={os.environ.get('NVIDIA_TF32_OVERRIDE')}, "
          f"fusion disabled={os.environ.get('GGML_CUDA_DISABLE_FUSION')}")
    with codecrt.Context(m, device="cpu") as cpu:
        off_cpu = cpu.decode(levels)
    for chunk in (4, 8, 16, 32):
        with codecrt.Context(m, device=args.device, stream_chunk_frames=chunk) as g, \
             codecrt.Context(m, device="cpu", stream_chunk_frames=chunk) as c:
            off = g.decode(levels)
            sg, sc = stream(g, levels), stream(c, levels)
            d = np.abs(sg - off)
            first = int(np.argmax(d > 1e-4)) if (d > 1e-4).any() else -1
            print(f"chunk {chunk:2d}: gpu stream vs gpu offline {d.max():.2e} (first >1e-4 at {first}), "
                  f"gpu stream vs cpu stream {np.abs(sg - sc).max():.2e}, "
                  f"cpu stream vs cpu offline {np.abs(sc - off_cpu).max():.2e}, "
                  f"gpu offline vs cpu offline {np.abs(off - off_cpu).max():.2e}")


if __name__ == "__main__":
    main()
