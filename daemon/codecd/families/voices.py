"""Voices: the conditioning of models that speak in a given voice (Chatterbox S3Gen), and the
prompt codes that lead an LM's output (NeuTTS on NeuCodec).

An S3Gen voice is a prompt (its S3 speech tokens and their 80-bin, 50 Hz mel
spectrogram: two frames per token) and a 192-d speaker embedding (x-vector).
A *prompt-codes* voice (``model_arch`` a windowed codec's architecture:
``neucodec``, ``xcodec2``, ``wavtokenizer``) holds only codes, ``prompt_tokens``
(``prompt_mel`` [0, 80] and ``speaker`` [0] empty): the reference codes NeuTTS
puts before the LM's output, which a windowed stream decodes as left context and
never outputs (:mod:`codecd.families.windowed`). NeuTTS' reference files (a
saved tensor of codes, ``samples/*.pt``) read as NeuCodec prompt-codes voices.

* :func:`read_conds` reads a Chatterbox conditioning file (``conds.pt``, as
  written by ``Conditionals.save``; its ``gen`` dict holds ``prompt_token``,
  ``prompt_feat`` and ``embedding``).
* A voice file is a small GGUF (architecture ``codecd-voice``) with tensors
  ``prompt_tokens`` (I32 [n]), ``prompt_mel`` (F32, numpy [2n, 80]) and
  ``speaker`` (F32 [192]), plus ``voice.name``, ``voice.model_arch``,
  ``voice.source``: :func:`write_voice` / :func:`read_voice`. Computing a voice
  from reference audio (S3 tokenizer + CAMPPlus) will write the same format.
* :class:`VoiceStore` is a directory of voice files, one per name; ``codecd
  voice add NAME FILE`` and ``codecd voice list`` use it, and the daemon loads
  every voice in it for the models that need one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["VoiceError", "VoiceData", "read_conds", "read_voice", "write_voice", "VoiceStore",
           "default_voices_dir", "load_voice_file", "prompt_codes_voice", "PROMPT_CODE_ARCHS"]

N_MELS = 80
SPEAKER_DIM = 192
VOCAB_SIZE = 6561
MEL_PER_TOKEN = 2
VOICE_ARCH = "codecd-voice"
#: architectures whose voices are prompt codes only (one codebook of at most 65536 codes)
PROMPT_CODE_ARCHS = ("neucodec", "xcodec2", "wavtokenizer")
MAX_PROMPT_CODE = 65536
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class VoiceError(Exception):
    """A voice file or conditioning file that cannot be used; the message says why."""


@dataclass(frozen=True)
class VoiceData:
    name: str
    prompt_tokens: np.ndarray  # int32 [n]
    prompt_mel: np.ndarray     # float32 [2n, 80]
    speaker: np.ndarray        # float32 [192]
    model_arch: str = "s3gen"
    source: str = ""

    def validate(self) -> VoiceData:
        t, m, s = self.prompt_tokens, self.prompt_mel, self.speaker
        if self.model_arch in PROMPT_CODE_ARCHS:
            if t.ndim != 1 or not t.size or m.size or s.size:
                raise VoiceError(f"voice {self.name!r}: a {self.model_arch} voice is prompt codes "
                                 f"[n > 0] only, got tokens {t.shape}, mel {m.shape}, speaker {s.shape}")
            if t.dtype.kind not in "iu" or int(t.min()) < 0 or int(t.max()) >= MAX_PROMPT_CODE:
                raise VoiceError(f"voice {self.name!r}: prompt codes outside [0, {MAX_PROMPT_CODE})")
            return self
        if t.ndim != 1 or m.ndim != 2 or m.shape[1] != N_MELS or s.shape != (SPEAKER_DIM,):
            raise VoiceError(f"voice {self.name!r}: shapes tokens {t.shape}, mel {m.shape}, speaker {s.shape}; "
                             f"expected [n], [2n, {N_MELS}], [{SPEAKER_DIM}]")
        if m.shape[0] != MEL_PER_TOKEN * t.shape[0]:
            raise VoiceError(f"voice {self.name!r}: {t.shape[0]} prompt tokens but {m.shape[0]} mel frames "
                             f"(needs {MEL_PER_TOKEN} per token)")
        if t.size and (int(t.min()) < 0 or int(t.max()) >= VOCAB_SIZE):
            raise VoiceError(f"voice {self.name!r}: prompt token ids outside [0, {VOCAB_SIZE})")
        if not (np.all(np.isfinite(m)) and np.all(np.isfinite(s))):
            raise VoiceError(f"voice {self.name!r}: non-finite values")
        return self


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        return np.asarray(x.numpy())
    return np.asarray(x)


def read_conds(path: str | os.PathLike, name: str | None = None) -> VoiceData:
    """A Chatterbox ``conds.pt`` (needs torch; loaded with ``weights_only=True``)."""
    try:
        import torch
    except ImportError:
        raise VoiceError("reading conds.pt needs torch: pip install torch") from None
    path = Path(path)
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise VoiceError(f"{path}: not a readable conditioning file ({type(e).__name__}: {e})") from None
    if isinstance(d, torch.Tensor):  # NeuTTS' reference codes (torch.save(ref_codes))
        return prompt_codes_voice(name or path.stem, _np(d), "neucodec", str(path.resolve()))
    gen = d.get("gen") if isinstance(d, dict) else None
    if not isinstance(gen, dict):
        raise VoiceError(f"{path}: no 'gen' conditionals (expected Chatterbox Conditionals.save output)")
    missing = [k for k in ("prompt_token", "prompt_feat", "embedding") if gen.get(k) is None]
    if missing:
        raise VoiceError(f"{path}: 'gen' lacks {', '.join(missing)}")
    tokens = _np(gen["prompt_token"]).reshape(-1)
    mel = _np(gen["prompt_feat"])
    mel = mel.reshape(mel.shape[-2], mel.shape[-1]) if mel.ndim == 3 and mel.shape[0] == 1 else mel
    spk = _np(gen["embedding"]).reshape(-1)
    if tokens.dtype.kind not in "iu":
        raise VoiceError(f"{path}: prompt_token has dtype {tokens.dtype}, expected integers")
    data = VoiceData(name=name or path.stem, prompt_tokens=tokens.astype(np.int32),
                     prompt_mel=np.ascontiguousarray(mel, dtype=np.float32),
                     speaker=np.ascontiguousarray(spk, dtype=np.float32), source=str(path.resolve()))
    return data.validate()


def prompt_codes_voice(name: str, codes: Any, model_arch: str, source: str = "") -> VoiceData:
    """A prompt-codes voice (see the module docstring) for models of ``model_arch``."""
    if model_arch not in PROMPT_CODE_ARCHS:
        raise VoiceError(f"prompt-codes voices are for {', '.join(PROMPT_CODE_ARCHS)}, "
                         f"not {model_arch!r}")
    c = np.asarray(codes).reshape(-1)
    if c.dtype.kind not in "iu":
        raise VoiceError(f"voice {name!r}: prompt codes of dtype {c.dtype}, expected integers")
    return VoiceData(name, c.astype(np.int32), np.zeros((0, N_MELS), np.float32),
                     np.zeros(0, np.float32), model_arch, source).validate()


def write_voice(data: VoiceData, path: str | os.PathLike) -> Path:
    """Write a voice file atomically (temporary file, then rename)."""
    import gguf

    data.validate()
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(tmp), VOICE_ARCH)
    w.add_string("voice.name", data.name)
    w.add_string("voice.model_arch", data.model_arch)
    w.add_string("voice.source", data.source)
    w.add_tensor("prompt_tokens", np.ascontiguousarray(data.prompt_tokens, dtype=np.int32))
    w.add_tensor("prompt_mel", np.ascontiguousarray(data.prompt_mel, dtype=np.float32))
    w.add_tensor("speaker", np.ascontiguousarray(data.speaker, dtype=np.float32))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except OSError as e:
        w.close()
        tmp.unlink(missing_ok=True)
        raise VoiceError(f"cannot write {path}: {e}") from None
    return path


def read_voice(path: str | os.PathLike) -> VoiceData:
    """Read and validate a voice file; VoiceError for anything wrong with it."""
    import gguf

    path = Path(path)
    try:
        r = gguf.GGUFReader(str(path))
    except Exception as e:
        raise VoiceError(f"{path}: not a voice file ({type(e).__name__}: {e})") from None

    def field(key: str, default: str | None = None) -> str:
        f = r.fields.get(key)
        if f is None or not f.data:
            if default is not None:
                return default
            raise VoiceError(f"{path}: missing {key!r}")
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")

    if field("general.architecture") != VOICE_ARCH:
        raise VoiceError(f"{path}: not a voice file (architecture {field('general.architecture')!r})")
    tensors = {t.name: t for t in r.tensors}
    for k in ("prompt_tokens", "prompt_mel", "speaker"):
        if k not in tensors:
            raise VoiceError(f"{path}: missing tensor {k!r}")

    def arr(k: str, dtype: Any) -> np.ndarray:
        t = tensors[k]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = np.asarray(t.data)
        if a.dtype != dtype or a.size != int(np.prod(shape)):
            raise VoiceError(f"{path}: tensor {k!r} has type {a.dtype} and {a.size} values")
        return np.array(a.reshape(shape))

    return VoiceData(name=field("voice.name"), prompt_tokens=arr("prompt_tokens", np.int32),
                     prompt_mel=arr("prompt_mel", np.float32), speaker=arr("speaker", np.float32),
                     model_arch=field("voice.model_arch"), source=field("voice.source", "")).validate()


def load_voice_file(path: str | os.PathLike, name: str | None = None) -> VoiceData:
    """A voice from a voice file (.gguf) or a Chatterbox conds.pt (by content, not extension)."""
    path = Path(path)
    if not path.is_file():
        raise VoiceError(f"voice file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    data = read_voice(path) if magic == b"GGUF" else read_conds(path, name)
    if name and data.name != name:
        data = VoiceData(name, data.prompt_tokens, data.prompt_mel, data.speaker, data.model_arch, data.source)
    return data


def default_voices_dir() -> Path:
    env = os.environ.get("CODECD_VOICES_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "codecd" / "voices"


class VoiceStore:
    """A directory of voice files ``NAME.voice.gguf``."""

    SUFFIX = ".voice.gguf"

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_voices_dir()

    def path(self, name: str) -> Path:
        if not NAME_RE.match(name):
            raise VoiceError(f"bad voice name {name!r}: use 1-64 letters, digits, '_', '-', '.'")
        return self.root / (name + self.SUFFIX)

    def add(self, name: str, src: str | os.PathLike, *, replace: bool = False) -> Path:
        dst = self.path(name)
        if dst.exists() and not replace:
            raise VoiceError(f"voice {name!r} exists ({dst}); pass --replace to overwrite it")
        data = load_voice_file(src, name)
        self.root.mkdir(parents=True, exist_ok=True)
        return write_voice(data, dst)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name[: -len(self.SUFFIX)] for p in self.root.glob("*" + self.SUFFIX))

    def load(self, name: str) -> VoiceData:
        p = self.path(name)
        if not p.is_file():
            raise VoiceError(f"unknown voice {name!r} (known: {', '.join(self.names()) or 'none'})")
        return read_voice(p)

    def load_all(self) -> tuple[dict[str, VoiceData], dict[str, str]]:
        """Every readable voice, and the error of every unreadable one (by name)."""
        ok: dict[str, VoiceData] = {}
        bad: dict[str, str] = {}
        for n in self.names():
            try:
                ok[n] = self.load(n)
            except VoiceError as e:
                bad[n] = str(e)
        return ok, bad
