"""Random-weight SNAC models written straight to GGUF (no torch, no checkpoint).

For the daemon's ``demo`` model source and for tests: the file follows
docs/gguf-format.md (the ``snac`` section), written with the ``gguf`` package
alone (numpy arrays in numpy order, which GGUF stores reversed: ggml order).
Its audio is noise: the weights are random.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["write_random_snac"]

_KERNEL = 7
_N_RES = 3


def _tensors(hp: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every tensor of the doc's table, numpy order, float32, with fan-in scaled weights."""
    L, D = hp["latent_dim"], hp["decoder_dim"]
    H, N = hp["codebook_dim"], hp["codebook_size"]
    rates = hp["decoder_rates"]
    n = len(rates)
    C = [D // 2**i for i in range(n + 1)]
    t: dict[str, np.ndarray] = {}

    def w(name: str, shape: tuple[int, ...], fan_in: int) -> None:
        t[name] = (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    def b(name: str, size: int) -> None:
        t[name] = (0.05 * rng.standard_normal(size)).astype(np.float32)

    def snake(prefix: str, ch: int) -> None:
        alpha = rng.uniform(0.5, 1.5, ch).astype(np.float32)
        t[f"{prefix}.alpha"] = alpha
        t[f"{prefix}.inv_alpha"] = (np.float32(1.0) / (alpha + np.float32(1e-9))).astype(np.float32)

    for lv in range(len(hp["vq_strides"])):
        t[f"quantizer.{lv}.codebook"] = rng.standard_normal((N, H)).astype(np.float32)
        w(f"quantizer.{lv}.out_proj.weight", (L, H), H)
        b(f"quantizer.{lv}.out_proj.bias", L)
    w("decoder.in_dw.weight", (_KERNEL, L), _KERNEL)
    b("decoder.in_dw.bias", L)
    w("decoder.in_pw.weight", (D, L), L)
    b("decoder.in_pw.bias", D)
    if hp["attn_window_size"]:
        t["decoder.attn.norm.weight"] = rng.uniform(0.7, 1.3, D).astype(np.float32)
        b("decoder.attn.norm.bias", D)
        w("decoder.attn.qkv.weight", (3 * D, D), D)
        w("decoder.attn.out.weight", (D, D), D)
    for i, s in enumerate(rates):
        p = f"decoder.block.{i}"
        cin, cout, k = C[i], C[i + 1], 2 * s
        snake(f"{p}.snake", cin)
        w(f"{p}.up.weight", (k * cout, cin), cin)
        b(f"{p}.up.bias", cout)
        if hp["noise"]:
            w(f"{p}.noise.weight", (cout, cout), cout)
        for j in range(_N_RES):
            r = f"{p}.res.{j}"
            snake(f"{r}.snake1", cout)
            w(f"{r}.dw.weight", (_KERNEL, cout), _KERNEL)
            b(f"{r}.dw.bias", cout)
            snake(f"{r}.snake2", cout)
            w(f"{r}.pw.weight", (cout, cout), cout)
            b(f"{r}.pw.bias", cout)
    snake("decoder.out_snake", C[n])
    w("decoder.out.weight", (_KERNEL, C[n]), _KERNEL * C[n])
    b("decoder.out.bias", 1)
    return t


def write_random_snac(path: str | os.PathLike[str], hp: Mapping[str, Any], *, seed: int = 0,
                      name: str = "snac_random", out_gain: float = 1.0,
                      description: str = "") -> Path:
    """Write a SNAC GGUF with hyperparameters ``hp`` (the ``snac.*`` keys but hop_length)
    and seeded random weights to ``path`` (atomically, via ``path.part``); returns the path.

    ``out_gain`` scales the last convolution (weight and bias), the one before the
    decoder's tanh: random weights drive that tanh deep into saturation (full-scale
    noise, RMS 0.999), and a small gain brings it back to its linear range, so the
    output level is set by the gain while the decode stays a real one."""
    import gguf

    hp = dict(hp)
    if hp["decoder_dim"] % (2 ** len(hp["decoder_rates"])):
        raise ValueError("decoder_dim must be divisible by 2**len(decoder_rates)")
    tensors = _tensors(hp, np.random.default_rng(seed))
    if out_gain != 1.0:
        for k in ("decoder.out.weight", "decoder.out.bias"):
            tensors[k] = (tensors[k] * np.float32(out_gain)).astype(np.float32)
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    wr = gguf.GGUFWriter(str(tmp), "snac")
    vt = gguf.GGUFValueType
    wr.add_string("general.name", name)
    if description:
        wr.add_string("general.description", description)
    wr.add_uint32("codecd.format_version", 1)
    wr.add_string("codecd.source", f"random(seed={seed})")
    wr.add_uint32("snac.sampling_rate", hp["sampling_rate"])
    wr.add_uint32("snac.hop_length", int(math.prod(hp["decoder_rates"])))
    wr.add_uint32("snac.latent_dim", hp["latent_dim"])
    wr.add_uint32("snac.decoder_dim", hp["decoder_dim"])
    wr.add_key_value("snac.decoder_rates", list(hp["decoder_rates"]), vt.ARRAY, sub_type=vt.INT32)
    wr.add_uint32("snac.attn_window_size", hp["attn_window_size"])
    wr.add_uint32("snac.codebook_size", hp["codebook_size"])
    wr.add_uint32("snac.codebook_dim", hp["codebook_dim"])
    wr.add_key_value("snac.vq_strides", list(hp["vq_strides"]), vt.ARRAY, sub_type=vt.INT32)
    wr.add_bool("snac.noise", hp["noise"])
    wr.add_bool("snac.depthwise", hp["depthwise"])
    for tname, a in tensors.items():
        wr.add_tensor_info(tname, a.shape, a.dtype, a.nbytes)
    try:
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_ti_data_to_file()
        for a in tensors.values():
            wr.write_tensor_data(a)
    finally:
        wr.close()
    os.replace(tmp, path)
    logger.debug("wrote %s (%d tensors)", path, len(tensors))
    return path
