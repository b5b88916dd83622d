"""Chatterbox S3Gen end to end: parity with the reference, the seed's check, lifecycle, bad input.

The stage-by-stage parity tests are test_s3gen_encoder.py, test_s3gen_estimator.py and
test_s3gen_hift.py; this file checks the whole pipeline (flow with its Euler loop and
guidance, then the vocoder and the fade-in) against S3Token2Wav on the same noise.
"""

from __future__ import annotations

import numpy as np
import pytest

import codecrt
import s3ref
from s3ref import tokens as _tokens, voice as _voice

FLOW_TOL = 1e-4  # f32: measured ~1e-6..1e-5 (docs/benchmarks.md)
PCM_TOL = 1e-4


@pytest.fixture(scope="module", params=["orig", "turbo"])
def s3(request):
    meanflow = request.param == "turbo"
    ref = s3ref.reference(meanflow)
    model = codecrt.Model(s3ref.gguf(meanflow))
    ctx = codecrt.Context(model, device="cpu", n_threads=2)
    yield meanflow, ref, model, ctx
    ctx.close()
    model.close()


def test_model_info(s3):
    meanflow, _, model, _ = s3
    info = model.info
    assert info.arch == "s3gen" and info.sample_rate == 24000 and info.hop_length == 960
    assert info.needs_voice and info.n_mels == 80 and info.mel_hop == 480
    assert info.default_steps == (2 if meanflow else 10)


def test_flow_matches_reference(s3):
    _, ref, model, ctx = s3
    data, voice = _voice(model)
    tokens = _tokens(2, 13)
    steps = model.info.default_steps
    ours = ctx.flow(tokens, voice, seed=5)
    theirs = s3ref.ref_mel(ref, tokens, data, 5, steps)
    assert ours.shape == theirs.shape == (80, 26)
    err = s3ref.rel_l2(ours, theirs)
    print(f"\nflow mel rel L2 vs reference ({steps} steps): {err:.2e}")
    assert err < FLOW_TOL


def test_flow_without_finalize_holds_back_the_lookahead(s3):
    """finalize=False: no mel for the last 3 tokens. (chatterbox-tts 0.1.7's own
    finalize=False path fails on its mask length, so there is no reference to compare.)"""
    _, _, model, ctx = s3
    _, voice = _voice(model)
    tokens = _tokens(2, 13)
    part = ctx.flow(tokens, voice, seed=5, finalize=False)
    assert part.shape == (80, 20) and np.all(np.isfinite(part))


@pytest.mark.slow
def test_decode_matches_reference(s3):
    _, ref, model, ctx = s3
    data, voice = _voice(model, seed=3, n=6)
    tokens = _tokens(4, 11)
    ours = ctx.decode([tokens], voice=voice, seed=9)
    mel = s3ref.ref_mel(ref, tokens, data, 9, model.info.default_steps)
    theirs = s3ref.fade_in(s3ref.ref_wav(ref, mel, 9), ref)
    assert ours.shape == (tokens.size * 960,)
    err = s3ref.rel_l2(ours, theirs)
    print(f"\ndecode PCM rel L2 vs reference: {err:.2e}")
    assert err < PCM_TOL


@pytest.mark.slow
def test_seed_check_two_decodes_identical(s3):
    """The seed's check: two decodes through one context, recreate policy on, identical and non-silent."""
    _, _, model, ctx = s3
    _, voice = _voice(model)
    for kind in ("encode", "flow_step", "f0", "vocode"):
        ctx.set_recreate_policy(kind, True)
    try:
        tokens = _tokens(6, 20)
        a = ctx.decode([tokens], voice=voice, seed=1)
        b = ctx.decode([tokens], voice=voice, seed=1)  # the same graphs, reused
        before = ctx.stats.sched_recreations
        ctx.decode([tokens[:7]], voice=voice, seed=1)  # other shapes: every kind released, recreated
        c = ctx.decode([tokens], voice=voice, seed=1)
        assert np.array_equal(a, b) and np.array_equal(a, c)
        assert float(np.sqrt(np.mean(a[960:] ** 2))) > 1e-3
        assert ctx.stats.sched_recreations - before >= 8
    finally:
        for kind in ("encode", "flow_step", "f0", "vocode"):
            ctx.set_recreate_policy(kind, False)


@pytest.mark.slow
def test_larger_after_smaller_and_reverse(s3):
    """Every decode through one reused context equals the same decode on a fresh context."""
    _, _, model, ctx = s3
    _, voice = _voice(model)
    lengths = [5, 17, 9, 17, 5]
    fresh = {}
    for n in sorted(set(lengths)):
        with codecrt.Context(model, device="cpu", n_threads=2) as c:
            fresh[n] = c.decode([_tokens(n, n)], voice=voice, seed=n)
    for n in lengths:
        assert np.array_equal(ctx.decode([_tokens(n, n)], voice=voice, seed=n), fresh[n])


@pytest.mark.slow
def test_seeds_differ_and_batch_equals_single(s3):
    _, _, model, ctx = s3
    _, voice = _voice(model)
    t = np.stack([_tokens(10, 7), _tokens(11, 7)])
    both = ctx.decode([t], voice=voice, seeds=[3, 4])
    first = ctx.decode([t[0]], voice=voice, seed=3)
    assert np.array_equal(both[0], first)
    assert np.array_equal(both[1], ctx.decode([t[1]], voice=voice, seed=4))
    assert not np.array_equal(first, ctx.decode([t[0]], voice=voice, seed=4))


def test_bad_input(s3):
    _, _, model, ctx = s3
    data, voice = _voice(model)
    with pytest.raises(codecrt.CodeRangeError):
        ctx.decode([np.array([1, 6561, 2])], voice=voice)
    with pytest.raises(codecrt.CodeRangeError):
        ctx.decode([np.array([1, -1])], voice=voice)
    with pytest.raises(codecrt.CodeRangeError):
        ctx.flow(np.array([7000]), voice)
    with pytest.raises(codecrt.InputError, match="voice"):
        ctx.decode([np.array([1, 2])])
    with pytest.raises(codecrt.CodeShapeError, match="mel frames"):
        codecrt.Voice(model, data["prompt_tokens"], data["prompt_mel"][:-1], data["speaker"])
    bad_mel = data["prompt_mel"].copy()
    bad_mel[3, 4] = np.nan
    with pytest.raises(codecrt.InputError, match="non-finite"):
        codecrt.Voice(model, data["prompt_tokens"], bad_mel, data["speaker"])
    with pytest.raises(codecrt.CodeRangeError):
        codecrt.Voice(model, data["prompt_tokens"] + 6561, data["prompt_mel"], data["speaker"])
    with pytest.raises(codecrt.CodeShapeError):
        codecrt.Voice(model, data["prompt_tokens"], data["prompt_mel"], data["speaker"][:100])
    with pytest.raises(codecrt.CodeShapeError):
        ctx.flow(np.array([1, 2, 3]), voice, finalize=False)  # all three are lookahead
    with pytest.raises(codecrt.InputError):
        ctx.vocode(np.full((80, 3), np.inf, dtype=np.float32))
    # the context still works after every refusal
    assert ctx.decode([np.array([1, 2, 3])], voice=voice).shape == (2880,)


def test_voice_of_another_model_refused(s3):
    meanflow, _, model, ctx = s3
    other = codecrt.Model(s3ref.gguf(not meanflow))
    try:
        data = s3ref.random_voice(1, 4)
        with pytest.raises(codecrt.InputError, match="another model"):
            ctx.decode([np.array([1, 2])], voice=codecrt.Voice(other, **data))
    finally:
        other.close()


def test_snac_model_refuses_two_stage_calls(snac_cases):
    case = snac_cases("tiny")
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        with pytest.raises(codecrt.UnsupportedError):
            ctx.vocode(np.zeros((80, 2), dtype=np.float32))
        with pytest.raises(codecrt.UnsupportedError):
            codecrt.Voice(m, np.zeros(0, np.int32), np.zeros((0, 80), np.float32), np.ones(192, np.float32))


@pytest.mark.slow
def test_batch_envelope_does_not_outgrow_the_budget():
    """After a wide batch of short flows, a long flow alone re-reserves for itself (Turbo):
    the per-axis envelope (longest T x widest batch) would pass the batch budget. It does so on
    the same schedulers (their buffers only grow), so switching back and forth recreates none."""
    model = codecrt.Model(s3ref.gguf(True))
    with codecrt.Context(model, device="cpu", n_threads=2) as ctx:
        _, voice = _voice(model, seed=5, n=8)
        short = np.stack([_tokens(40 + i, 4) for i in range(64)])
        mels = codecrt.diag.flow_batch(ctx, short, [voice] * 64, seeds=list(range(64)))
        assert mels.shape == (64, 80, 8)
        r0, n0 = ctx.stats.sched_recreations, ctx.stats.reservations
        long = _tokens(7, 300)  # T = 616 mel frames; (616, 64) would be ~1.9e8 elements
        got = ctx.flow(long, voice, seed=3)
        assert ctx.stats.reservations > n0 and ctx.stats.sched_recreations == r0
        again = codecrt.diag.flow_batch(ctx, short, [voice] * 64, seeds=list(range(64)))
        np.testing.assert_array_equal(again, mels)
        assert ctx.stats.sched_recreations == r0
        with codecrt.Context(model, device="cpu", n_threads=2) as fresh:
            np.testing.assert_array_equal(got, fresh.flow(long, voice, seed=3))
    model.close()
