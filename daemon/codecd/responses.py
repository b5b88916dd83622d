"""HTTP responses and request headers, as every route of the websocket port reads and
writes them (``codecd.http``'s routes, the page's ``codecd.web``): each header once in a
response, a header the server reads at most once in a request, bearer tokens compared in
constant time."""

from __future__ import annotations

import dataclasses
import hmac

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

__all__ = ["METHODS", "SINGLE_HEADERS", "BadRequest", "header", "bearer_ok", "respond"]


#: the methods every route answers (HEAD: the same headers, no body)
METHODS = ("GET", "HEAD")
#: request headers the server reads, which must therefore come at most once
SINGLE_HEADERS = ("Upgrade", "Authorization", "Origin")


class BadRequest(Exception):
    """A request the server cannot read unambiguously (answered 400)."""


def header(req: Request, name: str) -> str | None:
    """The value of a header that must come at most once; BadRequest when it is repeated."""
    values = req.headers.get_all(name)
    if len(values) > 1:
        raise BadRequest(f"{name} header sent {len(values)} times")
    return values[0] if values else None


def bearer_ok(auth: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` with this token (constant-time comparison)."""
    scheme, _, tok = (auth or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(tok.strip().encode(),
                                                              token.encode())


def respond(conn: ServerConnection, status: int, body: str,
            content_type: str = "text/plain; charset=utf-8",
            extra: dict[str, str] | None = None, head: bool = False) -> Response:
    """A complete response with each header once (``extra`` ones added or replaced)."""
    r = conn.respond(status, body)
    # respond() already sets Content-Type: replace it (a Headers item assignment appends)
    for k, v in {"Content-Type": content_type, **(extra or {})}.items():
        if k in r.headers:
            del r.headers[k]
        r.headers[k] = v
    if head:  # the GET response's headers (Content-Length included), without its body
        r = dataclasses.replace(r, body=b"")
    return r
