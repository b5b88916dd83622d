"""codecd.stalls: the fronts' event-loop lateness and collector pauses, as histograms."""

from __future__ import annotations

import asyncio
import gc
import time

from codecd.stalls import BUCKETS_S, GcClock, Histogram, LoopStalls


def test_histogram_buckets_are_cumulative_and_keep_the_largest() -> None:
    h = Histogram()
    for v in (0.0, 0.0005, 0.001, 0.003, 0.03, 2.0):
        h.add(v)
    d = h.as_dict()
    les = [le for le, _ in d["buckets"]]
    assert les == [*map(str, BUCKETS_S), "+Inf"]
    cum = dict(d["buckets"])
    assert cum["0.001"] == 3  # bounds are inclusive, as Prometheus' le
    assert cum["0.005"] == 4 and cum["0.05"] == 5 and cum["0.5"] == 5 and cum["+Inf"] == 6
    assert d["count"] == 6 and d["largest"] == 2.0
    assert abs(d["sum"] - 2.0345) < 1e-12


def test_a_blocked_loop_is_counted_late() -> None:
    """A callback that holds the loop 60 ms makes one wake-up at least 50 ms late."""

    async def main() -> LoopStalls:
        s = LoopStalls(interval_s=0.005)
        task = asyncio.create_task(s.run())
        await asyncio.sleep(0.05)
        time.sleep(0.06)  # the loop is blocked: no timer can fire
        await asyncio.sleep(0.2)  # some 40 wake-ups; a loaded box may deliver far fewer
        task.cancel()
        return s

    s = asyncio.run(main())
    d = s.late.as_dict()
    assert d["count"] >= 5
    assert d["largest"] >= 0.05
    assert d["count"] - dict(d["buckets"])["0.05"] >= 1  # one wake-up past 50 ms


def test_collections_are_timed() -> None:
    p = GcClock().install()
    try:
        gc.collect()
        gc.collect()
    finally:
        p.uninstall()
    assert p.pauses.as_dict()["count"] == 2
    gc.collect()
    assert p.pauses.as_dict()["count"] == 2  # uninstalled


def test_an_idle_front_samples_its_loop_rarely() -> None:
    """No open stream: the idle interval (here 1 s), not 5 ms."""

    async def count(busy: bool) -> int:
        s = LoopStalls(interval_s=0.005, idle_s=1.0, busy=lambda: busy)
        task = asyncio.create_task(s.run())
        await asyncio.sleep(0.3)  # some 60 samples when busy; 0 when idle (the first after 1 s)
        task.cancel()
        return int(s.late.as_dict()["count"])

    assert asyncio.run(count(False)) == 0
    assert asyncio.run(count(True)) >= 5
