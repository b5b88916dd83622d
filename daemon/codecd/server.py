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
stalled client costs little kernel/user memory. Pacing: a stream's codes are
handed to the engine at most ``max_ahead_s`` of audio ahead of real time since
its first push (the rest waits here as codes, ~100x smaller than PCM; the
session's backlog limit bounds them), so the audio produced and sent is never
more than that far ahead.

Plain HTTP on the same port (``process_request``): ``/healthz``, ``/readyz``,
``/metrics``; the websocket upgrade is refused with 401 (bearer token), 403
(Origin) or 503 (not ready, shutting down, connection limits).

Shutdown (:meth:`Server.close`, SIGTERM/SIGINT in :func:`run`): stop accepting,
refuse new streams (``busy``), let open streams finish within
``drain_timeout_s``, close the rest with ``shutting_down`` (1001), stop the
engine pool (native memory is freed with the worker processes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from . import __version__
from .config import Config, resolve_models
from .engine import Audio, Done, EngineConfig, EngineError, EngineEvent, EnginePool, StreamError
from .families import engine_options, model_spec
from .protocol import ErrorCode, Limits
from .session import (
    Action,
    Close,
    EngineCancel,
    EngineFinish,
    EngineOpen,
    EnginePush,
    ModelSpec,
    SendBinary,
    SendText,
    Session,
    SessionLimits,
    SessionMetrics,
    StreamKey,
)

__all__ = ["Server", "run", "systemd_listen_socket", "sd_notify", "setup_logging"]

logger = logging.getLogger(__name__)

TICK_S = 0.25  # Session.tick period
PACE_S = 0.02  # release period of paced codes
_CLOSE = object()


# ------------------------------------------------------------------ helpers


def systemd_listen_socket() -> socket.socket | None:
    """The listening socket passed by systemd socket activation (fd 3), if any."""
    try:
        if int(os.environ.get("LISTEN_PID", "0")) != os.getpid():
            return None
        if int(os.environ.get("LISTEN_FDS", "0")) < 1:
            return None
    except ValueError:
        return None
    for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(k, None)  # not inherited by the worker processes
    s = socket.socket(fileno=3)
    s.setblocking(False)
    logger.info("using the socket passed by systemd (fd 3, %s)", s.getsockname())
    return s


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC, for this pid), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 2e6)
    except ValueError:
        return None


def sd_notify(state: str) -> bool:
    """Tell systemd ``state`` (``READY=1``, ``STOPPING=1``...) when NOTIFY_SOCKET is set."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), addr)
        return True
    except OSError as e:
        logger.warning("sd_notify(%s) failed: %s", state, e)
        return False


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields."""

    _std = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                             "logger": record.name, "msg": record.getMessage()}
        for k, v in record.__dict__.items():
            if k not in self._std and not k.startswith("_"):
                d[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    h = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        h.setFormatter(JsonFormatter())
    else:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
    logging.getLogger("websockets").setLevel(max(logging.WARNING, root.level))


def voice_files(root: str) -> dict[str, str]:
    """Voice name -> file of every voice in the voices directory (none if it does not exist)."""
    from .families.voices import VoiceStore

    store = VoiceStore(root)
    return {n: str(store.path(n)) for n in store.names()}


def _peer_ip(conn: ServerConnection) -> str:
    ra = conn.remote_address
    return str(ra[0]) if ra else "?"


# ------------------------------------------------------------------ pacing


@dataclass(eq=False)
class _Pace:
    """Codes of one stream not yet handed to the engine (pacing), and its timing."""

    key: StreamKey
    frames_per_s: float
    max_stride: int
    strides: tuple[int, ...]
    t0: float | None = None
    frames_pushed: int = 0
    held: collections.deque[list[npt.NDArray[np.int32]]] = field(
        default_factory=collections.deque)
    finish_held: bool = False
    first_audio: bool = False


# ------------------------------------------------------------------ connection


@dataclass(eq=False)
class _Conn:
    ws: ServerConnection
    session: Session
    ip: str
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    writer: asyncio.Task[None] | None = None
    closing: bool = False


# ------------------------------------------------------------------ metrics


class _StatsCollector(Collector):
    """Per-worker engine stats (from the last fetch), session error counters, memory."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterable[Any]:
        s = self.server
        st = s.pool.stats() if s.pool is not None else {"workers": []}
        errs = CounterMetricFamily("codecd_errors", "errors sent to clients, by code",
                                   labels=["code"])
        for code, n in sorted(s.metrics.errors.items()):
            errs.add_metric([code], n)
        yield errs
        busy = CounterMetricFamily("codecd_busy_refusals", "stream starts refused with busy")
        busy.add_metric([], s.metrics.errors.get("busy", 0))
        yield busy
        sm = CounterMetricFamily("codecd_streams", "streams by outcome", labels=["outcome"])
        for k in ("started", "done", "cancelled", "failed", "refused"):
            sm.add_metric([k], getattr(s.metrics, f"streams_{k}"))
        yield sm
        restarts = CounterMetricFamily("codecd_worker_restarts", "worker process restarts",
                                       labels=["worker"])
        queued = GaugeMetricFamily("codecd_queue_depth", "commands queued for a worker",
                                   labels=["worker"])
        up = GaugeMetricFamily("codecd_worker_up", "1 while the worker serves", labels=["worker"])
        rss = GaugeMetricFamily("codecd_resident_memory_bytes", "resident set size",
                                labels=["process"])
        rss.add_metric(["daemon"], _rss(os.getpid()))
        lab = ["worker", "model"]
        pend = GaugeMetricFamily("codecd_pending_frames", "frames pushed, not yet decoded", labels=lab)
        bmax = GaugeMetricFamily("codecd_batch_size_max", "largest batch of one tick", labels=lab)
        bmean = GaugeMetricFamily("codecd_batch_size_recent", "mean batch of recent ticks", labels=lab)
        tmean = GaugeMetricFamily("codecd_tick_seconds_mean", "mean tick time (recent)", labels=lab)
        tmax = GaugeMetricFamily("codecd_tick_seconds_max", "max tick time (recent)", labels=lab)
        ticks = CounterMetricFamily("codecd_ticks", "decode ticks", labels=lab)
        graph = CounterMetricFamily("codecd_graph", "runtime graph counters",
                                    labels=lab + ["counter"])
        cbuf = GaugeMetricFamily("codecd_compute_buffer_bytes", "compute buffer memory",
                                 labels=lab + ["backend"])
        wbytes = GaugeMetricFamily("codecd_weight_bytes", "model weight memory", labels=lab)
        sbytes = GaugeMetricFamily("codecd_state_bytes", "stream state memory", labels=lab)
        for w in st["workers"]:
            wi = str(w["index"])
            restarts.add_metric([wi], w["restarts"])
            queued.add_metric([wi], w["queued_commands"])
            up.add_metric([wi], 1 if w["state"] == "ready" else 0)
            if w.get("pid"):
                rss.add_metric([f"worker{wi}"], _rss(int(w["pid"])))
            for name, m in ((w.get("worker") or {}).get("models") or {}).items():
                lv = [wi, name]
                pend.add_metric(lv, m.get("pending_frames", 0))
                bmax.add_metric(lv, m.get("max_batch_seen", 0))
                rb = m.get("recent_batches") or []
                bmean.add_metric(lv, sum(rb) / len(rb) if rb else 0.0)
                tmean.add_metric(lv, (m.get("tick_ms_mean") or 0.0) / 1e3)
                tmax.add_metric(lv, (m.get("tick_ms_max") or 0.0) / 1e3)
                ticks.add_metric(lv, m.get("ticks", 0))
                c = m.get("codecrt") or {}
                for k in ("graphs_built", "graphs_reused", "sched_resets", "sched_recreations",
                          "reservations", "computes", "graph_splits"):
                    if k in c:
                        graph.add_metric(lv + [k], c[k])
                for be, nb in zip(c.get("backends", ()), c.get("compute_buffer_bytes", ())):
                    cbuf.add_metric(lv + [str(be)], nb)
                wbytes.add_metric(lv, c.get("weight_bytes", 0))
                sbytes.add_metric(lv, c.get("state_bytes", 0))
        yield from (restarts, queued, up, rss, pend, bmax, bmean, tmean, tmax, ticks, graph,
                    cbuf, wbytes, sbytes)


def _rss(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


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
        self._pace: dict[StreamKey, _Pace] = {}
        self._ttfa_t0: dict[Hashable, float] = {}
        self._ws_server: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._close_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self.session_limits: SessionLimits | None = None
        self._init_metrics()

    # ---------------------------------------------------------------- metrics

    def _init_metrics(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        Gauge("codecd_streams_active", "open streams", registry=r).set_function(
            lambda: self.active_streams)
        Gauge("codecd_connections_active", "open websocket connections", registry=r
              ).set_function(lambda: len(self._conns))
        Gauge("codecd_ready", "1 when ready to serve", registry=r).set_function(
            lambda: 1 if self.ready else 0)
        self.m_ttfa = Histogram("codecd_time_to_first_audio_seconds",
                                "first codes handed to the engine -> first audio",
                                buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
                                registry=r)
        self.m_held = Gauge("codecd_paced_streams", "streams with codes held back by pacing",
                            registry=r)
        self.m_conn_refused = Counter("codecd_connections_refused",
                                      "websocket upgrades refused, by reason", ["reason"],
                                      registry=r)
        r.register(_StatsCollector(self))

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
        ekw: dict[str, Any] = dict(models=dict(models), n_threads=cfg.threads,
                                   max_streams=cfg.max_streams, max_batch=cfg.max_batch,
                                   gather_ms=cfg.gather_ms, max_backlog_frames=cfg.max_queued_frames,
                                   warm_buckets=tuple(cfg.batch_buckets) or None,
                                   voices=voice_files(cfg.voices_dir),
                                   family_options=engine_options(cfg))
        ekw.update(self._engine_overrides)
        self.pool = EnginePool(EngineConfig(**ekw), cfg.devices, on_event=self._on_event)
        kw: dict[str, Any] = dict(process_request=self._process_request, compression=None,
                                  max_size=cfg.max_message_bytes, max_queue=64,
                                  write_limit=max(4096, cfg.sndbuf_bytes or 32768),
                                  close_timeout=2.0, ping_interval=20, ping_timeout=20,
                                  server_header=f"codecd/{__version__}")
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
        cpf = max(s.codes_per_frame for s in self.specs.values())
        skw: dict[str, Any] = dict(
            max_streams=cfg.max_streams_per_connection,
            max_pending_tokens=max(64, int(cfg.max_queued_frames * cpf)),
            max_duration_s=cfg.max_stream_duration_s, idle_timeout_s=cfg.idle_timeout_s,
            finish_timeout_s=max(120.0, cfg.max_stream_duration_s + 60.0),
            protocol=Limits(max_message_bytes=cfg.max_message_bytes))
        skw.update(self._session_overrides)
        self.session_limits = SessionLimits(**skw)
        self._tasks.append(asyncio.create_task(self._ticker(), name="codecd-ticker"))
        interval = watchdog_interval_s()
        if interval is not None:
            self._tasks.append(asyncio.create_task(self._watchdog(interval), name="codecd-watchdog"))
        self.ready = True
        for n, s in self.specs.items():
            logger.info("model %s: %s %d Hz, %d levels, layouts %s", n, s.arch, s.sample_rate,
                        s.n_levels, ",".join(s.layouts))
        logger.info("ready: %d worker(s) on %s", len(self.pool.engines), ",".join(cfg.devices))
        sd_notify("READY=1")

    async def _watchdog(self, interval: float) -> None:
        """WATCHDOG=1 at half of WatchdogSec, from the event loop, and only while the
        engine workers answer a health probe: a wedged worker or loop stops the pings
        and systemd restarts the service."""
        while True:
            if self.pool is not None and await self.pool.probe(timeout=interval):
                sd_notify(f"WATCHDOG=1\nSTATUS=streams {self.active_streams}, "
                          f"devices {','.join(self.config.devices)}")
            else:
                logger.warning("watchdog: an engine worker did not answer; not pinging")
            await asyncio.sleep(interval)

    # ---------------------------------------------------------------- HTTP

    def _http(self, conn: ServerConnection, status: int, body: str,
              content_type: str = "text/plain; charset=utf-8",
              extra: dict[str, str] | None = None) -> Response:
        r = conn.respond(status, body)
        r.headers["Content-Type"] = content_type
        for k, v in (extra or {}).items():
            r.headers[k] = v
        return r

    async def _process_request(self, conn: ServerConnection, req: Request) -> Response | None:
        cfg = self.config
        path = req.path.split("?", 1)[0]
        if path == "/healthz":
            return self._http(conn, 200, "ok\n")
        if path == "/readyz":
            ok = self._is_ready()
            return self._http(conn, 200 if ok else 503, "ready\n" if ok else "not ready\n")
        if path == "/metrics":
            if self.pool is not None:
                with contextlib.suppress(Exception):
                    await self.pool.fetch_stats(timeout=1.0)
            return self._http(conn, 200, generate_latest(self.registry).decode(),
                              "text/plain; version=0.0.4; charset=utf-8")
        if req.headers.get("Upgrade", "").lower() != "websocket":
            return self._http(conn, 404, "not found\n")
        if cfg.auth_token is not None:
            auth = req.headers.get("Authorization", "")
            scheme, _, tok = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    tok.strip().encode(), cfg.auth_token.encode()):
                self.m_conn_refused.labels("unauthorized").inc()
                self.metrics.errors["unauthorized"] += 1
                logger.info("refused %s: unauthorized", _peer_ip(conn))
                return self._http(conn, 401, "unauthorized\n",
                                  extra={"WWW-Authenticate": 'Bearer realm="codecd"'})
        origin = req.headers.get("Origin")
        if origin is not None and cfg.allowed_origins and "*" not in cfg.allowed_origins \
                and origin not in cfg.allowed_origins:
            self.m_conn_refused.labels("bad_origin").inc()
            self.metrics.errors["bad_origin"] += 1
            logger.info("refused %s: origin %r not allowed", _peer_ip(conn), origin)
            return self._http(conn, 403, "origin not allowed\n")
        if self.draining or not self.ready:
            self.m_conn_refused.labels("not_ready").inc()
            return self._http(conn, 503, "not ready\n", extra={"Retry-After": "1"})
        ip = _peer_ip(conn)
        if len(self._conns) >= cfg.max_connections or self._per_ip[ip] >= cfg.max_connections_per_ip:
            self.m_conn_refused.labels("too_many_connections").inc()
            logger.info("refused %s: connection limit", ip)
            return self._http(conn, 503, "too many connections\n", extra={"Retry-After": "1"})
        if cfg.sndbuf_bytes:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.sndbuf_bytes)
        return None

    def _is_ready(self) -> bool:
        return (self.ready and not self.draining and self.pool is not None
                and all(e.serving for e in self.pool.engines))

    # ---------------------------------------------------------------- connections

    def _admit(self) -> bool:
        if self.draining or self.active_streams >= self.config.max_streams:
            return False
        self.active_streams += 1
        return True

    def _release(self) -> None:
        self.active_streams -= 1

    async def _handler(self, ws: ServerConnection) -> None:
        assert self.session_limits is not None
        ip = _peer_ip(ws)
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
            async for msg in ws:
                if isinstance(msg, str):
                    acts = sess.receive_text(msg)
                else:
                    acts = sess.receive_binary(msg)
                self._apply(conn, acts)
                if sess.closed:
                    break
        except ConnectionClosed:
            pass
        except Exception:
            logger.exception("connection %d: handler failed", sess.id, extra=log)
            self._apply(conn, sess.fail_connection(ErrorCode.INTERNAL_ERROR, "internal error"))
        finally:
            self._apply(conn, sess.connection_lost())
            if conn.writer is not None:
                if not conn.closing:
                    conn.out.put_nowait(_CLOSE)
                try:
                    await asyncio.wait_for(asyncio.shield(conn.writer),
                                           self.config.send_timeout_s + 3.0)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    conn.writer.cancel()
            self._conns.pop(sess.id, None)
            self._per_ip[ip] -= 1
            if self._per_ip[ip] <= 0:
                del self._per_ip[ip]
            logger.info("connection %d closed (%s)", sess.id,
                        ws.close_code if ws.close_code is not None else "-", extra=log)

    async def _writer(self, conn: _Conn) -> None:
        ws, sess = conn.ws, conn.session
        timeout = self.config.send_timeout_s
        while True:
            item = await conn.out.get()
            if item is _CLOSE:
                with contextlib.suppress(Exception):
                    await ws.close(1000)
                return
            if isinstance(item, Close):
                with contextlib.suppress(Exception):
                    await ws.close(item.code, item.reason)
                return
            try:
                await asyncio.wait_for(ws.send(item), timeout)
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

    # ---------------------------------------------------------------- actions

    def _apply(self, conn: _Conn, actions: list[Action]) -> None:
        """Carry out a session's actions in order; engine refusals become stream errors."""
        pool = self.pool
        assert pool is not None
        sess = conn.session
        followups: list[Action] = []
        for a in actions:
            if isinstance(a, (SendBinary, SendText)):
                if not conn.closing:
                    conn.out.put_nowait(a.data)
            elif isinstance(a, EnginePush):
                self._push(conn, a.key, a.levels, followups)
            elif isinstance(a, EngineOpen):
                try:
                    pool.open(a.key, a.model, noise=a.noise, seed=a.seed, latency=a.latency,
                              voice=a.voice, options=a.options)
                except EngineError as e:  # refused at once: the error is the only answer
                    followups += sess.on_engine_error(a.key, e.code, str(e))
                    continue
                spec = self.specs[a.model]
                self._pace[a.key] = _Pace(a.key, spec.sample_rate / spec.hop_length,
                                          max(spec.level_strides), spec.level_strides)
            elif isinstance(a, EngineFinish):
                ps = self._pace.get(a.key)
                if ps is not None and ps.held:
                    ps.finish_held = True
                else:
                    self._engine_call(conn, a.key, pool.finish, followups)
            elif isinstance(a, EngineCancel):
                pool.cancel(a.key)
                self._pace.pop(a.key, None)
                self._ttfa_t0.pop(a.key, None)
            elif isinstance(a, Close):
                if not conn.closing:
                    conn.closing = True
                    conn.out.put_nowait(a)
        if followups:
            self._apply(conn, followups)

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
        ps = self._pace.get(key)
        if ps is None:
            return
        if ps.t0 is None:
            ps.t0 = time.monotonic()
            self._ttfa_t0[key] = ps.t0
        if self.config.max_ahead_s <= 0:
            self._engine_call(conn, key, self.pool.push, followups, levels)  # type: ignore[union-attr]
            return
        ps.held.append(levels)
        self._release_paced(conn, ps, followups)

    def _release_paced(self, conn: _Conn, ps: _Pace, followups: list[Action]) -> None:
        pool = self.pool
        assert pool is not None and ps.t0 is not None
        allowed = int((time.monotonic() - ps.t0 + self.config.max_ahead_s) * ps.frames_per_s)
        while ps.held:
            budget = allowed - ps.frames_pushed
            if budget <= 0:
                break
            arrs = ps.held[0]
            frames = max((a.size * s for a, s in zip(arrs, ps.strides)), default=0)
            if frames > budget:
                f = (budget // ps.max_stride) * ps.max_stride
                if f <= 0:
                    break
                head = [a[: f // s] for a, s in zip(arrs, ps.strides)]
                ps.held[0] = [a[f // s:] for a, s in zip(arrs, ps.strides)]
                arrs, frames = head, f
            else:
                ps.held.popleft()
            if not self._engine_call(conn, ps.key, pool.push, followups, arrs):
                return
            ps.frames_pushed += frames
        if not ps.held and ps.finish_held:
            ps.finish_held = False
            self._engine_call(conn, ps.key, pool.finish, followups)

    # ---------------------------------------------------------------- engine events

    def _on_event(self, ev: EngineEvent) -> None:
        key = ev.key
        if not isinstance(key, StreamKey):
            return
        conn = self._conns.get(key.session)
        if conn is None:
            return
        sess = conn.session
        if isinstance(ev, Audio):
            t0 = self._ttfa_t0.pop(key, None)
            if t0 is not None:
                self.m_ttfa.observe(time.monotonic() - t0)
            acts = sess.on_audio(key, ev.pcm)
        elif isinstance(ev, Done):
            self._pace.pop(key, None)
            self._ttfa_t0.pop(key, None)
            acts = sess.on_done(key, ev.total_samples)
            logger.debug("stream %s done", key, extra={"conn": key.session,
                                                        "stream_id": key.stream_id})
        elif isinstance(ev, StreamError):
            self._pace.pop(key, None)
            self._ttfa_t0.pop(key, None)
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
            if self._pace and self.config.max_ahead_s > 0:
                for ps in list(self._pace.values()):
                    if ps.held or ps.finish_held:
                        conn = self._conns.get(ps.key.session)
                        if conn is None:
                            continue
                        fu: list[Action] = []
                        self._release_paced(conn, ps, fu)
                        if fu:
                            self._apply(conn, fu)
                        held += bool(ps.held)
            self.m_held.set(held)
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
