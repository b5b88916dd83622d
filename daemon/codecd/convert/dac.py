"""DAC (descript-audio-codec) checkpoints to codecd GGUF.

Implements the ``dac`` section of docs/gguf-format.md. The released files
(descript's ``weights.pth``, ``weights_24khz.pth``, ``weights_16khz.pth``;
IBM's ``weights_24khz_1.5kbps_v1.0.pth`` that OuteTTS 1.0 uses) are torch
pickles written by audiotools' ``BaseModel.save(path, package=False)``:
``{"state_dict": ..., "metadata": {"kwargs": {...}}}``, the kwargs being
``dac.DAC``'s constructor arguments. :func:`codecd.convert.convert` hands the
kwargs over as the config when no config file is given. Weight norm is the
old ``weight_g`` / ``weight_v`` layout on every conv; it is folded here.

Only the decoder side is written: the quantizers' codebooks and ``out_proj``
and ``decoder.*``; the encoder and the quantizers' ``in_proj`` are read past.
Every tensor's shape is checked against the config, and decoder tensors the
config does not account for are an error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, ConversionError, GGUFOut, StateDict

ARCH = "dac"

#: dac.DAC.__init__ defaults (descript-audio-codec 1.0.0); absent kwargs take these.
DAC_DEFAULTS: dict[str, Any] = {
    "encoder_dim": 64,
    "encoder_rates": [2, 4, 8, 8],
    "latent_dim": None,
    "decoder_dim": 1536,
    "decoder_rates": [8, 8, 4, 2],
    "n_codebooks": 9,
    "codebook_size": 1024,
    "codebook_dim": 8,
    "quantizer_dropout": False,
    "sample_rate": 44100,
}

N_RES_UNITS = 3
KERNEL = 7
#: the runtime's most code levels (codecrt.h CODECRT_MAX_LEVELS)
MAX_CODEBOOKS = 32


def is_mat(name: str) -> bool:
    """The weight tensors stored with the converter's --dtype ("mat" in the doc)."""
    return name in ("decoder.in.weight", "decoder.out.weight") or (
        name.startswith("decoder.block.") and name.endswith((".up.weight", ".conv.weight", ".pw.weight")))


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    """True for DAC kwargs (``n_codebooks`` with ``decoder_rates``) or DAC's decoder keys."""
    if config is not None and "n_codebooks" in config and "decoder_rates" in config:
        return True
    keys = set(keys)
    # SNAC shares the quantizer keys; its decoder.model.1 is a 1x1 conv, DAC's a decoder block
    return "quantizer.quantizers.0.codebook.weight" in keys and "decoder.model.1.block.0.alpha" in keys


def _int(cfg: dict, key: str, minimum: int = 1) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ConversionError(f"DAC config: {key} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _int_list(cfg: dict, key: str, minimum: int = 1) -> list[int]:
    v = cfg[key]
    if not isinstance(v, (list, tuple)) or not v or any(
            isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < minimum for x in v):
        raise ConversionError(f"DAC config: {key} must be a non-empty list of integers >= {minimum}, got {v!r}")
    return [int(x) for x in v]


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate DAC kwargs and return them complete (defaults filled, latent_dim resolved)."""
    if not isinstance(config, Mapping):
        raise ConversionError(f"DAC config must be a mapping (the checkpoint's metadata kwargs), "
                              f"got {type(config).__name__}")
    unknown = sorted(k for k in config if k not in DAC_DEFAULTS and not str(k).startswith("_"))
    if unknown:
        raise ConversionError(f"DAC config: unknown key(s) {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(DAC_DEFAULTS)})")
    cfg = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in DAC_DEFAULTS.items()}
    cfg.update({k: v for k, v in config.items() if k in DAC_DEFAULTS})
    out: dict[str, Any] = {}
    out["sample_rate"] = _int(cfg, "sample_rate", 1000)
    out["encoder_dim"] = _int(cfg, "encoder_dim")
    out["encoder_rates"] = _int_list(cfg, "encoder_rates")
    out["latent_dim"] = (out["encoder_dim"] * 2 ** len(out["encoder_rates"]) if cfg["latent_dim"] is None
                         else _int(cfg, "latent_dim"))
    out["decoder_dim"] = _int(cfg, "decoder_dim")
    out["decoder_rates"] = _int_list(cfg, "decoder_rates", 2)
    out["n_codebooks"] = _int(cfg, "n_codebooks")
    out["codebook_size"] = _int(cfg, "codebook_size")
    out["codebook_dim"] = _int(cfg, "codebook_dim")
    if out["n_codebooks"] > MAX_CODEBOOKS:
        raise ConversionError(f"DAC config: n_codebooks {out['n_codebooks']} is above codecrt's "
                              f"{MAX_CODEBOOKS} code levels")
    n = len(out["decoder_rates"])
    if n > 8:
        raise ConversionError(f"DAC config: {n} decoder blocks, codecrt takes at most 8")
    if out["decoder_dim"] % (2 ** n):
        raise ConversionError(f"DAC config: decoder_dim {out['decoder_dim']} is not divisible by "
                              f"2**{n} (one halving per decoder block)")
    out["hop_length"] = int(math.prod(out["decoder_rates"]))
    return out


def _expect(a: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise ConversionError(f"{what}: shape {tuple(a.shape)} does not match the config, expected "
                              f"{tuple(shape)} (is the config the one of this checkpoint?)")
    return a


def _inv_alpha(alpha: np.ndarray) -> np.ndarray:
    a = alpha.astype(np.float32)
    return np.asarray(np.float32(1.0) / (a + np.float32(1e-9)), dtype=np.float32)


def build_dac_tensors(sd: StateDict, hp: dict[str, Any], mat_dtype) -> GGUFOut:
    """Map a DAC state dict to the doc's tensors (numpy order), validating every shape."""
    L, D, H, N = hp["latent_dim"], hp["decoder_dim"], hp["codebook_dim"], hp["codebook_size"]
    rates = hp["decoder_rates"]
    n = len(rates)
    C = [D // 2 ** i for i in range(n + 1)]
    out = GGUFOut(ARCH)

    def put(name: str, a: np.ndarray) -> None:
        out.tensor(name, np.ascontiguousarray(a), mat_dtype if is_mat(name) else np.float32)

    def snake(dst: str, src: str, ch: int) -> None:
        alpha = _expect(sd.get(f"{src}.alpha"), (1, ch, 1), f"{src}.alpha").reshape(ch)
        put(f"{dst}.alpha", alpha)
        put(f"{dst}.inv_alpha", _inv_alpha(alpha))

    for q in range(hp["n_codebooks"]):
        p = f"quantizer.quantizers.{q}"
        if not sd.has_module(p):
            raise ConversionError(f"checkpoint has no {p!r}, but the config has {hp['n_codebooks']} codebooks")
        put(f"quantizer.{q}.codebook", _expect(sd.get(f"{p}.codebook.weight"), (N, H), f"{p}.codebook.weight"))
        w = _expect(sd.weight(f"{p}.out_proj"), (L, H, 1), f"{p}.out_proj weight")
        put(f"quantizer.{q}.out_proj.weight", w[..., 0])
        put(f"quantizer.{q}.out_proj.bias", _expect(sd.get(f"{p}.out_proj.bias"), (L,), f"{p}.out_proj.bias"))
    if sd.has_module(f"quantizer.quantizers.{hp['n_codebooks']}"):
        raise ConversionError(f"checkpoint has more quantizers than the config's n_codebooks "
                              f"{hp['n_codebooks']}")

    m = "decoder.model"
    w = _expect(sd.weight(f"{m}.0"), (D, L, KERNEL), f"{m}.0 weight (input conv)")
    put("decoder.in.weight", w)  # (Cout, Cin, K) = ggml ne [K, Cin, Cout]
    put("decoder.in.bias", _expect(sd.get(f"{m}.0.bias"), (D,), f"{m}.0.bias"))

    for i, s in enumerate(rates):
        b = f"{m}.{1 + i}.block"
        dst = f"decoder.block.{i}"
        cin, cout, k = C[i], C[i + 1], 2 * s
        snake(f"{dst}.snake", f"{b}.0", cin)
        w = _expect(sd.weight(f"{b}.1"), (cin, cout, k), f"{b}.1 weight (ConvTranspose1d, stride {s})")
        put(f"{dst}.up.weight", w.transpose(2, 1, 0).reshape(k * cout, cin))
        put(f"{dst}.up.bias", _expect(sd.get(f"{b}.1.bias"), (cout,), f"{b}.1.bias"))
        for j in range(N_RES_UNITS):
            r = f"{b}.{2 + j}.block"
            rd = f"{dst}.res.{j}"
            snake(f"{rd}.snake1", f"{r}.0", cout)
            put(f"{rd}.conv.weight", _expect(sd.weight(f"{r}.1"), (cout, cout, KERNEL), f"{r}.1 weight (k7 conv)"))
            put(f"{rd}.conv.bias", _expect(sd.get(f"{r}.1.bias"), (cout,), f"{r}.1.bias"))
            snake(f"{rd}.snake2", f"{r}.2", cout)
            w = _expect(sd.weight(f"{r}.3"), (cout, cout, 1), f"{r}.3 weight (1x1 conv)")
            put(f"{rd}.pw.weight", w[..., 0])
            put(f"{rd}.pw.bias", _expect(sd.get(f"{r}.3.bias"), (cout,), f"{r}.3.bias"))
        if sd.has_module(f"{b}.{2 + N_RES_UNITS}"):
            raise ConversionError(f"checkpoint has more layers in {b} than DAC's decoder block")

    snake("decoder.out_snake", f"{m}.{1 + n}", C[n])
    w = _expect(sd.weight(f"{m}.{2 + n}"), (1, C[n], KERNEL), f"{m}.{2 + n} weight (output conv)")
    put("decoder.out.weight", w.transpose(2, 0, 1).reshape(KERNEL, C[n]))
    put("decoder.out.bias", _expect(sd.get(f"{m}.{2 + n}.bias"), (1,), f"{m}.{2 + n}.bias"))
    if sd.has_module(f"{m}.{3 + n}"):
        raise ConversionError(f"checkpoint has decoder layers after {m}.{2 + n}: more decoder blocks than "
                              f"the config's decoder_rates {rates}?")

    def ignorable(k: str) -> bool:
        return k.startswith("encoder.") or ".in_proj." in k
    left = sorted(k for k in sd.keys() if k not in sd.used and not ignorable(k))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError("checkpoint has tensors this DAC config does not account for: "
                              + ", ".join(left[:5]) + more)
    return out


def add_dac_metadata(out: GGUFOut, hp: dict[str, Any], *, name: str, source: str) -> None:
    out.string("general.name", name)
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    out.u32("dac.sampling_rate", hp["sample_rate"])
    out.u32("dac.hop_length", hp["hop_length"])
    out.u32("dac.latent_dim", hp["latent_dim"])
    out.u32("dac.decoder_dim", hp["decoder_dim"])
    out.i32_array("dac.decoder_rates", hp["decoder_rates"])
    out.u32("dac.codebook_size", hp["codebook_size"])
    out.u32("dac.codebook_dim", hp["codebook_dim"])
    out.u32("dac.n_codebooks", hp["n_codebooks"])


def default_name(hp: dict[str, Any]) -> str:
    return f"dac_{int(hp['sample_rate']) // 1000}khz_{hp['n_codebooks']}q"


def convert_dac_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any],
                           dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                           name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from a DAC state dict and its kwargs (``metadata["kwargs"]``).

    ``dtype`` ("f32" or "f16") is the type of the doc's "mat" tensors; every
    other tensor is float32. Raises :class:`ConversionError` on any mismatch.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    hp = normalize_config(config)
    sd = StateDict(state_dict)
    out = build_dac_tensors(sd, hp, np.float16 if dtype == "f16" else np.float32)
    add_dac_metadata(out, hp, name=name or default_name(hp), source=source)
    return out.write(dst, progress=progress)
