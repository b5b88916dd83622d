"""S3Gen's encoder stage (token embedding, UpsampleConformerEncoder, encoder_proj) against the reference.

The graph runs alone through the real lifecycle manager (codecrt.diag.diag_encode) and is
compared with CausalMaskedDiffWithXvec.inference's encoder part on the same tokens: full
attention, nothing trimmed (finalize), every position valid.
"""

from __future__ import annotations

import numpy as np
import pytest

import codecrt
import s3ref

MU_TOL = 1e-5   # f32 graph vs torch; measured ~1e-6
F16_TOL = 3e-3  # F16 matrices; measured ~6e-4


@pytest.fixture(scope="module")
def encoder():
    ref = s3ref.reference(False)
    model = codecrt.Model(s3ref.gguf(False))
    ctx = codecrt.Context(model, device="cpu", n_threads=2)
    yield ref.flow, ctx
    ctx.close()
    model.close()


def _tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, n).astype(np.int32)


def _ref_mu(flow, tokens: np.ndarray) -> np.ndarray:
    torch, _ = s3ref.import_reference()
    with torch.inference_mode():
        emb = flow.input_embedding(torch.from_numpy(tokens.astype(np.int64))[None])
        h, _ = flow.encoder(emb, torch.tensor([tokens.size]))
        mu = flow.encoder_proj(h)  # (1, 2n, 80)
    return mu[0].T.numpy()


@pytest.mark.parametrize("n", [1, 7, 25, 64])
def test_mu_matches_reference(encoder, n):
    """mu [80, 2n] matches the reference for lengths on and off the padded key multiple (8)."""
    flow, ctx = encoder
    tokens = _tokens(n, n)
    ours = codecrt.diag.diag_encode(ctx, tokens)
    theirs = _ref_mu(flow, tokens)
    assert ours.shape == theirs.shape == (80, 2 * n)
    assert s3ref.rel_l2(ours, theirs) < MU_TOL


def test_inputs_refilled_per_length(encoder):
    """Encoding another length in between (new positional table and masks) leaves the result unchanged."""
    _, ctx = encoder
    tokens = _tokens(3, 13)
    first = codecrt.diag.diag_encode(ctx, tokens)
    codecrt.diag.diag_encode(ctx, _tokens(4, 40))
    codecrt.diag.diag_encode(ctx, _tokens(5, 2))
    np.testing.assert_array_equal(codecrt.diag.diag_encode(ctx, tokens), first)


def test_edge_tokens(encoder):
    """The first and last vocabulary ids embed like the reference."""
    flow, ctx = encoder
    tokens = np.array([0, 6560, 6560, 0, 17], dtype=np.int32)
    assert s3ref.rel_l2(codecrt.diag.diag_encode(ctx, tokens), _ref_mu(flow, tokens)) < MU_TOL


def test_f16_weights(encoder):
    """With the converter's F16 matrices (embedding, linears, conv kernels) mu stays close to the f32 reference."""
    flow, _ = encoder
    tokens = _tokens(9, 25)
    with codecrt.Model(s3ref.gguf(False, "f16")) as model, \
            codecrt.Context(model, device="cpu", n_threads=2) as ctx:
        ours = codecrt.diag.diag_encode(ctx, tokens)
    assert s3ref.rel_l2(ours, _ref_mu(flow, tokens)) < F16_TOL



def test_the_graphs_gpus_run_match_the_reference_with_and_without_the_device_ops(encoder, monkeypatch):
    """The portable graphs (what a GPU runs) on the CPU, the lookahead's and the upsampler's
    convs through transpose and ggml's im2col and the LayerNorms as ggml's norm, product and
    sum (CODECRT_FUSED_UNIT=0), and through codecrt's columns and norm ops (=1, ops/ops_cols.c's
    and ops/ops_norm.c's C functions): mu matches the reference either way, and the two differ
    (the one-pass norm rounds otherwise than ggml's three ops: the switch reached the graph)."""
    flow, _ = encoder
    tokens = _tokens(21, 19)
    theirs = _ref_mu(flow, tokens)
    out = {}
    monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
    for fused in ("0", "1"):
        monkeypatch.setenv("CODECRT_FUSED_UNIT", fused)
        with codecrt.Model(s3ref.gguf(False)) as model, codecrt.Context(model, device="cpu", n_threads=2) as ctx:
            out[fused] = codecrt.diag.diag_encode(ctx, tokens)
        assert s3ref.rel_l2(out[fused], theirs) < MU_TOL, fused
    assert not np.array_equal(out["0"], out["1"])
