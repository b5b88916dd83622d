"""The Qwen3-TTS 12 Hz tokenizer decoder on the GPU (opt-in, marker `gpu`): CUDA against the CPU,
offline and streamed.

Run on a CUDA build with ``CODECD_TEST_GPU=1 pytest -m gpu -s tests/codecs/test_qwen3_gpu.py``
(``bench/gpu/run.sh qwen3`` does). The model is the released size with random weights
(``codecd.convert.random_qwen3``: numpy only, no torch or qwen-tts on the device machine),
converted by the converter; every GPU decode is compared with the same decode on the CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import codecrt_or_skip
from streamkit import random_push_streams

pytestmark = pytest.mark.gpu

GPU = os.environ.get("CODECD_GPU_DEVICE", "cuda:0")
TF32_OFF = os.environ.get("NVIDIA_TF32_OVERRIDE") == "0"
# relative L2, GPU against CPU. With TF32 on (ggml's cuBLAS default), this decoder amplifies the
# products' 2^-11 rounding about a hundredfold: 7.7e-3 offline and 7.8e-3 streamed on the H200
# (2026-12-04 13:46 UTC, docs/gpu/qwen3-gpu-tests-2026-12-04-pm.txt); with it off, 2.2e-5.
TOL = 1e-4 if TF32_OFF else 1.5e-2
# Streams: a tick's linears have 4 to 16 columns at a few streams, which ggml's CUDA backend ran
# in its small-batch kernel on TF32 tensor cores whatever NVIDIA_TF32_OVERRIDE says (1.2e-2 to
# 1.8e-2 with TF32 off on the H200, 2026-12-04 11:20 UTC: this decoder amplifies relative rounding
# about a hundredfold). cr_mm pads such products to cuBLAS (native/src/layers.c), so the override
# governs streams as it does the offline decode.


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from codecd.convert.random_qwen3 import write_random_qwen3

    return write_random_qwen3(tmp_path_factory.mktemp("qwen3") / "qwen3.gguf", config="12hz", seed=3)


def codes_for(rng, k, shape):
    return [rng.integers(0, 2048, shape).astype(np.int32) for _ in range(k)]


def test_cuda_matches_cpu(codecrt, path):
    """A batch of 2 x 100 frames (8 s, past the 72-frame window) at 16 codebooks, and 40 frames at
    4 codebooks, on CUDA and on the CPU: relative L2 within TOL."""
    rng = np.random.default_rng(1)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU) as gpu:
        assert gpu.device.startswith("CUDA")
        for k, shape in ((16, (2, 100)), (4, (1, 40))):
            lv = codes_for(rng, k, shape)
            want = cpu.decode(lv)
            got = gpu.decode(lv)
            err = rel_l2(got, want)
            print(f"\nQwen3 {k} codebooks {shape}: CUDA vs CPU relative L2 {err:.2e}")
            assert err <= TOL


def test_streams_on_gpu_match_offline(codecrt, path):
    """16 streams (1..16 codebooks, 20..100 frames: past the window, under the piece budget) stepped
    together on CUDA, codes pushed in random pieces: each equals the CPU's offline decode within TOL."""
    rng = np.random.default_rng(3)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU, max_batch=16, max_streams=16, batch_bucket=True,
                            stream_chunk_frames=2) as gpu:
        utter = [codes_for(rng, int(rng.choice([16, 16, int(rng.integers(1, 17))])), int(rng.integers(20, 101)))
                 for _ in range(16)]
        want = [cpu.decode([x[None] for x in u])[0] for u in utter]
        got = random_push_streams(gpu, utter, rng)
    errs = [rel_l2(g, w) for g, w in zip(got, want)]
    print(f"\nQwen3: 16 streams on CUDA vs CPU offline, worst relative L2 {max(errs):.2e}")
    assert max(errs) <= TOL
