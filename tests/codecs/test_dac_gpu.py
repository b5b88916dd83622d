"""DAC on the GPU (opt-in, marker `gpu`): CUDA against the CPU, offline and streamed.

Run on a CUDA build with ``CODECD_TEST_GPU=1 pytest -m gpu -s tests/codecs/test_dac_gpu.py``
(``bench/gpu/run.sh vocos`` does). The models are the released 24 kHz (32 codebooks) and
44.1 kHz (9) sizes with random weights (``codecd.convert.random_dac``: numpy only, no torch or
reference package on the device machine), converted by the converter; every GPU decode is
compared with the same decode on the CPU.
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
TOL = 1e-4 if TF32_OFF else 2e-3  # relative L2, GPU against CPU (see tests/native/test_gpu.py)


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module", params=["24khz", "44khz"])
def model(request, tmp_path_factory):
    from codecd.convert.random_dac import write_random_dac

    name = request.param
    return name, write_random_dac(name, tmp_path_factory.mktemp("dac") / f"{name}.gguf", seed=3)


def codes_for(m, rng, shape):
    return [rng.integers(0, m.info.codebook_sizes[q], shape).astype(np.int32) for q in range(m.info.n_levels)]


def test_cuda_matches_cpu(codecrt, model):
    """A batch of 3 x 201 frames, and the same through frame buckets (masked graphs), on CUDA and
    on the CPU: relative L2 within TOL; the samples the odd stride loses stay silence."""
    name, path = model
    rng = np.random.default_rng(1)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU) as gpu, \
            codecrt.Context(m, device=GPU, frame_bucket=64, batch_bucket=True) as bucketed:
        assert gpu.device.startswith("CUDA")
        lv = codes_for(m, rng, (3, 201))
        want = cpu.decode(lv)
        got = gpu.decode(lv)
        masked = bucketed.decode(lv)
    err, err_masked = rel_l2(got, want), rel_l2(masked, want)
    print(f"\nDAC {name}: CUDA vs CPU relative L2 {err:.2e}, bucketed (masked) {err_masked:.2e}")
    for label, out, e in (("plain", got, err), ("bucketed", masked, err_masked)):
        if e > TOL:  # where it differs: per sequence, and the span of the samples that do
            d = np.abs(out.astype(np.float64) - want)
            bad = np.nonzero(d > 1e-3 * np.abs(want).max())
            print(f"DAC {name} {label}: per sequence "
                  + ", ".join(f"{rel_l2(out[i], want[i]):.2e}" for i in range(want.shape[0]))
                  + f"; samples off by over 1e-3 of the peak: {bad[1].size}, "
                  f"at {bad[1].min() if bad[1].size else '-'} to {bad[1].max() if bad[1].size else '-'} "
                  f"of {want.shape[1]}")
    assert err <= TOL and err_masked <= TOL
    if name == "24khz":  # 320 T - 8 samples, then silence
        assert not np.any(want[:, -8:]) and not np.any(got[:, -8:])


def test_device_piece_budget(codecrt, model, monkeypatch):
    """A GPU's piece budget follows its memory (guard.c): a batch that runs in pieces under the
    CPU's 2^27 elements runs in no more graphs under the device's default, with the same samples."""
    name, path = model
    rng = np.random.default_rng(4)
    with codecrt.Model(str(path)) as m:
        lv = codes_for(m, rng, (16, int(2 * m.info.sample_rate / m.info.hop_length)))
        with codecrt.Context(m, device=GPU) as gpu:
            got = gpu.decode(lv)
            computes = gpu.stats.computes
        monkeypatch.setenv("CODECRT_PIECE_ELEMENTS", str(1 << 27))
        with codecrt.Context(m, device=GPU) as small:
            want = small.decode(lv)
            small_computes = small.stats.computes
    err = rel_l2(got, want)
    print(f"\nDAC {name}: 16 x 2 s on CUDA in {computes} graph(s) under the device's piece budget, "
          f"{small_computes} under 2^27 elements, relative L2 {err:.2e}")
    assert computes <= small_computes and err <= TOL


def test_long_decode_in_pieces_on_gpu(codecrt, model):
    """30 s at batch 1 (pieces under the piece budget, each with the receptive field as context)
    on CUDA match the CPU's decode of the same codes."""
    name, path = model
    rng = np.random.default_rng(2)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device=GPU) as gpu, \
            codecrt.Context(m, device="cpu") as cpu:
        sr = m.info.sample_rate
        T = int(30 * sr / m.info.hop_length)
        lv = codes_for(m, rng, T)
        got = gpu.decode(lv)
        want = cpu.decode(lv)
        computes = gpu.stats.computes
    err = rel_l2(got, want)
    print(f"\nDAC {name}: {T} frames (30 s) on CUDA in {computes} graph(s), relative L2 to the CPU {err:.2e}")
    if err > TOL:  # where it differs: each second's error, and the span of the samples off by over 1e-3 of the peak
        d = np.abs(got.astype(np.float64) - want)
        bad = np.nonzero(d > 1e-3 * np.abs(want).max())[0]
        print(f"DAC {name} wrong samples: {bad.size}, at {bad.min() if bad.size else '-'} to "
              f"{bad.max() if bad.size else '-'} of {want.size}; per second: "
              + ", ".join(f"{rel_l2(got[i:i + sr], want[i:i + sr]):.1e}" for i in range(0, want.size, sr)))
    assert np.isfinite(got).all() and err <= TOL


def test_streams_on_gpu_match_offline(codecrt, model):
    """16 streams stepped together on CUDA, codes pushed in random pieces: each equals the CPU's
    offline decode within TOL (the tick graphs that GPUs run)."""
    name, path = model
    rng = np.random.default_rng(3)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU, max_batch=16, max_streams=16, batch_bucket=True,
                            stream_chunk_frames=4) as gpu:
        utter = [codes_for(m, rng, int(rng.integers(20, 120))) for _ in range(16)]
        want = [cpu.decode(u) for u in utter]
        got = random_push_streams(gpu, utter, rng)
    errs = [rel_l2(g, w) for g, w in zip(got, want)]
    print(f"\nDAC {name}: 16 streams on CUDA vs CPU offline, worst relative L2 {max(errs):.2e}")
    assert max(errs) <= TOL
