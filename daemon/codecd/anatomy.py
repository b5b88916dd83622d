"""Where a tick's wall time goes, tick by tick (issue 17).

The worker's phase counters (``PhaseClock``) add up time over a run, so a tick that took 114 ms
while most took 70 ms leaves no trace in them. :class:`TickAnatomy` keeps the parts of each
recent tick of a model and summarises them twice: over all of them and over the slowest tenth,
so a slow tail names its cause (a long launch: a graph built or buffers reallocated; a long
overlap: the fronts' pushes read while the device computed took longer than the device; a long
wait: the device itself; the garbage collector; a late start).

A tick of the native path, in order::

    launch   codecrt.step_begin: build or reuse the graph, set its inputs, launch it; the
             runtime's own split of its last launch (codecrt_stats) is
             acquire  (the graph reused, or built and allocated),
             inputs   (the streams' codes, slots and time inputs filled and copied) and
             enqueue  (the graph handed to ggml: on a GPU the kernels enqueued, plus any
                      wait ggml makes there for the device, e.g. at a backend split)
    overlap  flush earlier events, read every front's pushes (the device computes meanwhile)
    wait     codecrt.step_end: what is left of the device's work, then the outputs
    collect  pull every stream's PCM, cut it into AUDIO packets

``gc`` is the collector's time inside the tick (``codecd.stalls.GcClock``), ``graphs`` the graphs the
runtime built for it, ``grew`` 1 when the context's compute buffers grew (ggml reallocated them: on a GPU, a
device synchronisation and an allocation), ``late`` how far its start was behind the tick
boundary it was due at (aligned ticks only), ``batch`` its streams. A step that is not split (other stream kinds, or no fronts) is all
``launch``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["TickParts", "TickAnatomy", "PARTS"]


@dataclass(slots=True)
class TickParts:
    """One tick of one model; times in ms."""

    total: float = 0.0
    launch: float = 0.0
    acquire: float = 0.0
    inputs: float = 0.0
    enqueue: float = 0.0
    overlap: float = 0.0
    wait: float = 0.0
    collect: float = 0.0
    gc: float = 0.0
    late: float = 0.0
    graphs: int = 0
    grew: int = 0
    batch: int = 0


#: the fields summarised, in TickParts' order
PARTS: tuple[str, ...] = tuple(f.name for f in fields(TickParts))


class TickAnatomy:
    """The parts of a model's last ``maxlen`` ticks and their summary."""

    def __init__(self, maxlen: int = 1024) -> None:
        self.ticks: deque[TickParts] = deque(maxlen=maxlen)

    def add(self, t: TickParts) -> None:
        self.ticks.append(t)

    def summary(self) -> dict[str, Any]:
        """``{"ticks": n, "all": {part: mean}, "slowest": {part: mean}}``; "slowest" is the
        tenth of the ticks with the longest total (at least one)."""
        ts = list(self.ticks)
        if not ts:
            return {"ticks": 0, "all": {}, "slowest": {}}
        slow = sorted(ts, key=lambda t: t.total, reverse=True)[:max(1, len(ts) // 10)]
        return {"ticks": len(ts), "all": _means(ts), "slowest": _means(slow)}


def _means(ts: list[TickParts]) -> dict[str, float]:
    return {p: round(sum(getattr(t, p) for t in ts) / len(ts), 3) for p in PARTS}
