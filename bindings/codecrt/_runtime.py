"""The native library itself: the binding check at import, version, ggml logging, C strings.

Imported first by every module that calls the runtime: loading the extension
and checking that ``_cdef.h`` agrees with the compiled header happen here once.
"""

from __future__ import annotations

import os
from typing import Any

from . import _errors

# ggml's CPU backend computes each graph in an OpenMP parallel region with a
# barrier after every node. libgomp's default wait policy spins at those
# barriers and after each region; a stream tick is a few hundred small nodes,
# and where the cores are shared (other processes, the daemon's fronts) a
# spinning thread waits out its peer's whole time slice. Measured on 2 shared
# vCPUs, 4-frame SNAC ticks (docs/benchmarks.md, issue 19): 5.7-9.7x the offline
# decode's CPU time spinning, 1.6x passive, the stream exact either way. libgomp
# reads the variable when it loads, that is with the extension just below; a
# value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from ._native import ffi, lib  # noqa: E402

__all__ = ["ERR_SIZE", "c_str", "set_ggml_logging", "version"]

#: size of the error message buffers passed to the C calls that take one
ERR_SIZE = 1024


def c_str(p: Any) -> str:
    """A C string (char* or char[N]) as str; NULL -> ''."""
    if p == ffi.NULL:
        return ""
    return bytes(ffi.string(p)).decode("utf-8", errors="replace")


def _status_name(status: int) -> str:
    return c_str(lib.codecrt_status_name(status))


_errors._status_name = _status_name


def _verify_binding() -> None:
    """Fail at import, not at first use, if _cdef.h and codecrt.h disagree.

    The C compiler has checked the function signatures when the module was
    built; cffi checks a struct's layout (field offsets and sizes) the first
    time the type is used, so use every one now. The status values hard-coded in
    _errors must match the header's too.
    """
    for struct in ("codecrt_model_info", "codecrt_context_params", "codecrt_codes",
                   "codecrt_decode_params", "codecrt_stats", "codecrt_stream_params",
                   "codecrt_stream_info"):
        ffi.new(f"{struct} *")
    for value, name in _errors.STATUS_NAMES.items():
        if int(getattr(lib, name)) != value:
            raise ImportError(f"codecrt: {name} is {getattr(lib, name)} in the runtime, "
                              f"{value} in codecrt._errors")
    if int(lib.CODECRT_API_VERSION) != 9:
        raise ImportError(f"codecrt: runtime API version {lib.CODECRT_API_VERSION}, bindings 9")


_verify_binding()


def version() -> str:
    """The runtime's version string (``codecrt_version``)."""
    return c_str(lib.codecrt_version())


def set_ggml_logging(enabled: bool) -> None:
    """Turn ggml's own log lines (stderr) on or off, process-wide. Off by default."""
    lib.codecrt_set_ggml_logging(1 if enabled else 0)
