"""The streams one engine has on its worker: ids, keys, per-model counts and backlog.

The caller's key (any hashable) is mapped to a stream id (``sid``) that is
unique per engine and never reused, so late results from a worker for a stream
that is gone never reach a new stream with the same key.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StreamRecord", "StreamTable"]


@dataclass(eq=False)
class StreamRecord:
    key: Hashable
    sid: int
    model: str
    strides: tuple[int, ...]
    hop: int
    codes: list[int] = field(default_factory=list)  # codes pushed per level
    samples: int = 0  # samples received
    finished: bool = False

    def count_codes(self, levels: Sequence[Any]) -> None:
        for i, a in enumerate(levels[: len(self.codes)]):
            self.codes[i] += int(a.size)

    def backlog_frames(self) -> int:
        """Frames pushed (complete over every level) and not yet returned as audio."""
        frames = min((c * s for c, s in zip(self.codes, self.strides)), default=0)
        return frames - self.samples // max(self.hop, 1)


class StreamTable:
    """sid <-> key for one engine's open streams."""

    def __init__(self) -> None:
        self._sids = itertools.count(1)
        self._by_sid: dict[int, StreamRecord] = {}
        self._by_key: dict[Hashable, StreamRecord] = {}

    def __len__(self) -> int:
        return len(self._by_sid)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._by_key

    def add(self, key: Hashable, model: str, strides: Sequence[int], hop: int,
            n_levels: int) -> StreamRecord:
        rec = StreamRecord(key, next(self._sids), model, tuple(strides), hop, [0] * n_levels)
        self._by_sid[rec.sid] = rec
        self._by_key[key] = rec
        return rec

    def get(self, key: Hashable) -> StreamRecord | None:
        return self._by_key.get(key)

    def of_sid(self, sid: int) -> StreamRecord | None:
        return self._by_sid.get(sid)

    def forget_sid(self, sid: int) -> StreamRecord | None:
        rec = self._by_sid.pop(sid, None)
        if rec is not None:
            self._by_key.pop(rec.key, None)
        return rec

    def forget_key(self, key: Hashable) -> StreamRecord | None:
        rec = self._by_key.pop(key, None)
        if rec is not None:
            self._by_sid.pop(rec.sid, None)
        return rec

    def clear(self) -> list[StreamRecord]:
        """Forget every stream; the records, in the order they were opened."""
        recs = list(self._by_sid.values())
        self._by_sid.clear()
        self._by_key.clear()
        return recs

    def count(self, model: str) -> int:
        return sum(1 for r in self._by_sid.values() if r.model == model)
