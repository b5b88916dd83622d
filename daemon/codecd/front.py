"""A front process of ``codecd serve --fronts N``: websockets, sessions, pacing and HTTP on the
daemon's shared listening socket, feeding the engine workers over shared-memory rings.

Started by the main process (:mod:`codecd.daemon`) as ``python -c "import codecd.front as f;
f.serve_fd(CTL, LISTEN, INDEX)"``: ``CTL`` is its control socket to main
(:class:`codecd.channel.CtlLink`), ``LISTEN`` the listening socket every front
accepts on (the kernel hands each connection to one of them). A front never
decodes: per worker it holds a :class:`RingEngine`, the :class:`~codecd.engine.Engine`
API (``open/push/finish/cancel``, events ``Opened/Audio/Done/StreamError``) over the
two rings of its channel (:mod:`codecd.channel`), so the session code is the same
as in one process (:class:`FrontServer` is a :class:`~codecd.server.Server`).

What a front asks main (main is the one authority across fronts): a connection
at its upgrade (``admit_conn``; the connection limits), a stream at its start
(``admit_stream``; ``max_streams``), and the whole daemon's totals for
``/metrics``; each is released when it ends (``release_conn``, ``release_stream``).
Main pushes the readiness (``/readyz``), new channels (a worker that started or
restarted), and ``drain`` on shutdown. A worker that dies is an EOF on its event
doorbell: the front fails that worker's streams with ``engine_restarted`` and
keeps their connections; the restarted worker's channel follows from main.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy.typing as npt
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response
from websockets.protocol import State

from . import __version__, wire
from .actions import Action, EngineCancel, EngineFinish, EngineOpen, EnginePush
from .channel import CtlLink, FrontEnds, packets, recv_msg
from .config import Config, ModelSource
from .connection import SessionConnection
from .engine import (
    ENGINE_RESTARTED,
    Audio,
    BusyError,
    Done,
    DuplicateStreamError,
    EngineConfig,
    EngineEvent,
    Opened,
    StreamError,
    UnknownModelError,
    UnknownStreamError,
)
from .engine.events import BackpressureError
from .engine.streams import CodesError, StreamRecord, StreamTable, int32_levels
from .families import model_spec
from .logs import flush_logs
from .metrics import render_totals
from .stalls import GcClock, LoopStalls
from .server import Server, _Conn
from .web.tickets import offered_credentials

__all__ = ["RingEngine", "RingPool", "FrontServer", "serve_fd", "config_to_json",
           "config_from_json"]

logger = logging.getLogger(__name__)

_RETRY_S = 0.002  # a full command ring is tried again this soon
#: commands wait this long for others to share their ring record. Streams' codes come spread
#: over the frame period, each in a loop turn of its own: at 500 streams a front (SNAC's 85 ms
#: frames) a flush per message was a ring record and a doorbell, and a worker wake-up, about
#: 5,900 a second, where one a millisecond is 1,000 at most. The way from a push to the ring
#: costs a front about 7.5 us a message one to a record and 2 us six to a record (``python -m
#: bench session``); a stream's codes wait up to 1 ms more, against an 85 ms frame
_FLUSH_S = 0.001
_EVENT_SLICE_S = 0.002  # events handed on per loop turn, at most this long (_handle_events)


def config_to_json(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_from_json(d: Mapping[str, Any]) -> Config:
    d = dict(d)
    d["models"] = [ModelSource(**m) for m in d.get("models", [])]
    return Config(**d)


# ------------------------------------------------------------------ engine client


class RingEngine:
    """One worker seen from a front: its channel's rings, the streams this front has on it.

    Commands queued on the loop's turn go out as one wire packet in one ring record
    (the pushes of every stream as one PUSH batch); events come back one record per
    worker tick. A ring that is full keeps the packet and tries again shortly."""

    def __init__(self, index: int, ends: FrontEnds, info: Mapping[str, Any],
                 config: EngineConfig, deliver: Callable[[EngineEvent], None],
                 loop: asyncio.AbstractEventLoop,
                 on_lost: Callable[[int, int], None] = lambda index, fid: None,
                 fid: int = 0) -> None:
        self.index = index
        self.fid = fid  # main's id of this channel
        self.ends = ends
        self.info = dict(info)
        self.config = config
        self._deliver = deliver
        self._loop = loop
        self._on_lost = on_lost  # the channel hung up (the front tells main)
        self._streams = StreamTable()
        self._out: list[wire.Message] = []
        self._held: list[bytes] = []  # encoded packets waiting for room in the ring
        self._scheduled = False
        self.gone = False
        self.packets_out = 0
        self.packets_in = 0
        self.ring_full = 0
        self.backpressure_rejections = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            wire.AudioOut: self._on_audio, wire.StreamDone: self._on_done,
            wire.StreamFailed: self._on_failed, wire.StreamOpened: self._on_opened}
        #: events read from the ring and not yet handed on, in order (_handle_events)
        self._inbox: collections.deque[wire.Message] = collections.deque()
        self._handling = False  # a continuation of _handle_events is scheduled
        loop.add_reader(ends.events.doorbell.fileno(), self._on_bell)

    # state
    @property
    def serving(self) -> bool:
        return not self.gone

    @property
    def n_streams(self) -> int:
        return len(self._streams)

    def streams_of(self, model: str) -> int:
        return self._streams.count(model)

    def model_info(self, model: str) -> dict[str, Any] | None:
        mi: dict[str, Any] | None = self.info.get("models", {}).get(model)
        return mi

    # commands
    def _send(self, m: wire.Message) -> None:
        self._out.append(m)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_later(_FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self.gone:
            return
        prod = self.ends.commands
        while self._held:  # packets a full ring refused earlier go first
            if not prod.write([self._held[0]]):
                self.ring_full += 1
                self._scheduled = True
                self._loop.call_later(_RETRY_S, self._flush)
                prod.ring()
                return
            self._held.pop(0)
            self.packets_out += 1
        if not self._out:
            prod.ring()
            return
        pkts = packets(self._out, prod.capacity // 4)
        sent = 0
        for pkt in pkts:
            if not prod.write([pkt]):
                break
            sent += 1
        self.packets_out += sent
        if sent == len(pkts):
            self._out.clear()
        else:  # the ring is full: the worker reads it; keep the rest, in order
            self.ring_full += 1
            rest = pkts[sent:]
            self._out.clear()
            self._held = rest
            self._scheduled = True
            self._loop.call_later(_RETRY_S, self._flush)
        prod.ring()

    def _check(self) -> None:
        if self.gone:
            raise BusyError(f"engine {self.index} is restarting")
        if len(self._out) + 64 * len(self._held) >= self.config.max_queued_commands:
            self.backpressure_rejections += 1
            raise BusyError(f"engine {self.index}: {len(self._out)} commands queued, worker "
                            "is behind")

    def open(self, key: Hashable, model: str, *, noise: bool = False, seed: int | None = 0,
             latency: str = "exact", voice: str | None = None,
             options: Mapping[str, Any] | None = None) -> None:
        if key in self._streams:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        mi = self.model_info(model)
        if mi is None:
            raise UnknownModelError(f"model {model!r} is not loaded")
        self._check()
        rec = self._streams.add(key, model, mi["level_strides"], int(mi["hop_length"]),
                                int(mi["n_levels"]))
        self._send(wire.OpenStream(rec.sid, model, wire.StreamOptions(
            bool(noise), int(seed or 0), str(latency), voice, dict(options or {}))))

    def _rec(self, key: Hashable) -> StreamRecord:
        rec = self._streams.get(key)
        if rec is None:
            raise UnknownStreamError(f"no open stream {key!r}")
        return rec

    def push(self, key: Hashable, levels: Sequence[npt.ArrayLike]) -> None:
        rec = self._rec(key)
        self._check()
        if rec.backlog_frames() > self.config.max_backlog_frames:
            self.backpressure_rejections += 1
            raise BackpressureError(f"stream {key!r}: {rec.backlog_frames()} frames waiting to "
                                    f"be decoded (limit {self.config.max_backlog_frames})")
        try:
            arrs = int32_levels(levels)
        except CodesError as e:
            self._streams.forget_sid(rec.sid)
            self._send(wire.CancelStream(rec.sid))
            self._loop.call_soon(self._deliver, StreamError(key, e.code, str(e)))
            return
        rec.count_codes(arrs)
        self._send(wire.PushCodes(rec.sid, arrs))

    def finish(self, key: Hashable) -> None:
        rec = self._rec(key)
        if self.gone:
            raise BusyError(f"engine {self.index} is restarting")
        rec.finished = True
        self._send(wire.FinishStream(rec.sid))

    def cancel(self, key: Hashable) -> None:
        rec = self._streams.forget_key(key)
        if rec is not None and not self.gone:
            self._send(wire.CancelStream(rec.sid))

    # events
    def _on_bell(self) -> None:
        cons = self.ends.events
        alive = cons.on_doorbell()
        for rec in cons.records():
            self.packets_in += 1
            try:
                msgs = wire.decode(bytes(rec))  # a copy: the PCM views outlive the ring's room
            except wire.WireError as e:
                logger.error("engine %d: unreadable event record: %s", self.index, e)
                continue
            self._inbox.extend(msgs)
        if not alive:
            self._handle_events(None)  # what the worker sent before it died goes out first
            self.lost("the decode worker died; the stream was lost, the worker is being "
                      "restarted")
            self._on_lost(self.index, self.fid)
            return
        if not self._handling:
            self._handle_events(_EVENT_SLICE_S)

    def _handle_events(self, budget_s: float | None = _EVENT_SLICE_S) -> None:
        """Hand the inbox's events on, in order, for at most ``budget_s`` (None: all of them),
        then yield to the loop and go on in a later turn. A tick's audio for 500 streams is
        about 25 ms of a front's work (a message through the session, its s16 conversion, a
        websocket frame each): done in one callback it held back the socket reads queued
        behind it, so the codes clients sent meanwhile reached the worker up to that much late,
        after the round they were due for had started (issue 17). In slices the loop reads
        its sockets between them."""
        self._handling = False
        handlers, inbox = self._handlers, self._inbox
        end = time.perf_counter() + budget_s if budget_s is not None else None
        n = 0
        while inbox:
            m = inbox.popleft()
            h = handlers.get(type(m))
            if h is None:
                logger.warning("engine %d: unexpected event %s", self.index, type(m).__name__)
                continue
            try:
                h(m)
            except Exception:
                logger.exception("engine %d: event %s failed", self.index, type(m).__name__)
            n += 1
            if end is not None and n % 16 == 0 and inbox and time.perf_counter() > end:
                self._handling = True
                self._loop.call_soon(self._handle_events, budget_s)
                return

    def _on_audio(self, m: wire.AudioOut) -> None:
        rec = self._streams.of_sid(m.sid)
        if rec is not None:
            rec.samples += int(m.pcm.size)
            self._deliver(Audio(rec.key, m.pcm))

    def _on_done(self, m: wire.StreamDone) -> None:
        rec = self._streams.forget_sid(m.sid)
        if rec is not None:
            self._deliver(Done(rec.key, m.total_samples))

    def _on_failed(self, m: wire.StreamFailed) -> None:
        rec = self._streams.forget_sid(m.sid)
        if rec is not None:
            self._deliver(StreamError(rec.key, m.code, m.message))

    def _on_opened(self, m: wire.StreamOpened) -> None:
        rec = self._streams.of_sid(m.sid)
        if rec is not None:
            self._deliver(Opened(rec.key, self.index, m.latency_samples, m.sample_rate,
                                 m.chunk_frames))

    def lost(self, message: str) -> None:
        """The worker behind this channel is gone: every stream on it fails, the channel
        closes (a new one comes from main when the worker serves again)."""
        if self.gone:
            return
        self.gone = True
        self._loop.remove_reader(self.ends.events.doorbell.fileno())
        self._inbox.clear()
        self._out.clear()
        self._held.clear()
        recs = self._streams.clear()
        if recs:
            logger.warning("engine %d: worker gone with %d stream(s) of this front",
                           self.index, len(recs))
        for rec in recs:
            self._deliver(StreamError(rec.key, ENGINE_RESTARTED, message))
        self.ends.close()

    def stats(self) -> dict[str, Any]:
        return {"index": self.index, "state": "ready" if not self.gone else "restarting",
                "streams": len(self._streams), "queued_commands": len(self._out),
                "queued_events": len(self._inbox),
                "held_packets": len(self._held),
                "packets_out": self.packets_out, "packets_in": self.packets_in,
                "ring_full": self.ring_full,
                "backpressure_rejections": self.backpressure_rejections}


class RingPool:
    """The :class:`~codecd.engine.EnginePool` API over a front's channels to the workers."""

    def __init__(self, config: EngineConfig, n_workers: int,
                 on_event: Callable[[EngineEvent], object],
                 on_lost: Callable[[int, int], None] = lambda index, fid: None) -> None:
        self.config = config
        self._on_lost = on_lost
        self.n_workers = n_workers
        self._cb = on_event
        self.by_index: dict[int, RingEngine] = {}
        self._where: dict[Hashable, RingEngine] = {}
        self._rr = 0

    @property
    def engines(self) -> list[RingEngine]:
        return [self.by_index[i] for i in sorted(self.by_index)]

    def _deliver(self, ev: EngineEvent) -> None:
        if isinstance(ev, (Done, StreamError)):
            self._where.pop(ev.key, None)
        self._cb(ev)

    def attach(self, index: int, ends: FrontEnds, info: Mapping[str, Any],
               loop: asyncio.AbstractEventLoop, fid: int = 0) -> None:
        old = self.by_index.get(index)
        if old is not None:
            old.lost("the decode worker was restarted; the stream was lost")
        self.by_index[index] = RingEngine(index, ends, info, self.config, self._deliver, loop,
                                          self._on_lost, fid)

    @property
    def serving(self) -> bool:
        return len(self.by_index) == self.n_workers and all(
            e.serving for e in self.by_index.values())

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        for e in self.engines:
            if e.info:
                return dict(e.info.get("models", {}))
        return {}

    def open(self, key: Hashable, model: str, **kw: Any) -> int:
        if key in self._where:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        if model not in self.config.models:
            raise UnknownModelError(f"model {model!r} is not loaded")
        engines = self.engines
        n = len(engines)
        cands = [engines[(self._rr + i) % n] for i in range(n)]
        cands = [e for e in cands if e.serving]
        if not cands:
            raise BusyError(f"no decode worker can take a {model!r} stream now (restarting)")
        self._rr = (self._rr + 1) % max(n, 1)
        e = min(cands, key=lambda e: e.n_streams)
        e.open(key, model, **kw)
        self._where[key] = e
        return e.index

    def _engine(self, key: Hashable) -> RingEngine:
        e = self._where.get(key)
        if e is None:
            raise UnknownStreamError(f"no open stream {key!r}")
        return e

    def push(self, key: Hashable, levels: Sequence[npt.ArrayLike]) -> None:
        self._engine(key).push(key, levels)

    def finish(self, key: Hashable) -> None:
        self._engine(key).finish(key)

    def cancel(self, key: Hashable) -> None:
        e = self._where.pop(key, None)
        if e is not None:
            e.cancel(key)

    def stats(self) -> dict[str, Any]:
        return {"workers": [e.stats() for e in self.engines], "streams": len(self._where)}

    def close(self) -> None:
        for e in self.engines:
            e.lost("the daemon is shutting down")


# ------------------------------------------------------------------ the front


@dataclass(eq=False)
class _Pending:
    """A stream start waiting for main's admission, and what its session did meanwhile."""

    conn: _Conn
    open: EngineOpen
    buffer: list[Action] = field(default_factory=list)


class FrontServer(Server):
    """A :class:`Server` whose engine is its channels to the workers and whose limits,
    readiness and metrics are the main process's."""

    def __init__(self, config: Config, ctl: socket.socket, index: int, listen: socket.socket,
                 n_workers: int, engine: EngineConfig,
                 session_overrides: dict[str, Any] | None = None,
                 http: socket.socket | None = None) -> None:
        super().__init__(config, {}, sock=listen, session_overrides=session_overrides)
        self.index = index
        self._http_sock = http  # the speech endpoint's listening socket (main binds it)
        self._speech_task: asyncio.Future[None] | None = None
        self._speech_admissions: dict[int, asyncio.Future[bool]] = {}
        self._ctl_sock = ctl
        self._ctl: CtlLink | None = None
        self.n_workers = n_workers
        self.engine_config = engine
        self.main_ready = False
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._pending: dict[Hashable, _Pending] = {}
        self._admissions: dict[int, Hashable] = {}
        self._granted: set[Hashable] = set()
        #: id(ServerConnection) -> (it, peer ip): admitted by main, not yet released
        self._conn_admitted: dict[int, tuple[ServerConnection, str]] = {}
        self._totals: dict[str, Any] = {}
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._routes.exposition = lambda: render_totals(self._totals)
        self._routes.accepting = self._is_ready
        self._routes.admit_connection = self._admit_connection
        #: how late this front's loop ran, and its collector's pauses (codecd_front_stall_*)
        self._loop_stalls = LoopStalls(busy=lambda: self.active_streams > 0)
        self._gc = GcClock().install()

    # ------------------------------------------------------------- state

    def _is_ready(self) -> bool:
        pool = self.pool
        return (self.main_ready and self.ready and not self.draining and pool is not None
                and pool.serving)  # type: ignore[attr-defined]

    def engine_stats(self) -> dict[str, Any]:
        return self.pool.stats() if self.pool is not None else {"workers": []}

    async def _refresh_stats(self) -> None:
        self._totals = await self._ask({"op": "metrics"}, 3.0)

    def snapshot(self) -> dict[str, Any]:
        """This front's own counters, for main's totals."""
        refused: dict[str, float] = {}
        ttfa: dict[str, Any] = {"buckets": [], "sum": 0.0, "count": 0.0}
        held = 0.0
        sm = self.server_metrics
        for fam in (*sm.ttfa.collect(), *sm.conn_refused.collect(), *sm.held.collect()):
            for smp in fam.samples:
                if smp.name == "codecd_connections_refused_total":
                    refused[smp.labels["reason"]] = smp.value
                elif smp.name == "codecd_time_to_first_audio_seconds_bucket":
                    ttfa["buckets"].append([smp.labels["le"], smp.value])
                elif smp.name == "codecd_time_to_first_audio_seconds_sum":
                    ttfa["sum"] = smp.value
                elif smp.name == "codecd_time_to_first_audio_seconds_count":
                    ttfa["count"] = smp.value
                elif smp.name == "codecd_paced_streams":
                    held = smp.value
        return {"front": self.index, "pid": os.getpid(), "connections": len(self._conns),
                "streams": self.active_streams, "session": self.metrics.as_dict(),
                "refused": refused, "ttfa": ttfa, "held": held, "engine": self.engine_stats(),
                "stalls": {"loop": self._loop_stalls.late.as_dict(),
                           "gc": self._gc.pauses.as_dict()}}

    # ------------------------------------------------------------- control

    def _send(self, msg: dict[str, Any]) -> None:
        if self._ctl is not None:
            self._ctl.send(msg)

    async def _ask(self, msg: dict[str, Any], timeout: float) -> Any:
        i = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[i] = fut
        try:
            self._send({**msg, "id": i})
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._replies.pop(i, None)

    def _on_ctl(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg.get("op")
        try:
            if op == "channel":
                assert self.pool is not None
                ends = FrontEnds.from_fds(fds)
                fds = []
                self.pool.attach(int(msg["worker"]), ends, msg["info"], self._loop,  # type: ignore[attr-defined]
                                 int(msg.get("fid", 0)))
                if not self.specs:
                    self._set_specs()
                logger.info("front %d: channel to worker %d", self.index, msg["worker"])
            elif op == "ready":
                self.main_ready = bool(msg["value"])
            elif op == "admitted":
                self._on_admitted(int(msg["id"]), bool(msg["ok"]), str(msg.get("why", "")))
            elif op == "reply":
                fut = self._replies.get(int(msg["id"]))
                if fut is not None and not fut.done():
                    fut.set_result(msg.get("data"))
            elif op == "snapshot":
                self._send({"op": "snapshot", "id": msg["id"], "data": self.snapshot()})
            elif op == "drain":
                asyncio.ensure_future(self._drain_and_exit())
            else:
                logger.warning("front %d: unexpected control message %r", self.index, op)
        finally:
            for fd in fds:
                os.close(fd)

    def _on_ctl_eof(self) -> None:
        logger.error("front %d: the daemon's main process has gone; exiting", self.index)
        flush_logs(1.0)  # os._exit skips atexit: write the line above first
        os._exit(1)

    def _set_specs(self) -> None:
        assert self.pool is not None
        self.specs = {n: model_spec(n, i) for n, i in self.pool.models.items()}
        self.session_limits = self._make_session_limits()
        if self.config.upstream and self._speech_task is None:
            # text streams and the HTTP speech endpoint, once the models are known
            self._speech_task = asyncio.ensure_future(self._start_speech())

    # ------------------------------------------------------------- start

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._ctl = CtlLink(self._ctl_sock, self._loop, self._on_ctl, self._on_ctl_eof)
        self.pool = RingPool(self.engine_config, self.n_workers, self._on_event,  # type: ignore[assignment]
                             lambda i, fid: self._send({"op": "channel_lost", "worker": i,
                                                        "fid": fid}))
        kw: dict[str, Any] = dict(process_request=self._process_request, compression=None,
                                  max_size=cfg.max_message_bytes, max_queue=64,
                                  write_limit=max(4096, cfg.sndbuf_bytes or 32768),
                                  close_timeout=2.0, ping_interval=20, ping_timeout=20,
                                  server_header=f"codecd/{__version__}",
                                  select_subprotocol=self._web.select_subprotocol,
                                  create_connection=SessionConnection)
        self._ws_server = await serve(self._handler, sock=self._sock, **kw)
        self._tasks.append(asyncio.create_task(self._ticker(), name="codecd-ticker"))
        self._tasks.append(asyncio.create_task(self._loop_stalls.run(), name="codecd-loop-stalls"))
        self.ready = True
        self._send({"op": "ready"})

    # ------------------------------------------------------------- browser tickets

    async def _process_request(self, conn: ServerConnection, req: Request) -> Response | None:
        """The routes, with the browser tickets kept by main: a ticket this front issues goes
        to main's book, and one offered on an upgrade is redeemed there (single use whichever
        front issued it and whichever front the upgrade reaches)."""
        if self.config.auth_token is not None:
            if req.headers.get("Upgrade", "").lower() == "websocket":
                await self._redeem_offered(req)
            elif req.path.split("?", 1)[0] == "/auth/ticket":
                resp = await self._routes.process_request(conn, req)
                if resp is not None and resp.status_code == 200:
                    self._hand_over_ticket(resp, req)
                return resp
        return await self._routes.process_request(conn, req)

    def _hand_over_ticket(self, resp: Response, req: Request) -> None:
        try:
            t = json.loads(resp.body).get("ticket")
        except (ValueError, AttributeError):
            return
        if not isinstance(t, str):
            return
        bound = self._web.tickets.take(t)
        if bound is not False:
            self._send({"op": "ticket", "ticket": t, "origin": bound})

    async def _redeem_offered(self, req: Request) -> None:
        tickets, _ = offered_credentials(req.headers.get_all("Sec-WebSocket-Protocol"))
        if not tickets:
            return
        origin = req.headers.get("Origin")
        host = req.headers.get("Host")
        u = urlsplit(origin or "")  # the page's own origin, as WebRoutes.authorize judges it
        own = origin is None or (bool(host) and u.scheme in ("http", "https")
                                 and u.netloc == host)
        try:
            ok = await self._ask({"op": "redeem_ticket", "ticket": tickets[0],
                                  "origin": origin, "own": own}, 5.0)
        except asyncio.TimeoutError:
            return
        if ok:  # the local check (WebRoutes.authorize) now finds it, once
            self._web.tickets.adopt(tickets[0], origin)

    # ------------------------------------------------------------- admission

    def _admit(self) -> bool:
        # the daemon-wide limit is main's (asked when the engine open comes, _apply)
        if self.draining:
            return False
        self.active_streams += 1
        return True

    async def _admit_connection(self, ws: ServerConnection, ip: str) -> bool:
        try:
            ok = bool(await self._ask({"op": "admit_conn", "ip": ip}, 5.0))
        except asyncio.TimeoutError:
            return False
        if ok:
            self._conn_admitted[id(ws)] = (ws, ip)
            # a handshake that fails after this never reaches the handler: release it then
            self._loop.call_later(30.0, self._check_admitted, ws)
        return ok

    def _check_admitted(self, ws: ServerConnection) -> None:
        got = self._conn_admitted.get(id(ws))
        if got is None or got[0] is not ws:
            return
        if any(c.ws is ws for c in self._conns.values()):
            return  # its handler runs: it releases the connection when it ends
        if ws.state is State.CLOSED:
            del self._conn_admitted[id(ws)]
            self._send({"op": "release_conn", "ip": got[1]})
        else:
            self._loop.call_later(30.0, self._check_admitted, ws)

    async def _handler(self, ws: ServerConnection) -> None:
        try:
            await super()._handler(ws)
        finally:
            got = self._conn_admitted.pop(id(ws), None)
            if got is not None:
                self._send({"op": "release_conn", "ip": got[1]})

    def _apply(self, conn: _Conn, actions: list[Action]) -> None:
        if not self._pending and not any(type(a) is EngineOpen for a in actions):
            super()._apply(conn, actions)
            return
        run: list[Action] = []
        for a in actions:
            t = type(a)
            if t is EngineOpen and a.key not in self._granted:  # type: ignore[union-attr]
                if run:
                    super()._apply(conn, run)
                    run = []
                self._request_admission(conn, a)  # type: ignore[arg-type]
            elif t in (EnginePush, EngineFinish, EngineCancel) and \
                    a.key in self._pending:  # type: ignore[union-attr]
                if run:
                    super()._apply(conn, run)
                    run = []
                self._pending[a.key].buffer.append(a)  # type: ignore[union-attr]
            else:
                run.append(a)
        if run:
            super()._apply(conn, run)

    def _request_admission(self, conn: _Conn, a: EngineOpen) -> None:
        i = next(self._ids)
        self._pending[a.key] = _Pending(conn, a)
        self._admissions[i] = a.key
        self._send({"op": "admit_stream", "id": i})

    def _on_admitted(self, i: int, ok: bool, why: str) -> None:
        fut = self._speech_admissions.pop(i, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(ok)
            elif ok:  # asked, then given up on (timeout): give the slot back
                self._send({"op": "release_stream"})
            return
        key = self._admissions.pop(i, None)
        if key is None:
            return
        p = self._pending.pop(key, None)
        if p is None:
            return
        if ok:
            self._granted.add(key)
            self._apply(p.conn, [p.open, *p.buffer])
        else:
            if any(type(a) is EngineCancel for a in p.buffer):
                return  # the client cancelled meanwhile: nobody is waiting for an answer
            self._apply(p.conn, p.conn.session.on_engine_error(
                p.open.key, "busy", why or "server is at its stream limit; retry later"))

    def _open_stream(self, conn: _Conn, a: EngineOpen, followups: list[Action]) -> bool:
        ok = super()._open_stream(conn, a, followups)
        if not ok:
            self._release_granted(a.key)
        return ok

    def _forget(self, key: Any) -> None:
        super()._forget(key)
        self._release_granted(key)

    async def _start_speech(self) -> None:
        from .speech import start_speech  # aiohttp is imported only when it is used

        try:
            self.speech = await start_speech(self, sock=self._http_sock)
        except Exception:
            logger.exception("front %d: the speech endpoint did not start", self.index)

    async def _admit_speech(self) -> bool:
        """A speech request's stream: main's daemon-wide limit, as for a websocket stream."""
        if self.draining:
            return False
        i = next(self._ids)
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._speech_admissions[i] = fut
        self._send({"op": "admit_stream", "id": i})
        try:
            ok = await asyncio.wait_for(fut, 5.0)  # on timeout fut is cancelled: a late yes is released
        except asyncio.TimeoutError:
            return False
        if ok:
            self.active_streams += 1
        return ok

    def _release_speech(self) -> None:
        self.active_streams -= 1
        self._send({"op": "release_stream"})

    def _release_granted(self, key: Hashable) -> None:
        if key in self._granted:
            self._granted.discard(key)
            self._send({"op": "release_stream"})

    # ------------------------------------------------------------- shutdown

    async def _drain_and_exit(self) -> None:
        try:
            await self.close()
        finally:
            self._send({"op": "drained"})
            self.stopped.set()

    async def _shutdown(self) -> None:
        cfg = self.config
        self.draining = True
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)  # stop accepting
        deadline = time.monotonic() + cfg.drain_timeout_s
        while self.active_streams > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.active_streams:
            logger.warning("front %d: drain timeout: closing %d stream(s)", self.index,
                           self.active_streams)
        if self._speech_task is not None and not self._speech_task.done():
            self._speech_task.cancel()
        if self.speech is not None:
            await self.speech.close()
        for conn in list(self._conns.values()):
            self._apply(conn, conn.session.shutdown())
        if self._ws_server is not None:
            try:
                await asyncio.wait_for(self._ws_server.wait_closed(), cfg.send_timeout_s + 3.0)
            except asyncio.TimeoutError:
                for conn in list(self._conns.values()):
                    conn.ws.transport.abort()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self.ready = False
        self._closed.set()


def serve_fd(ctl_fd: int, listen_fd: int, index: int, http_fd: int = -1) -> None:
    """Process entry point of a front."""
    from .worker import _die_with_parent

    ctl = socket.socket(fileno=ctl_fd)
    ctl.setblocking(True)
    first = recv_msg(ctl)
    if first is None or first[0].get("op") != "config":
        os._exit(3)
    msg, _ = first
    _die_with_parent(int(msg["parent_pid"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # main decides (it sends drain)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = config_from_json(msg["config"])
    from .logs import setup_logging

    setup_logging(cfg.log_format, cfg.log_level, front=index)
    listen = socket.socket(fileno=listen_fd)
    listen.setblocking(False)
    http = None
    if http_fd >= 0:
        http = socket.socket(fileno=http_fd)
        http.setblocking(False)
    ecfg = EngineConfig.from_json(msg["engine"])
    if msg.get("uvloop"):
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    async def run() -> None:
        front = FrontServer(cfg, ctl, index, listen, int(msg["n_workers"]), ecfg,
                            session_overrides=msg.get("session_overrides") or None, http=http)
        await front.start()
        await front.stopped.wait()

    prof_path = os.environ.get("CODECD_FRONT_PROFILE")
    if prof_path:  # where a front's time goes (docs/benchmarks.md): cProfile, dumped at exit
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(run())
        finally:
            prof.disable()
            prof.dump_stats(f"{prof_path}.front{index}")
    else:
        asyncio.run(run())
    sys.exit(0)
