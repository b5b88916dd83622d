"""The SNAC family (hubertsiuzdak/snac): multi-scale codes, exact streaming, Orpheus layouts.

* architectures: ``snac`` (24, 32 and 44 kHz configurations); converter ``snac``;
* layouts: Orpheus token ids and codes (3 levels of 4096 codes, strides 4/2/1:
  the 24 kHz model) and per-level codes;
* streams: exact (``codecrt.Stream``, equal to the offline decode) or "low"
  latency (``codecrt.LowLatencyStream``), no voice;
* warm-up: dummy streams through whole utterances per batch bucket
  (:class:`codecd.families.native.ExactStreamModel`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Family, LoadedModel
from .layout import LEVELS, Layout
from .native import ExactStreamModel
from .orpheus import ORPHEUS, ORPHEUS_IDS

__all__ = ["SnacFamily", "low_latency_params", "LOW_LOOKAHEAD_FRACTION", "LOW_CROSSFADE_FRACTION"]

#: latency "low": codecrt.LowLatencyStream's lookahead and crossfade as fractions of
#: the model's exact latency (SNAC 24 kHz: 2046 + 257 samples, 96 ms instead of
#: 198 ms; relative error about 0.01 against offline, docs/benchmarks.md)
LOW_LOOKAHEAD_FRACTION = 0.43
LOW_CROSSFADE_FRACTION = 0.054


def low_latency_params(exact_latency: int) -> tuple[int, int]:
    """(lookahead, crossfade) in samples of a "low" stream for a model's exact latency."""
    return (int(round(LOW_LOOKAHEAD_FRACTION * exact_latency)),
            max(1, int(round(LOW_CROSSFADE_FRACTION * exact_latency))))


class SnacFamily(Family):
    name = "snac"
    architectures = ("snac",)
    converter = "snac"
    layouts: ClassVar[tuple[Layout, ...]] = (ORPHEUS_IDS, ORPHEUS, LEVELS)

    def low_latency_samples(self, exact_latency: int) -> int | None:
        look, fade = low_latency_params(exact_latency)
        return look + fade if look + fade < exact_latency else None

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        return ExactStreamModel(name, model, config, device, low_params=low_latency_params)
