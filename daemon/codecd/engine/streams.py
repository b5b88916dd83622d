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

import numpy as np
import numpy.typing as npt

__all__ = ["StreamRecord", "StreamTable", "CodesError", "int32_levels"]


class CodesError(ValueError):
    """Codes the wire cannot carry; ``code`` is the error code the runtime would report."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def int32_levels(levels: Sequence[npt.ArrayLike]) -> list[npt.NDArray[np.int32]]:
    """Codes as the wire carries them: one 1-D int32 array per level (no copy when they are).
    CodesError for codes that are not integers, not 1-D, or do not fit int32."""
    out = []
    for i, level in enumerate(levels):
        a = np.asarray(level)
        if a.dtype != np.int32:
            if a.size == 0:
                a = a.astype(np.int32)
            elif a.dtype.kind not in "iu":
                raise CodesError("bad_codes", f"codes level {i}: dtype {a.dtype} is not an "
                                              "integer dtype")
            else:
                lo, hi = int(a.min()), int(a.max())
                if lo < -(2**31) or hi >= 2**31:
                    raise CodesError("token_range", f"codes level {i}: code "
                                     f"{lo if lo < -(2**31) else hi} does not fit int32")
                a = a.astype(np.int32)
        if a.ndim != 1:
            raise CodesError("broken_group", "stream codes must be 1-D arrays, one per level")
        out.append(a)
    return out


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
