"""Plain HTTP on the daemon's port, and the checks a websocket upgrade passes.

``/healthz`` (the process answers), ``/readyz`` (200 once every worker serves and
until shutdown begins), ``/metrics`` (Prometheus text, after a fresh stats query
to the workers); the browser page's routes (``codecd.web``: ``/``, ``/static/*``,
``/demo/tokens.json``, ``/auth/ticket``). An upgrade is refused with 401 (bearer
token, or a browser credential in the subprotocol offer), 403 (Origin) or 503 (not
ready, shutting down, connection limits); 404 for anything else.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from .config import Config
from .metrics import ServerMetrics
from .session import SessionMetrics

if TYPE_CHECKING:
    from .web import WebRoutes

__all__ = ["Routes", "peer_ip"]

logger = logging.getLogger(__name__)


def peer_ip(conn: ServerConnection) -> str:
    ra = conn.remote_address
    return str(ra[0]) if ra else "?"


def _respond(conn: ServerConnection, status: int, body: str,
             content_type: str = "text/plain; charset=utf-8",
             extra: dict[str, str] | None = None) -> Response:
    r = conn.respond(status, body)
    r.headers["Content-Type"] = content_type
    for k, v in (extra or {}).items():
        r.headers[k] = v
    return r


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
        path = req.path.split("?", 1)[0]
        if path == "/healthz":
            return _respond(conn, 200, "ok\n")
        if path == "/readyz":
            ok = self.ready()
            return _respond(conn, 200 if ok else 503, "ready\n" if ok else "not ready\n")
        if path == "/metrics":
            with contextlib.suppress(Exception):
                await self.refresh_stats()
            text = self.exposition() if self.exposition is not None else \
                self.metrics.exposition()
            return _respond(conn, 200, text,
                            "text/plain; version=0.0.4; charset=utf-8")
        if req.headers.get("Upgrade", "").lower() != "websocket":
            page = None if self.web is None else await self.web.handle(conn, req, path)
            return page if page is not None else _respond(conn, 404, "not found\n")
        resp = self._check_upgrade(conn, req)
        if resp is None and self.admit_connection is not None and \
                not await self.admit_connection(conn, peer_ip(conn)):
            self._refuse("too_many_connections")
            logger.info("refused %s: connection limit (daemon-wide)", peer_ip(conn))
            return _respond(conn, 503, "too many connections\n", extra={"Retry-After": "1"})
        return resp

    def _refuse(self, reason: str) -> None:
        self.metrics.conn_refused.labels(reason).inc()

    def _check_upgrade(self, conn: ServerConnection, req: Request) -> Response | None:
        cfg = self.config
        if cfg.auth_token is not None:
            auth = req.headers.get("Authorization", "")
            scheme, _, tok = auth.partition(" ")
            if (scheme.lower() != "bearer" or not hmac.compare_digest(
                    tok.strip().encode(), cfg.auth_token.encode())) and not (
                    self.web is not None and self.web.authorize(req)):
                self._refuse("unauthorized")
                self.session_metrics.errors["unauthorized"] += 1
                logger.info("refused %s: unauthorized", peer_ip(conn))
                return _respond(conn, 401, "unauthorized\n",
                                extra={"WWW-Authenticate": 'Bearer realm="codecd"'})
        origin = req.headers.get("Origin")
        if origin is not None and cfg.allowed_origins and "*" not in cfg.allowed_origins \
                and origin not in cfg.allowed_origins:
            self._refuse("bad_origin")
            self.session_metrics.errors["bad_origin"] += 1
            logger.info("refused %s: origin %r not allowed", peer_ip(conn), origin)
            return _respond(conn, 403, "origin not allowed\n")
        if not self.accepting():
            self._refuse("not_ready")
            return _respond(conn, 503, "not ready\n", extra={"Retry-After": "1"})
        ip = peer_ip(conn)
        total, of_ip = self.connections(ip)
        if total >= cfg.max_connections or of_ip >= cfg.max_connections_per_ip:
            self._refuse("too_many_connections")
            logger.info("refused %s: connection limit", ip)
            return _respond(conn, 503, "too many connections\n", extra={"Retry-After": "1"})
        if cfg.sndbuf_bytes:
            sock = conn.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.sndbuf_bytes)
        return None
