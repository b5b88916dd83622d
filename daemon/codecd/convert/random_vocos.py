"""Random-weight WavTokenizer, NeuCodec and XCodec2 models (no torch, no checkpoint).

For machines without the reference packages (the GPU machine) and for
benchmarks: a state dict in the release's own key layout is filled with seeded
random numbers at sensible scales (fan-in scaled matrices, gains near 1, small
biases) and goes through the real converter. The audio is noise.

    python -m codecd.convert.random_vocos {wavtokenizer-75,wavtokenizer-40,neucodec,xcodec2} OUT.gguf
        [--seed N] [--dtype f16] [--small]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

from .neucodec import convert_neucodec_state_dict, convert_xcodec2_state_dict
from .wavtokenizer import convert_wavtokenizer_state_dict

__all__ = ["KINDS", "random_state_dict", "write_random_vocos"]

#: kind -> (architecture, full-size sizes, small sizes)
KINDS: dict[str, dict] = {
    "wavtokenizer-75": {"arch": "wavtokenizer", "hop": 320, "full": (512, 768, 2304, 12), "small": (64, 64, 96, 2)},
    "wavtokenizer-40": {"arch": "wavtokenizer", "hop": 600, "full": (512, 768, 2304, 12), "small": (64, 64, 96, 2)},
    "neucodec": {"arch": "neucodec", "hop": 480, "full": (2048, 1024, 4096, 12), "small": (64, 128, 256, 2)},
    "xcodec2": {"arch": "xcodec2", "hop": 320, "full": (2048, 1024, 4096, 12), "small": (64, 128, 256, 2)},
}


def _mat(rng: np.random.Generator, *shape: int) -> np.ndarray:
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _gain(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _bias(rng: np.random.Generator, n: int) -> np.ndarray:
    return (0.05 * rng.standard_normal(n)).astype(np.float32)


def _resnet(sd: dict, p: str, D: int, rng: np.random.Generator) -> None:
    for n in ("norm1", "norm2"):
        sd[f"{p}.{n}.weight"], sd[f"{p}.{n}.bias"] = _gain(rng, D), _bias(rng, D)
    for c in ("conv1", "conv2"):
        sd[f"{p}.{c}.weight"], sd[f"{p}.{c}.bias"] = _mat(rng, D, D, 3), _bias(rng, D)


def _window(n_fft: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)


def random_state_dict(kind: str, seed: int = 0, small: bool = False) -> tuple[str, dict, dict | None]:
    """(architecture, state dict in the release's layout, config for the converter)."""
    spec = KINDS[kind]
    rng = np.random.default_rng(seed)
    hop = spec["hop"]
    n_fft = 4 * hop
    a, D, inner, layers = spec["small" if small else "full"]
    sd: dict = {}
    if spec["arch"] == "wavtokenizer":  # OuteTTS' WavDecoder state dict; a = codebook width
        sd["codebook_weights"] = rng.standard_normal((4096, a)).astype(np.float32)
        sd["backbone.embed.weight"], sd["backbone.embed.bias"] = _mat(rng, D, a, 7), _bias(rng, D)
        for i in (0, 1, 3, 4):
            _resnet(sd, f"backbone.pos_net.{i}", D, rng)
        p = "backbone.pos_net.2"
        sd[f"{p}.norm.weight"], sd[f"{p}.norm.bias"] = _gain(rng, D), _bias(rng, D)
        for n in ("q", "k", "v", "proj_out"):
            sd[f"{p}.{n}.weight"], sd[f"{p}.{n}.bias"] = _mat(rng, D, D, 1), _bias(rng, D)
        sd["backbone.pos_net.5.weight"], sd["backbone.pos_net.5.bias"] = _gain(rng, D), _bias(rng, D)
        sd["backbone.norm.scale.weight"] = (1 + 0.1 * rng.standard_normal((4, D))).astype(np.float32)
        sd["backbone.norm.shift.weight"] = (0.05 * rng.standard_normal((4, D))).astype(np.float32)
        for i in range(layers):
            c = f"backbone.convnext.{i}"
            sd[f"{c}.dwconv.weight"], sd[f"{c}.dwconv.bias"] = _mat(rng, D, 1, 7), _bias(rng, D)
            sd[f"{c}.norm.scale.weight"] = (1 + 0.1 * rng.standard_normal((4, D))).astype(np.float32)
            sd[f"{c}.norm.shift.weight"] = (0.05 * rng.standard_normal((4, D))).astype(np.float32)
            sd[f"{c}.pwconv1.weight"], sd[f"{c}.pwconv1.bias"] = _mat(rng, inner, D), _bias(rng, inner)
            sd[f"{c}.pwconv2.weight"], sd[f"{c}.pwconv2.bias"] = _mat(rng, D, inner), _bias(rng, D)
            sd[f"{c}.gamma"] = np.full(D, 1.0 / layers, np.float32)
        sd["backbone.final_layer_norm.weight"] = _gain(rng, D)
        sd["backbone.final_layer_norm.bias"] = _bias(rng, D)
        sd["head.out.weight"], sd["head.out.bias"] = _mat(rng, n_fft + 2, D), _bias(rng, n_fft + 2)
        sd["head.istft.window"] = _window(n_fft)
        config = {"backbone_config": {"input_channels": a, "dim": D, "intermediate_dim": inner,
                                      "num_layers": layers, "adanorm_num_embeddings": 4},
                  "head_config": {"dim": D, "n_fft": n_fft, "hop_length": hop, "padding": "same"}}
        return "wavtokenizer", sd, config
    # NeuCodec / XCodec2: generator.* + fc_post_a; a = vq_dim
    g = "generator"
    sd[f"{g}.quantizer.project_out.weight"] = _mat(rng, a, 8)
    sd[f"{g}.quantizer.project_out.bias"] = _bias(rng, a)
    sd["fc_post_a.weight"], sd["fc_post_a.bias"] = _mat(rng, D, a), _bias(rng, D)
    b = f"{g}.backbone"
    sd[f"{b}.embed.weight"], sd[f"{b}.embed.bias"] = _mat(rng, D, D, 7), _bias(rng, D)
    for net in ("prior_net", "post_net"):
        for j in range(2):
            _resnet(sd, f"{b}.{net}.{j}", D, rng)
    for i in range(layers):
        t = f"{b}.transformers.{i}"
        sd[f"{t}.att_norm.weight"], sd[f"{t}.ffn_norm.weight"] = _gain(rng, D), _gain(rng, D)
        sd[f"{t}.att.c_attn.weight"] = _mat(rng, 3 * D, D)
        sd[f"{t}.att.c_proj.weight"] = _mat(rng, D, D) / math.sqrt(layers)
        sd[f"{t}.mlp.fc1.weight"] = _mat(rng, inner, D)
        sd[f"{t}.mlp.fc2.weight"] = _mat(rng, D, inner) / math.sqrt(layers)
    sd[f"{b}.final_layer_norm.weight"], sd[f"{b}.final_layer_norm.bias"] = _gain(rng, D), _bias(rng, D)
    sd[f"{g}.head.out.weight"], sd[f"{g}.head.out.bias"] = _mat(rng, n_fft + 2, D), _bias(rng, n_fft + 2)
    sd[f"{g}.head.istft.window"] = _window(n_fft)
    heads = 16 if not small else 2
    return spec["arch"], sd, {"heads": heads}


def write_random_vocos(kind: str, dst: str | os.PathLike, *, seed: int = 0, dtype: str = "f32",
                       small: bool = False) -> Path:
    """Write a random model of ``kind`` (see :data:`KINDS`) through the converter."""
    arch, sd, config = random_state_dict(kind, seed, small)
    convert = {"wavtokenizer": convert_wavtokenizer_state_dict, "neucodec": convert_neucodec_state_dict,
               "xcodec2": convert_xcodec2_state_dict}[arch]
    return convert(sd, config, dst, dtype, source=f"random weights (seed {seed})",
                   name=f"random_{kind.replace('-', '_')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--small", action="store_true", help="narrow layers (tests)")
    args = ap.parse_args(argv)
    write_random_vocos(args.kind, args.out, seed=args.seed, dtype=args.dtype, small=args.small)
    return 0


if __name__ == "__main__":
    sys.exit(main())
