"""The decode engine: supervised worker processes that own the native runtime.

::

    pool = EnginePool(EngineConfig(models={"snac": "snac_24khz.gguf"}),
                      devices=["cuda:0", "cuda:1"], on_event=handle)
    await pool.start()                  # every worker loaded and warmed up
    pool.open(key, "snac")              # least-loaded worker
    pool.push(key, [l0, l1, l2])        # -> Audio events as chunks complete
    pool.finish(key)                    # -> Audio..., then Done
    await pool.probe(1.0)               # watchdog: every running worker answered
    await pool.close()

Each device gets one :class:`Engine`: a child process (:mod:`codecd._worker`)
that loads the models, creates one ``codecrt.Context`` per model, and runs the
tick loop. A ggml abort, a segfault or an allocator failure kills the child,
never the daemon: the engine sees the pipe close, fails every stream that was
on the worker with ``engine_restarted``, and starts a new worker (with backoff).

Why a plain ``subprocess`` (``python -c "import codecd._worker ..."``) with a
socketpair wrapped in ``multiprocessing.connection.Connection``: a fresh
interpreter (``fork`` would copy the daemon's threads, locks, event loop and
CUDA state), and, unlike ``multiprocessing``'s spawn context, no re-import of
the daemon's ``__main__`` in the child (an unguarded main script would run
again there), no hidden process bookkeeping, and an explicit argv, environment
(the parent's ``sys.path`` as PYTHONPATH) and fd. ``Connection`` gives the
length-prefixed pickle framing; a peer that dies mid-message is an
``EOFError``. The daemon side never blocks its event loop on the pipe: one
reader thread per worker hands message batches to the loop with
``call_soon_threadsafe`` and one writer thread drains a command queue whose
depth is bounded by the engine (backpressure is an exception to the caller,
never unbounded growth). Messages are lists of small tuples; PCM travels as the
bytes of a float32 array, codes as int32 arrays.

Events (delivered on the event loop, in order per stream, to ``on_event`` or
to :attr:`EnginePool.events`): :class:`Opened`, :class:`Audio`, :class:`Done`,
:class:`StreamError`. After ``Done`` or ``StreamError`` the key is gone; after
:meth:`EnginePool.cancel` no event comes for the key. Error codes are the
protocol's where one fits (``token_range``, ``broken_group``, ``busy``,
``backlog_exceeded``, ``unknown_model``, ``shutting_down``), else engine codes
(``engine_restarted``, ``engine_error``, ``out_of_memory``, ``bad_codes``,
``bad_state``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from ._worker import WorkerConfig

__all__ = [
    "EngineConfig", "Engine", "EnginePool", "Opened", "Audio", "Done", "StreamError",
    "EngineEvent", "EngineError", "EngineStartError", "BackpressureError", "BusyError",
    "UnknownModelError", "DuplicateStreamError", "UnknownStreamError",
    "ENGINE_RESTARTED", "SHUTTING_DOWN",
]

logger = logging.getLogger(__name__)
_worker_log = logging.getLogger("codecd._worker")

ENGINE_RESTARTED = "engine_restarted"
SHUTTING_DOWN = "shutting_down"

_STARTING, _READY, _RESTARTING, _CLOSING, _CLOSED = (
    "starting", "ready", "restarting", "closing", "closed")


# ------------------------------------------------------------------------ config


def child_pythonpath() -> str:
    """PYTHONPATH for a child that must import codecrt and codecd from where this
    process did: their parent folders first (a source checkout's bindings/ on
    sys.path must not shadow an installed codecrt with its built extension), then
    the rest of sys.path."""
    import codecd
    import codecrt

    first = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__ or "")))
             for m in (codecrt, codecd)]
    return os.pathsep.join(dict.fromkeys([*first, *(p for p in sys.path if p)]))


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by every worker of a pool (the device is per worker)."""

    models: dict[str, str]  # model name -> GGUF path
    n_threads: int = 0  # CPU threads per context (0: all cores); split them over CPU workers
    max_streams: int = 64  # per model per worker (the runtime's slot pool)
    max_batch: int = 64  # streams per tick
    stream_chunk_frames: int = 0  # 0: the model's default (its frame_multiple)
    batch_bucket: bool = True
    #: batch buckets warmed at start-up; None: the largest and 1 (see _worker.default_buckets)
    warm_buckets: tuple[int, ...] | None = None
    gather_ms: float = 2.0
    #: a push is refused (BackpressureError) when its stream has more than this many
    #: frames pushed and not yet returned as audio
    max_backlog_frames: int = 4096
    #: most commands queued for one worker before open/push are refused (BusyError)
    max_queued_commands: int = 4096
    start_timeout_s: float = 120.0  # spawn, load and warm-up of one worker
    stop_timeout_s: float = 5.0
    restart_backoff_s: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
    #: a worker up this long has its restart backoff reset
    stable_after_s: float = 60.0
    #: probe() kills a worker that does not answer in time (it is then restarted)
    kill_unresponsive: bool = True
    debug_commands: bool = False  # tests: allow the worker's "_crash" command
    #: voice name -> voice file, for models that need a voice (S3Gen)
    voices: dict[str, str] = field(default_factory=dict)
    flow_first_chunk: int = 10  # S3Gen streams: tokens of the first chunk (time to first audio)
    flow_chunk: int = 25  # S3Gen streams: tokens per later chunk
    flow_steps: int = 0  # S3Gen streams: flow steps per chunk (0: the model's default)
    flow_precision: str = "f32"  # S3Gen models: "f32" or "bf16" products (codecrt.Context)


# ------------------------------------------------------------------------ events


@dataclass(frozen=True)
class Opened:
    key: Hashable
    worker: int
    latency_samples: int
    sample_rate: int
    chunk_frames: int


@dataclass(frozen=True, eq=False)
class Audio:
    key: Hashable
    pcm: npt.NDArray[np.float32]  # final samples, model rate, in order


@dataclass(frozen=True)
class Done:
    key: Hashable
    total_samples: int


@dataclass(frozen=True)
class StreamError:
    key: Hashable
    code: str
    message: str


EngineEvent = Union[Opened, Audio, Done, StreamError]
EventCallback = Callable[[EngineEvent], object]


# -------------------------------------------------------------------- exceptions


class EngineError(Exception):
    """A request the engine refuses at once; ``code`` is the error code for the client."""

    code = "engine_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class EngineStartError(EngineError):
    """A worker could not be started (bad model path, device, start-up timeout)."""

    code = "engine_error"


class BackpressureError(EngineError):
    """The stream's backlog is over ``max_backlog_frames``: the worker is behind."""

    code = "backlog_exceeded"


class BusyError(EngineError):
    """No worker can take the request now (slots full, restarting, queue full)."""

    code = "busy"


class UnknownModelError(EngineError):
    code = "unknown_model"


class DuplicateStreamError(EngineError):
    code = "duplicate_stream"


class UnknownStreamError(EngineError):
    code = "unknown_stream"


# ------------------------------------------------------------------------ engine


@dataclass(eq=False)
class _StreamRec:
    key: Hashable
    sid: int
    model: str
    strides: tuple[int, ...]
    hop: int
    codes: list[int]  # codes pushed per level
    samples: int = 0  # samples received
    finished: bool = False

    def backlog_frames(self) -> int:
        frames = min((c * s for c, s in zip(self.codes, self.strides)), default=0)
        return frames - self.samples // max(self.hop, 1)


class _Handle:
    """One incarnation of a worker process: the process, its pipe and its two threads."""

    def __init__(self, engine: Engine, generation: int) -> None:
        self.engine = engine
        self.generation = generation
        self.proc: Any = None
        self.conn: Connection | None = None
        self.queue: queue.SimpleQueue[list[tuple[Any, ...]] | None] = queue.SimpleQueue()
        # commands put (loop thread) and written (writer thread): each counter has one
        # writer, so their difference is a race-free queue depth
        self.n_put = 0
        self.n_sent = 0
        self.reader: threading.Thread | None = None
        self.writer: threading.Thread | None = None
        self.pid = 0
        self.started_at = 0.0
        self.eof = False

    def spawn(self, cfg: WorkerConfig, loop: asyncio.AbstractEventLoop) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["PYTHONPATH"] = child_pythonpath()
        fd = child.fileno()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"import codecd._worker as w; w.serve_fd({fd})"],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()  # the child holds the only other end: its death is EOF here
        self.conn = Connection(parent.detach())
        self.pid = int(self.proc.pid)
        self.started_at = time.monotonic()
        self.send(("config", cfg))
        tag = f"{cfg.index}.{self.generation}"
        self.reader = threading.Thread(target=self._read, args=(loop,), daemon=True,
                                       name=f"codecd-engine-rd-{tag}")
        self.writer = threading.Thread(target=self._write, daemon=True,
                                       name=f"codecd-engine-wr-{tag}")
        self.reader.start()
        self.writer.start()

    @property
    def exitcode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def queued(self) -> int:
        return self.n_put - self.n_sent

    def send(self, cmd: tuple[Any, ...]) -> None:
        self.n_put += 1
        self.queue.put([cmd])

    def _write(self) -> None:
        conn = self.conn
        assert conn is not None
        while True:
            batch = self.queue.get()
            if batch is None:
                return
            while True:  # coalesce whatever else is queued into one message
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.queue.put(None)
                    break
                batch.extend(more)
            try:
                conn.send(batch)
            except (OSError, ValueError):  # worker gone (EPIPE) or pipe closed: reader reports
                return
            finally:
                self.n_sent += len(batch)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        conn = self.conn
        assert conn is not None
        while True:
            try:
                msgs = conn.recv()
            except (EOFError, OSError, ValueError):
                msgs = None
            except Exception as e:  # a truncated pickle from a worker killed mid-send
                logger.debug("worker %d: unreadable message: %s", self.pid, e)
                msgs = None
            try:
                loop.call_soon_threadsafe(self.engine._on_messages, self, msgs)
            except RuntimeError:  # the loop is closed
                return
            if msgs is None:
                return

    def stop_threads(self) -> None:
        self.queue.put(None)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def close_conn(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass


class Engine:
    """One supervised worker on one device, with asyncio APIs (use on the loop's thread).

    Most callers use :class:`EnginePool`, which places streams over several engines.
    """

    def __init__(self, config: EngineConfig, device: str = "auto", index: int = 0,
                 on_event: Callable[[EngineEvent], object] | None = None) -> None:
        if not config.models:
            raise ValueError("EngineConfig.models is empty")
        self.config = config
        self.device = device
        self.index = index
        self._on_event = on_event
        self.state = _STARTING
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gen = itertools.count(1)
        self._h: _Handle | None = None
        self._sids = itertools.count(1)
        self._streams: dict[int, _StreamRec] = {}
        self._by_key: dict[Hashable, _StreamRec] = {}
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tokens = itertools.count(1)
        self._restart_task: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed starts / short lives (backoff index)
        self.info: dict[str, Any] = {}
        self.worker_stats: dict[str, Any] = {}
        # metrics
        self.restarts = 0
        self.last_restart_ms: float | None = None
        self.last_exit: str | None = None
        self.backpressure_rejections = 0
        self.events_delivered = 0
        self.last_probe_ms: float | None = None

    # ------------------------------------------------------------- lifecycle

    @property
    def pid(self) -> int:
        return self._h.pid if self._h is not None else 0

    @property
    def serving(self) -> bool:
        return self.state == _READY

    @property
    def n_streams(self) -> int:
        return len(self._streams)

    def streams_of(self, model: str) -> int:
        return sum(1 for r in self._streams.values() if r.model == model)

    async def start(self) -> None:
        """Spawn the worker and wait until it has loaded and warmed up every model."""
        self._loop = asyncio.get_running_loop()
        self.state = _STARTING
        await self._spawn_and_wait()
        self.state = _READY

    def _worker_config(self) -> WorkerConfig:
        c = self.config
        return WorkerConfig(models=dict(c.models), device=self.device, n_threads=c.n_threads,
                            max_streams=c.max_streams, max_batch=c.max_batch,
                            stream_chunk_frames=c.stream_chunk_frames,
                            batch_bucket=c.batch_bucket, warm_buckets=c.warm_buckets,
                            gather_ms=c.gather_ms, parent_pid=os.getpid(), index=self.index,
                            debug_commands=c.debug_commands, voices=dict(c.voices),
                            flow_first_chunk=c.flow_first_chunk, flow_chunk=c.flow_chunk,
                            flow_steps=c.flow_steps, flow_precision=c.flow_precision)

    async def _spawn_and_wait(self) -> None:
        loop = self._loop
        assert loop is not None
        h = _Handle(self, next(self._gen))
        self._ready = loop.create_future()
        self._h = h
        t0 = time.monotonic()
        h.spawn(self._worker_config(), loop)
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready),
                                          self.config.start_timeout_s)
        except asyncio.TimeoutError:
            h.kill()
            await self._reap(h)
            raise EngineStartError(f"worker {self.index} on {self.device} did not become "
                                   f"ready within {self.config.start_timeout_s:g} s") from None
        except EngineStartError:
            await self._reap(h)
            raise
        await asyncio.sleep(0)  # let an EOF that raced the ready event be seen first
        if h.eof:
            await self._reap(h)
            raise EngineStartError(f"worker {self.index} on {self.device} died right after "
                                   "start-up")
        self.info = info
        logger.info("engine %d: worker pid %d ready on %s in %.0f ms (models: %s)", self.index,
                    h.pid, self.device, (time.monotonic() - t0) * 1e3,
                    ", ".join(info.get("models", {})))

    async def _reap(self, h: _Handle, timeout: float = 2.0) -> int | None:
        """Wait (without blocking the loop) for the process to exit; kill it if it does not."""
        if h.proc is None:
            return None
        deadline = time.monotonic() + timeout
        while h.exitcode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if h.exitcode is None:
            h.kill()
            while h.exitcode is None:
                await asyncio.sleep(0.005)
        h.stop_threads()
        h.close_conn()
        return h.exitcode

    async def close(self) -> None:
        """Stop the worker gracefully (it frees its streams, contexts and models)."""
        if self.state in (_CLOSING, _CLOSED):
            return
        self.state = _CLOSING
        if self._restart_task is not None:
            self._restart_task.cancel()
            try:
                await self._restart_task
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all(SHUTTING_DOWN, "the engine is shutting down")
        h = self._h
        if h is not None and h.proc is not None:
            h.send(("stop",))
            code = await self._reap(h, self.config.stop_timeout_s)
            if code not in (0, None):
                logger.warning("engine %d: worker pid %d exited with %s on stop", self.index,
                               h.pid, _describe_exit(code))
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self.state = _CLOSED

    # ------------------------------------------------------------- requests

    def _check_serving(self) -> _Handle:
        h = self._h
        if self.state != _READY or h is None:
            raise BusyError(f"engine {self.index} is {self.state}")
        return h

    def _check_queue(self, h: _Handle) -> None:
        if h.queued >= self.config.max_queued_commands:
            self.backpressure_rejections += 1
            raise BusyError(f"engine {self.index}: {h.queued} commands queued, worker is behind")

    def model_info(self, model: str) -> dict[str, Any] | None:
        mi: dict[str, Any] | None = self.info.get("models", {}).get(model)
        return mi

    def open(self, key: Hashable, model: str, *, noise: bool = False, seed: int | None = 0,
             latency: str = "exact", voice: str | None = None) -> None:
        """Open a stream; an :class:`Opened` event (or a StreamError) follows.

        ``latency``: "exact" (equal to offline) or "low" (a shorter lookahead
        finalized by a crossfade: codecrt.LowLatencyStream)."""
        if key in self._by_key:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        mi = self.model_info(model)
        if mi is None:
            raise UnknownModelError(f"model {model!r} is not loaded")
        h = self._check_serving()
        self._check_queue(h)
        if self.streams_of(model) >= self.config.max_streams:
            raise BusyError(f"engine {self.index}: all {self.config.max_streams} stream slots "
                            f"of {model!r} are taken")
        sid = next(self._sids)
        rec = _StreamRec(key, sid, model, tuple(mi["level_strides"]), int(mi["hop_length"]),
                         [0] * int(mi["n_levels"]))
        self._streams[sid] = rec
        self._by_key[key] = rec
        h.send(("open", sid, model, bool(noise), int(seed or 0), str(latency), voice))

    def _rec(self, key: Hashable) -> _StreamRec:
        rec = self._by_key.get(key)
        if rec is None:
            raise UnknownStreamError(f"no open stream {key!r}")
        return rec

    def push(self, key: Hashable, levels: Sequence[npt.ArrayLike]) -> None:
        """Append codes (one integer array per level, any lengths); Audio events follow.

        Raises :class:`BackpressureError` when the stream's backlog is over the
        limit (nothing is sent; the caller decides whether to fail the stream).
        """
        rec = self._rec(key)
        h = self._check_serving()
        self._check_queue(h)
        if rec.backlog_frames() > self.config.max_backlog_frames:
            self.backpressure_rejections += 1
            raise BackpressureError(f"stream {key!r}: {rec.backlog_frames()} frames waiting to "
                                    f"be decoded (limit {self.config.max_backlog_frames})")
        arrs = [np.asarray(a) for a in levels]
        for i, a in enumerate(arrs[: len(rec.codes)]):
            rec.codes[i] += int(a.size)
        # codes that fit int32 travel as int32; others as they are, for the runtime to report
        out = []
        for a in arrs:
            if a.dtype != np.int32 and a.dtype.kind in "iu" and a.size and \
                    -(2**31) <= int(a.min()) and int(a.max()) < 2**31:
                a = a.astype(np.int32)
            out.append(a)
        h.send(("push", rec.sid, out))

    def finish(self, key: Hashable) -> None:
        """No more codes: the tail is decoded, then :class:`Done`."""
        rec = self._rec(key)
        h = self._check_serving()
        rec.finished = True
        h.send(("finish", rec.sid))

    def cancel(self, key: Hashable) -> None:
        """Drop the stream now and free its slot; no event follows. No-op for an unknown key."""
        rec = self._by_key.pop(key, None)
        if rec is None:
            return
        self._streams.pop(rec.sid, None)
        h = self._h
        if h is not None and self.state == _READY:
            h.send(("cancel", rec.sid))

    async def probe(self, timeout: float = 1.0) -> bool:
        """True when the worker's loop answers within ``timeout``; a worker that does not is
        killed (``kill_unresponsive``) and restarted. False while restarting."""
        h = self._h
        if self.state != _READY or h is None:
            return False
        t0 = time.monotonic()
        try:
            await self._request(h, "probe", timeout)
        except asyncio.TimeoutError:
            if self._h is h and self.state == _READY:
                logger.error("engine %d: worker pid %d did not answer a probe within %.2f s%s",
                             self.index, h.pid, timeout,
                             "; killing it" if self.config.kill_unresponsive else "")
                if self.config.kill_unresponsive:
                    h.kill()
            return False
        except (EngineError, asyncio.CancelledError):
            return False
        self.last_probe_ms = (time.monotonic() - t0) * 1e3
        return True

    async def fetch_stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """The worker's own stats (per model: codecrt stats, batches, tick times, queue)."""
        h = self._check_serving()
        self.worker_stats = await self._request(h, "stats", timeout)
        return self.worker_stats

    async def _request(self, h: _Handle, op: str, timeout: float) -> Any:
        assert self._loop is not None
        token = next(self._tokens)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._waiters[token] = fut
        try:
            h.send((op, token))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(token, None)

    def stats(self) -> dict[str, Any]:
        """Parent-side metrics, and the worker stats of the last :meth:`fetch_stats`."""
        h = self._h
        return {"index": self.index, "device": self.device, "state": self.state,
                "pid": self.pid, "restarts": self.restarts,
                "last_restart_ms": self.last_restart_ms, "last_exit": self.last_exit,
                "streams": len(self._streams), "queued_commands": h.queued if h else 0,
                "backpressure_rejections": self.backpressure_rejections,
                "events_delivered": self.events_delivered, "last_probe_ms": self.last_probe_ms,
                "worker": self.worker_stats}

    def _crash(self, how: str) -> None:
        """Tests: make the worker die (``abort``, ``segv``, ``exit``) or wedge (``hang``)."""
        h = self._check_serving()
        h.send(("_crash", how))

    # ------------------------------------------------------------- events

    def _emit(self, ev: EngineEvent) -> None:
        self.events_delivered += 1
        cb = self._on_event
        if cb is None:
            return
        try:
            cb(ev)
        except Exception:
            logger.exception("engine %d: event callback failed on %s", self.index,
                             type(ev).__name__)

    def _on_messages(self, h: _Handle, msgs: list[tuple[Any, ...]] | None) -> None:
        """Runs on the loop: one batch of worker events, or None for EOF."""
        if h is not self._h:
            return  # a previous incarnation
        if msgs is None:
            self._on_eof(h)
            return
        for m in msgs:
            try:
                self._dispatch(m)
            except Exception:
                logger.exception("engine %d: bad worker event %r", self.index, m[:2])

    def _dispatch(self, m: tuple[Any, ...]) -> None:
        kind = m[0]
        if kind == "audio":
            rec = self._streams.get(m[1])
            if rec is not None:
                pcm = np.frombuffer(m[2], dtype=np.float32)
                rec.samples += int(pcm.size)
                self._emit(Audio(rec.key, pcm))
        elif kind == "done":
            rec = self._forget(m[1])
            if rec is not None:
                self._emit(Done(rec.key, int(m[2])))
        elif kind == "error":
            rec = self._forget(m[1])
            if rec is not None:
                self._emit(StreamError(rec.key, str(m[2]), str(m[3])))
        elif kind == "opened":
            rec = self._streams.get(m[1])
            if rec is not None:
                self._emit(Opened(rec.key, self.index, int(m[2]), int(m[3]), int(m[4])))
        elif kind in ("probe_reply", "stats"):
            fut = self._waiters.get(m[1])
            if fut is not None and not fut.done():
                fut.set_result(m[2] if kind == "stats" else True)
        elif kind == "log":
            _worker_log.log(int(m[1]), "worker %d (pid %d): %s", self.index, self.pid, m[2])
        elif kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(m[1])
        elif kind == "failed":
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(EngineStartError(
                    f"worker {self.index} on {self.device} failed to start: {m[1]}"))
        elif kind == "stopped":
            pass
        else:
            logger.warning("engine %d: unknown worker event %r", self.index, kind)

    def _forget(self, sid: int) -> _StreamRec | None:
        rec = self._streams.pop(sid, None)
        if rec is not None:
            self._by_key.pop(rec.key, None)
        return rec

    def _fail_all(self, code: str, message: str) -> None:
        recs = list(self._streams.values())
        self._streams.clear()
        self._by_key.clear()
        for rec in recs:
            self._emit(StreamError(rec.key, code, message))

    # ---------------------------------------------------------- supervision

    def _on_eof(self, h: _Handle) -> None:
        h.eof = True
        if self.state in (_CLOSING, _CLOSED):
            return
        if self._ready is not None and not self._ready.done():
            # died during start-up: start()/the restart loop sees it
            self._ready.set_exception(EngineStartError(
                f"worker {self.index} on {self.device} died during start-up"))
            return
        if self.state != _READY:
            return
        self.state = _RESTARTING
        t_dead = time.monotonic()
        lived = t_dead - h.started_at
        logger.error("engine %d: worker pid %d on %s died after %.1f s with %d stream(s); "
                     "restarting", self.index, h.pid, self.device, lived, len(self._streams))
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(EngineError("the worker died"))
        if lived >= self.config.stable_after_s:
            self._failures = 0
        assert self._loop is not None
        self._restart_task = self._loop.create_task(self._restart(h, t_dead))

    async def _restart(self, dead: _Handle, t_dead: float) -> None:
        # the exit status is there within milliseconds of the EOF: put it in the message
        code = await self._reap(dead, 0.5)
        self.last_exit = _describe_exit(code)
        logger.error("engine %d: worker pid %d exited with %s", self.index, dead.pid,
                     self.last_exit)
        self._fail_all(ENGINE_RESTARTED,
                       f"the decode worker on {self.device} (pid {dead.pid}) died "
                       f"({self.last_exit}); the stream was lost, the worker is being restarted")
        backoff = self.config.restart_backoff_s or (1.0,)
        while self.state == _RESTARTING:
            delay = backoff[min(self._failures, len(backoff) - 1)]
            self._failures += 1
            await asyncio.sleep(delay)
            try:
                await self._spawn_and_wait()
            except EngineStartError as e:
                logger.error("engine %d: restart failed: %s (next try in %.1f s)", self.index, e,
                             backoff[min(self._failures, len(backoff) - 1)])
                continue
            if self.state != _RESTARTING:  # closed meanwhile
                return
            self.restarts += 1
            self.worker_stats = {}
            self.last_restart_ms = (time.monotonic() - t_dead) * 1e3
            self.state = _READY
            logger.warning("engine %d: serving again %.0f ms after the worker died "
                           "(restart #%d)", self.index, self.last_restart_ms, self.restarts)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


# -------------------------------------------------------------------------- pool


class EnginePool:
    """Engines on several devices; streams are placed on the least-loaded serving one.

    Events go to ``on_event`` (called on the event loop, must not block) or, when it is
    None, to the :attr:`events` queue.
    """

    def __init__(self, config: EngineConfig, devices: Sequence[str] = ("auto",),
                 on_event: Callable[[EngineEvent], object] | None = None) -> None:
        if not devices:
            raise ValueError("EnginePool needs at least one device")
        self.config = config
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._cb = on_event
        self.engines = [Engine(config, d, i, self._deliver) for i, d in enumerate(devices)]
        self._where: dict[Hashable, Engine] = {}
        self._rr = 0

    def _deliver(self, ev: EngineEvent) -> None:
        if isinstance(ev, (Done, StreamError)):
            self._where.pop(ev.key, None)
        if self._cb is not None:
            self._cb(ev)
        else:
            self.events.put_nowait(ev)

    async def start(self) -> None:
        """Start every worker; returns when all are ready (raises if one cannot start)."""
        results = await asyncio.gather(*(e.start() for e in self.engines), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        """Model name -> info (sample rate, levels, strides, chunk, latency) of a serving worker."""
        for e in self.engines:
            if e.info:
                return dict(e.info.get("models", {}))
        return {}

    def open(self, key: Hashable, model: str, *, noise: bool = False,
             seed: int | None = 0, latency: str = "exact", voice: str | None = None) -> int:
        """Open a stream on the least-loaded serving worker; returns the worker's index."""
        if key in self._where:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        if model not in self.config.models:
            raise UnknownModelError(f"model {model!r} is not loaded")
        n = len(self.engines)
        order = [self.engines[(self._rr + i) % n] for i in range(n)]
        cands = [e for e in order if e.serving and e.streams_of(model) < self.config.max_streams]
        if not cands:
            raise BusyError(f"no decode worker can take a {model!r} stream now (all busy or "
                            "restarting)")
        self._rr = (self._rr + 1) % n
        last: EngineError | None = None
        for e in sorted(cands, key=lambda e: e.n_streams):  # stable: round robin among ties
            try:
                e.open(key, model, noise=noise, seed=seed, latency=latency, voice=voice)
            except BusyError as err:
                last = err
                continue
            self._where[key] = e
            return e.index
        assert last is not None
        raise last

    def _engine(self, key: Hashable) -> Engine:
        e = self._where.get(key)
        if e is None:
            raise UnknownStreamError(f"no open stream {key!r}")
        return e

    def push(self, key: Hashable, levels: Sequence[npt.ArrayLike]) -> None:
        self._engine(key).push(key, levels)

    def finish(self, key: Hashable) -> None:
        self._engine(key).finish(key)

    def cancel(self, key: Hashable) -> None:
        """Drop the stream now (no event follows); a no-op for a key already gone."""
        e = self._where.pop(key, None)
        if e is not None:
            e.cancel(key)

    def worker_of(self, key: Hashable) -> int | None:
        e = self._where.get(key)
        return e.index if e is not None else None

    async def probe(self, timeout: float = 1.0) -> bool:
        """Watchdog health: every serving worker answered within ``timeout``, and at least
        one is serving. A restarting worker is the supervisor's business, not a failure;
        a wedged one is killed (then restarted) and makes this probe False."""
        serving = [e for e in self.engines if e.serving]
        if not serving:
            return False
        ok = await asyncio.gather(*(e.probe(timeout) for e in serving))
        return all(ok)

    async def fetch_stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """:meth:`stats` after a fresh stats query to every serving worker."""
        await asyncio.gather(*(e.fetch_stats(timeout) for e in self.engines if e.serving),
                             return_exceptions=True)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Parent-side metrics per worker (restarts, streams, queue) and the last worker stats."""
        return {"workers": [e.stats() for e in self.engines],
                "restarts": sum(e.restarts for e in self.engines),
                "streams": len(self._where),
                "serving": sum(1 for e in self.engines if e.serving)}

    async def close(self) -> None:
        """Stop every worker (open streams fail with ``shutting_down``)."""
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)
        self._where.clear()
