"""The load benchmarks' player models (bench/fronts.py), on arrivals made up here: the
criterion's 200 ms buffer counts what ``codecd play`` would do with a row's frames."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench/

from bench.fronts import late_frames, primed_play  # noqa: E402
from bench.serve import RunResult, StreamResult  # noqa: E402

SR = 24000
FRAME = 2048  # one SNAC 24 kHz 4-frame step: 85.3 ms
P = FRAME / SR


def row(ttfa: float, gaps: list[float]) -> RunResult:
    n = len(gaps) + 1
    s = StreamResult(ttfa=ttfa, gaps=gaps, samples=n * FRAME, t_first=100.0, sizes=[FRAME] * n)
    return RunResult(1, [s], 1.0, None)


def test_steady_cadence_plays_from_the_third_frame() -> None:
    """200 ms of audio is buffered at the third 85.3 ms frame; nothing is late."""
    starts, late = primed_play(row(0.2, [P] * 20))
    assert abs(starts[0] - (0.2 + 2 * P)) < 1e-9 and late == []
    assert late_frames(row(0.2, [P] * 20)) == []


def test_an_early_first_frame_costs_only_the_fixed_delay_player() -> None:
    """First audio a period early (an express tick), the rest on the cadence: codecd play waits
    for its 200 ms and has its usual margin; a player that starts 200 ms after the first frame
    is left 115 ms in hand, so a 140 ms stall later is late there and not for codecd play."""
    gaps = [2 * P] + [P] * 10 + [P + 0.14] + [P] * 10
    starts, late = primed_play(row(0.1, gaps))
    assert abs(starts[0] - (0.1 + 3 * P)) < 1e-9 and late == []
    assert [i for _, i, _ in late_frames(row(0.1, gaps))] == [12]


def test_a_stall_longer_than_the_buffer_is_late_once() -> None:
    """A 300 ms stall mid-stream: one late frame, then playback goes on without priming."""
    gaps = [P] * 10 + [P + 0.3] + [P] * 10
    starts, late = primed_play(row(0.2, gaps))
    assert [(t - 100.0 > 0, i) for t, i, _ in late] == [(True, 11)]


def test_gap_p99_split_separates_the_first_gap() -> None:
    """An early first audio lengthens the gap after it and no other; a missed tick mid-stream
    lengthens a later one: the split says which gap the criterion's pooled p99 comes from."""
    early = RunResult(2, [StreamResult(ttfa=0.1, gaps=[2 * P] + [P] * 30)] * 2, 1.0, None)
    assert early.gap_p99_split() == (2 * P, P)
    missed = RunResult(1, [StreamResult(ttfa=0.1, gaps=[P] * 15 + [2 * P] + [P] * 15)], 1.0, None)
    first, later = missed.gap_p99_split()
    assert first == P and later > 1.5 * P


def test_send_lag_pools_every_message() -> None:
    """The clients' own lag behind their send schedule, over every message of every stream:
    the row's note that tells a late load generator from a late daemon."""
    a = StreamResult(send_lags=[0.0] * 99 + [0.050])
    b = StreamResult(send_lags=[0.001] * 100)
    r = RunResult(2, [a, b], 1.0, None)
    assert r.send_lag(100) == 0.050
    assert 0.001 <= r.send_lag(99) < 0.050
    assert math.isnan(RunResult(1, [StreamResult()], 1.0, None).send_lag(99))  # no message sent
