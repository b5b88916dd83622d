"""Long offline decodes: exact pieces, sub-batches and the shape guard (issue 24).

A decode whose graph would hold a tensor above the piece budget runs in
overlapping pieces; these tests move the budget and the backend limits with the
runtime's test variables (read when a context is created):
``CODECRT_PIECE_ELEMENTS``, ``CODECRT_GUARD_ELEMENTS``, ``CODECRT_GUARD_GRID``.
On the CPU the pieces join bit-identically to one whole-utterance graph.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference
from codeckit import runtime_env

WHOLE = str(2**31 - 1)

#: the 32/44 kHz decoder (windowed attention, hop 384, four levels) scaled down
SNAC_TINY_ATTN = dict(reference.SNAC_32KHZ, encoder_dim=8, decoder_dim=128)


def decode(codecrt, gguf, levels, *, seed=7, seeds=None, **env):
    """Decode with noise on in a fresh CPU context under ``env``; (pcm, graphs computed)."""
    with runtime_env(**env), codecrt.Model(str(gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        pcm = ctx.decode(levels, noise=True, seed=seed, seeds=seeds)
        return pcm, ctx.stats.computes


@pytest.fixture(scope="module")
def tiny(snac_cases):
    return snac_cases("tiny")


@pytest.fixture(scope="module")
def tiny_attn(tmp_path_factory):
    pytest.importorskip("snac")
    from codecd.convert import convert

    root = tmp_path_factory.mktemp("snac_attn")
    model = reference.build_reference_snac(SNAC_TINY_ATTN, 55)
    return convert(reference.save_released_layout(model, SNAC_TINY_ATTN, root / "ref"), root / "m.gguf",
                   progress=False)


def frames_of(gguf, codecrt, seconds):
    with codecrt.Model(str(gguf)) as m:
        info = m.info
    n = int(seconds * info.sample_rate / info.hop_length)
    return info, n - n % info.frame_multiple


@pytest.mark.parametrize("budget", [str(2**18), str(2**20)])
def test_pieces_equal_whole(codecrt, tiny, budget):
    """A 20 s decode in pieces (noise on) is bit-identical to the one-graph decode."""
    info, n = frames_of(tiny.gguf, codecrt, 20)
    levels = reference.random_codes(info, n, None, np.random.default_rng(1))
    whole, one = decode(codecrt, tiny.gguf, levels, CODECRT_PIECE_ELEMENTS=WHOLE)
    pieces, k = decode(codecrt, tiny.gguf, levels, CODECRT_PIECE_ELEMENTS=budget)
    assert one == 1 and k > 2
    np.testing.assert_array_equal(pieces, whole)


def test_time_fastest_pieces_equal_whole(codecrt, tiny):
    """The time-fastest offline graph that GPUs run (issue 19), checked against CUDA's launch grid:
    split into pieces and sub-batches it is bit-identical to its one-graph decode, and it gives the
    channels-fastest graph's samples."""
    info, n = frames_of(tiny.gguf, codecrt, 6)
    levels = reference.random_codes(info, n, 3, np.random.default_rng(11))
    gpu = {"CODECRT_PORTABLE_OPS": "1", "CODECRT_GUARD_GRID": "65535"}
    whole, one = decode(codecrt, tiny.gguf, levels, CODECRT_PIECE_ELEMENTS=WHOLE, CODECRT_OFFLINE_LAYOUT="time",
                        **gpu)
    parts, k = decode(codecrt, tiny.gguf, levels, CODECRT_PIECE_ELEMENTS=str(2**17),
                      CODECRT_OFFLINE_LAYOUT="time", **gpu)
    assert one == 1 and k > 3
    np.testing.assert_array_equal(parts, whole)
    channels, _ = decode(codecrt, tiny.gguf, levels, CODECRT_OFFLINE_LAYOUT="channels", **gpu)
    assert float(np.abs(channels - whole).max()) <= 1e-6


@pytest.mark.slow
def test_sub_batches_equal_whole(codecrt, tiny):
    """A batch too wide for one short piece runs in sub-batches, each sequence with its own seed."""
    info, n = frames_of(tiny.gguf, codecrt, 3)
    levels = reference.random_codes(info, n, 6, np.random.default_rng(2))
    seeds = [3, 1, 4, 1, 5, 9]
    whole, _ = decode(codecrt, tiny.gguf, levels, seeds=seeds, CODECRT_PIECE_ELEMENTS=WHOLE)
    parts, k = decode(codecrt, tiny.gguf, levels, seeds=seeds, CODECRT_PIECE_ELEMENTS=str(2**17))
    assert k > 6
    np.testing.assert_array_equal(parts, whole)
    for b in range(6):  # and each sequence equals its decode alone
        alone, _ = decode(codecrt, tiny.gguf, [lv[b] for lv in levels], seed=seeds[b])
        np.testing.assert_array_equal(parts[b], alone)


def test_attention_pieces_equal_whole(codecrt, tiny_attn):
    """Windowed attention (32/44 kHz): pieces start on window boundaries and join exactly."""
    info, n = frames_of(tiny_attn, codecrt, 12)
    levels = reference.random_codes(info, n, 2, np.random.default_rng(3))
    whole, one = decode(codecrt, tiny_attn, levels, CODECRT_PIECE_ELEMENTS=WHOLE)
    pieces, k = decode(codecrt, tiny_attn, levels, CODECRT_PIECE_ELEMENTS=str(2**21))
    assert one == 1 and k > 2
    np.testing.assert_array_equal(pieces, whole)


@pytest.mark.slow
def test_60s_24khz_equals_piecewise(codecrt, snac_cases):
    """60 s of the full 24 kHz decoder: the default (pieces under 2^27 elements) equals one graph."""
    case = snac_cases("24khz")
    info, n = frames_of(case.gguf, codecrt, 60)
    levels = reference.random_codes(info, n, None, np.random.default_rng(4))
    whole, one = decode(codecrt, case.gguf, levels, CODECRT_PIECE_ELEMENTS=WHOLE)
    pieces, k = decode(codecrt, case.gguf, levels)
    assert one == 1 and k >= 2
    np.testing.assert_array_equal(pieces, whole)


@pytest.mark.slow
def test_300s_decodes_with_defaults(codecrt, tiny):
    """300 s decodes with a default context (max_frames no longer stops it) into the exact length."""
    info, n = frames_of(tiny.gguf, codecrt, 300)
    levels = reference.random_codes(info, n, None, np.random.default_rng(6))
    with codecrt.Model(str(tiny.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        pcm = ctx.decode(levels)
        assert pcm.shape == (n * info.hop_length,)
        assert np.isfinite(pcm).all() and float(np.abs(pcm).max()) > 0


def test_element_limit_refuses_what_cannot_split(codecrt, tiny):
    """Below the smallest piece, a lowered backend element limit gives TooLargeError naming it, not an abort."""
    info, n = frames_of(tiny.gguf, codecrt, 2)
    levels = reference.random_codes(info, n, None, np.random.default_rng(7))
    with runtime_env(CODECRT_GUARD_ELEMENTS="1000"), codecrt.Model(str(tiny.gguf)) as m, \
            codecrt.Context(m, device="cpu") as ctx:
        with pytest.raises(codecrt.TooLargeError, match="above the limit of 1000"):
            ctx.decode(levels)
    pcm, _ = decode(codecrt, tiny.gguf, levels)  # the process and the runtime carry on
    assert pcm.shape == (n * info.hop_length,)


def test_grid_limit_refuses_and_context_survives(codecrt, tiny):
    """A GPU launch-grid limit (lowered to 2 by the test hook) refuses a 3-sequence decode and a
    3-stream tick with TooLargeError; the same context then decodes and steps within the limit."""
    info, n = frames_of(tiny.gguf, codecrt, 1)
    three = reference.random_codes(info, n, 3, np.random.default_rng(8))
    with runtime_env(CODECRT_GUARD_GRID="2"), codecrt.Model(str(tiny.gguf)) as m, \
            codecrt.Context(m, device="cpu", max_streams=4) as ctx:
        with pytest.raises(codecrt.TooLargeError, match="launch-grid limit of 2"):
            ctx.decode(three)
        first = [lv[0] for lv in three]
        with codecrt.Context(m, device="cpu") as plain:
            np.testing.assert_array_equal(ctx.decode(first), plain.decode(first))
        streams = [ctx.stream() for _ in range(3)]
        for s, b in zip(streams, range(3)):
            s.push([lv[b] for lv in three])
            s.finish()
        with pytest.raises(codecrt.TooLargeError, match="launch-grid"):
            ctx.step(streams)
        streams[2].close()
        out = [[], []]
        while not all(s.done for s in streams[:2]):
            ctx.step(streams[:2])
            for i in range(2):
                out[i].append(streams[i].pull())
        for i in range(2):
            np.testing.assert_array_equal(np.concatenate(out[i]), ctx.decode([lv[i] for lv in three]))


def test_reserve_plans_pieces(codecrt, tiny):
    """reserve() for a decode too large for one graph reserves the piece it will run, then decodes."""
    info, n = frames_of(tiny.gguf, codecrt, 20)
    levels = reference.random_codes(info, n, None, np.random.default_rng(9))
    with runtime_env(CODECRT_PIECE_ELEMENTS=str(2**20)), codecrt.Model(str(tiny.gguf)) as m, \
            codecrt.Context(m, device="cpu") as ctx:
        ctx.reserve(n, 1)
        reservations = ctx.stats.reservations
        ctx.decode(levels)
        assert ctx.stats.reservations == reservations  # the pieces fit what reserve() planned


def test_no_pieces_sub_batches(codecrt, tmp_path):
    """An architecture that cannot be cut along time (Mimi: attention, 1,000 frames of receptive
    field) decodes a batch above the piece budget in sub-batches, equal to the one-graph decode;
    one sequence above the budget is refused with the reason. (Budgets for this tiny model and
    3 x 40 frames: 2^23 holds the batch, 2^21 one sequence, 2^20 none.)"""
    from codecd.convert.random_mimi import write_random_mimi

    gguf = write_random_mimi(tmp_path / "mimi.gguf", config="tiny", seed=2)
    levels = [np.random.default_rng(3).integers(0, 64, (3, 40)).astype(np.int32) for _ in range(8)]

    def run(budget):
        with runtime_env(CODECRT_PIECE_ELEMENTS=str(budget)), codecrt.Model(str(gguf)) as m, \
                codecrt.Context(m, device="cpu") as ctx:
            return ctx.decode(levels), ctx.stats.computes

    whole, one = run(2**23)
    split, k = run(2**21)
    assert one == 1 and k == 3
    np.testing.assert_array_equal(split, whole)
    with pytest.raises(codecrt.TooLargeError, match="cannot be decoded in pieces"):
        run(2**20)
