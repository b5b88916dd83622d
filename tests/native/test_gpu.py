"""The GPU path (opt-in, marker `gpu`): CUDA against the CPU, the seed's check, flat device memory.

Run on a CUDA build with ``CODECD_TEST_GPU=1 pytest -m gpu -s tests/native/test_gpu.py``
(bench/gpu/run.sh does). As ggml's test-backend-ops compares each backend with
the CPU, every decode here is compared with the same decode on the CPU.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip

pytestmark = pytest.mark.gpu

GPU = os.environ.get("CODECD_GPU_DEVICE", "cuda:0")
# ggml's CUDA backend runs F32 matrix products on cuBLAS with TF32 tensor-core
# math (10-bit mantissa inputs). NVIDIA_TF32_OVERRIDE=0 turns that off; then
# the GPU matches the CPU to F32 precision.
TF32_OFF = os.environ.get("NVIDIA_TF32_OVERRIDE") == "0"
TOL = 1e-4 if TF32_OFF else 2e-3  # relative L2, GPU against CPU, f32 weights
# Streamed against offline on the GPU, max |diff|. A tick of a few frames has
# matrix products of 4 to 16 columns, which ggml's CUDA backend would run in its
# small-batch kernel on TF32 tensor cores whatever NVIDIA_TF32_OVERRIDE says
# (3.0e-4 at 4 frames with TF32 off: docs/gpu/stream-check-2026-12-02.txt);
# cr_mm pads them to cuBLAS (native/src/layers.c), so with TF32 off a stream
# rounds as the offline decode does. The CPU streams exactly.
STREAM_TOL = 1e-5 if TF32_OFF else 5e-3


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def nvidia_smi_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.mark.parametrize("layout", ["auto", "time", "channels"])
@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
def test_cuda_matches_cpu(codecrt, snac_cases, name, layout, monkeypatch):
    """Every SNAC configuration decoded on the GPU matches the CPU (relative L2 <= 1e-4), batched, noise on;
    in each offline graph layout (CODECRT_OFFLINE_LAYOUT; auto: time fastest on a GPU)."""
    case = snac_cases(name)
    rng = np.random.default_rng(1)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as cpu:
        with monkeypatch.context() as mp:  # read when the context is created: the CPU's stays default
            mp.setenv("CODECRT_OFFLINE_LAYOUT", layout)
            gpu = codecrt.Context(m, device=GPU)
        with gpu:
            assert gpu.device.startswith("CUDA")
            n = 2 * m.info.frame_multiple if m.info.frame_multiple > 4 else 48
            levels = reference.random_codes(m.info, n, 3, rng)
            a = gpu.decode(levels, noise=True, seed=3)
            splits = gpu.stats.graph_splits
        b = cpu.decode(levels, noise=True, seed=3)
    err = rel_l2(a, b)
    print(f"\nSNAC {name} ({layout} layout): CUDA vs CPU relative L2 {err:.2e}, max |diff| {np.abs(a - b).max():.2e}, "
          f"graph splits {splits}, TF32 {'off' if TF32_OFF else 'on'}")
    assert err <= TOL


def test_seed_check_two_decodes(codecrt, snac_cases):
    """The seed's check: two GPU decodes through one context are identical and not silent."""
    case = snac_cases("24khz")
    levels = reference.random_codes(reference.SNAC_24KHZ, 64, None, np.random.default_rng(2))
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device=GPU) as ctx:
        a = ctx.decode(levels)
        b = ctx.decode(levels)
    assert np.array_equal(a, b)
    assert float(np.sqrt(np.mean(a**2))) > 0.01


def test_ten_thousand_decodes_flat_device_memory(codecrt, snac_cases):
    """10,000 decodes of mixed lengths and batches: equal results, flat compute buffers and nvidia-smi memory."""
    case = snac_cases("24khz")
    rng = np.random.default_rng(3)
    shapes = [(4, 1), (16, 4), (8, 2), (32, 1), (12, 8), (4, 16)]
    cases = [reference.random_codes(reference.SNAC_24KHZ, f, b, rng) for f, b in shapes]
    with codecrt.Model(case.gguf) as m, \
         codecrt.Context(m, device=GPU, frame_bucket=16, batch_bucket=True, max_batch=16) as ctx:
        ctx.reserve(32, 16)
        first = [ctx.decode(c) for c in cases]
        buf0, smi0 = ctx.stats.compute_buffer_bytes, nvidia_smi_used_mib()
        for i in range(10_000):
            k = ((i // 3) * 5) % len(cases)  # each shape three times in a row, then another
            out = ctx.decode(cases[k])
            if i % 997 == 0:
                assert np.array_equal(out, first[k]), f"decode {i} differs from the first"
        buf1, smi1 = ctx.stats.compute_buffer_bytes, nvidia_smi_used_mib()
        st = ctx.stats
    print(f"\n10k decodes: compute buffers {buf0} -> {buf1} bytes, nvidia-smi {smi0} -> {smi1} MiB, "
          f"built {st.graphs_built}, reused {st.graphs_reused}, reservations {st.reservations}")
    assert buf1 == buf0
    assert smi1 - smi0 <= 64


def test_recreate_policy_on_gpu(codecrt, snac_cases):
    """The scheduler-recreate policy on the GPU: identical results, recreations counted."""
    case = snac_cases("24khz")
    rng = np.random.default_rng(4)
    a = reference.random_codes(reference.SNAC_24KHZ, 64, None, rng)
    b = reference.random_codes(reference.SNAC_24KHZ, 16, 2, rng)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device=GPU) as ctx:
        want_a, want_b = ctx.decode(a), ctx.decode(b)
        ctx.set_recreate_policy("decode", True)
        for _ in range(4):
            assert np.array_equal(ctx.decode(a), want_a)
            assert np.array_equal(ctx.decode(b), want_b)
        assert ctx.stats.sched_recreations >= 7


@pytest.mark.parametrize("name", ["24khz", "44khz"])
def test_streaming_on_gpu_equals_offline(codecrt, snac_cases, name):
    """Streaming on the GPU, several streams batched, equals offline decode on the GPU."""
    case = snac_cases(name)
    rng = np.random.default_rng(5)
    with codecrt.Model(case.gguf) as m, \
         codecrt.Context(m, device=GPU, batch_bucket=True, max_batch=8) as ctx:
        n = 3 * m.info.frame_multiple if m.info.frame_multiple > 4 else 40
        utts = [reference.random_codes(m.info, n, None, rng) for _ in range(3)]
        want = [ctx.decode(u, noise=True, seed=i) for i, u in enumerate(utts)]
        ss = [ctx.stream(noise=True, seed=i) for i in range(3)]
        for s, u in zip(ss, utts):
            s.push(u)
            s.finish()
        while ctx.step(ss):
            pass
        got = [s.pull() for s in ss]
        for s in ss:
            s.close()
    for g, w in zip(got, want):
        assert len(g) == len(w)
        d = float(np.abs(g - w).max())
        print(f"\nSNAC {name} GPU streamed vs offline: max |diff| {d:.2e} (TF32 {'off' if TF32_OFF else 'on'})")
        assert d < STREAM_TOL


# ------------------------------------------- the unit core on CUDA (issue 19)


def _context(codecrt, m, device, env, **kw):
    """A context created under env (read when a context is created), as a context manager."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return codecrt.Context(m, device=device, **kw)


@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
def test_unit_kernels_match_their_cpu_functions(codecrt, snac_cases, name):
    """The residual unit's ops on CUDA (native/src/cuda/cuda_ops.cu: the core, its Snakes' sine reduced or
    CUDA's sinf, and the tail; the transposed convs' tail) against
    the same ops' C functions on the CPU (portable graphs, CODECRT_FUSED_UNIT=1) and against the
    composed ggml ops on the GPU (CODECRT_FUSED_UNIT=0), offline and streamed: as ggml's
    test-backend-ops checks a backend's op against the CPU's. The ops backend is in the context's
    list only when fused."""
    case = snac_cases(name)
    rng = np.random.default_rng(11)
    with codecrt.Model(case.gguf) as m:
        n = 2 * m.info.frame_multiple if m.info.frame_multiple > 4 else 48
        levels = reference.random_codes(m.info, n, 3, rng)
        # without noise the transposed convs' tails run as their op too (ops/ops_upconv.c): masked
        # in the bucketed context (3 sequences in a bucket of 4), unmasked in the plain one
        with _context(codecrt, m, "cpu", {"CODECRT_PORTABLE_OPS": "1", "CODECRT_FUSED_UNIT": "1"}) as cpu:
            want = cpu.decode(levels, noise=True, seed=3)
            want_quiet = cpu.decode(levels)
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "0"}) as composed:
            assert not any(b.endswith("+codecrt") for b in composed.stats.backends)
            base = composed.decode(levels, noise=True, seed=3)
            base_quiet = composed.decode(levels)
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "1"}) as plain:
            quiet_plain = plain.decode(levels)
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "1", "CODECRT_PRECISE_SIN": "1"}) as precise:
            got_precise = precise.decode(levels, noise=True, seed=3)  # the Snakes with CUDA's sinf
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "1"}, batch_bucket=True, max_batch=4) as gpu:
            assert any(b.endswith("+codecrt") for b in gpu.stats.backends), gpu.stats.backends
            got = gpu.decode(levels, noise=True, seed=3)
            quiet = gpu.decode(levels)  # what the streams below must give (noise is seeded per stream)
            ss = [gpu.stream() for _ in range(3)]
            for b, s in enumerate(ss):
                s.push([lv[b] for lv in levels])
                s.finish()
            while gpu.step(ss):
                pass
            streamed = np.stack([s.pull() for s in ss])
            for s in ss:
                s.close()
            splits = gpu.stats.graph_splits
    e_cpu, e_composed, e_precise = rel_l2(got, want), rel_l2(got, base), rel_l2(got_precise, want)
    e_tail = max(rel_l2(quiet, want_quiet), rel_l2(quiet_plain, want_quiet))
    e_tail_composed = max(rel_l2(quiet, base_quiet), rel_l2(quiet_plain, base_quiet))
    e_stream = float(np.abs(streamed - quiet).max())
    print(f"\nSNAC {name} unit ops on CUDA: vs their CPU functions {e_cpu:.2e} ({e_precise:.2e} with "
          f"CODECRT_PRECISE_SIN=1), vs composed on CUDA {e_composed:.2e}; "
          f"with the upconv tail op (no noise, masked and not) {e_tail:.2e} and {e_tail_composed:.2e}; "
          f"streamed vs offline max |diff| {e_stream:.2e}, graph splits {splits}, TF32 {'off' if TF32_OFF else 'on'}")
    assert e_cpu <= TOL and e_composed <= TOL and e_precise <= TOL
    assert not np.array_equal(got_precise, got)  # the switch reached the kernels
    assert e_tail <= TOL and e_tail_composed <= TOL
    assert e_stream < STREAM_TOL


# ------------------------------------------------------ long decodes (issue 24)


def _frames(info, seconds):
    n = int(seconds * info.sample_rate / info.hop_length)
    return max(info.frame_multiple, n - n % info.frame_multiple)


@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
def test_long_offline_decodes_on_gpu(codecrt, snac_cases, name):
    """Offline decodes past CUDA's launch grid (65,536 samples and more, up to 300 s), batch 1 and 16: no
    abort, the CPU's samples within the GPU tolerance, and equal to the same decode in finer pieces."""
    case = snac_cases(name)
    rng = np.random.default_rng(9)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device=GPU) as gpu, \
            codecrt.Context(m, device="cpu") as cpu:
        for seconds, batch in [(2.73, 1), (2.73, 16), (10, 16), (60, 1), (300, 1)]:
            n = _frames(m.info, seconds)
            levels = reference.random_codes(m.info, n, batch, rng)
            y = gpu.decode(levels, noise=True, seed=5)
            assert y.shape == (batch, n * m.info.hop_length)
            msg = f"SNAC {name} GPU {seconds} s x {batch}:"
            if seconds <= 60:
                e = rel_l2(y[0], cpu.decode([lv[0] for lv in levels], noise=True, seed=5))
                msg += f" vs CPU {e:.2e}"
                assert e <= TOL
            os.environ["CODECRT_PIECE_ELEMENTS"] = str(1 << 24)
            try:
                with codecrt.Context(m, device=GPU) as fine:
                    z = fine.decode(levels, noise=True, seed=5)
                    k = fine.stats.computes
            finally:
                del os.environ["CODECRT_PIECE_ELEMENTS"]
            e = rel_l2(z, y)
            print(f"\n{msg} vs {k} finer pieces {e:.2e}")
            assert e <= TOL


def test_cli_decodes_300s_on_gpu(codecrt, snac_cases, tmp_path):
    """``codecd decode --device cuda`` writes a 300 s WAV (the decode that aborted from 2.73 s)."""
    import sys
    import wave

    case = snac_cases("24khz")
    with codecrt.Model(case.gguf) as m:
        n = _frames(m.info, 300)
        levels = reference.random_codes(m.info, n, None, np.random.default_rng(10))
    codes = tmp_path / "codes.npz"
    np.savez(codes, **{f"level{i}": lv for i, lv in enumerate(levels)})
    out = tmp_path / "out.wav"
    r = subprocess.run([sys.executable, "-m", "codecd.cli", "decode", "--model", str(case.gguf), str(codes),
                        "-o", str(out), "--device", GPU], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        frames = w.getnframes()
    print(f"\ncodecd decode --device {GPU}: {frames} samples ({frames / 24000:.1f} s)")
    assert frames == n * 512


# ------------------------------------------------------------------ S3Gen


@pytest.fixture(scope="module", params=["orig", "turbo"])
def s3gen_gguf(request, tmp_path_factory):
    from codecd.convert.random_s3gen import write_random_s3gen

    meanflow = request.param == "turbo"
    return write_random_s3gen(tmp_path_factory.mktemp("s3") / f"{request.param}.gguf", meanflow=meanflow, seed=2)


def _s3_voice(codecrt, model, n=75, seed=1):
    rng = np.random.default_rng(seed)
    return codecrt.Voice(model, rng.integers(0, 6561, n), rng.normal(-4, 2, (2 * n, 80)).astype(np.float32),
                         rng.normal(0, 1, 192).astype(np.float32))


# The flow runs its estimator 10 (Turbo: 2) times and feeds the vocoder, so
# TF32 rounding compounds: measured errors are in docs/benchmarks.md.
S3_TOL = 2e-3 if TF32_OFF else 5e-2


def test_s3gen_cuda_matches_cpu(codecrt, s3gen_gguf):
    """S3Gen (random weights, 3 s prompt, 2 s of speech) on CUDA against the CPU: mel and PCM."""
    tokens = np.random.default_rng(3).integers(0, 6561, 50).astype(np.int32)
    with codecrt.Model(s3gen_gguf) as m, codecrt.Context(m, device="cpu") as cpu, \
            codecrt.Context(m, device=GPU) as gpu:
        v = _s3_voice(codecrt, m)
        mel_c, mel_g = cpu.flow(tokens, v, seed=4), gpu.flow(tokens, v, seed=4)
        pcm_c, pcm_g = cpu.decode([tokens], voice=v, seed=4), gpu.decode([tokens], voice=v, seed=4)
        voc_c, voc_g = cpu.vocode(mel_c, seed=4), gpu.vocode(mel_c, seed=4)
        e_mel, e_pcm, e_voc = rel_l2(mel_g, mel_c), rel_l2(pcm_g, pcm_c), rel_l2(voc_g, voc_c)
        print(f"\nS3Gen {m.info.default_steps} steps CUDA vs CPU rel L2: mel {e_mel:.2e}, pcm {e_pcm:.2e}, "
              f"vocoder alone {e_voc:.2e} (TF32 {'off' if TF32_OFF else 'on'})")
        assert e_mel < S3_TOL and e_voc < S3_TOL and e_pcm < 5 * S3_TOL


def test_s3gen_estimator_ops_match_their_cpu_functions_and_ggml(codecrt, s3gen_gguf):
    """The flow estimator's device ops on CUDA (cuda/cuda_ops.cu, the default where the ops
    backend is: the norms with their affine and Mish, the products and the attention's scores
    and values through cuBLAS, its softmax, the biases with GELU or the residual, the convs'
    columns) against the ops'
    C functions on the CPU's portable graphs (CODECRT_FUSED_UNIT=1) and against ggml's own ops
    on CUDA (=0): the flow's mel, every Euler step."""
    tokens = np.random.default_rng(9).integers(0, 6561, 40).astype(np.int32)
    with codecrt.Model(s3gen_gguf) as m:
        steps, v = m.info.default_steps, _s3_voice(codecrt, m)
        with _context(codecrt, m, "cpu", {"CODECRT_PORTABLE_OPS": "1", "CODECRT_FUSED_UNIT": "1"}) as cpu:
            want = cpu.flow(tokens, v, seed=2)
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "0"}) as composed:
            assert not any(b.endswith("+codecrt") for b in composed.stats.backends)
            base = composed.flow(tokens, v, seed=2)
        with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": "1"}) as gpu:
            assert any(b.endswith("+codecrt") for b in gpu.stats.backends), gpu.stats.backends
            got = gpu.flow(tokens, v, seed=2)
        v.close()
    e_cpu, e_ggml = rel_l2(got, want), rel_l2(got, base)
    print(f"\nS3Gen {steps} steps, estimator ops on CUDA: mel vs their CPU functions {e_cpu:.2e}, "
          f"vs ggml's ops on CUDA {e_ggml:.2e} (TF32 {'off' if TF32_OFF else 'on'})")
    assert e_cpu < S3_TOL and e_ggml < S3_TOL


def test_s3gen_softmax_kernel_on_rows_past_its_registers(codecrt, s3gen_gguf):
    """One estimator evaluation over 1,100 frames (rows of 1,100 scores: the kernel's
    three-pass path, past the 1,024 it keeps in registers) with codecrt's ops on CUDA (the
    softmax and the estimator's other ops) against ggml's."""
    rng = np.random.default_rng(4)
    T = 1100
    inp = dict(x=rng.normal(0, 1, (1, 80, T)).astype(np.float32), mu=rng.normal(0, 1, (1, 80, T)).astype(np.float32),
               cond=rng.normal(-2, 2, (1, 80, T)).astype(np.float32), spks=rng.normal(0, 1, (1, 80)).astype(np.float32),
               t=np.array([0.3], np.float32))
    with codecrt.Model(s3gen_gguf) as m:
        if m.info.default_steps == 2:
            inp["r"] = np.array([0.8], np.float32)  # Turbo: mean flow's end time
        out = {}
        for fused in ("0", "1"):
            with _context(codecrt, m, GPU, {"CODECRT_FUSED_UNIT": fused}) as gpu:
                out[fused] = codecrt.diag.diag_estimate(gpu, **inp)
    e = rel_l2(out["1"], out["0"])
    print(f"\nS3Gen estimator at T={T}: codecrt's ops vs ggml's on CUDA {e:.2e} (TF32 {'off' if TF32_OFF else 'on'})")
    assert np.all(np.isfinite(out["1"])) and e < S3_TOL


def test_s3gen_columns_kernel_matches_its_cpu_function_and_ggml(codecrt, s3gen_gguf):
    """The convolutions' columns as codecrt's op on CUDA (cuda/cuda_ops.cu, the default where the
    ops backend is: the vocoder's and F0 predictor's stride-1 convs, the ResBlocks' Snakes gathered
    through it, the encoder's and the estimator's convs) against the op's C function on the CPU's
    portable graphs (CODECRT_FUSED_UNIT=1) and against ggml's transpose + im2col on CUDA (=0): the
    vocoder alone on one mel, and a whole decode; the Snakes' sine reduced (the default) and
    CUDA's sinf (CODECRT_PRECISE_SIN=1)."""
    tokens = np.random.default_rng(10).integers(0, 6561, 40).astype(np.int32)
    mel = np.random.default_rng(11).normal(-4, 2, (80, 90)).astype(np.float32)
    out = {}
    with codecrt.Model(s3gen_gguf) as m:
        v = _s3_voice(codecrt, m)
        for name, dev, fused in (("cpu", "cpu", "1"), ("ggml", GPU, "0"), ("ops", GPU, "1"), ("sinf", GPU, "1")):
            env = {"CODECRT_FUSED_UNIT": fused} | ({"CODECRT_PORTABLE_OPS": "1"} if dev == "cpu" else {}) | \
                ({"CODECRT_PRECISE_SIN": "1"} if name == "sinf" else {})
            with _context(codecrt, m, dev, env) as ctx:
                if dev != "cpu":  # the ops backend is there exactly when asked
                    assert any(b.endswith("+codecrt") for b in ctx.stats.backends) == (fused == "1")
                out[name] = (ctx.vocode(mel, seed=3), ctx.decode([tokens], voice=v, seed=3))
        v.close()
    for op in ("ops", "sinf"):
        e = {k: (rel_l2(out[op][0], out[k][0]), rel_l2(out[op][1], out[k][1])) for k in ("cpu", "ggml")}
        print(f"\nS3Gen columns op on CUDA, sine {'reduced' if op == 'ops' else 'sinf'}: vocoder vs its CPU "
              f"function {e['cpu'][0]:.2e}, vs ggml's im2col {e['ggml'][0]:.2e}; decode {e['cpu'][1]:.2e}, "
              f"{e['ggml'][1]:.2e} (TF32 {'off' if TF32_OFF else 'on'})")
        assert all(np.all(np.isfinite(a)) for a in out[op])
        assert e["cpu"][0] < S3_TOL and e["ggml"][0] < S3_TOL
        assert e["cpu"][1] < 5 * S3_TOL and e["ggml"][1] < 5 * S3_TOL


def test_s3gen_bf16_refused_on_gpu(codecrt, s3gen_gguf):
    """The BF16 product mode is a CPU mode: a GPU context refuses it by name, never runs F32 silently."""
    with codecrt.Model(s3gen_gguf) as m:
        with pytest.raises(codecrt.UnsupportedError, match="CPU only"):
            codecrt.Context(m, device=GPU, precision="bf16")


def test_s3gen_seed_check_largest_graph(codecrt, s3gen_gguf):
    """The seed's check on CUDA for S3Gen's largest graphs (10 s after a 3 s prompt), recreate policy on."""
    tokens = np.random.default_rng(5).integers(0, 6561, 250).astype(np.int32)
    kinds = ("encode", "flow_step", "f0", "vocode")
    with codecrt.Model(s3gen_gguf) as m, codecrt.Context(m, device=GPU) as gpu:
        v = _s3_voice(codecrt, m)
        for k in kinds:
            gpu.set_recreate_policy(k, True)
        a = gpu.decode([tokens], voice=v, seed=6)
        gpu.decode([tokens[:40]], voice=v, seed=6)  # other shapes: every kind released and recreated
        b = gpu.decode([tokens], voice=v, seed=6)
        st = gpu.stats
        print(f"\nS3Gen seed check on CUDA: identical={np.array_equal(a, b)} rms={np.sqrt(np.mean(a ** 2)):.3g} "
              f"recreations={st.sched_recreations} compute buffers={st.compute_buffer_bytes[0] / 2**20:.0f} MiB")
        assert np.array_equal(a, b)
        assert float(np.sqrt(np.mean(a[960:] ** 2))) > 1e-3
        assert st.sched_recreations >= 2 * len(kinds)


def test_s3gen_stream_on_gpu_matches_cpu_stream(codecrt, s3gen_gguf):
    tokens = np.random.default_rng(7).integers(0, 6561, 60).astype(np.int32)
    out = []
    with codecrt.Model(s3gen_gguf) as m:
        v = _s3_voice(codecrt, m, n=20)
        for dev in ("cpu", GPU):
            with codecrt.Context(m, device=dev) as ctx:
                fs = codecrt.FlowStream(ctx, v, seed=8, first_chunk=10, chunk=20)
                fs.push(tokens)
                fs.finish()
                out.append(fs.decode_all())
    e = rel_l2(out[1], out[0])
    print(f"\nS3Gen stream CUDA vs CPU rel L2 {e:.2e}")
    assert out[0].shape == out[1].shape == (60 * 960,)
    assert e < 5 * S3_TOL
