"""How long a front's event loop and its garbage collector stalled (issue 17).

A front that stops reading its sockets for 20 ms holds back the codes of every stream it
serves by that much, and a worker's tick that was due meanwhile goes without them: from the
worker the late codes look like a late load generator. These two histograms tell the fronts'
part. :class:`LoopStalls` wakes every ``interval_s`` and counts how late each wake-up came
(a callback that ran long, a burst of sends, the collector, the process scheduled out);
:class:`GcClock` counts each collection by its length (``gc.callbacks``). Both are
cumulative counts per bucket, summed by main across fronts like any other histogram.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BUCKETS_S", "Histogram", "LoopStalls", "GcClock"]

#: upper bounds of the buckets, seconds (the last bucket, +Inf, is implicit)
BUCKETS_S: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


class Histogram:
    """Counts per bucket of ``BUCKETS_S`` (and one above), their sum and the largest value."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.sum = 0.0
        self.largest = 0.0

    def add(self, v: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, v)] += 1
        self.sum += v
        if v > self.largest:
            self.largest = v

    def as_dict(self) -> dict[str, Any]:
        """Cumulative buckets as Prometheus writes them: [[le, count], ...] ending at +Inf."""
        out, acc = [], 0
        for le, n in zip((*map(str, BUCKETS_S), "+Inf"), self.counts):
            acc += n
            out.append([le, acc])
        return {"buckets": out, "sum": self.sum, "count": acc, "largest": self.largest}


class LoopStalls:
    """The lateness of a periodic wake-up of the running event loop: every ``interval_s``
    while ``busy()`` (a front with open streams), every ``idle_s`` otherwise, so that an idle
    daemon's fronts wake 10 times a second, not 200."""

    def __init__(self, interval_s: float = 0.005, idle_s: float = 0.1,
                 busy: Callable[[], bool] = lambda: True) -> None:
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.busy = busy
        self.late = Histogram()

    async def run(self) -> None:
        while True:
            wait = self.interval_s if self.busy() else self.idle_s
            due = time.monotonic() + wait
            await asyncio.sleep(wait)
            self.late.add(max(0.0, time.monotonic() - due))


class GcClock:
    """The garbage collector's time in this process since :meth:`install` (its ``start`` and
    ``stop`` callbacks; one per process): the total in ms and the count, which the worker's
    tick anatomy reads, and each collection's length in ``pauses``, which a front exports."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.collections = 0
        self.pauses = Histogram()  # seconds
        self._t = 0.0

    def install(self) -> GcClock:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t:
            dt = time.perf_counter() - self._t
            self.ms += dt * 1e3
            self.collections += 1
            self.pauses.add(dt)
            self._t = 0.0
