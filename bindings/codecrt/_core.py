"""Model and Context: thin, copy-free wrappers over the codecrt C API.

Every C call's status goes through ``_errors._check``. Validation here is kept
to what only Python can check (dtypes, ndim, object lifetime); lengths, ranges,
limits and capacities are passed to C as they are, so the C side reports them.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from . import _errors
from ._errors import (
    E_INVALID_ARGUMENT,
    E_STATE,
    CodeRangeError,
    CodeShapeError,
    CodeTypeError,
    InputError,
    ModelFileError,
    _check,
    _fail,
)
from ._native import ffi, lib

if TYPE_CHECKING:
    from ._stream import Stream
    from ._voice import Voice

__all__ = ["Context", "Model", "ModelInfo", "Stats", "set_ggml_logging", "version"]

_ERR_SIZE = 1024
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1

_GRAPH_KINDS: dict[str, int] = {
    "decode": int(lib.CODECRT_GRAPH_DECODE),
    "stream": int(lib.CODECRT_GRAPH_STREAM),
    "stream_edge": int(lib.CODECRT_GRAPH_STREAM_EDGE),
    "encode": int(lib.CODECRT_GRAPH_ENCODE),
    "flow_step": int(lib.CODECRT_GRAPH_FLOW_STEP),
    "f0": int(lib.CODECRT_GRAPH_F0),
    "vocode": int(lib.CODECRT_GRAPH_VOCODE),
}
_WEIGHT_TYPES: dict[int, str] = {
    int(lib.CODECRT_WEIGHT_F32): "f32",
    int(lib.CODECRT_WEIGHT_F16): "f16",
}

# codecrt_precision by value: products in F32, or with bfloat16 operands
PRECISIONS: tuple[str, ...] = ("f32", "bf16")
assert PRECISIONS.index("bf16") == int(lib.CODECRT_PRECISION_BF16)

GraphKind = Literal["decode", "stream", "stream_edge", "encode", "flow_step", "f0", "vocode"] | int


def _str(p: Any) -> str:
    """A C string (char* or char[N]) as str; NULL -> ''."""
    if p == ffi.NULL:
        return ""
    return bytes(ffi.string(p)).decode("utf-8", errors="replace")


def _status_name(status: int) -> str:
    return _str(lib.codecrt_status_name(status))


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
    if int(lib.CODECRT_API_VERSION) != 3:
        raise ImportError(f"codecrt: runtime API version {lib.CODECRT_API_VERSION}, bindings 3")


_verify_binding()


def version() -> str:
    """The runtime's version string (``codecrt_version``)."""
    return _str(lib.codecrt_version())


def set_ggml_logging(enabled: bool) -> None:
    """Turn ggml's own log lines (stderr) on or off, process-wide. Off by default."""
    lib.codecrt_set_ggml_logging(1 if enabled else 0)


def _int_arg(name: str, value: object, lo: int, hi: int) -> int:
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


def _float_arg(name: str, value: object, lo: float, hi: float) -> float:
    """A finite float argument in [lo, hi]; InputError otherwise."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        _fail(E_INVALID_ARGUMENT, f"{name} must be a number, not {type(value).__name__}")
    if not (lo <= v <= hi):  # also rejects NaN
        _fail(E_INVALID_ARGUMENT, f"{name}={v} is outside [{lo}, {hi}]")
    return v


def _voice_arg(voice: object, ctx: Context) -> Voice:
    from ._voice import Voice

    if not isinstance(voice, Voice):
        _fail(E_INVALID_ARGUMENT, f"voice must be a codecrt.Voice, not {type(voice).__name__}")
    return voice


# ------------------------------------------------------------------ model


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
    needs_voice: bool = False
    default_steps: int = 0  # flow models: Euler steps by default

    @classmethod
    def _from_c(cls, info: Any) -> ModelInfo:
        n = max(0, min(int(info.n_levels), int(lib.CODECRT_MAX_LEVELS)))
        wt = int(info.weight_type)
        return cls(
            arch=_str(info.arch),
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
        err = ffi.new("char[]", _ERR_SIZE)
        status = lib.codecrt_model_load(c_path, out, err, _ERR_SIZE)
        try:
            _check(status, lambda: _str(err))
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
        n = _int_arg("n_frames", n_frames, -(2**63), 2**63 - 1)
        with self._lock:
            samples = int(lib.codecrt_model_samples_for_frames(self._handle(), n))
        if samples == 0 and n != 0:
            _fail(E_INVALID_ARGUMENT, f"invalid n_frames={n}")
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


# ---------------------------------------------------------------- context


@dataclass(frozen=True)
class Stats:
    """A context's counters (``codecrt_stats``)."""

    graphs_built: int
    graphs_reused: int
    sched_resets: int
    sched_recreations: int
    reservations: int
    computes: int
    backends: tuple[str, ...]
    compute_buffer_bytes: tuple[int, ...]
    weight_bytes: int
    last_compute_ms: float
    state_bytes: int
    streams_active: int
    graph_splits: int


def _as_codes(level: object, index: int) -> npt.NDArray[np.int32]:
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
            if lo < _INT32_MIN or hi > _INT32_MAX:
                bad = lo if lo < _INT32_MIN else hi
                raise CodeRangeError(f"codes level {index}: code {bad} does not fit int32")
        arr = arr.astype(np.int32)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if not arr.dtype.isnative:  # big-endian int32
        arr = arr.astype(np.dtype(np.int32).newbyteorder("="))
    return arr


class Context:
    """One device, its scheduler, buffers and cached graphs (``codecrt_context``).

    Not thread-safe in C; this wrapper serialises calls on one context with a
    lock, so sharing one is safe but not parallel. Use one context per thread
    for parallel decodes.
    """

    _ptr: Any = None  # class default: __del__ is safe after a failed __init__

    def __init__(
        self,
        model: Model,
        device: str | None = "auto",
        n_threads: int = 0,
        max_frames: int | None = None,
        max_batch: int | None = None,
        frame_bucket: int = 0,
        batch_bucket: bool = False,
        stream_chunk_frames: int = 0,
        max_streams: int | None = None,
        precision: str = "f32",
    ) -> None:
        self._lock = threading.RLock()
        if not isinstance(model, Model):
            _fail(E_INVALID_ARGUMENT, f"model must be a codecrt.Model, not {type(model).__name__}")
        params = ffi.new("codecrt_context_params *")
        params[0] = lib.codecrt_context_default_params()
        keep = None
        if device is not None:
            if not isinstance(device, str):
                _fail(E_INVALID_ARGUMENT, f"device must be a str, not {type(device).__name__}")
            keep = ffi.new("char[]", device.encode("utf-8"))
            params.device = keep
        else:
            params.device = ffi.NULL
        params.n_threads = _int_arg("n_threads", n_threads, _INT32_MIN, _INT32_MAX)
        if max_frames is not None:
            params.max_frames = _int_arg("max_frames", max_frames, _INT32_MIN, _INT32_MAX)
        if max_batch is not None:
            params.max_batch = _int_arg("max_batch", max_batch, _INT32_MIN, _INT32_MAX)
        params.frame_bucket = _int_arg("frame_bucket", frame_bucket, _INT32_MIN, _INT32_MAX)
        params.batch_bucket = 1 if batch_bucket else 0
        params.stream_chunk_frames = _int_arg("stream_chunk_frames", stream_chunk_frames,
                                              _INT32_MIN, _INT32_MAX)
        if max_streams is not None:
            params.max_streams = _int_arg("max_streams", max_streams, _INT32_MIN, _INT32_MAX)
        if precision not in PRECISIONS:
            _fail(E_INVALID_ARGUMENT, f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        params.precision = PRECISIONS.index(precision)

        out = ffi.new("codecrt_context **")
        err = ffi.new("char[]", _ERR_SIZE)
        with model._lock:
            status = lib.codecrt_context_init(model._handle(), params, out, err, _ERR_SIZE)
        del keep  # copied by init
        _check(status, lambda: _str(err))
        self._ptr = out[0]
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._model_info = model.info
        self._max_frames = int(params.max_frames)
        self._max_batch = int(params.max_batch)
        self._device = _str(lib.codecrt_context_device(self._ptr))
        self._precision = precision

    # ------------------------------------------------------------ helpers

    def _handle(self) -> Any:
        ptr = self._ptr
        if ptr is None:
            _fail(E_STATE, "the context is closed")
        return ptr

    def _last_error(self) -> str:
        ptr = self._ptr
        return "" if ptr is None else _str(lib.codecrt_context_last_error(ptr))

    # ---------------------------------------------------------------- API

    @property
    def device(self) -> str:
        """Name of the device actually used ("CPU", "CUDA0", ...)."""
        return self._device

    @property
    def precision(self) -> str:
        """``"f32"``, or ``"bf16"``: products with bfloat16 operands (S3Gen on AVX512-BF16 CPUs)."""
        return self._precision

    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def max_batch(self) -> int:
        """The largest batch one decode (or one graph of streams) takes."""
        return self._max_batch

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def reserve(self, n_frames: int, n_batch: int = 1) -> None:
        """Reserve decode buffers for up to ``n_frames`` frames x ``n_batch`` sequences."""
        f = _int_arg("n_frames", n_frames, _INT32_MIN, _INT32_MAX)
        b = _int_arg("n_batch", n_batch, _INT32_MIN, _INT32_MAX)
        with self._lock:
            _check(lib.codecrt_context_reserve(self._handle(), f, b), self._last_error)

    def set_recreate_policy(self, kind: GraphKind, enabled: bool) -> None:
        """Recreate the kind's scheduler after each graph release (``"decode"``/``"stream"``)."""
        if isinstance(kind, str):
            try:
                k = _GRAPH_KINDS[kind]
            except KeyError:
                _fail(E_INVALID_ARGUMENT,
                      f"unknown graph kind {kind!r} (expected one of {sorted(_GRAPH_KINDS)})")
        else:
            k = _int_arg("kind", kind, _INT32_MIN, _INT32_MAX)
        with self._lock:
            _check(lib.codecrt_context_set_recreate_policy(self._handle(), k, 1 if enabled else 0),
                   self._last_error)

    @property
    def stats(self) -> Stats:
        st = ffi.new("codecrt_stats *")
        with self._lock:
            _check(lib.codecrt_context_get_stats(self._handle(), st), self._last_error)
        n = max(0, min(int(st.n_backends), int(lib.CODECRT_MAX_BACKENDS)))
        return Stats(
            graphs_built=int(st.graphs_built),
            graphs_reused=int(st.graphs_reused),
            sched_resets=int(st.sched_resets),
            sched_recreations=int(st.sched_recreations),
            reservations=int(st.reservations),
            computes=int(st.computes),
            backends=tuple(_str(st.backend_names[i]) for i in range(n)),
            compute_buffer_bytes=tuple(int(st.compute_buffer_bytes[i]) for i in range(n)),
            weight_bytes=int(st.weight_bytes),
            last_compute_ms=float(st.last_compute_ms),
            state_bytes=int(st.state_bytes),
            streams_active=int(st.streams_active),
            graph_splits=int(st.graph_splits),
        )

    def decode(
        self,
        codes: Sequence[npt.ArrayLike] | npt.NDArray[np.integer[Any]],
        *,
        noise: bool = False,
        seed: int = 0,
        seeds: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        out: npt.NDArray[np.float32] | None = None,
        voice: Voice | None = None,
        n_steps: int = 0,
        cfg_rate: float | None = None,
    ) -> npt.NDArray[np.float32]:
        """Decode codes to float32 PCM.

        ``codes`` holds one integer array per level, each ``[T_l]`` (one
        sequence; the result is ``[samples]``) or ``[B, T_l]`` (a batch; the
        result is ``[B, samples]``). ``seeds`` (B values) overrides ``seed``
        per sequence. ``out`` is an optional preallocated C-contiguous float32
        array; the result is then a view of it. Models with
        ``info.needs_voice`` (S3Gen) take a :class:`Voice`, and flow models
        ``n_steps`` (0: the model's default) and ``cfg_rate`` (None: default).
        """
        levels = [_as_codes(level, i) for i, level in enumerate(codes)]
        n_levels = len(levels)
        ndims = {a.ndim for a in levels}
        if len(ndims) > 1:
            raise CodeShapeError(f"codes levels mix ndim {sorted(ndims)}: all must be 1-D or 2-D")
        ndim = ndims.pop() if ndims else 1
        if ndim == 1:
            n_batch = 1
        elif ndim == 2:
            batches = {a.shape[0] for a in levels}
            if len(batches) > 1:
                raise CodeShapeError(f"codes levels have different batch sizes {sorted(batches)}")
            n_batch = batches.pop()
        else:
            raise CodeShapeError(f"codes levels must be 1-D [T] or 2-D [B, T], not {ndim}-D")
        if n_batch > _INT32_MAX:
            raise CodeShapeError(f"batch size {n_batch} does not fit int32")

        lengths = ffi.new("int64_t[]", max(n_levels, 1))
        ptrs = ffi.new("const int32_t *[]", max(n_levels, 1))
        bufs = []  # keep the buffers alive during the call
        for i, a in enumerate(levels):
            lengths[i] = a.shape[-1]
            buf = ffi.from_buffer("int32_t[]", a)
            bufs.append(buf)
            ptrs[i] = buf
        c_codes = ffi.new("codecrt_codes *")
        c_codes.n_batch = n_batch
        c_codes.n_levels = n_levels
        c_codes.levels = ptrs
        c_codes.lengths = lengths

        params = ffi.new("codecrt_decode_params *")
        params[0] = lib.codecrt_decode_default_params()
        params.noise = 1 if noise else 0
        params.seed = _int_arg("seed", seed, 0, _UINT64_MAX)
        params.n_steps = _int_arg("n_steps", n_steps, 0, 100)
        if cfg_rate is not None:
            params.cfg_rate = _float_arg("cfg_rate", cfg_rate, 0.0, 10.0)
        voice_keep = None
        if voice is not None:
            voice_keep = _voice_arg(voice, self)
            params.voice = voice_keep._handle()
        seeds_arr = None
        if seeds is not None:
            seeds_arr = _as_seeds(seeds, n_batch)
            params.seeds = ffi.from_buffer("uint64_t[]", seeds_arr)

        # The output size. Inconsistent lengths are the C side's to report: size
        # the buffer for the longest level so that capacity is never the error
        # reported in their place, and skip the allocation when the request is
        # beyond the context's limits (C reports E_TOO_LARGE before capacity).
        info = self._model_info
        n_frames = 0
        for i, a in enumerate(levels):
            stride = info.level_strides[i] if i < len(info.level_strides) else 1
            n_frames = max(n_frames, int(a.shape[-1]) * max(stride, 1))
        samples = n_frames * max(info.hop_length, 0)
        total = n_batch * samples
        result_shape: tuple[int, ...] = (samples,) if ndim == 1 else (n_batch, samples)

        if out is not None:
            pcm = _check_out(out)
        elif n_frames <= self._max_frames and n_batch <= self._max_batch:
            pcm = np.empty(total, dtype=np.float32)
        else:
            pcm = np.empty(0, dtype=np.float32)
        pcm_ptr = ffi.from_buffer("float[]", pcm, require_writable=True)
        written = ffi.new("size_t *")

        with self._lock:
            status = lib.codecrt_decode(self._handle(), params, c_codes, pcm_ptr, pcm.size,
                                        written)
            _check(status, self._last_error)
        del bufs, seeds_arr, voice_keep

        n = int(written[0])
        flat = pcm.reshape(-1)
        if n != total:  # the C side is the authority on sizes
            result_shape = (n,) if ndim == 1 else (n_batch, n // max(n_batch, 1))
        if out is not None and out.shape == result_shape:
            return out
        return flat[:n].reshape(result_shape)

    def flow(
        self,
        tokens: npt.ArrayLike,
        voice: Voice,
        *,
        seed: int = 0,
        n_steps: int = 0,
        cfg_rate: float | None = None,
        finalize: bool = True,
    ) -> npt.NDArray[np.float32]:
        """Two-stage models: speech tokens to mel ``[n_mels, frames]`` (after the voice's prompt).

        ``finalize=False`` treats the last 3 tokens as lookahead only (no mel
        for them), as a stream does until more tokens arrive.
        """
        from ._twostage import flow

        return flow(self, tokens, voice, seed=seed, n_steps=n_steps, cfg_rate=cfg_rate, finalize=finalize)

    def vocode(
        self,
        mel: npt.ArrayLike,
        *,
        seed: int = 0,
        sample_offset: int = 0,
        cache_source: npt.ArrayLike | None = None,
        return_source: bool = False,
    ) -> Any:
        """Two-stage models: mel ``[n_mels, frames]`` to PCM (no fade-in).

        The vocoder's random source is keyed by (seed, sample_offset + i);
        ``cache_source`` replaces the start of the harmonic source. With
        ``return_source`` the result is ``(pcm, source)``.
        """
        from ._twostage import vocode

        return vocode(self, mel, seed=seed, sample_offset=sample_offset, cache_source=cache_source,
                      return_source=return_source)

    def stream(self, *, noise: bool = False, seed: int = 0) -> Stream:
        """A new :class:`Stream` on this context (takes a slot of the pool)."""
        from ._stream import Stream

        return Stream(self, noise=noise, seed=seed)

    def step(self, streams: Sequence[Stream]) -> int:
        """One tick: advance every ready stream in ``streams`` by one chunk, in one graph.

        Returns how many advanced (0: none was ready).
        """
        ptrs = ffi.new("codecrt_stream *[]", max(len(streams), 1))
        for i, s in enumerate(streams):
            if s._ctx is not self:
                _fail(E_INVALID_ARGUMENT, f"stream {i} belongs to another context")
            ptrs[i] = s._handle()
        n = ffi.new("int32_t *")
        with self._lock:
            _check(lib.codecrt_context_step(self._handle(), ptrs, len(streams), n),
                   self._last_error)
        return int(n[0])

    def close(self) -> None:
        """Free the context, closing its streams first. Idempotent."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            for s in list(getattr(self, "_streams", ())):
                s.close()
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                lib.codecrt_context_free(ptr)

    def __enter__(self) -> Context:
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
        state = "closed" if self.closed else self._device
        return f"<codecrt.Context {self._model_info.arch if hasattr(self, '_model_info') else '?'}"\
               f" on {state}>"


def _as_seeds(seeds: object, n_batch: int) -> npt.NDArray[np.uint64]:
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


def _check_out(out: object) -> npt.NDArray[np.float32]:
    if not isinstance(out, np.ndarray):
        _fail(E_INVALID_ARGUMENT, f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != np.float32 or not out.dtype.isnative:
        _fail(E_INVALID_ARGUMENT, f"out must be float32, not {out.dtype}")
    if not out.flags.c_contiguous:
        _fail(E_INVALID_ARGUMENT, "out must be C-contiguous")
    if not out.flags.writeable:
        _fail(E_INVALID_ARGUMENT, "out must be writable")
    return out
