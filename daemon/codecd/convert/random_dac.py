"""Random-weight DAC models in the released checkpoint layout (numpy only, no torch).

For tests and the GPU runs on machines without the reference package: the state dict
``dac.DAC(**kwargs)`` would save (decoder and quantizer only, old-style weight norm
``weight_g`` / ``weight_v``), converted by :mod:`codecd.convert.dac`. The audio is noise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .dac import convert_dac_state_dict

__all__ = ["CONFIGS", "random_dac_state_dict", "write_random_dac"]

_COMMON = {"encoder_dim": 64, "latent_dim": 1024, "decoder_dim": 1536, "codebook_size": 1024,
           "codebook_dim": 8, "quantizer_dropout": False}
#: the released configurations (metadata kwargs) and a tiny one with the 24 kHz strides
CONFIGS: dict[str, dict[str, Any]] = {
    "44khz": dict(_COMMON, encoder_rates=[2, 4, 8, 8], decoder_rates=[8, 8, 4, 2], n_codebooks=9,
                  sample_rate=44100),
    "24khz": dict(_COMMON, encoder_rates=[2, 4, 5, 8], decoder_rates=[8, 5, 4, 2], n_codebooks=32,
                  sample_rate=24000),
    "16khz": dict(_COMMON, encoder_rates=[2, 4, 5, 8], decoder_rates=[8, 5, 4, 2], n_codebooks=12,
                  sample_rate=16000),
    "ibm_speech_24khz": dict(_COMMON, encoder_rates=[2, 4, 5, 8], decoder_rates=[8, 5, 4, 2], n_codebooks=2,
                             sample_rate=24000),
    "tiny": {"encoder_dim": 4, "encoder_rates": [2, 4, 5, 8], "latent_dim": 32, "decoder_dim": 32,
             "decoder_rates": [8, 5, 4, 2], "n_codebooks": 4, "codebook_size": 1024, "codebook_dim": 8,
             "quantizer_dropout": False, "sample_rate": 24000},
}


def random_dac_state_dict(kwargs: Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """The decoder and quantizer tensors of ``dac.DAC(**kwargs)`` in its checkpoint layout, random
    (each folded conv's rows have norm g in [0.3, 0.8]; Snake alphas in [0.5, 1.5])."""
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}

    def conv(name: str, shape: tuple[int, int, int], n_bias: int) -> None:
        sd[f"{name}.weight_v"] = rng.standard_normal(shape).astype(np.float32)
        sd[f"{name}.weight_g"] = rng.uniform(0.3, 0.8, (shape[0], 1, 1)).astype(np.float32)
        sd[f"{name}.bias"] = (0.05 * rng.standard_normal(n_bias)).astype(np.float32)

    def snake(name: str, c: int) -> None:
        sd[f"{name}.alpha"] = rng.uniform(0.5, 1.5, (1, c, 1)).astype(np.float32)

    D, H = int(kwargs["decoder_dim"]), int(kwargs["codebook_dim"])
    rates = list(kwargs["decoder_rates"])
    L = kwargs.get("latent_dim") or int(kwargs["encoder_dim"]) * 2 ** len(kwargs["encoder_rates"])
    for q in range(int(kwargs["n_codebooks"])):
        sd[f"quantizer.quantizers.{q}.codebook.weight"] = rng.standard_normal(
            (int(kwargs["codebook_size"]), H)).astype(np.float32)
        conv(f"quantizer.quantizers.{q}.out_proj", (L, H, 1), L)
    conv("decoder.model.0", (D, L, 7), D)
    c = D
    for i, s in enumerate(rates):
        b = f"decoder.model.{1 + i}.block"
        snake(f"{b}.0", c)
        conv(f"{b}.1", (c, c // 2, 2 * s), c // 2)  # ConvTranspose1d: (Cin, Cout, K), g per input channel
        c //= 2
        for j in range(3):
            r = f"{b}.{2 + j}.block"
            snake(f"{r}.0", c)
            conv(f"{r}.1", (c, c, 7), c)
            snake(f"{r}.2", c)
            conv(f"{r}.3", (c, c, 1), c)
    snake(f"decoder.model.{1 + len(rates)}", c)
    conv(f"decoder.model.{2 + len(rates)}", (1, c, 7), 1)
    return sd


def write_random_dac(name_or_kwargs: str | Mapping[str, Any], dst: str | os.PathLike[str], *, seed: int = 0,
                     dtype: str = "f32") -> Path:
    """Convert a random DAC (a name of :data:`CONFIGS`, or kwargs) to the GGUF file ``dst``."""
    kwargs = CONFIGS[name_or_kwargs] if isinstance(name_or_kwargs, str) else dict(name_or_kwargs)
    return convert_dac_state_dict(random_dac_state_dict(kwargs, seed), kwargs, dst, dtype,
                                  source=f"random dac (seed {seed})")
