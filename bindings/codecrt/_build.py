"""cffi out-of-line API-mode builder for ``codecrt._native``.

CMake runs ``python bindings/codecrt/_build.py OUT.c`` at build time and compiles
OUT.c against native/include/codecrt.h (and codecrt_s3gen.h, S3Gen's part of the
API) and the static codecrt library. API mode
(not ABI mode) means no runtime code generation or libffi closures, so the module
works under systemd's MemoryDenyWriteExecute=yes, and the C compiler checks the
declarations of ``_cdef.h`` against the real header.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

_HERE = Path(__file__).resolve().parent

ffi = FFI()
ffi.cdef((_HERE / "_cdef.h").read_text(encoding="utf-8"))
ffi.set_source(
    "codecrt._native",
    '#include "codecrt.h"\n'
    '#include "codecrt_s3gen.h"\n'
    "_Static_assert(CODECRT_API_VERSION == 9, \"_cdef.h mirrors API version 9\");\n"
    "_Static_assert(CODECRT_MAX_LEVELS == 32, \"_cdef.h: CODECRT_MAX_LEVELS\");\n"
    "_Static_assert(CODECRT_MAX_BACKENDS == 4, \"_cdef.h: CODECRT_MAX_BACKENDS\");\n",
)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(f"usage: {argv[0]} OUTPUT.c\n")
        return 2
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    # emit_c_code rewrites the file only when its content changes.
    ffi.emit_c_code(str(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
