"""TickCost: a tick's wall time as a line in its batch, which first_audio = "now" fits its
express ticks by (daemon/codecd/tickcost.py)."""

from __future__ import annotations

import pytest

from codecd.tickcost import TickCost


def test_the_line_through_ticks_of_several_sizes() -> None:
    """Ticks of 4.5 ms plus 0.06 ms a stream (the H200's SNAC ticks, about): the fit gives
    them back, and the largest batch within a budget follows."""
    c = TickCost()
    assert not c.known and c.predict(100) == 0.0
    for n in (1000, 64, 900, 12, 1000, 200):
        c.add(n, 4.5 + 0.06 * n)
    assert c.known
    assert c.predict(0) == pytest.approx(4.5)
    assert c.predict(500) == pytest.approx(34.5)
    assert c.most_within(10.5, 1000) == 100
    assert c.most_within(10.5, 40) == 40  # all of them fit
    assert c.most_within(4.0, 1000) == 0  # not even one
    assert c.most_within(-1.0, 1000) == 0


def test_ticks_of_one_size_promise_no_cheaper_tick() -> None:
    """Before ticks of another size, a smaller tick is taken to cost as much as those seen
    (the fixed cost is unknown) and a larger one proportionally more."""
    c = TickCost()
    for _ in range(3):
        c.add(900, 60.0)
    assert c.predict(10) == pytest.approx(60.0)
    assert c.predict(1800) == pytest.approx(120.0)
    assert c.most_within(30.0, 50) == 0


def test_a_negative_slope_or_intercept_is_not_believed() -> None:
    """Noise may tilt the fit: a slope below zero falls back to the mean, an intercept below
    zero to none."""
    c = TickCost()
    c.add(10, 20.0)
    c.add(100, 10.0)
    assert c.predict(1) == pytest.approx(15.0, rel=0.01)  # their mean (the older one weighs less)
    c = TickCost()
    c.add(10, 1.0)
    c.add(110, 21.0)  # the line -1 + 0.2 n
    assert c.predict(0) == 0.0 and c.predict(50) == pytest.approx(10.0)


def test_older_ticks_weigh_less() -> None:
    """The device's cost moves (other work, clocks): after a half-life of ticks at the new cost,
    the estimate is nearer it than the old one."""
    c = TickCost(half_life=4)
    for _ in range(20):
        c.add(100, 10.0)
    for _ in range(4):
        c.add(100, 30.0)
    assert 20.0 < c.predict(100) < 30.0


def test_spread_measures_how_far_ticks_stray_from_the_line() -> None:
    """Ticks on the line have no spread; ticks alternating 10 ms either side of it have about
    10 ms; none is claimed before ticks of two sizes make a line."""
    c = TickCost()
    c.add(100, 10.0)
    c.add(100, 30.0)
    assert c.spread() == 0.0  # one size: no line yet
    c = TickCost()
    for n in (100, 200, 300, 400) * 4:
        c.add(n, 5.0 + 0.05 * n)
    assert c.spread() == pytest.approx(0.0, abs=1e-6)
    c = TickCost()
    for i in range(200):
        c.add(100 + (i % 3) * 100, 5.0 + 0.05 * (100 + (i % 3) * 100) + (10.0 if i % 2 else -10.0))
    assert c.spread() == pytest.approx(10.0, rel=0.15)
    # a tick that built a graph (steady=False) moves the line a little, the spread not at all
    before = c.spread()
    c.add(200, 300.0, steady=False)
    assert c.spread() == before
    c.add(200, 300.0)
    assert c.spread() > 2 * before
