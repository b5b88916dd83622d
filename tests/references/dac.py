"""DAC (descript-audio-codec 1.0.0) reference for the parity tests.

The ground truth is the ``dac`` package itself (``dac.DAC``), installed by
``.ci/install-references`` with ``--no-deps``. Everything that needs torch or
dac imports it inside the function, so this module imports with numpy alone.

Released checkpoints are ``.pth`` files written by audiotools'
``BaseModel.save(path, package=False)``: ``{"state_dict": ..., "metadata":
{"kwargs": {...}}}`` with old-style weight norm (``weight_g`` / ``weight_v``),
which is exactly what :func:`save_released_layout` writes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

_COMMON = {"encoder_dim": 64, "latent_dim": 1024, "decoder_dim": 1536,
           "codebook_size": 1024, "codebook_dim": 8, "quantizer_dropout": False}

#: descript 44 kHz 8 kbps (release tag 0.0.1, weights.pth): hop 512, 86.13 frames/s
DAC_44KHZ = dict(_COMMON, encoder_rates=[2, 4, 8, 8], decoder_rates=[8, 8, 4, 2],
                 n_codebooks=9, sample_rate=44100)
#: descript 24 kHz 8 kbps (tag 0.0.4, weights_24khz.pth): hop 320, 75 frames/s
DAC_24KHZ = dict(_COMMON, encoder_rates=[2, 4, 5, 8], decoder_rates=[8, 5, 4, 2],
                 n_codebooks=32, sample_rate=24000)
#: descript 16 kHz 6 kbps (tag 0.0.5, weights_16khz.pth): hop 320, 50 frames/s
DAC_16KHZ = dict(_COMMON, encoder_rates=[2, 4, 5, 8], decoder_rates=[8, 5, 4, 2],
                 n_codebooks=12, sample_rate=16000)
#: IBM DAC.speech.v1.0 weights_24khz_1.5kbps_v1.0.pth (OuteTTS 1.0): the 24 kHz
#: architecture with 2 codebooks (75 Hz x 2 x 10 bit = 1.5 kbps). Inferred, not
#: read from the file: see /work/notes/dac.md.
DAC_IBM_SPEECH_24KHZ = dict(DAC_24KHZ, n_codebooks=2)
#: the 24 kHz layout scaled down (same code paths incl. the odd stride 5, the
#: weight norm and Snake everywhere; ~1/2000 of the compute) for fast tests
DAC_TINY = {"encoder_dim": 4, "encoder_rates": [2, 4, 5, 8], "latent_dim": 32,
            "decoder_dim": 32, "decoder_rates": [8, 5, 4, 2], "n_codebooks": 4,
            "codebook_size": 1024, "codebook_dim": 8, "quantizer_dropout": False,
            "sample_rate": 24000}
CONFIGS: dict[str, dict[str, Any]] = {
    "44khz": DAC_44KHZ, "24khz": DAC_24KHZ, "16khz": DAC_16KHZ,
    "ibm_speech_24khz": DAC_IBM_SPEECH_24KHZ, "tiny": DAC_TINY,
}


def hop_length(config: Mapping[str, Any]) -> int:
    return math.prod(config["decoder_rates"])


def output_length(config: Mapping[str, Any], n_frames: int) -> int:
    """Samples that ``DAC.decode`` returns for ``n_frames`` frames (padding on).

    Each transposed conv (kernel 2s, stride s, padding ceil(s/2)) maps L to
    (L-1)*s - 2*ceil(s/2) + 2s = s*L + (s - 2*ceil(s/2)): s*L for even s,
    s*L - 1 for odd s. The k7 convs keep the length.
    """
    n = n_frames
    for s in config["decoder_rates"]:
        n = (n - 1) * s - 2 * math.ceil(s / 2) + 2 * s
    return n


def _depends_on(config: Mapping[str, Any], a: int, b: int) -> tuple[int, int]:
    """Code frames [lo, hi] that output samples [a, b] depend on (no edges: infinite signal).

    Walks ``dac.model.dac.Decoder`` backwards: the final k7 conv, then per
    DecoderBlock (last first) the three residual units (k7, dilation 9, 3, 1;
    the 1x1 adds nothing) and the transposed conv (out[n] = sum of in[i]*w[k]
    over n + p = i*s + k, 0 <= k < 2s, p = ceil(s/2)), then the first k7 conv
    on the latent. Checked against autograd on the reference.
    """
    a, b = a - 3, b + 3
    for s in reversed(config["decoder_rates"]):
        for d in (9, 3, 1):
            a, b = a - 3 * d, b + 3 * d
        p = math.ceil(s / 2)
        a, b = -((-(a + p - (2 * s - 1))) // s), (b + p) // s
    return a - 3, b + 3


def receptive_field(config: Mapping[str, Any]) -> dict[str, int]:
    """The decoder's exact (structural) dependence of output samples on code frames.

    ``left`` / ``right``: to produce the samples of frame f (``[f*hop,
    (f+1)*hop)``) exactly, code frames ``[f - left, f + right]`` are needed.
    ``before`` / ``after``: one code frame j changes samples
    ``[j*hop - before, (j+1)*hop - 1 + after]``. Structural: taps at the far
    edge contribute products of many small weights, so a perturbation in f32
    (or even f64) sees a slightly narrower span (dac.md).
    """
    hop = hop_length(config)
    f0 = 64
    lo, _ = _depends_on(config, f0 * hop, f0 * hop)
    _, hi = _depends_on(config, (f0 + 1) * hop - 1, (f0 + 1) * hop - 1)
    first = next(n for n in range((f0 - 64) * hop, f0 * hop) if _depends_on(config, n, n)[1] >= f0)
    last = next(n for n in range((f0 + 64) * hop, f0 * hop, -1) if _depends_on(config, n, n)[0] <= f0)
    return {"left": f0 - lo, "right": hi - f0,
            "before": f0 * hop - first, "after": last - ((f0 + 1) * hop - 1)}


def build_reference(config: Mapping[str, Any], seed: int):
    """A ``dac.DAC`` in eval mode with seeded random weights that are not at their defaults.

    DAC's own init leaves Snake alpha = 1, weight-norm g = ||v|| (folding would
    be a no-op) and zero conv biases. Here alphas become uniform(0.5, 1.5), g
    becomes ||v|| * uniform(0.5, 1.5) per output channel (input channel for the
    transposed convs: weight norm is over dim 0), v, biases and codebooks get
    noise. The encoder is perturbed too (it is in the released file).
    """
    import torch
    import dac

    torch.manual_seed(seed)
    model = dac.DAC(**dict(config))
    gen = torch.Generator().manual_seed(seed + 1)

    def u(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape, scale):
        return scale * torch.randn(shape, generator=gen)

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith(".alpha"):
                p.copy_(u(p.shape, 0.5, 1.5))
            elif name.endswith(".weight_v"):
                p.mul_(1 + n(p.shape, 0.2)).add_(n(p.shape, 0.02 * float(p.std())))
        for name, p in params.items():
            if name.endswith(".weight_g"):
                v = params[name[:-1] + "v"]
                norm = v.reshape(v.shape[0], -1).norm(dim=1).reshape(p.shape)
                p.copy_(norm * u(p.shape, 0.5, 1.5))
            elif name.endswith(".bias"):
                p.add_(n(p.shape, 0.05))
            elif name.endswith("codebook.weight"):
                p.mul_(1 + n(p.shape, 0.1)).add_(n(p.shape, 0.1))
    model.eval()
    return model


def save_released_layout(model, folder, name: str = "weights.pth") -> Path:
    """Write the model as descript / IBM release it; returns the file path.

    ``model.save(path, package=False)`` is audiotools' own writer: a dict with
    ``state_dict`` (``weight_g`` / ``weight_v`` keys, encoder + quantizer +
    decoder) and ``metadata = {"kwargs": {...}}`` (the constructor arguments;
    ``quantizer_dropout`` is always the signature default False, since DAC
    keeps no attribute of that name). ``dac.DAC.load(path)`` reads it back.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    model.save(str(path), package=False)
    return path


def reference_decode(model, codes: np.ndarray) -> np.ndarray:
    """Decode ``[n_q, T]`` (or ``[B, n_q, T]``) codes with dac itself; float32 ``[samples]`` / ``[B, samples]``.

    The path OuteTTS 1.0 uses (``DacInterface.decode``) without its chunking
    (2048 frames), 15 ms fades and loudness normalisation:
    ``model.decode(model.quantizer.from_codes(codes)[0])``. ``n_q`` may be less
    than the model's ``n_codebooks`` (the first n_q quantizers are used).
    """
    import torch

    c = np.asarray(codes)
    one = c.ndim == 2
    t = torch.as_tensor(np.atleast_3d(c[None] if one else c).astype(np.int64))
    with torch.inference_mode():
        z = model.quantizer.from_codes(t)[0]
        y = model.decode(z)
    y = y[:, 0, :].float().numpy()
    return y[0] if one else y


def random_codes(config: Mapping[str, Any], n_frames: int, rng: np.random.Generator,
                 n_codebooks: int | None = None, batch: int | None = None) -> np.ndarray:
    """Random valid codes: int32 ``[n_q, n_frames]`` (``[batch, n_q, n_frames]`` with ``batch``)."""
    nq = config["n_codebooks"] if n_codebooks is None else n_codebooks
    if not 1 <= nq <= config["n_codebooks"]:
        raise ValueError(f"n_codebooks {nq} not in 1..{config['n_codebooks']}")
    if n_frames <= 0:
        raise ValueError("n_frames must be positive")
    shape = (nq, n_frames) if batch is None else (batch, nq, n_frames)
    return rng.integers(0, config["codebook_size"], size=shape).astype(np.int32)
