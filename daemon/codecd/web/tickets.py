"""Short-lived single-use websocket tickets, sans-I/O (no sockets, no asyncio).

A browser cannot put an ``Authorization`` header on a websocket upgrade. The page
asks ``GET /auth/ticket`` with the bearer token in that header (``fetch`` can set
it); codecd answers with a ticket, and the page offers it in the upgrade's
``Sec-WebSocket-Protocol`` list as ``codecd.ticket.<ticket>``, next to
``codecd.v1`` (the one the server selects, so the ticket is never echoed). A
ticket is 32 random bytes (base64url: only RFC 7230 token characters), lives
``ttl_s`` seconds, is redeemed at most once, and only by an upgrade carrying
the same ``Origin`` as the request that obtained it (a same-origin ``fetch`` sends no
``Origin``: such a ticket is only good on an upgrade from the server's own origin, or
from a client that sends none). Nothing secret goes into
a URL, so none lands in an access log.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["TicketBook", "SUBPROTOCOL", "TICKET_PREFIX", "BEARER_PREFIX", "offered_credentials"]

#: the subprotocol codecd selects when a client offers it
SUBPROTOCOL = "codecd.v1"
#: ``codecd.ticket.<ticket>`` in the offer: a ticket from ``GET /auth/ticket``
TICKET_PREFIX = "codecd.ticket."
#: ``codecd.bearer.<token>`` in the offer: the bearer token itself (token characters only)
BEARER_PREFIX = "codecd.bearer."


def offered_credentials(header_values: list[str]) -> tuple[list[str], list[str]]:
    """(tickets, bearer tokens) offered in ``Sec-WebSocket-Protocol`` header values."""
    tickets: list[str] = []
    tokens: list[str] = []
    for v in header_values:
        for item in v.split(","):
            p = item.strip()
            if p.startswith(TICKET_PREFIX):
                tickets.append(p[len(TICKET_PREFIX):])
            elif p.startswith(BEARER_PREFIX):
                tokens.append(p[len(BEARER_PREFIX):])
    return tickets, tokens


@dataclass
class TicketBook:
    """Outstanding tickets: ``issue`` one, ``redeem`` it once before it expires."""

    ttl_s: float = 30.0
    #: most tickets outstanding; issuing one more forgets the oldest
    max_outstanding: int = 1024
    clock: Callable[[], float] = time.monotonic
    _live: OrderedDict[str, tuple[float, str | None]] = field(default_factory=OrderedDict)
    issued: int = 0
    redeemed: int = 0
    refused: int = 0

    def issue(self, origin: str | None) -> str:
        """A new ticket, bound to ``origin`` (the ``Origin`` of the request; None: none sent)."""
        self._expire()
        while len(self._live) >= self.max_outstanding:
            self._live.popitem(last=False)
        t = secrets.token_urlsafe(32)
        self._live[t] = (self.clock() + self.ttl_s, origin)
        self.issued += 1
        return t

    def redeem(self, ticket: str, origin: str | None, *, unbound_ok: bool = False) -> bool:
        """True once for a live ticket offered from the origin that obtained it. A ticket
        obtained without an ``Origin`` (browsers send none on a same-origin GET) is bound to
        none: it is accepted when ``unbound_ok`` (the caller's judgement that ``origin`` is
        the server's own, or absent)."""
        self._expire()
        entry = self._live.pop(ticket, None)  # single use, even when the origin is wrong
        if entry is None:
            self.refused += 1
            return False
        _, bound = entry
        if bound != origin and not (bound is None and unbound_ok):
            self.refused += 1
            return False
        self.redeemed += 1
        return True

    def take(self, ticket: str) -> str | None | bool:
        """Remove a live ticket without redeeming it; its origin binding (None: unbound), or
        False when it is not live. (``codecd serve --fronts``: a front hands the tickets it
        issues to the main process, which redeems them for whichever front an upgrade
        reaches.)"""
        self._expire()
        entry = self._live.pop(ticket, None)
        return False if entry is None else entry[1]

    def adopt(self, ticket: str, origin: str | None) -> None:
        """Hold a ticket issued elsewhere (main's book, or a front's copy of one main has
        just redeemed), bound to ``origin``, for ``ttl_s``."""
        self._expire()
        while len(self._live) >= self.max_outstanding:
            self._live.popitem(last=False)
        self._live[ticket] = (self.clock() + self.ttl_s, origin)

    @property
    def outstanding(self) -> int:
        self._expire()
        return len(self._live)

    def _expire(self) -> None:
        now = self.clock()
        while self._live:
            k, (exp, _) = next(iter(self._live.items()))
            if exp > now:
                break
            del self._live[k]
