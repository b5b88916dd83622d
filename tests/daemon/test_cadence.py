"""The worker's tick cadence (codecd.cadence), sans-I/O: tick rounds in, the period out."""

from __future__ import annotations

import pytest

from codecd.cadence import Cadence


def rounds(c: Cadence, start: float, period: float, busy: float, n: int) -> float:
    """n tick rounds, one per period from start, each busy for that fraction of it; the end."""
    t = start
    for _ in range(n):
        c.round(t, t + busy * period)
        t += period
    return t


def test_a_fixed_period_is_kept_at_any_load() -> None:
    c = Cadence(fixed_s=0.08)
    assert c.period_s(0.0) == 0.08
    rounds(c, 0.0, 0.08, 0.1, 50)
    assert c.period_s(10.0) == 0.08


def test_the_loaded_period_follows_the_load_with_hysteresis() -> None:
    p = 0.085
    c = Cadence(loaded_s=p)
    assert c.period_s(0.0) == 0.0  # idle: gather_ms
    t = rounds(c, 0.0, p, 0.5, 30)  # half busy: not loaded
    assert c.period_s(t) == 0.0
    t = rounds(c, t, p, 0.95, 30)  # a tick round fills the period: aligned
    assert c.period_s(t) == p
    t = rounds(c, t, p, 0.6, 30)  # aligned ticks are fuller and fewer: still aligned
    assert c.period_s(t) == p
    t = rounds(c, t, p, 0.2, 30)  # the load went: off again
    assert c.period_s(t) == 0.0


def test_an_idle_worker_stops_aligning() -> None:
    p = 0.085
    c = Cadence(loaded_s=p)
    t = rounds(c, 0.0, p, 1.0, 20)
    assert c.period_s(t) == p
    assert c.period_s(t + 0.5) == p  # the last second still holds the busy rounds
    assert c.period_s(t + 1.5) == 0.0  # they left the window: the next stream goes at once


def test_no_period_no_alignment_and_bad_thresholds_refused() -> None:
    c = Cadence()
    rounds(c, 0.0, 0.085, 1.0, 30)
    assert c.period_s(3.0) == 0.0
    with pytest.raises(ValueError):
        Cadence(loaded_s=0.085, on=0.4, off=0.5)
