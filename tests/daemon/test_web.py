"""codecd.web: the page's routes and browser-usable authentication (tickets, credentials in
the subprotocol offer, origins), over real sockets on 127.0.0.1 with the small model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import codecrt_or_skip
from smallmodel import write_small_snac

pytest.importorskip("websockets")

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402

from codecd.config import Config, ModelSource  # noqa: E402
from codecd.demo import demo_ids  # noqa: E402
from codecd.server import Server  # noqa: E402
from codecd.web.tickets import TicketBook, offered_credentials  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    codecrt_or_skip()
    return write_small_snac(tmp_path_factory.mktemp("web") / "small.gguf", seed=5)


@contextlib.asynccontextmanager
async def running(small: Path, **kw: Any) -> AsyncIterator[Server]:
    cfg = Config(listen="127.0.0.1:0", models=[ModelSource("small", str(small))],
                 devices=["cpu"], threads=1, **kw)
    srv = Server(cfg, {"small": str(small)}, engine_overrides={"warm_buckets": (1,)})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


async def get(port: int, path: str, headers: dict[str, str] | None = None
              ) -> tuple[int, dict[str, str], str]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    hs = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    w.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{hs}\r\n"
            .encode())
    data = await r.read()
    w.close()
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    lines = head.split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def test_ticket_book_single_use_expiry_and_origin() -> None:
    """A ticket is redeemed once, only from its origin, only before it expires; the book is bounded."""
    now = [0.0]
    book = TicketBook(ttl_s=30.0, max_outstanding=3, clock=lambda: now[0])
    a = book.issue("http://h:1")
    assert book.redeem(a, "http://h:1") and not book.redeem(a, "http://h:1")
    b = book.issue("http://h:1")
    assert not book.redeem(b, "http://evil") and not book.redeem(b, "http://h:1")  # burnt
    d = book.issue(None)  # a same-origin fetch sends no Origin: good from the page's own only
    assert not book.redeem(d, "http://evil") and not book.redeem(d, "http://h:1")
    d = book.issue(None)
    assert book.redeem(d, "http://h:1", unbound_ok=True)
    c = book.issue(None)
    now[0] = 30.0
    assert not book.redeem(c, None) and book.outstanding == 0
    ts = [book.issue(None) for _ in range(5)]
    assert book.outstanding == 3 and not book.redeem(ts[0], None) and book.redeem(ts[4], None)
    assert len(set(ts)) == 5 and all(len(t) >= 40 for t in ts)
    assert offered_credentials(["codecd.v1, codecd.ticket.abc", "codecd.bearer.x-y"]) == \
        (["abc"], ["x-y"])


def test_page_routes(small: Path) -> None:
    """GET / serves the page with a strict CSP; its static files, the demo tokens; nothing outside the table."""
    async def main() -> None:
        async with running(small) as srv:
            st, h, body = await get(srv.port, "/")
            assert st == 200 and h["content-type"].startswith("text/html")
            assert "script-src 'self'" in h["content-security-policy"]
            assert '<script type="module" src="/static/app.js">' in body
            for name, ctype in (("app.js", "text/javascript"), ("player-worklet.js",
                                                                "text/javascript"),
                                ("style.css", "text/css")):
                st, h, body = await get(srv.port, f"/static/{name}")
                assert st == 200 and h["content-type"].startswith(ctype) and body
            for bad in ("/static/../__init__.py", "/static/%2e%2e/__init__.py", "/static/",
                        "/static/nope.js", "/index.html"):
                assert (await get(srv.port, bad))[0] == 404, bad
            st, h, body = await get(srv.port, "/demo/tokens.json")
            d = json.loads(body)
            assert st == 200 and d["layout"] == "orpheus_ids" and d["tokens"] == demo_ids().tolist()
            st, h, body = await get(srv.port, "/auth/ticket")
            assert st == 200 and json.loads(body) == {"auth": False}
            assert (await get(srv.port, "/healthz"))[0] == 200  # the daemon's own routes stay
    asyncio.run(main())


def test_browser_auth_ticket_bearer_offer_and_origin(small: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A token-protected server: tickets for the token, single-use and origin-bound; the token in the offer; no secret in the log."""
    token = "s3cret-Token_1"

    async def main() -> list[str]:
        async with running(small, auth_token=token) as srv:
            port = srv.port
            me = f"http://127.0.0.1:{port}"
            url = f"ws://127.0.0.1:{port}/"
            bearer = {"Authorization": f"Bearer {token}"}
            assert (await get(port, "/auth/ticket"))[0] == 401
            assert (await get(port, "/auth/ticket", {"Authorization": "Bearer no"}))[0] == 401
            st, _, _ = await get(port, "/auth/ticket", {**bearer, "Origin": "http://evil.example"})
            assert st == 403
            st, h, body = await get(port, "/auth/ticket", {**bearer, "Origin": me})
            t = json.loads(body)
            assert st == 200 and h["cache-control"] == "no-store" and t["auth"] is True
            offer = t["subprotocols"]
            assert offer == ["codecd.v1", f"codecd.ticket.{t['ticket']}"]
            async with connect(url, subprotocols=offer, origin=me, open_timeout=5) as ws:
                assert ws.subprotocol == "codecd.v1"  # the credential is never echoed
                assert json.loads(await ws.recv())["type"] == "hello"
            with pytest.raises(InvalidStatus) as ei:  # single use
                await connect(url, subprotocols=offer, origin=me, open_timeout=5)
            assert ei.value.response.status_code == 401
            _, _, body = await get(port, "/auth/ticket", {**bearer, "Origin": me})
            other = json.loads(body)["subprotocols"]
            with pytest.raises(InvalidStatus) as ei:  # bound to the origin that obtained it
                await connect(url, subprotocols=other, origin="http://evil.example",
                              open_timeout=5)
            assert ei.value.response.status_code == 401
            # a same-origin fetch sends no Origin: its ticket is good from the page's origin only
            for origin, status in (("http://evil.example", 401), (me, 101)):
                _, _, body = await get(port, "/auth/ticket", bearer)
                offer = json.loads(body)["subprotocols"]
                if status == 101:
                    async with connect(url, subprotocols=offer, origin=origin, open_timeout=5):
                        pass
                else:
                    with pytest.raises(InvalidStatus) as ei:
                        await connect(url, subprotocols=offer, origin=origin, open_timeout=5)
                    assert ei.value.response.status_code == status
            async with connect(url, subprotocols=["codecd.v1", f"codecd.bearer.{token}"],
                               open_timeout=5) as ws:
                assert json.loads(await ws.recv())["type"] == "hello"
            with pytest.raises(InvalidStatus) as ei:
                await connect(url, subprotocols=["codecd.v1", "codecd.bearer.wrong"],
                              open_timeout=5)
            assert ei.value.response.status_code == 401
            async with connect(url, additional_headers=bearer, open_timeout=5) as ws:
                assert ws.subprotocol is None  # non-browser clients: unchanged
                assert json.loads(await ws.recv())["type"] == "hello"
            return [t["ticket"], other[1]]

    ws_logger = logging.getLogger("websockets")
    saved = ws_logger.level
    # as codecd.logs.setup_logging runs the daemon: its own loggers at any level, websockets'
    # (which dumps every header at DEBUG, a bearer token's too) at WARNING at least
    ws_logger.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.DEBUG):
            secrets = asyncio.run(main())
    finally:
        ws_logger.setLevel(saved)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ticket refused: unauthorized" in text and "refused 127.0.0.1: unauthorized" in text
    assert token not in text and not any(s in text for s in secrets)
