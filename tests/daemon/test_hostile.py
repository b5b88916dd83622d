"""Hostile clients against a real server on 127.0.0.1 (issue 18): slow readers, bad
handshakes, huge numbers, wrong frames. Every bad input gets its documented answer with
the server up; other streams are unaffected."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import load_layouts
from smallmodel import small_codes

pytest.importorskip("gguf")
pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")

from websockets.asyncio.client import connect  # noqa: E402

from codecd.protocol import encode_token_frame, parse_audio  # noqa: E402
from serverkit import SR, Client, assert_same_audio, expected, running, send_stream, start_msg  # noqa: E402

LAYOUTS = load_layouts()


# -------------------------------------------------------------- output budget


async def slow_reader(port: int, sid: str, toks: np.ndarray, speed: float
                      ) -> tuple[Any, bytearray, dict[str, Any]]:
    """A client that sends a whole stream at once, then reads its audio at ``speed`` x real
    time (a small receive buffer, one frame at a time). Returns the socket, audio, terminal."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    ws = await connect(f"ws://127.0.0.1:{port}/", sock=s, max_queue=1, compression=None,
                       max_size=None)
    await ws.recv()  # hello
    await ws.send(json.dumps(start_msg(sid)))
    for i in range(0, len(toks), 2800):
        await ws.send(encode_token_frame(sid, toks[i:i + 2800]))
    await ws.send(json.dumps({"type": "end", "stream_id": sid}))
    audio = bytearray()
    while True:
        m = await ws.recv()
        if isinstance(m, bytes):
            f = parse_audio(m)
            audio += f.data
            await asyncio.sleep(len(f.data) / 2 / SR / speed)
            continue
        d = json.loads(m)
        if d["type"] in ("done", "error"):
            return ws, audio, d


@pytest.mark.parametrize("budget, speed", [(0.5, 0.5), (0.0, 0.25)])
def test_slow_steady_reader_is_held_to_the_output_budget(small: Path, offline: Any,
                                                         budget: float, speed: float) -> None:
    """A client reading at half real time: with an output budget the audio queued for it
    stays within the budget and it gets all its audio, exact; another connection's stream
    finishes at full speed. Without one (control), the queue grows to most of the stream.

    The control reads at a quarter of real time: its queue peaks near 2.0 s x (1 - 0.25 / r)
    for a server decoding at r x real time, and a loaded CI box once decoded near r = 1
    (peak 0.91 s at half speed); at a quarter it stays past 1.0 s down to r = 0.5."""
    async def main() -> None:
        rng = np.random.default_rng(18)
        async with running(small, output_budget_s=budget, max_ahead_s=0.0, sndbuf_bytes=4096,
                           send_timeout_s=3.0, max_queued_frames=1 << 16) as srv:
            levels = small_codes(12000, rng)  # 2.0 s
            toks = LAYOUTS.codes_to_orpheus_ids(LAYOUTS.levels_to_orpheus(levels))
            peak = [0.0]
            stop = asyncio.Event()

            async def watch() -> None:  # the server's own count of the queued audio
                while not stop.is_set():
                    for conn in list(srv._conns.values()):
                        peak[0] = max(peak[0], conn.session.budget.queued_s)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            t0 = time.monotonic()
            slow = asyncio.create_task(slow_reader(srv.port, "slow", toks, speed=speed))
            await asyncio.sleep(0.3)
            other = await Client.open(srv.port)
            olevels = small_codes(1200, rng)
            await other.send(start_msg("o"))
            await send_stream(other, "o", olevels, "orpheus_ids", rng)
            assert (await other.terminal("o", 5))["type"] == "done"
            t_other = time.monotonic() - t0
            assert not slow.done()
            assert_same_audio(bytes(other.rec("o")["audio"]),
                              expected(offline, olevels, "pcm_s16le", SR), "pcm_s16le")
            ws, audio, term = await asyncio.wait_for(slow, 20)
            elapsed = time.monotonic() - t0
            stop.set()
            await watcher
            assert term["type"] == "done", term
            assert_same_audio(bytes(audio), expected(offline, levels, "pcm_s16le", SR),
                              "pcm_s16le")
            if budget:
                # budget + the small model's decoder hold (well under 0.1 s)
                assert peak[0] <= budget + 0.1, peak[0]
                assert t_other < elapsed / 2, (t_other, elapsed)  # the other ran at full speed
            else:
                # past the budgeted run's bound (0.6 s) with room
                assert peak[0] > 1.0, peak[0]
            assert elapsed > 2.0 / speed - 1.0, elapsed  # it did read at that speed
            await ws.close()
            await other.close()
    asyncio.run(main())


def test_budget_back_pressure_keeps_streams_and_slots(small: Path, offline: Any) -> None:
    """Four streams on one connection share a budget smaller than their decoders' start-up:
    none stalls or fails, each gets its exact audio, the stream count returns to zero."""
    async def main() -> None:
        rng = np.random.default_rng(19)
        async with running(small, output_budget_s=0.3, max_ahead_s=0.0, sndbuf_bytes=4096,
                           send_timeout_s=3.0, max_queued_frames=1 << 16) as srv:
            c = await Client.open(srv.port, max_queue=1)
            streams = {f"s{i}": small_codes(3000, rng) for i in range(4)}  # 0.5 s each
            for sid, lv in streams.items():
                await c.send(start_msg(sid))
                await send_stream(c, sid, lv, "orpheus_ids", rng)
            peak = 0.0
            deadline = time.monotonic() + 15
            while not all(c.rec(s)["terminal"] for s in streams):
                assert time.monotonic() < deadline, "streams did not finish"
                for conn in list(srv._conns.values()):
                    peak = max(peak, conn.session.budget.queued_s)
                await asyncio.sleep(0.005)
            for sid, lv in streams.items():
                assert c.rec(sid)["terminal"]["type"] == "done"
                assert_same_audio(bytes(c.rec(sid)["audio"]),
                                  expected(offline, lv, "pcm_s16le", SR), "pcm_s16le")
            assert peak <= 0.3 + 4 * 0.1, peak
            await c.close()
            for _ in range(100):
                if srv.active_streams == 0:
                    break
                await asyncio.sleep(0.02)
            assert srv.active_streams == 0
    asyncio.run(main())


# -------------------------------------------------------------- HTTP and handshake


async def raw_http(port: int, request: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Send raw bytes, read the whole reply: status, headers (in order, repeats kept), body."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request)
    await w.drain()
    data = await asyncio.wait_for(r.read(), 5)
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in
               (ln.partition(":") for ln in lines[1:])]
    return int(lines[0].split()[1]), headers, body


def upgrade_request(*extra: str, method: str = "GET", path: str = "/") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version: 13", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_duplicate_handshake_headers_get_400_without_traceback(
        small: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A repeated Authorization, Upgrade or Origin header is a clean 400 (no 500, no ERROR
    log); the websocket's own repeated headers are refused too; a good upgrade still works."""
    async def main() -> None:
        async with running(small, auth_token="s3cret",
                           allowed_origins=["https://ok.example"]) as srv:
            ok = "Authorization: Bearer s3cret"
            for extra in ((ok, ok), (ok, "Authorization: Bearer nope"),
                          (ok, "Upgrade: websocket"),
                          (ok, "Origin: https://ok.example", "Origin: https://ok.example"),
                          ("Authorization: Bearer nope", "Authorization: Bearer nope")):
                status, headers, body = await raw_http(srv.port, upgrade_request(*extra))
                assert status == 400, (extra, status, body)
                assert b"sent 2 times" in body
            for extra in ((ok, "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="),
                          (ok, "Sec-WebSocket-Version: 13")):
                status, _, body = await raw_http(srv.port, upgrade_request(*extra))
                assert status == 400, (extra, status, body)
            c = await Client.open(srv.port, additional_headers={"Authorization": "Bearer s3cret"})
            await c.close()
    with caplog.at_level("INFO"):
        asyncio.run(main())
    bad = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def test_every_response_has_one_content_type_and_other_methods_get_405(small: Path) -> None:
    """Every route's response carries Content-Type once; DELETE/POST/BREW get 405 with
    Allow on every path; HEAD gets the headers without a body."""
    async def main() -> None:
        async with running(small) as srv:
            for path in ("/healthz", "/readyz", "/metrics", "/nope"):
                status, headers, body = await raw_http(
                    srv.port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                names = [k for k, _ in headers]
                assert names.count("content-type") == 1, (path, headers)
                assert len(names) == len(set(names)), (path, headers)
                assert status == (404 if path == "/nope" else 200)
                for method in ("DELETE", "POST", "BREW"):
                    status, headers, _ = await raw_http(
                        srv.port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    assert status == 405, (method, path)
                    assert ("allow", "GET, HEAD") in headers
                status, headers, body = await raw_http(
                    srv.port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert status == (404 if path == "/nope" else 200) and body == b"", path
            status, headers, _ = await raw_http(srv.port, upgrade_request(method="POST"))
            assert status == 405
    asyncio.run(main())


# -------------------------------------------------------------- token messages


def test_huge_integers_fail_only_their_stream_with_the_value_sent(small: Path,
                                                                  offline: Any) -> None:
    """A token of thousands of digits (beyond Python's int-string limit) or just beyond
    int64 gets token_range for its stream with the value as sent (a decimal string); the
    connection and a concurrent stream carry on, exact."""
    async def main() -> None:
        rng = np.random.default_rng(20)
        async with running(small) as srv:
            c = await Client.open(srv.port)
            levels = small_codes(400, rng)
            await c.send(start_msg("ok"))
            huge = "9" * 5000
            cases = {"h": ("orpheus_ids", f'"tokens":[128266,{huge}]', 1, huge),
                     "n": ("orpheus", f'"tokens":[1,2,3,-{huge}]', 3, "-" + huge),
                     "i": ("orpheus", '"tokens":[1,9223372036854775808]', 1,
                           "9223372036854775808"),
                     "l": ("levels", '"levels":[[1],[2,3],[4,-99999999999999999999]]', 1,
                           "-99999999999999999999")}
            for sid, (layout, body, _, _) in cases.items():
                await c.send(start_msg(sid, layout))
                await c.send('{"type":"tokens","stream_id":"%s",%s}' % (sid, body))
            await c.send(start_msg("bare", "orpheus"))  # a bare array: the only open stream
            await send_stream(c, "ok", levels, "orpheus_ids", rng)
            for sid, (layout, _, index, value) in cases.items():
                e = await c.terminal(sid)
                assert e["code"] == "token_range", e
                assert e["index"] == index and e["value"] == value, (sid, e)
                assert len(e["message"]) < 300
                if layout == "levels":
                    assert e["level"] == 2
            assert (await c.terminal("ok"))["type"] == "done"
            assert_same_audio(bytes(c.rec("ok")["audio"]),
                              expected(offline, levels, "pcm_s16le", SR), "pcm_s16le")
            await c.send("[5, %s]" % huge)  # bare array: goes to the only open stream
            e = await c.terminal("bare")
            assert e["code"] == "token_range" and e["value"] == huge and e["index"] == 1, e
            assert not c.conn_errors and c.ws.close_code is None
            await c.close()
    asyncio.run(main())


def test_binary_frame_for_a_missing_level_is_bad_binary(small: Path) -> None:
    """A binary token frame for a level the model lacks, or a level byte that does not fit
    the stream's layout, fails that stream with bad_binary (as protocol.md says)."""
    async def main() -> None:
        async with running(small) as srv:
            c = await Client.open(srv.port)
            await c.send(start_msg("lv", "levels"))
            await c.send(encode_token_frame("lv", [1, 2], level=7))
            await c.send(start_msg("seq", "levels"))
            await c.send(encode_token_frame("seq", [1, 2]))  # 0xFF on a levels stream
            await c.send(start_msg("orp", "orpheus"))
            await c.send(encode_token_frame("orp", [1, 2], level=0))
            await c.send(start_msg("js", "levels"))
            await c.send({"type": "tokens", "stream_id": "js", "levels": [[1], [1], [1], [1]]})
            for sid in ("lv", "seq", "orp"):
                assert (await c.terminal(sid))["code"] == "bad_binary", sid
            assert (await c.terminal("js"))["code"] == "bad_message"
            assert c.ws.close_code is None
            await c.close()
    asyncio.run(main())


@pytest.mark.parametrize("access,auth,metrics_token,want", [
    ("auto", None, None, {None: 200}),
    ("auto", "s3cret", None, {None: 401, "nope": 401, "s3cret": 200}),
    ("auto", "s3cret", "m3trics", {None: 401, "s3cret": 401, "m3trics": 200}),
    ("token", None, "m3trics", {None: 401, "m3trics": 200}),
    ("loopback", "s3cret", None, {None: 200}),
    ("open", "s3cret", None, {None: 200}),
])
def test_metrics_access(small: Path, access: str, auth: str | None, metrics_token: str | None,
                        want: dict[str | None, int]) -> None:
    """/metrics follows metrics_access: with a bearer token configured it is no longer open
    by default; a separate metrics token, loopback only, or open when asked."""
    async def main() -> None:
        async with running(small, metrics_access=access, auth_token=auth,
                           metrics_token=metrics_token) as srv:
            for tok, status in want.items():
                hdr = f"Authorization: Bearer {tok}\r\n" if tok else ""
                got, headers, body = await raw_http(
                    srv.port, f"GET /metrics HTTP/1.1\r\nHost: x\r\n{hdr}\r\n".encode())
                assert got == status, (tok, got)
                assert (b"codecd_streams_active" in body) == (status == 200)
    asyncio.run(main())


def test_metrics_loopback_refuses_other_peers(small: Path) -> None:
    """metrics_access = loopback: a peer on a non-loopback address gets 403."""
    addrs = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
             if not a[4][0].startswith("127.")]
    if not addrs:
        pytest.skip("no non-loopback IPv4 address on this host")

    async def main() -> None:
        async with running(small, listen="0.0.0.0:0", metrics_access="loopback") as srv:
            r, w = await asyncio.open_connection(addrs[0], srv.port)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await asyncio.wait_for(r.read(), 5)
            w.close()
            assert data.split()[1] == b"403", data[:100]
            assert (await raw_http(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[0] \
                == 200
    asyncio.run(main())


def test_loopback_addresses() -> None:
    """What metrics_access = loopback admits: 127.0.0.0/8, ::1, IPv4-mapped loopback."""
    from codecd.http import _is_loopback
    for ip in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        assert _is_loopback(ip), ip
    for ip in ("10.0.0.1", "192.168.1.2", "::ffff:10.0.0.1", "2001:db8::1", "?", ""):
        assert not _is_loopback(ip), ip


# -------------------------------------------------------------- worker death


def test_worker_death_after_started_is_engine_error_never_busy(small: Path) -> None:
    """Streams told started whose worker dies get engine_error, also when their next
    tokens reach the engine while it restarts (which refuses them with busy); starts during
    the restart get busy, and the worker comes back."""
    import os
    import signal

    async def main() -> None:
        rng = np.random.default_rng(21)
        async with running(small) as srv:
            c = await Client.open(srv.port)
            ids = LAYOUTS.codes_to_orpheus_ids(LAYOUTS.levels_to_orpheus(small_codes(400, rng)))
            sids = [f"k{i}" for i in range(4)]
            for sid in sids:
                await c.send(start_msg(sid))
            await c.until(lambda: all(any(m["type"] == "started" for m in c.rec(s)["msgs"])
                                      for s in sids))
            os.kill(srv.pool.engines[0].pid, signal.SIGKILL)
            t0 = time.monotonic()
            i = 0
            # tokens race the worker's death: some reach the engine between its EOF and
            # the reaping that fails its streams, where the engine refuses them with busy
            while not all(c.rec(s)["terminal"] for s in sids) and time.monotonic() - t0 < 3:
                for sid in sids:
                    await c.send(encode_token_frame(sid, ids[i % 100 * 7:i % 100 * 7 + 7]))
                i += 1
                await asyncio.sleep(0.001)
            await c.send(start_msg("late"))
            for sid in sids:
                e = await c.terminal(sid, 5)
                assert (e["type"], e.get("code")) == ("error", "engine_error"), e
            late = await c.terminal("late", 5)
            assert late["type"] == "error" and late["code"] in ("busy", "engine_error"), late
            if late["code"] == "engine_error":  # it was started before the death was seen
                assert any(m["type"] == "started" for m in c.rec("late")["msgs"])
            else:
                assert not any(m["type"] == "started" for m in c.rec("late")["msgs"])
            assert c.ws.close_code is None
            await c.close()
    asyncio.run(main())


# -------------------------------------------------------------- nothing lost


def test_nothing_lost_under_faults(small: Path, offline: Any) -> None:
    """Every stream a client started ends with one message naming it, under faults: a
    worker kill (engine_error), a cancel (cancelled), SIGTERM-style shutdown (shutting_down
    per stream, then 1001), a normal end (done carrying every sample of every token sent,
    exact); a client that stops reading is closed with 1008 slow_reader."""
    import os
    import signal

    async def main() -> None:
        rng = np.random.default_rng(22)
        async with running(small, send_timeout_s=0.5, sndbuf_bytes=4096, drain_timeout_s=0.3,
                           output_budget_s=0.0, max_queued_frames=1 << 16) as srv:
            sent: dict[str, int] = {}  # frames of whole token groups sent, per stream

            async def feed(c: Client, sid: str, frames: int, end: bool) -> list[np.ndarray]:
                lv = small_codes(frames, rng)
                await c.send(start_msg(sid))
                await send_stream(c, sid, lv, "orpheus_ids", rng, end=end)
                sent[sid] = frames
                return lv

            # 1. a worker kill: every stream of that worker gets engine_error
            a = await Client.open(srv.port)
            for i in range(4):
                await feed(a, f"w{i}", 400, end=False)
            await a.until(lambda: all(len(a.rec(f"w{i}")["audio"]) for i in range(4)))
            os.kill(srv.pool.engines[0].pid, signal.SIGKILL)
            for i in range(4):
                assert (await a.terminal(f"w{i}", 5))["code"] == "engine_error"
            while not srv._is_ready():
                await asyncio.sleep(0.05)
            # 2. done, cancelled, and a stream open at shutdown, on one connection
            b = await Client.open(srv.port)
            done_lv = await feed(b, "done", 800, end=True)
            await feed(b, "cancel", 400, end=False)
            await b.send({"type": "cancel", "stream_id": "cancel"})
            await feed(b, "open", 400, end=False)
            assert (await b.terminal("done"))["type"] == "done"
            assert (await b.terminal("cancel"))["type"] == "cancelled"
            # 3. a client that stops reading
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            slow = await connect(f"ws://127.0.0.1:{srv.port}/", sock=s, max_queue=1,
                                 compression=None, max_size=None)
            await slow.recv()
            await slow.send(json.dumps(start_msg("big", format="pcm_f32le", sample_rate=192000)))
            toks = LAYOUTS.codes_to_orpheus_ids(LAYOUTS.levels_to_orpheus(small_codes(8000, rng)))
            for i in range(0, len(toks), 2800):
                await slow.send(encode_token_frame("big", toks[i:i + 2800]))
            await slow.send(json.dumps({"type": "end", "stream_id": "big"}))
            deadline = time.monotonic() + 8
            while slow.transport.get_extra_info("socket") is not None and \
                    srv.metrics.errors.get("slow_reader", 0) == 0:
                assert time.monotonic() < deadline, "slow reader not closed"
                await asyncio.sleep(0.05)
            slow.transport.abort()
            # 4. shutdown: the open stream is named
            await srv.close()
            assert await b.closed() == 1001
            assert (b.rec("open")["terminal"] or {}).get("code") == "shutting_down"
            # the accounting: one terminal per stream, done carries all its audio
            for c in (a, b):
                for sid, r in c.streams.items():
                    t = r["terminal"]
                    assert t is not None and t.get("stream_id", sid) == sid, (sid, r["msgs"])
            assert b.rec("done")["terminal"]["samples"] == sent["done"] * 4
            assert_same_audio(bytes(b.rec("done")["audio"]),
                              expected(offline, done_lv, "pcm_s16le", SR), "pcm_s16le")
            assert srv.metrics.errors["slow_reader"] == 1
            assert srv.active_streams == 0
    asyncio.run(main())


@pytest.mark.parametrize("kind", ["text", "binary"])
def test_error_flood_without_reading_is_bounded(small: Path, offline: Any, kind: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that floods bad input and never reads: the server stops reading it once its
    write buffer is over its mark (codecd.connection) or OUT_HIGH bytes wait to be sent, so
    the queue and the buffer stay bounded; it is closed with slow_reader; another
    connection's stream is exact. ``text``: start and tokens messages, each answered
    by a 50 KB token_range error, against the shipped 1 MiB mark. ``binary``: token frames
    for streams never started, each answered by an unknown_stream error of about 100 bytes,
    against a mark of 4 KiB: binary frames take the short way into the session from
    ``data_received`` (codecd.connection), which must stop at the mark too."""
    import codecd.server

    if kind == "binary":
        monkeypatch.setattr(codecd.server, "OUT_HIGH", 4096)
        monkeypatch.setattr(codecd.server, "OUT_LOW", 1024)
    high, slack = codecd.server.OUT_HIGH, 2 * 60000 if kind == "text" else 1024

    async def main() -> None:
        rng = np.random.default_rng(23)
        async with running(small, send_timeout_s=2.0, sndbuf_bytes=4096) as srv:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            ws = await connect(f"ws://127.0.0.1:{srv.port}/", sock=s, max_queue=1,
                               compression=None, max_size=None, write_limit=4096)
            await ws.recv()
            huge = "9" * 50000
            peak = [0, 0]  # the outgoing queue, the transport's buffer

            async def flood() -> None:
                if kind == "text":
                    for i in range(200):
                        await ws.send(json.dumps(start_msg(f"h{i}")))
                        await ws.send('{"type":"tokens","stream_id":"h%d","tokens":[%s]}'
                                      % (i, huge))
                else:  # 20,000 errors of ~100 bytes: 2 MB of answers
                    for i in range(20000):
                        await ws.send(encode_token_frame(f"x{i}", [1, 2, 3]))

            async def watch() -> None:
                while True:
                    for conn in list(srv._conns.values()):
                        peak[0] = max(peak[0], conn.queued_bytes)
                        peak[1] = max(peak[1], conn.ws.transport.get_write_buffer_size())
                    await asyncio.sleep(0.002)

            watcher = asyncio.create_task(watch())
            flooder = asyncio.create_task(flood())
            other = await Client.open(srv.port)
            levels = small_codes(400, rng)
            await other.send(start_msg("o"))
            await send_stream(other, "o", levels, "orpheus_ids", rng)
            assert (await other.terminal("o"))["type"] == "done"
            assert_same_audio(bytes(other.rec("o")["audio"]),
                              expected(offline, levels, "pcm_s16le", SR), "pcm_s16le")
            deadline = time.monotonic() + 15
            while srv.metrics.errors.get("slow_reader", 0) == 0:
                assert time.monotonic() < deadline, "flooder not closed"
                await asyncio.sleep(0.05)
            watcher.cancel()
            flooder.cancel()
            ws.transport.abort()
            code = "token_range" if kind == "text" else "unknown_stream"
            assert srv.metrics.errors[code] >= 3  # the flood was answered until it was held
            assert peak[0] <= high + slack, peak[0]
            assert peak[1] <= 4096 + slack, peak[1]  # write_limit: sndbuf_bytes, one message past
            await other.close()
    asyncio.run(main())


def _deaf_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


def test_one_large_answer_to_a_client_that_never_reads_is_closed(small: Path) -> None:
    """A client that sends one bad message (answered by a 50 KB token_range error), then
    nothing, and never reads: the server writes the answer at once, over the write buffer's
    mark, and its writer waits for it to drain under the send deadline, so the client is
    closed with slow_reader though nothing more is queued for it."""
    async def main() -> None:
        async with running(small, send_timeout_s=1.0, sndbuf_bytes=4096) as srv:
            ws = await connect(f"ws://127.0.0.1:{srv.port}/", sock=_deaf_socket(srv.port),
                               max_queue=1, compression=None, max_size=None)
            await ws.recv()
            ws.transport.pause_reading()
            await ws.send(json.dumps(start_msg("h")))
            await ws.send('{"type":"tokens","stream_id":"h","tokens":[%s]}' % ("9" * 50000))
            deadline = time.monotonic() + 10
            while srv.metrics.errors.get("slow_reader", 0) == 0:
                assert time.monotonic() < deadline, "a client that never reads was not closed"
                await asyncio.sleep(0.05)
            ws.transport.abort()
    asyncio.run(main())


def test_ping_flood_without_reading_is_bounded(small: Path) -> None:
    """A client that sends pings without end and never reads the pongs: websockets answers
    every ping, so the server's write buffer would grow with them (61 MB in 4 s, measured
    before the change); the connection stops reading its input while that buffer is over
    its mark (codecd.connection), so it stays within the mark and the pongs of one read of
    the socket (at most 256 KiB), and another connection is served meanwhile."""
    async def main() -> None:
        async with running(small, sndbuf_bytes=4096) as srv:
            ws = await connect(f"ws://127.0.0.1:{srv.port}/", sock=_deaf_socket(srv.port),
                               max_queue=1, compression=None, max_size=None)
            await ws.recv()
            ws.transport.pause_reading()  # not even the pongs (websockets reads them otherwise)
            peak = [0]
            for _ in range(400):  # 40,000 pings of 100 bytes: 4 MB of pongs owed
                for _ in range(100):
                    ws.protocol.send_ping(b"p" * 100)
                ws.transport.write(b"".join(ws.protocol.data_to_send()))
                await asyncio.sleep(0.001)
                for conn in list(srv._conns.values()):
                    peak[0] = max(peak[0], conn.ws.transport.get_write_buffer_size())
            other = await Client.open(srv.port)
            assert other.hello["type"] == "hello"
            await other.close()
            assert peak[0] <= 4096 + (256 << 10), peak[0]
            ws.transport.abort()
    asyncio.run(main())
