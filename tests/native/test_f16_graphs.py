"""F16 models through the graphs that GPUs run: offline and streamed, every family.

A model converted with ``--dtype f16`` keeps its large matrices in half precision. The graphs
built for a GPU (time fastest: products written x^T w, the weight as the second operand) once
handed ggml an F16 second operand beside an F32 first, which neither ggml's CPU nor its CUDA
backend runs, and the scheduler aborted the process (``GGML_ASSERT(*cur_backend_id != -1)``).
The guard now refuses any node that no backend of a context runs (UnsupportedError, before ggml
sees it), and the products cast such a weight (``cr_f32``). Here every family's F16 model
decodes, offline and streamed, within 1e-2 (relative L2) of its F32 model on the same device:
on the CPU with the GPU's graphs (``CODECRT_PORTABLE_OPS=1``, in CI) and on CUDA (marker gpu,
opt-in: ``CODECD_TEST_GPU=1``; ``bench/gpu/run.sh`` runs it).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip
from streamkit import stream_decode

GPU = os.environ.get("CODECD_GPU_DEVICE", "cuda:0")
TOL = 1e-2  # F16 weights against F32 (the converters' f16 tests hold the same bound)

#: family -> how to write its model at a dtype (numpy-only writers, or SNAC from the snac package)
FAMILIES = ["snac-24khz", "dac-44khz", "mimi-tiny", "qwen3-tiny", "wavtokenizer-75", "neucodec", "xcodec2"]
#: the attention codecs: their streams decode overlapping windows offline
WINDOWED = {"wavtokenizer-75", "neucodec", "xcodec2"}


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def models(tmp_path_factory, snac_cases):
    """family -> {dtype: path}, written on first use."""
    root = tmp_path_factory.mktemp("f16")
    cache: dict[str, dict[str, str]] = {}

    def write(family: str, dtype: str) -> str:
        dst = root / f"{family}-{dtype}.gguf"
        if family.startswith("snac-"):
            from codecd.convert import convert

            return str(convert(snac_cases(family[5:]).folder, dst, dtype=dtype, progress=False))
        if family.startswith("dac-"):
            from codecd.convert.random_dac import write_random_dac

            return str(write_random_dac(family[4:], dst, seed=3, dtype=dtype))
        if family == "mimi-tiny":
            from codecd.convert.random_mimi import write_random_mimi

            return str(write_random_mimi(dst, config="tiny", seed=3, dtype=dtype))
        if family == "qwen3-tiny":
            from codecd.convert.random_qwen3 import write_random_qwen3

            return str(write_random_qwen3(dst, config="tiny", seed=3, dtype=dtype))
        from codecd.convert.random_vocos import write_random_vocos

        return str(write_random_vocos(family, dst, seed=3, dtype=dtype, small=True))

    def get(family: str) -> dict[str, str]:
        if family not in cache:
            cache[family] = {d: write(family, d) for d in ("f32", "f16")}
        return cache[family]

    return get


def _pushes(info, n_frames: int, rng) -> list[int]:
    """Finest-frame push sizes, each a multiple of the model's frame multiple, summing to n_frames."""
    mult = int(info.frame_multiple)
    out: list[int] = []
    while sum(out) < n_frames:
        out.append(min(mult * int(rng.integers(1, 4)), n_frames - sum(out)))
    return out


def _rel_l2(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


@pytest.mark.parametrize("device", ["cpu-portable", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("family", FAMILIES)
def test_f16_model_on_gpu_graphs(codecrt, models, monkeypatch, family, device):
    paths = models(family)
    if device == "cpu-portable":
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")  # the time-fastest graphs a GPU runs
        monkeypatch.setenv("CODECRT_FUSED_UNIT", "1")  # with the codecrt ops' C functions
        dev = "cpu"
    else:
        dev = GPU
    rng = np.random.default_rng(5)
    got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for dtype in ("f32", "f16"):
        with codecrt.Model(paths[dtype]) as m, codecrt.Context(m, device=dev) as ctx:
            assert m.info.weight_type == dtype
            n = max(int(m.info.frame_multiple), 8)
            n -= n % int(m.info.frame_multiple)
            n *= 3
            codes = reference.random_codes(m.info, n, None, np.random.default_rng(7))
            offline = ctx.decode(codes)
            if family in WINDOWED:  # streams of windows, each decoded offline (families/windowed.py)
                from codecd.families.windowed import WindowParams, windowed_decode

                streamed = windowed_decode(lambda c: ctx.decode([c]), codes[0],
                                           int(m.info.hop_length), WindowParams(chunk=4, lookback=4, lookahead=2,
                                                                                overlap=1))
            else:
                streamed = stream_decode(ctx, codes, _pushes(m.info, n, rng), m.info.level_strides)
            got[dtype] = (offline, streamed)
    e_off, e_str = _rel_l2(got["f16"][0], got["f32"][0]), _rel_l2(got["f16"][1], got["f32"][1])
    print(f"\n{family} f16 vs f32 on {device}: offline {e_off:.2e}, streamed {e_str:.2e}")
    assert got["f16"][0].shape == got["f32"][0].shape and got["f16"][1].shape == got["f32"][1].shape
    assert np.isfinite(got["f16"][0]).all() and np.isfinite(got["f16"][1]).all()
    assert e_off <= TOL and e_str <= TOL


@pytest.mark.parametrize("device", ["cpu-portable", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_f16_s3gen_on_gpu_graphs(codecrt, tmp_path_factory, monkeypatch, device):
    """S3Gen Turbo (random weights) with F16 matrices: its flow's mel within 1e-2 of the F32
    model's on the same device, a FlowStream's audio within 1e-2 on the CPU and 5e-2 on CUDA (the
    estimator's value product took an F16 weight as its second operand). On CUDA ggml multiplies
    an F16 weight by activations rounded to F16 and sums in F16 (cuBLAS' COMPUTE_16F, where
    GGML_PREC_DEFAULT), and the random vocoder amplifies that: mel 1.3e-3, audio 2.2e-2 on an
    H100 (31c80b2, TF32 off; CPU's portable graphs 6.0e-4 and 7.6e-3)."""
    from codecd.convert.random_s3gen import write_random_s3gen

    root = tmp_path_factory.mktemp("s3f16")
    if device == "cpu-portable":
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
    dev = "cpu" if device == "cpu-portable" else GPU
    tokens = np.random.default_rng(7).integers(0, 6561, 30).astype(np.int32)
    got = {}
    for dtype in ("f32", "f16"):
        path = write_random_s3gen(root / f"turbo-{dtype}.gguf", meanflow=True, seed=2, dtype=dtype)
        with codecrt.Model(str(path)) as m, codecrt.Context(m, device=dev) as ctx:
            rng = np.random.default_rng(1)
            v = codecrt.Voice(m, rng.integers(0, 6561, 20), rng.normal(-4, 2, (40, 80)).astype(np.float32),
                              rng.normal(0, 1, 192).astype(np.float32))
            mel = ctx.flow(tokens, v, seed=4)
            fs = codecrt.FlowStream(ctx, v, seed=8, first_chunk=10, chunk=10)
            fs.push(tokens)
            fs.finish()
            got[dtype] = (mel, fs.decode_all())
    e_mel, e_pcm = _rel_l2(got["f16"][0], got["f32"][0]), _rel_l2(got["f16"][1], got["f32"][1])
    print(f"\nS3Gen Turbo f16 vs f32 on {device}: mel {e_mel:.2e}, streamed audio {e_pcm:.2e}")
    assert got["f16"][1].shape == got["f32"][1].shape == (30 * 960,)
    assert e_mel <= TOL and e_pcm <= (TOL if device == "cpu-portable" else 5 * TOL)
