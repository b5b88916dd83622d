"""NeuCodec and XCodec2 decoded by codecrt equal the neucodec / xcodec2 packages (seeded random
weights perturbed from their init, saved in the released layouts, our converter).

NeuCodec: ``pytorch_model.bin`` (bare state dict, no config; decoy encoder keys); XCodec2:
``model.safetensors`` + ``config.json``. Full-size models once each (slow); small ones for the rest:
``tiny`` (4 heads of 16 channels) and ``tiny64`` (2 heads of 64, the head size of the releases, which
the CPU's fused attention kernel takes).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from codeckit import amx_host, case_cache, decode, decode_without_amx, ops_env, rel_l2, runtime_env
from conftest import bf16_or_skip

F32_TOL = 1e-4

pytest.importorskip("torch")
nc = pytest.importorskip("references.neucodec")
xc = pytest.importorskip("references.xcodec2")

#: hidden 128 in 2 heads of 64 channels, as the released models' heads
NEUCODEC_TINY64 = {"hidden_dim": 128, "depth": 2, "heads": 2, "pos_meb_dim": 64, "hop_length": 480,
                   "vq_dim": 32, "sample_rate": 24000}
CASES = {
    "neucodec-tiny": ("neucodec", nc.CONFIGS["tiny"]),
    "neucodec-tiny64": ("neucodec", NEUCODEC_TINY64),
    "neucodec-24khz": ("neucodec", nc.CONFIGS["24khz"]),
    "xcodec2-tiny": ("xcodec2", xc.CONFIGS["tiny"]),
    "xcodec2-16khz": ("xcodec2", xc.CONFIGS["16khz"]),
}


def _need(package: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} (reference) is not installed")


class Case:
    """A seeded reference decoder saved in its release's layout and converted (f32)."""

    def __init__(self, root: Path, key: str, seed: int = 5, stale_weight_norm: bool = False):
        from codecd.convert import convert

        self.arch, self.config = CASES[key]
        _need(self.arch)
        self.ref = nc if self.arch == "neucodec" else xc
        self.model = self.ref.build_reference(self.config, seed)
        self.folder = root / key
        # the releases construct 16 heads; the small models tell the converter theirs
        overrides = {} if self.config["heads"] == 16 else {"heads": self.config["heads"]}
        if self.arch == "neucodec":
            nc.save_released_layout(self.model, self.folder, stale_weight_norm=stale_weight_norm)
            self.convert_config = overrides or None
        else:
            xc.save_released_layout(self.model, self.folder)
            self.convert_config = {**json.loads((self.folder / "config.json").read_text()), **overrides}
        self.gguf = convert(self.folder, root / f"{key}.gguf", config=self.convert_config, progress=False)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    with case_cache(tmp_path_factory, "neucodec", Case) as get:
        yield get


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
@pytest.mark.parametrize("key", ["neucodec-tiny", "neucodec-tiny64", "xcodec2-tiny"])
def test_parity_small(codecrt, cases, key, ops, record_property):
    """Batch 2 of 37 frames (odd) with the fused CPU kernels and with the portable graphs that GPUs
    run: relative L2 error against the package's decode_code at most 1e-4."""
    case = cases(key)
    codes = case.ref.random_codes(case.config, 37, np.random.default_rng(1), batch=2)
    want = case.ref.reference_decode(case.model, codes)
    with runtime_env(**ops_env(ops)):
        got = decode(codecrt, case.gguf, [codes])
    assert got.shape == want.shape == (2, 37 * case.config["hop_length"])
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\n{key} ({ops} ops): relative L2 {err:.2e}")
    assert err <= F32_TOL
    assert float(np.sqrt(np.mean(want**2))) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("key", ["neucodec-24khz", "xcodec2-16khz"])
def test_parity_full(codecrt, cases, key, record_property):
    """The released sizes (16 heads of 64, 12 layers): 2 s of random codes, relative L2 at most 1e-4."""
    case = cases(key)
    codes = case.ref.random_codes(case.config, 101, np.random.default_rng(2))
    want = case.ref.reference_decode(case.model, codes)
    got = decode(codecrt, case.gguf, [codes])
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\n{key}: 101 frames, relative L2 {err:.2e}")
    assert got.shape == want.shape
    assert err <= F32_TOL


@pytest.mark.parametrize("n_frames", [1, 2, 5])
def test_short_utterances(codecrt, cases, n_frames):
    case = cases("neucodec-tiny64")
    codes = nc.random_codes(case.config, n_frames, np.random.default_rng(n_frames))
    want = nc.reference_decode(case.model, codes)
    got = decode(codecrt, case.gguf, [codes])
    assert got.shape == want.shape == (n_frames * 480,)
    assert rel_l2(got, want) <= F32_TOL


def test_fsq_extremes(codecrt, cases):
    """Codes 0 and 65535 (every FSQ digit at its ends) decode as the package does; 65536 is refused."""
    case = cases("xcodec2-tiny")
    codes = np.array([0, 65535, 65535, 0, 1, 4**7, 65534], np.int32)
    want = xc.reference_decode(case.model, codes)
    assert rel_l2(decode(codecrt, case.gguf, [codes]), want) <= F32_TOL
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        with pytest.raises(codecrt.CodeRangeError, match="outside"):
            ctx.decode([np.array([65536], np.int32)])


@pytest.mark.parametrize("ops", ["cpu", "portable", "device-ops"])
def test_frame_buckets_mask_padding(codecrt, cases, ops):
    """Frame buckets: padded frames are masked out of convolutions, GroupNorm statistics, attention
    (the fused CPU kernel has no mask: those graphs take the products) and the overlap-add."""
    case = cases("neucodec-tiny64")
    rng = np.random.default_rng(3)
    with runtime_env(**ops_env(ops)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as exact, \
            codecrt.Context(m, device="cpu", frame_bucket=16, batch_bucket=True) as bucketed:
        for shape in ((3, 37), (1, 5)):
            codes = rng.integers(0, 65536, shape).astype(np.int32)
            a, b = exact.decode([codes]), bucketed.decode([codes])
            assert rel_l2(b, a) <= 2e-6


def test_too_large_is_refused(codecrt, cases):
    """Attention over the whole utterance: a decode above the piece budget cannot be split and is
    refused with TooLargeError; shorter ones still decode on the same context."""
    case = cases("neucodec-tiny")
    with runtime_env(CODECRT_PIECE_ELEMENTS=str(2**18)), codecrt.Model(str(case.gguf)) as m, \
            codecrt.Context(m, device="cpu") as ctx:
        codes = np.zeros(300, np.int32)  # spectrum 1922 x 300, scores 4 x 300 x 300: above 2^18
        with pytest.raises(codecrt.TooLargeError, match="cannot be decoded in pieces"):
            ctx.decode([codes])
        assert ctx.decode([codes[:40]]).shape == (40 * 480,)


def test_model_info(codecrt, cases):
    with codecrt.Model(str(cases("neucodec-tiny").gguf)) as m:
        a = m.info
    with codecrt.Model(str(cases("xcodec2-tiny").gguf)) as m:
        b = m.info
    assert (a.arch, a.sample_rate, a.hop_length, a.codebook_sizes) == ("neucodec", 24000, 480, (65536,))
    assert (b.arch, b.sample_rate, b.hop_length, b.codebook_sizes) == ("xcodec2", 16000, 320, (65536,))


# ------------------------------------------------------------------ weight norm


def test_stale_weight_norm_is_ignored(codecrt, tmp_path, caplog, record_property):
    """A file with both a plain .weight and disagreeing weight_g / weight_v (as transformers' converter
    reports for the released NeuCodec) decodes as the neucodec package does, from .weight; the
    disagreement is logged."""
    from codecd.convert import convert

    _need("neucodec")
    cfg = nc.CONFIGS["tiny"]
    model = nc.build_reference(cfg, 6)
    folder = tmp_path / "stale"
    nc.save_released_layout(model, folder, stale_weight_norm=True)
    with caplog.at_level(logging.WARNING, logger="codecd.convert.neucodec"):
        gguf = convert(folder, tmp_path / "stale.gguf", config={"heads": cfg["heads"]}, progress=False)
    assert any("weight_g/weight_v that disagree" in r.getMessage() for r in caplog.records)
    codes = nc.random_codes(cfg, 23, np.random.default_rng(4))
    want = nc.reference_decode(model, codes)
    err = rel_l2(decode(codecrt, gguf, [codes]), want)
    record_property("rel_l2", err)
    assert err <= F32_TOL


def test_weight_norm_only_is_folded(codecrt, tmp_path):
    """Convs stored only as weight_g / weight_v (no plain weight) are folded to g v / ||v||."""
    import torch

    from codecd.convert.neucodec import convert_neucodec_state_dict

    _need("neucodec")
    cfg = nc.CONFIGS["tiny"]
    model = nc.build_reference(cfg, 7)
    sd = nc.released_state_dict(model)
    n = 0
    for k in list(sd):
        if k.startswith("generator.backbone.") and k.endswith(".weight") and (".conv1." in k or ".embed." in k):
            w = sd.pop(k)
            norm = w.reshape(w.shape[0], -1).norm(dim=1).reshape(-1, 1, 1)
            sd[k + "_v"] = w * 3.0
            sd[k + "_g"] = norm.clone()
            n += 1
    assert n == 5
    gguf = convert_neucodec_state_dict({k: v for k, v in sd.items()}, {"heads": cfg["heads"]},
                                       tmp_path / "wn.gguf")
    codes = nc.random_codes(cfg, 19, np.random.default_rng(5))
    with torch.inference_mode():
        want = nc.reference_decode(model, codes)
    assert rel_l2(decode(codecrt, gguf, [codes]), want) <= F32_TOL


# ------------------------------------------------------------------ converter


def test_xcodec2_needs_its_config(cases, tmp_path):
    """XCodec2's weights carry NeuCodec's keys: without config.json it would be a 24 kHz NeuCodec;
    the converter refuses (hop 320), and converts it as XCodec2 with --arch xcodec2."""
    from codecd.convert import ConversionError, convert

    case = cases("xcodec2-tiny")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes((case.folder / "model.safetensors").read_bytes())
    with pytest.raises(ConversionError, match="hop 320"):
        convert(bare, tmp_path / "x.gguf", config={"heads": 4}, progress=False)
    out = convert(bare, tmp_path / "x.gguf", config={"heads": 4}, arch="xcodec2", progress=False)
    assert out.is_file()


def test_converter_rejects_unknown_decoder_tensors(cases, tmp_path):
    from codecd.convert import ConversionError
    from codecd.convert.neucodec import convert_neucodec_state_dict

    case = cases("neucodec-tiny")
    sd = nc.released_state_dict(case.model)
    sd["generator.backbone.transformers.0.att.bias"] = sd["generator.backbone.final_layer_norm.bias"]
    with pytest.raises(ConversionError, match="does not account for"):
        convert_neucodec_state_dict(sd, {"heads": 4}, tmp_path / "x.gguf")


def test_converter_folds_fsq_projections(cases):
    """project_out and fc_post_a become one affine map: on an FSQ vector, equal to applying both."""
    from codecd.convert.common import StateDict
    from codecd.convert.neucodec import build_tensors

    case = cases("neucodec-tiny")
    sd = {k: v.numpy() for k, v in nc.released_state_dict(case.model).items()}
    out, hp = build_tensors(StateDict(sd), "neucodec", {"heads": 4}, np.float32)
    v = nc.fsq_vectors(np.array([12345]))[0].astype(np.float64)
    two = sd["fc_post_a.weight"] @ (sd["generator.quantizer.project_out.weight"] @ v
                                    + sd["generator.quantizer.project_out.bias"]) + sd["fc_post_a.bias"]
    one = out.tensors["fsq.proj.weight"] @ v + out.tensors["fsq.proj.bias"]
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
    assert hp["fsq_levels"] == [4] * 8 and hp["n_heads"] == 4 and hp["hop_length"] == 480


# ------------------------------------------------------------------ BF16 products

BF16_TOL = 3e-2  # the opt-in mode's bound against the reference (docs/runtime.md, "BF16 products")
# (lower, upper) bounds per opt-in precision, as tests/codecs/test_wavtokenizer.py's
BOUNDS = {"bf16": (F32_TOL, BF16_TOL), "bf16x3": (1e-6, F32_TOL)}


@pytest.mark.parametrize("precision", list(BOUNDS))
@pytest.mark.parametrize("key", ["neucodec-tiny64", "xcodec2-tiny"])
def test_bf16_products(codecrt, cases, key, precision, record_property):
    """precision="bf16" or "bf16x3" (opt-in, AVX512-BF16 CPUs): linear layers, convolutions and
    (64-channel heads; BF16x3's only on AMX, F32 elsewhere) attention as BF16 products summed
    in F32 stay within the precision's BOUNDS of the reference; a batch of 2 equals each
    sequence decoded alone."""
    case = cases(key)
    bf16_or_skip(codecrt, case.gguf)
    codes = case.ref.random_codes(case.config, 37, np.random.default_rng(1), batch=2)
    want = case.ref.reference_decode(case.model, codes)
    with codecrt.Model(str(case.gguf)) as m, codecrt.Context(m, device="cpu", precision=precision) as ctx:
        got = ctx.decode([codes])
        alone = ctx.decode([codes[1:]])
    err = rel_l2(got, want)
    record_property("rel_l2", err)
    print(f"\n{key}, {precision} products: relative L2 {err:.2e}")
    lo, hi = BOUNDS[precision]
    assert lo < err < hi
    assert np.array_equal(alone[0], got[1])


# the AMX decode against the AVX512-BF16 tile's, as test_wavtokenizer.py's; here BF16x3's attention
# too is split on AMX and F32 on the tile: 8.9e-6 / 8.8e-6 (NeuCodec / XCodec2 tiny) on this
# project's Xeon (2026-12-08)
AGREE = {"bf16": BF16_TOL / 3, "bf16x3": F32_TOL / 4}


@pytest.mark.parametrize("precision", list(BOUNDS))
@pytest.mark.parametrize("key", ["neucodec-tiny64", "xcodec2-tiny"])
def test_amx_matches_the_bf16_tile(codecrt, cases, key, precision, tmp_path):
    """On an AMX CPU, the products (and attention) on AMX's tiles against the AVX512-BF16
    tile's (CODECRT_NO_AMX=1, a process of its own): within AGREE, BF16x3 well inside F32's
    parity bound with its attention's products split on AMX."""
    if not amx_host():
        pytest.skip("no AMX tiles on this CPU")
    case = cases(key)
    bf16_or_skip(codecrt, case.gguf)
    codes = case.ref.random_codes(case.config, 37, np.random.default_rng(2), batch=2)
    got = decode(codecrt, case.gguf, [codes], precision=precision)
    tile = decode_without_amx(case.gguf, codes, precision, tmp_path)
    err = rel_l2(got, tile)
    print(f"\n{key}, {precision} on AMX against the AVX512-BF16 tile: relative L2 {err:.2e}")
    assert 0 < err < AGREE[precision]  # 0: the same kernels twice (AMX not taken)
