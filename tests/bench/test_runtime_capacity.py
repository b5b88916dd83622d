"""The fronts bench's runtime-alone capacity (bench/fronts.py ``runtime_capacity``): the ratio
daemon/runtime divides by what the runtime holds, not by the largest N the daemon was tried
with. The runtime here is a line of tick times (the probe's logic is what is under test; the
runtime itself is timed on a device by ``bench.worker.run_runtime_alone``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench/

from bench.fronts import runtime_capacity  # noqa: E402

PERIOD = 0.0853


def line(ms_per_stream: float, asked: list[list[int]]):
    """A runtime whose p99 tick is ms_per_stream per stream; records each call's sizes."""
    def measure(sizes: list[int]) -> dict[int, float]:
        asked.append(list(sizes))
        return {n: n * ms_per_stream / 1e3 for n in sizes}
    return measure


def test_the_probe_goes_past_the_rows_until_a_tick_misses() -> None:
    """An H100 of 2026-12-06: rows up to 1,600, the runtime holding 2,000 (41 us a stream here):
    probed 12.5 % at a time, multiples of 8, up to the first miss."""
    asked: list[list[int]] = []
    alone, bounded = runtime_capacity(line(0.041, asked), [1000, 1600], PERIOD, 3200)
    assert asked == [[1000, 1600], [1800], [2032], [2288]]
    assert bounded and max(n for n, t in alone.items() if t < PERIOD) == 2032
    assert alone[2288] >= PERIOD


def test_no_probe_past_a_miss_or_the_limit() -> None:
    """A miss among the rows ends it at once; a runtime that holds everything up to the limit is
    reported as not bounded (the ratio is then an upper bound)."""
    asked: list[list[int]] = []
    _, bounded = runtime_capacity(line(0.1, asked), [600, 1000], PERIOD, 2000)
    assert asked == [[600, 1000]] and bounded
    asked.clear()
    alone, bounded = runtime_capacity(line(0.01, asked), [8, 16], PERIOD, 20)
    assert asked == [[8, 16], [18], [20]] and not bounded and max(alone) == 20


def test_small_loads_are_probed_a_stream_or_more_at_a_time() -> None:
    """Below 64 streams (a CPU's loads) the steps are not rounded to multiples of 8: from 14,
    16, 18, 21, 24, 27 rather than 16 and then 24."""
    asked: list[list[int]] = []
    alone, bounded = runtime_capacity(line(3.5, asked), [10, 14], PERIOD, 28)
    assert asked == [[10, 14], [16], [18], [21], [24], [27]]
    assert bounded and max(n for n, t in alone.items() if t < PERIOD) == 24
