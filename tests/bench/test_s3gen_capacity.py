"""bench/s3gen_capacity.py's bookkeeping: the chunks an utterance is cut into, each tick's budget."""

from __future__ import annotations

import argparse

import pytest

from bench.s3gen_capacity import Row, chunk_plan, growth_of


class Ceilings:
    """What chunk_plan reads of a FlowStream: its chunks' ceilings (first 10, then 25 grown by F up to M)."""

    def __init__(self, growth: float = 1.0, max_chunk: int = 100) -> None:
        self.growth, self.max_chunk = growth, max_chunk

    def chunk_ceiling(self, k: int) -> int:
        return 10 if k == 0 else min(self.max_chunk, round(25 * self.growth ** (k - 1)))


@pytest.mark.parametrize("growth, n_tok, plan", [
    (1.0, 150, [10, 25, 25, 25, 25, 25, 15]),
    (1.0, 38, [10, 28]),                     # the last chunk takes the rest when it fits in its ceiling + 3
    (2.0, 150, [10, 25, 50, 65]),
    (2.0, 300, [10, 25, 50, 100, 100, 15]),
    (2.0, 12, [12]),                        # 12 <= 10 + 3 lookahead: one chunk
])
def test_chunk_plan_follows_the_ceilings_and_the_last_chunk_takes_the_rest(growth, n_tok, plan):
    assert chunk_plan(Ceilings(growth), n_tok) == plan and sum(plan) == n_tok


def test_a_ticks_budget_is_the_previous_chunks_audio_and_real_time_is_the_load():
    row = Row("turbo", 2, 1, later=[0.9, 1.5], budgets=[1.0, 2.0])
    assert row.budget_ms(25) == 1000.0 and row.load() == pytest.approx(0.9, abs=2e-3)  # p99 of 0.9 and 0.75
    assert row.real_time()
    row.later[1] = 2.2  # over its 2 s budget
    assert not row.real_time()


def test_growth_of_the_arguments():
    ns = argparse.Namespace
    assert growth_of(ns(chunk_growth=1.0, max_chunk=0)) is None
    assert growth_of(ns(chunk_growth=2.0, max_chunk=0)) == {"chunk_growth": 2.0, "max_chunk": None}
    assert growth_of(ns(chunk_growth=1.5, max_chunk=60)) == {"chunk_growth": 1.5, "max_chunk": 60}
