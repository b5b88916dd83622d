"""S3Gen's HiFT vocoder stage by stage against the reference HiFTGenerator (mel2wav).

Each stage runs alone through the real lifecycle manager (codecrt.diag): the F0
predictor graph, the harmonic source (host code, fed the same phases and noise as
the reference's SineGen), and the decode graph on the same mel and source.
"""

from __future__ import annotations

import numpy as np
import pytest

import codecrt
import s3ref

# f32. f0 is a 512-term dot product that cancels ~60x on random weights, so the
# reference's own f32 error (vs f64) is ~3e-6; ours measured 1e-7..4e-6 against it.
F0_TOL = 2e-5
SOURCE_TOL = 1e-5  # host arithmetic replicates torch's; measured ~5e-8
PCM_TOL = 1e-5     # the whole vocoder graph; measured ~5e-7


@pytest.fixture(scope="module")
def hift():
    ref = s3ref.reference(False)
    model = codecrt.Model(s3ref.gguf(False))
    ctx = codecrt.Context(model, device="cpu", n_threads=2)
    yield ref.mel2wav, ctx
    ctx.close()
    model.close()


def _mel(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(-4.0, 2.0, (80, n)).astype(np.float32)


def _f0(seed: int, n: int) -> np.ndarray:
    """A pitch track with voiced stretches (80..400 Hz) and unvoiced frames (0, or below 10 Hz)."""
    rng = np.random.default_rng(seed)
    f0 = rng.uniform(80.0, 400.0, n).astype(np.float32)
    f0[rng.random(n) < 0.25] = 0.0
    f0[rng.random(n) < 0.05] = 7.5
    return f0


def _ref_source(gen, f0: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    torch, _ = s3ref.import_reference()
    phases, sine = s3ref.source_noise(seed, f0.size * s3ref.MEL_HOP)
    with s3ref.patched_noise(phases=phases, sine=sine), torch.inference_mode():
        s = gen.f0_upsamp(torch.from_numpy(f0)[None, None]).transpose(1, 2)
        s, _, _ = gen.m_source(s)
    return s[0, :, 0].numpy(), phases, sine


def _ref_decode(gen, mel: np.ndarray, source: np.ndarray) -> np.ndarray:
    torch, _ = s3ref.import_reference()
    with torch.inference_mode():
        pcm = gen.decode(x=torch.from_numpy(mel)[None], s=torch.from_numpy(source)[None, None])
    return pcm[0].numpy()


@pytest.mark.parametrize("n", [1, 20, 57])
def test_f0_matches_reference(hift, n):
    """The F0 predictor graph (5 convs + ELU, |linear|) gives the reference's f0 per mel frame."""
    gen, ctx = hift
    torch, _ = s3ref.import_reference()
    mel = _mel(n, n)
    with torch.inference_mode():
        theirs = gen.f0_predictor(torch.from_numpy(mel)[None])[0].numpy()
    ours = codecrt.diag.diag_f0(ctx, mel)
    assert ours.shape == theirs.shape == (n,)
    assert s3ref.rel_l2(ours, theirs) < F0_TOL


@pytest.mark.parametrize("n", [3, 500])
def test_source_matches_reference(hift, n):
    """SineGen + l_linear + tanh on the host equals the reference on the same phases and noise,
    harmonics' phases included after 10 s (the cumulative sum is done as torch does it)."""
    gen, ctx = hift
    f0 = _f0(n, n)
    theirs, phases, sine = _ref_source(gen, f0, seed=n)
    ours = codecrt.diag.diag_source(ctx, f0, phases, sine)
    assert ours.shape == theirs.shape == (n * 480,)
    assert s3ref.rel_l2(ours, theirs) < SOURCE_TOL
    assert np.max(np.abs(ours - theirs)) < 1e-5


@pytest.mark.parametrize("n", [1, 20, 57])
def test_decode_matches_reference(hift, n):
    """The decode graph (STFT of the source, upsampling with source fusion, Snake ResBlocks,
    iSTFT, clamp) gives the reference's PCM for the same mel and source, and it is not silent."""
    gen, ctx = hift
    mel = _mel(100 + n, n)
    source, _, _ = _ref_source(gen, _f0(200 + n, n), seed=300 + n)
    theirs = _ref_decode(gen, mel, source)
    ours = codecrt.diag.diag_hift(ctx, mel, source)
    assert ours.shape == theirs.shape == (n * 480,)
    assert s3ref.rel_l2(ours, theirs) < PCM_TOL
    assert np.sqrt(np.mean(ours.astype(np.float64) ** 2)) > 1e-3
    assert np.max(np.abs(ours)) <= 0.99


def test_vocoder_pipeline_matches_reference(hift):
    """F0 graph -> host source -> decode graph, chained, matches the reference's hift path."""
    gen, ctx = hift
    torch, _ = s3ref.import_reference()
    mel = _mel(7, 30)
    f0 = codecrt.diag.diag_f0(ctx, mel)
    phases, sine = s3ref.source_noise(11, mel.shape[1] * 480)
    ours = codecrt.diag.diag_hift(ctx, mel, codecrt.diag.diag_source(ctx, f0, phases, sine))
    with s3ref.patched_noise(phases=phases, sine=sine), torch.inference_mode():
        theirs, _ = gen.inference(speech_feat=torch.from_numpy(mel)[None])
    assert s3ref.rel_l2(ours, theirs[0].numpy()) < PCM_TOL


def test_the_graphs_gpus_run_match_the_reference_with_and_without_the_columns_op(monkeypatch):
    """The portable graphs (what a GPU runs) on the CPU: the convs' columns by transpose and
    ggml's im2col, each ResBlock Snake composed (CODECRT_FUSED_UNIT=0), and by codecrt's columns
    op with the Snakes gathered through it (=1: ops/ops_cols.c's C function, which the CUDA
    kernel is checked against in tests/native/test_gpu.py): F0 and decode match the reference
    either way, and the graphs differ (no transposes, no Snake tensors: other compute buffers)."""
    gen = s3ref.reference(False).mel2wav
    torch, _ = s3ref.import_reference()
    mel = _mel(41, 23)
    source, _, _ = _ref_source(gen, _f0(42, 23), seed=43)
    with torch.inference_mode():
        f0_ref = gen.f0_predictor(torch.from_numpy(mel)[None])[0].numpy()
    pcm_ref = _ref_decode(gen, mel, source)
    buffers = {}
    monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
    for fused in ("0", "1"):
        monkeypatch.setenv("CODECRT_FUSED_UNIT", fused)
        with codecrt.Model(s3ref.gguf(False)) as model, codecrt.Context(model, device="cpu", n_threads=2) as ctx:
            f0 = codecrt.diag.diag_f0(ctx, mel)
            pcm = codecrt.diag.diag_hift(ctx, mel, source)
            buffers[fused] = ctx.stats.compute_buffer_bytes
        assert s3ref.rel_l2(f0, f0_ref) < F0_TOL, fused
        assert s3ref.rel_l2(pcm, pcm_ref) < PCM_TOL, fused
    assert buffers["0"] != buffers["1"]
