"""Checkpoint converters: PyTorch / safetensors checkpoints to codecd GGUF files.

``convert(src, dst)`` finds the checkpoint and its config, detects the
architecture and hands over to that architecture's converter. Architectures
are entries of :data:`ARCHITECTURES`; adding one (S3Gen, Mimi, DAC, ...) means
writing ``codecd/convert/<arch>.py`` with a ``detect(config, keys)`` predicate
and a ``convert_<arch>_state_dict(state_dict, config, dst, dtype, *, source,
progress)`` function, and registering it below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from . import dac, mimi, neucodec, qwen3, s3gen, snac, wavtokenizer
from .common import DTYPES, ConversionError, load_checkpoint, load_config

__all__ = ["convert", "ConversionError", "ARCHITECTURES", "Architecture", "register", "find_checkpoint"]


@dataclass(frozen=True)
class Architecture:
    name: str
    #: detect(config_or_None, state_dict_keys) -> bool
    detect: Callable[[Mapping[str, Any] | None, Any], bool]
    #: convert_state_dict(state_dict, config, dst, dtype, *, source, progress) -> Path
    convert_state_dict: Callable[..., Path]
    description: str = ""
    #: False when the architecture is fixed and the weights alone describe it
    needs_config: bool = True


ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> None:
    ARCHITECTURES[arch.name] = arch


register(Architecture("snac", snac.detect, snac.convert_snac_state_dict,
                      "SNAC multi-scale neural audio codec (hubertsiuzdak/snac)"))
register(Architecture("s3gen", s3gen.detect, s3gen.convert_s3gen_state_dict,
                      "Chatterbox S3Gen: S3 tokens to 24 kHz speech (flow matching + HiFT)",
                      needs_config=False))
register(Architecture("wavtokenizer", wavtokenizer.detect, wavtokenizer.convert_wavtokenizer_state_dict,
                      "WavTokenizer decoder (OuteTTS 0.2/0.3; 75 and 40 tokens/s, 24 kHz)",
                      needs_config=False))
register(Architecture("neucodec", neucodec.detect_neucodec, neucodec.convert_neucodec_state_dict,
                      "NeuCodec decoder (NeuTTS Air/Nano; 50 Hz FSQ codes, 24 kHz)", needs_config=False))
register(Architecture("mimi", mimi.detect, mimi.convert_mimi_state_dict,
                      "Mimi decoder (Kyutai; Moshi, Sesame CSM): 1..32 RVQ codebooks at 12.5 Hz, 24 kHz",
                      needs_config=False))
register(Architecture("qwen3", qwen3.detect, qwen3.convert_qwen3_state_dict,
                      "Qwen3-TTS 12 Hz speech tokenizer decoder: 16 RVQ codebooks at 12.5 Hz, 24 kHz",
                      needs_config=False))
register(Architecture("xcodec2", neucodec.detect_xcodec2, neucodec.convert_xcodec2_state_dict,
                      "XCodec2 decoder (Llasa; 50 Hz FSQ codes, 16 kHz)", needs_config=False))
register(Architecture("dac", dac.detect, dac.convert_dac_state_dict,
                      "DAC, descript-audio-codec (44.1/24/16 kHz; IBM DAC.speech for OuteTTS 1.0); "
                      "the config is the .pth's metadata kwargs"))

#: weight files looked for in a checkpoint folder, in order
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors", "diffusion_pytorch_model.safetensors",
                "s3gen.safetensors", "s3gen_meanflow.safetensors", "decoder_model.pt")


def find_checkpoint(src: str | os.PathLike, config: Any = None) -> tuple[Path, dict | None]:
    """Resolve ``src`` (a checkpoint folder, or a weights file) to (weights file, config or None)."""
    src = Path(src)
    if src.is_dir():
        weights = next((src / f for f in WEIGHT_FILES if (src / f).is_file()), None)
        if weights is None:
            cands = (sorted(src.glob("*.safetensors")) + sorted(src.glob("*.pt")) + sorted(src.glob("*.pth"))
                     + sorted(src.glob("*.ckpt")))
            if len(cands) != 1:
                raise ConversionError(f"{src}: no weights found (looked for {', '.join(WEIGHT_FILES)}"
                                      + (f"; several candidates: {', '.join(c.name for c in cands)}" if cands else "")
                                      + ")")
            weights = cands[0]
        if config is None and (src / "config.json").is_file():
            config = src / "config.json"
    elif src.is_file():
        weights = src
        if config is None and (src.parent / "config.json").is_file():
            config = src.parent / "config.json"
    else:
        raise ConversionError(f"checkpoint not found: {src}")
    return weights, load_config(config)


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, dtype: str = "f32", config: Any = None,
            progress: bool = True, arch: str | None = None, source: str | None = None) -> Path:
    """Convert the checkpoint ``src`` to the GGUF file ``dst`` and return ``dst`` as a Path.

    ``src``: a folder with ``config.json`` and ``pytorch_model.bin`` (or
    ``model.safetensors``), or a single state-dict file; ``config`` (a path or
    a dict) is required for a single file without a ``config.json`` beside it.
    ``dtype``: "f32" or "f16" for the large matrices. ``arch``: force an
    architecture instead of detecting it. Errors: :class:`ConversionError`.
    """
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    weights, cfg = find_checkpoint(src, config)
    state_dict, embedded = load_checkpoint(weights)
    if cfg is None:
        cfg = embedded  # a checkpoint that carries its own config (DAC's metadata kwargs)
    if arch is None:
        found = [a for a in ARCHITECTURES.values() if a.detect(cfg, state_dict.keys())]
        if not found:
            raise ConversionError(f"{weights}: not a known architecture (known: {', '.join(ARCHITECTURES)})")
        if len(found) > 1:
            raise ConversionError(f"{weights}: ambiguous architecture ({', '.join(a.name for a in found)}); "
                                  "choose one explicitly")
        entry = found[0]
    elif arch in ARCHITECTURES:
        entry = ARCHITECTURES[arch]
    else:
        raise ConversionError(f"unknown architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
    if cfg is None and entry.needs_config:
        raise ConversionError(f"no config for {weights}: pass one (--config config.json)")
    dst = Path(dst)
    if dst.is_dir():
        raise ConversionError(f"output {dst} is a directory; give a file name such as {dst / 'model.gguf'}")
    return entry.convert_state_dict(state_dict, cfg, dst, dtype,
                                    source=source or str(Path(src).resolve()), progress=progress)
