"""The Qwen3-TTS 12 Hz speech tokenizer's decoder to codecd GGUF.

Implements the ``qwen3`` section of docs/gguf-format.md. The released folder
(``Qwen/Qwen3-TTS-Tokenizer-12Hz``, and ``speech_tokenizer/`` inside every
Qwen3-TTS-12Hz model) holds ``config.json`` (``model_type``
``qwen3_tts_tokenizer_12hz``, the decoder's sizes under ``decoder_config``)
and ``model.safetensors``: ``decoder.*`` is qwen-tts's
``Qwen3TTSTokenizerV2Decoder.state_dict()``, ``encoder.*`` a Mimi encoder
(read past: codecd decodes only).

Written: the split RVQ's codebooks (``embedding_sum / max(cluster_usage,
1e-5)``, precomputed, each followed by a zero row for an absent codebook) and
the two groups' ``output_proj``; pre_conv; the transformer (q, k, v fused into
one matrix, q and k rows left in transformers' NEOX order, which the runtime's
RoPE takes as is; LayerScale folded into ``o_proj`` and ``down_proj``); the
upsampling stack (each ConvNeXt's gamma folded into its ``pwconv2``); the
decoder (SnakeBeta's ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)``
precomputed). The release has no weight norm.
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

ARCH = "qwen3"
MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
log = logging.getLogger(__name__)

#: qwen-tts ``EuclideanCodebook(epsilon=1e-5)``
CODEBOOK_EPS = 1e-5
#: qwen-tts ``SnakeBeta.no_div_by_zero``
SNAKE_EPS = 1e-9
#: the decoder's fixed kernels (not in the config): pre_conv 3, everything else 7
PRE_K, K = 3, 7

#: ``decoder_config`` of Qwen/Qwen3-TTS-Tokenizer-12Hz (the fields the decoder reads)
DECODER_DEFAULTS: dict[str, Any] = {
    "codebook_size": 2048, "codebook_dim": 512, "latent_dim": 1024, "decoder_dim": 1536,
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64, "hidden_act": "silu",
    "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000,
    "sliding_window": 72, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
    "attention_bias": False, "layer_scale_initial_scale": 0.01,
}


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    if config is not None and config.get("model_type") == MODEL_TYPE:
        return True
    keys = set(keys)
    return ("decoder.pre_conv.conv.weight" in keys
            and "decoder.pre_transformer.input_proj.weight" in keys)


def is_mat(name: str) -> bool:
    """The tensors stored with --dtype; must agree with qwen3.c's specs."""
    return bool(re.fullmatch(r"tr\.\d+\.(attn_qkv|attn_out|ff_gate|ff_up|ff_down)\.weight", name))


def _int_list(cfg: Mapping[str, Any], key: str) -> list[int]:
    v = cfg[key]
    if not isinstance(v, list) or not 1 <= len(v) <= 8 or any(
            isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 64 for r in v):
        raise ConversionError(f"Qwen3 tokenizer config: {key} must be 1..8 integers in [1, 64], got {v!r}")
    return list(v)


def _config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decoder's config: the release's, overridden by ``config["decoder_config"]``."""
    cfg = dict(DECODER_DEFAULTS)
    top: Mapping[str, Any] = {}
    if config is not None:
        if not isinstance(config, Mapping):
            raise ConversionError("Qwen3 tokenizer config must be a JSON object")
        top = config
        dec = config.get("decoder_config", config)
        if not isinstance(dec, Mapping):
            raise ConversionError("Qwen3 tokenizer config: decoder_config must be an object")
        cfg.update({k: v for k, v in dec.items() if k in DECODER_DEFAULTS})
        rs = dec.get("rope_scaling")
        if isinstance(rs, Mapping) and rs.get("rope_type", rs.get("type", "default")) != "default":
            raise ConversionError(f"Qwen3 tokenizer config: rope_scaling {dict(rs)!r}; the runtime implements "
                                  "the default RoPE")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False)):
        if cfg[key] != want:
            raise ConversionError(f"Qwen3 tokenizer config: {key} = {cfg[key]!r}; the runtime implements {want!r}")
    if cfg["num_key_value_heads"] != cfg["num_attention_heads"]:
        raise ConversionError("Qwen3 tokenizer config: grouped-query attention (num_key_value_heads != "
                              "num_attention_heads) is not implemented")
    if cfg["num_semantic_quantizers"] != 1:
        raise ConversionError("Qwen3 tokenizer config: the decoder's split RVQ has 1 semantic quantizer "
                              f"(qwen-tts hard-codes it), got {cfg['num_semantic_quantizers']!r}")
    for key in ("codebook_size", "codebook_dim", "latent_dim", "decoder_dim", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "head_dim", "num_quantizers", "sliding_window"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConversionError(f"Qwen3 tokenizer config: {key} must be a positive integer, got {v!r}")
    if cfg["codebook_dim"] % 2 or cfg["head_dim"] % 2:
        raise ConversionError("Qwen3 tokenizer config: codebook_dim and head_dim must be even")
    if cfg["num_quantizers"] < 2:
        raise ConversionError("Qwen3 tokenizer config: num_quantizers must be at least 2")
    rates, ups = _int_list(cfg, "upsample_rates"), _int_list(cfg, "upsampling_ratios")
    if cfg["decoder_dim"] % 2 ** len(rates):
        raise ConversionError("Qwen3 tokenizer config: decoder_dim must halve once per upsample rate")
    for key in ("rms_norm_eps", "rope_theta"):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConversionError(f"Qwen3 tokenizer config: {key} must be a positive number, got {v!r}")
    sr = top.get("output_sample_rate", 24000)
    if isinstance(sr, bool) or not isinstance(sr, int) or sr < 1000:
        raise ConversionError(f"Qwen3 tokenizer config: output_sample_rate must be an integer >= 1000, got {sr!r}")
    cfg["sample_rate"] = sr
    hop = math.prod(rates) * math.prod(ups)
    want = top.get("decode_upsample_rate", hop)
    if want != hop:
        raise ConversionError(f"Qwen3 tokenizer config: decode_upsample_rate {want!r} but the decoder's "
                              f"ratios give {hop}")
    return cfg


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def _scaled_rows(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """diag(s) w in float64, back to float32: a per-output-channel scale folded into a matrix."""
    return (w.astype(np.float64) * s.astype(np.float64)[:, None]).astype(np.float32)


def build_tensors(sd: StateDict, cfg: Mapping[str, Any], mat_dtype: Any) -> tuple[GGUFOut, dict[str, int]]:
    """Map the ``decoder.*`` tensors to the doc's tensors, validating every shape; returns (tensors, hparams)."""
    Qd, L, D, F = cfg["codebook_dim"], cfg["latent_dim"], cfg["hidden_size"], cfg["intermediate_size"]
    H, hd, NL = cfg["num_attention_heads"], cfg["head_dim"], cfg["num_hidden_layers"]
    A = H * hd
    nq, bins, cdim = cfg["num_quantizers"], cfg["codebook_size"], cfg["codebook_dim"] // 2
    rates, ups, C0 = list(cfg["upsample_rates"]), list(cfg["upsampling_ratios"]), cfg["decoder_dim"]
    out = GGUFOut(ARCH)

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, np.ascontiguousarray(a), mat_dtype if is_mat(name) else np.float32)

    def get(key: str, shape: tuple) -> np.ndarray:
        return _expect(sd.get("decoder." + key), shape, "decoder." + key)

    def snake(src: str, dst: str, c: int) -> None:
        a = get(src + ".alpha", (c,)).astype(np.float32)
        b = get(src + ".beta", (c,)).astype(np.float32)
        put(dst + ".alpha", np.exp(a))
        put(dst + ".inv_alpha", (1.0 / (np.exp(b) + np.float32(SNAKE_EPS))).astype(np.float32))

    # split RVQ: codebook 0 in rvq_first, 1..nq-1 in rvq_rest; one zero row after each
    books = []
    for k in range(nq):
        g, j = ("rvq_first", k) if k == 0 else ("rvq_rest", k - 1)
        p = f"quantizer.{g}.vq.layers.{j}._codebook."
        esum = get(p + "embedding_sum", (bins, cdim)).astype(np.float64)
        usage = get(p + "cluster_usage", (bins,)).astype(np.float64)
        books.append(esum / np.maximum(usage, CODEBOOK_EPS)[:, None])
        books.append(np.zeros((1, cdim)))
    put("quant.codebooks", np.concatenate(books, 0).astype(np.float32))   # ne [cdim, nq*(bins+1)]
    for g, name in (("rvq_first", "quant.first.proj"), ("rvq_rest", "quant.rest.proj")):
        put(name, get(f"quantizer.{g}.output_proj.weight", (Qd, cdim, 1))[..., 0])   # ne [cdim, Q]
    for g, n in (("rvq_first", 1), ("rvq_rest", nq - 1)):
        if sd.has_module(f"decoder.quantizer.{g}.vq.layers.{n}"):
            raise ConversionError(f"checkpoint has more than {nq} codebooks; the config does not match it")

    put("pre_conv.weight", get("pre_conv.conv.weight", (L, Qd, PRE_K)))     # ne [3, Q, L]
    put("pre_conv.bias", get("pre_conv.conv.bias", (L,)))
    p = "pre_transformer."
    put("tr.in.weight", get(p + "input_proj.weight", (D, L)))
    put("tr.in.bias", get(p + "input_proj.bias", (D,)))
    for i in range(NL):
        q = f"{p}layers.{i}."
        put(f"tr.{i}.norm1.weight", get(q + "input_layernorm.weight", (D,)))
        put(f"tr.{i}.norm2.weight", get(q + "post_attention_layernorm.weight", (D,)))
        put(f"tr.{i}.attn_qkv.weight", np.concatenate(
            [get(q + f"self_attn.{n}_proj.weight", (A, D)) for n in "qkv"], 0))   # ne [D, 3A]
        put(f"tr.{i}.attn_out.weight", _scaled_rows(get(q + "self_attn.o_proj.weight", (D, A)),
                                                    get(q + "self_attn_layer_scale.scale", (D,))))
        put(f"tr.{i}.ff_gate.weight", get(q + "mlp.gate_proj.weight", (F, D)))
        put(f"tr.{i}.ff_up.weight", get(q + "mlp.up_proj.weight", (F, D)))
        put(f"tr.{i}.ff_down.weight", _scaled_rows(get(q + "mlp.down_proj.weight", (D, F)),
                                                   get(q + "mlp_layer_scale.scale", (D,))))
    if sd.has_module(f"decoder.{p}layers.{NL}"):
        raise ConversionError(f"checkpoint has more than {NL} transformer layers")
    put("tr.norm.weight", get(p + "norm.weight", (D,)))
    put("tr.out.weight", get(p + "output_proj.weight", (L, D)))
    put("tr.out.bias", get(p + "output_proj.bias", (L,)))

    for i, f in enumerate(ups):
        u = f"upsample.{i}."
        w = get(u + "0.conv.weight", (L, L, f))                                  # ConvTranspose1d (Cin, Cout, f)
        put(f"up{i}.weight", w.transpose(2, 1, 0).reshape(f * L, L))            # ne [L, f*L], row k*L + oc
        put(f"up{i}.bias", np.tile(get(u + "0.conv.bias", (L,)), f))
        put(f"up{i}.dw.weight", get(u + "1.dwconv.conv.weight", (L, 1, K))[:, 0, :].T)   # ne [L, 7]
        put(f"up{i}.dw.bias", get(u + "1.dwconv.conv.bias", (L,)))
        put(f"up{i}.norm.weight", get(u + "1.norm.weight", (L,)))
        put(f"up{i}.norm.bias", get(u + "1.norm.bias", (L,)))
        put(f"up{i}.pw1.weight", get(u + "1.pwconv1.weight", (4 * L, L)))
        put(f"up{i}.pw1.bias", get(u + "1.pwconv1.bias", (4 * L,)))
        gamma = get(u + "1.gamma", (L,))
        put(f"up{i}.pw2.weight", _scaled_rows(get(u + "1.pwconv2.weight", (L, 4 * L)), gamma))
        put(f"up{i}.pw2.bias", (get(u + "1.pwconv2.bias", (L,)).astype(np.float64) * gamma).astype(np.float32))

    put("dec.in.weight", get("decoder.0.conv.weight", (C0, L, K)))            # ne [7, L, C0]
    put("dec.in.bias", get("decoder.0.conv.bias", (C0,)))
    C = C0
    for i, r in enumerate(rates):
        b = f"decoder.{i + 1}.block."
        snake(b + "0", f"dec.{i}.snake", C)
        w = get(b + "1.conv.weight", (C, C // 2, 2 * r))                        # ConvTranspose1d (Cin, Cout, 2r)
        put(f"dec.{i}.up.weight", w.transpose(2, 1, 0).reshape(2 * r * (C // 2), C))
        put(f"dec.{i}.up.bias", get(b + "1.conv.bias", (C // 2,)))
        C //= 2
        for j in range(3):
            ru = f"{b}{j + 2}."
            snake(ru + "act1", f"dec.{i}.res.{j}.snake1", C)
            put(f"dec.{i}.res.{j}.conv.weight", get(ru + "conv1.conv.weight", (C, C, K)))   # ne [7, C, C]
            put(f"dec.{i}.res.{j}.conv.bias", get(ru + "conv1.conv.bias", (C,)))
            snake(ru + "act2", f"dec.{i}.res.{j}.snake2", C)
            put(f"dec.{i}.res.{j}.pw.weight", get(ru + "conv2.conv.weight", (C, C, 1))[..., 0])
            put(f"dec.{i}.res.{j}.pw.bias", get(ru + "conv2.conv.bias", (C,)))
    n = len(rates) + 1
    snake(f"decoder.{n}", "dec.out_snake", C)
    put("dec.out.weight", get(f"decoder.{n + 1}.conv.weight", (1, C, K))[0].T)  # ne [C, 7]
    put("dec.out.bias", get(f"decoder.{n + 1}.conv.bias", (1,)))

    # the quantizer's input_proj (encoding side) is not on the decode path
    left = sorted(k for k in sd.keys() if k.startswith("decoder.") and k not in sd.used
                  and not re.fullmatch(r"decoder\.quantizer\.rvq_(first|rest)\.input_proj\.weight", k))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has decoder tensors this converter does not account for "
                              "(the config does not match it): " + ", ".join(left[:5]) + more)
    hp = {"sample_rate": cfg["sample_rate"], "n_q": nq, "n_q_semantic": 1, "codebook_size": bins,
          "codebook_dim": cdim, "quantizer_dim": Qd, "latent_dim": L, "dim": D, "n_layers": NL, "n_heads": H,
          "head_dim": hd, "ff_dim": F, "context": cfg["sliding_window"], "decoder_dim": C0,
          "hop": math.prod(rates) * math.prod(ups)}
    return out, hp


def convert_qwen3_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                             dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                             name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from the released tokenizer's tensors (``decoder.*``; the rest ignored).

    ``config``: the release's ``config.json`` (its ``decoder_config``); absent
    means the released sizes. ``dtype`` ("f32" or "f16") is the type of the
    transformer's matrices.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if not detect(config, state_dict.keys()) or "decoder.pre_conv.conv.weight" not in state_dict:
        raise ConversionError("not a Qwen3-TTS 12 Hz tokenizer checkpoint (no decoder.pre_conv / "
                              "decoder.pre_transformer tensors)")
    cfg = _config(config)
    sd = StateDict(state_dict)
    out, hp = build_tensors(sd, cfg, np.float16 if dtype == "f16" else np.float32)
    out.string("general.name", name or "qwen3-tts-tokenizer-12hz")
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    for key, v in hp.items():
        out.u32(f"{ARCH}.{key}", v)
    out.i32_array(f"{ARCH}.upsampling_ratios", list(cfg["upsampling_ratios"]))
    out.i32_array(f"{ARCH}.upsample_rates", list(cfg["upsample_rates"]))
    out.f32(f"{ARCH}.rope_theta", float(cfg["rope_theta"]))
    out.f32(f"{ARCH}.norm_eps", float(cfg["rms_norm_eps"]))
    log.info("Qwen3-TTS 12 Hz tokenizer: %d codebooks of %d, %d layers, window %d frames", hp["n_q"],
             hp["codebook_size"], hp["n_layers"], hp["context"])
    return out.write(dst, progress=progress)
