"""Model: a GGUF model loaded by the runtime (``codecrt_model``), and its hyperparameters."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from . import _errors
from ._args import int_arg
from ._errors import E_INVALID_ARGUMENT, E_STATE, ModelFileError, _check, _fail
from ._native import ffi, lib
from ._runtime import ERR_SIZE, c_str

__all__ = ["Model", "ModelInfo"]

_WEIGHT_TYPES: dict[int, str] = {
    int(lib.CODECRT_WEIGHT_F32): "f32",
    int(lib.CODECRT_WEIGHT_F16): "f16",
}


@dataclass(frozen=True)
class ModelInfo:
    """A model's hyperparameters (``codecrt_model_info``)."""

    arch: str
    sample_rate: int
    hop_length: int
    n_levels: int
    codebook_sizes: tuple[int, ...]
    level_strides: tuple[int, ...]
    frame_multiple: int
    weight_type: str  # 'f32' | 'f16'
    n_params: int
    weight_bytes: int
    n_mels: int = 0         # two-stage models: mel bins between flow and vocoder
    mel_hop: int = 0        # two-stage models: samples per mel frame
    needs_voice: bool = False  # the C API's flag: decodes take a codecrt.Voice
    default_steps: int = 0  # flow models: Euler steps by default

    @classmethod
    def _from_c(cls, info: Any) -> ModelInfo:
        n = max(0, min(int(info.n_levels), int(lib.CODECRT_MAX_LEVELS)))
        wt = int(info.weight_type)
        return cls(
            arch=c_str(info.arch),
            sample_rate=int(info.sample_rate),
            hop_length=int(info.hop_length),
            n_levels=int(info.n_levels),
            codebook_sizes=tuple(int(info.codebook_size[i]) for i in range(n)),
            level_strides=tuple(int(info.level_stride[i]) for i in range(n)),
            frame_multiple=int(info.frame_multiple),
            weight_type=_WEIGHT_TYPES.get(wt, str(wt)),
            n_params=int(info.n_params),
            weight_bytes=int(info.weight_bytes),
            n_mels=int(info.n_mels),
            mel_hop=int(info.mel_hop),
            needs_voice=bool(info.needs_voice),
            default_steps=int(info.default_steps),
        )


class Model:
    """A GGUF model loaded by the runtime (``codecrt_model``).

    Immutable once loaded and shareable by any number of Contexts on any
    threads. ``close()`` drops this handle's reference; contexts created from
    the model keep the weights alive until they are closed too.
    """

    _ptr: Any = None  # class default: __del__ is safe after a failed __init__

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self.path: str = os.fspath(path)
        c_path = os.fsencode(self.path)
        if b"\0" in c_path:
            _fail(E_INVALID_ARGUMENT, "model path contains a NUL byte")
        out = ffi.new("codecrt_model **")
        err = ffi.new("char[]", ERR_SIZE)
        status = lib.codecrt_model_load(c_path, out, err, ERR_SIZE)
        try:
            _check(status, lambda: c_str(err))
        except ModelFileError as e:
            e.filename = self.path
            raise
        ptr = out[0]
        info = ffi.new("codecrt_model_info *")
        status = lib.codecrt_model_get_info(ptr, info)
        if status != _errors.OK:
            lib.codecrt_model_free(ptr)
            _check(status, "codecrt_model_get_info failed")
        self._ptr = ptr
        self._info = ModelInfo._from_c(info)

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _handle(self) -> Any:
        ptr = self._ptr
        if ptr is None:
            _fail(E_STATE, "the model is closed")
        return ptr

    def samples_for_frames(self, n_frames: int) -> int:
        """Samples per sequence that a decode of ``n_frames`` frames yields."""
        n = int_arg("n_frames", n_frames, -(2**63), 2**63 - 1)
        with self._lock:
            samples = int(lib.codecrt_model_samples_for_frames(self._handle(), n))
        if samples == 0 and n != 0:
            _fail(E_INVALID_ARGUMENT, f"invalid n_frames={n} (negative, or samples beyond int64)")
        return samples

    def close(self) -> None:
        """Drop this handle's reference to the model. Idempotent."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                lib.codecrt_model_free(ptr)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # fallback only: call close() or use `with`
        if self._ptr is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: module globals may be gone
                pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else self._info.arch
        return f"<codecrt.Model {self.path!r} ({state})>"
