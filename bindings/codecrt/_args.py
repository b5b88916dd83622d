"""Arguments on their way to C: integers and floats that must fit a field, code and seed arrays.

Validation here is kept to what only Python can check (dtypes, ndim, object
types); lengths, ranges, limits and capacities are passed to C as they are, so
the C side reports them.
"""

from __future__ import annotations

import operator

import numpy as np
import numpy.typing as npt

from ._errors import E_INVALID_ARGUMENT, CodeRangeError, CodeTypeError, InputError, _fail

__all__ = ["INT32_MIN", "INT32_MAX", "UINT32_MAX", "UINT64_MAX", "int_arg", "float_arg", "as_codes", "as_seeds",
           "check_out"]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def int_arg(name: str, value: object, lo: int, hi: int) -> int:
    """An integer argument that must fit a C field; InputError otherwise."""
    if isinstance(value, bool):
        value = int(value)
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        _fail(E_INVALID_ARGUMENT, f"{name} must be an integer, not {type(value).__name__}")
    if not lo <= v <= hi:
        _fail(E_INVALID_ARGUMENT, f"{name}={v} is outside [{lo}, {hi}]")
    return v


def float_arg(name: str, value: object, lo: float, hi: float) -> float:
    """A finite float argument in [lo, hi]; InputError otherwise."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        _fail(E_INVALID_ARGUMENT, f"{name} must be a number, not {type(value).__name__}")
    if not (lo <= v <= hi):  # also rejects NaN
        _fail(E_INVALID_ARGUMENT, f"{name}={v} is outside [{lo}, {hi}]")
    return v


def as_codes(level: object, index: int) -> npt.NDArray[np.int32]:
    """One level as a C-contiguous int32 array (no copy when it already is one)."""
    if isinstance(level, np.ndarray):
        arr = level
    else:
        arr = np.asarray(level)
        if arr.size == 0 and arr.dtype == np.float64:
            arr = arr.astype(np.int32)  # [] and [[]] carry no dtype; C reports the shape
    kind = arr.dtype.kind
    if kind not in "iu":
        raise CodeTypeError(
            f"codes level {index}: dtype {arr.dtype} is not an integer dtype",
            status=E_INVALID_ARGUMENT,
        )
    if arr.dtype != np.int32:
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < INT32_MIN or hi > INT32_MAX:
                bad = lo if lo < INT32_MIN else hi
                raise CodeRangeError(f"codes level {index}: code {bad} does not fit int32")
        arr = arr.astype(np.int32)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if not arr.dtype.isnative:  # big-endian int32
        arr = arr.astype(np.dtype(np.int32).newbyteorder("="))
    return arr


def as_seeds(seeds: object, n_batch: int) -> npt.NDArray[np.uint64]:
    """One non-negative integer seed per sequence, as uint64."""
    arr = np.asarray(seeds)
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype == np.float64:
            arr = arr.astype(np.uint64)
        else:
            _fail(E_INVALID_ARGUMENT, f"seeds must be integers, not {arr.dtype}", InputError)
    if arr.ndim != 1 or arr.shape[0] != n_batch:
        _fail(E_INVALID_ARGUMENT, f"seeds must have one value per sequence ({n_batch}), "
              f"got shape {arr.shape}")
    if arr.size and arr.dtype.kind == "i" and int(arr.min()) < 0:
        _fail(E_INVALID_ARGUMENT, "seeds must be non-negative")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def check_out(out: object) -> npt.NDArray[np.float32]:
    """A caller's output buffer: a writable, C-contiguous, native float32 numpy array."""
    if not isinstance(out, np.ndarray):
        _fail(E_INVALID_ARGUMENT, f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != np.float32 or not out.dtype.isnative:
        _fail(E_INVALID_ARGUMENT, f"out must be float32, not {out.dtype}")
    if not out.flags.c_contiguous:
        _fail(E_INVALID_ARGUMENT, "out must be C-contiguous")
    if not out.flags.writeable:
        _fail(E_INVALID_ARGUMENT, "out must be writable")
    out_f32: npt.NDArray[np.float32] = out
    return out_f32
