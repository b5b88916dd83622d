"""Mimi references (kyutai-labs ``moshi`` and transformers ``MimiModel``) with seeded random weights.

One seed gives one set of weights, whichever upstream runs them: the weights
are drawn in moshi's layout (the layout of Kyutai's single-file release) and
loaded into transformers through the mapping of transformers' own conversion
script (q/k rows permuted from interleaved RoPE pairs to NEOX halves). So the
two references decode the same codes from the same weights, and either can
be saved in either released layout.

Released layouts (``save_released_layout``):

- ``"transformers"``: ``kyutai/mimi``: ``config.json`` + ``model.safetensors``
  (+ ``preprocessor_config.json``), the flat key names transformers 4.x wrote
  (``decoder.layers.N``, ``decoder_transformer.layers.N.self_attn.q_proj``,
  ``quantizer.semantic_residual_vector_quantizer``...), F32, q/k in NEOX order.
  transformers >= 5.x renames them on load (its ``conversion_mapping.py``).
- ``"moshi"``: ``tokenizer-e351c8d8-checkpoint125.safetensors``: the keys of
  ``moshi.models.loaders.get_mimi`` with attention stored as
  ``self_attn.in_proj_weight`` / ``self_attn.out_proj.weight`` (what Kyutai's
  release and its Rust loader use; moshi's load hook maps them onto
  ``in_projs.0`` / ``out_projs.0``), q/k in interleaved (moshi) order.

Everything that needs torch, moshi or transformers imports it inside the
function, so this module imports with numpy alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

#: kyutai/mimi ``config.json`` (= transformers ``MimiConfig()`` defaults; frame rate 12.5 Hz)
MIMI = {
    "sampling_rate": 24000, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
    "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7,
    "last_kernel_size": 3, "residual_kernel_size": 3, "dilation_growth_rate": 2,
    "use_causal_conv": True, "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0,
    "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
    "use_conv_shortcut": False, "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1, "upsample_groups": 512, "num_hidden_layers": 8,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "gelu", "max_position_embeddings": 8000,
    "norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 250,
    "layer_scale_initial_scale": 0.01, "attention_bias": False,
}
#: the same code paths at ~1/100 of the compute: 2 layers of width 64, SEANet from
#: 128 channels, 64-entry codebooks of dim 16, a 12-step (6-frame) attention window
#: so that streams cross the window within a second
MIMI_TINY = dict(
    MIMI, hidden_size=64, num_filters=8, codebook_size=64, codebook_dim=16,
    vector_quantization_hidden_dimension=16, upsample_groups=64, num_hidden_layers=2,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
    sliding_window=12,
)
CONFIGS = {"mimi": MIMI, "tiny": MIMI_TINY}

#: samples per code frame at 24 kHz (12.5 Hz)
FRAME_SAMPLES = 1920
MOSHI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
PREPROCESSOR = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1, "overlap": None, "padding_side": "right",
                "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}


def moshi_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """moshi's ``_mimi_config`` for a config dict; equals ``loaders._mimi_config`` for ``MIMI``."""
    if config["num_key_value_heads"] != config["num_attention_heads"]:
        raise ValueError("moshi's Mimi has no grouped-query attention")
    if config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]:
        raise ValueError("moshi's attention width is hidden_size (head_dim = hidden/heads)")
    if config["upsample_groups"] != config["hidden_size"]:
        raise ValueError("moshi's upsample is depthwise (groups = hidden_size)")
    if config["vector_quantization_hidden_dimension"] != config["codebook_dim"]:
        raise ValueError("moshi's quantizer has one dimension (codebook = projection)")
    seanet = {
        "channels": config["audio_channels"], "dimension": config["hidden_size"], "causal": True,
        "n_filters": config["num_filters"], "n_residual_layers": config["num_residual_layers"],
        "activation": "ELU", "compress": config["compress"],
        "dilation_base": config["dilation_growth_rate"], "disable_norm_outer_blocks": 0,
        "kernel_size": config["kernel_size"], "residual_kernel_size": config["residual_kernel_size"],
        "last_kernel_size": config["last_kernel_size"], "norm": "none",
        "pad_mode": config["pad_mode"], "ratios": list(config["upsampling_ratios"]),
        "true_skip": not config["use_conv_shortcut"],
    }
    quantizer = {
        "dimension": config["codebook_dim"], "n_q": config["num_quantizers"],
        "bins": config["codebook_size"], "input_dimension": config["hidden_size"],
        "output_dimension": config["hidden_size"],
    }
    transformer = {
        "d_model": config["hidden_size"], "num_heads": config["num_attention_heads"],
        "num_layers": config["num_hidden_layers"], "causal": True,
        "layer_scale": config["layer_scale_initial_scale"], "context": config["sliding_window"],
        "conv_layout": True, "max_period": int(config["rope_theta"]), "gating": "none",
        "norm": "layer_norm", "positional_embedding": "rope",
        "dim_feedforward": config["intermediate_size"], "input_dimension": config["hidden_size"],
        "output_dimensions": [config["hidden_size"]],
    }
    frame_size = math.prod(config["upsampling_ratios"]) * 2
    return {"sample_rate": config["sampling_rate"], "channels": config["audio_channels"],
            "frame_rate": config["sampling_rate"] / frame_size, "seanet": seanet,
            "quantizer": quantizer, "transformer": transformer}


def hf_config_json(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` as kyutai/mimi ships it (transformers 4.x field names)."""
    out: dict[str, Any] = {"architectures": ["MimiModel"], "model_type": "mimi",
                           "torch_dtype": "float32"}
    out.update(config)
    out["frame_rate"] = config["sampling_rate"] / (math.prod(config["upsampling_ratios"]) * 2)
    out["use_cache"] = False
    return out


def _hf_config(config: Mapping[str, Any]) -> Any:
    from transformers import MimiConfig

    kw = dict(config)
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
    return MimiConfig(**kw)


# ---------------------------------------------------------------- layouts

def _permute_rows(w: Any, n_heads: int) -> Any:
    """Interleaved RoPE pairs -> NEOX halves, per head (transformers' conversion script)."""
    d_out, d_in = w.shape
    return w.view(n_heads, d_out // n_heads // 2, 2, d_in).transpose(1, 2).reshape(d_out, d_in)


def _unpermute_rows(w: Any, n_heads: int) -> Any:
    """NEOX halves -> interleaved RoPE pairs (the inverse of ``_permute_rows``)."""
    d_out, d_in = w.shape
    return w.view(n_heads, 2, d_out // n_heads // 2, d_in).transpose(1, 2).reshape(d_out, d_in)


#: moshi (release) name fragment -> transformers 4.x flat name fragment, in order
_MOSHI_TO_HF = [
    ("conv.conv.conv", "conv"), ("convtr.convtr.convtr", "conv"), ("conv.conv", "conv"),
    ("convtr.convtr", "conv"),
    ("quantizer.rvq_first.vq", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_first", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_rest.vq", "quantizer.acoustic_residual_vector_quantizer"),
    ("quantizer.rvq_rest", "quantizer.acoustic_residual_vector_quantizer"),
    ("_codebook", "codebook"), ("_initialized", "initialized"), ("embedding_sum", "embed_sum"),
    ("encoder.model", "encoder.layers"), ("decoder.model", "decoder.layers"),
    ("encoder_transformer.transformer", "encoder_transformer"),
    ("decoder_transformer.transformer", "decoder_transformer"),
    ("linear1", "mlp.fc1"), ("linear2", "mlp.fc2"), ("self_attn.out_proj", "self_attn.o_proj"),
    ("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm"),
    ("layer_scale_1", "self_attn_layer_scale"), ("layer_scale_2", "mlp_layer_scale"),
]
#: transformers >= 5 module names (nested halves) -> the flat names of the release
_HF5_TO_FLAT = [
    ("encoder.encoder_seanet.layers.", "encoder.layers."),
    ("encoder.encoder_transformer.", "encoder_transformer."),
    ("encoder.downsample.", "downsample."), ("decoder.upsample.", "upsample."),
    ("decoder.decoder_transformer.", "decoder_transformer."),
    ("decoder.decoder_seanet.layers.", "decoder.layers."),
]


def moshi_to_hf_state(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Release-layout moshi tensors -> kyutai/mimi (flat transformers 4.x) tensors."""
    heads = config["num_attention_heads"]
    out: dict[str, Any] = {}
    for k, v in sd.items():
        nk = k
        for a, b in _MOSHI_TO_HF:
            if a in nk:
                nk = nk.replace(a, b)
        if nk.endswith("in_proj_weight"):
            d = v.shape[0] // 3
            base = nk[: -len("in_proj_weight")]
            out[base + "q_proj.weight"] = _permute_rows(v[:d], heads).contiguous()
            out[base + "k_proj.weight"] = _permute_rows(v[d:2 * d], heads).contiguous()
            out[base + "v_proj.weight"] = v[2 * d:].contiguous()
        else:
            out[nk] = v
    return out


def hf_to_moshi_state(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """kyutai/mimi (flat) tensors -> release-layout moshi tensors (the inverse mapping)."""
    import torch

    heads = config["num_attention_heads"]
    n_res = config["num_residual_layers"]
    # SEANet decoder list: [conv, (ELU, convtr, res * n_res) per ratio, ELU, conv]
    convtr = {2 + i * (2 + n_res) for i in range(len(config["upsampling_ratios"]))}
    tr_names = [("mlp.fc1", "linear1"), ("mlp.fc2", "linear2"), ("self_attn.o_proj", "self_attn.out_proj"),
                ("post_attention_layernorm", "norm2"), ("input_layernorm", "norm1"),
                ("self_attn_layer_scale", "layer_scale_1"), ("mlp_layer_scale", "layer_scale_2")]
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if k.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            continue
        m = re.match(r"^(encoder|decoder)\.layers\.(\d+)\.(block\.\d+\.)?conv\.(weight|bias)$", k)
        if m:
            side, idx, block, leaf = m.groups()
            wrap = "convtr.convtr" if side == "decoder" and not block and int(idx) in convtr \
                else "conv.conv"
            out[f"{side}.model.{idx}.{block or ''}{wrap}.{leaf}"] = v
            continue
        if k.startswith("downsample.conv."):
            out["downsample.conv.conv.conv." + k.split(".")[-1]] = v
            continue
        if k.startswith("upsample.conv."):
            out["upsample.convtr.convtr.convtr." + k.split(".")[-1]] = v
            continue
        m = re.match(r"^quantizer\.(semantic|acoustic)_residual_vector_quantizer\.(.*)$", k)
        if m:
            group = "rvq_first" if m.group(1) == "semantic" else "rvq_rest"
            rest = m.group(2)
            if rest.startswith("layers."):
                rest = "vq." + rest.replace(".codebook.", "._codebook.")
                rest = rest.replace("embed_sum", "embedding_sum").replace(
                    "._codebook.initialized", "._codebook._initialized")
            out[f"quantizer.{group}.{rest}"] = v
            continue
        m = re.match(r"^(encoder|decoder)_transformer\.layers\.(\d+)\.(.*)$", k)
        if m:
            side, idx, rest = m.groups()
            base = f"{side}_transformer.transformer.layers.{idx}."
            if rest == "self_attn.q_proj.weight":
                src = f"{side}_transformer.layers.{idx}.self_attn."
                qkv = [_unpermute_rows(v, heads), _unpermute_rows(sd[src + "k_proj.weight"], heads),
                       sd[src + "v_proj.weight"]]
                out[base + "self_attn.in_proj_weight"] = torch.cat(qkv, 0).contiguous()
                continue
            for a, b in tr_names:
                if rest.startswith(a):
                    rest = b + rest[len(a):]
                    break
            out[base + rest] = v
            continue
        raise KeyError(f"unknown Mimi tensor {k!r}")
    return out


def hf5_to_flat(sd: Mapping[str, Any]) -> dict[str, Any]:
    """transformers >= 5 ``MimiModel.state_dict()`` names -> the flat released names."""
    out: dict[str, Any] = {}
    for k, v in sd.items():
        nk = k
        for a, b in _HF5_TO_FLAT:
            if nk.startswith(a):
                nk = b + nk[len(a):]
                break
        out[nk] = v
    return out


def flat_to_hf5(sd: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sd.items():
        nk = k
        for a, b in _HF5_TO_FLAT:
            if nk.startswith(b):
                nk = a + nk[len(b):]
                break
        out[nk] = v
    return out


def _moshi_release_state(model: Any) -> dict[str, Any]:
    """A moshi model's tensors under the release's names (``in_proj_weight``, ``out_proj.weight``)."""
    out = {}
    for k, v in model.state_dict().items():
        k = k.replace("self_attn.in_projs.0.weight", "self_attn.in_proj_weight")
        k = k.replace("self_attn.out_projs.0.weight", "self_attn.out_proj.weight")
        out[k] = v.detach().clone().float().contiguous()
    return out


def released_state(model: Any, layout: str) -> dict[str, Any]:
    """The tensors of ``model`` (either reference) as the named release stores them."""
    cfg = model.codecd_config
    if _is_moshi(model):
        moshi_sd = _moshi_release_state(model)
        if layout == "moshi":
            return moshi_sd
        return moshi_to_hf_state(moshi_sd, cfg)
    flat = {k: v.detach().clone().float().contiguous()
            for k, v in hf5_to_flat(model.state_dict()).items()}
    if layout == "transformers":
        return flat
    return hf_to_moshi_state(flat, cfg)


# ---------------------------------------------------------------- models

def _is_moshi(model: Any) -> bool:
    return type(model).__module__.startswith("moshi.")


def _perturbed_moshi_state(model: Any, config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Every tensor of a fresh moshi Mimi moved away from its init (release names).

    moshi's init leaves LayerNorm at (1, 0), LayerScale at 0.01, codebooks at
    zero (``embedding_sum`` = 0, ``cluster_usage`` = 1) and ``_initialized`` at
    0. Here: LayerNorm gains U(0.7, 1.3) and biases N(0, 0.05); LayerScale
    U(0.05, 0.25) per channel; conv/linear weights x (1 + N(0, 0.2)) + noise;
    conv biases + N(0, 0.05); each codebook's centroids N(0, 1) with usage
    U(0.5, 2) and ``embedding_sum = centroid * usage``, except ~3% of the codes
    per codebook whose usage is 1e-8 (below the clamp eps 1e-5, so only
    ``embedding_sum / max(usage, 1e-5)`` gives the centroid: dividing by the
    raw usage gives 1000x too large); ``_initialized`` = 1.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)

    def u(shape: Any, lo: float, hi: float) -> Any:
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape: Any, scale: float) -> Any:
        return scale * torch.randn(shape, generator=gen)

    sd = _moshi_release_state(model)
    out = {}
    for k, v in sd.items():
        if k.endswith("_initialized"):
            v = torch.ones_like(v)
        elif k.endswith("cluster_usage"):
            usage = u(v.shape, 0.5, 2.0)
            n_low = max(1, math.ceil(0.03 * v.shape[0]))
            low = torch.randperm(v.shape[0], generator=gen)[:n_low]
            usage[low] = 1e-8
            v = usage
        elif k.endswith("embedding_sum"):
            continue  # set with its usage below
        elif k.endswith(("norm1.weight", "norm2.weight")):
            v = u(v.shape, 0.7, 1.3)
        elif k.endswith(("norm1.bias", "norm2.bias")):
            v = n(v.shape, 0.05)
        elif k.endswith(".scale"):
            v = u(v.shape, 0.05, 0.25)
        elif k.endswith(".bias"):
            v = v + n(v.shape, 0.05)
        else:
            v = v * (1 + n(v.shape, 0.2)) + n(v.shape, 0.02 * float(v.std()))
        out[k] = v.float().contiguous()
    for k, v in sd.items():
        if k.endswith("embedding_sum"):
            usage = out[k[: -len("embedding_sum")] + "cluster_usage"]
            centroid = n(v.shape, 1.0)
            out[k] = (centroid * usage.clamp(min=1e-5)[:, None]).float().contiguous()
    return out


def _build_moshi(config: Mapping[str, Any]) -> Any:
    from moshi.models import loaders

    return loaders.get_mimi(None, moshi_config(config), device="cpu", num_codebooks=8)


def build_reference(config: Mapping[str, Any], seed: int, impl: str = "moshi") -> Any:
    """Mimi in eval mode, weights seeded and perturbed away from their init.

    ``impl``: ``"moshi"`` (``moshi.models.loaders.get_mimi(None, cfg)``) or
    ``"transformers"`` (``MimiModel(MimiConfig(...))``). The same ``(config,
    seed)`` gives the same weights in both (drawn in moshi's layout, mapped to
    transformers' with its conversion script's q/k permutation), so both
    decode the same codes to the same audio. The model carries its config
    dict as ``model.codecd_config``.
    """
    import torch

    torch.manual_seed(seed)
    base = _build_moshi(config)
    sd = _perturbed_moshi_state(base, config, seed)
    if impl == "moshi":
        model = base
        _load_moshi(model, sd)
    elif impl == "transformers":
        from transformers import MimiModel

        model = MimiModel(_hf_config(config))
        _load_hf(model, moshi_to_hf_state(sd, config))
    else:
        raise ValueError(f"impl must be 'moshi' or 'transformers', not {impl!r}")
    model.eval()
    model.codecd_config = dict(config)
    return model


def _load_moshi(model: Any, sd: Mapping[str, Any]) -> None:
    """Load release-named tensors strictly (moshi's own load hook maps the attention names)."""
    missing, unexpected = model.load_state_dict(dict(sd), strict=True)
    assert not missing and not unexpected
    _drop_codebook_caches(model)


def _load_hf(model: Any, flat: Mapping[str, Any]) -> None:
    nested = flat_to_hf5(flat)
    own = model.state_dict()
    if set(own) != set(nested):
        raise KeyError(f"layout mismatch: missing {sorted(set(own) - set(nested))[:5]}, "
                       f"unexpected {sorted(set(nested) - set(own))[:5]}")
    model.load_state_dict(nested, strict=True)
    _drop_codebook_caches(model)


def _drop_codebook_caches(model: Any) -> None:
    """Both references cache ``embedding_sum / clamp(usage)`` on first use: invalidate it."""
    for m in model.modules():
        if hasattr(m, "_embedding") and type(m).__name__ == "EuclideanCodebook":
            m._embedding = None  # moshi
        if hasattr(m, "_embed") and type(m).__name__ == "MimiEuclideanCodebook":
            m._embed = None  # transformers


def load_released(folder: str | Path, config: Mapping[str, Any], impl: str = "moshi",
                  layout: str | None = None) -> Any:
    """A reference built from files written by ``save_released_layout`` (either layout)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if layout is None:
        layout = "moshi" if (folder / MOSHI_FILE).exists() else "transformers"
    if impl == "moshi" and layout == "moshi":
        from moshi.models import loaders

        model = loaders.get_mimi(folder / MOSHI_FILE, moshi_config(config), device="cpu")
    elif impl == "transformers" and layout == "transformers":
        from transformers import MimiModel

        model = MimiModel.from_pretrained(folder)
    else:
        sd = load_file(str(folder / (MOSHI_FILE if layout == "moshi" else "model.safetensors")))
        if impl == "moshi":
            model = _build_moshi(config)
            _load_moshi(model, hf_to_moshi_state(sd, config))
        else:
            from transformers import MimiModel

            model = MimiModel(_hf_config(config))
            _load_hf(model, moshi_to_hf_state(sd, config))
    model.eval()
    _drop_codebook_caches(model)
    model.codecd_config = dict(config)
    return model


def save_released_layout(model: Any, folder: str | Path, layout: str = "transformers") -> Path:
    """Write ``model``'s weights exactly as a release stores them; returns the folder.

    ``layout="transformers"``: ``config.json``, ``preprocessor_config.json`` and
    ``model.safetensors`` (flat transformers 4.x names, NEOX q/k) as kyutai/mimi.
    ``layout="moshi"``: the single ``tokenizer-e351c8d8-checkpoint125.safetensors``
    of kyutai/moshiko-pytorch-bf16 (its config is moshi's code default,
    ``loaders._mimi_config``; for the tiny config nothing records the sizes,
    the caller knows them). All tensors F32, weight norm folded (Mimi's
    release has plain conv weights).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = released_state(model, layout)
    if layout == "transformers":
        (folder / "config.json").write_text(json.dumps(hf_config_json(model.codecd_config),
                                                       indent=2))
        (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "moshi":
        save_file(sd, str(folder / MOSHI_FILE))
    else:
        raise ValueError(f"layout must be 'transformers' or 'moshi', not {layout!r}")
    return folder


# ---------------------------------------------------------------- decoding

def _codes_tensor(codes: np.ndarray) -> tuple[Any, bool]:
    import torch

    a = np.asarray(codes)
    one = a.ndim == 2
    if a.ndim not in (2, 3):
        raise ValueError(f"codes must be [K, T] or [B, K, T], got shape {a.shape}")
    return torch.as_tensor(np.atleast_3d(a[None] if one else a).astype(np.int64)), one


def reference_decode(model: Any, codes: np.ndarray) -> np.ndarray:
    """Offline decode with the reference itself: float32 ``[samples]`` or ``[B, samples]``.

    ``codes``: int ``[K, T]`` or ``[B, K, T]``, K in 1..32 (the first codebook
    goes to the semantic RVQ, the rest to the acoustic one). Both references
    apply the attention window (250 steps = 10 s for the release) in their
    offline decode: moshi masks ``0 <= q - k < context``, transformers
    ``k > q - sliding_window``; the same positions. Output: T * 1920 samples.
    """
    import torch

    x, one = _codes_tensor(codes)
    with torch.inference_mode():
        if _is_moshi(model):
            y = model.decode(x)
        else:
            y = model.decode(x).audio_values
    y = y[:, 0, :].float().numpy()
    return np.asarray(y[0] if one else y, dtype=np.float32)


def _chunks(n_frames: int, chunking: int | Sequence[int]) -> list[int]:
    if isinstance(chunking, int):
        sizes = [chunking] * (n_frames // chunking) + ([n_frames % chunking] if n_frames % chunking
                                                       else [])
    else:
        sizes = [int(c) for c in chunking]
    if sum(sizes) != n_frames or min(sizes) <= 0:
        raise ValueError(f"chunk sizes {sizes} do not cover {n_frames} frames")
    return sizes


def reference_stream(model: Any, codes: np.ndarray, chunking: int | Sequence[int] = 1,
                     ) -> np.ndarray:
    """moshi's own streaming decode (``with model.streaming(B)``), chunk by chunk; concatenated.

    ``chunking``: frames per call (int) or the list of chunk sizes. moshi keeps
    conv input tails, transposed-conv overlap tails and a ring KV cache of
    ``context`` (250) entries. Its cache drops keys a batch decode would use
    once a stream passes the window with chunks of more than one transformer
    step (every Mimi frame is 2 steps at 25 Hz): then streamed != offline (see
    notes). transformers' MimiModel cannot stream a decode exactly (its
    decoder keeps no conv state), so this is moshi-only.
    """
    import torch

    if not _is_moshi(model):
        raise TypeError("only the moshi reference streams its decode")
    x, one = _codes_tensor(codes)
    outs = []
    t = 0
    with torch.inference_mode(), model.streaming(x.shape[0]):
        for c in _chunks(x.shape[-1], chunking):
            outs.append(model.decode(x[:, :, t:t + c])[:, 0, :].float().numpy())
            t += c
    y = np.concatenate(outs, axis=-1)
    return np.asarray(y[0] if one else y, dtype=np.float32)


def random_codes(config: Mapping[str, Any], n_frames: int, n_codebooks: int,
                 rng: np.random.Generator, batch: int | None = None) -> np.ndarray:
    """Uniform random codes: int32 ``[K, T]`` (``batch=None``) or ``[B, K, T]``."""
    if not 1 <= n_codebooks <= config["num_quantizers"]:
        raise ValueError(f"n_codebooks must be in 1..{config['num_quantizers']}")
    shape = (n_codebooks, n_frames) if batch is None else (batch, n_codebooks, n_frames)
    return rng.integers(0, config["codebook_size"], size=shape).astype(np.int32)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the references on ``n`` threads (the CI box has 2 cores)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
