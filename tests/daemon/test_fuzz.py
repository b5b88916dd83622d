"""Fuzzing the protocol (issue 18): hypothesis drives sequences of hostile frames through the
sans-I/O session, and hostile handshakes and frames through a live server for a bounded
number of cases. Inputs that once broke something are kept as ``@example`` regression
cases. The single-frame parser fuzzers are in ``test_protocol.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from codecd import protocol as P
from codecd.actions import Close, EngineCancel, EngineFinish, EngineOpen, EnginePush, SendBinary, \
    SendText
from codecd.families import ModelSpec
from codecd.session import Session, SessionLimits

SNAC = ModelSpec("snac_24khz", "snac", 24000, 512, 3, (4096, 4096, 4096), (4, 2, 1),
                 layouts=("orpheus_ids", "orpheus", "levels"), latency_samples=1536)
IDS = ("a", "b", "é")

# ----------------------------------------------------------------- strategies

_ints = st.one_of(st.integers(-5, 5000), st.integers(128266, 128266 + 7 * 4096),
                  st.integers(-(2**70), 2**70), st.just(2**63), st.just(-(2**63) - 1))
_junk = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=6)
                     | _ints, lambda k: st.lists(k, max_size=3) | st.dictionaries(
                         st.text(max_size=6), k, max_size=3), max_leaves=6)
_sid = st.sampled_from(IDS) | _junk


def _obj(**fields: Any) -> st.SearchStrategy[str]:
    return st.fixed_dictionaries(fields).map(json.dumps)


_text = st.one_of(
    _obj(type=st.just("start"), stream_id=_sid, model=st.sampled_from(["snac_24khz", "x"]) | _junk,
         layout=st.sampled_from(P.LAYOUTS + ("bad",)),
         format=st.sampled_from(P.FORMATS + ("wav",)),
         sample_rate=st.sampled_from([None, 8000, 24000, 7, 10**40])),
    _obj(type=st.just("tokens"), stream_id=_sid, tokens=st.lists(_ints, max_size=30) | _junk),
    _obj(type=st.just("tokens"), stream_id=_sid,
         levels=st.lists(st.lists(_ints, max_size=8), max_size=5) | _junk),
    _obj(type=st.sampled_from(["end", "cancel", "hello", "nope"]), stream_id=_sid),
    st.lists(_ints, max_size=20).map(json.dumps),
    st.builds(lambda d: "[1,%s]" % d, st.text("0123456789", min_size=4301, max_size=4400)),
    _junk.map(json.dumps),
    st.text(max_size=40),
)
_binary = st.one_of(
    st.builds(lambda sid, lv, toks: P.encode_token_frame(sid, toks, lv),
              st.sampled_from(IDS), st.none() | st.integers(0, 254),
              st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20)),
    st.binary(max_size=40),
    st.builds(lambda b: b"\x01" + b, st.binary(max_size=40)),
)
_frames = st.lists(st.one_of(_text, _binary), max_size=25)


# ----------------------------------------------------------------- the session


class FakeEngine:
    """Answers a session's engine commands at once, as the engine would: opens, audio for
    every push (one sample per code of level 0), done after finish. Checks the session's
    output on the way."""

    def __init__(self, limits: SessionLimits) -> None:
        self.admitted = 0
        self.released = 0
        self.s = Session({"snac_24khz": SNAC}, limits, admit=self._admit, release=self._release)
        self.open: set[Any] = set()
        self.terminal: dict[str, int] = {}
        self.started: set[str] = set()
        self.closed = False

    def _admit(self) -> bool:
        self.admitted += 1
        return True

    def _release(self) -> None:
        self.released += 1

    def run(self, acts: list[Any]) -> None:
        follow: list[Any] = []
        for a in acts:
            if isinstance(a, EngineOpen):
                assert a.key not in self.open
                self.open.add(a.key)
                follow += self.s.on_opened(a.key)
            elif isinstance(a, EnginePush):
                assert a.key in self.open, "push for a stream the engine does not have"
                assert all(x.dtype == np.int32 for x in a.levels)
                follow += self.s.on_audio(a.key, np.zeros(4 * len(a.levels[0]), np.float32))
            elif isinstance(a, EngineFinish):
                assert a.key in self.open
                self.open.discard(a.key)
                follow += self.s.on_done(a.key, -1)
            elif isinstance(a, EngineCancel):
                self.open.discard(a.key)
            elif isinstance(a, SendText):
                self.check_text(a.data)
            elif isinstance(a, SendBinary):
                f = P.parse_audio(a.data)
                assert f.stream_id in self.started, "audio before started"
            elif isinstance(a, Close):
                assert 1000 <= a.code < 5000 and len(a.reason.encode()) <= 123
                assert not self.closed
                self.closed = True
        if follow:
            self.run(follow)

    def check_text(self, data: str) -> None:
        m = P.parse_server_text(data)
        if isinstance(m, P.Started):
            assert m.stream_id not in self.started
            self.started.add(m.stream_id)
        elif isinstance(m, (P.Done, P.Cancelled)) or (isinstance(m, P.Error) and m.stream_id):
            sid = m.stream_id
            assert sid is not None
            self.started.discard(sid)
            self.terminal[sid] = self.terminal.get(sid, 0) + 1
        if isinstance(m, P.Error):
            assert m.code != "internal_error", m
            assert m.code in {c.value for c in P.ErrorCode}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_frames, st.booleans())
@example([json.dumps({"type": "start", "stream_id": "a", "model": "snac_24khz",
                      "layout": "orpheus_ids"}),
          '{"type":"tokens","stream_id":"a","tokens":[128266,%s]}' % ("9" * 5000)], False)
@example([json.dumps({"type": "start", "stream_id": "a", "model": "snac_24khz",
                      "layout": "levels"}), P.encode_token_frame("a", [1], 9)], True)
def test_session_survives_any_frame_sequence(frames: list[Any], lose: bool) -> None:
    """Any sequence of text and binary frames: the session never raises or sends
    internal_error, never pushes for a stream the engine lacks, sends audio only between
    started and the stream's terminal, closes at most once, and releases every admitted slot
    once the connection is gone."""
    eng = FakeEngine(SessionLimits(max_streams=3, max_pending_tokens=64))
    eng.run(eng.s.connect())
    for f in frames:
        eng.run(eng.s.receive_text(f) if isinstance(f, str) else eng.s.receive_binary(f))
        eng.run(eng.s.tick())
    eng.run(eng.s.shutdown() if lose else eng.s.connection_lost())
    assert not eng.s.open_streams
    assert eng.released == eng.admitted  # every slot taken was given back, once
    assert all(n >= 1 for n in eng.terminal.values())


# ----------------------------------------------------------------- a live server

pytest.importorskip("gguf")
pytest.importorskip("websockets")

from conftest import codecrt_or_skip  # noqa: E402
from smallmodel import write_small_snac  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from codecd.server import Server  # noqa: E402
from serverkit import make_config  # noqa: E402


class LiveServer:
    """A server on its own event loop thread (hypothesis drives it with blocking sockets)."""

    def __init__(self, small: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.srv = Server(make_config(small, auth_token="tok", allowed_origins=["https://ok"],
                                      max_message_bytes=4096, metrics_access="open"),
                          {"small": str(small)},
                          engine_overrides={"start_timeout_s": 30.0, "warm_buckets": (1,)})
        self.call(self.srv.start())
        self.port = self.srv.port

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.srv.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class ErrorLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "worker" not in record.getMessage():
            self.records.append(record)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ErrorLogs]]:
    codecrt_or_skip()
    small = write_small_snac(tmp_path_factory.mktemp("fuzz") / "small.gguf", seed=5)
    logs = ErrorLogs()
    root = logging.getLogger()
    root.addHandler(logs)
    srv = LiveServer(small)
    try:
        yield srv, logs
    finally:
        srv.close()
        root.removeHandler(logs)


_hname = st.sampled_from(["Host", "Upgrade", "Connection", "Sec-WebSocket-Key",
                          "Sec-WebSocket-Version", "Authorization", "Origin",
                          "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol",
                          "Content-Length", "Transfer-Encoding", "X-Junk"])
_hvalue = st.one_of(
    st.sampled_from(["websocket", "Upgrade", "dGhlIHNhbXBsZSBub25jZQ==", "13", "8",
                     "Bearer tok", "bearer tok", "Bearer nope", "Basic dG9r", "https://ok",
                     "https://evil", "permessage-deflate", "chunked", "0", "127.0.0.1"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=4000, max_size=9000),
)
_header = st.tuples(_hname.map(lambda n: n.lower()) | _hname.map(lambda n: n.upper()) | _hname,
                    _hvalue)
_request = st.tuples(
    st.sampled_from(["GET", "HEAD", "POST", "DELETE", "BREW", "get", "OPTIONS"]),
    st.sampled_from(["/", "/healthz", "/readyz", "/metrics", "/x?y=1", "*", "//", "/%00"]),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "JUNK"]),
    st.lists(_header, max_size=12),
    st.binary(max_size=30),
)


def _send_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        with contextlib.suppress(socket.timeout, ConnectionResetError):
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and (out.startswith(b"HTTP/1.1 101") or len(out) > 1 << 20):
                    break
        return out


VALID = [("Host", "x"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
         ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"),
         ("Authorization", "Bearer tok")]


@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_request, st.booleans())
@example(("GET", "/", "HTTP/1.1", [("Authorization", "Bearer tok")], b""), True)
@example(("GET", "/", "HTTP/1.1", [("upgrade", "websocket")], b""), True)
@example(("GET", "/", "HTTP/1.1", [("origin", "https://ok"), ("Origin", "https://ok")], b""),
         True)
@example(("DELETE", "/metrics", "HTTP/1.1", [], b""), False)
@example(("POST", "*", "HTTP/1.1", [], b"\x8b*n"), True)  # was: ERROR traceback in websockets
@example(("GET", "/healthz", "HTTP/1.1", [], b"\x8b*n"), False)
def test_live_handshake_fuzz(live: tuple[LiveServer, ErrorLogs], req: Any,
                             based: bool) -> None:
    """Hostile handshakes (duplicated, re-cased, huge or junk headers, odd methods, paths,
    versions, trailing bytes), alone or added to a valid upgrade: a clean HTTP answer that is
    never 500, or a dropped connection for unparsable requests; no ERROR log."""
    srv, logs = live
    method, path, version, headers, tail = req
    hs = (VALID if based else []) + list(headers)
    data = (f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hs)
            + "\r\n").encode("latin-1") + tail
    out = _send_raw(srv.port, data)
    if out:
        status = int(out.split(b" ", 2)[1])
        assert status != 500 and status in (101, 200, 400, 401, 403, 404, 405, 426, 431, 503, 505), out[:200]
        if status != 101:
            assert out.lower().count(b"\r\ncontent-type:") <= 1, out[:300]
    assert not logs.records, [r.getMessage() for r in logs.records]


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_frames)
def test_live_frame_fuzz(live: tuple[LiveServer, ErrorLogs], frames: list[Any]) -> None:
    """Hostile frame sequences over a real websocket: each is answered with documented
    errors (never internal_error, never close 1011), and the server serves the next client."""
    srv, logs = live
    with connect(f"ws://127.0.0.1:{srv.port}/", additional_headers={"Authorization": "Bearer tok"},
                 open_timeout=5, close_timeout=2, max_size=None) as ws:
        ws.recv(5)  # hello
        for f in frames:
            try:
                ws.send(f.replace('"snac_24khz"', '"small"') if isinstance(f, str) else f)
            except Exception:
                break  # the server closed: the rest cannot go
        got: list[Any] = []
        with contextlib.suppress(Exception):
            while True:
                got.append(ws.recv(0.3))
        code = ws.protocol.close_code
    assert code in (None, 1000, 1008, 1009), code
    for m in got:
        if isinstance(m, str):
            d = json.loads(m)
            assert d.get("code") != "internal_error", d
    assert not logs.records, [r.getMessage() for r in logs.records]
