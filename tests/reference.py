"""Reference helpers for the tests: random SNAC models with non-trivial weights,
the released checkpoint layout, a noise-free reference decode, random codes.

Everything that needs torch/snac imports them inside the function, so that the
module itself imports with numpy alone (``random_codes`` needs only numpy).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

SNAC_24KHZ = {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8],
              "decoder_dim": 1024, "decoder_rates": [8, 8, 4, 2], "attn_window_size": None,
              "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1],
              "noise": True, "depthwise": True}
SNAC_32KHZ = {"sampling_rate": 32000, "encoder_dim": 64, "encoder_rates": [2, 3, 8, 8],
              "decoder_dim": 1536, "decoder_rates": [8, 8, 3, 2], "attn_window_size": 32,
              "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [8, 4, 2, 1],
              "noise": True, "depthwise": True}
SNAC_44KHZ = dict(SNAC_32KHZ, sampling_rate=44100)
#: the 24 kHz layout scaled down (same code paths, ~1/200 of the compute) for the
#: tests that loop thousands of decodes
SNAC_TINY = {"sampling_rate": 24000, "encoder_dim": 8, "encoder_rates": [2, 4, 8, 8],
             "decoder_dim": 64, "decoder_rates": [8, 8, 4, 2], "attn_window_size": None,
             "codebook_size": 4096, "codebook_dim": 8, "vq_strides": [4, 2, 1],
             "noise": True, "depthwise": True}
CONFIGS = {"24khz": SNAC_24KHZ, "32khz": SNAC_32KHZ, "44khz": SNAC_44KHZ, "tiny": SNAC_TINY}


def build_reference_snac(config: Mapping[str, Any], seed: int):
    """A ``snac.SNAC`` in eval mode with seeded random weights that are not at their defaults.

    SNAC's own init leaves Snake alpha = 1, weight-norm g = ||v|| (so folding
    would be a no-op), zero biases and LayerNorm at (1, 0): every parameter is
    perturbed so that a wrong mapping, transpose or fold cannot go unnoticed.
    Alphas become uniform(0.5, 1.5); g becomes ||v|| * uniform(0.5, 1.5) per
    output channel; everything else gets multiplicative and additive noise.
    """
    import torch
    from snac import SNAC

    torch.manual_seed(seed)
    model = SNAC(**dict(config))
    gen = torch.Generator().manual_seed(seed + 1)

    def u(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape, scale):
        return scale * torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".alpha"):
                p.copy_(u(p.shape, 0.5, 1.5))
            elif name.endswith("parametrizations.weight.original0"):
                v = dict(model.named_parameters())[name[:-1] + "1"]
                norm = v.reshape(v.shape[0], -1).norm(dim=1).reshape(p.shape)
                p.copy_(norm * u(p.shape, 0.5, 1.5))
            elif name.endswith("parametrizations.weight.original1"):
                p.mul_(1 + n(p.shape, 0.2)).add_(n(p.shape, 0.02 * float(p.std())))
            elif name.endswith(".bias"):
                p.add_(n(p.shape, 0.05))
            elif name.endswith("norm.weight"):
                p.copy_(u(p.shape, 0.7, 1.3))
            elif name.endswith("codebook.weight"):
                p.mul_(1 + n(p.shape, 0.1)).add_(n(p.shape, 0.1))
            else:  # attention projections
                p.mul_(1 + n(p.shape, 0.2)).add_(n(p.shape, 0.02 * float(p.std())))
    model.eval()
    return model


def save_released_layout(model, config: Mapping[str, Any], folder) -> Path:
    """Write ``config.json`` + ``pytorch_model.bin`` as the HF release does; returns the folder.

    The state dict is ``model.state_dict()``: weight norm stays unfolded
    (``parametrizations.weight.original0/1``), the keys ``SNAC.load_state_dict``
    and ``SNAC.from_pretrained(folder)`` expect.
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2))
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def to_old_weight_norm_keys(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The same state dict with pre-parametrization keys (``weight_g`` / ``weight_v``)."""
    out = {}
    for k, v in state_dict.items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        k = k.replace(".parametrizations.weight.original1", ".weight_v")
        out[k] = v
    return out


@contextlib.contextmanager
def noise_disabled():
    """Patch ``snac.layers.NoiseBlock.forward`` so that the noise term is exactly zero."""
    from snac import layers

    orig = layers.NoiseBlock.forward
    layers.NoiseBlock.forward = lambda self, x: x
    try:
        yield
    finally:
        layers.NoiseBlock.forward = orig


def reference_decode(model, levels: Sequence[np.ndarray], noise: bool = False) -> np.ndarray:
    """Decode code levels with snac itself; float32 ``[samples]`` (1-D levels) or ``[B, samples]``.

    With ``noise=False`` (the default) NoiseBlock adds nothing, which is what
    the runtime's ``noise=False`` must reproduce.
    """
    import torch

    one = np.asarray(levels[0]).ndim == 1
    codes = [torch.as_tensor(np.atleast_2d(np.asarray(l, dtype=np.int64))) for l in levels]
    cm = contextlib.nullcontext() if noise else noise_disabled()
    with cm, torch.inference_mode():
        y = model.decode(codes)
    y = y[:, 0, :].float().numpy()
    return y[0] if one else y


def _get(info: Any, key: str):
    if isinstance(info, Mapping):
        return info[key]
    return getattr(info, key)


def frame_multiple(config: Mapping[str, Any]) -> int:
    """Frames per decode must be a multiple of this (coarsest stride, attention window)."""
    return math.lcm(max(config["vq_strides"]), config.get("attn_window_size") or 1)


def random_codes(info_or_config: Any, n_frames: int, batch: int | None, rng: np.random.Generator):
    """Random valid codes for ``n_frames`` finest frames: one int32 array per level.

    ``info_or_config``: a codecrt ``Model.info`` (object or dict with
    codebook_sizes, level_strides, frame_multiple) or a SNAC config dict.
    ``batch=None`` gives 1-D levels, else ``[batch, n_frames // stride]``.
    """
    if isinstance(info_or_config, Mapping) and "vq_strides" in info_or_config:
        strides = list(info_or_config["vq_strides"])
        sizes = [info_or_config["codebook_size"]] * len(strides)
        mult = frame_multiple(info_or_config)
    else:
        strides = list(_get(info_or_config, "level_strides"))
        sizes = list(_get(info_or_config, "codebook_sizes"))
        mult = int(_get(info_or_config, "frame_multiple"))
    if n_frames <= 0 or n_frames % mult:
        raise ValueError(f"n_frames {n_frames} must be a positive multiple of {mult}")
    out = []
    for s, nc in zip(strides, sizes):
        shape = (n_frames // s,) if batch is None else (batch, n_frames // s)
        out.append(rng.integers(0, nc, size=shape, dtype=np.int64).astype(np.int32))
    return out


# ------------------------------------------------------------------------------
# A plain-numpy decoder that reads only the GGUF file, written from
# docs/gguf-format.md. Agreement with snac's own decode proves the converter and
# the doc's layouts (not just the converter's internal consistency).


def read_gguf(path) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, tuple[list[int], str]]]:
    """(metadata, tensors as float32 numpy arrays, {name: (ggml shape, type name)}) of a GGUF file."""
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors, meta = {}, {}
    for t in r.tensors:
        tensors[t.name] = np.array(t.data, dtype=np.float32)
        meta[t.name] = ([int(x) for x in t.shape], t.tensor_type.name)
    return kv, tensors, meta


def _snake(x, w, pfx):
    return x + w[pfx + ".inv_alpha"][:, None] * np.sin(w[pfx + ".alpha"][:, None] * x) ** 2


def _dwconv(x, wk, b, dilation):
    k = wk.shape[0]  # numpy (K, C)
    pad = (k - 1) * dilation // 2
    xp = np.pad(x, ((0, 0), (pad, pad)))
    t = x.shape[1]
    y = np.zeros_like(x) + b[:, None]
    for j in range(k):
        y += wk[j][:, None] * xp[:, j * dilation: j * dilation + t]
    return y


def _attention(x, w, window):
    d, t = x.shape
    dh = 64
    h = d // dh
    xt = x.T.astype(np.float64)
    mu = xt.mean(-1, keepdims=True)
    var = ((xt - mu) ** 2).mean(-1, keepdims=True)
    xn = (xt - mu) / np.sqrt(var + 1e-5) * w["decoder.attn.norm.weight"] + w["decoder.attn.norm.bias"]
    qkv = xn @ w["decoder.attn.qkv.weight"].T  # (T, 3D)
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(t // window, window, h, dh).transpose(0, 2, 1, 3)
               for i in range(3))
    inv = 1.0 / (10000 ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
    fr = np.arange(window, dtype=np.float32)[:, None] * inv[None, :]
    fr = np.concatenate([fr, fr], -1)

    def rot(a):
        a1, a2 = a[..., :dh // 2], a[..., dh // 2:]
        return np.concatenate([-a2, a1], -1)

    q = q * np.cos(fr) + rot(q) * np.sin(fr)
    k = k * np.cos(fr) + rot(k) * np.sin(fr)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = (s @ v).transpose(0, 2, 1, 3).reshape(t, d)
    return (o @ w["decoder.attn.out.weight"].T).T + x


def numpy_decode_gguf(path, levels: Sequence[np.ndarray]) -> np.ndarray:
    """Noise-free decode of one sequence (1-D levels) from the GGUF file alone; float32 [samples]."""
    kv, w, _ = read_gguf(path)
    strides = kv["snac.vq_strides"]
    z = 0.0
    for l, codes in enumerate(levels):
        e = w[f"quantizer.{l}.codebook"][np.asarray(codes)]                  # (T_l, H)
        zl = w[f"quantizer.{l}.out_proj.weight"] @ e.T + w[f"quantizer.{l}.out_proj.bias"][:, None]
        z = z + np.repeat(zl, strides[l], axis=1)
    x = _dwconv(z, w["decoder.in_dw.weight"], w["decoder.in_dw.bias"], 1)
    x = w["decoder.in_pw.weight"] @ x + w["decoder.in_pw.bias"][:, None]
    if kv["snac.attn_window_size"]:
        x = _attention(x, w, kv["snac.attn_window_size"])
    for i, s in enumerate(kv["snac.decoder_rates"]):
        p = f"decoder.block.{i}"
        x = _snake(x, w, p + ".snake")
        up = w[p + ".up.weight"]
        cout = up.shape[0] // (2 * s)
        y = (up @ x).reshape(2 * s, cout, -1)                               # (K, Cout, T)
        t = x.shape[1]
        full = np.zeros((cout, (t - 1) * s + 2 * s))
        for k in range(2 * s):
            full[:, k: k + (t - 1) * s + 1: s] += y[k]
        pad = math.ceil(s / 2)
        x = full[:, pad: pad + t * s] + w[p + ".up.bias"][:, None]
        for j in range(3):
            r = f"{p}.res.{j}"
            yr = _snake(x, w, r + ".snake1")
            yr = _dwconv(yr, w[r + ".dw.weight"], w[r + ".dw.bias"], 3 ** j)
            yr = _snake(yr, w, r + ".snake2")
            x = x + w[r + ".pw.weight"] @ yr + w[r + ".pw.bias"][:, None]
    x = _snake(x, w, "decoder.out_snake")
    wo = w["decoder.out.weight"]                                             # (7, C)
    xp = np.pad(x, ((0, 0), (3, 3)))
    t = x.shape[1]
    y = np.full(t, w["decoder.out.bias"][0], dtype=np.float64)
    for k in range(7):
        y += wo[k] @ xp[:, k: k + t]
    return np.tanh(y).astype(np.float32)
