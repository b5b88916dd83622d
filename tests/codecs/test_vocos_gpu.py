"""WavTokenizer, NeuCodec and XCodec2 on the GPU (opt-in, marker `gpu`): CUDA against the CPU.

Run on a CUDA build with ``CODECD_TEST_GPU=1 pytest -m gpu -s tests/codecs/test_vocos_gpu.py``
(``bench/gpu/run.sh vocos`` does). The models are full-size with random weights written by
``codecd.convert.random_vocos`` through the converters (no torch or reference package needed on
the device machine); every GPU decode is compared with the same decode on the CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import codecrt_or_skip

pytestmark = pytest.mark.gpu

GPU = os.environ.get("CODECD_GPU_DEVICE", "cuda:0")
TF32_OFF = os.environ.get("NVIDIA_TF32_OVERRIDE") == "0"
TOL = 1e-4 if TF32_OFF else 2e-3  # relative L2, GPU against CPU (see tests/native/test_gpu.py)
#: the longest one-graph decode at batch 1 (docs/runtime.md): the attention scores at the piece budget
LONGEST = {"wavtokenizer-75": 11584, "wavtokenizer-40": 11584, "neucodec": 2896, "xcodec2": 2896}


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module", params=sorted(LONGEST))
def model(request, tmp_path_factory):
    from codecd.convert.random_vocos import write_random_vocos

    kind = request.param
    return kind, write_random_vocos(kind, tmp_path_factory.mktemp("vocos") / f"{kind}.gguf", seed=3)


def test_cuda_matches_cpu(codecrt, model):
    """A batch of 3 x 201 frames, and the same through frame buckets (masked graphs), on CUDA and
    on the CPU: relative L2 within TOL."""
    kind, path = model
    rng = np.random.default_rng(1)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU) as gpu, \
            codecrt.Context(m, device=GPU, frame_bucket=64, batch_bucket=True) as bucketed:
        assert gpu.device.startswith("CUDA")
        codes = rng.integers(0, m.info.codebook_sizes[0], (3, 201)).astype(np.int32)
        want = cpu.decode([codes])
        got = gpu.decode([codes])
        masked = bucketed.decode([codes])
    err, err_masked = rel_l2(got, want), rel_l2(masked, want)
    print(f"\n{kind}: CUDA vs CPU relative L2 {err:.2e}, bucketed (masked) {err_masked:.2e}")
    assert err <= TOL and err_masked <= TOL


def test_longest_decode_on_gpu(codecrt, model, monkeypatch):
    """The longest decode the context takes as one graph runs on CUDA (no launch-grid or element
    failure) and matches the CPU; one frame more is refused with TooLargeError before any compute."""
    # LONGEST is the boundary of the CPU's piece budget, 2^27 elements; a large GPU's own budget
    # is larger (guard.c), so the boundary is checked under the CPU's
    monkeypatch.setenv("CODECRT_PIECE_ELEMENTS", str(1 << 27))
    kind, path = model
    T = LONGEST[kind]
    rng = np.random.default_rng(2)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device=GPU) as gpu:
        codes = rng.integers(0, m.info.codebook_sizes[0], T + 1).astype(np.int32)
        with pytest.raises(codecrt.TooLargeError, match="cannot be decoded in pieces"):
            gpu.decode([codes])
        got = gpu.decode([codes[:T]])
        with codecrt.Context(m, device="cpu") as cpu:
            want = cpu.decode([codes[:T]])
    err = rel_l2(got, want)
    print(f"\n{kind}: {T} frames ({T * m.info.hop_length / m.info.sample_rate:.1f} s) on CUDA, "
          f"relative L2 to the CPU {err:.2e}")
    assert np.isfinite(got).all() and err <= TOL


def test_batch_64_on_gpu(codecrt, model):
    """64 sequences in one graph: each equals its own decode (sequences never mix)."""
    kind, path = model
    rng = np.random.default_rng(3)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device=GPU, max_batch=64) as gpu:
        codes = rng.integers(0, m.info.codebook_sizes[0], (64, 150)).astype(np.int32)
        batch = gpu.decode([codes])
        for b in (0, 31, 63):
            assert rel_l2(batch[b], gpu.decode([codes[b]])) <= TOL
