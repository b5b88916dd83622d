"""NeuCodec (neuphonic; NeuTTS) and XCodec2 (HKUST-Audio; Llasa) decoders to codecd GGUF.

Implements the ``neucodec`` / ``xcodec2`` sections of docs/gguf-format.md.
One network: ``CodecDecoderVocos`` (``generator.*``) after ``fc_post_a``
(Linear vq_dim -> hidden), at hop 480 / 24 kHz (``NeuCodec(24000, 480)``,
``neuphonic/neucodec`` ``pytorch_model.bin``, no config) or hop 320 / 16 kHz
(XCodec2, ``HKUSTAudio/xcodec2`` ``model.safetensors`` + ``config.json``,
``model_type`` "xcodec"). The files also hold the encoder side, which is
skipped.

Folded here: the FSQ's ``project_out`` and ``fc_post_a`` (two affine maps
with nothing between them) into ``fsq.proj``; the fused ``c_attn`` split into
q, k, v; the iSTFT's inverse DFT and window into ``head.basis``.

Weight norm: the released NeuCodec file is reported (transformers' converter,
PR #47143) to hold both a plain ``.weight`` and ``weight_g``/``weight_v`` for
the backbone's ``embed`` and ResnetBlock convs. The neucodec package, which
NeuTTS runs, never applies weight norm to the generator and loads with
``strict=False``: it uses the plain ``.weight``. So does this converter; g/v
are ignored, and reported in the log when ``g * v / ||v||`` differs from the
plain weight (the HF port would then decode differently). A conv with only
g/v is folded.

Heads are not recorded in the weights: 16, as both releases construct
``CodecDecoderVocos``; a config key ``heads`` overrides (tests of small
models). ``hop_length``, ``sample_rate`` and ``fsq_levels`` may be given the
same way; by default hop = n_fft / 4 (as ``CodecDecoderVocos``), levels
[4]*8, 24 kHz for NeuCodec and 16 kHz for XCodec2.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, WN_LAYOUTS, ConversionError, GGUFOut, StateDict, fold_weight_norm
from .istft import check_window, istft_basis

log = logging.getLogger(__name__)

HEADS = 16
FSQ_LEVELS = [4, 4, 4, 4, 4, 4, 4, 4]
N_GROUPS = 32
SAMPLE_RATES = {"neucodec": 24000, "xcodec2": 16000}
RESNETS = (("prior_net.0", "prior.0"), ("prior_net.1", "prior.1"), ("post_net.0", "post.0"),
           ("post_net.1", "post.1"))
_PROBE = "generator.backbone.transformers.0.att.c_attn.weight"


def _is_xcodec2_config(config: Mapping[str, Any] | None) -> bool:
    return config is not None and (config.get("model_type") == "xcodec"
                                   or "XCodec2Model" in (config.get("architectures") or []))


def detect_neucodec(config: Mapping[str, Any] | None, keys) -> bool:
    keys = set(keys)
    return _PROBE in keys and "fc_post_a.weight" in keys and not _is_xcodec2_config(config)


def detect_xcodec2(config: Mapping[str, Any] | None, keys) -> bool:
    keys = set(keys)
    return _PROBE in keys and "fc_post_a.weight" in keys and _is_xcodec2_config(config)


def is_mat(name: str) -> bool:
    """The tensors stored with --dtype; must agree with neucodec.c's specs."""
    if name in ("embed.weight", "head.out.weight"):
        return True
    if name.startswith(("prior.", "post.")):
        return name.endswith((".conv1.weight", ".conv2.weight"))
    return name.startswith("blk.") and name.endswith((".q.weight", ".k.weight", ".v.weight", ".out.weight",
                                                      ".fc1.weight", ".fc2.weight"))


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def _int(config: Mapping[str, Any], key: str, default: int) -> int:
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ConversionError(f"config: {key} must be a positive integer, got {v!r}")
    return int(v)


def _conv_weight(sd: StateDict, prefix: str, stale: list[str]) -> np.ndarray:
    """A conv's weight as the neucodec package loads it: the plain ``.weight`` if present (g/v ignored)."""
    plain = f"{prefix}.weight"
    if plain not in sd:
        return sd.weight(prefix)
    w = sd.get(plain)
    for gk, vk in WN_LAYOUTS:
        g, v = f"{prefix}.{gk}", f"{prefix}.{vk}"
        if g in sd and v in sd:
            sd.used.update((g, v))
            try:
                folded = fold_weight_norm(sd.get(g), sd.get(v))
            except ValueError as e:
                raise ConversionError(f"{prefix}: {e}") from None
            den = float(np.linalg.norm(w)) or 1.0
            if folded.shape != w.shape or float(np.linalg.norm(folded - w)) > 1e-5 * den:
                stale.append(prefix)
    return w


def build_tensors(sd: StateDict, arch: str, config: Mapping[str, Any] | None,
                  mat_dtype) -> tuple[GGUFOut, dict[str, Any]]:
    cfg = dict(config or {})
    fc_w = sd.get("fc_post_a.weight")
    if fc_w.ndim != 2:
        raise ConversionError(f"fc_post_a.weight has shape {fc_w.shape}, expected [hidden, vq_dim]")
    D, V = fc_w.shape
    po_w = sd.get("generator.quantizer.project_out.weight")
    if po_w.ndim != 2 or po_w.shape[0] != V:
        raise ConversionError(f"generator.quantizer.project_out.weight {po_w.shape}, expected [{V}, n_fsq]")
    n_fsq = po_w.shape[1]
    levels = cfg.get("fsq_levels", FSQ_LEVELS)
    if (not isinstance(levels, (list, tuple)) or len(levels) != n_fsq
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 2 for x in levels)):
        raise ConversionError(f"FSQ levels {levels!r} do not match project_out's {n_fsq} inputs")
    heads = _int(cfg, "heads", HEADS)
    if D % heads or D % N_GROUPS:
        raise ConversionError(f"hidden size {D} is not a multiple of {heads} heads and {N_GROUPS} groups")
    n_layers = 0
    while f"generator.backbone.transformers.{n_layers}.att.c_attn.weight" in sd:
        n_layers += 1
    ffn = sd.get("generator.backbone.transformers.0.mlp.fc1.weight").shape[0]
    head_w = sd.get("generator.head.out.weight")
    n_fft = head_w.shape[0] - 2
    win_key = "generator.head.istft.window"
    window = _expect(sd.get(win_key), (n_fft,), win_key) if win_key in sd else np.asarray(
        0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft), dtype=np.float32)
    hop = _int(cfg, "hop_length", n_fft // 4)
    window = check_window(window, hop, f"{arch} head")
    hp = {"sample_rate": _int(cfg, "sample_rate", SAMPLE_RATES[arch]), "hop_length": hop, "n_fft": n_fft,
          "dim": D, "n_layers": n_layers, "n_heads": heads, "ffn_dim": ffn, "n_groups": N_GROUPS,
          "fsq_levels": [int(x) for x in levels]}
    if arch == "neucodec" and hop != 480 and "hop_length" not in cfg:
        # XCodec2's weights have the same keys: without its config.json (model_type "xcodec") a
        # 16 kHz model would be written as a 24 kHz NeuCodec
        raise ConversionError(f"NeuCodec decoders have hop 480, this one {hop}: for XCodec2 (hop 320) give its "
                              "config.json (model_type 'xcodec') or --arch xcodec2; else set hop_length in the config")

    out = GGUFOut(arch)
    stale: list[str] = []

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, a, mat_dtype if is_mat(name) else np.float32)

    def vec(key: str, n: int) -> np.ndarray:
        return _expect(sd.get(key), (n,), key)

    # FSQ -> project_out (V x n_fsq) -> fc_post_a (D x V): one affine map, folded in float64
    po_b = vec("generator.quantizer.project_out.bias", V).astype(np.float64)
    fc_b = vec("fc_post_a.bias", D).astype(np.float64)
    fc64 = fc_w.astype(np.float64)
    put("fsq.proj.weight", (fc64 @ po_w.astype(np.float64)).astype(np.float32))   # numpy (D, n_fsq)
    put("fsq.proj.bias", (fc64 @ po_b + fc_b).astype(np.float32))
    bb = "generator.backbone"
    put("embed.weight", _expect(_conv_weight(sd, f"{bb}.embed", stale), (D, D, 7), f"{bb}.embed weight"))
    put("embed.bias", vec(f"{bb}.embed.bias", D))
    for src, dst in RESNETS:
        s = f"{bb}.{src}"
        if sd.has_module(f"{s}.nin_shortcut") or sd.has_module(f"{s}.conv_shortcut") or sd.has_module(f"{s}.temb_proj"):
            raise ConversionError(f"{s}: shortcut or time-embedding layers are not part of this decoder")
        for n in ("norm1", "norm2"):
            put(f"{dst}.{n}.weight", vec(f"{s}.{n}.weight", D))
            put(f"{dst}.{n}.bias", vec(f"{s}.{n}.bias", D))
        for c in ("conv1", "conv2"):
            put(f"{dst}.{c}.weight", _expect(_conv_weight(sd, f"{s}.{c}", stale), (D, D, 3), f"{s}.{c} weight"))
            put(f"{dst}.{c}.bias", vec(f"{s}.{c}.bias", D))
    for i in range(n_layers):
        t = f"{bb}.transformers.{i}"
        put(f"blk.{i}.att_norm.weight", vec(f"{t}.att_norm.weight", D))
        qkv = _expect(sd.get(f"{t}.att.c_attn.weight"), (3 * D, D), f"{t}.att.c_attn.weight")
        for j, n in enumerate(("q", "k", "v")):  # rearrange "b t (r h d)": q, k, v blocks of D rows
            put(f"blk.{i}.attn.{n}.weight", qkv[j * D:(j + 1) * D])
        put(f"blk.{i}.attn.out.weight", _expect(sd.get(f"{t}.att.c_proj.weight"), (D, D), f"{t}.att.c_proj.weight"))
        put(f"blk.{i}.ffn_norm.weight", vec(f"{t}.ffn_norm.weight", D))
        put(f"blk.{i}.fc1.weight", _expect(sd.get(f"{t}.mlp.fc1.weight"), (ffn, D), f"{t}.mlp.fc1.weight"))
        put(f"blk.{i}.fc2.weight", _expect(sd.get(f"{t}.mlp.fc2.weight"), (D, ffn), f"{t}.mlp.fc2.weight"))
    put("final_norm.weight", vec(f"{bb}.final_layer_norm.weight", D))
    put("final_norm.bias", vec(f"{bb}.final_layer_norm.bias", D))
    put("head.out.weight", _expect(head_w, (n_fft + 2, D), "generator.head.out.weight"))
    put("head.out.bias", vec("generator.head.out.bias", n_fft + 2))
    put("head.basis", istft_basis(window))
    put("head.window", window)

    if stale:
        log.warning("%s: %d conv(s) hold a plain .weight and weight_g/weight_v that disagree (%s%s); using the "
                    "plain .weight, as the neucodec package (NeuTTS) does", arch, len(stale), ", ".join(stale[:3]),
                    " ..." if len(stale) > 3 else "")
    hp["stale_weight_norm"] = stale

    def ignorable(k: str) -> bool:
        # the encoder side, training-only modules, FSQ's input projection and buffers
        return (not k.startswith(("generator.", "fc_post_a."))
                or (k.startswith("generator.quantizer.") and not k.startswith("generator.quantizer.project_out.")))
    left = sorted(k for k in sd.keys() if k not in sd.used and not ignorable(k))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has decoder tensors this converter does not account for: "
                              + ", ".join(left[:5]) + more)
    return out, hp


def _convert(arch: str, state_dict: Mapping[str, Any], config: Mapping[str, Any] | None, dst: str | os.PathLike,
             dtype: str, source: str, name: str | None, progress: bool) -> Path:
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if config is not None and not isinstance(config, Mapping):
        raise ConversionError(f"{arch} config must be a JSON object")
    sd = StateDict(state_dict)
    out, hp = build_tensors(sd, arch, config, np.float16 if dtype == "f16" else np.float32)
    out.string("general.name", name or f"{arch}_{hp['sample_rate'] // 1000}khz")
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    for key in ("sample_rate", "hop_length", "n_fft", "dim", "n_layers", "n_heads", "ffn_dim", "n_groups"):
        out.u32(f"{arch}.{key}", hp[key])
    out.i32_array(f"{arch}.fsq_levels", hp["fsq_levels"])
    log.info("%s: %d layers, dim %d, %d heads, n_fft %d, hop %d", arch, hp["n_layers"], hp["dim"],
             hp["n_heads"], hp["n_fft"], hp["hop_length"])
    return out.write(dst, progress=progress)


def convert_neucodec_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                                dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                                name: str | None = None, progress: bool = False) -> Path:
    """Write a NeuCodec GGUF (``neuphonic/neucodec`` ``pytorch_model.bin``; config optional)."""
    return _convert("neucodec", state_dict, config, dst, dtype, source, name, progress)


def convert_xcodec2_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                               dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                               name: str | None = None, progress: bool = False) -> Path:
    """Write an XCodec2 GGUF (``HKUSTAudio/xcodec2`` ``model.safetensors`` + ``config.json``)."""
    return _convert("xcodec2", state_dict, config, dst, dtype, source, name, progress)
