"""Context: one device, its scheduler, buffers and cached graphs (``codecrt_context``).

Every C call's status goes through ``_errors._check``. A context decodes whole
utterances (:meth:`Context.decode`), runs the two stages of flow models
(:meth:`Context.flow`, :meth:`Context.vocode`), and owns the slots of its
streams (:meth:`Context.stream`, :meth:`Context.step`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import _twostage
from ._args import INT32_MAX, INT32_MIN, UINT64_MAX, as_codes, as_seeds, check_out, float_arg, int_arg
from ._errors import E_INVALID_ARGUMENT, E_STATE, CodeShapeError, _check, _fail
from ._model import Model, ModelInfo
from ._native import ffi, lib
from ._runtime import ERR_SIZE, c_str
from ._stream import Stream, step_native
from ._voice import Voice, as_voice

__all__ = ["Context", "GraphKind", "PRECISIONS", "Stats"]

_GRAPH_KINDS: dict[str, int] = {
    "decode": int(lib.CODECRT_GRAPH_DECODE),
    "stream": int(lib.CODECRT_GRAPH_STREAM),
    "stream_edge": int(lib.CODECRT_GRAPH_STREAM_EDGE),
    "encode": int(lib.CODECRT_GRAPH_ENCODE),
    "flow_step": int(lib.CODECRT_GRAPH_FLOW_STEP),
    "f0": int(lib.CODECRT_GRAPH_F0),
    "vocode": int(lib.CODECRT_GRAPH_VOCODE),
}

# codecrt_precision by value: products in F32, with bfloat16 operands, or as three
# bfloat16 products of split operands (F32-grade)
PRECISIONS: tuple[str, ...] = ("f32", "bf16", "bf16x3")
assert PRECISIONS.index("bf16") == int(lib.CODECRT_PRECISION_BF16)
assert PRECISIONS.index("bf16x3") == int(lib.CODECRT_PRECISION_BF16X3)

GraphKind = Literal["decode", "stream", "stream_edge", "encode", "flow_step", "f0", "vocode"] | int


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
    #: the host's part of the last launch (ms): taking the graph (built and allocated, or
    #: reused), filling its inputs, handing it to the backend (codecrt_stats)
    last_acquire_ms: float = 0.0
    last_inputs_ms: float = 0.0
    last_enqueue_ms: float = 0.0
    #: CPU threads the last graph computed with: the context's n_threads, or fewer for a graph
    #: whose work per node does not pay for them (docs/runtime.md); 0 off the CPU backend
    last_threads: int = 0


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
            if not device.isprintable() or not device.isascii():  # a NUL would cut it short
                _fail(E_INVALID_ARGUMENT, f"device {device!r}: not a device name")
            keep = ffi.new("char[]", device.encode("ascii"))
            params.device = keep
        else:
            params.device = ffi.NULL
        params.n_threads = int_arg("n_threads", n_threads, INT32_MIN, INT32_MAX)
        if max_frames is not None:
            params.max_frames = int_arg("max_frames", max_frames, INT32_MIN, INT32_MAX)
        if max_batch is not None:
            params.max_batch = int_arg("max_batch", max_batch, INT32_MIN, INT32_MAX)
        params.frame_bucket = int_arg("frame_bucket", frame_bucket, INT32_MIN, INT32_MAX)
        params.batch_bucket = 1 if batch_bucket else 0
        params.stream_chunk_frames = int_arg("stream_chunk_frames", stream_chunk_frames,
                                              INT32_MIN, INT32_MAX)
        if max_streams is not None:
            params.max_streams = int_arg("max_streams", max_streams, INT32_MIN, INT32_MAX)
        if precision not in PRECISIONS:
            _fail(E_INVALID_ARGUMENT, f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        params.precision = PRECISIONS.index(precision)

        out = ffi.new("codecrt_context **")
        err = ffi.new("char[]", ERR_SIZE)
        with model._lock:
            status = lib.codecrt_context_init(model._handle(), params, out, err, ERR_SIZE)
        del keep  # copied by init
        _check(status, lambda: c_str(err))
        self._ptr = out[0]
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._model_info = model.info
        self._max_frames = int(params.max_frames)
        self._max_batch = int(params.max_batch)
        self._device = c_str(lib.codecrt_context_device(self._ptr))
        self._precision = precision

    # ------------------------------------------------------------ helpers

    def _handle(self) -> Any:
        ptr = self._ptr
        if ptr is None:
            _fail(E_STATE, "the context is closed")
        return ptr

    def _last_error(self) -> str:
        ptr = self._ptr
        return "" if ptr is None else c_str(lib.codecrt_context_last_error(ptr))

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
        f = int_arg("n_frames", n_frames, INT32_MIN, INT32_MAX)
        b = int_arg("n_batch", n_batch, INT32_MIN, INT32_MAX)
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
            k = int_arg("kind", kind, INT32_MIN, INT32_MAX)
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
            backends=tuple(c_str(st.backend_names[i]) for i in range(n)),
            compute_buffer_bytes=tuple(int(st.compute_buffer_bytes[i]) for i in range(n)),
            weight_bytes=int(st.weight_bytes),
            last_compute_ms=float(st.last_compute_ms),
            state_bytes=int(st.state_bytes),
            streams_active=int(st.streams_active),
            graph_splits=int(st.graph_splits),
            last_acquire_ms=float(st.last_acquire_ms),
            last_inputs_ms=float(st.last_inputs_ms),
            last_enqueue_ms=float(st.last_enqueue_ms),
            last_threads=int(st.last_threads),
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
        array; the result is then a view of it. Models that need a voice
        (S3Gen; their :class:`ModelInfo` says so) take a :class:`Voice`, and flow models
        ``n_steps`` (0: the model's default) and ``cfg_rate`` (None: default).
        """
        levels = [as_codes(level, i) for i, level in enumerate(codes)]
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
        if n_batch > INT32_MAX:
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
        params.seed = int_arg("seed", seed, 0, UINT64_MAX)
        params.n_steps = int_arg("n_steps", n_steps, 0, 100)
        if cfg_rate is not None:
            params.cfg_rate = float_arg("cfg_rate", cfg_rate, 0.0, 10.0)
        voice_keep = None
        if voice is not None:
            voice_keep = as_voice(voice)
            params.voice = voice_keep._handle()
        seeds_arr = None
        if seeds is not None:
            seeds_arr = as_seeds(seeds, n_batch)
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
            pcm = check_out(out)
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
        return _twostage.flow(self, tokens, voice, seed=seed, n_steps=n_steps, cfg_rate=cfg_rate,
                              finalize=finalize)

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
        return _twostage.vocode(self, mel, seed=seed, sample_offset=sample_offset,
                                cache_source=cache_source, return_source=return_source)

    def stream(self, *, noise: bool = False, seed: int = 0) -> Stream:
        """A new :class:`Stream` on this context (takes a slot of the pool)."""
        return Stream(self, noise=noise, seed=seed)

    def step(self, streams: Sequence[Stream]) -> int:
        """One tick: advance every ready stream in ``streams`` by one chunk, in one graph.

        Returns how many advanced (0: none was ready).
        """
        return step_native(self, streams)

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
