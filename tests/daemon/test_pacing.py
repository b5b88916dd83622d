"""Pacing of codes to real time (codecd.pacing), sans-I/O: what may go when, whole groups only."""

from __future__ import annotations

import numpy as np

from codecd.pacing import Pacer

STRIDES = (4, 2, 1)  # SNAC 24 kHz: one coarse code = 4 frames


def _codes(frames: int) -> list[np.ndarray]:
    return [np.arange(frames // s, dtype=np.int32) for s in STRIDES]


def _frames(levels: list[np.ndarray]) -> int:
    return max(a.size * s for a, s in zip(levels, STRIDES))


def test_codes_go_at_most_max_ahead_of_real_time():
    """At t0 only max_ahead worth of frames go, cut at whole coarse groups; the rest follows
    as time passes, in order."""
    ps = Pacer().open("k", frames_per_s=100.0, strides=STRIDES)  # 100 frames per second
    assert ps.start(10.0) and not ps.start(10.5)
    ps.hold(_codes(40))
    first = list(ps.due(10.0, max_ahead_s=0.1))  # budget 10 frames -> 8 (two groups)
    assert [_frames(c) for c in first] == [8]
    assert list(ps.due(10.0, 0.1)) == []
    later = list(ps.due(10.25, 0.1))  # budget 35 -> 27 more, cut to 24
    assert [_frames(c) for c in later] == [24]
    rest = list(ps.due(11.0, 0.1))
    assert [_frames(c) for c in rest] == [8] and not ps.held
    got = [np.concatenate(x) for x in zip(*(first + later + rest))]
    assert all(np.array_equal(g, w) for g, w in zip(got, _codes(40)))


def test_end_waits_for_held_codes():
    """An end with codes held waits, and is due once, after the last of them."""
    ps = Pacer().open("k", 100.0, STRIDES)
    assert not ps.hold_finish()  # nothing held: the end goes at once
    ps.start(0.0)
    ps.hold(_codes(20))
    list(ps.due(0.0, 0.08))
    assert ps.hold_finish() and not ps.finish_due()
    list(ps.due(1.0, 0.08))
    assert ps.finish_due() and not ps.finish_due()


def test_a_consumer_that_stops_leaves_the_rest_held():
    """A failed push (the consumer stops) does not count the frames it was given."""
    pacer = Pacer()
    ps = pacer.open("k", 100.0, STRIDES)
    ps.start(0.0)
    ps.hold(_codes(8))
    ps.hold(_codes(8))
    for _ in ps.due(1.0, 0.0):
        break
    assert ps.frames_pushed == 0 and len(ps.held) == 1
    assert pacer.waiting() == [ps]
    pacer.drop("k")
    assert pacer.get("k") is None and len(pacer) == 0
