"""The wire between the engine and its worker (see the messages below)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StreamOptions"]


@dataclass(frozen=True)
class StreamOptions:
    """How a stream is opened: the generic options, and the family's own (``extra``,
    from its ``StreamPlan.options``)."""

    noise: bool = False
    seed: int = 0
    latency: str = "exact"  # "exact" or "low"
    voice: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
