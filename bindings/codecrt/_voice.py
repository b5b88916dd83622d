"""Voice: the conditioning of models that speak in a given voice (S3Gen).

A voice is a prompt (its speech tokens and its 80-bin mel spectrogram, two
mel frames per token) plus a speaker embedding (192-d x-vector). It is
validated and copied by the C side (``codecrt_voice_init``); immutable, and
shareable by every context of its model, on any threads.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import E_INVALID_ARGUMENT, E_STATE, _check, _fail
from ._model import Model
from ._native import ffi, lib
from ._runtime import ERR_SIZE

__all__ = ["Voice", "as_voice"]


def _array(name: str, a: object, dtype: Any, ndim: int) -> npt.NDArray[Any]:
    arr = np.asarray(a)
    if dtype == np.int32:
        if arr.size and arr.dtype.kind not in "iu":
            _fail(E_INVALID_ARGUMENT, f"{name} must be integers, not {arr.dtype}")
        if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) >= 2**31):
            _fail(E_INVALID_ARGUMENT, f"{name} values do not fit int32")
    elif arr.size and arr.dtype.kind not in "fiu":
        _fail(E_INVALID_ARGUMENT, f"{name} must be numbers, not {arr.dtype}")
    if arr.size == 0 and ndim == 2:
        arr = arr.reshape(0, 80)
    if arr.ndim != ndim:
        _fail(E_INVALID_ARGUMENT, f"{name} must be {ndim}-D, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype)


class Voice:
    """``Voice(model, prompt_tokens, prompt_mel, speaker)``.

    ``prompt_tokens``: ``[n]`` ints; ``prompt_mel``: ``[2n, 80]`` floats (time
    major, as Chatterbox's ``prompt_feat``); ``speaker``: ``[192]`` floats.
    Errors are typed (CodeRangeError for ids out of range, CodeShapeError for
    lengths that disagree, InputError for non-finite values).
    """

    _ptr: Any = None

    def __init__(self, model: Model, prompt_tokens: npt.ArrayLike, prompt_mel: npt.ArrayLike,
                 speaker: npt.ArrayLike, *, name: str = "") -> None:
        if not isinstance(model, Model):
            _fail(E_INVALID_ARGUMENT, f"model must be a codecrt.Model, not {type(model).__name__}")
        toks = _array("prompt_tokens", prompt_tokens, np.int32, 1)
        mel = _array("prompt_mel", prompt_mel, np.float32, 2)
        spk = _array("speaker", speaker, np.float32, 1).reshape(-1)
        data = ffi.new("codecrt_voice_data *")
        keep = (ffi.from_buffer("int32_t[]", toks), ffi.from_buffer("float[]", mel),
                ffi.from_buffer("float[]", spk))
        data.prompt_tokens = keep[0]
        data.n_prompt_tokens = toks.shape[0]
        data.prompt_mel = keep[1]
        data.n_prompt_frames = mel.shape[0]
        data.n_mels = mel.shape[1]
        data.speaker = keep[2]
        data.speaker_dim = spk.shape[0]
        out = ffi.new("codecrt_voice **")
        err = ffi.new("char[]", ERR_SIZE)
        with model._lock:
            status = lib.codecrt_voice_init(model._handle(), data, out, err, ERR_SIZE)
        del keep
        _check(status, lambda: ffi.string(err).decode("utf-8", "replace"))
        self._ptr = out[0]
        self._lock = threading.Lock()
        self.name = name
        self.n_prompt_tokens = int(toks.shape[0])
        self.model_info = model.info

    def _handle(self) -> Any:
        if self._ptr is None:
            _fail(E_STATE, "the voice is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Free the voice. Decodes that use it must have returned."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.codecrt_voice_free(ptr)

    def __enter__(self) -> Voice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # fallback only
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.n_prompt_tokens} prompt tokens"
        return f"<codecrt.Voice {self.name or '?'} ({state})>"


def as_voice(voice: object) -> Voice:
    """``voice`` when it is a :class:`Voice`; InputError otherwise."""
    if not isinstance(voice, Voice):
        _fail(E_INVALID_ARGUMENT, f"voice must be a codecrt.Voice, not {type(voice).__name__}")
    return voice
