"""bench/edges.py's run: N streams fed a tick at a time and finished together end done, one row of
tick times per tick, the flush's ticks after the codes' (the tiny SNAC model of bench/worker.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench/

from bench.edges import FRAMES_PER_TICK, run  # noqa: E402


def test_streams_fed_a_tick_at_a_time_and_finished_together_end_done():
    import codecrt

    from bench.worker import tiny_model

    frames = 10 * FRAMES_PER_TICK
    with codecrt.Model(str(tiny_model())) as m, codecrt.Context(m, device="cpu", n_threads=1, max_batch=3,
                                                                max_streams=3) as ctx:
        ticks = run(ctx, 3, frames, np.random.default_rng(0))
        again = run(ctx, 3, frames, np.random.default_rng(0))
    assert frames // FRAMES_PER_TICK < len(ticks) <= frames // FRAMES_PER_TICK + 8
    assert len(again) == len(ticks) and all(w > 0 for w, _ in ticks)
    assert sum(g for _, g in again) == 0  # the second run reuses every graph of the first
