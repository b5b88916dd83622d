"""cadence.py: whether a worker's ticks keep its models' frame period (``tick_align_ms``).

Sans-I/O: the worker reports each tick round (its start and end on the monotonic
clock) and asks, before gathering, which period the next tick waits for (0: none,
``gather_ms`` instead).

Aligned ticks put the streams whose codes arrive spread over a frame period into one
tick a period instead of several partial ones, each of which pays the tick's fixed cost;
a stream's first audio waits for the boundary (up to a period). So:

- a fixed period (``tick_align_ms`` > 0, or auto on a GPU, where that fixed cost is large
  and full ticks pay at every load) is always kept;
- under auto on the CPU the period is kept only while the worker is loaded: from when
  its tick rounds fill ``on`` of the last ``window_s`` of wall time until they fill less
  than ``off``. On two cores (docs/benchmarks.md, 2026-12-04) 6 real-time SNAC streams
  through one daemon met the criterion in 5 runs of 6 aligned against 3 of 7 without,
  while at 1 to 4 streams alignment raised the time to first audio p99 from about 205
  to up to 287 ms for nothing. The gap between ``on`` and ``off`` keeps an aligned
  worker, whose fuller ticks leave it less busy, from switching back and forth.
"""

from __future__ import annotations

from collections import deque


class Cadence:
    """The period a worker's next tick waits for, from its recent tick rounds."""

    def __init__(self, fixed_s: float = 0.0, loaded_s: float = 0.0, *, window_s: float = 1.0,
                 on: float = 0.8, off: float = 0.4) -> None:
        if not 0.0 <= off < on <= 1.0:
            raise ValueError(f"need 0 <= off < on <= 1, got off {off}, on {on}")
        self.fixed_s = fixed_s    # kept always (0: none)
        self.loaded_s = loaded_s  # kept while loaded (0: never); ignored when fixed_s is set
        self.window_s = window_s
        self.on, self.off = on, off
        self.aligned = fixed_s > 0
        self._rounds: deque[tuple[float, float]] = deque()  # (start, end) within the window
        self._busy_s = 0.0

    def round(self, start: float, end: float) -> None:
        """A tick round ran from ``start`` to ``end`` (monotonic seconds)."""
        if self.fixed_s or not self.loaded_s:
            return
        self._rounds.append((start, end))
        self._busy_s += end - start
        self._forget(end)
        busy = self._busy_s / self.window_s
        if busy >= self.on:
            self.aligned = True
        elif busy < self.off:
            self.aligned = False

    def period_s(self, now: float) -> float:
        """The period the next tick waits for at ``now`` (monotonic seconds): 0 for none. A
        worker gone idle stops aligning once its rounds have left the window."""
        if self.fixed_s:
            return self.fixed_s
        if self.aligned and self.loaded_s:
            self._forget(now)
            if self._busy_s / self.window_s < self.off:
                self.aligned = False
        return self.loaded_s if self.aligned else 0.0

    def _forget(self, now: float) -> None:
        """Drop the rounds that ended before the window (a round is counted whole)."""
        while self._rounds and self._rounds[0][1] < now - self.window_s:
            start, end = self._rounds.popleft()
            self._busy_s -= end - start
