"""Plain HTTP on the daemon's port, and the checks a websocket upgrade passes.

``/healthz`` (the process answers), ``/readyz`` (200 once every worker serves and
until shutdown begins), ``/metrics`` (Prometheus text, after a fresh stats query
to the workers); the browser page's routes (``codecd.web``: ``/``, ``/static/*``,
``/demo/tokens.json``, ``/auth/ticket``). An upgrade is refused with 401 (bearer
token, or a browser credential in the subprotocol offer), 403 (Origin) or 503 (not
ready, shutting down, connection limits); 404 for anything else.
``/metrics`` follows ``metrics_access``: 401 without the bearer token, 403 from a
peer that is not loopback. Methods other than GET and HEAD get 405 on every path; a request that repeats a
header the server reads (``Upgrade``, ``Authorization``, ``Origin``) gets 400.
Each response carries each header once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response
from websockets.protocol import State

from .config import Config
from .metrics import ServerMetrics
from .responses import METHODS, SINGLE_HEADERS, BadRequest, bearer_ok, header, respond
from .session import SessionMetrics

if TYPE_CHECKING:
    from .web import WebRoutes

__all__ = ["Routes", "peer_ip"]

logger = logging.getLogger(__name__)


def peer_ip(conn: ServerConnection) -> str:
    ra = conn.remote_address
    return str(ra[0]) if ra else "?"


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return bool((mapped or addr).is_loopback)


@dataclass
class Routes:
    """``process_request`` of the websockets server: the routes and the upgrade checks."""

    config: Config
    metrics: ServerMetrics
    session_metrics: SessionMetrics
    ready: Callable[[], bool]  # /readyz: ready, not draining, every worker serving
    accepting: Callable[[], bool]  # new connections are welcome (ready, not draining)
    connections: Callable[[str], tuple[int, int]]  # (open connections, of this peer)
    refresh_stats: Callable[[], Awaitable[object]]  # before /metrics
    web: WebRoutes | None = None  # the page, tickets, browser credentials
    #: the metrics text (default: ``metrics.exposition()``; a front: the daemon's totals)
    exposition: Callable[[], str] | None = None
    #: a front asks the daemon's main process, the one authority on the connection limits
    #: (True: admitted; the front releases it when the connection ends)
    admit_connection: Callable[[ServerConnection, str], Awaitable[bool]] | None = None

    async def process_request(self, conn: ServerConnection, req: Request) -> Response | None:
        resp = await self._route(conn, req)
        proto = conn.protocol
        if proto.eof_sent and proto.state is State.CONNECTING:
            # bytes after the request that are not websocket frames made the library end
            # the connection already; answering too would trip its own assertion (an
            # ERROR traceback per such request). Marked closed, it is dropped silently.
            logger.info("dropped %s: junk after the request", peer_ip(conn))
            proto.state = State.CLOSED
        return resp

    async def _route(self, conn: ServerConnection, req: Request) -> Response | None:
        if req.method not in METHODS:
            self._refuse("bad_method")
            return respond(conn, 405, "method not allowed\n",
                           extra={"Allow": ", ".join(METHODS)})
        head = req.method == "HEAD"
        try:
            for name in SINGLE_HEADERS:
                header(req, name)
        except BadRequest as e:
            self._refuse("bad_request")
            logger.info("refused %s: %s", peer_ip(conn), e)
            return respond(conn, 400, f"bad request: {e}\n", head=head)
        path = req.path.split("?", 1)[0]
        if path == "/healthz":
            return respond(conn, 200, "ok\n", head=head)
        if path == "/readyz":
            ok = self.ready()
            return respond(conn, 200 if ok else 503, "ready\n" if ok else "not ready\n",
                           head=head)
        if path == "/metrics":
            refused = self._check_metrics(conn, req)
            if refused is not None:
                return refused
            with contextlib.suppress(Exception):
                await self.refresh_stats()
            text = self.exposition() if self.exposition is not None else \
                self.metrics.exposition()
            return respond(conn, 200, text, "text/plain; version=0.0.4; charset=utf-8", head=head)
        if (header(req, "Upgrade") or "").lower() != "websocket" or head:
            page = None if self.web is None else await self.web.handle(conn, req, path)
            if page is not None and head:  # the GET response's headers, without its body
                page = dataclasses.replace(page, body=b"")
            return page if page is not None else respond(conn, 404, "not found\n", head=head)
        resp = self._check_upgrade(conn, req)
        if resp is None and self.admit_connection is not None and \
                not await self.admit_connection(conn, peer_ip(conn)):
            self._refuse("too_many_connections")
            logger.info("refused %s: connection limit (daemon-wide)", peer_ip(conn))
            return respond(conn, 503, "too many connections\n", extra={"Retry-After": "1"})
        return resp

    def _check_metrics(self, conn: ServerConnection, req: Request) -> Response | None:
        """``metrics_access``: None when this peer may read /metrics, else the refusal."""
        cfg = self.config
        access = cfg.metrics_access
        token = cfg.metrics_token or cfg.auth_token
        if access == "open" or (access == "auto" and token is None):
            return None
        if access == "loopback":
            if _is_loopback(peer_ip(conn)):
                return None
            self._refuse("metrics_not_loopback")
            return respond(conn, 403, "metrics are served to loopback peers only\n")
        if token is not None and bearer_ok(header(req, "Authorization"), token):
            return None
        self._refuse("metrics_unauthorized")
        return respond(conn, 401, "unauthorized\n",
                       extra={"WWW-Authenticate": 'Bearer realm="codecd-metrics"'})

    def _refuse(self, reason: str) -> None:
        self.metrics.conn_refused.labels(reason).inc()

    def _check_upgrade(self, conn: ServerConnection, req: Request) -> Response | None:
        cfg = self.config
        if cfg.auth_token is not None:
            if not bearer_ok(header(req, "Authorization"), cfg.auth_token) and not (
                    self.web is not None and self.web.authorize(req)):
                self._refuse("unauthorized")
                self.session_metrics.errors["unauthorized"] += 1
                logger.info("refused %s: unauthorized", peer_ip(conn))
                return respond(conn, 401, "unauthorized\n",
                                extra={"WWW-Authenticate": 'Bearer realm="codecd"'})
        origin = header(req, "Origin")
        if origin is not None and cfg.allowed_origins and "*" not in cfg.allowed_origins \
                and origin not in cfg.allowed_origins:
            self._refuse("bad_origin")
            self.session_metrics.errors["bad_origin"] += 1
            logger.info("refused %s: origin %r not allowed", peer_ip(conn), origin)
            return respond(conn, 403, "origin not allowed\n")
        if not self.accepting():
            self._refuse("not_ready")
            return respond(conn, 503, "not ready\n", extra={"Retry-After": "1"})
        ip = peer_ip(conn)
        total, of_ip = self.connections(ip)
        if total >= cfg.max_connections or of_ip >= cfg.max_connections_per_ip:
            self._refuse("too_many_connections")
            logger.info("refused %s: connection limit", ip)
            return respond(conn, 503, "too many connections\n", extra={"Retry-After": "1"})
        if cfg.sndbuf_bytes:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.sndbuf_bytes)
        return None
