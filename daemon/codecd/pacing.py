"""Pacing, sans-I/O: a stream's codes reach the engine at most ``max_ahead_s`` of audio ahead
of real time since its first push.

The rest waits here as codes (about 100x smaller than the PCM they become; the
session's backlog limit bounds them), so the audio produced and sent is never
more than that far ahead of what a listener plays. The server asks what is due
(:meth:`PacedStream.due`) when codes arrive and periodically, and hands it to
the engine; an ``end`` waits until the held codes have gone.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["PacedStream", "Pacer"]

Codes = list[npt.NDArray[np.int32]]


@dataclass(eq=False)
class PacedStream:
    """Codes of one stream not yet handed to the engine, and its timing."""

    key: Hashable
    frames_per_s: float
    strides: tuple[int, ...]
    t0: float | None = None  # the first push
    frames_pushed: int = 0
    held: collections.deque[Codes] = field(default_factory=collections.deque)
    finish_held: bool = False

    @property
    def max_stride(self) -> int:
        return max(self.strides, default=1)

    def start(self, now: float) -> bool:
        """Note the first push's time; True on the first push only."""
        if self.t0 is not None:
            return False
        self.t0 = now
        return True

    def hold(self, levels: Codes) -> None:
        self.held.append(levels)

    def hold_finish(self) -> bool:
        """An ``end``: True when it must wait for held codes (it is then held)."""
        if self.held:
            self.finish_held = True
            return True
        return False

    def due(self, now: float, max_ahead_s: float, max_frames: float = math.inf
            ) -> Iterator[Codes]:
        """The held codes that may go now, whole groups of the coarsest level; each one yielded
        counts as handed over once the consumer asks for the next (a consumer that stops
        after a failed push leaves the rest held). ``max_ahead_s`` inf: no pacing;
        ``max_frames``: at most this many frames now (the connection's output budget)."""
        assert self.t0 is not None
        ahead = (now - self.t0 + max_ahead_s) * self.frames_per_s
        cap = min(ahead, self.frames_pushed + max_frames)
        allowed = self.frames_pushed + (1 << 62) if math.isinf(cap) else int(cap)
        while self.held:
            budget = allowed - self.frames_pushed
            if budget <= 0:
                return
            arrs = self.held[0]
            frames = max((a.size * s for a, s in zip(arrs, self.strides)), default=0)
            if frames > budget:
                f = (budget // self.max_stride) * self.max_stride
                if f <= 0:
                    return
                head = [a[: f // s] for a, s in zip(arrs, self.strides)]
                self.held[0] = [a[f // s:] for a, s in zip(arrs, self.strides)]
                arrs, frames = head, f
            else:
                self.held.popleft()
            yield arrs
            self.frames_pushed += frames

    def finish_due(self) -> bool:
        """A held ``end`` may go now (every held code has gone); True once."""
        if self.finish_held and not self.held:
            self.finish_held = False
            return True
        return False


class Pacer:
    """The paced streams of a server, by key."""

    def __init__(self) -> None:
        self._streams: dict[Hashable, PacedStream] = {}

    def open(self, key: Hashable, frames_per_s: float, strides: Sequence[int]) -> PacedStream:
        ps = self._streams[key] = PacedStream(key, frames_per_s, tuple(strides))
        return ps

    def get(self, key: Hashable) -> PacedStream | None:
        return self._streams.get(key)

    def drop(self, key: Hashable) -> None:
        self._streams.pop(key, None)

    def waiting(self) -> list[PacedStream]:
        """The streams with codes or an ``end`` held."""
        return [ps for ps in self._streams.values() if ps.held or ps.finish_held]

    def __len__(self) -> int:
        return len(self._streams)
