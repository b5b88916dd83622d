"""WavTokenizer decoder reference (the copy OuteTTS 0.4.4 vendors under ``outetts/wav_tokenizer``).

WavTokenizer is not on PyPI; outetts ships the repo's ``decoder`` package
(``decoder.models.VocosBackbone``, ``decoder.heads.ISTFTHead``) and its own
``WavDecoder`` (``outetts/wav_tokenizer/model.py``), which OuteTTS 0.2/0.3 use
to decode. outetts is installed with ``--no-deps``; its package ``__init__``
(llama-cpp, whisper, ...) is never imported: the vendored folder is put on
``sys.path`` (as ``outetts/wav_tokenizer/__init__.py`` does: the code imports
itself as the top-level packages ``decoder`` and ``encoder``) and
``model.py`` is loaded from its file.

Everything that needs torch imports it inside the function, so this module
imports with numpy alone.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import neucodec as _nc


def _backbone(input_channels: int, dim: int, intermediate_dim: int, num_layers: int) -> dict:
    return {"input_channels": input_channels, "dim": dim, "intermediate_dim": intermediate_dim,
            "num_layers": num_layers, "adanorm_num_embeddings": 4}


#: novateur/WavTokenizer-large-speech-75token (and OuteAI/wavtokenizer-large-75token-interface,
#: which OuteTTS 0.2/0.3 use): 75 Hz, hop 320, n_fft 1280, 24 kHz
WAVTOKENIZER_75 = {"backbone_config": _backbone(512, 768, 2304, 12),
                   "head_config": {"dim": 768, "n_fft": 1280, "hop_length": 320, "padding": "same"},
                   "codebook_size": 4096, "sample_rate": 24000, "dowmsamples": [8, 5, 4, 2]}
#: novateur/WavTokenizer-large-unify-40token (frame40 config): 40 Hz, hop 600, n_fft 2400
WAVTOKENIZER_40 = {"backbone_config": _backbone(512, 768, 2304, 12),
                   "head_config": {"dim": 768, "n_fft": 2400, "hop_length": 600, "padding": "same"},
                   "codebook_size": 4096, "sample_rate": 24000, "dowmsamples": [6, 5, 5, 4]}
#: same code paths (GroupNorm 32 groups, the pos_net attention, AdaLayerNorm,
#: ConvNeXt, the "same" iSTFT with n_fft = 4 hop), ~1/100 of the compute; the
#: codebook stays 4096 x 512 so that the original layout (whose encoder fixes
#: the codebook width) loads with upstream's loader
WAVTOKENIZER_TINY = {"backbone_config": _backbone(512, 64, 96, 2),
                     "head_config": {"dim": 64, "n_fft": 160, "hop_length": 40, "padding": "same"},
                     "codebook_size": 4096, "sample_rate": 24000, "dowmsamples": [8, 5, 4, 2]}
CONFIGS: dict[str, dict[str, Any]] = {"75token": WAVTOKENIZER_75, "40token": WAVTOKENIZER_40,
                                      "tiny": WAVTOKENIZER_TINY}


def _vendored():
    """(decoder.models, decoder.heads, outetts' WavDecoder class) from the installed outetts."""
    spec = importlib.util.find_spec("outetts")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("outetts is not installed (see .ci/install-references)")
    base = Path(list(spec.submodule_search_locations)[0]) / "wav_tokenizer"
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    import decoder.heads
    import decoder.models

    name = "outetts_wav_tokenizer_model"
    mod = sys.modules.get(name)
    if mod is None:
        mspec = importlib.util.spec_from_file_location(name, base / "model.py")
        mod = importlib.util.module_from_spec(mspec)
        sys.modules[name] = mod
        mspec.loader.exec_module(mod)
    return decoder.models, decoder.heads, mod.WavDecoder


def hop_length(config: Mapping[str, Any]) -> int:
    return int(config["head_config"]["hop_length"])


def build_reference(config: Mapping[str, Any], seed: int):
    """outetts' ``WavDecoder(VocosBackbone, ISTFTHead, codebook_weights)`` in eval mode, seeded, perturbed.

    Init leaves GroupNorm / LayerNorm at (1, 0), AdaLayerNorm at scale 1 /
    shift 0 for all 4 bandwidth rows, ConvNeXt gamma at 1/num_layers and the
    backbone's conv / linear biases at 0. Norm scales become uniform(0.7, 1.3)
    and shifts N(0, 0.1) (each AdaLayerNorm row differently, so using another
    row than bandwidth 0 is caught), gammas gamma * uniform(0.5, 1.5), biases
    get N(0, 0.05), weights a relative N(0, 0.2) factor plus noise.
    """
    import torch

    models, heads, WavDecoder = _vendored()
    torch.manual_seed(seed)
    backbone = models.VocosBackbone(**config["backbone_config"])
    head = heads.ISTFTHead(**config["head_config"])
    codebook = torch.randn(config["codebook_size"], config["backbone_config"]["input_channels"])
    model = WavDecoder(backbone, head, codebook)
    gen = torch.Generator().manual_seed(seed + 1)

    def u(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    def n(shape, scale):
        return scale * torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            mod_name = name.rsplit(".", 1)[0]
            mod = model.get_submodule(mod_name)
            is_norm = isinstance(mod, (torch.nn.GroupNorm, torch.nn.LayerNorm))
            if name.endswith(".gamma"):
                p.mul_(u(p.shape, 0.5, 1.5))
            elif name.endswith("norm.scale.weight") or (is_norm and name.endswith(".weight")):
                p.copy_(u(p.shape, 0.7, 1.3))
            elif name.endswith("norm.shift.weight") or (is_norm and name.endswith(".bias")):
                p.add_(n(p.shape, 0.1))
            elif name.endswith(".bias"):
                p.add_(n(p.shape, 0.05))
            else:
                p.mul_(1 + n(p.shape, 0.2)).add_(n(p.shape, 0.02 * float(p.std())))
    model.eval()
    return model


def outetts_config_json(config: Mapping[str, Any]) -> dict:
    """OuteTTS' decoder ``config.json`` (the keys of ``WavDecoder._create_config``) for ``config``."""
    return {"backbone_class": "decoder.models.VocosBackbone", "head_class": "decoder.heads.ISTFTHead",
            "backbone_config": dict(config["backbone_config"]), "head_config": dict(config["head_config"])}


def original_config_yaml(config: Mapping[str, Any]) -> str:
    """The parts of the original repo's training yaml that ``from_hparams0802`` reads."""
    b, h = config["backbone_config"], config["head_config"]
    lines = [
        "model:", "  class_path: decoder.experiment.WavTokenizer", "  init_args:",
        "    sample_rate: %d" % config["sample_rate"],
        "    feature_extractor:", "      class_path: decoder.feature_extractors.EncodecFeatures",
        "      init_args:", "        encodec_model: encodec_24khz",
        "        bandwidths: [6.6, 6.6, 6.6, 6.6]", "        train_codebooks: true",
        "        num_quantizers: 1", "        dowmsamples: %s" % json.dumps(config["dowmsamples"]),
        "        vq_bins: %d" % config["codebook_size"], "        vq_kmeans: 200",
        "    backbone:", "      class_path: decoder.models.VocosBackbone", "      init_args:",
        *("        %s: %s" % (k, v) for k, v in b.items()),
        "    head:", "      class_path: decoder.heads.ISTFTHead", "      init_args:",
        *("        %s: %s" % (k, v) for k, v in h.items()),
    ]
    return "\n".join(lines) + "\n"


def save_released_layout(model, config: Mapping[str, Any], folder, layout: str = "outetts") -> Path:
    """Write the decoder as a release has it; returns the file holding the weights.

    ``layout="outetts"`` (OuteAI/wavtokenizer-large-75token-interface,
    ``decoder/``): ``decoder_model.pt`` = ``{"model_state_dict":
    WavDecoder.state_dict(), "codebook_weights": [4096, 512]}`` (the state
    dict holds ``backbone.*``, ``head.*`` incl. the ``head.istft.window``
    buffer, and ``codebook_weights`` again) and ``config.json`` as
    ``WavDecoder.save_pretrained`` writes it (which hard-codes the 75-token
    config; written here from ``config``).

    ``layout="original"`` (novateur/WavTokenizer-*, the Lightning checkpoint
    ``*.ckpt`` that ``WavTokenizer.from_pretrained0802(config_path,
    model_path)`` reads): ``{"state_dict": {...}}`` with ``backbone.*``,
    ``head.*`` and the codebook at
    ``feature_extractor.encodec.quantizer.vq.layers.0._codebook.embed``
    (plus ``embed_avg``, ``cluster_size``, ``inited``) and the rest of the
    EncodecFeatures (``feature_extractor.encodec.encoder.*`` / ``decoder.*``,
    built by the vendored code), and the training yaml. The real checkpoint
    also has the discriminators and optimizer state; not written here.
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = model.state_dict()
    cb = model.codebook_weights.detach().clone()
    if layout == "outetts":
        path = folder / "decoder_model.pt"
        torch.save({"model_state_dict": sd, "codebook_weights": cb}, path)
        (folder / "config.json").write_text(json.dumps(outetts_config_json(config), indent=2))
        return path
    if layout == "original":
        # The real state dict: the whole EncodecFeatures (SEANet encoder and
        # decoder, LSTMs, the EMA codebook), built by the vendored code, with
        # our codebook in it, plus backbone.* and head.*.
        _vendored()
        from decoder.feature_extractors import EncodecFeatures

        fe = EncodecFeatures(encodec_model="encodec_24khz", bandwidths=[6.6, 6.6, 6.6, 6.6],
                             train_codebooks=True, num_quantizers=1,
                             dowmsamples=list(config["dowmsamples"]),
                             vq_bins=config["codebook_size"], vq_kmeans=200)
        out = {"feature_extractor." + k: v for k, v in fe.state_dict().items()}
        pfx = "feature_extractor.encodec.quantizer.vq.layers.0._codebook."
        if out[pfx + "embed"].shape != cb.shape:
            raise ValueError(f"codebook {tuple(cb.shape)} does not fit the encoder's {tuple(out[pfx + 'embed'].shape)}")
        out[pfx + "inited"] = torch.tensor([1.0])
        out[pfx + "embed"] = cb
        out[pfx + "embed_avg"] = cb.clone()
        out.update({k: v for k, v in sd.items() if k.startswith(("backbone.", "head."))})
        path = folder / "wavtokenizer_checkpoint.ckpt"
        torch.save({"state_dict": out, "epoch": 0, "global_step": 0}, path)
        (folder / "config.yaml").write_text(original_config_yaml(config))
        return path
    raise ValueError(f"unknown layout {layout!r}")


def reference_decode(model, codes: np.ndarray) -> np.ndarray:
    """Decode ``[T]`` (or ``[B, T]``) codes as OuteTTS' ``AudioCodec.decode`` does; float32 ``[samples]`` / ``[B, samples]``.

    ``features = model.codes_to_features(codes [K=1, B, T])`` then
    ``model(features, bandwidth_id=tensor([0]))``; T codes give T * hop samples.
    """
    import torch

    c = np.asarray(codes)
    one = c.ndim == 1
    t = torch.as_tensor(np.atleast_2d(c).astype(np.int64))[None]    # [K=1, B, T]
    with torch.inference_mode():
        feats = model.codes_to_features(t)
        y = model(feats, bandwidth_id=torch.tensor([0]))
    y = y.float().numpy()
    return y[0] if one else y


def reference_windowed_decode(model, codes: np.ndarray, chunk: int = _nc.NEUTTS_CHUNK,
                              lookback: int = _nc.NEUTTS_LOOKBACK,
                              lookforward: int = _nc.NEUTTS_LOOKFORWARD,
                              overlap: int = _nc.NEUTTS_OVERLAP, n_prefix: int = 0,
                              upstream_final: bool = True) -> np.ndarray:
    """NeuTTS' windowed streaming scheme applied to WavTokenizer (OuteTTS itself does not stream)."""
    hop = int(model.head.istft.hop_length)
    return np.concatenate(list(_nc.neutts_stream(lambda c: reference_decode(model, c), codes, hop,
                                                 chunk, lookback, lookforward, overlap, n_prefix,
                                                 upstream_final)))


def random_codes(config: Mapping[str, Any], n_frames: int, rng: np.random.Generator,
                 batch: int | None = None) -> np.ndarray:
    """Random codes in [0, 4096): int32 ``[n_frames]`` (``[batch, n_frames]`` with ``batch``)."""
    if n_frames <= 0:
        raise ValueError("n_frames must be positive")
    shape = (n_frames,) if batch is None else (batch, n_frames)
    return rng.integers(0, config["codebook_size"], size=shape).astype(np.int32)
