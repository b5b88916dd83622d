"""The Chatterbox S3Gen reference (PyPI chatterbox-tts, CPU torch) with seeded random weights.

Parity tests build the upstream model, perturb every decode-path parameter
with seeded noise (so LayerNorm gains, biases and Snake alphas are not at
their init values of 1 and 0, where a wrong broadcast would go unnoticed),
export it through our converter and compare stage by stage. Skips cleanly
when the reference is not installed (it is a test extra, installed with
--no-deps: see .ci/run).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: decode-path prefixes; the tokenizer and speaker encoder are not ported
DECODE_PREFIXES = ("flow.", "mel2wav.")


def import_reference() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from chatterbox.models.s3gen import S3Gen
    except Exception as e:  # ImportError, or a dependency failing at import
        pytest.skip(f"chatterbox-tts reference not importable: {type(e).__name__}: {e}")
    return torch, S3Gen


@functools.lru_cache(maxsize=2)
def reference(meanflow: bool = False, seed: int = 0) -> Any:
    """S3Gen(meanflow) in eval mode with seeded, perturbed decode-path parameters."""
    torch, S3Gen = import_reference()
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = S3Gen(meanflow=meanflow).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(DECODE_PREFIXES):
                continue
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("original0"):  # weight-norm gain: keep it positive
                p.mul_(1.0 + 0.1 * noise)
            elif p.dim() <= 1 or "pos_bias" in name:  # biases, norm gains, Snake alphas
                p.add_(0.1 * noise)
    return model


def state_dict(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.state_dict().items() if k.startswith(DECODE_PREFIXES)}


@functools.lru_cache(maxsize=4)
def gguf(meanflow: bool = False, dtype: str = "f32", seed: int = 0) -> Path:
    """The reference's weights converted by codecd's converter (cached per process)."""
    from codecd.convert.s3gen import convert_s3gen_state_dict

    root = Path(os.environ.get("CODECD_TEST_TMP", "/tmp")) / f"codecd-s3ref-{os.getpid()}"
    if not root.exists():
        root.mkdir(parents=True)
        atexit.register(shutil.rmtree, root, True)  # ~0.5 GB per model
    path = root / f"s3gen_{'turbo' if meanflow else 'orig'}_{dtype}_{seed}.gguf"
    if not path.exists():
        convert_s3gen_state_dict(state_dict(reference(meanflow, seed)), None, path, dtype)
    return path


def rel_l2(a: Any, b: Any) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
