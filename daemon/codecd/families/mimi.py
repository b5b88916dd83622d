"""The Mimi family (Kyutai; the codec of Moshi and Sesame CSM): RVQ codes at 12.5 Hz, exact streaming.

* architectures: ``mimi``; converter ``mimi`` (kyutai/mimi's transformers folder, or
  moshi's single ``tokenizer-e351c8d8-checkpoint125.safetensors``);
* layouts: per-level codes (``levels``: one array per codebook, all at 12.5 Hz);
* codebooks: a stream sends the model's first K codebooks, K fixed at ``start``
  (``"codebooks": K``, 1..32; absent: all 32). Moshi sends 8, CSM 32. The
  runtime decodes the missing ones as absent (the split RVQ sums only what it
  gets), exactly as moshi's and transformers' ``decode`` do with K codebooks;
* streams: exact, latency 0 beyond the frame (every layer is causal: a frame's
  1,920 samples are final when its codes arrive), no voice, no low mode;
* warm-up: :class:`codecd.families.native.ExactStreamModel`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .base import Family, LoadedModel, ModelSpec, StreamPlan, StreamRefused
from .layout import LEVELS, Layout
from .native import ExactStreamModel

if TYPE_CHECKING:
    from ..protocol import Start

__all__ = ["MimiFamily"]


class MimiFamily(Family):
    name = "mimi"
    architectures = ("mimi",)
    converter = "mimi"
    layouts: ClassVar[tuple[Layout, ...]] = (LEVELS,)

    def plan_stream(self, spec: ModelSpec, start: Start) -> StreamPlan:
        plan = super().plan_stream(spec, start)
        k = spec.n_levels if start.codebooks is None else start.codebooks
        if not 1 <= k <= spec.n_levels:
            raise StreamRefused("bad_message", f"model {spec.name!r} has {spec.n_levels} codebooks; "
                                               f"a stream sends 1 to {spec.n_levels}, not {k}")
        return StreamPlan(plan.latency, plan.latency_samples, n_levels=k, options={"codebooks": k})

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        return ExactStreamModel(name, model, config, device)
