"""What a session asks of the server: engine commands and connection output (sans-I/O).

:class:`codecd.session.Session` returns lists of these actions; the server
carries them out in order. :class:`StreamKey` is the engine key of one stream of
one session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "StreamKey", "EngineOpen", "EnginePush", "EngineFinish", "EngineCancel", "GenerateText",
    "SendText",
    "SendBinary", "Close", "Action",
]


@dataclass(frozen=True)
class StreamKey:
    """Opaque engine key of one stream of one session (never reused)."""

    session: int
    serial: int
    stream_id: str

    def __str__(self) -> str:
        return f"{self.session}.{self.serial}:{self.stream_id}"


@dataclass(frozen=True)
class EngineOpen:
    key: StreamKey
    model: str
    noise: bool = False
    seed: int | None = None
    latency: str = "exact"
    voice: str | None = None
    #: the model family's own options for the stream (its StreamPlan's)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class EnginePush:
    """Codes to decode: one int32 array per level of the model, any lengths (may be empty)."""

    key: StreamKey
    levels: list[npt.NDArray[np.int32]]


@dataclass(frozen=True)
class EngineFinish:
    """No more codes: decode the rest, then report ``on_done``."""

    key: StreamKey


@dataclass(frozen=True)
class EngineCancel:
    """Drop the stream (no ``on_done`` expected). Must be a no-op for a key already gone."""

    key: StreamKey


@dataclass(frozen=True)
class GenerateText:
    """Have the upstream LM speak ``text`` in ``voice`` into the stream (a ``start`` with
    ``text``): its tokens come back through :meth:`Session.text_tokens`."""

    key: StreamKey
    text: str
    voice: str


@dataclass(frozen=True)
class SendText:
    data: str


@dataclass(frozen=True)
class SendBinary:
    """A binary frame; an audio frame names its stream and the seconds of audio it carries
    (the connection's output budget counts them until the frame is written)."""

    data: bytes
    key: StreamKey | None = None
    audio_s: float = 0.0


@dataclass(frozen=True)
class Close:
    """Close the connection with this websocket close code and reason (<= 123 bytes)."""

    code: int
    reason: str


Action = Union[EngineOpen, EnginePush, EngineFinish, EngineCancel, GenerateText, SendText,
               SendBinary, Close]
