"""Mimi decoded by codecrt equals moshi's and transformers' (seeded random weights, our converter).

The references are built by ``tests/references/mimi.py`` (moshi ``get_mimi(None, cfg)``, and
transformers ``MimiModel`` from the same weights), perturbed away from their init, saved in
either released layout (kyutai/mimi's ``config.json`` + ``model.safetensors``, or moshi's
single ``tokenizer-e351c8d8-checkpoint125.safetensors``) and converted by ``codecd.convert``.
The tiny config (same code paths, a 12-step = 6-frame attention window so that short decodes
cross it) runs fast; the released config once (slow).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from codeckit import case_cache, decode, ops_env, rel_l2, runtime_env
from streamkit import levels, offline_and_stream, random_pushes, staggered_and_offline, stream_decode

F32_TOL = 1e-4

pytest.importorskip("torch")
pytest.importorskip("moshi")
ref = pytest.importorskip("references.mimi")


class Case:
    """A seeded moshi Mimi saved in a released layout and converted (f32)."""

    def __init__(self, root: Path, name: str, layout: str = "transformers", seed: int = 7):
        from codecd.convert import convert

        self.config = ref.CONFIGS[name]
        with ref.torch_threads(1):
            self.model = ref.build_reference(self.config, seed)
        self.folder = root / f"{name}_{layout}"
        ref.save_released_layout(self.model, self.folder, layout=layout)
        # moshi's single file has no config: the tiny sizes are passed, the release's are the default
        config = dict(self.config) if layout == "moshi" and name != "mimi" else None
        self.gguf = convert(self.folder, root / f"{name}_{layout}.gguf", config=config, progress=False)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    with case_cache(tmp_path_factory, "mimi", Case) as get:
        yield get


def test_layouts_convert_alike(cases):
    """kyutai/mimi (NEOX q/k, transformers names) and moshi's file (interleaved q/k) give the same GGUF tensors."""
    gguf = pytest.importorskip("gguf")
    a = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(cases("tiny", "transformers").gguf)).tensors}
    b = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(cases("tiny", "moshi").gguf)).tensors}
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("ops", ["cpu", "portable"])
@pytest.mark.parametrize("n_q", [1, 8, 32])
@pytest.mark.parametrize("layout", ["transformers", "moshi"])
def test_parity_tiny(codecrt, cases, layout, n_q, ops, record_property):
    """Batch 2 of 23 frames (46 transformer steps: past the 12-step window), 1, 8 or 32 codebooks,
    with the fused CPU kernels and with the portable graphs that GPUs run: relative L2 <= 1e-4
    against moshi's decode."""
    case = cases("tiny", layout)
    codes = ref.random_codes(case.config, 23, n_q, np.random.default_rng(n_q), batch=2)
    with ref.torch_threads(1):
        want = ref.reference_decode(case.model, codes)
    with runtime_env(**ops_env(ops)):
        got = decode(codecrt, case.gguf, levels(codes))
    assert got.shape == want.shape == (2, 23 * ref.FRAME_SAMPLES)
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3


def test_parity_transformers_reference(codecrt, cases, record_property):
    """transformers' MimiModel (NEOX RoPE on permuted q/k, its own window mask) from the same weights."""
    case = cases("tiny", "transformers")
    with ref.torch_threads(1):
        hf = ref.load_released(case.folder, case.config, impl="transformers")
        codes = ref.random_codes(case.config, 19, 8, np.random.default_rng(3), batch=1)
        want = ref.reference_decode(hf, codes)
    got = decode(codecrt, case.gguf, levels(codes))
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    assert err <= F32_TOL


def test_bucketed_batch_equals_alone(codecrt, cases):
    """Sequences of a batch (padded to a bucket) decode as they do alone: the decoder is causal."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, 13, 8, np.random.default_rng(4), batch=3)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu", frame_bucket=16, batch_bucket=True) as ctx:
        both = ctx.decode(levels(codes))
        for b in range(3):
            alone = ctx.decode(levels(codes[b:b + 1]))
            np.testing.assert_allclose(both[b], alone[0], rtol=0, atol=1e-6)


def test_bad_codes(codecrt, cases):
    """More codebooks than the model's, none, or a code out of range: clear errors."""
    case = cases("tiny")
    rng = np.random.default_rng(5)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        assert m.info.n_levels == 32 and m.info.hop_length == ref.FRAME_SAMPLES
        with pytest.raises(codecrt.CodecrtError, match="code levels"):
            ctx.decode(levels(ref.random_codes(case.config, 4, 32, rng, batch=1)) + [np.zeros((1, 4), np.int32)])
        bad = ref.random_codes(case.config, 4, 8, rng, batch=1)
        bad[0, 3, 2] = case.config["codebook_size"]
        with pytest.raises(codecrt.CodecrtError, match="outside"):
            ctx.decode(levels(bad))


@pytest.mark.slow
def test_parity_released(codecrt, cases, record_property):
    """The released sizes: 2 s at 8 codebooks and 30 s (past the 10 s window) at 32, relative L2 <= 1e-4."""
    case = cases("mimi", "moshi")
    for n_frames, n_q in ((25, 8), (375, 32)):
        codes = ref.random_codes(case.config, n_frames, n_q, np.random.default_rng(n_frames), batch=1)
        with ref.torch_threads(1):
            want = ref.reference_decode(case.model, codes)
        got = decode(codecrt, case.gguf, levels(codes))
        err = rel_l2(got, want)
        record_property(f"rel_l2_{n_frames}x{n_q}", err)
        print(f"\nMimi released: {n_frames} frames, {n_q} codebooks: relative L2 {err:.2e}")
        assert err <= F32_TOL


# ------------------------------------------------------------------ streaming


@pytest.mark.parametrize("ops", ["cpu", "portable"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_stream_equals_offline(codecrt, cases, chunk, ops):
    """Ticks of 1, 2, 3 and 7 frames over 29 frames (58 steps: the 12-step window passed many
    times), pushed frame by frame: the streamed audio equals the offline decode (f32 noise)."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, 29, 8, np.random.default_rng(10 + chunk), batch=1)
    with runtime_env(**ops_env(ops)):
        want, got = offline_and_stream(codecrt, case.gguf, codes[0], [1] * 29, stream_chunk_frames=chunk)
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-5


def test_stream_random_pushes(codecrt, cases):
    """Random push sizes (1..9 frames, several ticks per step call) equal the offline decode."""
    case = cases("tiny")
    rng = np.random.default_rng(11)
    codes = ref.random_codes(case.config, 40, 32, rng, batch=1)
    pushes = random_pushes(rng, 40)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu", stream_chunk_frames=2) as ctx:
        want = ctx.decode(levels(codes))[0]
        got = stream_decode(ctx, codes[0], pushes)
    assert float(np.abs(got - want).max()) <= 1e-5


def test_batched_streams_at_different_positions(codecrt, cases):
    """Six streams with 1 to 32 codebooks and different lengths, started at different ticks, stepped
    together (one batched graph per tick): each equals its own offline decode."""
    case = cases("tiny")
    rng = np.random.default_rng(12)
    specs = [(1, 17, 0), (8, 25, 0), (32, 9, 3), (3, 30, 5), (16, 12, 8), (8, 21, 2)]  # (K, frames, start tick)
    codes = [ref.random_codes(case.config, T, K, rng, batch=1)[0] for K, T, _ in specs]
    gots, wants = staggered_and_offline(codecrt, case.gguf, codes, [start for _, _, start in specs])
    for i, (got, want) in enumerate(zip(gots, wants)):
        assert got.shape == want.shape, i
        assert float(np.abs(got - want).max()) <= 1e-5, i


@pytest.mark.parametrize("ops", ["cpu", "portable"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_reused_slot_equals_a_fresh_one(codecrt, cases, chunk, ops):
    """A stream's KV ring is never cleared: in a slot that an earlier stream filled (max_streams
    = 1), a new stream's window holds that stream's keys before its own start. The mask gives
    them weight exactly 0, so its audio is bit-identical to the same stream in a fresh context."""
    case = cases("tiny")
    rng = np.random.default_rng(15)
    first = ref.random_codes(case.config, 31, 32, rng, batch=1)[0]
    second = ref.random_codes(case.config, 23, 8, rng, batch=1)[0]
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m:
        with codecrt.Context(m, device="cpu", max_streams=1, stream_chunk_frames=chunk) as ctx:
            stream_decode(ctx, first, [31])
            reused = stream_decode(ctx, second, [1] * 23)
        with codecrt.Context(m, device="cpu", max_streams=1, stream_chunk_frames=chunk) as ctx:
            fresh = stream_decode(ctx, second, [1] * 23)
    assert np.array_equal(reused, fresh)


def test_stream_codebook_count(codecrt, cases):
    """A stream's codebook count is fixed by its first push: another count later, more than the
    model's, or none, is a clear error that leaves the stream usable."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, 3, 8, np.random.default_rng(13), batch=1)[0]
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        s = ctx.stream()
        with pytest.raises(codecrt.CodecrtError, match="code levels"):
            s.push([codes[0, :1]] * 33)
        s.push([codes[k, :1] for k in range(8)])
        with pytest.raises(codecrt.CodecrtError, match="started with 8"):
            s.push([codes[k, 1:2] for k in range(4)])
        s.push([codes[k, 1:3] for k in range(8)])
        s.finish()
        out = []
        while not s.done:
            ctx.step([s])
            out.append(s.pull())
        want = ctx.decode([codes[k:k + 1] for k in range(8)])[0]
        np.testing.assert_allclose(np.concatenate(out), want, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_stream_released(codecrt, cases, record_property):
    """The released sizes streamed frame by frame over 12 s (past the 250-step window) equal the
    offline decode; prints the CPU cost of a 1-frame tick (one stream, shared machine)."""
    import time

    case = cases("mimi", "moshi")
    codes = ref.random_codes(case.config, 150, 8, np.random.default_rng(14), batch=1)
    with codecrt.Model(str(case.gguf)) as m:
        with codecrt.Context(m, device="cpu") as ctx:
            want = ctx.decode(levels(codes))[0]
        with codecrt.Context(m, device="cpu", stream_chunk_frames=1) as ctx:
            t0 = time.process_time()
            got = stream_decode(ctx, codes[0], [1] * 150)
            per_frame = (time.process_time() - t0) / 150
    err = float(np.abs(got - want).max())
    record_property("max_abs", err)
    record_property("cpu_ms_per_frame", per_frame * 1e3)
    print(f"\nMimi released streamed 150 frames: max |diff| {err:.2e}, {per_frame * 1e3:.1f} ms CPU per frame")
    assert err <= 1e-5
