"""The random Mimi builder (``codecd.convert.random_mimi``, what ``python -m bench mimi`` decodes on
machines without moshi or transformers) has the release's layout, and its GGUF decodes finite audio."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import codecrt_or_skip


def test_layout_equals_transformers_decoder():
    """Same keys and shapes as transformers' MimiModel (released sizes, kyutai/mimi's flat 4.x names)
    on the decoder path: everything but the encoder side (encoder, downsample, the quantizer's input_proj)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ref = pytest.importorskip("references.mimi")
    from transformers import MimiModel

    from codecd.convert.mimi import HF_PREFIXES
    from codecd.convert.random_mimi import random_mimi_state_dict

    with torch.device("meta"):  # shapes only: no weights allocated or initialised
        model = MimiModel(ref._hf_config(ref.MIMI))
    want = {k: tuple(v.shape) for k, v in ref.hf5_to_flat(model.state_dict()).items()
            if k.startswith(HF_PREFIXES) and not k.endswith("input_proj.weight")}
    got = {k: v.shape for k, v in random_mimi_state_dict(seed=3).items()}
    assert sorted(set(want) - set(got)) == [] and sorted(set(got) - set(want)) == []
    assert got == want
    assert len(want) > 100


def test_gguf_decodes_finite_audio(tmp_path):
    """The full-size random model converts, loads, and decodes 8 codebooks offline and streamed
    (frame by frame) to the same finite, non-silent audio of T * 1920 samples. The stream
    context admits tick graphs of 1,024 streams (max_batch): Mimi's bound counts its few
    steps of state at each rate, not 64 coarse frames upsampled (which refused more than
    107 streams a graph)."""
    codecrt = codecrt_or_skip()
    from codecd.convert.random_mimi import write_random_mimi

    gguf = write_random_mimi(tmp_path / "mimi.gguf", seed=1)
    codes = np.random.default_rng(0).integers(0, 2048, (8, 6)).astype(np.int32)
    with codecrt.Model(str(gguf)) as m:
        assert m.info.n_levels == 32 and m.info.hop_length == 1920 and m.info.sample_rate == 24000
        with codecrt.Context(m, device="cpu", n_threads=2) as ctx:
            want = ctx.decode([c[None] for c in codes])[0]
        with codecrt.Context(m, device="cpu", n_threads=2, stream_chunk_frames=1, max_streams=4,
                             max_batch=1024) as ctx:
            s = ctx.stream()
            out = []
            for t in range(codes.shape[1]):
                s.push([c[t:t + 1] for c in codes])
                ctx.step([s])
                out.append(s.pull())
            s.close()
    got = np.concatenate(out)
    assert want.shape == got.shape == (6 * 1920,)
    assert np.all(np.isfinite(want))
    rms = float(np.sqrt(np.mean(want**2)))
    assert 1e-2 < rms < 1e2
    assert float(np.abs(got - want).max()) <= 1e-4 * max(1.0, float(np.abs(want).max()))
