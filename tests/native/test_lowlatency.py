"""LowLatencyStream: a shorter lookahead, finalized by a crossfade; exact when the lookahead covers the latency."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def setup(codecrt, snac_cases):
    case = snac_cases("24khz")
    m = codecrt.Model(case.gguf)
    ctx = codecrt.Context(m, device="cpu")
    levels = reference.random_codes(m.info, 96, None, np.random.default_rng(7))
    yield ctx, levels, ctx.decode(levels)
    ctx.close()
    m.close()


def run(codecrt, ctx, levels, lookahead, crossfade=256):
    """Push one Orpheus group (4 frames) at a time; return all emitted samples and the max lag seen."""
    ll = codecrt.LowLatencyStream(ctx, lookahead=lookahead, crossfade=crossfade)
    out, lag = [], 0
    for f in range(0, len(levels[2]), 4):
        ll.push([levels[0][f // 4:f // 4 + 1], levels[1][f // 2:f // 2 + 2], levels[2][f:f + 4]])
        out.append(ll.update())
        lag = max(lag, (f + 4) * 512 - ll.emitted)
    ll.finish()
    while not ll.done:
        out.append(ll.update())
    ll.close()
    return np.concatenate(out), lag, ll


def test_exact_when_lookahead_covers_latency(codecrt, setup):
    """lookahead >= the algorithmic latency: every sample is final and equals offline."""
    ctx, levels, want = setup
    got, lag, ll = run(codecrt, ctx, levels, lookahead=4757)
    assert len(got) == len(want)
    assert ll.provisional_samples == 0
    assert np.abs(got - want).max() < 1e-5


#: relative L2 error bound per lookahead: measured 0.090, 0.040, 0.010, 0.003 (SNAC 24 kHz
#: reference weights of seed 11, 96 frames of seed-7 codes, crossfade 256), with margin
ERROR_BOUND = {0: 0.15, 1024: 0.07, 2048: 0.02, 3072: 0.006}


@pytest.mark.parametrize("lookahead", sorted(ERROR_BOUND))
def test_low_latency_error_and_lag(codecrt, setup, lookahead):
    """Smaller lookahead: exact length, lag bounded by lookahead + crossfade, error reported and bounded."""
    ctx, levels, want = setup
    got, lag, ll = run(codecrt, ctx, levels, lookahead=lookahead)
    assert len(got) == len(want)
    assert lag <= lookahead + 256 + 4 * 512  # one group of input granularity
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    # no clicks: the largest sample-to-sample step stays within the offline signal's own
    step, step_ref = np.abs(np.diff(got)).max(), np.abs(np.diff(want)).max()
    print(f"\nlookahead {lookahead} samples ({1000 * lookahead / 24000:.0f} ms) + crossfade 256: "
          f"relative L2 error {err:.3f}, provisional {ll.provisional_samples} samples, "
          f"max step {step:.3f} (offline {step_ref:.3f})")
    assert err < ERROR_BOUND[lookahead], err
    assert step <= 1.5 * step_ref + 0.05
