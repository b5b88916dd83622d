"""The SNAC converter against docs/gguf-format.md and against snac itself."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import reference

CONFIG_NAMES = list(reference.CONFIGS)


def doc_tensor_table(cfg: dict, mat: str = "F32") -> dict[str, tuple[list[int], str]]:
    """The doc's tensor table for a config: name -> (ggml shape, type)."""
    L = cfg.get("latent_dim") or cfg["encoder_dim"] * 2 ** len(cfg["encoder_rates"])
    D, H, N = cfg["decoder_dim"], cfg["codebook_dim"], cfg["codebook_size"]
    rates = cfg["decoder_rates"]
    n = len(rates)
    C = [D // 2 ** i for i in range(n + 1)]
    t: dict[str, tuple[list[int], str]] = {}
    for l in range(len(cfg["vq_strides"])):
        t[f"quantizer.{l}.codebook"] = ([H, N], "F32")
        t[f"quantizer.{l}.out_proj.weight"] = ([H, L], "F32")
        t[f"quantizer.{l}.out_proj.bias"] = ([L], "F32")
    t["decoder.in_dw.weight"] = ([L, 7], "F32")
    t["decoder.in_dw.bias"] = ([L], "F32")
    t["decoder.in_pw.weight"] = ([L, D], mat)
    t["decoder.in_pw.bias"] = ([D], "F32")
    if cfg.get("attn_window_size"):
        t["decoder.attn.norm.weight"] = ([D], "F32")
        t["decoder.attn.norm.bias"] = ([D], "F32")
        t["decoder.attn.qkv.weight"] = ([D, 3 * D], mat)
        t["decoder.attn.out.weight"] = ([D, D], mat)
    for i, s in enumerate(rates):
        b = f"decoder.block.{i}"
        ci, co = C[i], C[i + 1]
        t[f"{b}.snake.alpha"] = ([ci], "F32")
        t[f"{b}.snake.inv_alpha"] = ([ci], "F32")
        t[f"{b}.up.weight"] = ([ci, 2 * s * co], mat)
        t[f"{b}.up.bias"] = ([co], "F32")
        if cfg["noise"]:
            t[f"{b}.noise.weight"] = ([co, co], mat)
        for j in range(3):
            r = f"{b}.res.{j}"
            for sn in ("snake1", "snake2"):
                t[f"{r}.{sn}.alpha"] = ([co], "F32")
                t[f"{r}.{sn}.inv_alpha"] = ([co], "F32")
            t[f"{r}.dw.weight"] = ([co, 7], "F32")
            t[f"{r}.dw.bias"] = ([co], "F32")
            t[f"{r}.pw.weight"] = ([co, co], mat)
            t[f"{r}.pw.bias"] = ([co], "F32")
    t["decoder.out_snake.alpha"] = ([C[n]], "F32")
    t["decoder.out_snake.inv_alpha"] = ([C[n]], "F32")
    t["decoder.out.weight"] = ([C[n], 7], mat)
    t["decoder.out.bias"] = ([1], "F32")
    return t


def folded_model(model, cfg: dict):
    """A fresh copy of a snac model with every weight-norm parametrization removed by torch itself.

    (Not ``copy.deepcopy``: the copy would share parametrize's injected classes,
    and removing the parametrization from the copy would break the original.)
    """
    from snac import SNAC
    from torch.nn.utils import parametrize

    m = SNAC(**cfg)
    m.load_state_dict(model.state_dict())
    m.eval()
    for mod in m.modules():
        if parametrize.is_parametrized(mod, "weight"):
            parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)
    return m


def doc_expected_values(model, cfg: dict) -> dict[str, np.ndarray]:
    """Every doc tensor computed from the torch modules (folded by torch), in numpy order."""
    m = folded_model(model, cfg)
    def g(t):
        return t.detach().float().numpy()

    out: dict[str, np.ndarray] = {}
    for l, q in enumerate(m.quantizer.quantizers):
        out[f"quantizer.{l}.codebook"] = g(q.codebook.weight)
        out[f"quantizer.{l}.out_proj.weight"] = g(q.out_proj.weight)[:, :, 0]
        out[f"quantizer.{l}.out_proj.bias"] = g(q.out_proj.bias)
    seq = list(m.decoder.model)
    out["decoder.in_dw.weight"] = g(seq[0].weight)[:, 0, :].T
    out["decoder.in_dw.bias"] = g(seq[0].bias)
    out["decoder.in_pw.weight"] = g(seq[1].weight)[:, :, 0]
    out["decoder.in_pw.bias"] = g(seq[1].bias)
    k = 2
    if cfg.get("attn_window_size"):
        a = seq[2]
        out["decoder.attn.norm.weight"] = g(a.norm.weight)
        out["decoder.attn.norm.bias"] = g(a.norm.bias)
        out["decoder.attn.qkv.weight"] = g(a.to_qkv.weight)
        out["decoder.attn.out.weight"] = g(a.to_out.weight)
        k = 3

    def snake(name, mod):
        alpha = g(mod.alpha).reshape(-1)
        out[f"{name}.alpha"] = alpha
        out[f"{name}.inv_alpha"] = g((mod.alpha + 1e-9).reciprocal()).reshape(-1)

    for i in range(len(cfg["decoder_rates"])):
        blk = list(seq[k + i].block)
        b = f"decoder.block.{i}"
        snake(f"{b}.snake", blk[0])
        w = g(blk[1].weight)                       # (Cin, Cout, K)
        out[f"{b}.up.weight"] = w.transpose(2, 1, 0).reshape(-1, w.shape[0])
        out[f"{b}.up.bias"] = g(blk[1].bias)
        res = blk[2:]
        if cfg["noise"]:
            out[f"{b}.noise.weight"] = g(blk[2].linear.weight)[:, :, 0]
            res = blk[3:]
        for j, ru in enumerate(res):
            r = f"{b}.res.{j}"
            u = list(ru.block)
            snake(f"{r}.snake1", u[0])
            out[f"{r}.dw.weight"] = g(u[1].weight)[:, 0, :].T
            out[f"{r}.dw.bias"] = g(u[1].bias)
            snake(f"{r}.snake2", u[2])
            out[f"{r}.pw.weight"] = g(u[3].weight)[:, :, 0]
            out[f"{r}.pw.bias"] = g(u[3].bias)
    n = len(cfg["decoder_rates"])
    snake("decoder.out_snake", seq[k + n])
    w = g(seq[k + n + 1].weight)                   # (1, C, 7)
    out["decoder.out.weight"] = w.transpose(2, 0, 1).reshape(7, -1)
    out["decoder.out.bias"] = g(seq[k + n + 1].bias)
    return out


# ----------------------------------------------------------------- the file


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_tensor_set_shapes_and_types(snac_cases, name):
    """The converter writes exactly the doc's tensor set, with the doc's ggml shapes and types."""
    case = snac_cases(name)
    _, _, meta = case.read
    expected = doc_tensor_table(case.config)
    assert set(meta) == set(expected), (set(meta) ^ set(expected))
    for k, (shape, typ) in expected.items():
        assert meta[k] == (shape, typ), (k, meta[k], (shape, typ))


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_hyperparameters(snac_cases, name):
    """Every hyperparameter key of the doc is present with the right GGUF type and value."""
    import gguf

    case = snac_cases(name)
    cfg = case.config
    r = gguf.GGUFReader(str(case.gguf))
    VT = gguf.GGUFValueType
    f = r.fields
    expect = {
        "general.architecture": (VT.STRING, "snac"),
        "general.name": (VT.STRING, f"snac_{cfg['sampling_rate'] // 1000}khz"),
        "codecd.format_version": (VT.UINT32, 1),
        "snac.sampling_rate": (VT.UINT32, cfg["sampling_rate"]),
        "snac.hop_length": (VT.UINT32, math.prod(cfg["decoder_rates"])),
        "snac.latent_dim": (VT.UINT32, cfg["encoder_dim"] * 16),
        "snac.decoder_dim": (VT.UINT32, cfg["decoder_dim"]),
        "snac.decoder_rates": (VT.ARRAY, cfg["decoder_rates"]),
        "snac.attn_window_size": (VT.UINT32, cfg["attn_window_size"] or 0),
        "snac.codebook_size": (VT.UINT32, 4096),
        "snac.codebook_dim": (VT.UINT32, 8),
        "snac.vq_strides": (VT.ARRAY, cfg["vq_strides"]),
        "snac.noise": (VT.BOOL, True),
        "snac.depthwise": (VT.BOOL, True),
    }
    for key, (vt, val) in expect.items():
        assert f[key].types[0] == vt, key
        if vt == VT.ARRAY:
            assert f[key].types[1] == VT.INT32, key
        assert f[key].contents() == val, key
    assert f["codecd.source"].contents() == str(case.folder.resolve())
    user_keys = {k for k in f if not k.startswith("GGUF.")}
    assert user_keys == set(expect) | {"codecd.source"}


@pytest.mark.parametrize("name", ["24khz", "32khz"])
def test_every_tensor_value_matches_torch(snac_cases, name):
    """Each written tensor equals the doc's mapping of the torch module, folded by torch's remove_parametrizations."""
    case = snac_cases(name)
    _, tensors, _ = case.read
    exp = doc_expected_values(case.model, case.config)
    assert set(exp) == set(tensors)
    worst = 0.0
    for k, v in exp.items():
        assert tensors[k].shape == v.shape, k
        d = float(np.max(np.abs(tensors[k] - v)))
        worst = max(worst, d / max(float(np.max(np.abs(v))), 1e-12))
        np.testing.assert_allclose(tensors[k], v, rtol=2e-6, atol=1e-7, err_msg=k)
    print(f"{name}: max relative |converter - torch| over all tensors = {worst:.3g}")


def test_inv_alpha_bit_exact(snac_cases):
    """inv_alpha is 1 / (alpha + 1e-9) computed in float32, bit-identical to torch."""
    case = snac_cases("24khz")
    _, tensors, _ = case.read
    exp = doc_expected_values(case.model, case.config)
    for k in exp:
        if k.endswith("inv_alpha"):
            assert np.array_equal(tensors[k], exp[k]), k


def test_fold_weight_norm_matches_torch():
    """fold_weight_norm equals torch's own weight norm for Conv1d and ConvTranspose1d shapes."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import weight_norm

    from codecd.convert.common import fold_weight_norm

    torch.manual_seed(0)
    worst = 0.0
    for mod in (torch.nn.Conv1d(64, 64, 7, groups=64), torch.nn.Conv1d(32, 48, 1),
                torch.nn.ConvTranspose1d(64, 32, 16, stride=8), torch.nn.Conv1d(16, 1, 7)):
        wn = weight_norm(mod)
        with torch.no_grad():
            wn.parametrizations.weight.original0.mul_(torch.rand_like(wn.parametrizations.weight.original0) + 0.5)
        g = wn.parametrizations.weight.original0.detach().numpy()
        v = wn.parametrizations.weight.original1.detach().numpy()
        parametrize.remove_parametrizations(wn, "weight", leave_parametrized=True)
        ref = wn.weight.detach().numpy()
        ours = fold_weight_norm(g, v)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        worst = max(worst, float(np.max(np.abs(ours - ref))))
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)
    print(f"max |fold_weight_norm - torch remove_parametrizations| = {worst:.3g}")


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_numpy_decode_of_gguf_matches_snac(snac_cases, name):
    """A numpy decoder written from the doc, reading only the GGUF, reproduces snac's noise-free decode."""
    case = snac_cases(name)
    rng = np.random.default_rng(5)
    codes = reference.random_codes(case.config, reference.frame_multiple(case.config) * 2, None, rng)
    ref = reference.reference_decode(case.model, codes)
    ours = reference.numpy_decode_gguf(case.gguf, codes)
    assert ours.shape == ref.shape == (reference.frame_multiple(case.config) * 2
                                       * math.prod(case.config["decoder_rates"]),)
    assert float(np.std(ref)) > 1e-2, "reference output is degenerate"
    diff = float(np.max(np.abs(ours - ref)))
    print(f"{name}: max |numpy(GGUF) - snac| = {diff:.3g}")
    assert diff < 2e-5


# ------------------------------------------------------------ options, layouts


def test_f16_option(snac_cases, tmp_path):
    """--dtype f16 stores exactly the doc's "mat" tensors as F16 (rounded from f32), all others as F32."""
    from codecd.convert import convert

    case = snac_cases("32khz")
    out = convert(case.folder, tmp_path / "m16.gguf", dtype="f16", progress=False)
    _, t16, meta16 = reference.read_gguf(out)
    _, t32, _ = case.read
    expected = doc_tensor_table(case.config, mat="F16")
    assert {k: v for k, v in meta16.items()} == expected
    for k, (_, typ) in expected.items():
        if typ == "F16":
            assert np.array_equal(t16[k], t32[k].astype(np.float16).astype(np.float32)), k
        else:
            assert np.array_equal(t16[k], t32[k]), k
    assert out.stat().st_size < case.gguf.stat().st_size * 0.6


def test_single_file_with_config(snac_cases, tmp_path):
    """A lone state-dict file plus --config converts to the same tensors as the released folder."""
    import shutil

    from codecd.convert import convert

    case = snac_cases("24khz")
    sd_file = tmp_path / "weights.pt"
    shutil.copy(case.folder / "pytorch_model.bin", sd_file)
    cfg_file = tmp_path / "elsewhere.json"
    cfg_file.write_text(json.dumps(case.config))
    out = convert(sd_file, tmp_path / "single.gguf", config=cfg_file, progress=False)
    _, t, _ = reference.read_gguf(out)
    _, t_ref, _ = case.read
    assert set(t) == set(t_ref)
    assert all(np.array_equal(t[k], t_ref[k]) for k in t)
    # a dict config works the same
    out2 = convert(sd_file, tmp_path / "single2.gguf", config=dict(case.config), progress=False)
    assert out2.read_bytes() == out.read_bytes()


def test_single_file_without_config_is_an_error(snac_cases, tmp_path):
    """A lone state-dict file with no config beside it and no --config fails with ConversionError."""
    import shutil

    from codecd.convert import ConversionError, convert

    case = snac_cases("24khz")
    sd_file = tmp_path / "weights.bin"
    shutil.copy(case.folder / "pytorch_model.bin", sd_file)
    with pytest.raises(ConversionError, match="--config"):
        convert(sd_file, tmp_path / "x.gguf", progress=False)
    assert not (tmp_path / "x.gguf").exists()


def test_old_style_weight_norm_keys(snac_cases, tmp_path):
    """weight_g/weight_v keys (pre-parametrization torch) convert to the same tensors as the new keys."""
    from snac import SNAC

    from codecd.convert.snac import convert_snac_state_dict

    case = snac_cases("32khz")
    old = reference.to_old_weight_norm_keys(case.model.state_dict())
    assert any(k.endswith(".weight_g") for k in old) and not any("parametrizations" in k for k in old)
    # torch's compat hook accepts these keys too: they are a real checkpoint layout
    SNAC(**case.config).load_state_dict(old)
    out = convert_snac_state_dict(old, case.config, tmp_path / "old.gguf", "f32", progress=False)
    _, t, _ = reference.read_gguf(out)
    _, t_ref, _ = case.read
    assert set(t) == set(t_ref)
    for k in t:
        np.testing.assert_array_equal(t[k], t_ref[k], err_msg=k)


def test_safetensors_input(snac_cases, tmp_path):
    """A .safetensors state dict (numpy arrays, with some tensors stored as bf16/f16) converts."""
    from codecd.convert import convert
    from codecd.convert.common import read_safetensors, write_safetensors

    case = snac_cases("24khz")
    sd = {k: v.detach().numpy() for k, v in case.model.state_dict().items()}
    folder = tmp_path / "st"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(case.config))
    write_safetensors(folder / "model.safetensors", sd)
    back = read_safetensors(folder / "model.safetensors")
    assert set(back) == set(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
    out = convert(folder, tmp_path / "st.gguf", progress=False)
    _, t, _ = reference.read_gguf(out)
    _, t_ref, _ = case.read
    assert all(np.array_equal(t[k], t_ref[k]) for k in t_ref)


def test_safetensors_reader_bf16_and_errors(tmp_path):
    """The numpy safetensors reader widens BF16 to f32 and reports truncated files clearly."""
    import struct

    from codecd.convert.common import ConversionError, read_safetensors

    vals = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    bf16 = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    hdr = json.dumps({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                      "__metadata__": {"format": "pt"}}).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bf16)
    np.testing.assert_array_equal(read_safetensors(p)["a"], vals)
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bf16[:4])
    with pytest.raises(ConversionError, match="outside the file"):
        read_safetensors(p)
    p.write_bytes(b"\x01\x02")
    with pytest.raises(ConversionError, match="too short"):
        read_safetensors(p)


# ------------------------------------------------------------------- errors


def _sd(case):
    return dict(case.model.state_dict())


def test_missing_tensor_is_a_clear_error(snac_cases, tmp_path):
    """A tensor missing from the checkpoint raises ConversionError naming it; no file is left behind."""
    from codecd.convert import ConversionError
    from codecd.convert.snac import convert_snac_state_dict

    case = snac_cases("24khz")
    for key in ("decoder.model.3.block.4.block.2.alpha", "quantizer.quantizers.1.codebook.weight",
                "decoder.model.0.parametrizations.weight.original0", "decoder.model.7.bias"):
        sd = _sd(case)
        del sd[key]
        dst = tmp_path / "m.gguf"
        with pytest.raises(ConversionError) as ei:
            convert_snac_state_dict(sd, case.config, dst, "f32")
        assert key.rsplit(".parametrizations", 1)[0] in str(ei.value)
        assert not dst.exists() and not (tmp_path / "m.gguf.part").exists()


@pytest.mark.parametrize("bad, match", [
    ({"hop_size": 512}, "unknown key"),
    ({"depthwise": False}, "depthwise"),
    ({"decoder_rates": [8, 8, "4", 2]}, "decoder_rates"),
    ({"noise": 1}, "noise"),
    ({"decoder_dim": 1000}, "divisible"),
    ({"codebook_size": 0}, "codebook_size"),
    ({"decoder_dim": 512}, "does not match the config"),
    ({"vq_strides": [4, 2]}, "more quantizer levels"),
    ({"vq_strides": [8, 4, 2, 1]}, "quantizer"),
    ({"noise": False}, "noise"),
    ({"attn_window_size": 32}, "missing"),
    ({"decoder_rates": [8, 8, 2, 4]}, "does not match the config"),
])
def test_bad_config_is_a_clear_error(snac_cases, tmp_path, bad, match):
    """A config that is invalid or does not match the checkpoint raises ConversionError, never a deep traceback."""
    from codecd.convert import ConversionError
    from codecd.convert.snac import convert_snac_state_dict

    case = snac_cases("24khz")
    cfg = dict(case.config, **bad)
    with pytest.raises(ConversionError, match=match):
        convert_snac_state_dict(_sd(case), cfg, tmp_path / "m.gguf", "f32")


def test_underscore_config_keys_are_ignored(snac_cases, tmp_path):
    """Config keys starting with '_' (HF metadata such as _name_or_path) are accepted and ignored."""
    from codecd.convert.snac import convert_snac_state_dict

    case = snac_cases("24khz")
    cfg = dict(case.config, _name_or_path="hubertsiuzdak/snac_24khz")
    assert convert_snac_state_dict(_sd(case), cfg, tmp_path / "m.gguf", "f32").is_file()


def test_bad_dtype_and_paths(snac_cases, tmp_path):
    """An unknown dtype, a missing checkpoint and an empty folder raise ConversionError."""
    from codecd.convert import ConversionError, convert

    case = snac_cases("24khz")
    with pytest.raises(ConversionError, match="dtype"):
        convert(case.folder, tmp_path / "m.gguf", dtype="q8_0")
    with pytest.raises(ConversionError, match="not found"):
        convert(tmp_path / "nope", tmp_path / "m.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="no weights"):
        convert(tmp_path / "empty", tmp_path / "m.gguf")
    (tmp_path / "junk.bin").write_bytes(b"not a pickle")
    with pytest.raises(ConversionError, match="cannot load"):
        convert(tmp_path / "junk.bin", tmp_path / "m.gguf", config=case.config)


def test_non_finite_weights_are_rejected(snac_cases, tmp_path):
    """NaN weights, or values beyond the f16 range with --dtype f16, raise ConversionError."""
    import torch

    from codecd.convert import ConversionError
    from codecd.convert.snac import convert_snac_state_dict

    case = snac_cases("24khz")
    sd = _sd(case)
    sd["decoder.model.1.bias"] = torch.full_like(sd["decoder.model.1.bias"], float("nan"))
    with pytest.raises(ConversionError, match="NaN"):
        convert_snac_state_dict(sd, case.config, tmp_path / "m.gguf", "f32")
    sd = _sd(case)
    sd["decoder.model.1.parametrizations.weight.original0"] = sd[
        "decoder.model.1.parametrizations.weight.original0"] * 1e6
    with pytest.raises(ConversionError, match="f16"):
        convert_snac_state_dict(sd, case.config, tmp_path / "m.gguf", "f16")
