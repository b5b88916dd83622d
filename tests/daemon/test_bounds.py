"""Bounds that a client reaches (issue 18, docs/bounds.md): a real server on 127.0.0.1, the
small model. Each test sends exactly the input that fills one container, checks the
documented answer, and that the server carries on.

* ``MAX_PENDING_MARKS``: unanswered ``mark`` messages of one stream;
* ``SessionLimits.max_closed_ids``: stream ids a connection remembers as closed;
* ``max_connections``: open websocket connections of one (single-process) server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip, load_layouts
from smallmodel import small_codes, write_small_snac

pytest.importorskip("gguf")
pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from codecd.protocol import encode_token_frame  # noqa: E402
from codecd.session import MAX_PENDING_MARKS, SessionLimits  # noqa: E402
from serverkit import Client, running, send_stream, start_msg  # noqa: E402

L = load_layouts()


@pytest.fixture(scope="module")
def codecrt() -> Any:
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, codecrt: Any) -> Path:
    return write_small_snac(tmp_path_factory.mktemp("bounds") / "small.gguf", seed=5)


async def until(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_pending_marks_are_bounded(small: Path) -> None:
    """A stream holds at most MAX_PENDING_MARKS unanswered marks: the one after them fails
    that stream with bad_message (protocol.md, Marks), its pending marks are dropped, never
    answered; the connection stays open and a new stream on it gets its marks and done."""
    async def main() -> None:
        rng = np.random.default_rng(31)
        async with running(small) as srv:
            c = await Client.open(srv.port)
            await c.send(start_msg("a"))
            # one 7-token group: 16 samples, inside the decoder's look-ahead (135 samples),
            # so no audio comes before end and every mark after it stays pending
            ids = L.codes_to_orpheus_ids(L.levels_to_orpheus(small_codes(4, rng)))
            await c.send(encode_token_frame("a", ids))
            for i in range(MAX_PENDING_MARKS):
                await c.send({"type": "mark", "stream_id": "a", "id": i})
            sess = next(iter(srv._conns.values())).session
            await until(lambda: "a" in sess._streams
                        and len(sess._streams["a"].marks) == MAX_PENDING_MARKS)
            await c.send({"type": "mark", "stream_id": "a", "id": "one-too-many"})
            e = await c.terminal("a")
            assert (e["type"], e["code"]) == ("error", "bad_message"), e
            assert str(MAX_PENDING_MARKS) in e["message"]
            assert not any(m["type"] == "mark" for m in c.rec("a")["msgs"])
            assert "a" not in sess.open_streams
            # the connection carries on: a new stream's mark is answered, then done
            await c.send(start_msg("b"))
            await send_stream(c, "b", small_codes(40, rng), "orpheus_ids", rng, end=False)
            await c.send({"type": "mark", "stream_id": "b", "id": "m"})
            await c.send({"type": "end", "stream_id": "b"})
            assert (await c.terminal("b"))["type"] == "done"
            marks = [m for m in c.rec("b")["msgs"] if m["type"] == "mark"]
            assert [(m["id"], m["sample_offset"]) for m in marks] == [("m", 40 * 4)]
            assert not c.conn_errors and c.ws.close_code is None
            await c.close()
            await until(lambda: srv.active_streams == 0)
    asyncio.run(main())


def test_remembered_closed_ids_are_bounded(small: Path) -> None:
    """Every refused or ended stream id is remembered (its late messages are dropped
    silently), at most max_closed_ids of them: one more forgets the oldest, whose next
    message is answered with unknown_stream again; a remembered one stays silent. The
    connection stays open throughout."""
    limit = SessionLimits().max_closed_ids

    async def main() -> None:
        async with running(small) as srv:
            ws = await connect(f"ws://127.0.0.1:{srv.port}/", compression=None, max_size=None)
            assert json.loads(await ws.recv())["type"] == "hello"
            errors: list[dict[str, Any]] = []

            async def read() -> None:  # every answer here is an error (no audio, no close)
                with contextlib.suppress(ConnectionClosed):
                    async for m in ws:
                        errors.append(json.loads(m))

            reader = asyncio.create_task(read())
            tokens = {"type": "tokens", "tokens": [128266]}
            for i in range(limit + 1):  # one more than the connection remembers
                await ws.send(json.dumps({**tokens, "stream_id": f"u{i}"}))
            await until(lambda: len(errors) == limit + 1)
            assert all((e["type"], e["code"]) == ("error", "unknown_stream") for e in errors)
            assert [e["stream_id"] for e in errors] == [f"u{i}" for i in range(limit + 1)]
            sess = next(iter(srv._conns.values())).session
            assert len(sess._closed_ids) == limit
            dropped = srv.metrics.messages_dropped
            await ws.send(json.dumps({**tokens, "stream_id": f"u{limit}"}))  # remembered
            await ws.send(json.dumps({**tokens, "stream_id": "u0"}))  # forgotten
            await until(lambda: len(errors) == limit + 2)
            # answers come in order: the one answer is u0's, u{limit}'s message was dropped
            assert (errors[-1]["code"], errors[-1]["stream_id"]) == ("unknown_stream", "u0")
            assert srv.metrics.messages_dropped == dropped + 1
            assert len(sess._closed_ids) == limit
            assert ws.close_code is None and not reader.done()
            await ws.close()
            await reader
    asyncio.run(main())


def test_server_wide_connection_limit(small: Path) -> None:
    """max_connections of one server process: the (max+1)-th upgrade gets 503 and is not
    counted; a connection that closes frees its place; no per-peer entry is left."""
    async def main() -> None:
        async with running(small, max_connections=2) as srv:
            a = await Client.open(srv.port)
            b = await Client.open(srv.port)
            with pytest.raises(InvalidStatus) as ei:
                await connect(f"ws://127.0.0.1:{srv.port}/", open_timeout=5)
            assert ei.value.response.status_code == 503
            assert srv.n_connections == 2
            await a.close()
            await until(lambda: srv.n_connections == 1)
            c = await Client.open(srv.port)  # the freed place is taken again
            await c.send(start_msg("s"))
            await c.until(lambda: any(m["type"] == "started" for m in c.rec("s")["msgs"]))
            await b.close()
            await c.close()
            await until(lambda: srv.n_connections == 0)
            assert not srv._per_ip and not srv._conns
            await until(lambda: srv.active_streams == 0)
    asyncio.run(main())
