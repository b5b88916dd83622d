"""What a stream or a two-stage call needs of its context, as a protocol.

:class:`codecrt.Context` creates streams and runs the flow and the vocoder; those
in turn only need the context's native handle, its lock and its model's info.
Typing them against this protocol instead of ``Context`` keeps the import graph
one-way: ``_context`` imports ``_stream`` and ``_twostage``, never the reverse.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from ._model import ModelInfo

__all__ = ["ContextLike"]


class ContextLike(Protocol):
    """The part of :class:`codecrt.Context` that streams and two-stage calls use."""

    _lock: threading.RLock
    _streams: weakref.WeakSet[Any]  # the streams to close with the context

    def _handle(self) -> Any:
        """The native ``codecrt_context *``; StateError once closed."""

    def _last_error(self) -> str:
        """The context's last native error message."""

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def max_batch(self) -> int: ...
