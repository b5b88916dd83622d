"""The browser page served by codecd, and browser-usable authentication.

Routes (plain ``GET``s on the daemon's port; websockets' HTTP parser takes no other method):

* ``/`` and ``/static/<file>``: the page (``static/index.html``, an ES module ``app.js``, the
  AudioWorklet ``player-worklet.js``, ``style.css``); no build step, no framework, no CDN.
* ``/demo/tokens.json``: the built-in demo sequence (``codecd.demo.demo_ids``).
* ``/auth/ticket``: with ``Authorization: Bearer <token>``, a single-use websocket ticket
  (``codecd.web.tickets``); ``{"auth": false}`` when no token is configured.

On the upgrade, :meth:`WebRoutes.authorize` accepts a ticket or the bearer token offered in
``Sec-WebSocket-Protocol`` (``codecd.ticket.<t>``, ``codecd.bearer.<token>``), and
:meth:`WebRoutes.select_subprotocol` selects ``codecd.v1`` so that the browser, which offered
subprotocols, gets one back (and never the credential). docs/protocol.md, "Browsers".
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from ..config import Config
from ..responses import bearer_ok, header, respond
from .tickets import SUBPROTOCOL, TicketBook, offered_credentials

__all__ = ["WebRoutes", "STATIC_DIR", "TicketBook"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".json": "application/json",
          ".png": "image/png", ".svg": "image/svg+xml"}
#: the page loads nothing from elsewhere; it talks to this server only
_CSP = ("default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
        "style-src 'self'; script-src 'self'; worker-src 'self'; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'")


def _respond(conn: ServerConnection, status: int, body: str, content_type: str,
             extra: dict[str, str] | None = None) -> Response:
    return respond(conn, status, body, content_type,
                   {"X-Content-Type-Options": "nosniff", **(extra or {})})


def _same_origin(origin: str, host: str | None) -> bool:
    u = urlsplit(origin)
    return bool(host) and u.scheme in ("http", "https") and u.netloc == host


@dataclass
class WebRoutes:
    """The page's routes and the browser credentials of the websocket upgrade."""

    config: Config
    tickets: TicketBook = field(default_factory=TicketBook)
    static_dir: Path = STATIC_DIR
    _files: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a fixed table built once: a request path never reaches the filesystem
        self._files = {f"/static/{p.name}": p for p in sorted(self.static_dir.iterdir())
                       if p.is_file() and p.suffix in _TYPES}
        self._files["/"] = self.static_dir / "index.html"

    async def handle(self, conn: ServerConnection, req: Request, path: str) -> Response | None:
        """The response to a plain GET of the page's routes; None for any other path."""
        if path in self._files:
            return self._static(conn, path)
        if path == "/demo/tokens.json":
            from ..demo import demo_ids

            return _respond(conn, 200, json.dumps({"layout": "orpheus_ids",
                                                   "tokens": demo_ids().tolist()}),
                            "application/json", {"Cache-Control": "no-cache"})
        if path == "/auth/ticket":
            return self._ticket(conn, req)
        return None

    def _static(self, conn: ServerConnection, path: str) -> Response:
        f = self._files[path]
        try:
            body = f.read_text(encoding="utf-8")
        except OSError as e:
            logger.warning("page file %s unreadable: %s", f, e)
            return _respond(conn, 404, "not found\n", "text/plain; charset=utf-8")
        return _respond(conn, 200, body, _TYPES[f.suffix],
                        {"Cache-Control": "no-cache", "Content-Security-Policy": _CSP,
                         "Referrer-Policy": "no-referrer"})

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """An Origin a browser page may call from: none (not a browser), the page's own
        (same scheme-less host:port as the request), or one in ``allowed_origins``."""
        if origin is None:
            return True
        allowed = self.config.allowed_origins
        return _same_origin(origin, host) or "*" in allowed or origin in allowed

    def _ticket(self, conn: ServerConnection, req: Request) -> Response:
        nocache = {"Cache-Control": "no-store"}
        token = self.config.auth_token
        if token is None:
            return _respond(conn, 200, json.dumps({"auth": False}), "application/json", nocache)
        origin = header(req, "Origin")
        if not self.origin_allowed(origin, req.headers.get("Host")):
            logger.info("ticket refused: origin %r not allowed", origin)
            return _respond(conn, 403, json.dumps({"error": "origin not allowed"}),
                            "application/json", nocache)
        if not bearer_ok(header(req, "Authorization"), token):
            logger.info("ticket refused: unauthorized")
            return _respond(conn, 401, json.dumps({"error": "unauthorized"}), "application/json",
                            {**nocache, "WWW-Authenticate": 'Bearer realm="codecd"'})
        t = self.tickets.issue(origin)
        return _respond(conn, 200, json.dumps({"auth": True, "ticket": t,
                                               "expires_in": self.tickets.ttl_s,
                                               "subprotocols": [SUBPROTOCOL, f"codecd.ticket.{t}"]}),
                        "application/json", nocache)

    def authorize(self, req: Request) -> bool:
        """An upgrade's credentials offered in ``Sec-WebSocket-Protocol``: a live ticket from
        this Origin (used up here), or the bearer token itself."""
        token = self.config.auth_token
        if token is None:
            return True
        tickets, tokens = offered_credentials(req.headers.get_all("Sec-WebSocket-Protocol"))
        origin = req.headers.get("Origin")
        own = origin is None or _same_origin(origin, req.headers.get("Host"))
        if any(self.tickets.redeem(t, origin, unbound_ok=own) for t in tickets[:1]):
            return True
        return any(hmac.compare_digest(t.encode(), token.encode()) for t in tokens[:1])

    def select_subprotocol(self, conn: ServerConnection,
                           offered: Sequence[str]) -> str | None:
        """``codecd.v1`` when offered (a browser that offered subprotocols needs one back);
        otherwise none, whatever else was offered (credentials are never selected)."""
        return SUBPROTOCOL if SUBPROTOCOL in offered else None
