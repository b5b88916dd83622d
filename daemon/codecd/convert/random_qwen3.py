"""Random-weight Qwen3-TTS 12 Hz tokenizer decoders in the released layout (numpy only, no torch).

For benchmarks, the command-line tests and the GPU machine, which have no qwen-tts: the
``decoder.*`` tensors of the release's ``model.safetensors`` (qwen-tts's
``Qwen3TTSTokenizerV2Decoder.state_dict()`` names and shapes), filled with seeded random
numbers at sensible scales, and converted by :mod:`codecd.convert.qwen3`. The audio is
noise; the shapes, and so the cost, are the release's.

Scales: conv, transposed-conv and linear weights N(0, 1/fan_in) (a transposed conv's
fan-in: input channels x kernel / stride), biases N(0, 0.02^2), norm gains U(0.7, 1.3),
LayerNorm biases N(0, 0.05^2), LayerScale U(0.05, 0.25), ConvNeXt gamma U(0.1, 0.5),
SnakeBeta log-alpha and log-beta N(0, 0.3^2), codebook centroids N(0, 1) stored as
``embedding_sum = centroid * usage`` with usage U(0.5, 2); then the decoder's convs are
rescaled on a random input (``_calibrate``) so that activations stay O(1) and the output's
std is about 0.2.

    python -m codecd.convert.random_qwen3 OUT.gguf [--seed N] [--dtype f16] [--tiny]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .qwen3 import DECODER_DEFAULTS, MODEL_TYPE, convert_qwen3_state_dict

__all__ = ["CONFIGS", "random_qwen3_state_dict", "write_random_qwen3"]


def _full(decoder: Mapping[str, Any]) -> dict[str, Any]:
    return {"model_type": MODEL_TYPE, "output_sample_rate": 24000, "decode_upsample_rate": 1920,
            "decoder_config": dict(decoder)}


#: the release, and the tests' tiny sizes (tests/references/qwen3_tokenizer.py's QWEN3_TINY
#: decoder: 2 layers of width 32, 4 heads of 16, 64-entry codebooks, an 8-frame window)
CONFIGS: dict[str, dict[str, Any]] = {
    "12hz": _full(DECODER_DEFAULTS),
    "tiny": _full(dict(DECODER_DEFAULTS, latent_dim=32, codebook_dim=16, codebook_size=64, decoder_dim=64,
                       hidden_size=32, intermediate_size=64, head_dim=16, num_attention_heads=4,
                       num_key_value_heads=4, num_hidden_layers=2, sliding_window=8)),
}


def random_qwen3_state_dict(config: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The ``decoder.*`` tensors of the release's ``model.safetensors`` for ``config`` (a full
    config.json-shaped dict; default: the release), random."""
    cfg = dict(DECODER_DEFAULTS)
    if config is not None:
        cfg.update(config.get("decoder_config", {}))
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def uniform(shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, shape).astype(np.float32)

    def put(name: str, a: np.ndarray) -> None:
        sd["decoder." + name] = a

    Q, L, D, F = cfg["codebook_dim"], cfg["latent_dim"], cfg["hidden_size"], cfg["intermediate_size"]
    A = cfg["num_attention_heads"] * cfg["head_dim"]
    nq, bins, cdim = cfg["num_quantizers"], cfg["codebook_size"], cfg["codebook_dim"] // 2

    for group, n in (("rvq_first", 1), ("rvq_rest", nq - 1)):
        g = f"quantizer.{group}."
        for j in range(n):
            usage = uniform((bins,), 0.5, 2.0)
            put(f"{g}vq.layers.{j}._codebook.cluster_usage", usage)
            put(f"{g}vq.layers.{j}._codebook.embedding_sum", normal((bins, cdim), 1.0) * usage[:, None])
        put(f"{g}input_proj.weight", normal((cdim, Q, 1), 1.0 / math.sqrt(Q)))
        put(f"{g}output_proj.weight", normal((Q, cdim, 1), 1.0 / math.sqrt(cdim * n)))

    def conv(pre: str, cout: int, cin: int, k: int, scale: float = 1.0) -> None:
        put(f"{pre}.conv.weight", normal((cout, cin, k), scale / math.sqrt(cin * k)))
        put(f"{pre}.conv.bias", normal((cout,), 0.02))

    def snake(pre: str, c: int) -> None:
        put(f"{pre}.alpha", normal((c,), 0.3))
        put(f"{pre}.beta", normal((c,), 0.3))

    conv("pre_conv", L, Q, 3)
    p = "pre_transformer."
    put(p + "input_proj.weight", normal((D, L), 1.0 / math.sqrt(L)))
    put(p + "input_proj.bias", normal((D,), 0.02))
    for i in range(cfg["num_hidden_layers"]):
        q = f"{p}layers.{i}."
        put(q + "input_layernorm.weight", uniform((D,), 0.7, 1.3))
        put(q + "post_attention_layernorm.weight", uniform((D,), 0.7, 1.3))
        for n in "qkv":
            put(f"{q}self_attn.{n}_proj.weight", normal((A, D), 1.0 / math.sqrt(D)))
        put(q + "self_attn.o_proj.weight", normal((D, A), 1.0 / math.sqrt(A)))
        put(q + "mlp.gate_proj.weight", normal((F, D), 1.0 / math.sqrt(D)))
        put(q + "mlp.up_proj.weight", normal((F, D), 1.0 / math.sqrt(D)))
        put(q + "mlp.down_proj.weight", normal((D, F), 1.0 / math.sqrt(F)))
        put(q + "self_attn_layer_scale.scale", uniform((D,), 0.05, 0.25))
        put(q + "mlp_layer_scale.scale", uniform((D,), 0.05, 0.25))
    put(p + "norm.weight", uniform((D,), 0.7, 1.3))
    put(p + "output_proj.weight", normal((L, D), 1.0 / math.sqrt(D)))
    put(p + "output_proj.bias", normal((L,), 0.02))

    for i, f in enumerate(cfg["upsampling_ratios"]):
        u = f"upsample.{i}."
        put(u + "0.conv.weight", normal((L, L, f), 1.0 / math.sqrt(L)))
        put(u + "0.conv.bias", normal((L,), 0.02))
        put(u + "1.dwconv.conv.weight", normal((L, 1, 7), 1.0 / math.sqrt(7)))
        put(u + "1.dwconv.conv.bias", normal((L,), 0.02))
        put(u + "1.norm.weight", uniform((L,), 0.7, 1.3))
        put(u + "1.norm.bias", normal((L,), 0.05))
        put(u + "1.pwconv1.weight", normal((4 * L, L), 1.0 / math.sqrt(L)))
        put(u + "1.pwconv1.bias", normal((4 * L,), 0.02))
        put(u + "1.pwconv2.weight", normal((L, 4 * L), 1.0 / math.sqrt(4 * L)))
        put(u + "1.pwconv2.bias", normal((L,), 0.02))
        put(u + "1.gamma", uniform((L,), 0.1, 0.5))

    C = cfg["decoder_dim"]
    conv("decoder.0", C, L, 7)
    for i, r in enumerate(cfg["upsample_rates"]):
        b = f"decoder.{i + 1}.block."
        snake(b + "0", C)
        put(b + "1.conv.weight", normal((C, C // 2, 2 * r), 1.0 / math.sqrt(2 * C)))
        put(b + "1.conv.bias", normal((C // 2,), 0.02))
        C //= 2
        for j in range(3):
            ru = f"{b}{j + 2}."
            snake(ru + "act1", C)
            conv(ru + "conv1", C, C, 7)
            snake(ru + "act2", C)
            conv(ru + "conv2", C, C, 1, scale=0.5)
    n = len(cfg["upsample_rates"]) + 1
    snake(f"decoder.{n}", C)
    conv(f"decoder.{n + 1}", 1, C, 7)
    _calibrate(sd, cfg, rng)
    return sd


def _snake(x: np.ndarray, sd: Mapping[str, np.ndarray], pre: str) -> np.ndarray:
    a = np.exp(sd[pre + ".alpha"].astype(np.float64))[:, None]
    inv = 1.0 / (np.exp(sd[pre + ".beta"].astype(np.float64))[:, None] + 1e-9)
    return np.asarray(x + inv * np.sin(a * x) ** 2)


def _causal_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, dil: int = 1) -> np.ndarray:
    """x [Cin, T], w (Cout, Cin, K) -> [Cout, T], zero left padding d (K-1)."""
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), ((k - 1) * dil, 0)))
    t = x.shape[1]
    y = b[:, None].astype(np.float64)
    for j in range(k):
        y = y + w[:, :, j].astype(np.float64) @ xp[:, j * dil:j * dil + t]
    return np.asarray(y)


def _calibrate(sd: dict[str, np.ndarray], cfg: Mapping[str, Any], rng: np.random.Generator) -> None:
    """Rescale the decoder's convs (after the upsampling stack) so that, on a random O(1)
    input of 8 steps, each main-path conv's output has std 1, each residual branch's 0.5
    and the last conv's 0.2, as tests/references/qwen3_tokenizer.py calibrates the
    reference. Uncalibrated, the activations grow block by block and SnakeBeta's
    sin(alpha x) turns f32 rounding into output differences of 1e-4: streamed and
    offline decodes, equal in exact arithmetic, would then differ by two s16 steps."""
    def fit(pre: str, y: np.ndarray, target: float) -> np.ndarray:
        s = target / float(y.std())
        sd[pre + ".weight"] *= np.float32(s)
        sd[pre + ".bias"] *= np.float32(s)
        return y * s

    def run(pre: str, x: np.ndarray, target: float, dil: int = 1) -> np.ndarray:
        return fit(pre, _causal_conv(x, sd[pre + ".weight"], sd[pre + ".bias"], dil), target)

    x = rng.standard_normal((cfg["latent_dim"], 8))
    x = run("decoder.decoder.0.conv", x, 1.0)
    for i, r in enumerate(cfg["upsample_rates"]):
        b = f"decoder.decoder.{i + 1}.block."
        x = _snake(x, sd, b + "0")
        w = sd[b + "1.conv.weight"].astype(np.float64)              # (Cin, Cout, 2r)
        cols = np.einsum("iok,it->okt", w, x)                        # [Cout, 2r, T]
        t = x.shape[1]
        y = np.zeros((w.shape[1], (t + 1) * r))
        for k in range(2 * r):
            y[:, k:k + t * r:r] += cols[:, k, :]
        x = fit(b + "1.conv", y[:, :t * r] + sd[b + "1.conv.bias"][:, None], 1.0)
        for j, dil in enumerate((1, 3, 9)):
            ru = f"{b}{j + 2}."
            h = run(ru + "conv1.conv", _snake(x, sd, ru + "act1"), 1.0, dil)
            x = x + run(ru + "conv2.conv", _snake(h, sd, ru + "act2"), 0.5)
    n = len(cfg["upsample_rates"]) + 1
    run(f"decoder.decoder.{n + 1}.conv", _snake(x, sd, f"decoder.decoder.{n}"), 0.2)


def write_random_qwen3(dst: str | os.PathLike[str], *, config: str | Mapping[str, Any] = "12hz", seed: int = 0,
                       dtype: str = "f32") -> Path:
    """Convert a random decoder (a name of :data:`CONFIGS`, or a full config dict) to the GGUF file ``dst``."""
    cfg = CONFIGS[config] if isinstance(config, str) else dict(config)
    name = config if isinstance(config, str) else "custom"
    return convert_qwen3_state_dict(random_qwen3_state_dict(cfg, seed), cfg, dst, dtype,
                                    source=f"random qwen3 (seed {seed})", name=f"random_qwen3_{name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny sizes")
    args = ap.parse_args(argv)
    write_random_qwen3(args.out, config="tiny" if args.tiny else "12hz", seed=args.seed, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
