"""WavTokenizer decoded by codecrt equals OuteTTS' vendored reference (seeded random weights, our converter).

Both released layouts go through ``codecd.convert``: OuteTTS' ``decoder_model.pt`` +
``config.json`` and the original repo's Lightning checkpoint. Full-size models (75 and 40
tokens/s) once each (slow); the tiny config (same code paths) for the rest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from codeckit import amx_host, case_cache, decode, decode_without_amx, ops_env, rel_l2, runtime_env
from conftest import bf16_or_skip

F32_TOL = 1e-4

pytest.importorskip("torch")
ref = pytest.importorskip("references.wavtokenizer")


class Case:
    """A seeded reference decoder saved in a released layout and converted (f32)."""

    def __init__(self, root: Path, name: str, layout: str = "outetts", seed: int = 5):
        import importlib.util

        from codecd.convert import convert

        if importlib.util.find_spec("outetts") is None:  # its package __init__ is never imported
            pytest.skip("outetts (the vendored WavTokenizer reference) is not installed")

        self.config = ref.CONFIGS[name]
        self.model = ref.build_reference(self.config, seed)
        self.folder = root / f"{name}_{layout}"
        ref.save_released_layout(self.model, self.config, self.folder, layout=layout)
        self.gguf = convert(self.folder, root / f"{name}_{layout}.gguf", progress=False)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    with case_cache(tmp_path_factory, "wavtokenizer", Case) as get:
        yield get


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
@pytest.mark.parametrize("layout", ["outetts", "original"])
def test_parity_tiny(codecrt, cases, layout, ops, record_property):
    """Both released layouts, batch 2 of 37 frames (odd), with the fused CPU kernels and with the
    portable graphs that GPUs run: relative L2 error against the reference at most 1e-4."""
    case = cases("tiny", layout)
    codes = ref.random_codes(case.config, 37, np.random.default_rng(1), batch=2)
    want = ref.reference_decode(case.model, codes)
    with runtime_env(**ops_env(ops)):
        got = decode(codecrt, case.gguf, [codes])
    assert got.shape == want.shape == (2, 37 * ref.hop_length(case.config))
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nWavTokenizer tiny ({layout}, {ops} ops): relative L2 {err:.2e}")
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name,layout", [("75token", "outetts"), ("40token", "original")])
def test_parity_full(codecrt, cases, name, layout, record_property):
    """The released sizes: 2 s of random codes, relative L2 error at most 1e-4."""
    case = cases(name, layout)
    n = 2 * case.config["sample_rate"] // ref.hop_length(case.config) + 1
    codes = ref.random_codes(case.config, n, np.random.default_rng(2))
    want = ref.reference_decode(case.model, codes)
    got = decode(codecrt, case.gguf, [codes])
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nWavTokenizer {name} ({layout}): {n} frames, relative L2 {err:.2e}")
    assert got.shape == want.shape
    assert err <= F32_TOL


@pytest.mark.parametrize("n_frames", [1, 2, 3, 8])
def test_short_utterances(codecrt, cases, n_frames):
    """The shortest decodes (where the envelope's edges meet; one frame, where the depthwise
    convolutions see only their centre tap) match the reference."""
    case = cases("tiny")
    codes = ref.random_codes(case.config, n_frames, np.random.default_rng(n_frames))
    want = ref.reference_decode(case.model, codes)
    got = decode(codecrt, case.gguf, [codes])
    assert got.shape == want.shape == (n_frames * ref.hop_length(case.config),)
    assert rel_l2(got, want) <= F32_TOL


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
def test_frame_buckets_mask_padding(codecrt, cases, ops):
    """A context with frame buckets decodes 37 and 5 frames in graphs of 48 and 16 (padded frames
    masked out of the convolutions, GroupNorm statistics, attention and overlap-add): equal to the
    exact-shape decode up to float rounding."""
    case = cases("tiny")
    rng = np.random.default_rng(3)
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as exact, \
            codecrt.Context(m, device="cpu", frame_bucket=16, batch_bucket=True) as bucketed:
        for shape in ((3, 37), (1, 5)):
            codes = rng.integers(0, 4096, shape).astype(np.int32)
            a, b = exact.decode([codes]), bucketed.decode([codes])
            assert a.shape == b.shape
            assert rel_l2(b, a) <= 2e-6


def test_f16_weights(codecrt, cases, tmp_path):
    """--dtype f16 (large matrices in half precision): relative L2 error at most 1e-2."""
    from codecd.convert import convert

    case = cases("tiny")
    path = convert(case.folder, tmp_path / "f16.gguf", dtype="f16", progress=False)
    codes = ref.random_codes(case.config, 20, np.random.default_rng(4))
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(path)) as m:
        assert m.info.weight_type == "f16"
    err = rel_l2(decode(codecrt, path, [codes]), want)
    assert err <= 1e-2


def test_too_large_is_refused(codecrt, cases):
    """Attention over the whole utterance cannot be split: a decode whose graph passes the piece
    budget is refused with TooLargeError naming the reason; shorter ones still decode."""
    case = cases("tiny")
    with runtime_env(CODECRT_PIECE_ELEMENTS=str(2**18)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as ctx:
        long = np.zeros(200, np.int32)
        with pytest.raises(codecrt.TooLargeError, match="cannot be decoded in pieces"):
            ctx.decode([long])
        assert ctx.decode([long[:50]]).shape == (50 * m.info.hop_length,)


def test_model_info(codecrt, cases):
    case = cases("tiny")
    with codecrt.Model(str(case.gguf)) as m:
        info = m.info
    assert (info.arch, info.sample_rate, info.hop_length, info.n_levels) == ("wavtokenizer", 24000, 40, 1)
    assert info.codebook_sizes == (4096,) and info.frame_multiple == 1


def test_code_range(codecrt, cases):
    """Codes 4096..4099 exist as OuteTTS tokens but not in the codebook: CodeRangeError."""
    case = cases("tiny")
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        with pytest.raises(codecrt.CodeRangeError, match="outside"):
            ctx.decode([np.array([1, 4096], np.int32)])


# ------------------------------------------------------------------ converter


def _state_dict(case: Case) -> dict:
    import torch

    return dict(torch.load(case.folder / "decoder_model.pt", weights_only=True)["model_state_dict"])


def test_converter_checks_config_against_weights(cases, tmp_path):
    """A config.json whose backbone does not match the weights is an error, not a wrong model."""
    from codecd.convert import ConversionError, convert

    case = cases("tiny")
    cfg = ref.outetts_config_json(case.config)
    cfg["backbone_config"]["num_layers"] = 3
    with pytest.raises(ConversionError, match="num_layers"):
        convert(case.folder, tmp_path / "x.gguf", config=cfg, progress=False)


def test_converter_rejects_unknown_decoder_tensors(cases, tmp_path):
    from codecd.convert import ConversionError
    from codecd.convert.wavtokenizer import convert_wavtokenizer_state_dict

    case = cases("tiny")
    sd = _state_dict(case)
    sd["backbone.pos_net.2.extra.weight"] = sd["backbone.pos_net.2.q.weight"]
    with pytest.raises(ConversionError, match="does not account for"):
        convert_wavtokenizer_state_dict(sd, None, tmp_path / "x.gguf")
    sd = _state_dict(case)
    del sd["codebook_weights"]
    with pytest.raises(ConversionError, match="no codebook"):
        convert_wavtokenizer_state_dict(sd, None, tmp_path / "x.gguf")


def test_converter_folds_adanorm_row_zero(cases):
    """AdaLayerNorm becomes the affine of bandwidth 0 (the reference's rows differ)."""
    from codecd.convert.common import StateDict
    from codecd.convert.wavtokenizer import build_tensors

    case = cases("tiny")
    sd = _state_dict(case)
    out, hp = build_tensors(StateDict(sd), None, np.float32)
    scale = sd["backbone.convnext.1.norm.scale.weight"].numpy()
    assert not np.allclose(scale[0], scale[1])
    np.testing.assert_array_equal(out.tensors["convnext.1.norm.weight"], scale[0])
    assert hp["hop_length"] == 40 and hp["n_fft"] == 160 and hp["n_layers"] == 2


# ------------------------------------------------------------------ BF16 products

BF16_TOL = 3e-2  # the opt-in mode's bound against the reference (docs/runtime.md, "BF16 products")
# (lower, upper) bounds of the relative L2 to the reference per opt-in precision: BF16 is not
# F32-close (the mode is really on); BF16x3 keeps F32's parity bound but is not F32's own
# 1e-7 (its split products are really on)
BOUNDS = {"bf16": (F32_TOL, BF16_TOL), "bf16x3": (1e-6, F32_TOL)}


@pytest.mark.parametrize("precision", list(BOUNDS))
def test_bf16_products(codecrt, cases, precision, record_property):
    """precision="bf16" or "bf16x3" (opt-in, AVX512-BF16 CPUs): the convolutions and linear
    layers as BF16 products summed in F32 (BF16x3: three of split operands) stay within the
    precision's BOUNDS of the reference; a batch of 2 equals each sequence decoded alone."""
    case = cases("tiny")
    bf16_or_skip(codecrt, case.gguf)
    codes = ref.random_codes(case.config, 37, np.random.default_rng(1), batch=2)
    want = ref.reference_decode(case.model, codes)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu", precision=precision) as ctx:
        got = ctx.decode([codes])
        alone = ctx.decode([codes[1:]])
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\nWavTokenizer tiny, {precision} products: relative L2 {err:.2e}")
    lo, hi = BOUNDS[precision]
    assert lo < err < hi
    assert np.array_equal(alone[0], got[1])


# the AMX decode against the AVX512-BF16 tile's: BF16 2.7e-3, BF16x3 6.5e-6 on this project's
# Xeon (2026-12-08); a BF16x3 product left out moves it to BF16's error
AGREE = {"bf16": BF16_TOL / 3, "bf16x3": F32_TOL / 4}


@pytest.mark.parametrize("precision", list(BOUNDS))
def test_amx_matches_the_bf16_tile(codecrt, cases, precision, tmp_path):
    """On an AMX CPU, the BF16 and BF16x3 products on AMX's tiles (ops_amx.c; BF16x3's three
    products per pair step) sum the same products as the AVX512-BF16 register tile
    (CODECRT_NO_AMX=1, in a process of its own: the probe runs once a process), in another
    order (and, in BF16, with the attention's operands rounded where each tile needs them):
    the two decodes agree within AGREE, BF16x3's well inside F32's parity bound."""
    if not amx_host():
        pytest.skip("no AMX tiles on this CPU")
    case = cases("tiny")
    bf16_or_skip(codecrt, case.gguf)
    codes = ref.random_codes(case.config, 37, np.random.default_rng(2), batch=2)
    got = decode(codecrt, case.gguf, [codes], precision=precision)
    tile = decode_without_amx(case.gguf, codes, precision, tmp_path)
    err = rel_l2(got, tile)
    print(f"\nWavTokenizer tiny, {precision} on AMX against the AVX512-BF16 tile: relative L2 {err:.2e}")
    assert 0 < err < AGREE[precision]  # 0: the same kernel twice (AMX not taken)
