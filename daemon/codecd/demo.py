"""The demo model and the demo token sequence, for trying codecd without a checkpoint.

* :func:`demo_levels`: a seeded sequence of SNAC 24 kHz codes (3 levels, strides 4, 2, 1);
  :func:`demo_ids` is the same as Orpheus token ids, what ``codecd decode/stream/play
  --model demo`` without CODES and the browser page's "demo sequence" send (the page
  fetches it from ``GET /demo/tokens.json``);

The demo model (``codecd.config.build_demo_model``) has random weights: its audio is
noise, at about -20 dBFS RMS.
"""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt

from .families import orpheus

__all__ = ["DEMO_GROUPS", "demo_levels", "demo_ids"]

logger = logging.getLogger(__name__)

#: groups (7 Orpheus tokens, 2048 samples at 24 kHz) of the built-in sequence: 3.0 s
DEMO_GROUPS = 35


def demo_levels(groups: int = DEMO_GROUPS, seed: int = 1) -> list[npt.NDArray[np.int32]]:
    """Per-level codes ``[groups]``, ``[2 groups]``, ``[4 groups]`` of the demo sequence."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 4096, groups * s, dtype=np.int32) for s in (1, 2, 4)]


def demo_ids(groups: int = DEMO_GROUPS, seed: int = 1) -> npt.NDArray[np.int64]:
    """The demo sequence as Orpheus LM token ids (what ``orpheus_ids`` streams carry)."""
    codes = orpheus.levels_to_orpheus(demo_levels(groups, seed))
    return np.asarray(orpheus.codes_to_orpheus_ids(codes), dtype=np.int64)
