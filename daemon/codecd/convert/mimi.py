"""Mimi (Kyutai; the codec of Moshi and Sesame CSM) decoder checkpoints to codecd GGUF.

Implements the ``mimi`` section of docs/gguf-format.md. Two released layouts:

* transformers ``kyutai/mimi``: ``config.json`` + ``model.safetensors`` with the
  flat transformers 4.x names (``decoder.layers.N.conv``,
  ``decoder_transformer.layers.N.self_attn.q_proj``,
  ``quantizer.semantic_residual_vector_quantizer...``), q and k rows in NEOX
  (halves) RoPE order;
* moshi's single file ``tokenizer-e351c8d8-checkpoint125.safetensors``
  (``decoder.model.N.convtr.convtr``, ``decoder_transformer.transformer.layers.N
  .self_attn.in_proj_weight``, ``quantizer.rvq_first.vq...``), q and k rows in
  interleaved RoPE order. That release has no config: the sizes that the
  weights do not give (heads, attention window, RoPE base, norm eps) are
  moshi's ``loaders._mimi_config`` unless a config (transformers field names)
  is passed.

Only the decoder path is written: the codebooks (``embedding_sum /
max(cluster_usage, 1e-5)``, precomputed), the two groups' ``output_proj``,
the depthwise transposed-conv upsample, the decoder transformer (q and k in
interleaved RoPE order whatever the source, LayerScale folded into the
attention's output projection and the second linear layer) and the SEANet
decoder. Weight norm is folded where a checkpoint has it (the releases do
not). The encoder side is read past.
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, ConversionError, GGUFOut, StateDict

ARCH = "mimi"
log = logging.getLogger(__name__)

#: moshi ``EuclideanCodebook(epsilon=1e-5)`` and transformers ``MimiEuclideanCodebook``
CODEBOOK_EPS = 1e-5

#: kyutai/mimi ``config.json`` fields the decoder uses (= moshi's ``_mimi_config``)
MIMI_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 24000, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
    "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7,
    "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
    "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
    "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
    "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1, "upsample_groups": 512, "num_hidden_layers": 8,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": 10000.0,
    "sliding_window": 250, "attention_bias": False,
}

#: transformers 4.x flat names (kyutai/mimi) of the decoder path
HF_PREFIXES = ("decoder.layers.", "decoder_transformer.layers.", "upsample.conv.",
               "quantizer.semantic_residual_vector_quantizer.", "quantizer.acoustic_residual_vector_quantizer.")
MOSHI_PREFIXES = ("decoder.model.", "decoder_transformer.transformer.", "upsample.convtr.",
                  "quantizer.rvq_first.", "quantizer.rvq_rest.")


def layout_of(keys) -> str | None:
    keys = set(keys)
    if "upsample.conv.weight" in keys and "decoder_transformer.layers.0.self_attn.q_proj.weight" in keys:
        return "transformers"
    if "upsample.convtr.convtr.convtr.weight" in keys and any(
            k.startswith("decoder_transformer.transformer.layers.0.self_attn.") for k in keys):
        return "moshi"
    return None


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    if config is not None and config.get("model_type") not in (None, "mimi"):
        return False
    return layout_of(keys) is not None


def is_mat(name: str) -> bool:
    """The tensors stored with --dtype; must agree with mimi.c's specs."""
    return bool(re.fullmatch(r"tr\.\d+\.(attn_qkv|attn_out|ff1|ff2)\.weight", name))


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def _int(cfg: Mapping[str, Any], key: str, lo: int = 1) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConversionError(f"Mimi config: {key} must be an integer >= {lo}, got {v!r}")
    return v


def _config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decoder's config: the release's defaults, overridden by ``config`` (transformers names)."""
    cfg = dict(MIMI_DEFAULTS)
    if config is not None:
        if not isinstance(config, Mapping):
            raise ConversionError("Mimi config must be a JSON object")
        cfg.update({k: v for k, v in config.items() if k in MIMI_DEFAULTS})
        rp = config.get("rope_parameters")
        if isinstance(rp, Mapping) and "rope_theta" in rp:
            cfg["rope_theta"] = rp["rope_theta"]
    checks = [("use_causal_conv", True), ("pad_mode", "constant"), ("trim_right_ratio", 1.0),
              ("use_conv_shortcut", False), ("hidden_act", "gelu"), ("attention_bias", False),
              ("audio_channels", 1)]
    checks.append(("num_residual_layers", 1))
    for key, want in checks:
        if cfg[key] != want:
            raise ConversionError(f"Mimi config: {key} = {cfg[key]!r}; the runtime implements {want!r}")
    if cfg["num_key_value_heads"] != cfg["num_attention_heads"]:
        raise ConversionError("Mimi config: grouped-query attention (num_key_value_heads != num_attention_heads) "
                              "is not Mimi's")
    if cfg["upsample_groups"] != cfg["hidden_size"]:
        raise ConversionError("Mimi config: the runtime implements the depthwise upsample "
                              "(upsample_groups = hidden_size)")
    if cfg["vector_quantization_hidden_dimension"] != cfg["codebook_dim"]:
        raise ConversionError("Mimi config: vector_quantization_hidden_dimension must equal codebook_dim")
    ratios = cfg["upsampling_ratios"]
    if not isinstance(ratios, list) or not 1 <= len(ratios) <= 8 or any(
            isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 64 for r in ratios):
        raise ConversionError(f"Mimi config: upsampling_ratios must be 1..8 integers in [1, 64], got {ratios!r}")
    for key in ("hidden_size", "num_filters", "num_residual_layers", "kernel_size", "last_kernel_size",
                "residual_kernel_size", "dilation_growth_rate", "compress", "codebook_size", "codebook_dim",
                "num_quantizers", "num_semantic_quantizers", "num_hidden_layers", "intermediate_size",
                "num_attention_heads", "head_dim", "sliding_window"):
        _int(cfg, key)
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        raise ConversionError("Mimi config: head_dim * num_attention_heads must equal hidden_size")
    if cfg["head_dim"] % 2:
        raise ConversionError("Mimi config: head_dim must be even (RoPE pairs)")
    if cfg["num_semantic_quantizers"] >= cfg["num_quantizers"]:
        raise ConversionError("Mimi config: num_semantic_quantizers must be less than num_quantizers")
    sr = cfg["sampling_rate"]
    if isinstance(sr, bool) or not isinstance(sr, int) or sr < 1:
        raise ConversionError(f"Mimi config: sampling_rate must be a positive integer, got {sr!r}")
    for key in ("norm_eps", "rope_theta"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConversionError(f"Mimi config: {key} must be a positive number, got {v!r}")
    return cfg


class _Names:
    """Decoder tensor names of one released layout."""

    def __init__(self, layout: str):
        self.layout = layout

    def upsample(self) -> str:
        return "upsample.conv.weight" if self.layout == "transformers" else "upsample.convtr.convtr.convtr.weight"

    def dec(self, i: int, sub: str = "", transposed: bool = False) -> str:
        """Module prefix of SEANet decoder layer i (sub: ``block.N.`` inside a residual block)."""
        if self.layout == "transformers":
            return f"decoder.layers.{i}.{sub}conv"
        return f"decoder.model.{i}.{sub}" + ("convtr.convtr" if transposed else "conv.conv")

    def layer(self, i: int) -> str:
        if self.layout == "transformers":
            return f"decoder_transformer.layers.{i}."
        return f"decoder_transformer.transformer.layers.{i}."

    def group(self, semantic: bool) -> str:
        if self.layout == "transformers":
            return "quantizer." + ("semantic" if semantic else "acoustic") + "_residual_vector_quantizer."
        return "quantizer." + ("rvq_first" if semantic else "rvq_rest") + "."

    def codebook(self, semantic: bool, j: int) -> tuple[str, str]:
        g = self.group(semantic)
        if self.layout == "transformers":
            return f"{g}layers.{j}.codebook.embed_sum", f"{g}layers.{j}.codebook.cluster_usage"
        return f"{g}vq.layers.{j}._codebook.embedding_sum", f"{g}vq.layers.{j}._codebook.cluster_usage"


def _neox_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q/k projection permuted per head from NEOX halves back to interleaved pairs.

    transformers' conversion script permuted moshi's rows as new row j*(h/2)+i =
    old row 2i+j within each head of h; this is its inverse.
    """
    d_out, d_in = w.shape
    h = d_out // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, 2, h // 2, d_in).transpose(0, 2, 1, 3).reshape(d_out, d_in))


def build_tensors(sd: StateDict, cfg: Mapping[str, Any], layout: str,
                  mat_dtype: Any) -> tuple[GGUFOut, dict[str, Any]]:
    """Map a Mimi state dict to the doc's tensors, validating every shape; returns (tensors, hparams)."""
    nm = _Names(layout)
    D = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    F = cfg["intermediate_size"]
    L = cfg["num_hidden_layers"]
    nq, nsem = cfg["num_quantizers"], cfg["num_semantic_quantizers"]
    bins, cdim = cfg["codebook_size"], cfg["codebook_dim"]
    ratios = list(cfg["upsampling_ratios"])
    nf = cfg["num_filters"]
    n_res, comp = cfg["num_residual_layers"], cfg["compress"]
    K, KL, KR = cfg["kernel_size"], cfg["last_kernel_size"], cfg["residual_kernel_size"]
    C0 = nf * 2 ** len(ratios)

    out = GGUFOut(ARCH)

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, a, mat_dtype if is_mat(name) else np.float32)

    def vec(key: str, n: int) -> np.ndarray:
        return _expect(sd.get(key), (n,), key)

    # quantizer: codebooks 0..nsem-1 (semantic group), nsem..nq-1 (acoustic group),
    # each embedding_sum / max(usage, eps) followed by one all-zero row (code `bins`: an absent codebook)
    books = []
    for k in range(nq):
        sem = k < nsem
        s_key, u_key = nm.codebook(sem, k if sem else k - nsem)
        esum = _expect(sd.get(s_key), (bins, cdim), s_key).astype(np.float64)
        usage = _expect(sd.get(u_key), (bins,), u_key).astype(np.float64)
        books.append(esum / np.maximum(usage, CODEBOOK_EPS)[:, None])
        books.append(np.zeros((1, cdim)))
    put("quant.codebooks", np.concatenate(books, 0).astype(np.float32))  # ne [cdim, nq*(bins + 1)]
    for sem, name in ((True, "quant.first.proj"), (False, "quant.rest.proj")):
        key = nm.group(sem) + "output_proj.weight"
        put(name, _expect(sd.get(key), (D, cdim, 1), key)[..., 0])  # ne [cdim, D]
    if sd.has_module(nm.codebook(True, nsem)[0].rsplit(".", 2)[0]):
        raise ConversionError(f"checkpoint has more than {nsem} semantic codebooks")
    extra = nm.codebook(False, nq - nsem)[0]
    if extra in sd:
        raise ConversionError(f"checkpoint has more than {nq} codebooks (found {extra!r})")

    up = _expect(sd.get(nm.upsample()), (D, 1, 4), nm.upsample())
    put("upsample.weight", np.ascontiguousarray(up[:, 0, :].T))  # ne [D, 4]: tap k of channel c at c + k*D

    for i in range(L):
        p = nm.layer(i)
        put(f"tr.{i}.norm1.weight", vec(p + ("input_layernorm.weight" if layout == "transformers" else "norm1.weight"), D))
        put(f"tr.{i}.norm1.bias", vec(p + ("input_layernorm.bias" if layout == "transformers" else "norm1.bias"), D))
        put(f"tr.{i}.norm2.weight", vec(p + ("post_attention_layernorm.weight" if layout == "transformers"
                                             else "norm2.weight"), D))
        put(f"tr.{i}.norm2.bias", vec(p + ("post_attention_layernorm.bias" if layout == "transformers"
                                           else "norm2.bias"), D))
        if layout == "transformers":
            wq = _neox_to_interleaved(_expect(sd.get(p + "self_attn.q_proj.weight"), (D, D), p + "q_proj"), H)
            wk = _neox_to_interleaved(_expect(sd.get(p + "self_attn.k_proj.weight"), (D, D), p + "k_proj"), H)
            wv = _expect(sd.get(p + "self_attn.v_proj.weight"), (D, D), p + "v_proj")
            qkv = np.concatenate([wq, wk, wv], 0)
            o = _expect(sd.get(p + "self_attn.o_proj.weight"), (D, D), p + "o_proj")
            ls1 = vec(p + "self_attn_layer_scale.scale", D)
            ls2 = vec(p + "mlp_layer_scale.scale", D)
            w1 = _expect(sd.get(p + "mlp.fc1.weight"), (F, D), p + "mlp.fc1")
            w2 = _expect(sd.get(p + "mlp.fc2.weight"), (D, F), p + "mlp.fc2")
        else:
            key = p + "self_attn.in_proj_weight"
            if key not in sd:
                key = p + "self_attn.in_projs.0.weight"
            qkv = _expect(sd.get(key), (3 * D, D), key)
            key = p + "self_attn.out_proj.weight"
            if key not in sd:
                key = p + "self_attn.out_projs.0.weight"
            o = _expect(sd.get(key), (D, D), key)
            ls1 = vec(p + "layer_scale_1.scale", D)
            ls2 = vec(p + "layer_scale_2.scale", D)
            w1 = _expect(sd.get(p + "linear1.weight"), (F, D), p + "linear1")
            w2 = _expect(sd.get(p + "linear2.weight"), (D, F), p + "linear2")
        put(f"tr.{i}.attn_qkv.weight", qkv)                        # ne [D, 3D]
        # LayerScale: ls * (W x) = (ls W) x
        put(f"tr.{i}.attn_out.weight", (o.astype(np.float64) * ls1.astype(np.float64)[:, None]).astype(np.float32))
        put(f"tr.{i}.ff1.weight", w1)                              # ne [D, F]
        put(f"tr.{i}.ff2.weight", (w2.astype(np.float64) * ls2.astype(np.float64)[:, None]).astype(np.float32))
    if sd.has_module(nm.layer(L).rstrip(".")):
        raise ConversionError(f"checkpoint has more than {L} transformer layers")

    # SEANet decoder: 0 conv; per ratio: ELU, convtr, n_res residual blocks; ELU; conv
    def conv(idx: int, name: str, cout: int, cin: int, k: int, sub: str = "") -> None:
        pre = nm.dec(idx, sub)
        w = _expect(sd.weight(pre), (cout, cin, k), pre + " weight")
        put(f"{name}.weight", w)                                   # ne [k, cin, cout]
        put(f"{name}.bias", vec(pre + ".bias", cout))

    conv(0, "dec.in", C0, D, K)
    idx = 1
    C = C0
    for i, r in enumerate(ratios):
        idx += 1  # ELU
        pre = nm.dec(idx, transposed=True)
        w = _expect(sd.weight(pre), (C, C // 2, 2 * r), pre + " weight")  # ConvTranspose1d (Cin, Cout, K)
        put(f"dec.up{i}.weight", np.ascontiguousarray(w.transpose(2, 1, 0).reshape(2 * r * (C // 2), C)))
        put(f"dec.up{i}.bias", vec(pre + ".bias", C // 2))
        C //= 2
        idx += 1
        for j in range(n_res):
            hid = C // comp
            pre = nm.dec(idx, "block.1.")
            w = _expect(sd.weight(pre), (hid, C, KR), pre + " weight")
            # the narrow conv's layout: ne [C, KR*hid], row k*hid + oc
            put(f"dec.res{i}.{j}.conv1.weight", np.ascontiguousarray(w.transpose(2, 0, 1).reshape(KR * hid, C)))
            put(f"dec.res{i}.{j}.conv1.bias", vec(pre + ".bias", hid))
            w = _expect(sd.weight(nm.dec(idx, "block.3.")), (C, hid, 1), nm.dec(idx, "block.3.") + " weight")
            put(f"dec.res{i}.{j}.conv2.weight", w[..., 0])           # ne [hid, C]
            put(f"dec.res{i}.{j}.conv2.bias", vec(nm.dec(idx, "block.3.") + ".bias", C))
            if sd.has_module(nm.dec(idx, "shortcut.").rsplit(".", 1)[0]):
                raise ConversionError(f"decoder layer {idx}: conv shortcut; Mimi's residual blocks have none")
            idx += 1
    idx += 1  # ELU
    pre = nm.dec(idx)
    w = _expect(sd.weight(pre), (1, C, KL), pre + " weight")
    put("dec.out.weight", np.ascontiguousarray(w.transpose(2, 0, 1).reshape(KL, C)))  # ne [C, KL]
    put("dec.out.bias", vec(pre + ".bias", 1))
    if sd.has_module(nm.dec(idx + 1).split(".conv")[0]):
        raise ConversionError(f"checkpoint's SEANet decoder has more than {idx + 1} layers; "
                              "the config does not match it")

    decoder_prefixes = HF_PREFIXES if layout == "transformers" else MOSHI_PREFIXES
    left = sorted(k for k in sd.keys() if k not in sd.used and k.startswith(decoder_prefixes)
                  and not k.endswith(("input_proj.weight", "initialized", "_initialized",
                                      "embed_avg", "cluster_usage", "embed_sum", "embedding_sum")))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has decoder tensors this converter does not account for: "
                              + ", ".join(left[:5]) + more)
    hop = math.prod(ratios)
    hp = {"sample_rate": cfg["sampling_rate"], "dim": D, "n_filters": nf, "n_residual_layers": n_res,
          "kernel_size": K, "last_kernel_size": KL, "residual_kernel_size": KR,
          "dilation_base": cfg["dilation_growth_rate"], "compress": comp, "n_q": nq, "n_q_semantic": nsem,
          "codebook_size": bins, "codebook_dim": cdim, "n_layers": L, "n_heads": H, "ff_dim": F,
          "context": cfg["sliding_window"], "upsample_stride": 2, "hop": hop}
    return out, hp


def convert_mimi_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                            dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                            name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from a Mimi state dict (either released layout).

    ``config``: kyutai/mimi's ``config.json`` (transformers field names); for
    moshi's single file, absent means moshi's built-in config. ``dtype``
    ("f32" or "f16") is the type of the transformer's matrices.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    layout = layout_of(state_dict.keys())
    if layout is None:
        raise ConversionError("not a Mimi checkpoint (neither the kyutai/mimi nor moshi's key layout)")
    cfg = _config(config)
    sd = StateDict(state_dict)
    out, hp = build_tensors(sd, cfg, layout, np.float16 if dtype == "f16" else np.float32)
    out.string("general.name", name or "mimi")
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    ratios = list(cfg["upsampling_ratios"])
    for key, v in hp.items():
        out.u32(f"{ARCH}.{key}", v)
    out.i32_array(f"{ARCH}.ratios", ratios)
    out.f32(f"{ARCH}.rope_theta", float(cfg["rope_theta"]))
    out.f32(f"{ARCH}.norm_eps", float(cfg["norm_eps"]))
    log.info("Mimi (%s layout): %d codebooks of %d, dim %d, %d layers, window %d steps", layout, hp["n_q"],
             hp["codebook_size"], hp["dim"], hp["n_layers"], hp["context"])
    return out.write(dst, progress=progress)
