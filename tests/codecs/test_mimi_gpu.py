"""Mimi on the GPU (opt-in, marker `gpu`): CUDA against the CPU, offline and streamed.

Run on a CUDA build with ``CODECD_TEST_GPU=1 pytest -m gpu -s tests/codecs/test_mimi_gpu.py``
(``bench/gpu/run.sh mimi`` does). The model is the released size (32 codebooks, 8
transformer layers, the 250-step window) with random weights
(``codecd.convert.random_mimi``: numpy only, no torch or moshi on the device machine),
converted by the converter; every GPU decode is compared with the same decode on the CPU.
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
# Streams step 1-3 frames a tick: a tick's linears have 4 to 16 columns at a few streams, which
# ggml's CUDA backend would run in its small-batch kernel on TF32 tensor cores whatever
# NVIDIA_TF32_OVERRIDE says (1.2e-3 with TF32 off, measured on the H200 2026-12-04 11:20 UTC);
# cr_mm pads such products to cuBLAS (native/src/layers.c), so the override governs streams too.
# The CPU streams exactly (tests/codecs/test_mimi.py).
STREAM_TOL = TOL
FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    from codecd.convert.random_mimi import write_random_mimi

    return str(write_random_mimi(tmp_path_factory.mktemp("mimi") / "mimi.gguf", seed=5))


def codes(rng, n_q, shape):
    return [rng.integers(0, 2048, shape).astype(np.int32) for _ in range(n_q)]


@pytest.mark.parametrize("n_q,seconds", [(8, 2.0), (32, 2.0), (8, 30.0)])
def test_cuda_matches_cpu(codecrt, gguf, n_q, seconds):
    """Offline decodes of 2 s (batch 3) and 30 s (batch 1, past the 10 s attention window) with
    8 and 32 codebooks: CUDA within TOL of the CPU."""
    rng = np.random.default_rng(n_q + int(seconds))
    T = int(seconds * 12.5)
    batch = 3 if seconds <= 2 else 1
    lv = codes(rng, n_q, (batch, T))
    with codecrt.Model(gguf) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU) as gpu:
        assert gpu.device.startswith("CUDA")
        want = cpu.decode(lv)
        got = gpu.decode(lv)
    assert got.shape == want.shape == (batch, T * FRAME)
    err = rel_l2(got, want)
    print(f"\nMimi {n_q} codebooks, {seconds:g} s x {batch}: CUDA vs CPU relative L2 {err:.2e}")
    assert err <= TOL


def test_streams_on_gpu_equal_cpu_offline(codecrt, gguf):
    """Eight streams with 1..32 codebooks, started at different ticks and pushed 1 to 3 frames at
    a time, stepped together in one CUDA context past the window (320 frames, 25.6 s): each
    stream's audio is within STREAM_TOL of the CPU's offline decode of its codes."""
    rng = np.random.default_rng(7)
    n_qs = [1, 8, 8, 16, 32, 8, 4, 32]
    starts = [0, 3, 7, 11, 20, 31, 40, 55]
    T = 320
    want_codes = [codes(rng, q, T) for q in n_qs]
    with codecrt.Model(gguf) as m:
        with codecrt.Context(m, device="cpu") as cpu:
            want = [cpu.decode([c[None] for c in cs])[0] for cs in want_codes]
        with codecrt.Context(m, device=GPU, stream_chunk_frames=1, max_streams=8, max_batch=8) as gpu:
            streams, pos, out = [None] * 8, [0] * 8, [[] for _ in range(8)]
            for tick in range(10 * T):
                live = []
                for i in range(8):
                    if tick == starts[i]:
                        streams[i] = gpu.stream()
                    s = streams[i]
                    if s is None or s.done:
                        continue
                    if pos[i] < T:
                        n = min(int(rng.integers(1, 4)), T - pos[i])
                        s.push([c[pos[i]:pos[i] + n] for c in want_codes[i]])
                        pos[i] += n
                        if pos[i] == T:
                            s.finish()
                    live.append(s)
                if not live and tick > max(starts):
                    break
                gpu.step(live)
                for i, s in enumerate(streams):
                    if s is not None:
                        out[i].append(s.pull())
            for s in streams:
                s.close()
    errs = []
    for i in range(8):
        got = np.concatenate(out[i])
        assert got.shape == want[i].shape
        errs.append(rel_l2(got, want[i]))
        print(f"stream {i} ({n_qs[i]} codebooks, started at tick {starts[i]}): CUDA stream vs CPU offline "
              f"{errs[-1]:.2e}")
    assert max(errs) <= STREAM_TOL
