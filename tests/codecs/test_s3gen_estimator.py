"""S3Gen flow estimator (ConditionalDecoder): one evaluation against the reference's estimator.forward.

Random x, mu, cond and speaker vectors, a distinct flow time per batch entry (and an end time r for
the meanflow/Turbo model), an all-ones mask: codecrt.diag.diag_estimate runs only the estimator graph
(s3_estimator_build) through the real lifecycle manager. Turbo's time mixer is initialised to [I, 0]
(it ignores r) and s3ref perturbs only vectors, so the Turbo model here gets a perturbed mixer of its
own (its own GGUF) to make r count.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import codecrt
import s3ref

TOL = 1e-5  # f32: measured 0.8e-6 .. 1.6e-6
MIXER = "flow.decoder.estimator.time_embed_mixer.weight"


def _turbo_with_mixer(path):
    """The Turbo estimator with a perturbed time mixer, and its GGUF at path."""
    torch, _ = s3ref.import_reference()
    from codecd.convert.s3gen import convert_s3gen_state_dict

    ref = s3ref.reference(True)
    est = copy.deepcopy(ref.flow.decoder.estimator)
    mixer = est.time_embed_mixer.weight
    with torch.no_grad():  # std 1/sqrt(2048): r's share ~0.7 of t's identity path
        mixer.add_(torch.randn(mixer.shape, generator=torch.Generator().manual_seed(3)) / mixer.shape[1] ** 0.5)
    sd = dict(s3ref.state_dict(ref))
    sd[MIXER] = mixer.detach().clone()
    convert_s3gen_state_dict(sd, None, path, "f32")
    return est, path


@pytest.fixture(scope="module", params=["orig", "turbo"])
def s3(request, tmp_path_factory):
    meanflow = request.param == "turbo"
    if meanflow:
        est, path = _turbo_with_mixer(tmp_path_factory.mktemp("s3est") / "turbo_mixer.gguf")
    else:
        est, path = s3ref.reference(False).flow.decoder.estimator, s3ref.gguf(False)
    model = codecrt.Model(path)
    ctx = codecrt.Context(model, device="cpu", n_threads=2)
    yield meanflow, est, ctx, model
    ctx.close()
    model.close()


def _inputs(seed: int, B: int, T: int, meanflow: bool) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.0, 1.0, B).astype(np.float32)
    return dict(x=rng.normal(0.0, 1.0, (B, 80, T)).astype(np.float32),
                mu=rng.normal(0.0, 1.0, (B, 80, T)).astype(np.float32),
                cond=rng.normal(-2.0, 2.0, (B, 80, T)).astype(np.float32),
                spks=rng.normal(0.0, 1.0, (B, 80)).astype(np.float32),
                t=t, r=(t + rng.uniform(0.0, 1.0 - t)).astype(np.float32) if meanflow else None)


def _reference(est, inp: dict[str, np.ndarray | None]) -> np.ndarray:
    torch, _ = s3ref.import_reference()
    B, _, T = inp["x"].shape
    args = {k: None if v is None else torch.from_numpy(v) for k, v in inp.items()}
    with torch.inference_mode():
        out = est.forward(mask=torch.ones(B, 1, T), **args)
    return out.numpy()


@pytest.mark.parametrize("T", [1, 10, 50, 100])
def test_estimator_matches_reference(s3, T):
    """dx/dt of one evaluation (B 2, distinct t) matches estimator.forward, below and above the 64-query tile."""
    meanflow, est, ctx, _ = s3
    inp = _inputs(T, 2, T, meanflow)
    ours = codecrt.diag.diag_estimate(ctx, **inp)
    theirs = _reference(est, inp)
    assert ours.shape == theirs.shape == (2, 80, T)
    assert np.all(np.isfinite(ours))
    assert s3ref.rel_l2(ours, theirs) < TOL


def test_estimator_batch_entries_independent(s3):
    """Each batch entry depends only on its own inputs (B 3 vs the entries alone)."""
    meanflow, _, ctx, _ = s3
    inp = _inputs(7, 3, 20, meanflow)
    batched = codecrt.diag.diag_estimate(ctx, **inp)
    for b in range(3):
        one = {k: None if v is None else v[b:b + 1] for k, v in inp.items()}
        alone = codecrt.diag.diag_estimate(ctx, **one)
        assert s3ref.rel_l2(batched[b:b + 1], alone) < 1e-6


def test_estimator_end_time(s3):
    """Turbo's output depends on the end time r (through the perturbed mixer); the original ignores r."""
    meanflow, _, ctx, _ = s3
    inp = _inputs(5, 2, 12, True)
    a = codecrt.diag.diag_estimate(ctx, **inp)
    inp["r"] = np.ones(2, dtype=np.float32)
    b = codecrt.diag.diag_estimate(ctx, **inp)
    if meanflow:
        assert s3ref.rel_l2(a, b) > 1e-3
    else:
        np.testing.assert_array_equal(a, b)


def test_the_graphs_gpus_run_match_the_reference_with_and_without_the_attention_ops(s3, monkeypatch):
    """The portable graphs (what a GPU runs) on the CPU: the estimator composed from ggml's
    ops (CODECRT_FUSED_UNIT=0) and as codecrt's ops (=1: the C functions of the norms, the
    products, the attention's scores, softmax and values, and the biases with GELU or the
    residual, which the CUDA kernels and cuBLAS products are checked against in
    tests/native/test_gpu.py) both match estimator.forward, and differ from each other (the
    switch reached the graph)."""
    meanflow, est, _, model = s3
    inp = _inputs(11, 2, 40, meanflow)
    theirs = _reference(est, inp)
    out = {}
    for fused in ("0", "1"):
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
        monkeypatch.setenv("CODECRT_FUSED_UNIT", fused)
        with codecrt.Context(model, device="cpu", n_threads=2) as c:
            out[fused] = codecrt.diag.diag_estimate(c, **inp)
        assert s3ref.rel_l2(out[fused], theirs) < TOL, fused
    assert not np.array_equal(out["0"], out["1"])

