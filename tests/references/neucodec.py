"""NeuCodec (neucodec 0.0.6) decoder reference, and NeuTTS' windowed streaming.

The ground truth is the neucodec package's own decoder
(``neucodec.codec_decoder_vocos.CodecDecoderVocos``), its ``fc_post_a``
Linear, and ``NeuCodec.decode_code`` (the method NeuTTS calls), run on a
holder module with exactly the released key names (``generator.*``,
``fc_post_a.*``). ``NeuCodec(...)`` itself cannot be built offline (its
``__init__`` downloads w2v-bert-2.0), hence the holder.

torchtune (needed only for ``RotaryPositionalEmbeddings``) imports
``datasets`` and half of the fine-tuning stack in its package ``__init__``;
:func:`import_torchtune_rope` loads torchtune's own
``modules/position_embeddings.py`` without that ``__init__`` (torchtune is
installed with ``--no-deps``). The RoPE is a numerical no-op here anyway: it
is applied to ``[B, H, T, D]`` tensors, so its "position" is the head index
and q and k of a head get the same rotation.

Everything that needs torch imports it inside the function, so this module
imports with numpy alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

#: neuphonic/neucodec and neuphonic/distill-neucodec (the same decoder): 50 Hz
#: FSQ codes (levels [4]*8 = 65536) -> 24 kHz, hop 480, n_fft 1920
NEUCODEC_24KHZ = {"hidden_dim": 1024, "depth": 12, "heads": 16, "pos_meb_dim": 64,
                  "hop_length": 480, "vq_dim": 2048, "sample_rate": 24000}
#: same code paths (GroupNorm 32 groups, RoPE dim == head dim, hop 480 head),
#: ~1/300 of the compute
NEUCODEC_TINY = {"hidden_dim": 64, "depth": 2, "heads": 4, "pos_meb_dim": 16,
                 "hop_length": 480, "vq_dim": 32, "sample_rate": 24000}
CONFIGS: dict[str, dict[str, Any]] = {"24khz": NEUCODEC_24KHZ, "tiny": NEUCODEC_TINY}

FSQ_LEVELS = (4, 4, 4, 4, 4, 4, 4, 4)
CODEBOOK_SIZE = 4 ** 8

#: NeuTTS' streaming defaults (neutts/neutts.py, NeuTTS.__init__)
NEUTTS_CHUNK, NEUTTS_LOOKBACK, NEUTTS_LOOKFORWARD, NEUTTS_OVERLAP = 25, 50, 5, 1


def import_torchtune_rope():
    """torchtune's ``RotaryPositionalEmbeddings`` class, importable by ``from torchtune.modules import ...``.

    If ``torchtune.modules`` is not imported yet, registers empty package
    modules ``torchtune`` and ``torchtune.modules`` (pointing at the installed
    package's folders) and executes only ``torchtune/modules/position_embeddings.py``.
    """
    mod = sys.modules.get("torchtune.modules")
    if mod is not None and hasattr(mod, "RotaryPositionalEmbeddings"):
        return mod.RotaryPositionalEmbeddings
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchtune is not installed (see .ci/install-references)")
    root = Path(list(spec.submodule_search_locations)[0])
    for name, path in (("torchtune", root), ("torchtune.modules", root / "modules")):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(path)]
            sys.modules[name] = pkg
    pe = importlib.import_module("torchtune.modules.position_embeddings")
    sys.modules["torchtune.modules"].RotaryPositionalEmbeddings = pe.RotaryPositionalEmbeddings
    return pe.RotaryPositionalEmbeddings


def perturb_vocos_decoder_(model, seed: int) -> None:
    """Move every parameter of a generator (+ fc_post_a) holder away from its init, in place.

    Init leaves GroupNorm / LayerNorm / RMSNorm at (1, 0), zero conv biases
    (``init_weights``) and small weights: norms get uniform(0.7, 1.3) scales
    and N(0, 0.1) shifts, biases N(0, 0.05) offsets, weights a relative
    N(0, 0.2) factor plus noise.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def u(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape, scale):
        return scale * torch.randn(shape, generator=gen)

    norms = (".norm1.", ".norm2.", "final_layer_norm.", "att_norm.", "ffn_norm.")
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = any(k in name for k in norms)
            if is_norm and name.endswith(".weight"):
                p.copy_(u(p.shape, 0.7, 1.3))
            elif is_norm and name.endswith(".bias"):
                p.add_(n(p.shape, 0.1))
            elif name.endswith(".bias"):
                p.add_(n(p.shape, 0.05))
            else:
                p.mul_(1 + n(p.shape, 0.2)).add_(n(p.shape, 0.02 * float(p.std())))


def _holder_class(decode_code: Callable, name: str):
    import torch

    return type(name, (torch.nn.Module,), {
        "decode_code": decode_code,
        "device": property(lambda self: next(self.parameters()).device),
        "__doc__": "generator + fc_post_a, the released key layout; decode_code is upstream's method",
    })


def build_reference(config: Mapping[str, Any], seed: int):
    """NeuCodec's decoder in eval mode with seeded random weights perturbed away from their init.

    A module with ``generator`` (``neucodec.codec_decoder_vocos.CodecDecoderVocos``)
    and ``fc_post_a`` (``Linear(vq_dim, hidden_dim)``) whose ``decode_code``
    is ``neucodec.NeuCodec.decode_code`` itself.
    """
    import torch

    import_torchtune_rope()
    from neucodec import NeuCodec
    from neucodec.codec_decoder_vocos import CodecDecoderVocos

    torch.manual_seed(seed)
    model = _holder_class(NeuCodec.decode_code, "NeuCodecDecoder")()
    model.sample_rate = config["sample_rate"]
    model.hop_length = config["hop_length"]
    model.generator = CodecDecoderVocos(hidden_dim=config["hidden_dim"], depth=config["depth"],
                                        heads=config["heads"], pos_meb_dim=config["pos_meb_dim"],
                                        hop_length=config["hop_length"], vq_dim=config["vq_dim"])
    model.fc_post_a = torch.nn.Linear(config["vq_dim"], config["hidden_dim"])
    perturb_vocos_decoder_(model, seed + 1)
    model.eval()
    return model


def released_state_dict(model, decoys: bool = True, stale_weight_norm: bool = False) -> dict:
    """The state dict as neuphonic/neucodec's ``pytorch_model.bin`` has it (decoder part).

    ``model.state_dict()`` gives ``generator.*`` (incl. the persistent
    ``generator.head.istft.window`` buffer and the unused
    ``generator.quantizer.project_in.*``) and ``fc_post_a.*``. The real file
    also holds the encoder (``CodecEnc.*``, ``SemanticEncoder_module.*``,
    ``fc_prior.*``) and training-only keys (``fc_post_s.*``,
    ``SemanticDecoder_module.*``); ``decoys`` adds ``fc_prior`` and
    ``fc_post_s`` entries (shapes inferred) that a converter must ignore.
    ``stale_weight_norm`` adds ``weight_g`` / ``weight_v`` for the backbone's
    ``embed`` and ResnetBlock convs whose product does NOT equal ``.weight``:
    the HF port reports both forms in the released file and takes g/v, while
    the neucodec package (what NeuTTS runs) loads ``.weight`` and ignores g/v.
    See neucodec_xcodec2.md.
    """
    import torch

    sd = dict(model.state_dict())
    if decoys:
        vq, hid = model.fc_post_a.in_features, model.fc_post_a.out_features
        g = torch.Generator().manual_seed(7)
        sd["fc_prior.weight"] = torch.randn(vq, vq, generator=g) * 0.02
        sd["fc_prior.bias"] = torch.zeros(vq)
        sd["fc_post_s.weight"] = torch.randn(hid, vq, generator=g) * 0.02
        sd["fc_post_s.bias"] = torch.zeros(hid)
    if stale_weight_norm:
        g = torch.Generator().manual_seed(8)
        for k in list(sd):
            if k.startswith("generator.backbone.") and k.endswith(".weight") and (
                    ".embed." in k or ".conv1." in k or ".conv2." in k):
                w = sd[k]
                v = w * (1 + 0.3 * torch.randn(w.shape, generator=g))
                sd[k + "_v"] = v
                sd[k + "_g"] = v.reshape(v.shape[0], -1).norm(dim=1).reshape(-1, 1, 1) * 1.1
    return sd


def save_released_layout(model, folder, decoys: bool = True, stale_weight_norm: bool = False) -> Path:
    """Write ``pytorch_model.bin`` (a bare state dict, ``torch.save``) as neuphonic/neucodec has it.

    The release has no config.json (only a download-counting ``meta.yaml``):
    the architecture is fixed in code (``NeuCodec(24000, 480)``).
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pytorch_model.bin"
    torch.save(released_state_dict(model, decoys, stale_weight_norm), path)
    return path


def reference_decode(model, codes: np.ndarray) -> np.ndarray:
    """Decode ``[T]`` (or ``[B, T]``) FSQ indices with upstream's ``decode_code``; float32 ``[samples]`` / ``[B, samples]``.

    ``decode_code`` takes ``[B, 1, T]`` and returns ``[B, 1, T * hop]``.
    """
    import torch

    c = np.asarray(codes)
    one = c.ndim == 1
    t = torch.as_tensor(np.atleast_2d(c).astype(np.int64))[:, None, :]
    with torch.inference_mode():
        y = model.decode_code(t)
    y = y[:, 0, :].float().numpy()
    return y[0] if one else y


def random_codes(config: Mapping[str, Any], n_frames: int, rng: np.random.Generator,
                 batch: int | None = None) -> np.ndarray:
    """Random FSQ indices in [0, 65536): int32 ``[n_frames]`` (``[batch, n_frames]`` with ``batch``)."""
    if n_frames <= 0:
        raise ValueError("n_frames must be positive")
    shape = (n_frames,) if batch is None else (batch, n_frames)
    return rng.integers(0, CODEBOOK_SIZE, size=shape).astype(np.int32)


def fsq_vectors(codes: np.ndarray) -> np.ndarray:
    """FSQ index -> 8-vector as ``ResidualFSQ.get_codes_from_indices`` computes it (float32 ``[..., 8]``).

    digit i = (idx // 4**i) % 4 (least significant first), value (digit - 2) / 2
    in {-1, -0.5, 0, 0.5}; the single quantizer's scale is (4-1)**0 = 1.
    """
    c = np.asarray(codes, dtype=np.int64)[..., None]
    digits = (c // (4 ** np.arange(8))) % 4
    return ((digits - 2) / 2).astype(np.float32)


# ------------------------------------------------------------------------------
# NeuTTS' streaming (neuphonic/neutts, neutts/neutts.py at 857bec0:
# NeuTTS._infer_stream_ggml and _linear_overlap_add), replayed offline.


def linear_overlap_add(frames: Sequence[np.ndarray], stride: int) -> np.ndarray:
    """Overlap-add with triangular weights, normalised by their sum (NeuTTS' ``_linear_overlap_add``, power 1).

    Frame k starts at k*stride; frame of length L is weighted by
    w(t) = 0.5 - |t - 0.5| at t = linspace(0, 1, L + 2)[1:-1], computed in the
    frames' dtype; the sum is divided by the summed weights.
    """
    dtype = frames[0].dtype
    total = max(stride * i + f.shape[-1] for i, f in enumerate(frames))
    out = np.zeros(total, dtype=dtype)
    wsum = np.zeros(total, dtype=dtype)
    for i, f in enumerate(frames):
        t = np.linspace(0, 1, f.shape[-1] + 2, dtype=dtype)[1:-1]
        w = 0.5 - np.abs(t - 0.5)
        out[i * stride: i * stride + f.shape[-1]] += w * f
        wsum[i * stride: i * stride + f.shape[-1]] += w
    if wsum.min() <= 0:
        raise ValueError("overlap-add left a gap")
    return out / wsum


def neutts_stream(decode: Callable[[np.ndarray], np.ndarray], codes: np.ndarray, hop: int,
                  chunk: int = NEUTTS_CHUNK, lookback: int = NEUTTS_LOOKBACK,
                  lookforward: int = NEUTTS_LOOKFORWARD, overlap: int = NEUTTS_OVERLAP,
                  n_prefix: int = 0, upstream_final: bool = True) -> Iterator[np.ndarray]:
    """Yield the audio pieces NeuTTS' streaming loop yields, for codes arriving one at a time.

    ``codes[:n_prefix]`` are the reference (prompt) codes NeuTTS seeds its
    token cache with: they serve as left context and are never output.
    ``decode(window_codes) -> float32 [len(window) * hop]`` decodes a window.

    Each time ``chunk + lookforward`` undecoded codes are available, the window
    ``[n - lookback - overlap, n + chunk + lookforward + overlap)`` (clipped;
    at that moment only ``n + chunk + lookforward`` codes exist, so the right
    overlap frame is never there) is decoded, samples of frames
    ``[n, n + chunk + 2*overlap)`` are kept, all kept pieces are overlap-added
    at stride ``chunk*hop`` and the finished part is yielded (``chunk*hop``
    samples; the last ``2*overlap`` frames wait for the next piece).

    The final piece: upstream starts it at frame ``n - overlap`` but places it
    at frame n (one frame of misalignment, and one frame more output than
    codes); ``upstream_final=False`` starts it at frame n instead, which makes
    the stream equal the offline decode when every window covers the whole
    utterance.
    """
    codes = np.asarray(codes)
    total = len(codes)
    stride = chunk * hop
    pieces: list[np.ndarray] = []
    n_dec, n_out = n_prefix, 0
    for have in range(n_prefix + 1, total + 1):          # one new code per step
        if have - n_dec >= chunk + lookforward:
            start = max(n_dec - lookback - overlap, 0)
            end = min(n_dec + chunk + lookforward + overlap, have)
            s0 = (n_dec - start) * hop
            rec = decode(codes[start:end])[s0: s0 + (chunk + 2 * overlap) * hop]
            pieces.append(rec)
            mixed = linear_overlap_add(pieces, stride)
            new_end = len(pieces) * stride
            yield mixed[n_out:new_end]
            n_out = new_end
            n_dec += chunk
    remaining = total - n_dec
    if remaining > 0:
        start = max(total - (lookback + overlap + remaining), 0)
        if upstream_final:
            s0 = (total - start - remaining - overlap) * hop   # negative when n_dec == 0: upstream's slice
        else:
            s0 = (n_dec - start) * hop
        rec = decode(codes[start:])[s0:]
        pieces.append(rec)
        yield linear_overlap_add(pieces, stride)[n_out:]


def reference_windowed_decode(model, codes: np.ndarray, chunk: int = NEUTTS_CHUNK,
                              lookback: int = NEUTTS_LOOKBACK, lookforward: int = NEUTTS_LOOKFORWARD,
                              overlap: int = NEUTTS_OVERLAP, n_prefix: int = 0,
                              upstream_final: bool = True) -> np.ndarray:
    """NeuTTS' streamed output for ``codes`` ([T]) as one float32 array (see :func:`neutts_stream`)."""
    hop = int(model.hop_length)
    return np.concatenate(list(neutts_stream(lambda c: reference_decode(model, c), codes, hop,
                                             chunk, lookback, lookforward, overlap, n_prefix,
                                             upstream_final)))
