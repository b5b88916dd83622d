"""Typed exceptions for codecrt statuses, and the one check gate ``_check``.

Every exception carries ``.status`` (the ``codecrt_status`` as an int),
``.status_name`` (``"CODECRT_E_..."``) and ``.message`` (the native message)::

    CodecrtError(Exception)                       .status, .status_name, .message
    ├── ModelError
    │   ├── ModelFileError (also OSError)         CODECRT_E_IO
    │   ├── NotGGUFError                          CODECRT_E_NOT_GGUF
    │   ├── CorruptModelError                     CODECRT_E_CORRUPT
    │   ├── TruncatedModelError                   CODECRT_E_TRUNCATED
    │   ├── UnknownArchitectureError              CODECRT_E_UNKNOWN_ARCH
    │   ├── HyperparameterError                   CODECRT_E_BAD_HPARAMS
    │   ├── MissingTensorError                    CODECRT_E_MISSING_TENSOR
    │   └── TensorError                           CODECRT_E_BAD_TENSOR
    ├── BackendError                              CODECRT_E_BACKEND
    ├── OutOfMemoryError (also MemoryError)       CODECRT_E_OUT_OF_MEMORY
    ├── InputError (also ValueError)              CODECRT_E_INVALID_ARGUMENT
    │   ├── CodeRangeError                        CODECRT_E_CODE_RANGE
    │   ├── CodeShapeError                        CODECRT_E_SHAPE
    │   ├── CodeTypeError (also TypeError)        (Python-side dtype check;
    │   │                                          status CODECRT_E_INVALID_ARGUMENT)
    │   ├── TooLargeError                         CODECRT_E_TOO_LARGE
    │   └── BufferTooSmallError                   CODECRT_E_BUFFER_TOO_SMALL
    ├── ComputeError                              CODECRT_E_COMPUTE
    ├── StateError                                CODECRT_E_STATE
    └── UnsupportedError                          CODECRT_E_UNSUPPORTED

A status this module does not know (a newer runtime) raises ``CodecrtError``
itself. This module does not import the native extension, so the classes can be
used (caught, documented, type-checked) without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "STATUS_NAMES",
    "BackendError",
    "BufferTooSmallError",
    "CodeRangeError",
    "CodeShapeError",
    "CodeTypeError",
    "CodecrtError",
    "ComputeError",
    "CorruptModelError",
    "HyperparameterError",
    "InputError",
    "MissingTensorError",
    "ModelError",
    "ModelFileError",
    "NotGGUFError",
    "OutOfMemoryError",
    "StateError",
    "TensorError",
    "TooLargeError",
    "TruncatedModelError",
    "UnknownArchitectureError",
    "UnsupportedError",
]

# codecrt_status values (native/include/codecrt.h).
OK = 0
E_INVALID_ARGUMENT = 1
E_IO = 2
E_NOT_GGUF = 3
E_CORRUPT = 4
E_TRUNCATED = 5
E_UNKNOWN_ARCH = 6
E_BAD_HPARAMS = 7
E_MISSING_TENSOR = 8
E_BAD_TENSOR = 9
E_BACKEND = 10
E_OUT_OF_MEMORY = 11
E_CODE_RANGE = 12
E_SHAPE = 13
E_TOO_LARGE = 14
E_BUFFER_TOO_SMALL = 15
E_COMPUTE = 16
E_STATE = 17
E_UNSUPPORTED = 18

STATUS_NAMES: dict[int, str] = {
    OK: "CODECRT_OK",
    E_INVALID_ARGUMENT: "CODECRT_E_INVALID_ARGUMENT",
    E_IO: "CODECRT_E_IO",
    E_NOT_GGUF: "CODECRT_E_NOT_GGUF",
    E_CORRUPT: "CODECRT_E_CORRUPT",
    E_TRUNCATED: "CODECRT_E_TRUNCATED",
    E_UNKNOWN_ARCH: "CODECRT_E_UNKNOWN_ARCH",
    E_BAD_HPARAMS: "CODECRT_E_BAD_HPARAMS",
    E_MISSING_TENSOR: "CODECRT_E_MISSING_TENSOR",
    E_BAD_TENSOR: "CODECRT_E_BAD_TENSOR",
    E_BACKEND: "CODECRT_E_BACKEND",
    E_OUT_OF_MEMORY: "CODECRT_E_OUT_OF_MEMORY",
    E_CODE_RANGE: "CODECRT_E_CODE_RANGE",
    E_SHAPE: "CODECRT_E_SHAPE",
    E_TOO_LARGE: "CODECRT_E_TOO_LARGE",
    E_BUFFER_TOO_SMALL: "CODECRT_E_BUFFER_TOO_SMALL",
    E_COMPUTE: "CODECRT_E_COMPUTE",
    E_STATE: "CODECRT_E_STATE",
    E_UNSUPPORTED: "CODECRT_E_UNSUPPORTED",
}


class CodecrtError(Exception):
    """Base of every codecrt error: a non-OK ``codecrt_status``."""

    status: int
    status_name: str
    message: str

    def __init__(self, message: str = "", *, status: int | None = None,
                 status_name: str | None = None) -> None:
        # Only the message goes to the base class: OSError would read a second
        # positional argument as errno/strerror.
        super().__init__(message)
        if status is None:
            status = _DEFAULT_STATUS.get(type(self), E_INVALID_ARGUMENT)
        self.status = int(status)
        self.status_name = status_name or STATUS_NAMES.get(self.status, f"CODECRT_STATUS_{status}")
        self.message = message

    def __str__(self) -> str:
        if self.message:
            return f"{self.message} [{self.status_name}]"
        return self.status_name

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable (multiprocessing, concurrent.futures) with its keyword fields.
        return (_rebuild, (type(self), self.message, self.status, self.status_name))


def _rebuild(cls: type[CodecrtError], message: str, status: int,
             status_name: str) -> CodecrtError:
    return cls(message, status=status, status_name=status_name)


class ModelError(CodecrtError):
    """The model file could not be loaded or failed validation."""


class ModelFileError(ModelError, OSError):
    """The model file is missing or unreadable (CODECRT_E_IO)."""


class NotGGUFError(ModelError):
    """No GGUF magic at the start of the file (CODECRT_E_NOT_GGUF)."""


class CorruptModelError(ModelError):
    """GGUF header or metadata malformed (CODECRT_E_CORRUPT)."""


class TruncatedModelError(ModelError):
    """File shorter than its tensor data (CODECRT_E_TRUNCATED)."""


class UnknownArchitectureError(ModelError):
    """general.architecture is not supported (CODECRT_E_UNKNOWN_ARCH)."""


class HyperparameterError(ModelError):
    """A hyperparameter is missing, mistyped or invalid (CODECRT_E_BAD_HPARAMS)."""


class MissingTensorError(ModelError):
    """A tensor the architecture needs is absent (CODECRT_E_MISSING_TENSOR)."""


class TensorError(ModelError):
    """A tensor has the wrong type or shape, or is unknown (CODECRT_E_BAD_TENSOR)."""


class BackendError(CodecrtError):
    """The requested device is not available (CODECRT_E_BACKEND)."""


class OutOfMemoryError(CodecrtError, MemoryError):
    """A host or device allocation failed (CODECRT_E_OUT_OF_MEMORY)."""


class InputError(CodecrtError, ValueError):
    """An invalid argument (CODECRT_E_INVALID_ARGUMENT) or invalid codes (subclasses)."""


class CodeRangeError(InputError):
    """A code outside [0, codebook_size), or outside int32 (CODECRT_E_CODE_RANGE)."""


class CodeShapeError(InputError):
    """Levels of inconsistent shape or length, zero or misaligned frames (CODECRT_E_SHAPE)."""


class CodeTypeError(InputError, TypeError):
    """Codes of a non-integer dtype (Python-side check; status CODECRT_E_INVALID_ARGUMENT)."""


class TooLargeError(InputError):
    """More frames or sequences than the context allows (CODECRT_E_TOO_LARGE)."""


class BufferTooSmallError(InputError):
    """The output buffer is smaller than the decode's size (CODECRT_E_BUFFER_TOO_SMALL)."""


class ComputeError(CodecrtError):
    """The backend failed to allocate or compute a graph (CODECRT_E_COMPUTE)."""


class StateError(CodecrtError):
    """Call not valid in the object's current state, e.g. closed (CODECRT_E_STATE)."""


class UnsupportedError(CodecrtError):
    """A valid request this build or model cannot serve (CODECRT_E_UNSUPPORTED)."""


STATUS_ERRORS: dict[int, type[CodecrtError]] = {
    E_INVALID_ARGUMENT: InputError,
    E_IO: ModelFileError,
    E_NOT_GGUF: NotGGUFError,
    E_CORRUPT: CorruptModelError,
    E_TRUNCATED: TruncatedModelError,
    E_UNKNOWN_ARCH: UnknownArchitectureError,
    E_BAD_HPARAMS: HyperparameterError,
    E_MISSING_TENSOR: MissingTensorError,
    E_BAD_TENSOR: TensorError,
    E_BACKEND: BackendError,
    E_OUT_OF_MEMORY: OutOfMemoryError,
    E_CODE_RANGE: CodeRangeError,
    E_SHAPE: CodeShapeError,
    E_TOO_LARGE: TooLargeError,
    E_BUFFER_TOO_SMALL: BufferTooSmallError,
    E_COMPUTE: ComputeError,
    E_STATE: StateError,
    E_UNSUPPORTED: UnsupportedError,
}

_DEFAULT_STATUS: dict[type[CodecrtError], int] = {cls: st for st, cls in STATUS_ERRORS.items()}
_DEFAULT_STATUS[CodeTypeError] = E_INVALID_ARGUMENT

# Filled in by _core with codecrt_status_name once the extension is loaded.
_status_name: Callable[[int], str] | None = None


def error_for(status: int, message: str = "",
              cls: type[CodecrtError] | None = None) -> CodecrtError:
    """Build (not raise) the exception for a non-OK status."""
    status = int(status)
    name = STATUS_NAMES.get(status)
    if name is None and _status_name is not None:
        name = _status_name(status)
    if cls is None:
        cls = STATUS_ERRORS.get(status, CodecrtError)
    return cls(message, status=status, status_name=name)


def _check(status: int, message: str | Callable[[], str] = "") -> None:
    """The one check gate: return on CODECRT_OK, else raise the typed error.

    ``message`` is the native message, or a callable that fetches it (such as
    ``codecrt_context_last_error``), called only on failure.
    """
    if status == OK:
        return
    msg = message() if callable(message) else message
    raise error_for(status, msg)


def _fail(status: int, message: str, cls: type[CodecrtError] | None = None) -> NoReturn:
    """Raise a Python-side error with a codecrt status (e.g. use after close)."""
    raise error_for(status, message, cls)
