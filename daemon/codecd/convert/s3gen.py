"""Chatterbox S3Gen checkpoints (``s3gen.safetensors``, Turbo ``s3gen_meanflow.safetensors``) to GGUF.

The released file is the state dict of ``chatterbox.models.s3gen.S3Gen``
(S3Token2Wav). Only the decode path is kept: ``flow.*`` (token embedding,
conformer encoder, flow-matching estimator, speaker projection) and
``mel2wav.*`` (HiFT). The S3 tokenizer and the CAMPPlus speaker encoder
(``tokenizer.*``, ``speaker_encoder.*``) compute voices from audio and are
dropped. Names keep the state-dict keys with weight norm folded and the long
prefixes shortened (GGUF names hold at most 63 bytes); docs/gguf-format.md has
the table. Shapes stay PyTorch's (GGUF stores them reversed, as ggml's ne).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .common import FORMAT_VERSION, WN_LAYOUTS, ConversionError, GGUFOut, StateDict

ARCH = "s3gen"

#: state-dict prefix -> GGUF prefix, first match wins
PREFIXES = (
    ("flow.decoder.estimator.", "est."),
    ("flow.encoder.", "enc."),
    ("mel2wav.", "hift."),
    ("flow.", "flow."),
)
#: modules that compute voices from reference audio, not needed to decode
DROPPED = ("tokenizer.", "speaker_encoder.")
#: kept in f32 whatever --dtype says: read on the host when a voice is made
HOST_TENSORS = ("flow.spk_embed_affine_layer.weight",)

VOCAB_SIZE = 6561
N_MELS = 80
SAMPLING_RATE = 24000
SPEAKER_DIM = 192
CFG_RATE = 0.7
MEANFLOW_KEY = "flow.decoder.estimator.time_embed_mixer.weight"


def detect(config: Mapping[str, Any] | None, keys) -> bool:
    keys = set(keys)
    return "flow.input_embedding.weight" in keys and any(k.startswith("mel2wav.") for k in keys)


def gguf_name(key: str) -> str:
    for old, new in PREFIXES:
        if key.startswith(old):
            return new + key[len(old):]
    raise ConversionError(f"tensor {key!r} is outside the S3Gen decode path (flow.*, mel2wav.*)")


def is_mat(name: str, shape: tuple[int, ...]) -> bool:
    """The tensors that may be stored as f16: matrices and kernels of at least 4096 elements.

    Must agree with the ``mat`` flags of native/src/s3gen*.c's tensor specs.
    """
    return len(shape) >= 2 and int(np.prod(shape)) >= 4096 and name not in HOST_TENSORS


def _modules(sd: StateDict) -> list[tuple[str, str]]:
    """(state-dict key of the effective tensor, how to read it): plain keys and weight-norm modules."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for k in sd.keys():
        if k.startswith(DROPPED):
            continue
        for gk, vk in WN_LAYOUTS:
            for part in (gk, vk):
                if k.endswith("." + part):
                    prefix = k[: -len(part) - 1]
                    if prefix not in seen:
                        seen.add(prefix)
                        out.append((prefix + ".weight", prefix))
                    break
            else:
                continue
            break
        else:
            out.append((k, ""))
    return out


def build_s3gen_tensors(sd: StateDict, mat_dtype) -> tuple[GGUFOut, bool]:
    if "flow.input_embedding.weight" not in sd:
        raise ConversionError("not an S3Gen checkpoint: no 'flow.input_embedding.weight'")
    emb = sd.get("flow.input_embedding.weight")
    if emb.shape != (VOCAB_SIZE, 512):
        raise ConversionError(f"flow.input_embedding.weight has shape {emb.shape}, expected ({VOCAB_SIZE}, 512)")
    meanflow = MEANFLOW_KEY in sd
    out = GGUFOut(ARCH)
    for key, wn_prefix in _modules(sd):
        a = sd.weight(wn_prefix) if wn_prefix else sd.get(key)
        if a.dtype.kind != "f":
            # integer buffers (e.g. BatchNorm's num_batches_tracked) are not weights
            continue
        name = gguf_name(key)
        if len(name) > 63:
            raise ConversionError(f"tensor name {name!r} is longer than GGUF's 63 bytes")
        out.tensor(name, a, mat_dtype if is_mat(name, a.shape) else np.float32)
    return out, meanflow


def add_s3gen_metadata(out: GGUFOut, *, meanflow: bool, name: str, source: str) -> None:
    out.string("general.name", name)
    out.u32("codecd.format_version", FORMAT_VERSION)
    out.string("codecd.source", source)
    out.boolean("s3gen.meanflow", meanflow)
    out.u32("s3gen.n_steps", 2 if meanflow else 10)
    out.f32("s3gen.cfg_rate", 0.0 if meanflow else CFG_RATE)
    out.u32("s3gen.vocab_size", VOCAB_SIZE)
    out.u32("s3gen.n_mels", N_MELS)
    out.u32("s3gen.sampling_rate", SAMPLING_RATE)
    out.u32("s3gen.speaker_dim", SPEAKER_DIM)


def convert_s3gen_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any] | None,
                             dst: str | os.PathLike, dtype: str = "f32", *, source: str = "state_dict",
                             name: str | None = None, progress: bool = False) -> Path:
    """Write the GGUF file ``dst`` from an S3Gen state dict (numpy arrays or torch tensors).

    ``config`` is unused (the architecture is fixed; Turbo is recognised by its
    time mixer). ``dtype`` ("f32" or "f16") applies to the large matrices.
    """
    if dtype not in ("f32", "f16"):
        raise ConversionError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    sd = StateDict(state_dict)
    out, meanflow = build_s3gen_tensors(sd, np.float16 if dtype == "f16" else np.float32)
    add_s3gen_metadata(out, meanflow=meanflow, name=name or ("s3gen_turbo" if meanflow else "s3gen"),
                       source=source)
    return out.write(dst, progress=progress)
