"""Which PyTorch references of tests/references work here: one report line each.

    python3 bench/gpu/reference_check.py       (from the repository root; run.sh's references stage)

For WavTokenizer (outetts' vendored decoder), NeuCodec, XCodec2 and DAC: the
tiny configuration's reference is built with seeded random weights
(``build_reference``) and decodes 8 frames of random codes
(``reference_decode``, on the CPU). Each prints "OK" with the samples out, or
"no PyTorch reference (why)": then that codec's rows in ``python -m bench
vocos`` and ``windowed --torch`` are codecrt's alone. The first line says which
torch, numpy, scipy and torchaudio were imported and from where (the device's
own, or the carried wheels of bench/gpu/reference-wheels.sh that run.sh puts
on PYTHONPATH). Exit status 1 when a reference is missing.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ("wavtokenizer", "neucodec", "xcodec2", "dac")


def origin(name: str) -> str:
    """``name version (where)`` for an importable module, or why it is not."""
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 -- reported, not raised
        return f"{name} missing ({type(e).__name__}: {e})"
    carried = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # run.sh's $SITE
    where = "carried" if any(str(mod.__file__).startswith(p) for p in carried) else "device"
    return f"{name} {getattr(mod, '__version__', '?')} ({where})"


def check(kind: str) -> str:
    """One report line for the reference ``kind``."""
    try:
        import numpy as np

        ref = importlib.import_module(f"references.{kind}")
        cfg = ref.CONFIGS["tiny"]
        model = ref.build_reference(cfg, 1)
        y = ref.reference_decode(model, ref.random_codes(cfg, 8, np.random.default_rng(0)))
        if not np.isfinite(y).all():
            return f"{kind}: no PyTorch reference (the tiny decode is not finite)"
        return f"{kind}: PyTorch reference OK (tiny: 8 frames -> {y.shape[-1]} samples)"
    except Exception as e:  # noqa: BLE001 -- a report line, not a failure
        return f"{kind}: no PyTorch reference ({type(e).__name__}: {e})"


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    print(", ".join(origin(m) for m in ("torch", "numpy", "scipy", "torchaudio")), flush=True)
    lines = [check(kind) for kind in REFERENCES]
    for line in lines:
        print(line, flush=True)
    return 0 if all(" OK " in line for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
