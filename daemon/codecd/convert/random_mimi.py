"""Random-weight Mimi decoders in kyutai/mimi's released layout (numpy only, no torch).

For benchmarks and the GPU machine, which has neither moshi nor transformers: the
decoder tensors that kyutai/mimi's ``model.safetensors`` holds (transformers 4.x
flat names, q/k rows in NEOX order, plain conv weights), filled with seeded random
numbers at sensible scales, and converted by :mod:`codecd.convert.mimi`. The audio
is noise; the shapes, and so the cost, are the release's.

Scales: conv, transposed-conv and linear weights N(0, 1/fan_in) (fan-in of a
transposed conv: input channels x kernel / stride), biases N(0, 0.05^2),
LayerNorm gains U(0.7, 1.3) and biases N(0, 0.05^2), LayerScale U(0.05, 0.25),
codebook centroids N(0, 1) stored as ``embed_sum = centroid * usage`` with usage
U(0.5, 2), so activations stay O(1) through the 8 layers and the SEANet.

    python -m codecd.convert.random_mimi OUT.gguf [--seed N] [--dtype f16] [--tiny]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .mimi import MIMI_DEFAULTS, convert_mimi_state_dict

__all__ = ["CONFIGS", "random_mimi_state_dict", "write_random_mimi"]

#: the release (kyutai/mimi ``config.json`` fields the decoder reads), and the tests' tiny
#: sizes (same code paths, 2 layers of width 64, a 12-step attention window)
CONFIGS: dict[str, dict[str, Any]] = {
    "mimi": dict(MIMI_DEFAULTS),
    "tiny": dict(MIMI_DEFAULTS, hidden_size=64, num_filters=8, codebook_size=64, codebook_dim=16,
                 vector_quantization_hidden_dimension=16, upsample_groups=64, num_hidden_layers=2,
                 intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                 sliding_window=12),
}


def random_mimi_state_dict(config: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The decoder-side tensors of kyutai/mimi's ``model.safetensors`` for ``config`` (default: the
    release), random. Keys and shapes are those of transformers' ``MimiModel`` (4.x flat names) on the
    decoder path: quantizer codebooks (``embed_sum``, ``cluster_usage``, ``initialized``) and
    ``output_proj`` of both groups, ``upsample``, ``decoder_transformer``, ``decoder`` (SEANet)."""
    cfg = dict(MIMI_DEFAULTS)
    if config is not None:
        cfg.update(config)
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def uniform(shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, shape).astype(np.float32)

    D, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nq, nsem = cfg["num_quantizers"], cfg["num_semantic_quantizers"]
    bins, cdim = cfg["codebook_size"], cfg["codebook_dim"]

    # quantizer: semantic group (codebooks 0..nsem-1) and acoustic group (the rest)
    for group, n in (("semantic", nsem), ("acoustic", nq - nsem)):
        g = f"quantizer.{group}_residual_vector_quantizer."
        for j in range(n):
            usage = uniform((bins,), 0.5, 2.0)
            sd[f"{g}layers.{j}.codebook.initialized"] = np.ones(1, np.float32)
            sd[f"{g}layers.{j}.codebook.cluster_usage"] = usage
            sd[f"{g}layers.{j}.codebook.embed_sum"] = normal((bins, cdim), 1.0) * usage[:, None]
        # n codebooks summed (std sqrt(n)) then projected: keep the group's output O(1)
        sd[f"{g}output_proj.weight"] = normal((D, cdim, 1), 1.0 / math.sqrt(cdim * max(n, 1)))

    # depthwise transposed conv k4 stride 2: each output sums 2 taps
    sd["upsample.conv.weight"] = normal((D, 1, 4), 1.0 / math.sqrt(2))

    for i in range(L):
        p = f"decoder_transformer.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            sd[f"{p}{norm}.weight"] = uniform((D,), 0.7, 1.3)
            sd[f"{p}{norm}.bias"] = normal((D,), 0.05)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[f"{p}self_attn.{proj}.weight"] = normal((D, D), 1.0 / math.sqrt(D))
        sd[f"{p}mlp.fc1.weight"] = normal((F, D), 1.0 / math.sqrt(D))
        sd[f"{p}mlp.fc2.weight"] = normal((D, F), 1.0 / math.sqrt(F))
        sd[f"{p}self_attn_layer_scale.scale"] = uniform((D,), 0.05, 0.25)
        sd[f"{p}mlp_layer_scale.scale"] = uniform((D,), 0.05, 0.25)

    # SEANet decoder: 0 conv; per ratio: ELU, convtr, residual block(s); ELU; conv
    K, KL, KR = cfg["kernel_size"], cfg["last_kernel_size"], cfg["residual_kernel_size"]
    n_res, comp = cfg["num_residual_layers"], cfg["compress"]
    ratios = list(cfg["upsampling_ratios"])
    C = cfg["num_filters"] * 2 ** len(ratios)

    def conv(pre: str, cout: int, cin: int, k: int, fan_in: float) -> None:
        sd[f"{pre}.conv.weight"] = normal((cout, cin, k), 1.0 / math.sqrt(fan_in))
        sd[f"{pre}.conv.bias"] = normal((cout,), 0.05)

    conv("decoder.layers.0", C, D, K, D * K)
    idx = 1
    for r in ratios:
        idx += 1  # ELU
        # ConvTranspose1d (Cin, Cout, 2r), stride r: each output sums 2 taps of Cin channels
        sd[f"decoder.layers.{idx}.conv.weight"] = normal((C, C // 2, 2 * r), 1.0 / math.sqrt(2 * C))
        sd[f"decoder.layers.{idx}.conv.bias"] = normal((C // 2,), 0.05)
        C //= 2
        idx += 1
        for _ in range(n_res):
            hid = C // comp
            conv(f"decoder.layers.{idx}.block.1", hid, C, KR, C * KR)
            # the residual branch's last conv at half scale: x + f(x) stays O(1)
            conv(f"decoder.layers.{idx}.block.3", C, hid, 1, 4 * hid)
            idx += 1
    idx += 1  # ELU
    conv(f"decoder.layers.{idx}", 1, C, KL, C * KL)
    return sd


def write_random_mimi(dst: str | os.PathLike[str], *, config: str | Mapping[str, Any] = "mimi", seed: int = 0,
                      dtype: str = "f32") -> Path:
    """Convert a random Mimi (a name of :data:`CONFIGS`, or config fields) to the GGUF file ``dst``."""
    cfg = CONFIGS[config] if isinstance(config, str) else dict(MIMI_DEFAULTS, **config)
    name = config if isinstance(config, str) else "custom"
    return convert_mimi_state_dict(random_mimi_state_dict(cfg, seed), cfg, dst, dtype,
                                   source=f"random mimi (seed {seed})", name=f"random_mimi_{name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny sizes")
    args = ap.parse_args(argv)
    write_random_mimi(args.out, config="tiny" if args.tiny else "mimi", seed=args.seed, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
