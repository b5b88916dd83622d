"""Engine: one supervised worker process on one device.

Starts the worker and waits for its warm-up, forwards stream commands with
backpressure (a bounded command queue, a per-stream backlog limit), turns the
worker's messages into :mod:`events <codecd.engine.events>`, probes it, and
restarts it with backoff when it dies (its streams fail with
``engine_restarted``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy.typing as npt

from .. import wire
from .config import EngineConfig
from .events import (
    ENGINE_RESTARTED,
    SHUTTING_DOWN,
    Audio,
    BackpressureError,
    BusyError,
    Done,
    DuplicateStreamError,
    EngineError,
    EngineEvent,
    EngineStartError,
    Opened,
    StreamError,
    UnknownModelError,
    UnknownStreamError,
)
from .process import WorkerProcess, describe_exit
from .streams import CodesError, StreamRecord, StreamTable, int32_levels

__all__ = ["Engine"]

logger = logging.getLogger(__name__)
_worker_log = logging.getLogger("codecd.worker")

_STARTING, _READY, _RESTARTING, _CLOSING, _CLOSED = (
    "starting", "ready", "restarting", "closing", "closed")


class Engine:
    """One supervised worker on one device, with asyncio APIs (use on the loop's thread).

    Most callers use :class:`EnginePool`, which places streams over several engines.
    """

    def __init__(self, config: EngineConfig, device: str = "auto", index: int = 0,
                 on_event: Callable[[EngineEvent], object] | None = None,
                 on_serving: Callable[[Engine], object] | None = None) -> None:
        if not config.models:
            raise ValueError("EngineConfig.models is empty")
        self.config = config
        self.device = device
        self.index = index
        self._on_event = on_event
        #: called on the loop each time a worker (the first or a restarted one) serves: the
        #: daemon attaches its fronts' channels to it (``attach``)
        self._on_serving = on_serving
        self.state = _STARTING
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gen = itertools.count(1)
        self._h: WorkerProcess | None = None
        self._streams = StreamTable()
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tokens = itertools.count(1)
        self._restart_task: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed starts / short lives (backoff index)
        self.info: dict[str, Any] = {}
        self.worker_stats: dict[str, Any] = {}
        self._stats_query: asyncio.Future[Any] | None = None  # the stats query in flight
        self._handlers: dict[type, Callable[[Any], None]] = {
            wire.AudioOut: self._on_audio, wire.StreamDone: self._on_done,
            wire.StreamFailed: self._on_failed, wire.StreamOpened: self._on_opened,
            wire.ProbeReply: self._on_reply, wire.Stats: self._on_reply, wire.Log: self._on_log,
            wire.Ready: self._on_ready, wire.Failed: self._on_start_failed,
            wire.Stopped: lambda m: None}
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
        return self._streams.count(model)

    async def start(self) -> None:
        """Spawn the worker and wait until it has loaded and warmed up every model."""
        self._loop = asyncio.get_running_loop()
        self.state = _STARTING
        await self._spawn_and_wait()
        self.state = _READY
        self._serving()

    def _serving(self) -> None:
        if self._on_serving is not None:
            try:
                self._on_serving(self)
            except Exception:
                logger.exception("engine %d: on_serving failed", self.index)

    def attach(self, fid: int, fds: list[int]) -> bool:
        """Hand the worker a front's channel (its four descriptors; the caller closes its own
        copies). False when there is no serving worker to take it."""
        from ..channel import send_msg

        h = self._h
        if self.state != _READY or h is None or h.fdsock is None:
            return False
        try:
            send_msg(h.fdsock, {"op": "attach", "fid": fid}, fds)
        except OSError as e:
            logger.warning("engine %d: attach of front channel %d failed: %s", self.index, fid, e)
            return False
        return True

    @property
    def generation(self) -> int:
        return self._h.generation if self._h is not None else 0

    async def _spawn_and_wait(self) -> None:
        loop = self._loop
        assert loop is not None
        h = WorkerProcess(next(self._gen), self._on_messages)
        self._ready = loop.create_future()
        self._h = h
        t0 = time.monotonic()
        cfg = self.config
        if self.state == _RESTARTING:
            cfg = dataclasses.replace(cfg, restarted=True)
        h.spawn([wire.Hello(), wire.Configure(cfg.to_json(), self.device, self.index,
                                              os.getpid())],
                f"{self.index}.{h.generation}", loop)
        try:
            info = await asyncio.wait_for(asyncio.shield(self._ready),
                                          self.config.start_timeout_s)
        except asyncio.TimeoutError:
            self._ready.cancel()  # abandoned: the EOF that follows the kill has no one to tell
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
                    h.pid, self.devices_used(), (time.monotonic() - t0) * 1e3,
                    ", ".join(info.get("models", {})))

    def devices_used(self) -> str:
        """The device actually used (``CPU``, ``CUDA0``), with the request when it differs
        (``CPU (asked: auto)``): what the worker's contexts report, not the request."""
        used = sorted({str(m.get("device")) for m in (self.info or {}).get("models", {}).values()
                       if m.get("device")})
        if not used:
            return self.device
        got = ",".join(used)
        return got if got.lower() == self.device.lower() else f"{got} (asked: {self.device})"

    async def _reap(self, h: WorkerProcess, timeout: float = 2.0) -> int | None:
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
            h.send(wire.Stop())
            code = await self._reap(h, self.config.stop_timeout_s)
            if code not in (0, None):
                logger.warning("engine %d: worker pid %d exited with %s on stop", self.index,
                               h.pid, describe_exit(code))
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self.state = _CLOSED

    # ------------------------------------------------------------- requests

    def _check_serving(self) -> WorkerProcess:
        h = self._h
        if self.state != _READY or h is None:
            raise BusyError(f"engine {self.index} is {self.state}")
        return h

    def _check_queue(self, h: WorkerProcess) -> None:
        if h.queued >= self.config.max_queued_commands:
            self.backpressure_rejections += 1
            raise BusyError(f"engine {self.index}: {h.queued} commands queued, worker is behind")

    def model_info(self, model: str) -> dict[str, Any] | None:
        mi: dict[str, Any] | None = self.info.get("models", {}).get(model)
        return mi

    def open(self, key: Hashable, model: str, *, noise: bool = False, seed: int | None = 0,
             latency: str = "exact", voice: str | None = None,
             options: Mapping[str, Any] | None = None) -> None:
        """Open a stream; an :class:`Opened` event (or a StreamError) follows.

        ``latency``: "exact" (equal to offline) or "low" (a shorter lookahead
        finalized by a crossfade, where the model's family has one); ``voice``: for
        models that need one; ``options``: the model family's own (its ``StreamPlan``)."""
        if key in self._streams:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        mi = self.model_info(model)
        if mi is None:
            raise UnknownModelError(f"model {model!r} is not loaded")
        h = self._check_serving()
        self._check_queue(h)
        if self.streams_of(model) >= self.config.max_streams:
            raise BusyError(f"engine {self.index}: all {self.config.max_streams} stream slots "
                            f"of {model!r} are taken")
        rec = self._streams.add(key, model, mi["level_strides"], int(mi["hop_length"]),
                                int(mi["n_levels"]))
        h.send(wire.OpenStream(rec.sid, model, wire.StreamOptions(
            bool(noise), int(seed or 0), str(latency), voice, dict(options or {}))))

    def _rec(self, key: Hashable) -> StreamRecord:
        rec = self._streams.get(key)
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
        try:
            arrs = int32_levels(levels)
        except CodesError as e:  # fails the stream as the runtime would have, as an event
            self._streams.forget_sid(rec.sid)
            h.send(wire.CancelStream(rec.sid))
            assert self._loop is not None
            self._loop.call_soon(self._emit, StreamError(key, e.code, str(e)))
            return
        rec.count_codes(arrs)
        h.send(wire.PushCodes(rec.sid, arrs))

    def finish(self, key: Hashable) -> None:
        """No more codes: the tail is decoded, then :class:`Done`."""
        rec = self._rec(key)
        h = self._check_serving()
        rec.finished = True
        h.send(wire.FinishStream(rec.sid))

    def cancel(self, key: Hashable) -> None:
        """Drop the stream now and free its slot; no event follows. No-op for an unknown key."""
        rec = self._streams.forget_key(key)
        if rec is None:
            return
        h = self._h
        if h is not None and self.state == _READY:
            h.send(wire.CancelStream(rec.sid))

    async def probe(self, timeout: float = 1.0) -> bool:
        """True when the worker's loop answers within ``timeout``; a worker that does not is
        killed (``kill_unresponsive``) and restarted. False while restarting."""
        h = self._h
        if self.state != _READY or h is None:
            return False
        t0 = time.monotonic()
        try:
            await self._request(h, wire.Probe, timeout)
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
        """The worker's own stats (per model: codecrt stats, batches, tick times, queue).
        Callers while a query is in flight share its answer: a flood of ``/metrics`` requests
        costs the worker one stats computation at a time, between its ticks, not one each.
        (A lone caller's query is answered after the commands sent before it, as ever.)"""
        h = self._check_serving()
        q = self._stats_query
        if q is None or q.done():
            q = self._stats_query = asyncio.ensure_future(
                self._request(h, wire.StatsRequest, timeout))
            # retrieved here too, so that a failure that no caller awaits is not logged
            q.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.worker_stats = await asyncio.shield(q)
        return self.worker_stats

    async def _request(self, h: WorkerProcess, request: type[wire.Probe], timeout: float) -> Any:
        assert self._loop is not None
        token = next(self._tokens)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._waiters[token] = fut
        try:
            h.send(request(token))
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
        h.send(wire.Crash(how))

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

    def _on_messages(self, h: WorkerProcess, msgs: list[wire.Message] | None) -> None:
        """Runs on the loop: one packet of worker messages, or None for EOF."""
        if h is not self._h:
            return  # a previous incarnation
        if msgs is None:
            self._on_eof(h)
            return
        handlers = self._handlers
        for m in msgs:
            handler = handlers.get(type(m))
            if handler is None:
                logger.warning("engine %d: unexpected worker message %s", self.index,
                               type(m).__name__)
                continue
            try:
                handler(m)
            except Exception:
                logger.exception("engine %d: bad worker message %s", self.index,
                                 type(m).__name__)

    def _on_audio(self, m: wire.AudioOut) -> None:
        rec = self._streams.of_sid(m.sid)
        if rec is not None:
            rec.samples += int(m.pcm.size)
            self._emit(Audio(rec.key, m.pcm))

    def _on_done(self, m: wire.StreamDone) -> None:
        rec = self._forget(m.sid)
        if rec is not None:
            self._emit(Done(rec.key, m.total_samples))

    def _on_failed(self, m: wire.StreamFailed) -> None:
        rec = self._forget(m.sid)
        if rec is not None:
            self._emit(StreamError(rec.key, m.code, m.message))

    def _on_opened(self, m: wire.StreamOpened) -> None:
        rec = self._streams.of_sid(m.sid)
        if rec is not None:
            self._emit(Opened(rec.key, self.index, m.latency_samples, m.sample_rate,
                              m.chunk_frames))

    def _on_reply(self, m: wire.ProbeReply | wire.Stats) -> None:
        fut = self._waiters.get(m.token)
        if fut is not None and not fut.done():
            fut.set_result(m.stats if isinstance(m, wire.Stats) else True)

    def _on_log(self, m: wire.Log) -> None:
        _worker_log.log(m.level, "worker %d (pid %d): %s", self.index, self.pid, m.message)

    def _on_ready(self, m: wire.Ready) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(m.info)

    def _on_start_failed(self, m: wire.Failed) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineStartError(
                f"worker {self.index} on {self.device} failed to start: {m.message}"))

    def _forget(self, sid: int) -> StreamRecord | None:
        return self._streams.forget_sid(sid)

    def _fail_all(self, code: str, message: str) -> None:
        recs = self._streams.clear()
        for rec in recs:
            self._emit(StreamError(rec.key, code, message))

    # ---------------------------------------------------------- supervision

    def _on_eof(self, h: WorkerProcess) -> None:
        h.eof = True
        if self.state in (_CLOSING, _CLOSED):
            return
        if self._ready is not None and not self._ready.done():
            # died during start-up (or spoke another wire): start()/the restart loop sees it
            why = f"failed to start: {h.wire_error}" if h.wire_error else "died during start-up"
            self._ready.set_exception(EngineStartError(
                f"worker {self.index} on {self.device} {why}"))
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

    async def _restart(self, dead: WorkerProcess, t_dead: float) -> None:
        # the exit status is there within milliseconds of the EOF: put it in the message
        code = await self._reap(dead, 0.5)
        self.last_exit = describe_exit(code)
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
            self._serving()
            logger.warning("engine %d: serving again %.0f ms after the worker died "
                           "(restart #%d)", self.index, self.last_restart_ms, self.restarts)
