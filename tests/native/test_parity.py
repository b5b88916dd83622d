"""SNAC decoded by codecrt equals the reference package (random seeded weights, our converter)."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from codeckit import rel_l2

F32_TOL = 1e-4
F16_TOL = 1e-2


# (CODECRT_PORTABLE_OPS, CODECRT_OFFLINE_LAYOUT, CODECRT_FUSED_UNIT): the fused CPU ops in their
# channels-fastest graphs (the CPU's default), the same ops under the time-fastest offline graph,
# the portable graphs that GPUs run in both offline layouts (time fastest is their default), and
# those with each residual unit's core as one op (what a CUDA device runs, here its C function)
OPS = {
    "cpu": (None, None, None),
    "cpu-time": (None, "time", None),
    "portable": ("1", None, "0"),
    "portable-channels": ("1", "channels", "0"),
    "portable-fused": ("1", None, "1"),
}
ENV = ("CODECRT_PORTABLE_OPS", "CODECRT_OFFLINE_LAYOUT", "CODECRT_FUSED_UNIT")


def decode_with(codecrt, gguf, levels, ops):
    """Decode `levels` on the CPU with the environment of OPS[ops]: the samples and the context's stats."""
    with pytest.MonkeyPatch.context() as mp:
        for var, value in zip(ENV, OPS[ops]):
            if value is None:
                mp.delenv(var, raising=False)
            else:
                mp.setenv(var, value)
        with codecrt.Model(gguf) as m, codecrt.Context(m, device="cpu") as ctx:
            return ctx.decode(levels), ctx.stats


@pytest.fixture(scope="module")
def f32_parity(codecrt, snac_cases):
    """The f32 parity tests' inputs and decodes, each computed once per module (the four ops
    variants of a model share its codes and reference decode, and compare with each other's
    decodes): ``inputs(name)`` -> (info, n_frames, levels, reference samples);
    ``decoded(name, ops)`` -> decode_with's (samples, stats)."""
    inputs_of: dict[str, tuple] = {}
    decodes: dict[tuple[str, str], tuple] = {}

    def inputs(name: str) -> tuple:
        if name not in inputs_of:
            case = snac_cases(name)
            rng = np.random.default_rng(5)
            with codecrt.Model(case.gguf) as m:
                info = m.info
            n_frames = 2 * info.frame_multiple if info.frame_multiple > 4 else 24
            levels = reference.random_codes(info, n_frames, 2, rng)
            want = np.stack([reference.reference_decode(case.model, [lv[b] for lv in levels]) for b in range(2)])
            inputs_of[name] = (info, n_frames, levels, want)
        return inputs_of[name]

    def decoded(name: str, ops: str) -> tuple:
        if (name, ops) not in decodes:
            decodes[(name, ops)] = decode_with(codecrt, snac_cases(name).gguf, inputs(name)[2], ops)
        return decodes[(name, ops)]

    return inputs, decoded


@pytest.mark.parametrize("ops", list(OPS))
@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
def test_parity_f32(f32_parity, name, ops, record_property):
    """f32 weights: relative L2 error against snac at most 1e-4, batched too; with the fused CPU
    ops and with the portable graphs that GPUs run (time-fastest fusable Snake), both on the CPU,
    each in both offline graph layouts (channels fastest, time fastest)."""
    inputs, decoded = f32_parity
    info, n_frames, levels, want = inputs(name)
    got, stats = decoded(name, ops)
    assert got.shape == want.shape == (2, n_frames * info.hop_length)
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nSNAC {name} f32 ({ops} ops): relative L2 error {err:.2e} ({n_frames} frames x 2)")
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3  # not a degenerate comparison
    if ops != "cpu":  # the variables took effect: other graphs, other roundings
        assert not np.array_equal(decoded(name, "cpu")[0], got)
    if ops == "portable":
        # the portable default is the time-fastest graph: other tensors (a smaller compute buffer)
        # than the channels-fastest one, the same arithmetic per sample (equal on this CPU)
        other, other_stats = decoded(name, "portable-channels")
        assert stats.compute_buffer_bytes[0] < other_stats.compute_buffer_bytes[0]
        assert float(np.abs(other - got).max()) <= 1e-6
    if ops == "portable-fused":
        # the unit core as one op replaces five composed ops and their tensors (a smaller compute
        # buffer) with the same arithmetic in the same order
        composed, composed_stats = decoded(name, "portable")
        assert stats.compute_buffer_bytes[0] < composed_stats.compute_buffer_bytes[0]
        assert float(np.abs(composed - got).max()) <= 1e-6


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
