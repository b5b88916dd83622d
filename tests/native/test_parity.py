"""SNAC decoded by codecrt equals the reference package (random seeded weights, our converter)."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip

F32_TOL = 1e-4
F16_TOL = 1e-2


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


# (CODECRT_PORTABLE_OPS, CODECRT_OFFLINE_LAYOUT): the fused CPU ops in their channels-fastest
# graphs (the CPU's default), the same ops under the time-fastest offline graph, and the portable
# graphs that GPUs run in both offline layouts (time fastest is their default)
OPS = {
    "cpu": (None, None),
    "cpu-time": (None, "time"),
    "portable": ("1", None),
    "portable-channels": ("1", "channels"),
}


def decode_with(codecrt, gguf, levels, ops, monkeypatch):
    """Decode `levels` on the CPU with the environment of OPS[ops]: the samples and the context's stats."""
    with monkeypatch.context() as mp:
        for var, value in zip(("CODECRT_PORTABLE_OPS", "CODECRT_OFFLINE_LAYOUT"), OPS[ops]):
            if value is None:
                mp.delenv(var, raising=False)
            else:
                mp.setenv(var, value)
        with codecrt.Model(gguf) as m, codecrt.Context(m, device="cpu") as ctx:
            return ctx.decode(levels), ctx.stats


@pytest.mark.parametrize("ops", list(OPS))
@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
def test_parity_f32(codecrt, snac_cases, name, ops, monkeypatch, record_property):
    """f32 weights: relative L2 error against snac at most 1e-4, batched too; with the fused CPU
    ops and with the portable graphs that GPUs run (time-fastest fusable Snake), both on the CPU,
    each in both offline graph layouts (channels fastest, time fastest)."""
    case = snac_cases(name)
    rng = np.random.default_rng(5)
    with codecrt.Model(case.gguf) as m:
        info = m.info
    n_frames = 2 * info.frame_multiple if info.frame_multiple > 4 else 24
    levels = reference.random_codes(info, n_frames, 2, rng)
    want = np.stack([reference.reference_decode(case.model, [lv[b] for lv in levels]) for b in range(2)])
    got, stats = decode_with(codecrt, case.gguf, levels, ops, monkeypatch)
    assert got.shape == want.shape == (2, n_frames * info.hop_length)
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nSNAC {name} f32 ({ops} ops): relative L2 error {err:.2e} ({n_frames} frames x 2)")
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3  # not a degenerate comparison
    if ops != "cpu":  # the variables took effect: other graphs, other roundings
        assert not np.array_equal(decode_with(codecrt, case.gguf, levels, "cpu", monkeypatch)[0], got)
    if ops == "portable":
        # the portable default is the time-fastest graph: other tensors (a smaller compute buffer)
        # than the channels-fastest one, the same arithmetic per sample (equal on this CPU)
        other, other_stats = decode_with(codecrt, case.gguf, levels, "portable-channels", monkeypatch)
        assert stats.compute_buffer_bytes[0] < other_stats.compute_buffer_bytes[0]
        assert float(np.abs(other - got).max()) <= 1e-6


def test_bad_offline_layout_is_refused(codecrt, snac_cases, monkeypatch):
    """CODECRT_OFFLINE_LAYOUT other than auto, time or channels: the context is refused, saying why."""
    monkeypatch.setenv("CODECRT_OFFLINE_LAYOUT", "diagonal")
    with codecrt.Model(snac_cases("24khz").gguf) as m:
        with pytest.raises(codecrt.CodecrtError, match="CODECRT_OFFLINE_LAYOUT is 'diagonal'"):
            codecrt.Context(m, device="cpu")


@pytest.mark.parametrize("name", ["24khz", "44khz"])
def test_parity_f16(codecrt, snac_cases, name, tmp_path, record_property):
    """f16 weights: relative L2 error against snac at most 1e-2."""
    from codecd.convert import convert

    case = snac_cases(name)
    path = convert(case.folder, tmp_path / f"{name}-f16.gguf", dtype="f16", progress=False)
    rng = np.random.default_rng(6)
    with codecrt.Model(path) as m, codecrt.Context(m, device="cpu") as ctx:
        assert m.info.weight_type == "f16"
        n_frames = max(m.info.frame_multiple, 16)
        levels = reference.random_codes(m.info, n_frames, None, rng)
        want = reference.reference_decode(case.model, levels)
        got = ctx.decode(levels)
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nSNAC {name} f16: relative L2 error {err:.2e}")
    assert err <= F16_TOL


def test_noise_is_chunking_invariant_and_seeded(codecrt, snac_cases):
    """Noise on: same seed gives the same audio, another seed different audio; batching keeps it."""
    case = snac_cases("24khz")
    rng = np.random.default_rng(7)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        levels = reference.random_codes(m.info, 16, None, rng)
        a = ctx.decode(levels, noise=True, seed=3)
        b = ctx.decode(levels, noise=True, seed=3)
        c = ctx.decode(levels, noise=True, seed=4)
        quiet = ctx.decode(levels)
        batch = ctx.decode([np.stack([lv, lv]) for lv in levels], noise=True, seeds=[4, 3])
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a, quiet)
    np.testing.assert_allclose(batch[1], a, atol=1e-6)
    np.testing.assert_allclose(batch[0], c, atol=1e-6)
