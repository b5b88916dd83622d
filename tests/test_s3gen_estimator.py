"""S3Gen flow estimator (ConditionalDecoder): one evaluation against the reference's estimator.forward.

Random x, mu, cond and speaker vectors, a distinct flow time per batch entry (and an end time r for
the meanflow/Turbo model), an all-ones mask: codecrt.diag.diag_estimate runs only the estimator graph
(s3_estimator_build) through the real lifecycle manager.
"""

from __future__ import annotations

import numpy as np
import pytest

import codecrt
import s3ref

TOL = 1e-4  # f32: measured ~1e-6


@pytest.fixture(scope="module", params=["orig", "turbo"])
def s3(request):
    meanflow = request.param == "turbo"
    ref = s3ref.reference(meanflow)
    model = codecrt.Model(s3ref.gguf(meanflow))
    ctx = codecrt.Context(model, device="cpu", n_threads=2)
    yield meanflow, ref, ctx
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


def _reference(ref, inp: dict[str, np.ndarray | None]) -> np.ndarray:
    torch, _ = s3ref.import_reference()
    B, _, T = inp["x"].shape
    args = {k: None if v is None else torch.from_numpy(v) for k, v in inp.items()}
    with torch.inference_mode():
        out = ref.flow.decoder.estimator.forward(mask=torch.ones(B, 1, T), **args)
    return out.numpy()


@pytest.mark.parametrize("T", [10, 48, 50])
def test_estimator_matches_reference(s3, T):
    """dx/dt of one evaluation (B 2, distinct t) matches estimator.forward; T 48 needs no key padding."""
    meanflow, ref, ctx = s3
    inp = _inputs(T, 2, T, meanflow)
    ours = codecrt.diag.diag_estimate(ctx, **inp)
    theirs = _reference(ref, inp)
    assert ours.shape == theirs.shape == (2, 80, T)
    assert np.all(np.isfinite(ours))
    assert s3ref.rel_l2(ours, theirs) < TOL


def test_estimator_batch_entries_independent(s3):
    """Each batch entry depends only on its own inputs (B 3 vs the entries alone)."""
    meanflow, _, ctx = s3
    inp = _inputs(7, 3, 20, meanflow)
    both = codecrt.diag.diag_estimate(ctx, **inp)
    for b in range(3):
        one = {k: None if v is None else v[b:b + 1] for k, v in inp.items()}
        alone = codecrt.diag.diag_estimate(ctx, **one)
        assert s3ref.rel_l2(both[b:b + 1], alone) < 1e-6
