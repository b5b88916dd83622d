"""``python -m bench frames --paced``: both ways a connection can take a front's traffic answer
every frame the client sends, at its pace (real websockets on loopback, the client in a
process that counts what it sent and received)."""

from __future__ import annotations

import asyncio

import pytest


@pytest.mark.parametrize("way", ["handler", "direct"])
def test_paced_frames_are_all_answered(way: str) -> None:
    from bench.frames import PERIOD_S, _serve_paced

    cpu, rate, sent, got = asyncio.run(_serve_paced(way, 4, 2, 3.5, None))
    assert got == sent > 0.9 * 3.5 * 4 * 2 / PERIOD_S  # every frame answered, at the pace
    assert 0 < cpu < 0.01 and rate > 0  # seconds of CPU per pair
