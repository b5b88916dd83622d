"""codecrt: Python bindings of the codecd runtime (neural audio codec decoders on ggml).

::

    import codecrt
    with codecrt.Model("snac_24khz.gguf") as m, codecrt.Context(m, device="auto") as ctx:
        pcm = ctx.decode([c0, c1, c2])     # float32 [samples]; [B, T_l] levels -> [B, samples]

Streams (:class:`Stream`, :class:`LowLatencyStream`, :class:`FlowStream`) share
one interface, :class:`CodecStream`, and :func:`step` advances any mix of them.
Errors are typed (see ``codecrt._errors`` for the tree); each carries
``.status`` and ``.status_name`` of the native ``codecrt_status``.

The modules depend on each other in one direction only (no import cycles)::

    _errors, _args            (no native calls)
    _runtime                  (loads and checks the extension)
    _model, _voice
    _contextlike, _streaming  (protocols)
    _stream, _twostage
    _context
    _lowlatency, _flowstream
"""

from __future__ import annotations

from ._runtime import set_ggml_logging, version
from ._model import Model, ModelInfo
from ._voice import Voice
from ._streaming import CodecStream, StreamStats, Tick, step
from ._stream import (PULL_DONE, PULL_MORE, PULL_READY, Stream, StreamInfo, pull_many, push_many, step_begin,
                      step_end)
from ._context import Context, Stats
from ._lowlatency import LowLatencyStream
from ._flowstream import FlowStream, FlowTick, step_flows
from . import _twostage as diag  # noqa: F401  (codecrt.diag.diag_encode(ctx, tokens), ...)
from ._twostage import noise
from ._errors import (
    BackendError,
    BufferTooSmallError,
    CodecrtError,
    CodeRangeError,
    CodeShapeError,
    CodeTypeError,
    ComputeError,
    CorruptModelError,
    HyperparameterError,
    InputError,
    MissingTensorError,
    ModelError,
    ModelFileError,
    NotGGUFError,
    OutOfMemoryError,
    StateError,
    TensorError,
    TooLargeError,
    TruncatedModelError,
    UnknownArchitectureError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BufferTooSmallError",
    "CodeRangeError",
    "CodeShapeError",
    "CodeTypeError",
    "CodecStream",
    "CodecrtError",
    "ComputeError",
    "Context",
    "CorruptModelError",
    "FlowStream",
    "FlowTick",
    "HyperparameterError",
    "InputError",
    "LowLatencyStream",
    "MissingTensorError",
    "Model",
    "ModelError",
    "ModelFileError",
    "ModelInfo",
    "NotGGUFError",
    "OutOfMemoryError",
    "PULL_DONE",
    "PULL_MORE",
    "PULL_READY",
    "Stats",
    "StateError",
    "Stream",
    "StreamInfo",
    "StreamStats",
    "TensorError",
    "Tick",
    "TooLargeError",
    "TruncatedModelError",
    "UnknownArchitectureError",
    "UnsupportedError",
    "Voice",
    "diag",
    "noise",
    "pull_many",
    "push_many",
    "step_begin",
    "step_end",
    "set_ggml_logging",
    "step",
    "step_flows",
    "version",
]
