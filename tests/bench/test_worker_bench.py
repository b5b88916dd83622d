"""``python -m bench worker``: the worker with one or several front channels takes every
stream's codes and gives every stream its audio each timed tick (bench.worker raises
otherwise); a tick's audio that cannot fit a front's ring is refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("fronts", [1, 3])
def test_every_stream_gets_its_audio_each_tick(fronts: int) -> None:
    from bench.worker import run_daemon_side, tiny_model

    d = run_daemon_side(str(tiny_model()), 48, 2, "cpu", 1, np.random.default_rng(0),
                        per_record=5, fronts=fronts)
    assert len(d["wall"]) == 2
    assert d["phases_cpu"]["ingest"] > 0 and d["phases_cpu"]["collect"] > 0


def test_a_tick_that_cannot_fit_a_front_ring_is_refused_with_advice() -> None:
    from bench.worker import run_daemon_side, tiny_model

    with pytest.raises(SystemExit, match="use more --fronts"):
        run_daemon_side(str(tiny_model()), 2400, 1, "cpu", 1, np.random.default_rng(0),
                        per_record=5, fronts=1)
