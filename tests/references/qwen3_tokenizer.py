"""The Qwen3-TTS 12 Hz speech tokenizer decoder (PyPI ``qwen-tts``) with seeded random weights.

The reference is ``Qwen3TTSTokenizerV2Decoder`` from
``qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py``, built
offline from ``Qwen3TTSTokenizerV2DecoderConfig``. Two facts shape this module:

- ``import qwen_tts`` runs the package ``__init__``, which imports the whole
  TTS stack (librosa, soundfile, sox, onnxruntime, torchaudio, the 25 Hz
  tokenizer). The two 12 Hz files import only torch and transformers, so they
  are loaded straight from the installed package's files under a private
  package name (``_load``), and none of that is needed.
- qwen-tts 0.1.1 pins ``transformers==4.57.3``; this project has 5.24.0,
  where four names the decoder uses changed. Under transformers >= 5 the
  loader patches them, inside the loaded module only: ``check_model_inputs()``
  (now a plain decorator), ``ROPE_INIT_FUNCTIONS["default"]`` (removed; the
  4.57.3 function is reproduced), and the keyword names of
  ``create_causal_mask`` / ``create_sliding_window_causal_mask``
  (``input_embeds`` -> ``inputs_embeds``, ``past_key_values`` -> ``cache``,
  no ``cache_position``). Measured: the patched decoder under 5.24.0 equals
  the unpatched one under 4.57.3 (see /work/notes/qwen3_tokenizer.md).

The released folder (``Qwen/Qwen3-TTS-Tokenizer-12Hz``, and ``speech_tokenizer/``
inside every Qwen3-TTS-12Hz model) holds ``config.json``, ``configuration.json``,
``preprocessor_config.json`` and ``model.safetensors``: 496 F32 tensors, 271
``decoder.*`` (this decoder's ``state_dict()`` under ``decoder.``) and 225
``encoder.*`` (a transformers-4.x ``MimiModel`` encoder half, flat names).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import logging
import math
import sys
import types
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

#: ``decoder_config`` of the released ``config.json`` (Qwen/Qwen3-TTS-Tokenizer-12Hz)
DECODER_12HZ = {
    "attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
    "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
    "intermediate_size": 1024, "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000, "head_dim": 64, "num_attention_heads": 16,
    "num_hidden_layers": 8, "num_key_value_heads": 16, "num_quantizers": 16,
    "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000,
    "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512,
}
#: ``encoder_config`` of the release: a Mimi encoder (kyutai/mimi's values)
ENCODER_12HZ = {
    "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "upsampling_ratios": [8, 6, 5, 4],
    "num_residual_layers": 1, "dilation_growth_rate": 2, "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
    "num_quantizers": 32, "num_semantic_quantizers": 1, "codebook_size": 2048,
    "codebook_dim": 256, "frame_rate": 12.5, "upsample_groups": 512, "use_causal_conv": True,
    "pad_mode": "constant", "norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 250,
    "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "gelu",
    "intermediate_size": 2048, "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000, "use_conv_shortcut": False, "trim_right_ratio": 1.0,
    "vector_quantization_hidden_dimension": 256, "residual_kernel_size": 3,
    "last_kernel_size": 3, "compress": 2, "sampling_rate": 24000,
}
QWEN3_12HZ = {
    "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
    "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
    "encoder_config": ENCODER_12HZ, "decoder_config": DECODER_12HZ,
}
#: same code paths, ~1/300 of the compute: 2 layers of width 32 with 4 heads of 16
#: (attention width 64 != hidden 32, as 16 x 64 != 512 in the release), 64-entry
#: codebooks, latent 32, SEANet-like decoder from 64 channels, an 8-frame window
QWEN3_TINY = dict(
    QWEN3_12HZ,
    encoder_config=dict(ENCODER_12HZ, hidden_size=64, num_filters=8, codebook_size=64,
                        codebook_dim=16, vector_quantization_hidden_dimension=16,
                        upsample_groups=64, num_hidden_layers=1, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=4, head_dim=16),
    decoder_config=dict(DECODER_12HZ, latent_dim=32, codebook_dim=16, codebook_size=64,
                        decoder_dim=64, hidden_size=32, intermediate_size=64, head_dim=16,
                        num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                        sliding_window=8, semantic_codebook_size=64,
                        vector_quantization_hidden_dimension=16),
)
CONFIGS = {"12hz": QWEN3_12HZ, "tiny": QWEN3_TINY}

FRAME_SAMPLES = 1920
PREPROCESSOR = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1, "overlap": None, "padding_side": "right",
                "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}
_PKG = "_codecd_qwen_tts_12hz"


# ---------------------------------------------------------------- loading the package

def _default_rope(config: Any, device: Any = None, seq_len: Any = None) -> tuple[Any, float]:
    """transformers 4.57.3 ``_compute_default_rope_parameters``, which 5.x removed."""
    import torch

    base = config.rope_theta
    factor = getattr(config, "partial_rotary_factor", 1.0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * factor)
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device,
                                                                        dtype=torch.float) / dim))
    return inv, 1.0


def _mask_v4_to_v5(fn: Any) -> Any:
    """A masking function of transformers 5.x called with 4.57's keyword names."""
    def wrapped(config: Any, input_embeds: Any, attention_mask: Any, cache_position: Any = None,
                past_key_values: Any = None, position_ids: Any = None, **kw: Any) -> Any:
        return fn(config=config, inputs_embeds=input_embeds, attention_mask=attention_mask,
                  cache=past_key_values, position_ids=position_ids, **kw)
    return wrapped


@contextlib.contextmanager
def _decorator_compat() -> Iterator[None]:
    """During the import only: ``check_model_inputs()`` as 4.57 wrote it, under 5.x."""
    from transformers.utils import generic

    orig = generic.check_model_inputs

    def check_model_inputs(func: Any = None, *args: Any, **kw: Any) -> Any:
        if callable(func):
            return orig(func)
        return lambda f: orig(f)

    generic.check_model_inputs = check_model_inputs
    try:
        yield
    finally:
        generic.check_model_inputs = orig


def _load() -> tuple[Any, Any]:
    """(configuration module, modeling module) of qwen-tts's 12 Hz tokenizer, without its package."""
    conf_name = f"{_PKG}.configuration_qwen3_tts_tokenizer_v2"
    model_name = f"{_PKG}.modeling_qwen3_tts_tokenizer_v2"
    if model_name in sys.modules:
        return sys.modules[conf_name], sys.modules[model_name]
    import transformers

    spec = importlib.util.find_spec("qwen_tts")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("qwen-tts is not installed (see /work/notes/install-mimi-qwen3.sh)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "core" / "tokenizer_12hz"
    pkg = types.ModuleType(_PKG)
    pkg.__path__ = [str(folder)]
    sys.modules[_PKG] = pkg
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    try:
        # transformers' auto_docstring prints "[ERROR] ... not documented" for this
        # third-party file at import: noise, not a failure
        with _decorator_compat() if v5 else contextlib.nullcontext(), \
                contextlib.redirect_stdout(io.StringIO()):
            conf = importlib.import_module(conf_name)
            mod: Any = importlib.import_module(model_name)
    except Exception:
        for name in (_PKG, conf_name, model_name):
            sys.modules.pop(name, None)
        raise
    if v5:
        mod.ROPE_INIT_FUNCTIONS = {**mod.ROPE_INIT_FUNCTIONS, "default": _default_rope}
        mod.create_causal_mask = _mask_v4_to_v5(mod.create_causal_mask)
        mod.create_sliding_window_causal_mask = _mask_v4_to_v5(
            mod.create_sliding_window_causal_mask)
    return conf, mod


def decoder_config(config: Mapping[str, Any]) -> Any:
    """``Qwen3TTSTokenizerV2DecoderConfig`` of a full (config.json-shaped) config dict."""
    conf, _ = _load()
    return conf.Qwen3TTSTokenizerV2DecoderConfig(**dict(config["decoder_config"]))


# ---------------------------------------------------------------- models

def _fan_in(name: str, w: Any) -> float:
    """Inputs summed into one output: Cin * K, or Cin * K / stride for a transposed conv."""
    parts = name.split(".")
    if parts[0] == "decoder" and parts[2:4] == ["block", "1"]:
        return float(w.shape[0] * 2)  # CausalTransConvNet(k = 2r, stride r)
    if parts[0] == "upsample" and parts[2] == "0":
        return float(w.shape[0])  # CausalTransConvNet(k = stride)
    return float(math.prod(w.shape[1:]))


def build_reference(config: Mapping[str, Any], seed: int) -> Any:
    """``Qwen3TTSTokenizerV2Decoder`` in eval mode, every parameter seeded and off its init.

    The package's init leaves SnakeBeta at alpha = beta = 0 (exp -> 1), RMSNorm
    and LayerNorm at (1, 0), LayerScale at 0.01, ConvNeXt gamma at 1e-6, zero
    biases, codebooks at zero, and N(0, 0.02) weights that shrink the signal
    through the deep stack. Here: conv/linear weights N(0, 1 / fan_in)
    (variance preserving), biases N(0, 0.02); SnakeBeta alpha, beta
    N(0, 0.3) (log scale); norm gains U(0.7, 1.3), LayerNorm biases N(0, 0.05);
    LayerScale U(0.05, 0.25); ConvNeXt gamma U(0.1, 0.5); codebooks as in
    ``mimi.py`` (centroids N(0, 1), usage U(0.5, 2), ~3% of the codes at usage
    1e-8 below the clamp eps 1e-5). Last, the convs after the transformer are
    rescaled on seeded random codes so that activations stay O(1) and the
    output's std is 0.2 (``_calibrate``). The model carries its config dict as
    ``model.codecd_config``.
    """
    import torch

    _, mod = _load()
    torch.manual_seed(seed)
    model = mod.Qwen3TTSTokenizerV2Decoder(decoder_config(config)).eval()
    gen = torch.Generator().manual_seed(seed + 1)

    def u(shape: Any, lo: float, hi: float) -> Any:
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape: Any, scale: float) -> Any:
        return scale * torch.randn(shape, generator=gen)

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("cluster_usage"):
                usage = u(p.shape, 0.5, 2.0)
                low = torch.randperm(p.shape[0], generator=gen)[:max(1, math.ceil(0.03 * p.shape[0]))]
                usage[low] = 1e-8
                p.copy_(usage)
                emb = params[name[: -len("cluster_usage")] + "embedding_sum"]
                emb.copy_(n(emb.shape, 1.0) * usage.clamp(min=1e-5)[:, None])
            elif name.endswith("embedding_sum"):
                continue
            elif name.endswith((".alpha", ".beta")):
                p.copy_(n(p.shape, 0.3))
            elif name.endswith(".gamma"):
                p.copy_(u(p.shape, 0.1, 0.5))
            elif name.endswith(".scale"):
                p.copy_(u(p.shape, 0.05, 0.25))
            elif p.dim() == 1 and ("norm" in name.split(".")[-2]):
                p.copy_(u(p.shape, 0.7, 1.3) if name.endswith("weight") else n(p.shape, 0.05))
            elif name.endswith(".bias"):
                p.copy_(n(p.shape, 0.02))
            else:
                p.copy_(n(p.shape, 1.0) / math.sqrt(_fan_in(name, p)))
        _calibrate(model, config, seed)
    model.codecd_config = json.loads(json.dumps(dict(config)))
    return model


def _calibrate(model: Any, config: Mapping[str, Any], seed: int) -> None:
    """Rescale every conv after the transformer so that activations stay O(1).

    One forward pass on seeded random codes; a hook on each conv (in execution
    order, so each sees its input already rescaled) scales its weight and bias
    so that its output has a set std: 1 on the main path, 0.5 for the output of
    a residual unit's branch, 0.2 for the final conv (the decoder clamps to
    [-1, 1]; saturated samples would hide errors). Random weights without this
    grow the activations block by block; then SnakeBeta's sin(alpha x) turns
    f32 rounding into errors of 1e-4 relative at the output, and no f32 port
    could be held to a 1e-4 tolerance.
    """
    import torch
    from torch import nn

    targets: dict[Any, float] = {}
    for name, m in model.named_modules():
        if not isinstance(m, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)):
            continue
        if name.startswith("pre_transformer.") or name.startswith("quantizer."):
            continue
        if name.endswith("conv2.conv"):
            targets[m] = 0.5
        else:
            targets[m] = 1.0
    targets[model.decoder[-1].conv] = 0.2

    def hook(m: Any, inputs: Any, out: Any) -> Any:
        scale = targets[m] / float(out.std())
        m.weight.mul_(scale)
        if m.bias is not None:
            m.bias.mul_(scale)
        return out * scale

    hooks = [m.register_forward_hook(hook) for m in targets]
    codes = random_codes(config, 8, config["decoder_config"]["num_quantizers"],
                         np.random.default_rng(seed + 2))
    try:
        with torch.no_grad():
            model(torch.as_tensor(codes[None].astype(np.int64)))
    finally:
        for h in hooks:
            h.remove()


def encoder_state(config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Random ``encoder.*`` tensors under the release's names and shapes (not decoded by us).

    The release's encoder is ``Qwen3TTSTokenizerV2Encoder``: a transformers-4.x
    ``MimiModel`` without ``upsample``, ``decoder_transformer`` and
    ``decoder``, saved with 4.x's flat names (``encoder.encoder.layers.N``,
    ``encoder.encoder_transformer``, ``encoder.downsample``,
    ``encoder.quantizer``). Built here from a transformers ``MimiModel`` whose
    decoder half is dropped, renamed to those names. (qwen-tts's own encoder
    class does not build under transformers 5: it assigns ``None`` to
    ``MimiModel`` attributes that 5.x made read-only properties.)
    """
    import torch
    from transformers import MimiConfig, MimiModel

    from . import mimi

    enc = dict(config["encoder_config"])
    enc.pop("frame_rate", None)
    enc["rope_parameters"] = {"rope_type": "default", "rope_theta": enc.pop("rope_theta")}
    mc = MimiConfig(**enc)
    mc.decoder_config = None
    torch.manual_seed(seed + 3)
    m = MimiModel(mc)
    flat = mimi.hf5_to_flat(m.state_dict())
    return {"encoder." + k: v.detach().clone().float().contiguous() for k, v in flat.items()}


def save_released_layout(model: Any, folder: str | Path, encoder_seed: int = 0,
                         with_encoder: bool = True) -> Path:
    """Write the released folder: config.json, configuration.json, preprocessor_config.json,
    model.safetensors (``decoder.*`` from ``model``; ``encoder.*`` random, see
    ``encoder_state``; ``with_encoder=False`` leaves them out). Returns the folder.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.codecd_config
    sd = {"decoder." + k: v.detach().clone().float().contiguous()
          for k, v in model.state_dict().items()}
    if with_encoder:
        sd.update(encoder_state(config, encoder_seed))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    # ModelScope metadata; not read by transformers or by a decoder
    (folder / "configuration.json").write_text(json.dumps({"framework": "pytorch"}))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def load_released(folder: str | Path) -> Any:
    """The decoder of a released-layout folder (strict load of the ``decoder.*`` tensors)."""
    from safetensors.torch import load_file

    _, mod = _load()
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    model = mod.Qwen3TTSTokenizerV2Decoder(decoder_config(config)).eval()
    sd = {k[len("decoder."):]: v for k, v in load_file(str(folder / "model.safetensors")).items()
          if k.startswith("decoder.")}
    model.load_state_dict(sd, strict=True)
    model.codecd_config = config
    return model


# ---------------------------------------------------------------- decoding

def _codes_tensor(codes: np.ndarray) -> tuple[Any, bool]:
    import torch

    a = np.asarray(codes)
    if a.ndim not in (2, 3):
        raise ValueError(f"codes must be [16, T] or [B, 16, T], got shape {a.shape}")
    one = a.ndim == 2
    return torch.as_tensor((a[None] if one else a).astype(np.int64)), one


def reference_decode(model: Any, codes: np.ndarray) -> np.ndarray:
    """The exact causal decode, ``Qwen3TTSTokenizerV2Decoder.forward``: float32 ``[samples]``
    or ``[B, samples]``, T * 1920 samples, clamped to [-1, 1] as the reference does.

    ``codes``: int ``[16, T]`` or ``[B, 16, T]``; the reference accepts exactly
    ``num_quantizers`` (16) codebooks and raises otherwise. This is not what
    ``Qwen3TTSTokenizerV2Model.decode`` returns past 300 frames: that one calls
    ``chunked_decode`` (``reference_decode_chunked``).
    """
    import torch

    x, one = _codes_tensor(codes)
    with torch.inference_mode():
        y = model(x)
    y = y[:, 0, :].float().numpy()
    return np.asarray(y[0] if one else y, dtype=np.float32)


def reference_decode_chunked(model: Any, codes: np.ndarray, chunk_size: int = 300,
                             left_context_size: int = 25) -> np.ndarray:
    """What ``Qwen3TTSTokenizer.decode`` / ``Qwen3TTSTokenizerV2Model.decode`` run:
    ``decoder.chunked_decode``: chunks of 300 frames, each decoded from scratch
    with 25 frames of left context. Equal to ``reference_decode`` up to 300
    frames (24 s); past that an approximation of it.
    """
    import torch

    x, one = _codes_tensor(codes)
    with torch.inference_mode():
        y = model.chunked_decode(x, chunk_size=chunk_size, left_context_size=left_context_size)
    y = y[:, 0, :].float().numpy()
    return np.asarray(y[0] if one else y, dtype=np.float32)


def reference_stream(model: Any, codes: np.ndarray, chunking: int | Sequence[int] = 1,
                     ) -> np.ndarray:
    """Streamed decode by prefix recomputation: after each chunk, decode all frames so far
    and emit the samples of the new frames. qwen-tts has no streaming decoder API;
    this is what an exact streamer must equal, because the decoder is causal
    (left-padded convs, right-trimmed transposed convs, causal sliding-window
    attention). Cost grows with the square of the length: keep streams short.
    """
    import torch

    x, one = _codes_tensor(codes)
    total = x.shape[-1]
    if isinstance(chunking, int):
        sizes = [chunking] * (total // chunking) + ([total % chunking] if total % chunking else [])
    else:
        sizes = [int(c) for c in chunking]
    if sum(sizes) != total or min(sizes) <= 0:
        raise ValueError(f"chunk sizes {sizes} do not cover {total} frames")
    outs, t = [], 0
    with torch.inference_mode():
        for c in sizes:
            y = model(x[:, :, :t + c])[:, 0, t * FRAME_SAMPLES:(t + c) * FRAME_SAMPLES]
            outs.append(y.float().numpy())
            t += c
    y = np.concatenate(outs, axis=-1)
    return np.asarray(y[0] if one else y, dtype=np.float32)


def random_codes(config: Mapping[str, Any], n_frames: int, n_codebooks: int,
                 rng: np.random.Generator, batch: int | None = None) -> np.ndarray:
    """Uniform random codes, int32 ``[K, T]`` or ``[B, K, T]`` (the reference needs K = 16)."""
    dec = config["decoder_config"]
    if not 1 <= n_codebooks <= dec["num_quantizers"]:
        raise ValueError(f"n_codebooks must be in 1..{dec['num_quantizers']}")
    shape = (n_codebooks, n_frames) if batch is None else (batch, n_codebooks, n_frames)
    return rng.integers(0, dec["codebook_size"], size=shape).astype(np.int32)
