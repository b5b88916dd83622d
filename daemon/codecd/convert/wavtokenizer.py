"""WavTokenizer decoders (jishengpeng/WavTokenizer; OuteTTS 0.2/0.3) to codecd GGUF.

Implements the ``wavtokenizer`` section of docs/gguf-format.md. Two released layouts:

* OuteTTS (``OuteAI/wavtokenizer-large-75token-interface``, ``decoder/``):
  ``decoder_model.pt`` = ``{"model_state_dict": WavDecoder.state_dict(),
  "codebook_weights": [4096, 512]}`` beside ``config.json``
  (``backbone_config``, ``head_config``);
* the original repo's Lightning checkpoint (``novateur/WavTokenizer-*``,
  ``*.ckpt``): ``{"state_dict": {...}}`` with ``backbone.*``, ``head.*``, the
  whole ``feature_extractor.*`` (encoder, EMA codebook) and training keys.

Both hold the same ``backbone.*`` / ``head.*`` keys; the codebook is
``codebook_weights`` or ``feature_extractor.encodec.quantizer.vq.layers.0._codebook.embed``.
The architecture is read from the weights (dims, layers, n_fft from the
window); the hop is ``head_config.hop_length`` when a config is given, else
n_fft / 4 as in every released config. AdaLayerNorm is folded to the affine
of bandwidth 0 (what OuteTTS and the repo's ``decode`` use), ConvNeXt's
LayerScale gamma into its second linear layer, and the iSTFT's inverse DFT
and window into ``head.basis``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, ConversionError, GGUFOut, StateDict
from .istft import check_window, istft_basis

ARCH = "wavtokenizer"
log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
N_GROUPS = 32
#: the pos_net's ResnetBlocks (2 is its AttnBlock, 5 its last GroupNorm)
RESNETS = (0, 1, 3, 4)
#: the codebook in the original repo's checkpoint (single quantizer, codebook_dim == dim: no projections)
ORIGINAL_CODEBOOK = "feature_extractor.encodec.quantizer.vq.layers.0._codebook.embed"
OUTETTS_CODEBOOK = "codebook_weights"
#: bandwidth id OuteTTS and WavTokenizer.decode pass (bandwidth_id = tensor([0]))
BANDWIDTH_ID = 0


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    keys = set(keys)
    return "backbone.pos_net.2.q.weight" in keys and "head.out.weight" in keys and "backbone.embed.weight" in keys


def is_mat(name: str) -> bool:
    """The tensors stored with --dtype; must agree with wavtokenizer.c's specs."""
    return (name in ("embed.weight", "head.out.weight") or bool(re.fullmatch(r"posnet\.\d\.conv[12]\.weight", name))
            or bool(re.fullmatch(r"posnet\.attn\.(q|k|v|out)\.weight", name))
            or bool(re.fullmatch(r"convnext\.\d+\.pw[12]\.weight", name)))


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def _hop(config: Mapping[str, Any] | None, n_fft: int) -> int:
    if config is None:
        if n_fft % 4:
            raise ConversionError(f"n_fft {n_fft} is not a multiple of 4 and no config gives the hop length")
        return n_fft // 4
    head = config.get("head_config", config)
    if not isinstance(head, Mapping):
        raise ConversionError("WavTokenizer config: head_config must be an object")
    hop = head.get("hop_length", n_fft // 4)
    nf = head.get("n_fft", n_fft)
    if isinstance(hop, bool) or not isinstance(hop, int) or hop < 1:
        raise ConversionError(f"WavTokenizer config: hop_length must be a positive integer, got {hop!r}")
    if nf != n_fft:
        raise ConversionError(f"WavTokenizer config: n_fft {nf!r} does not match the checkpoint's window ({n_fft})")
    if head.get("padding", "same") != "same":
        raise ConversionError(f"WavTokenizer config: padding {head.get('padding')!r}; the runtime implements 'same'")
    return hop


def _norm_affine(sd: StateDict, prefix: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A LayerNorm's affine, or AdaLayerNorm's row for bandwidth 0."""
    if f"{prefix}.scale.weight" in sd:
        scale = sd.get(f"{prefix}.scale.weight")
        shift = sd.get(f"{prefix}.shift.weight")
        if scale.ndim != 2 or scale.shape[1] != dim or shift.shape != scale.shape:
            raise ConversionError(f"{prefix}: AdaLayerNorm tables {scale.shape} / {shift.shape}, expected [n, {dim}]")
        return scale[BANDWIDTH_ID], shift[BANDWIDTH_ID]
    return (_expect(sd.get(f"{prefix}.weight"), (dim,), f"{prefix}.weight"),
            _expect(sd.get(f"{prefix}.bias"), (dim,), f"{prefix}.bias"))


def build_tensors(sd: StateDict, config: Mapping[str, Any] | None, mat_dtype) -> tuple[GGUFOut, dict[str, int]]:
    """Map a WavTokenizer state dict to the doc's tensors, validating every shape; returns (tensors, hparams)."""
    if OUTETTS_CODEBOOK in sd:
        codebook = sd.get(OUTETTS_CODEBOOK)
    elif ORIGINAL_CODEBOOK in sd:
        codebook = sd.get(ORIGINAL_CODEBOOK)
        if "feature_extractor.encodec.quantizer.vq.layers.1._codebook.embed" in sd:
            raise ConversionError("checkpoint has more than one quantizer; the released WavTokenizers have one")
    else:
        raise ConversionError(f"no codebook: neither {OUTETTS_CODEBOOK!r} (OuteTTS) nor {ORIGINAL_CODEBOOK!r} "
                              "(the original checkpoint)")
    if codebook.ndim != 2:
        raise ConversionError(f"codebook has shape {codebook.shape}, expected [codes, dim]")
    n_codes, E = codebook.shape
    embed = sd.weight("backbone.embed")
    if embed.ndim != 3 or embed.shape[1:] != (E, 7):
        raise ConversionError(f"backbone.embed weight {embed.shape}, expected [dim, {E}, 7]")
    D = embed.shape[0]
    if D % N_GROUPS:
        raise ConversionError(f"dim {D} is not a multiple of the GroupNorm's {N_GROUPS} groups")
    n_layers = 0
    while f"backbone.convnext.{n_layers}.dwconv.weight" in sd or sd.has_module(f"backbone.convnext.{n_layers}.dwconv"):
        n_layers += 1
    if n_layers == 0:
        raise ConversionError("checkpoint has no backbone.convnext blocks")
    inter = sd.get("backbone.convnext.0.pwconv1.weight").shape[0]
    head_w = sd.get("head.out.weight")
    n_fft = head_w.shape[0] - 2
    win_key = "head.istft.window"
    if win_key in sd:
        window = _expect(sd.get(win_key), (n_fft,), win_key)
    else:  # the buffer is persistent in every release; torch.hann_window otherwise
        window = np.asarray(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft), dtype=np.float32)
    hop = _hop(config, n_fft)
    window = check_window(window, hop, "WavTokenizer head")
    if config is not None and isinstance(config.get("backbone_config"), Mapping):
        bc = config["backbone_config"]
        for key, have in (("input_channels", E), ("dim", D), ("intermediate_dim", inter), ("num_layers", n_layers)):
            if key in bc and bc[key] != have:
                raise ConversionError(f"WavTokenizer config: backbone_config.{key} = {bc[key]!r} but the "
                                      f"checkpoint has {have}")
    hp = {"sample_rate": int(config.get("sample_rate", SAMPLE_RATE)) if config else SAMPLE_RATE,
          "hop_length": hop, "n_fft": n_fft, "input_dim": E, "dim": D, "intermediate_dim": inter,
          "n_layers": n_layers, "codebook_size": n_codes, "n_groups": N_GROUPS}

    out = GGUFOut(ARCH)

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, a, mat_dtype if is_mat(name) else np.float32)

    def vec(key: str, n: int) -> np.ndarray:
        return _expect(sd.get(key), (n,), key)

    put("codebook", codebook)
    put("embed.weight", embed)
    put("embed.bias", vec("backbone.embed.bias", D))
    for i in RESNETS:
        s = f"backbone.pos_net.{i}"
        if sd.has_module(f"{s}.nin_shortcut") or sd.has_module(f"{s}.conv_shortcut") or sd.has_module(f"{s}.temb_proj"):
            raise ConversionError(f"{s}: shortcut or time-embedding layers are not part of WavTokenizer's pos_net")
        for n in ("norm1", "norm2"):
            put(f"posnet.{i}.{n}.weight", vec(f"{s}.{n}.weight", D))
            put(f"posnet.{i}.{n}.bias", vec(f"{s}.{n}.bias", D))
        for c in ("conv1", "conv2"):
            put(f"posnet.{i}.{c}.weight", _expect(sd.weight(f"{s}.{c}"), (D, D, 3), f"{s}.{c} weight"))
            put(f"posnet.{i}.{c}.bias", vec(f"{s}.{c}.bias", D))
    a = "backbone.pos_net.2"
    put("posnet.attn.norm.weight", vec(f"{a}.norm.weight", D))
    put("posnet.attn.norm.bias", vec(f"{a}.norm.bias", D))
    for src, dst in (("q", "q"), ("k", "k"), ("v", "v"), ("proj_out", "out")):
        w = _expect(sd.weight(f"{a}.{src}"), (D, D, 1), f"{a}.{src} weight")
        put(f"posnet.attn.{dst}.weight", w[..., 0])
        put(f"posnet.attn.{dst}.bias", vec(f"{a}.{src}.bias", D))
    put("posnet.norm.weight", vec("backbone.pos_net.5.weight", D))
    put("posnet.norm.bias", vec("backbone.pos_net.5.bias", D))
    if sd.has_module("backbone.pos_net.6"):
        raise ConversionError("backbone.pos_net has more than the 6 layers of WavTokenizer's")
    w, b = _norm_affine(sd, "backbone.norm", D)
    put("norm.weight", w)
    put("norm.bias", b)
    for i in range(n_layers):
        c = f"backbone.convnext.{i}"
        dw = _expect(sd.weight(f"{c}.dwconv"), (D, 1, 7), f"{c}.dwconv weight")
        put(f"convnext.{i}.dw.weight", np.ascontiguousarray(dw[:, 0, :].T))
        put(f"convnext.{i}.dw.bias", vec(f"{c}.dwconv.bias", D))
        w, b = _norm_affine(sd, f"{c}.norm", D)
        put(f"convnext.{i}.norm.weight", w)
        put(f"convnext.{i}.norm.bias", b)
        put(f"convnext.{i}.pw1.weight", _expect(sd.get(f"{c}.pwconv1.weight"), (inter, D), f"{c}.pwconv1.weight"))
        put(f"convnext.{i}.pw1.bias", vec(f"{c}.pwconv1.bias", inter))
        w2 = _expect(sd.get(f"{c}.pwconv2.weight"), (D, inter), f"{c}.pwconv2.weight").astype(np.float64)
        b2 = vec(f"{c}.pwconv2.bias", D).astype(np.float64)
        if f"{c}.gamma" in sd:  # LayerScale: gamma * (W x + b) = (gamma W) x + gamma b
            g = vec(f"{c}.gamma", D).astype(np.float64)
            w2, b2 = w2 * g[:, None], b2 * g
        put(f"convnext.{i}.pw2.weight", w2.astype(np.float32))
        put(f"convnext.{i}.pw2.bias", b2.astype(np.float32))
    put("final_norm.weight", vec("backbone.final_layer_norm.weight", D))
    put("final_norm.bias", vec("backbone.final_layer_norm.bias", D))
    put("head.out.weight", _expect(head_w, (n_fft + 2, D), "head.out.weight"))
    put("head.out.bias", vec("head.out.bias", n_fft + 2))
    put("head.basis", istft_basis(window))
    put("head.window", window)

    # every decoder tensor must have been used: a leftover means a different architecture
    def ignorable(k: str) -> bool:
        return (k.startswith("feature_extractor.") or k == OUTETTS_CODEBOOK
                or not k.startswith(("backbone.", "head.")))
    left = sorted(k for k in sd.keys() if k not in sd.used and not ignorable(k))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has decoder tensors this converter does not account for: "
                              + ", ".join(left[:5]) + more)
    return out, hp


def convert_wavtokenizer_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                                    dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                                    name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from a WavTokenizer state dict (either released layout).

    ``config``: OuteTTS' decoder ``config.json`` (optional). ``dtype`` ("f32"
    or "f16") is the type of the large matrices. Raises :class:`ConversionError`.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if config is not None and not isinstance(config, Mapping):
        raise ConversionError("WavTokenizer config must be a JSON object")
    sd = StateDict(state_dict)
    out, hp = build_tensors(sd, config, np.float16 if dtype == "f16" else np.float32)
    tokens = round(hp["sample_rate"] / hp["hop_length"])
    out.string("general.name", name or f"wavtokenizer_{tokens}token")
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    for key, v in hp.items():
        out.u32(f"{ARCH}.{key}", v)
    log.info("WavTokenizer: %d layers, dim %d, n_fft %d, hop %d, %d codes", hp["n_layers"], hp["dim"],
             hp["n_fft"], hp["hop_length"], hp["codebook_size"])
    return out.write(dst, progress=progress)
