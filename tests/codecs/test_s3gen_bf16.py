"""S3Gen with BF16 products (``codecrt.Context(precision="bf16")``).

The mode rounds both operands of every product (linear layers, convolutions,
attention) to bfloat16 and sums in F32, so its output differs from the F32
reference by bfloat16's rounding, not by F32's: the parity checks bound it from
above (the error budget, docs/runtime.md) and from below (the mode really ran).
The properties F32 has and BF16 keeps are checked as they are for F32: two
decodes through one context agree bit for bit, a batch entry equals the same
input alone, a chunked stream stays within the F32 stream's bound of offline.
On CPUs without AVX512-BF16 the mode must be refused with UnsupportedError.
"""

from __future__ import annotations


import numpy as np
import pytest

import codecrt
import s3ref
from conftest import cpu_has_bf16
from s3ref import tokens as _tokens, voice as _voice

# Measured with random weights (docs/runtime.md): mel 6.4e-3 / 6.7e-3 and PCM
# 1.6e-3 / 3.2e-3 against F32 (original / Turbo) on 10 s of audio.
BF16_TOL = 3e-2
F32_LEVEL = 1e-4  # below this the products were not rounded (F32 is ~1e-6)


HAS_BF16 = cpu_has_bf16()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")


@pytest.fixture(scope="module", params=["orig", "turbo"])
def s3(request):
    if not HAS_BF16:
        pytest.skip("this CPU has no AVX512-BF16")
    meanflow = request.param == "turbo"
    model = codecrt.Model(s3ref.gguf(meanflow))
    ctx = codecrt.Context(model, device="cpu", n_threads=2, precision="bf16")
    f32 = codecrt.Context(model, device="cpu", n_threads=2)
    yield meanflow, model, ctx, f32
    f32.close()
    ctx.close()
    model.close()


def test_refused_where_it_cannot_run(snac_cases):
    """Not a silent fallback: another model, an unknown name, or a CPU without the instructions."""
    model = codecrt.Model(s3ref.gguf(False))
    try:
        if HAS_BF16:
            with codecrt.Context(model, device="cpu", n_threads=1, precision="bf16") as ctx:
                assert ctx.precision == "bf16"
        else:
            with pytest.raises(codecrt.UnsupportedError, match="AVX512-BF16"):
                codecrt.Context(model, device="cpu", n_threads=1, precision="bf16")
        with pytest.raises(codecrt.InputError, match="precision must be one of f32, bf16"):
            codecrt.Context(model, device="cpu", precision="fp8")
        with codecrt.Context(model, device="cpu", n_threads=1) as ctx:
            assert ctx.precision == "f32"
    finally:
        model.close()
    snac = codecrt.Model(snac_cases("tiny").gguf)
    try:
        for precision in ("bf16", "bf16x3"):
            with pytest.raises(codecrt.UnsupportedError, match=f"precision {precision} is not implemented for snac"):
                codecrt.Context(snac, device="cpu", precision=precision)
    finally:
        snac.close()


@needs_bf16
def test_portable_ops_refuse_bf16(monkeypatch):
    """CODECRT_PORTABLE_OPS (the GPU graphs on the CPU) has no BF16 products: refused, not ignored."""
    monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
    with codecrt.Model(s3ref.gguf(False)) as model:
        with pytest.raises(codecrt.UnsupportedError, match="CODECRT_PORTABLE_OPS"):
            codecrt.Context(model, device="cpu", precision="bf16")


@pytest.mark.slow
def test_flow_and_decode_within_budget_of_reference(s3):
    """Mel and PCM against chatterbox-tts (F32, same noise): within BF16_TOL, and not F32-close."""
    meanflow, model, ctx, _ = s3
    ref = s3ref.reference(meanflow)
    data, voice = _voice(model)
    tokens = _tokens(2, 40)
    steps = model.info.default_steps
    mel = ctx.flow(tokens, voice, seed=5)
    ref_mel = s3ref.ref_mel(ref, tokens, data, 5, steps)
    pcm = ctx.vocode(mel, seed=5)
    ref_pcm = s3ref.ref_wav(ref, ref_mel, 5)
    e_mel, e_pcm = s3ref.rel_l2(mel, ref_mel), s3ref.rel_l2(pcm[: ref_pcm.size], ref_pcm)
    print(f"\nbf16 vs reference ({steps} steps): mel rel L2 {e_mel:.2e}, PCM {e_pcm:.2e}")
    assert F32_LEVEL < e_mel < BF16_TOL
    assert F32_LEVEL < e_pcm < BF16_TOL


@needs_bf16
def test_bf16x3_is_f32_grade():
    """precision="bf16x3": the flow's mel and the vocoder's PCM within F32's parity bound
    (1e-4) of the F32 context's, and not bit-equal to them (the split products really ran);
    a batch entry equals the same input alone."""
    with codecrt.Model(s3ref.gguf(False)) as model, \
            codecrt.Context(model, device="cpu", n_threads=2, precision="bf16x3") as x3, \
            codecrt.Context(model, device="cpu", n_threads=2) as f32:
        assert x3.precision == "bf16x3"
        data, voice = _voice(model)
        tokens = _tokens(2, 20)
        mel, want_mel = x3.flow(tokens, voice, seed=5), f32.flow(tokens, voice, seed=5)
        pcm, want_pcm = x3.vocode(want_mel, seed=5), f32.vocode(want_mel, seed=5)
        e_mel, e_pcm = s3ref.rel_l2(mel, want_mel), s3ref.rel_l2(pcm, want_pcm)
        print(f"\nbf16x3 vs f32: mel rel L2 {e_mel:.2e}, PCM {e_pcm:.2e}")
        assert 1e-7 < e_mel < 1e-4 and 1e-7 < e_pcm < 1e-4
        t = np.stack([_tokens(10, 9), _tokens(11, 9)])
        both = x3.decode([t], voice=voice, seeds=[3, 4])
        assert np.array_equal(both[1], x3.decode([t[1]], voice=voice, seed=4))


@pytest.mark.slow
def test_seed_check_and_batch_invariance(s3):
    """Two decodes through one context identical and non-silent; a batch entry equals it alone."""
    _, model, ctx, _ = s3
    _, voice = _voice(model)
    t = np.stack([_tokens(10, 9), _tokens(11, 9)])
    a = ctx.decode([t[0]], voice=voice, seed=3)
    ctx.decode([t[1][:5]], voice=voice, seed=3)  # another shape in between
    assert np.array_equal(a, ctx.decode([t[0]], voice=voice, seed=3))
    assert float(np.sqrt(np.mean(a[960:] ** 2))) > 1e-3
    both = ctx.decode([t], voice=voice, seeds=[3, 4])
    assert np.array_equal(both[0], a)
    assert np.array_equal(both[1], ctx.decode([t[1]], voice=voice, seed=4))


def test_packs_counted_and_reused(s3):
    """The weights packed for BF16 count in weight_bytes (about half the F32 weights, once per
    context, not per graph); an F32 context on the CPU packs only the weights of its products
    of few rows (LN_MIN_ROWS), at most one F32 copy of the model's, and also once."""
    _, model, ctx, f32 = s3
    _, voice = _voice(model)
    ctx.decode([_tokens(12, 6)], voice=voice, seed=1)
    packed = ctx.stats.weight_bytes
    assert 0.4 * model.info.weight_bytes < packed < 0.55 * model.info.weight_bytes
    ctx.decode([_tokens(13, 23)], voice=voice, seed=1)  # new shapes, new graphs: the same packs
    assert ctx.stats.weight_bytes == packed
    f32.decode([_tokens(12, 6)], voice=voice, seed=1)
    f32_packed = f32.stats.weight_bytes
    assert 0 < f32_packed <= model.info.weight_bytes
    f32.decode([_tokens(12, 6)], voice=voice, seed=2)
    assert f32.stats.weight_bytes == f32_packed


@pytest.mark.slow
def test_stream_against_offline(s3):
    """A chunked BF16 stream is as close to the BF16 offline decode as F32's are to F32's."""
    meanflow, model, ctx, f32 = s3
    _, voice = _voice(model, seed=7)
    t = _tokens(5, 45)
    errs = {}
    for name, c in (("bf16", ctx), ("f32", f32)):
        fs = codecrt.FlowStream(c, voice, seed=3, first_chunk=10, chunk=20)
        fs.push(t)
        fs.finish()
        errs[name] = s3ref.rel_l2(fs.decode_all(), c.decode([t], voice=voice, seed=3))
    print(f"\nstream vs offline, {'turbo' if meanflow else 'orig'}: bf16 {errs['bf16']:.4f}, "
          f"f32 {errs['f32']:.4f}")
    assert errs["bf16"] < max(2 * errs["f32"], 1e-3)
