"""``codecd serve``: the main process, its front processes and its engine workers.

::

    codecd serve (main: supervisor, admission, readiness, systemd, shutdown)
     ├─ engine worker per device  (codecd.worker: the models, the ticks; one context per model)
     └─ front x N                 (codecd.front: websockets, sessions, pacing, HTTP)

Main binds the listening socket once (or takes systemd's) and every front
accepts on it. Each (front, worker) pair has a data channel of two
shared-memory rings (:mod:`codecd.channel`), so every stream of a device, from
whichever front, is decoded in the same ticks of the same context. Main
creates each channel and hands the ends over: to the worker on its descriptor
socket (``attach``), to the front on its control socket (``channel``); a worker
that (re)starts gets a channel to every front, a front that (re)starts one to
every serving worker.

Main is the one authority for the daemon-wide limits: a front asks it for every
connection (``max_connections``, ``max_connections_per_ip``) and every stream
(``max_streams``) and releases them when they end; the counts of a front that
dies are released with it. ``/readyz`` on a front is 200 only while main says
so: every worker serves, every front has started, and no drain has begun.
``/metrics`` on any front is the whole daemon: main gathers every front's
counters and every worker's stats for it.

Recovery: a front that dies is restarted (with backoff) and nothing else is
touched (the workers close its streams when its doorbells hang up). A worker
that dies is restarted by its :class:`~codecd.engine.Engine`; the fronts see
their event rings hang up and fail the streams on it with ``engine_restarted``,
keeping the connections; the new worker's channels follow.

Shutdown (SIGTERM/SIGINT reach main; fronts and workers ignore them):
``STOPPING=1``, every front drains (stops accepting, ``/readyz`` 503, streams
finish within ``drain_timeout_s``, then connections close with 1001) and exits,
then the workers stop, then main exits 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .channel import CtlLink, control_pair, make_channel, send_msg
from .config import Config, resolve_models
from .engine import Engine, EngineConfig, EngineStartError, child_env
from .front import config_to_json
from .sdnotify import sd_notify, systemd_listen_socket, watchdog, watchdog_interval_s
from .server import engine_config
from .web.tickets import TicketBook

__all__ = ["Daemon", "run", "default_fronts", "usable_cores"]

logger = logging.getLogger(__name__)

FRONT_BACKOFF_S = (0.05, 0.5, 1.0, 2.0, 5.0)
FRONT_STABLE_S = 30.0


def usable_cores(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Cores this process may use: its CPU affinity (taskset, systemd's CPUAffinity, a
    cpuset), within its cgroup's CPU quota where one is set (systemd's CPUQuota, a container's
    --cpus: ``cpu.max`` = "quota period")."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    try:
        with open(cgroup_cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def default_fronts(devices: list[str]) -> int:
    """Front processes for this machine: 1 when every worker decodes on the CPU (its threads
    take every core, and on 2 cores 2 fronts were no faster than 1: docs/benchmarks.md);
    otherwise one per usable core (:func:`usable_cores`) beyond one per worker and one for
    main, at least 1 and at most 8 (on 8 cores of an H100 host at 2,400 to 2,600 streams 6
    and 8 fronts kept up better than 4: a front reaches 0.4 to 0.8 of a core at 400 streams,
    and an idle one sleeps)."""
    if devices and all(d.strip().lower() == "cpu" for d in devices):
        return 1
    return max(1, min(8, usable_cores() - len(devices) - 1))


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0: ephemeral), for every front to accept on."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(4096)
    return s


@dataclass(eq=False)
class _Front:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    link: CtlLink | None = None
    up: bool = False
    ready: bool = False
    streams: int = 0  # streams admitted for it, not yet released
    conns: collections.Counter[str] = field(default_factory=collections.Counter)
    restarts: int = 0
    started_at: float = 0.0
    failures: int = 0
    snapshot: dict[str, Any] | None = None
    channels: dict[int, int] = field(default_factory=dict)  # worker -> its latest channel id


class Daemon:
    """Main process of ``codecd serve`` (see the module docstring)."""

    def __init__(self, config: Config, models: dict[str, str] | None = None, *,
                 sock: socket.socket | None = None, fronts: int | None = None,
                 engine_overrides: dict[str, Any] | None = None,
                 session_overrides: dict[str, Any] | None = None,
                 use_uvloop: bool = True) -> None:
        self.config = config
        self._model_paths = models
        self._sock = sock
        self.n_fronts = fronts or config.fronts or default_fronts(config.devices)
        self._engine_overrides = dict(engine_overrides or {})
        self._session_overrides = dict(session_overrides or {})
        self._use_uvloop = use_uvloop
        self.engines: list[Engine] = []
        self.engine_config: EngineConfig | None = None
        self.fronts = [_Front(i) for i in range(self.n_fronts)]
        self.active_streams = 0
        self.n_conns = 0
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.draining = False
        self.ready = False
        self._fids = itertools.count(1)
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_sent: bool | None = None
        self.tickets = TicketBook()  # the browser tickets of every front (codecd.web)
        self.port = 0
        #: the speech endpoint's listening socket (--http-port with --upstream), every front's
        self._http_sock: socket.socket | None = None
        self.http_port = 0

    # ------------------------------------------------------------- start

    def _listen(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        return _bind(self.config.host, self.config.port)

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        models = self._model_paths
        if models is None:
            models = await asyncio.to_thread(resolve_models, cfg)
        self.engine_config = engine_config(cfg, models, self._engine_overrides)
        self._sock = self._listen()
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        logger.info("listening on %s:%d (%d front(s))", cfg.host, self.port, self.n_fronts)
        if cfg.upstream and cfg.http_port >= 0:
            self._http_sock = _bind(cfg.host, cfg.http_port)
            self._http_sock.setblocking(False)
            self.http_port = int(self._http_sock.getsockname()[1])
            logger.info("speech endpoint on http://%s:%d/v1/audio/speech (upstream %s)",
                        cfg.host, self.http_port, cfg.upstream)
        self.engines = [Engine(self.engine_config, d, i, on_serving=self._on_worker_serving)
                        for i, d in enumerate(cfg.devices)]
        for f in self.fronts:
            self._spawn_front(f)
        results = await asyncio.gather(*(e.start() for e in self.engines),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._stop_all()
            raise errors[0]
        t_end = time.monotonic() + 60.0
        while not all(f.ready for f in self.fronts) and time.monotonic() < t_end:
            await asyncio.sleep(0.01)
        if not all(f.ready for f in self.fronts):
            await self._stop_all()
            raise EngineStartError("the front processes did not start within 60 s")
        self._tasks.append(asyncio.create_task(self._readiness(), name="codecd-readiness"))
        interval = watchdog_interval_s()
        if interval is not None:
            self._tasks.append(asyncio.create_task(
                watchdog(interval, self._healthy(interval), self._status), name="codecd-watchdog"))
        self._update_ready()
        logger.info("ready: %d worker(s) on %s, %d front(s)", len(self.engines),
                    ",".join(cfg.devices), self.n_fronts)
        sd_notify("READY=1")

    def _healthy(self, timeout: float) -> Any:
        async def probe() -> bool:
            serving = [e for e in self.engines if e.serving]
            if not serving:
                return False
            return all(await asyncio.gather(*(e.probe(timeout) for e in serving)))
        return probe

    def _status(self) -> str:
        up = sum(1 for f in self.fronts if f.up)
        return (f"streams {self.active_streams}, connections {self.n_conns}, fronts {up}/"
                f"{self.n_fronts}, devices {','.join(self.config.devices)}")

    # ------------------------------------------------------------- fronts

    def _spawn_front(self, f: _Front) -> None:
        assert self._loop is not None and self._sock is not None
        mine, theirs = control_pair()
        env = child_env()
        cfd, lfd = theirs.fileno(), self._sock.fileno()
        hfd = self._http_sock.fileno() if self._http_sock is not None else -1
        try:
            f.proc = subprocess.Popen(
                [sys.executable, "-c",
                 f"import codecd.front as f; f.serve_fd({cfd}, {lfd}, {f.index}, {hfd})"],
                pass_fds=(cfd, lfd) + ((hfd,) if hfd >= 0 else ()), stdin=subprocess.DEVNULL,
                env=env, close_fds=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        assert self.engine_config is not None
        send_msg(mine, {"op": "config", "config": config_to_json(self.config),
                        "engine": self.engine_config.to_json(), "parent_pid": os.getpid(),
                        "n_workers": len(self.config.devices), "uvloop": self._use_uvloop,
                        "session_overrides": self._session_overrides})
        f.link = CtlLink(mine, self._loop, lambda m, fds: self._on_front_msg(f, m, fds),
                         lambda: self._on_front_eof(f))
        f.up, f.ready, f.started_at = True, False, time.monotonic()
        f.channels.clear()
        logger.info("front %d: pid %d", f.index, f.proc.pid)
        for e in self.engines:
            if e.serving:
                self._connect(f, e)

    def _connect(self, f: _Front, e: Engine) -> None:
        """A new data channel between front ``f`` and worker ``e``."""
        if f.link is None or f.link.closed:
            return
        ch = make_channel()
        try:
            fid = next(self._fids)
            if e.attach(fid, ch.worker_fds):
                f.link.send({"op": "channel", "worker": e.index, "info": e.info, "fid": fid},
                            ch.front_fds)
                f.channels[e.index] = fid
        finally:
            ch.close()

    def _reconnect(self, f: _Front, e: Engine, fid: Any) -> None:
        """A channel hung up while its worker serves: a new one (unless one came since)."""
        if e.serving and f.up and not self.draining and f.channels.get(e.index) == fid:
            logger.warning("front %d: new channel to worker %d", f.index, e.index)
            self._connect(f, e)

    def _on_worker_serving(self, e: Engine) -> None:
        for f in self.fronts:
            if f.up:
                self._connect(f, e)
        self._update_ready()

    def _on_front_msg(self, f: _Front, msg: dict[str, Any], fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        op = msg.get("op")
        link = f.link
        assert link is not None
        cfg = self.config
        if op == "admit_stream":
            ok = not self.draining and self.active_streams < cfg.max_streams
            if ok:
                self.active_streams += 1
                f.streams += 1
            link.send({"op": "admitted", "id": msg["id"], "ok": ok,
                       "why": "" if ok else ("server is shutting down" if self.draining else
                                             "server is at its stream limit; retry later")})
        elif op == "release_stream":
            if f.streams > 0:
                f.streams -= 1
                self.active_streams -= 1
        elif op == "admit_conn":
            ip = str(msg.get("ip", "?"))
            ok = (not self.draining and self.n_conns < cfg.max_connections
                  and self.per_ip[ip] < cfg.max_connections_per_ip)
            if ok:
                self.n_conns += 1
                self.per_ip[ip] += 1
                f.conns[ip] += 1
            link.send({"op": "reply", "id": msg["id"], "data": ok})
        elif op == "release_conn":
            ip = str(msg.get("ip", "?"))
            if f.conns[ip] > 0:
                self._release_conns(f, ip, 1)
        elif op == "ready":
            f.ready = True
            self._update_ready()
        elif op == "metrics":
            asyncio.ensure_future(self._answer_metrics(f, int(msg["id"])))
        elif op == "snapshot":
            fut = self._waiters.get(int(msg["id"]))
            if fut is not None and not fut.done():
                fut.set_result(msg.get("data"))
        elif op == "ticket":  # a browser ticket a front issued: any front may redeem it
            self.tickets.adopt(str(msg["ticket"]), msg.get("origin"))
        elif op == "redeem_ticket":
            ok = self.tickets.redeem(str(msg.get("ticket", "")), msg.get("origin"),
                                     unbound_ok=bool(msg.get("own")))
            link.send({"op": "reply", "id": msg["id"], "data": ok})
        elif op == "drained":
            f.ready = False
        elif op == "channel_lost":  # a worker that died (restarting: it reconnects when it
            # serves) or one that closed this front's channel (the front did not read)
            i = int(msg.get("worker", -1))
            if 0 <= i < len(self.engines) and f.channels.get(i) == msg.get("fid"):
                assert self._loop is not None
                self._loop.call_later(0.2, self._reconnect, f, self.engines[i], msg.get("fid"))
        else:
            logger.warning("front %d: unexpected message %r", f.index, op)

    def _release_conns(self, f: _Front, ip: str, n: int) -> None:
        f.conns[ip] -= n
        if f.conns[ip] <= 0:
            del f.conns[ip]
        self.n_conns -= n
        self.per_ip[ip] -= n
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]

    def _on_front_eof(self, f: _Front) -> None:
        """The front's control socket hung up: it exited (or crashed)."""
        f.up = f.ready = False
        f.link = None
        self.active_streams -= f.streams
        f.streams = 0
        for ip, n in list(f.conns.items()):
            self._release_conns(f, ip, n)
        self._update_ready()
        if self.draining:
            return
        lived = time.monotonic() - f.started_at
        code = f.proc.poll() if f.proc is not None else None
        logger.error("front %d (pid %d) exited (%s) after %.1f s; restarting", f.index,
                     f.proc.pid if f.proc else 0, code, lived)
        if lived >= FRONT_STABLE_S:
            f.failures = 0
        delay = FRONT_BACKOFF_S[min(f.failures, len(FRONT_BACKOFF_S) - 1)]
        f.failures += 1
        self._tasks = [t for t in self._tasks if not t.done()]  # restarts come and go
        self._tasks.append(asyncio.ensure_future(self._restart_front(f, delay)))

    async def _restart_front(self, f: _Front, delay: float) -> None:
        proc = f.proc
        if proc is not None:
            t_end = time.monotonic() + 2.0
            while proc.poll() is None and time.monotonic() < t_end:
                await asyncio.sleep(0.01)
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        await asyncio.sleep(delay)
        if self.draining:
            return
        f.restarts += 1
        self._spawn_front(f)

    # ------------------------------------------------------------- readiness, metrics

    def _compute_ready(self) -> bool:
        return (not self.draining and bool(self.engines)
                and all(e.serving for e in self.engines)
                and all(f.up and f.ready for f in self.fronts))

    def _update_ready(self) -> None:
        self.ready = self._compute_ready()
        for f in self.fronts:
            if f.link is not None:
                f.link.send({"op": "ready", "value": self.ready})

    async def _readiness(self) -> None:
        """Push readiness when it changes (a worker that died or came back)."""
        last = self.ready
        while True:
            now = self._compute_ready()
            if now != last:
                self._update_ready()
                last = now
            await asyncio.sleep(0.02)

    async def _snapshot(self, f: _Front) -> dict[str, Any] | None:
        if f.link is None or not f.up:
            return None
        i = next(self._ids)
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._waiters[i] = fut
        try:
            f.link.send({"op": "snapshot", "id": i})
            got: dict[str, Any] = await asyncio.wait_for(fut, 1.0)
            return got
        except asyncio.TimeoutError:
            return None
        finally:
            self._waiters.pop(i, None)

    async def totals(self) -> dict[str, Any]:
        """The whole daemon's numbers: every front's counters, every worker's stats."""
        snaps, _ = await asyncio.gather(
            asyncio.gather(*(self._snapshot(f) for f in self.fronts)),
            asyncio.gather(*(e.fetch_stats(1.0) for e in self.engines if e.serving),
                           return_exceptions=True))
        return {"ready": self.ready, "pid": os.getpid(), "streams": self.active_streams,
                "connections": self.n_conns,
                "fronts": [{"index": f.index, "up": f.up, "restarts": f.restarts,
                            "pid": f.proc.pid if f.proc else 0, "snapshot": s}
                           for f, s in zip(self.fronts, snaps)],
                "workers": [e.stats() for e in self.engines]}

    async def _answer_metrics(self, f: _Front, i: int) -> None:
        try:
            data = await self.totals()
        except Exception:
            logger.exception("metrics totals failed")
            data = {}
        if f.link is not None:
            f.link.send({"op": "reply", "id": i, "data": data})

    # ------------------------------------------------------------- shutdown

    async def close(self) -> None:
        cfg = self.config
        logger.info("shutting down: draining %d stream(s) on %d front(s) for up to %.1f s",
                    self.active_streams, sum(f.up for f in self.fronts), cfg.drain_timeout_s)
        sd_notify("STOPPING=1")
        self.draining = True
        self._update_ready()
        for f in self.fronts:
            if f.link is not None:
                f.link.send({"op": "drain"})
        for sock in (self._sock, self._http_sock):  # the fronts close theirs as they stop accepting
            if sock is not None:
                sock.close()
        self._sock = self._http_sock = None
        t_end = time.monotonic() + cfg.drain_timeout_s + cfg.send_timeout_s + 5.0
        while any(f.proc is not None and f.proc.poll() is None for f in self.fronts) and \
                time.monotonic() < t_end:
            await asyncio.sleep(0.02)
        await self._stop_all()
        logger.info("stopped")

    async def _stop_all(self) -> None:
        self.draining = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        for f in self.fronts:
            if f.proc is not None and f.proc.poll() is None:
                logger.warning("front %d did not exit; killing it", f.index)
                f.proc.kill()
            if f.proc is not None:
                await asyncio.to_thread(f.proc.wait)
            if f.link is not None:
                f.link.close()
                f.link = None
            f.up = False
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)
        for sock in (self._sock, self._http_sock):
            if sock is not None:
                sock.close()


async def run(config: Config) -> int:
    """``codecd serve``: start, serve until SIGTERM/SIGINT, shut down."""
    daemon = Daemon(config, sock=systemd_listen_socket(),
                    use_uvloop=os.environ.get("CODECD_UVLOOP", "1") != "0")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(daemon.start())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if start in done and start.exception() is not None:
        stopper.cancel()
        raise start.exception()  # type: ignore[misc]
    await stopper
    if not start.done():
        start.cancel()
        with contextlib.suppress(BaseException):
            await start
    await daemon.close()
    return 0
