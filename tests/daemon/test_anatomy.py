"""codecd.anatomy: the per-tick record the worker keeps (issue 17), and the collector's clock."""

from __future__ import annotations

import gc

from codecd.anatomy import PARTS, TickAnatomy, TickParts
from codecd.stalls import GcClock


def test_summary_means_all_ticks_and_the_slowest_tenth() -> None:
    an = TickAnatomy(maxlen=100)
    assert an.summary() == {"ticks": 0, "all": {}, "slowest": {}}
    for i in range(120):  # the first 20 fall out of the window
        slow = i % 10 == 9
        an.add(TickParts(total=100.0 if slow else 10.0, launch=1.0, overlap=2.0,
                         wait=90.0 if slow else 5.0, collect=2.0, graphs=1 if slow else 0,
                         batch=i))
    s = an.summary()
    assert s["ticks"] == 100
    assert set(s["all"]) == set(PARTS) == set(s["slowest"])
    assert s["slowest"]["total"] == 100.0 and s["slowest"]["wait"] == 90.0
    assert s["slowest"]["graphs"] == 1.0
    assert s["all"]["total"] == 19.0  # 10 slow ticks of 100 ms among 100
    assert s["all"]["batch"] == sum(range(20, 120)) / 100


def test_gc_clock_times_real_collections() -> None:
    clock = GcClock().install()
    try:
        garbage = [[i] for i in range(200_000)]
        for g in garbage:
            g.append(g)  # reference cycles: only the collector frees them
        del garbage
        gc.collect()
        assert clock.collections >= 1 and clock.ms > 0
    finally:
        clock.uninstall()
    n = clock.collections
    gc.collect()
    assert clock.collections == n  # uninstalled: no longer counting
