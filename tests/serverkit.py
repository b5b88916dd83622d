"""Helpers of the daemon tests: a server in-process or as a ``codecd serve`` process on
127.0.0.1, a websockets client, the offline reference for the small model, audio comparisons.

The fixtures they use (``codecrt``, ``small``, ``offline``) are in ``conftest.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import load_layouts

pytest.importorskip("gguf")
pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from codecd.audio import OutputConverter, mulaw_to_s16  # noqa: E402
from codecd.config import Config, ModelSource  # noqa: E402
from codecd.protocol import encode_token_frame, parse_audio  # noqa: E402
from codecd.server import Server  # noqa: E402

STRIDES = (4, 2, 1)
SR = 24000
LAYOUTS = load_layouts()


def make_config(small: Path, **kw: Any) -> Config:
    base: dict[str, Any] = dict(listen="127.0.0.1:0", models=[ModelSource("small", str(small))],
                                devices=["cpu"], threads=1, max_ahead_s=0.0, max_batch=64,
                                send_timeout_s=2.0, drain_timeout_s=2.0)
    base.update(kw)
    cfg = Config(**base)
    assert not cfg.validate()
    return cfg


@contextlib.asynccontextmanager
async def running(small: Path, **kw: Any) -> AsyncIterator[Server]:
    srv = Server(make_config(small, **kw), {"small": str(small)},
                 engine_overrides={"debug_commands": True, "start_timeout_s": 30.0,
                                   "warm_buckets": (1,)})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


@contextlib.contextmanager
def serve_process(small: Path, log: Path, *flags: str, env: dict[str, str] | None = None,
                  buckets: str | None = "1", backlog: int = 64, unread_stderr: bool = False
                  ) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``codecd serve`` in a child process, on a loopback socket passed as systemd passes one
    (fd 3: the port is known before the child starts, with no race), stderr into ``log``, or
    with ``unread_stderr`` into a pipe that nobody reads (``log`` stays empty).
    ``buckets``: its ``--batch-buckets`` (None: the daemon's default). Yields the process (the
    daemon itself: bash execs it) and the port. On exit a daemon still running gets SIGTERM,
    and SIGKILL after 20 s (its workers die with it: PR_SET_PDEATHSIG)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(backlog)
    port = lsock.getsockname()[1]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CODECD_")}
    full_env.update(PYTHONPATH=os.pathsep.join(sys.path), LISTEN_FDS="1", CODECD_DEVICES="cpu")
    full_env.update(env or {})
    fd = lsock.fileno()
    args = " ".join(shlex.quote(f) for f in (*(("--batch-buckets", buckets) if buckets else ()),
                                               *flags))
    # fd 3 only, as systemd passes it: a second descriptor of the socket left open in the
    # daemon would keep it listening after the daemon closes it (connections would hang)
    redirect = "" if fd == 3 else f"3<&{fd} {fd}<&-"
    cmd = (f'LISTEN_PID=$$ exec {shlex.quote(sys.executable)} -m codecd.cli serve '
           f'--model small={shlex.quote(str(small))} --threads 1 '
           f'--listen 127.0.0.1:1 {args} {redirect}')
    with open(log, "wb") as err:
        p = subprocess.Popen(["bash", "-c", cmd], env=full_env, pass_fds=(fd,),
                             stderr=subprocess.PIPE if unread_stderr else err)
    lsock.close()
    try:
        yield p, port
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        p.wait()


async def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path,
                     timeout: float = 90.0) -> None:
    """Poll /readyz until 200; fail with the daemon's log if it exits or takes too long (90 s:
    a daemon starts in about a second idle, and took over 30 s on a box at load 12)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if (await http_get(port, "/readyz"))[0] == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(("exited: " if proc.poll() is not None else "not ready in time: ")
                                 + log.read_text(errors="replace")[-4000:])
        await asyncio.sleep(0.1)


async def http_get(port: int, path: str, headers: dict[str, str] | None = None
                   ) -> tuple[int, str]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    hs = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{hs}\r\n".encode())
    data = await r.read()
    w.close()
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head.split()[1]), body


async def metrics(port: int) -> dict[str, list[Any]]:
    status, body = await http_get(port, "/metrics")
    assert status == 200
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(body):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def metric_value(m: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(s.value for fam in m.values() for s in fam
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


class Client:
    """A websocket client that collects each stream's audio and terminal message."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.hello: dict[str, Any] = {}
        self.streams: dict[str, dict[str, Any]] = {}
        self.conn_errors: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, port: int, **kw: Any) -> Client:
        ws = await connect(f"ws://127.0.0.1:{port}/", compression=None, max_size=None,
                           open_timeout=10, **kw)
        c = cls(ws)
        c.hello = json.loads(await ws.recv())
        assert c.hello["type"] == "hello"
        c.task = asyncio.create_task(c._read())
        return c

    def rec(self, sid: str) -> dict[str, Any]:
        return self.streams.setdefault(sid, {"audio": bytearray(), "frames": [], "msgs": [],
                                             "terminal": None})

    def on_audio(self, r: dict[str, Any], f: Any) -> None:
        """One binary audio frame ``f`` (protocol.parse_audio) of the stream recorded in ``r``."""
        r["frames"].append((f.seq, f.sample_offset))
        r["audio"] += f.data

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for m in self.ws:
                if isinstance(m, bytes):
                    f = parse_audio(m)
                    r = self.rec(f.stream_id)
                    assert r["terminal"] is None, "audio after the terminal message"
                    self.on_audio(r, f)
                else:
                    d = json.loads(m)
                    sid = d.get("stream_id")
                    if sid is None:
                        self.conn_errors.append(d)
                    else:
                        r = self.rec(sid)
                        r["msgs"].append(d)
                        if d["type"] in ("done", "cancelled", "error"):
                            assert r["terminal"] is None, f"two terminal messages: {r['msgs']}"
                            r["terminal"] = d
                self.changed.set()
        self.changed.set()

    async def send(self, obj: Any) -> None:
        await self.ws.send(obj if isinstance(obj, (str, bytes)) else json.dumps(obj))

    async def until(self, cond: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out")
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.05))

    async def terminal(self, sid: str, timeout: float = 10.0) -> dict[str, Any]:
        await self.until(lambda: self.rec(sid)["terminal"] is not None, timeout)
        return self.rec(sid)["terminal"]

    async def closed(self, timeout: float = 5.0) -> int | None:
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)
        return self.ws.close_code

    async def close(self) -> None:
        await self.ws.close()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task


def expected(offline: Any, levels: list[np.ndarray], fmt: str, rate: int) -> bytes:
    conv = OutputConverter(SR, rate, fmt)
    a, _ = conv.feed(offline(levels))
    b, _ = conv.flush()
    return a + b


def offline_s16(ctx: Any, codes: np.ndarray) -> bytes:
    """The s16 a stream of codes [K, T] must come back as: ``ctx``'s offline decode of them
    (24 kHz in and out)."""
    conv = OutputConverter(24000, 24000, "pcm_s16le")
    a, _ = conv.feed(ctx.decode([codes[k:k + 1] for k in range(codes.shape[0])])[0])
    b, _ = conv.flush()
    return a + b


def assert_same_audio(got: bytes, want: bytes, fmt: str) -> None:
    """Same length; s16 within 1 LSB (almost everywhere: the small random model amplifies the
    batch-dependent GEMM rounding to ~1e-4, see test_engine; on CPUs without the fused
    kernels, where ggml's products make streamed and offline decodes differ by such rounding
    too, in 95 % of the samples: conftest.fused_cpu_products; 98.1 % of 160 measured on an AVX2
    CPU before its fused products), f32 to float precision."""
    from conftest import fused_cpu_products

    assert len(got) == len(want)
    if fmt == "pcm_s16le":
        d = np.abs(np.frombuffer(got, "<i2").astype(int) - np.frombuffer(want, "<i2"))
        within = float(np.mean(d <= 1)) if d.size else 1.0
        assert within > (0.99 if fused_cpu_products() else 0.95) and d.max(initial=0) <= 1 + int(5e-4 * 32768), \
            (int(d.max(initial=0)), within)
    elif fmt == "pcm_f32le":
        np.testing.assert_allclose(np.frombuffer(got, "<f4"), np.frombuffer(want, "<f4"),
                                   atol=5e-4, rtol=0)
    else:
        g = np.frombuffer(got, np.uint8).astype(int)
        w = np.frombuffer(want, np.uint8).astype(int)
        assert np.mean(g == w) > 0.98
        np.testing.assert_allclose(mulaw_to_s16(got), mulaw_to_s16(want), atol=600, rtol=0.1)


async def send_stream(c: Client, sid: str, levels: list[np.ndarray], layout: str,
                      rng: np.random.Generator, *, end: bool = True,
                      strides: tuple[int, ...] = STRIDES) -> None:
    """Send a stream's codes in random pieces, mixing JSON and binary frames. ``levels``
    with their frame strides (the small SNAC's by default; (1,) * K for Mimi's and
    Qwen3's K codebooks): cuts fall on whole frames of the coarsest level."""
    if layout == "levels":
        n = len(levels[0])
        top = max(strides)
        cuts = sorted({0, n, *map(int, rng.integers(0, n, 3))})
        for a, b in zip(cuts, cuts[1:]):
            parts = [lv[a * (top // s):b * (top // s)] for lv, s in zip(levels, strides)]
            if rng.random() < 0.5:
                await c.send({"type": "tokens", "stream_id": sid,
                              "levels": [p.tolist() for p in parts]})
            else:
                for i, p in enumerate(parts):
                    await c.send(encode_token_frame(sid, p, level=i))
    else:
        toks = LAYOUTS.levels_to_orpheus(levels)
        if layout == "orpheus_ids":
            toks = LAYOUTS.codes_to_orpheus_ids(toks)
        n = len(toks)
        cuts = sorted({0, n, *map(int, rng.integers(0, n, 4))})
        for a, b in zip(cuts, cuts[1:]):
            piece = toks[a:b]
            if rng.random() < 0.5:
                await c.send({"type": "tokens", "stream_id": sid, "tokens": piece.tolist()})
            else:
                await c.send(encode_token_frame(sid, piece))
    if end:
        await c.send({"type": "end", "stream_id": sid})


async def levels_streams(port: int, cases: list[tuple[str, np.ndarray]], rng: np.random.Generator,
                         *, bad_codebooks: int, bad_message: str
                         ) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Streams of a codebook codec (Mimi, Qwen3) in the ``levels`` layout: ``cases`` (stream id,
    codes [K, T], K fixed per stream at ``start``) spread over two connections (one holds at
    most 16 streams), each pushed in random pieces. Returns every stream's s16 audio and the
    first connection's hello. Then a start with ``bad_codebooks`` is refused with an error
    naming ``bad_message``, and the connection stays usable."""
    conns = [await Client.open(port) for _ in range(2)]
    for i, (sid, codes) in enumerate(cases):
        await conns[i % 2].send({"type": "start", "stream_id": sid, "model": "small",
                                 "layout": "levels", "codebooks": int(codes.shape[0])})
    await asyncio.gather(*(send_stream(conns[i % 2], sid, list(codes), "levels", rng,
                                       strides=(1,) * codes.shape[0])
                           for i, (sid, codes) in enumerate(cases)))
    out = {}
    for i, (sid, _) in enumerate(cases):
        c = conns[i % 2]
        t = await c.terminal(sid, timeout=60)
        assert t["type"] == "done", t
        out[sid] = bytes(c.rec(sid)["audio"])
    c = conns[0]
    await c.send({"type": "start", "stream_id": "bad", "model": "small", "layout": "levels",
                  "codebooks": bad_codebooks})
    t = await c.terminal("bad")
    assert t["type"] == "error" and bad_message in t["message"], t
    hello = conns[0].hello
    for c in conns:
        await c.close()
    return out, hello


def s16_worst(got: dict[str, bytes], want: dict[str, bytes]) -> tuple[int, int]:
    """(largest |difference|, samples that differ) between two sets of s16 streams."""
    worst, differ = 0, 0
    for sid, w16 in want.items():
        g = np.frombuffer(got[sid], "<i2").astype(int)
        w = np.frombuffer(w16, "<i2").astype(int)
        assert g.shape == w.shape, sid
        worst = max(worst, int(np.abs(g - w).max()))
        differ += int(np.count_nonzero(g != w))
    return worst, differ


def start_msg(sid: str, layout: str = "orpheus_ids", **kw: Any) -> dict[str, Any]:
    return {"type": "start", "stream_id": sid, "model": "small", "layout": layout, **kw}


# -------------------------------------------------------------------- tests
