"""What an engine tells its caller: stream events, and the refusals it raises at once."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "Opened", "Audio", "Done", "StreamError", "EngineEvent", "EventCallback",
    "EngineError", "EngineStartError", "BackpressureError", "BusyError", "UnknownModelError",
    "DuplicateStreamError", "UnknownStreamError", "ENGINE_RESTARTED", "SHUTTING_DOWN",
]

#: error codes of streams the engine itself ends
ENGINE_RESTARTED = "engine_restarted"
SHUTTING_DOWN = "shutting_down"


# ------------------------------------------------------------------------ events



@dataclass(frozen=True)
class Opened:
    key: Hashable
    worker: int
    latency_samples: int
    sample_rate: int
    chunk_frames: int


@dataclass(frozen=True, eq=False)
class Audio:
    key: Hashable
    pcm: npt.NDArray[np.float32]  # final samples, model rate, in order


@dataclass(frozen=True)
class Done:
    key: Hashable
    total_samples: int


@dataclass(frozen=True)
class StreamError:
    key: Hashable
    code: str
    message: str


EngineEvent = Union[Opened, Audio, Done, StreamError]
EventCallback = Callable[[EngineEvent], object]

# -------------------------------------------------------------------- exceptions


class EngineError(Exception):
    """A request the engine refuses at once; ``code`` is the error code for the client."""

    code = "engine_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class EngineStartError(EngineError):
    """A worker could not be started (bad model path, device, start-up timeout)."""

    code = "engine_error"


class BackpressureError(EngineError):
    """The stream's backlog is over ``max_backlog_frames``: the worker is behind."""

    code = "backlog_exceeded"


class BusyError(EngineError):
    """No worker can take the request now (slots full, restarting, queue full)."""

    code = "busy"


class UnknownModelError(EngineError):
    code = "unknown_model"


class DuplicateStreamError(EngineError):
    code = "duplicate_stream"


class UnknownStreamError(EngineError):
    code = "unknown_stream"
