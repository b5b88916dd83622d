"""codecd.budget: the audio a connection owes its client, and the room left for its streams."""

from __future__ import annotations

import math

from codecd.budget import OutputBudget

GROUP = 0.01


def test_room_shrinks_with_queued_and_decodable_audio() -> None:
    """Room is the budget less queued audio and the engine's audio beyond its hold."""
    b = OutputBudget(1.0)
    b.open("a", hold_s=0.2)
    assert math.isclose(b.room_s("a", GROUP), 1.0)
    b.released("a", 0.5)  # 0.3 s beyond the hold
    assert math.isclose(b.room_s("a", GROUP), 0.7)
    b.produced("a", 0.3)
    b.queued(0.3, 600)
    assert math.isclose(b.owed_s, 0.3)
    b.sent(0.3, 600)
    assert b.owed_s == 0 and b.queued_bytes == 0


def test_full_budget_waits_for_the_client_then_resumes() -> None:
    """With the budget full of queued audio no codes may go; reading frees room."""
    b = OutputBudget(0.5)
    b.open("a", hold_s=0.0)
    for _ in range(5):
        b.queued(0.1, 100)
    assert b.room_s("a", GROUP) == 0.0
    b.sent(0.1, 100)
    assert math.isclose(b.room_s("a", GROUP), 0.1)
    assert math.isclose(b.peak_queued_s, 0.5)


def test_decoder_hold_never_stalls_a_stream() -> None:
    """Nothing queued: a stream may always add one group, whatever the engine holds."""
    b = OutputBudget(0.1)
    for k in "abcd":
        b.open(k, hold_s=0.0)
        b.released(k, 0.05)  # the engine holds 0.2 s that needs more codes to come out
    assert b.room_s("a", GROUP) == GROUP
    b.queued(0.01, 10)
    assert b.room_s("a", GROUP) == 0.0


def test_dropped_stream_frees_its_engine_share_not_its_queue() -> None:
    """A stream that ends leaves the engine's count; its queued frames count until written."""
    b = OutputBudget(1.0)
    b.open("a", hold_s=0.0)
    b.released("a", 0.6)
    b.produced("a", 0.2)
    b.queued(0.2, 10)
    assert math.isclose(b.owed_s, 0.6)
    b.drop("a")
    assert math.isclose(b.owed_s, 0.2)
    b.sent(0.2, 10)
    assert b.owed_s == 0


def test_no_budget_never_limits() -> None:
    """A budget of 0 gives every stream unlimited room."""
    b = OutputBudget(0.0)
    b.open("a", hold_s=0.0)
    b.queued(100.0, 1)
    assert b.room_s("a", GROUP) == math.inf
