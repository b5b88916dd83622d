"""DAC decoded and streamed by codecrt equals descript-audio-codec (seeded random weights, our converter).

The reference (tests/references/dac.py) is ``dac.DAC`` with perturbed random weights, saved
as descript and IBM release it (``weights.pth``: state dict with weight_g/weight_v, config
in ``metadata["kwargs"]``) and converted by ``codecd.convert`` from that file alone. The
tiny config has the 24 kHz layout (strides 8, 5, 4, 2, including the odd stride that
loses a sample); the released 24 kHz and 44.1 kHz sizes run once each (slow).

DAC yields ``hop T - 8`` samples for the stride-5 models; codecrt promises ``hop T`` and
appends zeros (native/src/dac/dac.h), so the reference is compared with the first
samples and the rest must be silence.
"""

from __future__ import annotations

import numpy as np
import pytest

from codeckit import case_cache, ops_env, rel_l2, runtime_env
from conftest import assert_stream_equals_offline, bf16_or_skip

F32_TOL = 1e-4

pytest.importorskip("torch")
pytest.importorskip("dac")
ref = pytest.importorskip("references.dac")


def levels(codes: np.ndarray) -> list[np.ndarray]:
    """[n_q, T] or [B, n_q, T] reference codes -> codecrt's per-codebook list."""
    return [np.ascontiguousarray(codes[..., q, :]) for q in range(codes.shape[-2])]


class Case:
    """A seeded reference saved in the released layout and converted (f32) from the .pth alone."""

    def __init__(self, root, name: str, seed: int = 3):
        from codecd.convert import convert

        self.config = ref.CONFIGS[name]
        self.model = ref.build_reference(self.config, seed)
        self.path = ref.save_released_layout(self.model, root / name)
        self.gguf = convert(self.path, root / f"{name}.gguf", progress=False)
        self.hop = ref.hop_length(self.config)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    with case_cache(tmp_path_factory, "dac", Case) as get:
        yield get


def check_against_reference(got: np.ndarray, want: np.ndarray, n_frames: int, hop: int) -> float:
    """Shapes, the appended silence, and the relative L2 error of DAC's own samples."""
    n = want.shape[-1]
    assert got.shape[-1] == n_frames * hop and got.shape[:-1] == want.shape[:-1]
    assert not np.any(got[..., n:]), "the samples DAC does not produce are silence"
    return rel_l2(got[..., :n], want)


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
def test_parity_tiny(codecrt, cases, ops, record_property):
    """Batch 2 of 37 frames with the fused CPU kernels and with the portable graphs that GPUs run,
    composed from ggml's ops and on codecrt's device ops (dac.h, dac_conv_dev): relative L2 error
    against dac itself at most 1e-4."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, 37, np.random.default_rng(1), batch=2)
    want = ref.reference_decode(case.model, codes)
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as ctx:
        got = ctx.decode(levels(codes))
    err = check_against_reference(got, want, 37, case.hop)
    record_property("rel_l2", err)
    print(f"\nDAC tiny ({ops} ops): relative L2 {err:.2e}")
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["24khz", "44khz"])
def test_parity_released_sizes(codecrt, cases, name, record_property):
    """The released 24 kHz (32 codebooks) and 44.1 kHz (9) models: 1 s of random codes, relative
    L2 error at most 1e-4."""
    case = cases(name)
    n = case.config["sample_rate"] // case.hop + 1
    codes = ref.random_codes(case.config, n, np.random.default_rng(2))
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        got = ctx.decode(levels(codes))
    assert got.shape == (n * case.hop,)
    k = want.shape[-1]
    assert not np.any(got[k:])
    err = rel_l2(got[:k], want)
    record_property("rel_l2", err)
    print(f"\nDAC {name}: {n} frames, relative L2 {err:.2e}")
    assert err <= F32_TOL


@pytest.mark.parametrize("n_frames", [1, 2, 3, 11])
def test_short_utterances(codecrt, cases, n_frames):
    """Decodes shorter than the receptive field (every layer's zero padding reaches every sample)."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, n_frames, np.random.default_rng(n_frames))
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        got = ctx.decode(levels(codes))
    assert check_against_reference(got, want, n_frames, case.hop) <= F32_TOL


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
def test_frame_buckets_mask_padding(codecrt, cases, ops):
    """Frame and batch buckets: 37 and 5 frames decoded in graphs of 48 and 16 with their padding
    masked at each point's own valid length (the odd stride's lost sample included) equal the
    exact-shape decode."""
    case = cases("tiny")
    rng = np.random.default_rng(3)
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as exact, \
            codecrt.Context(m, device="cpu", frame_bucket=16, batch_bucket=True) as bucketed:
        for b, t in ((3, 37), (1, 5)):
            lv = [rng.integers(0, 1024, (b, t)).astype(np.int32) for _ in range(4)]
            a, c = exact.decode(lv), bucketed.decode(lv)
            assert a.shape == c.shape
            assert rel_l2(c, a) <= 2e-6
            assert not np.any(c[..., 320 * t - 8:])


def test_long_decode_in_pieces(codecrt, cases):
    """Under a small piece budget a decode runs in pieces with decode_context_frames of context
    each side (the receptive field, 10 frames, plus two): equal to the one-graph decode."""
    case = cases("tiny")
    rng = np.random.default_rng(6)
    lv = [rng.integers(0, 1024, (2, 150)).astype(np.int32) for _ in range(4)]
    with codecrt.Model(str(case.gguf)) as m:
        with codecrt.Context(m, device="cpu") as ctx:
            whole = ctx.decode(lv)
        with runtime_env(CODECRT_PIECE_ELEMENTS=str(2**19)), codecrt.Context(m, device="cpu") as ctx:
            pieces = ctx.decode(lv)
            stats = ctx.stats
    assert pieces.shape == whole.shape
    assert stats.computes >= 3, "the budget splits the decode"
    assert np.abs(pieces - whole).max() <= 1e-6


def test_model_info(codecrt, cases):
    case = cases("tiny")
    with codecrt.Model(str(case.gguf)) as m:
        info = m.info
    assert (info.arch, info.sample_rate, info.hop_length, info.n_levels) == ("dac", 24000, 320, 4)
    assert info.codebook_sizes == (1024,) * 4 and info.level_strides == (1,) * 4 and info.frame_multiple == 1


def test_code_range(codecrt, cases):
    case = cases("tiny")
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        with pytest.raises(codecrt.CodeRangeError, match="outside"):
            ctx.decode([np.array([1, 1024], np.int32)] + [np.zeros(2, np.int32)] * 3)


# ------------------------------------------------------------------ streaming


def run_stream(ctx, lv: list[np.ndarray], cuts: list[int]) -> tuple[np.ndarray, object]:
    s = ctx.stream()
    out = []
    for a, b in zip(cuts, cuts[1:]):
        s.push([x[a:b] for x in lv])
        s.decode_ready()
        out.append(s.pull())
    s.finish()
    s.decode_ready()
    out.append(s.pull())
    assert s.done
    info = s.info
    s.close()
    return np.concatenate(out), info


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_stream_equals_offline(codecrt, cases, chunk, ops):
    """Codes pushed in random pieces, ticks of 1, 3 and 8 frames: the stream gives the offline
    samples (bit-identical with the fused AVX-512 products, else f32 noise: conftest's
    fused_cpu_products; f32 noise with the portable graphs),
    n_frames * hop of them, after a latency of the right receptive field (3,141 samples)."""
    case = cases("tiny")
    rng = np.random.default_rng(10 + chunk)
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu", stream_chunk_frames=chunk) as ctx:
        for n in (1, 7, 40):
            lv = [rng.integers(0, 1024, n).astype(np.int32) for _ in range(4)]
            want = ctx.decode(lv)
            cuts = sorted(set(int(c) for c in rng.integers(0, n, 5)) | {0, n})
            got, info = run_stream(ctx, lv, cuts)
            assert len(got) == len(want) == n * case.hop == info.total_samples
            assert info.latency_samples == 3141
            if ops == "cpu":
                assert_stream_equals_offline(got, want, f"{n} frames")
            else:
                err = float(np.abs(got - want).max())
                assert err < 1e-6, f"{n} frames: max |diff| {err:.1e}"


def test_stream_batched_with_joins_and_leaves(codecrt, cases):
    """Streams stepped together in one graph, joining and leaving at different ticks, each equal
    its own offline decode."""
    case = cases("tiny")
    rng = np.random.default_rng(4)
    with codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu", batch_bucket=True, max_batch=8, max_streams=8,
                            stream_chunk_frames=2) as ctx:
        utter = [[rng.integers(0, 1024, f).astype(np.int32) for _ in range(4)] for f in (8, 27, 3, 30, 16)]
        want = [ctx.decode(u) for u in utter]
        live: dict[int, object] = {}
        got: dict[int, list[np.ndarray]] = {i: [] for i in range(len(utter))}
        fed = dict.fromkeys(range(len(utter)), 0)
        for tick in range(80):
            if tick < len(utter) * 2 and tick % 2 == 0:
                live[tick // 2] = ctx.stream()
            for i, s in live.items():
                n = len(utter[i][0])
                if fed[i] < n:
                    a, b = fed[i], min(n, fed[i] + 1 + i % 3)
                    s.push([x[a:b] for x in utter[i]])
                    fed[i] = b
                    if b == n:
                        s.finish()
            ctx.step(list(live.values()))
            for i, s in list(live.items()):
                got[i].append(s.pull())
                if s.done:
                    s.close()
                    del live[i]
        assert not live
    for i, w in enumerate(want):
        g = np.concatenate(got[i])
        assert len(g) == len(w)
        assert np.abs(g - w).max() == 0.0, f"stream {i}"


# ------------------------------------------------------------------ converter


def _checkpoint(case: Case) -> tuple[dict, dict]:
    import torch

    obj = torch.load(case.path, map_location="cpu", weights_only=True)
    return dict(obj["state_dict"]), dict(obj["metadata"]["kwargs"])


def test_converter_detects_dac_not_snac(cases):
    """DAC and SNAC share the quantizer keys: the state dict alone detects DAC, never SNAC."""
    from codecd.convert import ARCHITECTURES

    sd, kwargs = _checkpoint(cases("tiny"))
    found = [a.name for a in ARCHITECTURES.values() if a.detect(None, sd.keys())]
    assert found == ["dac"]
    found = [a.name for a in ARCHITECTURES.values() if a.detect(kwargs, sd.keys())]
    assert found == ["dac"]


def test_converter_checks_config_against_weights(cases, tmp_path):
    """kwargs that do not describe the weights are an error, not a wrong model."""
    from codecd.convert import ConversionError
    from codecd.convert.dac import convert_dac_state_dict

    sd, kwargs = _checkpoint(cases("tiny"))
    with pytest.raises(ConversionError, match="more quantizers"):
        convert_dac_state_dict(sd, dict(kwargs, n_codebooks=2), tmp_path / "x.gguf")
    with pytest.raises(ConversionError, match="does not match the config"):
        convert_dac_state_dict(sd, dict(kwargs, decoder_dim=64), tmp_path / "x.gguf")
    with pytest.raises(ConversionError, match="unknown key"):
        convert_dac_state_dict(sd, dict(kwargs, attn_window_size=32), tmp_path / "x.gguf")
    sd["decoder.model.1.block.5.alpha"] = sd["decoder.model.1.block.0.alpha"]
    with pytest.raises(ConversionError, match="more layers"):
        convert_dac_state_dict(sd, kwargs, tmp_path / "x.gguf")


def test_f16_weights(codecrt, cases, tmp_path):
    """--dtype f16 (the large matrices in half precision): relative L2 error at most 1e-2."""
    from codecd.convert import convert

    case = cases("tiny")
    path = convert(case.path, tmp_path / "f16.gguf", dtype="f16", progress=False)
    codes = ref.random_codes(case.config, 20, np.random.default_rng(4))
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu") as ctx:
        assert m.info.weight_type == "f16"
        got = ctx.decode(levels(codes))
    assert check_against_reference(got, want, 20, case.hop) <= 1e-2


# ------------------------------------------------------------------ BF16 products


BF16_TOL = 3e-2
# (lower, upper) bounds per opt-in precision, as tests/codecs/test_wavtokenizer.py's
BOUNDS = {"bf16": (F32_TOL, BF16_TOL), "bf16x3": (1e-6, F32_TOL)}


@pytest.mark.parametrize("precision", list(BOUNDS))
def test_bf16_products(codecrt, cases, precision):
    """precision="bf16" or "bf16x3" (opt-in, AVX512-BF16 CPUs): the convolutions, 1x1 convs
    and transposed convs as BF16 products summed in F32 (BF16x3: three of split operands) stay
    within the precision's BOUNDS of dac itself; its streams equal its offline decode."""
    case = cases("tiny")
    bf16_or_skip(codecrt, case.gguf)
    codes = ref.random_codes(case.config, 37, np.random.default_rng(8), batch=2)
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu", precision=precision, stream_chunk_frames=3) as ctx:
        got = ctx.decode(levels(codes))
        lv = levels(codes[0])
        streamed, _ = run_stream(ctx, lv, [0, 5, 6, 30, 37])
        offline = ctx.decode(lv)
    err = check_against_reference(got, want, 37, case.hop)
    print(f"\nDAC tiny, {precision} products: relative L2 {err:.2e}")
    lo, hi = BOUNDS[precision]
    assert lo < err < hi
    assert np.abs(streamed - offline).max() < 1e-6


def test_gpu_launch_limits_hold_for_long_decodes(codecrt, cases):
    """The portable graphs (what GPUs run) checked by the shape guard with CUDA's launch-grid
    rules (CODECRT_GUARD_GRID=65535) on the CPU: 300 frames (96,000 samples per sequence,
    past 65,535) decode, as do streams, with nothing refused; equal to the plain decode."""
    case = cases("tiny")
    rng = np.random.default_rng(12)
    lv = [rng.integers(0, 1024, (2, 300)).astype(np.int32) for _ in range(4)]
    with codecrt.Model(str(case.gguf)) as m:
        with codecrt.Context(m, device="cpu") as ctx:
            want = ctx.decode(lv)
        with runtime_env(CODECRT_PORTABLE_OPS="1", CODECRT_GUARD_GRID="65535"), \
                codecrt.Context(m, device="cpu", stream_chunk_frames=8) as ctx:
            got = ctx.decode(lv)
            streamed, _ = run_stream(ctx, [x[0] for x in lv], [0, 100, 300])
    assert rel_l2(got, want) <= 1e-5
    assert np.abs(streamed - want[0]).max() < 1e-5


def test_conv_taps_decode_as_im2col(codecrt, cases):
    """The portable graphs' two ways to run a full conv (cr_conv1d): ggml's im2col and a product
    (the default off the CPU) and CODECRT_CONV=taps, one product with the 7 taps side by side
    and its shifted views summed. Offline and streamed, the same samples to f32 rounding."""
    case = cases("tiny")
    rng = np.random.default_rng(13)
    lv = [rng.integers(0, 1024, (2, 60)).astype(np.int32) for _ in range(4)]
    out = {}
    with codecrt.Model(str(case.gguf)) as m:
        for conv in ("im2col", "taps"):
            with runtime_env(CODECRT_PORTABLE_OPS="1", CODECRT_CONV=conv), \
                    codecrt.Context(m, device="cpu", stream_chunk_frames=4) as ctx:
                out[conv] = ctx.decode(lv), run_stream(ctx, [x[0] for x in lv], [0, 7, 33, 60])[0]
    (im2col, _), (taps, taps_streamed) = out["im2col"], out["taps"]
    assert rel_l2(taps, im2col) <= 1e-5
    assert np.abs(taps_streamed - taps[0]).max() < 1e-5


def test_device_ops_graphs_are_other_graphs(codecrt, cases):
    """The portable graphs on codecrt's device ops with the convs on the columns op
    (CODECRT_FUSED_UNIT=1 CODECRT_CONV=cols: the Snakes gathered through it, its products, biases
    with the residual; what a CUDA context runs with CODECRT_CONV=cols) are other graphs than the composed ones (no transposes, no column matrix by im2col: another
    compute buffer), and decode the same samples to f32 rounding, offline and streamed."""
    case = cases("tiny")
    rng = np.random.default_rng(14)
    lv = [rng.integers(0, 1024, (2, 45)).astype(np.int32) for _ in range(4)]
    out, buffers = {}, {}
    with codecrt.Model(str(case.gguf)) as m:
        for ops in ("portable", "device-ops"):
            with runtime_env(**ops_env(ops)), codecrt.Context(m, device="cpu", stream_chunk_frames=4) as ctx:
                out[ops] = ctx.decode(lv), run_stream(ctx, [x[0] for x in lv], [0, 9, 30, 45])[0]
                buffers[ops] = ctx.stats.compute_buffer_bytes
    (composed, _), (dev, dev_streamed) = out["portable"], out["device-ops"]
    assert buffers["portable"] != buffers["device-ops"]
    assert rel_l2(dev, composed) <= 1e-5
    assert np.abs(dev_streamed - dev[0]).max() < 1e-5
