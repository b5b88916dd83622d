"""Stream: incremental decode of one utterance (``codecrt_stream``).

::

    s = ctx.stream()
    s.push([l0, l1, l2])      # any amounts per level, as codes arrive
    ctx.step([s, other])      # one tick for every ready stream, in one graph
    pcm = s.pull()            # the samples that are final
    s.finish()                # then step until s.done; pull the tail

The output equals ``ctx.decode`` of the whole utterance, sample for sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._args import UINT64_MAX, as_codes, check_out, int_arg
from ._contextlike import ContextLike
from ._errors import (E_INVALID_ARGUMENT, E_STATE, CodecrtError, CodeShapeError, _check, _fail,
                      error_for)
from ._native import ffi, lib
from ._runtime import c_str
from ._streaming import StreamStats, Tick

__all__ = ["Stream", "StreamInfo", "step_native", "step_exact", "step_begin", "step_end", "push_many", "pull_many",
           "PULL_READY", "PULL_DONE", "PULL_MORE"]

#: ``pull_many`` flags of a stream after its pull: a step would advance it; it is done (every
#: sample produced); samples are left (the buffer ran out before they all fit)
PULL_READY, PULL_DONE, PULL_MORE = 1, 2, 4


@dataclass(frozen=True)
class StreamInfo:
    """A stream's position (``codecrt_stream_info``)."""

    frames_pushed: int
    frames_decoded: int
    samples_ready: int
    samples_pulled: int
    total_samples: int  # -1 until finish()
    chunk_frames: int
    latency_samples: int
    slot: int
    finished: bool
    done: bool
    ready: bool


def _stream_ptrs(ctx: ContextLike, streams: Sequence[Stream]) -> Any:
    """The streams' native handles: with ``ctx._lock`` held, so that no other thread's
    :meth:`Stream.close` frees one between this and the call that uses it."""
    ptrs = ffi.new("codecrt_stream *[]", max(len(streams), 1))
    for i, s in enumerate(streams):
        if not isinstance(s, Stream):
            _fail(E_INVALID_ARGUMENT, f"streams[{i}] is a {type(s).__name__}, not a codecrt.Stream")
        if s._ctx is not ctx:
            _fail(E_INVALID_ARGUMENT, f"stream {i} belongs to another context")
        ptrs[i] = s._handle()
    return ptrs


def step_native(ctx: ContextLike, streams: Sequence[Stream]) -> int:
    """One tick of the runtime over ``streams`` (all on ``ctx``), in one graph; how many advanced."""
    n = ffi.new("int32_t *")
    with ctx._lock:
        ptrs = _stream_ptrs(ctx, streams)
        _check(lib.codecrt_context_step(ctx._handle(), ptrs, len(streams), n), ctx._last_error)
    return int(n[0])


def step_begin(ctx: ContextLike, streams: Sequence[Stream]) -> None:
    """The first half of :func:`step_native` (``codecrt_context_step_begin``): the tick's graph
    is launched and left on the device. Until :func:`step_end`, codes may be pushed
    (:meth:`Stream.push`, :func:`push_many`) and samples pulled; any other call on the context
    or its streams ends the tick first."""
    with ctx._lock:
        ptrs = _stream_ptrs(ctx, streams)
        _check(lib.codecrt_context_step_begin(ctx._handle(), ptrs, len(streams)), ctx._last_error)


def step_end(ctx: ContextLike) -> int:
    """The second half (``codecrt_context_step_end``): waits for the device, advances the
    streams; how many advanced (0 when nothing was in flight)."""
    n = ffi.new("int32_t *")
    with ctx._lock:
        _check(lib.codecrt_context_step_end(ctx._handle(), n), ctx._last_error)
    return int(n[0])


def step_exact(ctx: ContextLike, streams: Sequence[Any]) -> Tick:
    """The stepper of exact streams and of the low-latency streams built on them: their
    runtime streams (``.native``) advance together in one graph."""
    n = step_native(ctx, [s.native for s in streams])
    return Tick(n, {}, n)


def _context_of(streams: Sequence[Stream | None]) -> ContextLike | None:
    """The one context of ``streams`` (None entries aside), or None when all are None."""
    ctx = None
    for i, s in enumerate(streams):
        if s is None:
            continue
        if not isinstance(s, Stream):
            _fail(E_INVALID_ARGUMENT, f"streams[{i}] is a {type(s).__name__}, not a codecrt.Stream")
        if ctx is None:
            ctx = s._ctx
        elif s._ctx is not ctx:
            _fail(E_INVALID_ARGUMENT, f"stream {i} belongs to another context")
    return ctx


def _handles(streams: Sequence[Stream | None]) -> Any:
    """The streams' native handles, None -> NULL: with their context's lock held (as
    :func:`_stream_ptrs`)."""
    return ffi.new("codecrt_stream *[]", [ffi.NULL if s is None else s._handle()
                                          for s in streams])


def _u32(name: str, a: npt.NDArray[Any]) -> Any:
    if not isinstance(a, np.ndarray) or a.dtype != np.uint32 or not a.dtype.isnative or \
            a.ndim != 1 or not a.flags.c_contiguous:
        _fail(E_INVALID_ARGUMENT, f"{name} must be a 1-D C-contiguous native uint32 array")
    return ffi.from_buffer("uint32_t[]", a)


def push_many(streams: Sequence[Stream | None], n_levels: npt.NDArray[np.uint32],
              lengths: npt.NDArray[np.uint32], codes: npt.NDArray[np.int32]
              ) -> dict[int, CodecrtError]:
    """Codes for many streams of one context in one call (``codecrt_streams_push``): stream
    ``i`` gets ``n_levels[i]`` levels, their lengths the next entries of ``lengths``, their
    codes the next ones of ``codes`` (a packed batch, e.g. a PUSH record's arrays, read in
    place). None entries are skipped. Each stream is validated and appended as by
    :meth:`Stream.push`; the errors by stream index (nothing pushed to those)."""
    n = len(streams)
    if len(n_levels) != n:
        _fail(E_INVALID_ARGUMENT, f"{len(n_levels)} level counts for {n} streams")
    if not isinstance(codes, np.ndarray) or codes.dtype != np.int32 or not codes.dtype.isnative \
            or codes.ndim != 1 or not codes.flags.c_contiguous:
        _fail(E_INVALID_ARGUMENT, "codes must be a 1-D C-contiguous native int32 array")
    if n == 0:
        return {}
    ctx = _context_of(streams)
    status = ffi.new("codecrt_status[]", n)
    nl, ln = _u32("n_levels", n_levels), _u32("lengths", lengths)
    cd = ffi.from_buffer("int32_t[]", codes)
    if ctx is None:
        return {}
    with ctx._lock:
        ptrs = _handles(streams)
        _check(lib.codecrt_streams_push(ptrs, n, nl, ln, len(lengths), cd, len(codes), status),
               "bad packed batch: level counts, lengths and codes disagree")
        errors: dict[int, CodecrtError] = {}
        if any(status):  # each stream's message, before another thread may close it
            for i in range(n):
                if status[i] and streams[i] is not None:
                    errors[i] = error_for(status[i], streams[i]._last_error())  # type: ignore[union-attr]
    return errors


def pull_many(streams: Sequence[Stream | None], out: npt.NDArray[np.float32]
              ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """The final samples of many streams of one context into ``out``, stream after stream
    (``codecrt_streams_pull``): (samples per stream, flags per stream: PULL_READY,
    PULL_DONE, PULL_MORE). A stream whose samples do not all fit keeps the rest
    (PULL_MORE): pull again."""
    n = len(streams)
    counts = np.zeros(n, dtype=np.int64)
    flags = np.zeros(n, dtype=np.int32)
    if n == 0:
        return counts, flags
    out = check_out(out)
    ctx = _context_of(streams)
    if ctx is None:
        return counts, flags
    with ctx._lock:
        ptrs = _handles(streams)
        _check(lib.codecrt_streams_pull(ptrs, n, ffi.from_buffer("float[]", out), out.size,
                                        ffi.from_buffer("int64_t[]", counts),
                                        ffi.from_buffer("int32_t[]", flags)))
    return counts, flags


class Stream:
    """One utterance decoded incrementally on a :class:`Context`.

    Owns a slot of the context's state pool until ``close()``. Calls are
    serialised with the context's lock (a stream is used with its context).
    """

    _ptr: Any = None
    stepper = staticmethod(step_exact)

    def __init__(self, ctx: ContextLike, *, noise: bool = False, seed: int = 0) -> None:
        self._ctx = ctx
        params = ffi.new("codecrt_stream_params *")
        params[0] = lib.codecrt_stream_default_params()
        params.noise = 1 if noise else 0
        params.seed = int_arg("seed", seed, 0, UINT64_MAX)
        out = ffi.new("codecrt_stream **")
        self._cinfo = ffi.new("codecrt_stream_info *")  # reused by every query
        with ctx._lock:
            _check(lib.codecrt_stream_init(ctx._handle(), params, out), ctx._last_error)
            self._ptr = out[0]
            ctx._streams.add(self)
        self._n_levels = ctx.model_info.n_levels

    @property
    def native(self) -> Stream:
        """The runtime stream that a tick advances: this one."""
        return self

    def _handle(self) -> Any:
        ptr = self._ptr
        if ptr is None:
            _fail(E_STATE, "the stream is closed")
        return ptr

    def _last_error(self) -> str:
        ptr = self._ptr
        return "" if ptr is None else c_str(lib.codecrt_stream_last_error(ptr))

    def push(self, levels: Sequence[npt.ArrayLike]) -> None:
        """Append codes: one 1-D integer array per level, of any lengths (also 0).

        Validated whole first: on error nothing is appended.
        """
        arrs = [as_codes(level, i) for i, level in enumerate(levels)]
        if any(a.ndim != 1 for a in arrs):
            raise CodeShapeError("stream codes must be 1-D arrays, one per level")
        n = max(len(arrs), 1)
        lengths = ffi.new("int64_t[]", n)
        ptrs = ffi.new("const int32_t *[]", n)
        bufs = []
        for i, a in enumerate(arrs):
            lengths[i] = a.shape[0]
            buf = ffi.from_buffer("int32_t[]", a)
            bufs.append(buf)
            ptrs[i] = buf
        codes = ffi.new("codecrt_codes *")
        codes.n_batch = 1
        codes.n_levels = len(arrs)
        codes.levels = ptrs
        codes.lengths = lengths
        with self._ctx._lock:
            _check(lib.codecrt_stream_push(self._handle(), codes), self._last_error)
        del bufs

    def finish(self) -> None:
        """No more codes; the next ticks flush the tail."""
        with self._ctx._lock:
            _check(lib.codecrt_stream_finish(self._handle()), self._last_error)

    def reset(self) -> None:
        """Start a new utterance in the same slot, dropping everything pending."""
        with self._ctx._lock:
            _check(lib.codecrt_stream_reset(self._handle()), self._last_error)

    def pull(self, max_samples: int | None = None) -> npt.NDArray[np.float32]:
        """The final samples not pulled yet (at most ``max_samples``), float32."""
        with self._ctx._lock:
            ready = int(self._info_c().samples_ready)
            n = ready if max_samples is None else min(ready, max(0, int(max_samples)))
            pcm = np.empty(n, dtype=np.float32)
            got = ffi.new("size_t *")
            _check(lib.codecrt_stream_pull(self._handle(), ffi.from_buffer("float[]", pcm), n, got),
                   self._last_error)
        return pcm[: int(got[0])]

    def decode_ready(self) -> int:
        """Step this stream alone until it has nothing ready; returns the ticks taken."""
        ticks = 0
        while step_native(self._ctx, [self]):
            ticks += 1
        return ticks

    def _info_c(self) -> Any:
        """The native info struct, filled now (valid until the next query; hold the lock)."""
        _check(lib.codecrt_stream_get_info(self._handle(), self._cinfo), self._last_error)
        return self._cinfo

    @property
    def info(self) -> StreamInfo:
        with self._ctx._lock:
            info = self._info_c()
            return StreamInfo(
                frames_pushed=int(info.frames_pushed),
                frames_decoded=int(info.frames_decoded),
                samples_ready=int(info.samples_ready),
                samples_pulled=int(info.samples_pulled),
                total_samples=int(info.total_samples),
                chunk_frames=int(info.chunk_frames),
                latency_samples=int(info.latency_samples),
                slot=int(info.slot),
                finished=bool(info.finished),
                done=bool(info.done),
                ready=bool(info.ready),
            )

    @property
    def stats(self) -> StreamStats:
        with self._ctx._lock:
            info = self._info_c()
            return StreamStats(int(info.frames_pushed), int(info.frames_decoded),
                               int(info.total_samples), bool(info.finished), bool(info.ready),
                               bool(info.done))

    @property
    def done(self) -> bool:
        with self._ctx._lock:
            return bool(self._info_c().done)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Release the slot at once. Idempotent."""
        ctx = self._ctx
        with ctx._lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                lib.codecrt_stream_free(ptr)
                ctx._streams.discard(self)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # fallback only
        if self._ptr is not None:
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"<codecrt.Stream {'closed' if self.closed else 'open'}>"
