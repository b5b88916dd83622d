"""``python -m bench frames --paced``: both ways a connection can take a front's traffic serve
every frame pair at the paced rate (real websockets on loopback, the client in a process)."""

from __future__ import annotations

import asyncio

import pytest


@pytest.mark.parametrize("way", ["handler", "direct"])
def test_paced_frames_are_all_answered(way: str) -> None:
    from bench.frames import PERIOD_S, _serve_paced

    cpu, rate = asyncio.run(_serve_paced(way, 4, 2, 3.5, None))
    want = 4 * 2 / PERIOD_S  # pairs a second
    assert 0.8 * want < rate < 1.2 * want, (rate, want)
    assert 0 < cpu < 0.01  # seconds of CPU per pair
