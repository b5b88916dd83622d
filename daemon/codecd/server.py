"""The network shell of codecd: websockets <-> :class:`Session` <-> :class:`EnginePool`.

Everything protocol-related lives in :mod:`codecd.session` (sans-I/O); this module
only moves data: it reads frames from each connection into its session, carries
out the actions the session returns (engine commands, sends, close), routes
engine events to the session that owns the stream (one dispatcher, keyed by
``StreamKey.session``), and calls ``Session.tick`` periodically.

Per connection: a reader loop (the websocket handler) and a writer task that
drains one FIFO of outgoing frames with a per-send deadline (``send_timeout_s``;
a client that does not read is failed with ``slow_reader``). ``SO_SNDBUF`` is
capped on each accepted socket and the websockets write buffer is small, so a
stalled client costs little kernel/user memory. The hot frames take short ways
(:mod:`codecd.connection`): a binary frame goes from ``data_received`` straight into
the session when nothing is queued ahead of it, and the writer frames what is queued
with one write while the socket takes it.

Elsewhere, one concern each: plain HTTP and the upgrade checks
(:mod:`codecd.http`), the metrics (:mod:`codecd.metrics`), pacing of codes to
real time (:mod:`codecd.pacing`), logging (:mod:`codecd.logs`), systemd
(:mod:`codecd.sdnotify`).

Shutdown (:meth:`Server.close`, SIGTERM/SIGINT in :func:`run`): stop accepting,
refuse new streams (``busy``), let open streams finish within
``drain_timeout_s``, close the rest with ``shutting_down`` (1001), stop the
engine pool (native memory is freed with the worker processes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np
import numpy.typing as npt
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from . import __version__
from .config import Config, resolve_models
from .connection import SessionConnection
from .engine import Audio, Done, EngineConfig, EngineError, EngineEvent, EnginePool, StreamError
from .families import ModelSpec, engine_options, model_spec
from .families.voices import VoiceStore
from .http import Routes, peer_ip
from .metrics import ServerMetrics
from .pacing import PacedStream, Pacer
from .protocol import ErrorCode, Limits
from .sdnotify import sd_notify, systemd_listen_socket, watchdog, watchdog_interval_s
from .web import WebRoutes
from .actions import (
    Action,
    Close,
    EngineCancel,
    EngineFinish,
    EngineOpen,
    EnginePush,
    GenerateText,
    SendBinary,
    SendText,
    StreamKey,
)
from .session import Session, SessionLimits, SessionMetrics

__all__ = ["Server", "run"]

logger = logging.getLogger(__name__)

TICK_S = 0.25  # Session.tick period
PACE_S = 0.02  # release period of paced codes
_CLOSE = object()
#: bytes queued for one connection above which its input is not read until the writer has
#: sent it down to OUT_LOW: a client that floods bad input without reading the errors
#: cannot grow the queue (audio is bounded by the output budget)
OUT_HIGH = 1 << 20
OUT_LOW = 1 << 18


def engine_config(cfg: Config, models: Mapping[str, str],
                  overrides: Mapping[str, Any] | None = None) -> EngineConfig:
    """The one configuration every engine worker of a daemon gets, from its settings."""
    ekw: dict[str, Any] = dict(models=dict(models), n_threads=cfg.threads,
                               precisions={m.name: m.precision for m in cfg.models},
                               max_streams=cfg.max_streams, max_batch=cfg.max_batch,
                               batch_bucket={"pow2": True, "exact": False}.get(cfg.batch_shapes),
                               gather_ms=cfg.gather_ms, max_backlog_frames=cfg.max_queued_frames,
                               tick_align_ms=cfg.tick_align_ms, tick_slack_ms=cfg.tick_slack_ms,
                               first_audio=cfg.first_audio,
                               first_audio_gap_ms=cfg.first_audio_gap_ms,
                               tick_catch_up=cfg.tick_catch_up,
                               warm_buckets=tuple(cfg.batch_buckets) or None,
                               voices=voice_files(cfg.voices_dir),
                               family_options=engine_options(cfg))
    ekw.update(overrides or {})
    return EngineConfig(**ekw)


def voice_files(root: str) -> dict[str, str]:
    """Voice name -> file of every voice in the voices directory (none if it does not exist)."""
    store = VoiceStore(root)
    return {n: str(store.path(n)) for n in store.names()}


@dataclass(eq=False)
class _Conn:
    ws: ServerConnection
    session: Session
    ip: str
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    writer: asyncio.Task[None] | None = None
    closing: bool = False
    queued_bytes: int = 0  # of the frames in ``out``
    held_back: bool = False  # input not taken until the queue is down to OUT_LOW
    space: asyncio.Event = field(default_factory=asyncio.Event)  # queued_bytes <= OUT_LOW

    def put(self, item: Any, nbytes: int) -> None:
        self.queued_bytes += nbytes
        self.out.put_nowait(item)

    def taken(self, nbytes: int) -> None:
        self.queued_bytes -= nbytes
        if self.queued_bytes <= OUT_LOW:
            self.held_back = False
            self.space.set()

    def sent(self, item: Any) -> None:
        """A queued frame (a ``SendBinary`` or a text frame) was written: its bytes leave the
        queue, and an audio frame's audio the session's output budget."""
        if isinstance(item, SendBinary):
            self.session.on_sent(item)
            self.taken(len(item.data))
        else:
            self.taken(len(item))

    def may_take(self) -> bool:
        """Whether a frame may go into the session from ``data_received`` (connection.py):
        not from when the queue is over OUT_HIGH until it is down to OUT_LOW, as the handler
        waits (``wait_space``)."""
        if self.queued_bytes > OUT_HIGH:
            self.held_back = True
        return not self.held_back and not self.closing and not self.session.closed

    async def wait_space(self) -> None:
        """Until the writer has sent the queue down to OUT_LOW (or has stopped)."""
        if self.queued_bytes <= OUT_HIGH:
            return
        self.space.clear()
        waiter = asyncio.ensure_future(self.space.wait())
        assert self.writer is not None
        await asyncio.wait({waiter, self.writer}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()


# ------------------------------------------------------------------ server


class Server:
    """One daemon: a websocket listener, its sessions and an :class:`EnginePool`.

    ``models``: name -> GGUF path (default: :func:`resolve_models` of the config).
    ``engine_overrides``: extra :class:`EngineConfig` fields (tests).
    ``sock``: an already listening socket (systemd socket activation).
    """

    def __init__(self, config: Config, models: dict[str, str] | None = None, *,
                 sock: socket.socket | None = None,
                 engine_overrides: dict[str, Any] | None = None,
                 session_overrides: dict[str, Any] | None = None) -> None:
        self.config = config
        self._model_paths = models
        self._sock = sock
        self._engine_overrides = dict(engine_overrides or {})
        self._session_overrides = dict(session_overrides or {})
        self.pool: EnginePool | None = None
        self.specs: dict[str, ModelSpec] = {}
        self.metrics = SessionMetrics()
        self.ready = False
        self.draining = False
        self.active_streams = 0
        self._conns: dict[int, _Conn] = {}
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._pacer = Pacer()
        self._ttfa_t0: dict[Hashable, float] = {}
        self._gen: dict[Hashable, asyncio.Task[None]] = {}  # text streams' generations
        self._room: dict[Hashable, asyncio.Event] = {}  # set by a text stream's audio
        self._ws_server: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._close_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self.session_limits: SessionLimits | None = None
        self.server_metrics = ServerMetrics(self)
        self._web = WebRoutes(config)  # the browser page and its credentials (codecd.web)
        self.speech: Any = None  # codecd.speech.SpeechFront when --http-port is set
        self._routes = Routes(config, self.server_metrics, self.metrics, ready=self._is_ready,
                              accepting=lambda: self.ready and not self.draining,
                              connections=lambda ip: (len(self._conns), self._per_ip[ip]),
                              refresh_stats=self._refresh_stats, web=self._web)

    # ------------------------------------------------------------- state

    @property
    def n_connections(self) -> int:
        return len(self._conns)

    def engine_stats(self) -> dict[str, Any]:
        return self.pool.stats() if self.pool is not None else {"workers": []}

    async def _refresh_stats(self) -> None:
        if self.pool is not None:
            await self.pool.fetch_stats(timeout=1.0)

    def _is_ready(self) -> bool:
        return (self.ready and not self.draining and self.pool is not None
                and all(e.serving for e in self.pool.engines))


    # ---------------------------------------------------------------- start

    @property
    def port(self) -> int:
        assert self._ws_server is not None
        return int(self._ws_server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen (HTTP answers at once; /readyz 503 until warm-up), start the workers."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        models = self._model_paths
        if models is None:
            models = await asyncio.to_thread(resolve_models, cfg)
        self.pool = EnginePool(engine_config(cfg, models, self._engine_overrides), cfg.devices,
                               on_event=self._on_event)
        kw: dict[str, Any] = dict(process_request=self._routes.process_request, compression=None,
                                  max_size=cfg.max_message_bytes, max_queue=64,
                                  write_limit=max(4096, cfg.sndbuf_bytes or 32768),
                                  close_timeout=2.0, ping_interval=20, ping_timeout=20,
                                  server_header=f"codecd/{__version__}",
                                  select_subprotocol=self._web.select_subprotocol,
                                  create_connection=SessionConnection)
        if self._sock is not None:
            self._ws_server = await serve(self._handler, sock=self._sock, **kw)
        else:
            self._ws_server = await serve(self._handler, cfg.host, cfg.port, **kw)
        logger.info("listening on %s:%d", cfg.host, self.port)
        try:
            await self.pool.start()
        except BaseException:
            self._ws_server.close()
            raise
        self.specs = {n: model_spec(n, i) for n, i in self.pool.models.items()}
        self.session_limits = self._make_session_limits()
        self._tasks.append(asyncio.create_task(self._ticker(), name="codecd-ticker"))
        interval = watchdog_interval_s()
        if interval is not None:
            self._tasks.append(asyncio.create_task(
                watchdog(interval, self._healthy(interval), self._status), name="codecd-watchdog"))
        if cfg.upstream:  # text streams (websocket), and HTTP speech on --http-port
            from .speech import start_speech  # aiohttp is imported only when it is used

            self.speech = await start_speech(self)
        self.ready = True
        for n, s in self.specs.items():
            logger.info("model %s: %s %d Hz, %d levels, layouts %s", n, s.arch, s.sample_rate,
                        s.n_levels, ",".join(s.layouts))
        logger.info("ready: %d worker(s) on %s", len(self.pool.engines),
                    ", ".join(e.devices_used() for e in self.pool.engines))
        sd_notify("READY=1")

    def _make_session_limits(self) -> SessionLimits:
        """Every session's limits, from the config and the served models (``self.specs``)."""
        cfg = self.config
        cpf = max(s.codes_per_frame for s in self.specs.values())
        skw: dict[str, Any] = dict(
            max_streams=cfg.max_streams_per_connection,
            max_pending_tokens=max(64, int(cfg.max_queued_frames * cpf)),
            max_duration_s=cfg.max_stream_duration_s, idle_timeout_s=cfg.idle_timeout_s,
            output_budget_s=cfg.output_budget_s,
            finish_timeout_s=max(120.0, cfg.max_stream_duration_s + 60.0),
            protocol=Limits(max_message_bytes=cfg.max_message_bytes))
        skw.update(self._session_overrides)
        return SessionLimits(**skw)

    def _healthy(self, timeout: float) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            return self.pool is not None and await self.pool.probe(timeout=timeout)
        return probe

    def _status(self) -> str:
        return f"streams {self.active_streams}, devices {','.join(self.config.devices)}"

    # ---------------------------------------------------------------- connections

    def _admit(self) -> bool:
        if self.draining or self.active_streams >= self.config.max_streams:
            return False
        self.active_streams += 1
        return True

    def _release(self) -> None:
        self.active_streams -= 1

    async def _admit_speech(self) -> bool:
        """A speech request's stream (HTTP): the same limit as a websocket stream's."""
        return self._admit()

    def _release_speech(self) -> None:
        self._release()

    async def _handler(self, ws: ServerConnection) -> None:
        assert self.session_limits is not None
        ip = peer_ip(ws)
        sess = Session(self.specs, self.session_limits, admit=self._admit,
                       release=self._release, metrics=self.metrics)
        conn = _Conn(ws, sess, ip)
        self._per_ip[ip] += 1
        self._conns[sess.id] = conn
        log = {"conn": sess.id, "peer": ip}
        logger.info("connection %d from %s", sess.id, ip, extra=log)
        conn.writer = asyncio.create_task(self._writer(conn), name=f"codecd-writer-{sess.id}")
        try:
            if self._per_ip[ip] > self.config.max_connections_per_ip or \
                    len(self._conns) > self.config.max_connections:  # raced past the check
                await ws.close(1013, "too many connections")
                return
            self._apply(conn, sess.connect())
            direct = ws if isinstance(ws, SessionConnection) else None
            if direct is not None:
                direct.take_binary(lambda data: self._on_binary(conn, data), conn.may_take)
            async for msg in ws:
                if direct is not None:
                    direct.took()
                if sess.closed:
                    break
                if isinstance(msg, str):
                    acts = sess.receive_text(msg)
                else:
                    acts = sess.receive_binary(msg)
                self._apply(conn, acts)
                if sess.closed:
                    break
                await conn.wait_space()
        except ConnectionClosed:
            pass
        except Exception:
            self._internal_error(conn)
        finally:
            if isinstance(ws, SessionConnection):
                ws.stop_taking()
            self._apply(conn, sess.connection_lost())
            if conn.writer is not None:
                if not conn.closing:
                    conn.out.put_nowait(_CLOSE)
                try:
                    await asyncio.wait_for(asyncio.shield(conn.writer),
                                           self.config.send_timeout_s + 3.0)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    conn.writer.cancel()
                except Exception:  # the writer failed: still release what the connection held
                    logger.exception("connection %d: writer failed", sess.id, extra=log)
            self._conns.pop(sess.id, None)
            self._per_ip[ip] -= 1
            if self._per_ip[ip] <= 0:
                del self._per_ip[ip]
            logger.info("connection %d closed (%s)", sess.id,
                        ws.close_code if ws.close_code is not None else "-", extra=log)

    def _on_binary(self, conn: _Conn, data: bytes) -> None:
        """A binary frame handed over by ``data_received`` (connection.py): what the handler
        does with one, in the protocol callback."""
        try:
            self._apply(conn, conn.session.receive_binary(data))
        except Exception:
            try:
                self._internal_error(conn)
            except Exception:  # not out of data_received: the transport would log a fatal error
                logger.exception("connection %d: failing it failed: aborted", conn.session.id,
                                 extra={"conn": conn.session.id})
                conn.ws.transport.abort()

    def _internal_error(self, conn: _Conn) -> None:
        """An unexpected error while handling the connection's input: logged, and the
        connection failed with internal_error."""
        sess = conn.session
        logger.exception("connection %d: handler failed", sess.id,
                         extra={"conn": sess.id, "peer": conn.ip})
        self._apply(conn, sess.fail_connection(ErrorCode.INTERNAL_ERROR, "internal error"))

    async def _writer(self, conn: _Conn) -> None:
        """Send the connection's queued frames in order, each within ``send_timeout_s``. The
        frames queued when it wakes go out in one pass: while the socket's buffer takes them,
        framed together and written at once (``SessionConnection.send_now``); once it is above
        its high-water mark, one by one, each awaited under one timeout re-armed per frame
        (a client that does not read fails ``slow_reader``). A tick queues a frame for each of
        the connection's streams at once, and a wake-up and a send per frame were a good part
        of a front's work per message."""
        ws, sess = conn.ws, conn.session
        timeout = self.config.send_timeout_s
        loop = asyncio.get_running_loop()
        todo: collections.deque[Any] = collections.deque()
        direct = ws if isinstance(ws, SessionConnection) else None
        while True:
            todo.append(await conn.out.get())
            while not conn.out.empty():
                todo.append(conn.out.get_nowait())
            try:
                if direct is not None:
                    self._send_now(conn, direct, todo)
                async with asyncio.timeout(None) as deadline:
                    if direct is not None and direct.paused:
                        # what send_now wrote is over the buffer's mark: wait for it as
                        # send() waits for each message (a client that does not read)
                        deadline.reschedule(loop.time() + timeout)
                        await direct.drain()
                    while todo and todo[0] is not _CLOSE and not isinstance(todo[0], Close):
                        item = todo[0]
                        deadline.reschedule(loop.time() + timeout)
                        await ws.send(item.data if isinstance(item, SendBinary) else item)
                        conn.sent(item)
                        todo.popleft()
                if todo:  # a close, after every frame before it
                    item = todo.popleft()
                    code, reason = (1000, "") if item is _CLOSE else (item.code, item.reason)
                    with contextlib.suppress(Exception):
                        await ws.close(code, reason)
                    return
            except asyncio.TimeoutError:
                logger.warning("connection %d: client did not read for %.1f s: slow_reader",
                               sess.id, timeout, extra={"conn": sess.id})
                acts = sess.fail_connection(ErrorCode.SLOW_READER,
                                            f"a send did not complete within {timeout:g} s")
                for a in acts:
                    if not isinstance(a, (SendText, SendBinary, Close)):
                        self._apply(conn, [a])
                err = next((a.data for a in acts if isinstance(a, SendText)), None)
                if err is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(ws.send(err), 0.2)
                close = next((a for a in acts if isinstance(a, Close)), Close(1008, "slow_reader"))
                try:
                    await asyncio.wait_for(ws.close(close.code, close.reason), 1.0)
                except Exception:
                    ws.transport.abort()
                return
            except ConnectionClosed:
                return

    @staticmethod
    def _send_now(conn: _Conn, ws: SessionConnection, todo: collections.deque[Any]) -> None:
        """Write the frames at the head of ``todo`` (up to its first close) that the
        connection's buffer takes now in one go (``SessionConnection.send_now``); the rest
        stay queued."""
        batch = list(itertools.takewhile(lambda it: it is not _CLOSE and not isinstance(it, Close),
                                         todo))
        if not batch:
            return
        n = ws.send_now([it.data if isinstance(it, SendBinary) else it for it in batch])
        for it in batch[:n]:
            todo.popleft()
            conn.sent(it)

    # ---------------------------------------------------------------- actions

    def _apply(self, conn: _Conn, actions: list[Action]) -> None:
        """Carry out a session's actions in order; engine refusals become stream errors."""
        pool = self.pool
        assert pool is not None
        followups: list[Action] = []
        for a in actions:
            if isinstance(a, SendBinary):
                if not conn.closing:
                    conn.put(a, len(a.data))  # the writer tells the session once it is written
            elif isinstance(a, SendText):
                if not conn.closing:
                    conn.put(a.data, len(a.data))
            elif isinstance(a, EnginePush):
                self._push(conn, a.key, a.levels, followups)
            elif isinstance(a, EngineOpen):
                self._open_stream(conn, a, followups)
            elif isinstance(a, EngineFinish):
                ps = self._pacer.get(a.key)
                if ps is None or not ps.hold_finish():
                    self._engine_call(conn, a.key, pool.finish, followups)
            elif isinstance(a, EngineCancel):
                pool.cancel(a.key)
                self._forget(a.key)
            elif isinstance(a, GenerateText):
                self._generate(conn, a, followups)
            elif isinstance(a, Close):
                if not conn.closing:
                    conn.closing = True
                    conn.out.put_nowait(a)
        if followups:
            self._apply(conn, followups)

    def _open_stream(self, conn: _Conn, a: EngineOpen, followups: list[Action]) -> bool:
        """Open the stream on the engine; False when it refused (the error is the answer)."""
        assert self.pool is not None
        try:
            self.pool.open(a.key, a.model, noise=a.noise, seed=a.seed, latency=a.latency,
                           voice=a.voice, options=a.options)
        except EngineError as e:  # refused at once: the error is the only answer
            followups += conn.session.on_engine_error(a.key, e.code, str(e))
            return False
        spec = self.specs[a.model]
        self._pacer.open(a.key, spec.frame_rate, spec.level_strides)
        return True

    def _engine_call(self, conn: _Conn, key: StreamKey, fn: Callable[..., None],
                     followups: list[Action], *args: Any) -> bool:
        try:
            fn(key, *args)
            return True
        except EngineError as e:
            followups += conn.session.on_engine_error(key, e.code, str(e))
            return False

    def _push(self, conn: _Conn, key: StreamKey, levels: list[npt.NDArray[np.int32]],
              followups: list[Action]) -> None:
        ps = self._pacer.get(key)
        if ps is None:
            return
        now = time.monotonic()
        if ps.start(now):
            self._ttfa_t0[key] = now
        if not self._holds:
            self._engine_call(conn, key, self.pool.push, followups, levels)  # type: ignore[union-attr]
            return
        ps.hold(levels)
        self._release_paced(conn, ps, followups)

    def _release_paced(self, conn: _Conn, ps: PacedStream, followups: list[Action]) -> None:
        """Hand the engine what pacing lets go now (and a held ``end`` after it)."""
        pool = self.pool
        assert pool is not None
        ahead = self.config.max_ahead_s if self.config.max_ahead_s > 0 else float("inf")
        sess, key = conn.session, ps.key
        room = sess.output_room_s(key)  # type: ignore[arg-type]
        before = ps.frames_pushed
        try:
            for arrs in ps.due(time.monotonic(), ahead, room * ps.frames_per_s):
                if not self._engine_call(conn, key, pool.push, followups, arrs):  # type: ignore[arg-type]
                    return
        finally:
            sess.on_released(key, ps.frames_pushed - before)  # type: ignore[arg-type]
        if ps.finish_due():
            self._engine_call(conn, ps.key, pool.finish, followups)  # type: ignore[arg-type]

    @property
    def _holds(self) -> bool:
        """Codes wait in the pacer: for pacing, or for a connection's output budget."""
        assert self.session_limits is not None
        return self.config.max_ahead_s > 0 or self.session_limits.output_budget_s > 0

    def _forget(self, key: StreamKey) -> None:
        self._pacer.drop(key)
        self._ttfa_t0.pop(key, None)
        room = self._room.pop(key, None)
        if room is not None:
            room.set()
        gen = self._gen.pop(key, None)
        if gen is not None:
            gen.cancel()

    def _generate(self, conn: _Conn, a: GenerateText, followups: list[Action]) -> None:
        """A start with text: the speech front's upstream LM feeds the stream's tokens."""
        sess = conn.session
        if self.speech is None:
            followups += sess.text_failed(a.key, "no_upstream", "this server has no --upstream "
                                          "language model: start with tokens")
            return
        self._gen[a.key] = asyncio.create_task(self.speech.feed_session(
            a.text, a.voice, f"ws-{a.key}",
            on_ids=lambda ids: self._apply(conn, sess.text_tokens(a.key, ids)),
            on_end=lambda: self._apply(conn, sess.text_end(a.key)),
            on_fail=lambda code, msg: self._apply(conn, sess.text_failed(a.key, code, msg)),
            room=lambda: self._text_room(sess, a.key)),
            name=f"codecd-text-{a.key}")

    async def _text_room(self, sess: Session, key: StreamKey) -> None:
        """Until the text stream takes more ids: woken by each of its audio events."""
        while not sess.text_room(key) and key in self._gen:
            ev = self._room.setdefault(key, asyncio.Event())
            ev.clear()
            await ev.wait()

    # ---------------------------------------------------------------- engine events

    def _on_event(self, ev: EngineEvent) -> None:
        key = ev.key
        if not isinstance(key, StreamKey):
            if self.speech is not None:
                self.speech.on_event(ev)
            return
        conn = self._conns.get(key.session)
        if conn is None:
            return
        sess = conn.session
        if isinstance(ev, Audio):
            room = self._room.get(key)
            if room is not None:
                room.set()
            t0 = self._ttfa_t0.pop(key, None)
            if t0 is not None:
                self.server_metrics.ttfa.observe(time.monotonic() - t0)
            acts = sess.on_audio(key, ev.pcm)
        elif isinstance(ev, Done):
            self._forget(key)
            acts = sess.on_done(key, ev.total_samples)
            logger.debug("stream %s done", key, extra={"conn": key.session,
                                                        "stream_id": key.stream_id})
        elif isinstance(ev, StreamError):
            self._forget(key)
            logger.warning("stream %s: engine error %s: %s", key, ev.code, ev.message,
                           extra={"conn": key.session, "stream_id": key.stream_id})
            acts = sess.on_engine_error(key, ev.code, ev.message)
        else:  # Opened: the session answers the start now
            acts = sess.on_opened(key)
        self._apply(conn, acts)

    async def _ticker(self) -> None:
        last_tick = 0.0
        while True:
            now = time.monotonic()
            held = 0
            if len(self._pacer) and self._holds:
                for ps in self._pacer.waiting():
                    conn = self._conns.get(ps.key.session)  # type: ignore[attr-defined]
                    if conn is None:
                        continue
                    fu: list[Action] = []
                    self._release_paced(conn, ps, fu)
                    if fu:
                        self._apply(conn, fu)
                    held += bool(ps.held)
            self.server_metrics.held.set(held)
            if now - last_tick >= TICK_S:
                last_tick = now
                for conn in list(self._conns.values()):
                    try:
                        self._apply(conn, conn.session.tick(now))
                    except Exception:
                        logger.exception("tick of connection %d failed", conn.session.id)
            await asyncio.sleep(PACE_S if held else TICK_S / 2)

    # ---------------------------------------------------------------- shutdown

    async def close(self) -> None:
        """Drain and stop (idempotent; concurrent callers wait for the same shutdown)."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        cfg = self.config
        logger.info("shutting down: draining %d stream(s) for up to %.1f s",
                    self.active_streams, cfg.drain_timeout_s)
        sd_notify("STOPPING=1")
        self.draining = True
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)  # stop accepting
        deadline = time.monotonic() + cfg.drain_timeout_s
        while self.active_streams > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.active_streams:
            logger.warning("drain timeout: closing %d stream(s)", self.active_streams)
        if self.speech is not None:
            await self.speech.close()
        for conn in list(self._conns.values()):
            self._apply(conn, conn.session.shutdown())
        if self._ws_server is not None:
            try:
                await asyncio.wait_for(self._ws_server.wait_closed(),
                                       cfg.send_timeout_s + 3.0)
            except asyncio.TimeoutError:
                logger.warning("connections did not close in time; aborting them")
                for conn in list(self._conns.values()):
                    conn.ws.transport.abort()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.pool is not None:
            await self.pool.close()
        self.ready = False
        self._closed.set()
        logger.info("stopped")

    async def wait_closed(self) -> None:
        await self._closed.wait()


async def run(config: Config) -> int:
    """``codecd serve``: start, serve until SIGTERM/SIGINT, shut down."""
    server = Server(config, sock=systemd_listen_socket())
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(server.start())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if start in done and start.exception() is not None:
        stopper.cancel()
        await server.close()
        raise start.exception()  # type: ignore[misc]
    await stopper
    if not start.done():
        start.cancel()
        with contextlib.suppress(BaseException):
            await start
    await server.close()
    return 0
