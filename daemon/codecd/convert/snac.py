"""SNAC (hubertsiuzdak/snac) checkpoints to codecd GGUF.

Implements the ``snac`` section of docs/gguf-format.md. Only the decoder side
is written: the quantizers' codebooks and ``out_proj``, and ``decoder.*``.
The encoder and the quantizers' ``in_proj`` are read past (never validated).

Config semantics follow ``SNAC.from_config`` (``SNAC(**config)``): a key that
is absent takes SNAC's constructor default, a key SNAC does not know is an
error (keys starting with ``_``, e.g. ``_name_or_path``, are ignored as
comments). On top of that the runtime needs ``depthwise = true``.

Every source tensor's shape is checked against the shape the config implies,
and every checkpoint tensor of the decoder path that this converter does not
consume is reported, so a config that does not match its checkpoint fails with
a message instead of producing a wrong model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, ConversionError, GGUFOut, StateDict

ARCH = "snac"

#: SNAC.__init__ defaults (snac 1.2.1); absent config keys take these values.
SNAC_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 44100,
    "encoder_dim": 64,
    "encoder_rates": [3, 3, 7, 7],
    "latent_dim": None,
    "decoder_dim": 1536,
    "decoder_rates": [7, 7, 3, 3],
    "attn_window_size": 32,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [8, 4, 2, 1],
    "noise": True,
    "depthwise": True,
}

#: LocalMHA's fixed head size in snac 1.2.1 (heads = decoder_dim // 64).
ATTN_DIM_HEAD = 64
N_RES_UNITS = 3
KERNEL = 7

#: names of the weight tensors stored with the converter's --dtype ("mat" in the doc)
def is_mat(name: str) -> bool:
    return name in ("decoder.in_pw.weight", "decoder.attn.qkv.weight", "decoder.attn.out.weight",
                    "decoder.out.weight") or (
        name.startswith("decoder.block.") and (
            name.endswith(".up.weight") or name.endswith(".noise.weight") or name.endswith(".pw.weight")))


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    """True when the config or the state dict looks like SNAC."""
    if config is not None and "vq_strides" in config and "decoder_rates" in config:
        return True
    keys = set(keys)
    if "decoder.model.1.block.0.alpha" in keys:
        return False  # DAC: its decoder.model.1 is a decoder block, SNAC's a 1x1 conv
    return "quantizer.quantizers.0.codebook.weight" in keys and any(k.startswith("decoder.model.") for k in keys)


def _int(cfg: dict, key: str, minimum: int = 1) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ConversionError(f"SNAC config: {key} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _int_list(cfg: dict, key: str) -> list[int]:
    v = cfg[key]
    if not isinstance(v, (list, tuple)) or not v or any(
            isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in v):
        raise ConversionError(f"SNAC config: {key} must be a non-empty list of positive integers, got {v!r}")
    return [int(x) for x in v]


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a SNAC config and return it complete (defaults filled, latent_dim resolved)."""
    if not isinstance(config, Mapping):
        raise ConversionError(f"SNAC config must be a JSON object, got {type(config).__name__}")
    unknown = sorted(k for k in config if k not in SNAC_DEFAULTS and not str(k).startswith("_"))
    if unknown:
        raise ConversionError(f"SNAC config: unknown key(s) {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(SNAC_DEFAULTS)})")
    cfg = {k: (list(v) if isinstance(v, list) else v) for k, v in SNAC_DEFAULTS.items()}
    cfg.update({k: v for k, v in config.items() if k in SNAC_DEFAULTS})
    out: dict[str, Any] = {}
    out["sampling_rate"] = _int(cfg, "sampling_rate")
    out["encoder_dim"] = _int(cfg, "encoder_dim")
    out["encoder_rates"] = _int_list(cfg, "encoder_rates")
    if cfg["latent_dim"] is None:
        out["latent_dim"] = out["encoder_dim"] * 2 ** len(out["encoder_rates"])
    else:
        out["latent_dim"] = _int(cfg, "latent_dim")
    out["decoder_dim"] = _int(cfg, "decoder_dim")
    out["decoder_rates"] = _int_list(cfg, "decoder_rates")
    if cfg["attn_window_size"] is None:
        out["attn_window_size"] = 0
    else:
        out["attn_window_size"] = _int(cfg, "attn_window_size")
    out["codebook_size"] = _int(cfg, "codebook_size")
    out["codebook_dim"] = _int(cfg, "codebook_dim")
    out["vq_strides"] = _int_list(cfg, "vq_strides")
    for key in ("noise", "depthwise"):
        if not isinstance(cfg[key], bool):
            raise ConversionError(f"SNAC config: {key} must be true or false, got {cfg[key]!r}")
        out[key] = cfg[key]
    if not out["depthwise"]:
        raise ConversionError("SNAC config: depthwise = false is not supported by codecrt "
                              "(every released SNAC model is depthwise)")
    n = len(out["decoder_rates"])
    if out["decoder_dim"] % (2 ** n):
        raise ConversionError(f"SNAC config: decoder_dim {out['decoder_dim']} is not divisible by "
                              f"2**{n} (one halving per decoder block)")
    if out["attn_window_size"] and out["decoder_dim"] % ATTN_DIM_HEAD:
        raise ConversionError(f"SNAC config: decoder_dim {out['decoder_dim']} is not a multiple of the "
                              f"attention head size {ATTN_DIM_HEAD}")
    out["hop_length"] = int(math.prod(out["decoder_rates"]))
    return out


def _squeeze_last(a: np.ndarray, name: str) -> np.ndarray:
    if a.shape[-1] != 1:
        raise ConversionError(f"tensor {name!r}: expected a kernel size of 1, got shape {a.shape}")
    return a[..., 0]


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)} does not match the config, expected "
                              f"{tuple(shape)} (is the config the one of this checkpoint?)")
    return a


def _inv_alpha(alpha: np.ndarray) -> np.ndarray:
    a = alpha.astype(np.float32)
    return np.asarray(np.float32(1.0) / (a + np.float32(1e-9)), dtype=np.float32)


def build_snac_tensors(sd: StateDict, hp: dict[str, Any], mat_dtype) -> GGUFOut:
    """Map a SNAC state dict to the doc's tensors (numpy order), validating every shape."""
    L, D, H, N = hp["latent_dim"], hp["decoder_dim"], hp["codebook_dim"], hp["codebook_size"]
    rates = hp["decoder_rates"]
    n = len(rates)
    C = [D // 2 ** i for i in range(n + 1)]
    out = GGUFOut(ARCH)

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, a, mat_dtype if is_mat(name) else np.float32)

    def snake(dst: str, src: str, ch: int) -> None:
        alpha = _expect(sd.get(f"{src}.alpha"), (1, ch, 1), f"{src}.alpha").reshape(ch)
        put(f"{dst}.alpha", alpha)
        put(f"{dst}.inv_alpha", _inv_alpha(alpha))

    # quantizers
    for l in range(len(hp["vq_strides"])):
        q = f"quantizer.quantizers.{l}"
        if not sd.has_module(q):
            raise ConversionError(f"checkpoint has no {q!r}, but the config has {len(hp['vq_strides'])} "
                                  f"levels (vq_strides {hp['vq_strides']})")
        put(f"quantizer.{l}.codebook", _expect(sd.get(f"{q}.codebook.weight"), (N, H), f"{q}.codebook.weight"))
        w = _expect(sd.weight(f"{q}.out_proj"), (L, H, 1), f"{q}.out_proj weight")
        put(f"quantizer.{l}.out_proj.weight", w[..., 0])
        put(f"quantizer.{l}.out_proj.bias", _expect(sd.get(f"{q}.out_proj.bias"), (L,), f"{q}.out_proj.bias"))
    extra_q = len(hp["vq_strides"])
    if sd.has_module(f"quantizer.quantizers.{extra_q}"):
        raise ConversionError(f"checkpoint has more quantizer levels than the config's "
                              f"vq_strides {hp['vq_strides']}")

    # input convolutions
    m = "decoder.model"
    w = _expect(sd.weight(f"{m}.0"), (L, 1, KERNEL), f"{m}.0 weight (depthwise input conv)")
    put("decoder.in_dw.weight", np.ascontiguousarray(w[:, 0, :].T))
    put("decoder.in_dw.bias", _expect(sd.get(f"{m}.0.bias"), (L,), f"{m}.0.bias"))
    w = _expect(sd.weight(f"{m}.1"), (D, L, 1), f"{m}.1 weight (pointwise input conv)")
    put("decoder.in_pw.weight", w[..., 0])
    put("decoder.in_pw.bias", _expect(sd.get(f"{m}.1.bias"), (D,), f"{m}.1.bias"))

    idx = 2
    if hp["attn_window_size"]:
        a = f"{m}.2"
        put("decoder.attn.norm.weight", _expect(sd.get(f"{a}.norm.weight"), (D,), f"{a}.norm.weight"))
        put("decoder.attn.norm.bias", _expect(sd.get(f"{a}.norm.bias"), (D,), f"{a}.norm.bias"))
        put("decoder.attn.qkv.weight", _expect(sd.get(f"{a}.to_qkv.weight"), (3 * D, D), f"{a}.to_qkv.weight"))
        put("decoder.attn.out.weight", _expect(sd.get(f"{a}.to_out.weight"), (D, D), f"{a}.to_out.weight"))
        inv_key = f"{a}.rel_pos.inv_freq"
        if inv_key in sd:
            inv = sd.get(inv_key)
            ref = 1.0 / (10000 ** (np.arange(0, ATTN_DIM_HEAD, 2, dtype=np.float32) / ATTN_DIM_HEAD))
            if inv.shape != ref.shape or not np.allclose(inv, ref, rtol=1e-5, atol=0):
                raise ConversionError(f"{inv_key}: rotary frequencies differ from snac's fixed ones "
                                      "(head size 64, base 10000); codecrt cannot represent this model")
        idx = 3
    elif sd.has_module(f"{m}.2.to_qkv"):
        raise ConversionError("checkpoint has a decoder attention layer but the config's "
                              "attn_window_size is null")

    for i, s in enumerate(rates):
        b = f"{m}.{idx + i}.block"
        dst = f"decoder.block.{i}"
        cin, cout, k = C[i], C[i + 1], 2 * s
        snake(f"{dst}.snake", f"{b}.0", cin)
        w = _expect(sd.weight(f"{b}.1"), (cin, cout, k), f"{b}.1 weight (ConvTranspose1d, stride {s})")
        put(f"{dst}.up.weight", np.ascontiguousarray(w.transpose(2, 1, 0).reshape(k * cout, cin)))
        put(f"{dst}.up.bias", _expect(sd.get(f"{b}.1.bias"), (cout,), f"{b}.1.bias"))
        r0 = 2
        if hp["noise"]:
            w = _expect(sd.weight(f"{b}.2.linear"), (cout, cout, 1), f"{b}.2.linear weight (NoiseBlock)")
            put(f"{dst}.noise.weight", w[..., 0])
            if f"{b}.2.linear.bias" in sd:
                raise ConversionError(f"{b}.2.linear.bias: NoiseBlock has no bias in snac")
            r0 = 3
        elif sd.has_module(f"{b}.2.linear"):
            raise ConversionError(f"checkpoint has noise blocks ({b}.2.linear) but the config says noise = false")
        for j in range(N_RES_UNITS):
            r = f"{b}.{r0 + j}.block"
            rd = f"{dst}.res.{j}"
            snake(f"{rd}.snake1", f"{r}.0", cout)
            w = _expect(sd.weight(f"{r}.1"), (cout, 1, KERNEL), f"{r}.1 weight (depthwise conv)")
            put(f"{rd}.dw.weight", np.ascontiguousarray(w[:, 0, :].T))
            put(f"{rd}.dw.bias", _expect(sd.get(f"{r}.1.bias"), (cout,), f"{r}.1.bias"))
            snake(f"{rd}.snake2", f"{r}.2", cout)
            w = _expect(sd.weight(f"{r}.3"), (cout, cout, 1), f"{r}.3 weight (pointwise conv)")
            put(f"{rd}.pw.weight", w[..., 0])
            put(f"{rd}.pw.bias", _expect(sd.get(f"{r}.3.bias"), (cout,), f"{r}.3.bias"))
        if sd.has_module(f"{b}.{r0 + N_RES_UNITS}"):
            raise ConversionError(f"checkpoint has more layers in {b} than snac's decoder block")

    snake("decoder.out_snake", f"{m}.{idx + n}", C[n])
    w = _expect(sd.weight(f"{m}.{idx + n + 1}"), (1, C[n], KERNEL), f"{m}.{idx + n + 1} weight (output conv)")
    put("decoder.out.weight", np.ascontiguousarray(w.transpose(2, 0, 1).reshape(KERNEL, C[n])))
    put("decoder.out.bias", _expect(sd.get(f"{m}.{idx + n + 1}.bias"), (1,), f"{m}.{idx + n + 1}.bias"))

    # anything on the decode path that was not consumed means config and checkpoint disagree
    def ignorable(k: str) -> bool:
        return (k.startswith("encoder.") or ".in_proj." in k or k.endswith("rel_pos.inv_freq")
                or k.endswith("rel_pos.scale"))
    left = sorted(k for k in sd.keys() if k not in sd.used and not ignorable(k))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has tensors this SNAC config does not account for: "
                              + ", ".join(left[:5]) + more)
    return out


def add_snac_metadata(out: GGUFOut, hp: dict[str, Any], *, name: str, source: str) -> None:
    out.string("general.name", name)
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    out.u32("snac.sampling_rate", hp["sampling_rate"])
    out.u32("snac.hop_length", hp["hop_length"])
    out.u32("snac.latent_dim", hp["latent_dim"])
    out.u32("snac.decoder_dim", hp["decoder_dim"])
    out.i32_array("snac.decoder_rates", hp["decoder_rates"])
    out.u32("snac.attn_window_size", hp["attn_window_size"])
    out.u32("snac.codebook_size", hp["codebook_size"])
    out.u32("snac.codebook_dim", hp["codebook_dim"])
    out.i32_array("snac.vq_strides", hp["vq_strides"])
    out.boolean("snac.noise", hp["noise"])
    out.boolean("snac.depthwise", hp["depthwise"])


def default_name(hp: dict[str, Any]) -> str:
    return f"snac_{int(hp['sampling_rate']) // 1000}khz"


def convert_snac_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any],
                            dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                            name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from a SNAC state dict (numpy arrays or torch tensors) and config.

    ``dtype`` ("f32" or "f16") is the type of the doc's "mat" tensors; every
    other tensor is float32. Raises :class:`ConversionError` on any mismatch.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    hp = normalize_config(config)
    sd = StateDict(state_dict)
    out = build_snac_tensors(sd, hp, np.float16 if dtype == "f16" else np.float32)
    add_snac_metadata(out, hp, name=name or default_name(hp), source=source)
    return out.write(dst, progress=progress)
