"""A small random-weight SNAC model written straight to GGUF (no torch), for engine tests.

The file follows docs/gguf-format.md (the ``snac`` section) with the ``gguf``
package alone: numpy arrays in numpy order, which GGUF stores reversed (ggml
order). The default hyperparameters give a model of ~0.2 M parameters that
decodes a chunk in well under a millisecond on one CPU core::

    from smallmodel import write_small_snac
    path = write_small_snac(tmp_path / "small.gguf")
    model = codecrt.Model(path)          # 3 levels, strides [4, 2, 1], hop 4
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["SMALL_SNAC", "write_small_snac", "small_codes"]

#: hyperparameters of the default small model (the ``snac.*`` keys, minus hop_length)
SMALL_SNAC: dict[str, Any] = {
    "sampling_rate": 24000,
    "latent_dim": 32,
    "decoder_dim": 64,
    "decoder_rates": [2, 2],
    "attn_window_size": 0,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

_KERNEL = 7
_N_RES = 3


def write_small_snac(path: str | os.PathLike[str], seed: int = 0, **overrides: Any) -> Path:
    """Write a random SNAC GGUF (``SMALL_SNAC`` with ``overrides``) to ``path``; returns it."""
    from codecd.convert.random_snac import write_random_snac

    unknown = set(overrides) - set(SMALL_SNAC)
    if unknown:
        raise ValueError(f"unknown hyperparameter(s): {sorted(unknown)}")
    return write_random_snac(path, dict(SMALL_SNAC, **overrides), seed=seed, name="snac_small")


def small_codes(n_frames: int, rng: np.random.Generator,
                strides: Sequence[int] = (4, 2, 1), codebook_size: int = 4096) -> list[np.ndarray]:
    """Random valid codes for ``n_frames`` finest frames (a multiple of max(strides)), int32."""
    if n_frames <= 0 or n_frames % max(strides):
        raise ValueError(f"n_frames {n_frames} must be a positive multiple of {max(strides)}")
    return [rng.integers(0, codebook_size, n_frames // s, dtype=np.int64).astype(np.int32)
            for s in strides]
