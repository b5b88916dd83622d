"""The shipped HAProxy configuration in front of two real daemons on loopback.

The config under test is systemd/haproxy/codecd.cfg itself: the test only points
its frontend and servers at loopback ports, shortens the health checks and logs
to stderr. The daemons are ``codecd serve`` processes (stopped with SIGTERM, as
systemd stops them) with a bearer token. Skipped when haproxy is not installed
(CI installs it from .ci/apt-packages.txt).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from smallmodel import small_codes
from serverkit import (
    SR,
    Client,
    assert_same_audio,
    expected,
    http_get,
    metric_value,
    metrics,
    send_stream,
    serve_process,
    start_msg,
    wait_ready,
)

SHIPPED = Path(__file__).resolve().parents[2] / "systemd" / "haproxy" / "codecd.cfg"
HAPROXY = shutil.which("haproxy") or next(
    (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None)
TOKEN = "proxy-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVER_TIMEOUT_S = 1  # the test's "timeout server" (shipped: 5 s)
# float output: the subject is the routing, not s16 rounding of batch-dependent GEMM results
FMT = "pcm_f32le"

pytestmark = pytest.mark.skipif(HAPROXY is None,
                                reason="haproxy is not installed (apt install haproxy)")


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


@dataclass
class Haproxy:
    port: int
    log: Path
    stats_socket: Path

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` on the runtime API: the backend's rows (BACKEND, codecd1, ...) by name."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.stats_socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, *rows = data.decode().strip().splitlines()
        names = head.lstrip("# ").split(",")
        out = {}
        for row in rows:
            d = dict(zip(names, row.split(",")))
            if d.get("pxname") == "codecd_daemons":
                out[d["svname"]] = d
        return out

    def server_status(self, i: int) -> str:
        """UP, DOWN, ... of server codecd<i+1>, as the health checks left it."""
        return self.stats()[f"codecd{i + 1}"]["status"]


@dataclass
class Proxy:
    haproxy: Haproxy
    daemons: list[Daemon]

    @property
    def port(self) -> int:
        return self.haproxy.port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proxy_config(front: int, backends: list[int], stats_socket: Path,
                 no_check: frozenset[int] = frozenset()) -> str:
    """The shipped config with loopback ports, 200 ms checks of up to 2 s (down after one
    failure), a 1 s server timeout, stderr logs, the runtime API on ``stats_socket``, and no chroot or user
    switch (the test may not run as root); the backends at the indices in ``no_check`` are
    not health-checked."""
    text = SHIPPED.read_text(encoding="utf-8")
    subs = [(r"log /dev/log local0 notice", "log stderr format raw local0 info"),
            (r"(?m)^\s*(chroot|user|group) .*\n", ""),
            (r"stats socket /run/haproxy/admin.sock", f"stats socket {stats_socket}"),
            (r"maxconn 20000", "maxconn 2000"),  # within a test runner's file descriptor limit
            (r"(?m)^(\s*)bind :\d+$", rf"\g<1>bind 127.0.0.1:{front}"),
            # a check's answer may take 2 s (a loaded box): without "timeout check" the 200 ms
            # "inter" is the whole check's timeout and one slow /readyz marks a live daemon down
            (r"timeout server 5s", f"timeout server {SERVER_TIMEOUT_S}s\n    timeout check 2s"),
            (r"inter 2s fall 2 rise 2", "inter 200ms fall 1 rise 1"),
            (r"(?m)^\s*server .*\n", "")]
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text)
        assert n >= 1, f"the shipped config has no {pattern!r} any more: update this test"
    servers = "".join(
        f"    server codecd{i + 1} 127.0.0.1:{p}{' no-check' if i in no_check else ''}\n"
        for i, p in enumerate(backends))
    return text.rstrip("\n") + "\n" + servers


def start_haproxy(stack: ExitStack, tmp_path: Path, backends: list[int],
                  no_check: frozenset[int] = frozenset()) -> Haproxy:
    """haproxy in the foreground on the test's config (stopped by ``stack``), once it listens."""
    front = free_port()
    sock_dir = Path(tempfile.mkdtemp(prefix="hap", dir="/tmp"))  # short: AF_UNIX path limit
    stack.callback(shutil.rmtree, sock_dir, True)
    stats_socket = sock_dir / "admin.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(proxy_config(front, backends, stats_socket, no_check), encoding="utf-8")
    log = tmp_path / "haproxy.log"
    with open(log, "wb") as out:
        hp = subprocess.Popen([str(HAPROXY), "-db", "-f", str(cfg)], stdout=out,
                              stderr=subprocess.STDOUT)
    stack.callback(stop_process, hp, log)

    deadline = time.monotonic() + 10
    while True:
        assert hp.poll() is None, "haproxy exited: " + log.read_text(errors="replace")
        try:
            socket.create_connection(("127.0.0.1", front), timeout=1).close()
            return Haproxy(front, log, stats_socket)
        except OSError:
            assert time.monotonic() < deadline, "haproxy never listened"
            time.sleep(0.05)


def stop_process(p: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, then SIGKILL after 5 s; a process that had already exited is a failure."""
    assert p.poll() is None, f"exited early ({p.returncode}): " + log.read_text(errors="replace")
    p.terminate()
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def start_daemons(stack: ExitStack, small: Path, tmp_path: Path, n: int) -> list[Daemon]:
    """``n`` ready ``codecd serve`` processes (token required, no pacing, 10 s drain)."""
    daemons = []
    for i in range(n):
        log = tmp_path / f"daemon{i + 1}.log"
        p, port = stack.enter_context(serve_process(
            small, log, "--max-ahead-s", "0", "--drain-timeout-s", "10",
            "--metrics-access", "loopback",
            env={"CODECD_AUTH_TOKEN": TOKEN}))
        daemons.append(Daemon(p, port, log))

    async def all_ready() -> None:
        await asyncio.gather(*(wait_ready(d.port, d.proc, d.log) for d in daemons))
    asyncio.run(all_ready())
    return daemons


@pytest.fixture
def proxy(small: Path, tmp_path: Path) -> Iterator[Proxy]:
    """Two ready daemons and haproxy in front, both seen up by its checks; all stopped after."""
    with ExitStack() as stack:
        daemons = start_daemons(stack, small, tmp_path, 2)
        hp = start_haproxy(stack, tmp_path, [d.port for d in daemons])
        deadline = time.monotonic() + 5
        while not all(r["status"] == "UP" and r["check_status"] == "L7OK"
                      for name, r in hp.stats().items() if name != "BACKEND"):
            assert time.monotonic() < deadline, hp.stats()
            time.sleep(0.05)
        yield Proxy(hp, daemons)


async def conns(port: int) -> float:
    return metric_value(await metrics(port), "codecd_connections_active")


async def done_streams(port: int) -> float:
    return metric_value(await metrics(port), "codecd_streams_total", outcome="done")


def codes(rng: np.random.Generator) -> list[np.ndarray]:
    return small_codes(4 * int(rng.integers(10, 30)), rng)


async def stream_once(c: Client, sid: str, offline: Any, rng: np.random.Generator) -> None:
    """One whole stream on ``c``; it must end with done and the offline decode's samples."""
    levels = codes(rng)
    await c.send(start_msg(sid, format=FMT))
    await send_stream(c, sid, levels, "orpheus_ids", rng)
    t = await c.terminal(sid, 15)
    assert t["type"] == "done", t
    assert_same_audio(bytes(c.rec(sid)["audio"]), expected(offline, levels, FMT, SR), FMT)


def test_shipped_config_is_valid() -> None:
    """haproxy -c accepts systemd/haproxy/codecd.cfg as shipped."""
    r = subprocess.run([str(HAPROXY), "-c", "-f", str(SHIPPED)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout


def test_proxy_passes_authorization(proxy: Proxy) -> None:
    """Through the proxy a missing or wrong token gets the daemon's 401; the right one connects."""
    async def main() -> None:
        url = f"ws://127.0.0.1:{proxy.port}/"
        for hdrs in ({}, {"Authorization": "Bearer nope"}):
            with pytest.raises(InvalidStatus) as ei:
                await connect(url, additional_headers=hdrs, open_timeout=5)
            assert ei.value.response.status_code == 401
            assert ei.value.response.headers.get("WWW-Authenticate", "").startswith("Bearer")
        c = await Client.open(proxy.port, additional_headers=AUTH)
        assert c.hello["models"][0]["name"] == "small"
        await c.close()
        refused = [metric_value(await metrics(d.port), "codecd_errors_total", code="unauthorized")
                   for d in proxy.daemons]
        assert sum(refused) == 2  # checked by the daemons themselves
        assert (await http_get(proxy.port, "/metrics"))[0] == 403  # not through the proxy
    asyncio.run(main())


def test_proxy_balances_least_connections(proxy: Proxy, offline: Any) -> None:
    """Four open connections land two on each daemon; idle past "timeout server" they stay open
    (the tunnel timeout governs them), and every stream through the proxy is exact."""
    async def main() -> None:
        rng = np.random.default_rng(21)
        clients = [await Client.open(proxy.port, additional_headers=AUTH) for _ in range(4)]
        assert [await conns(d.port) for d in proxy.daemons] == [2, 2]
        await asyncio.sleep(SERVER_TIMEOUT_S * 1.5)
        await asyncio.gather(*(stream_once(c, f"s{i}", offline, rng)
                               for i, c in enumerate(clients)))
        assert [await done_streams(d.port) for d in proxy.daemons] == [2, 2]
        for c in clients:
            assert not c.conn_errors and c.ws.close_code is None
            await c.close()
    asyncio.run(main())


def test_unanswering_server_is_retried_elsewhere(small: Path, offline: Any,
                                                  tmp_path: Path) -> None:
    """A server that accepts connections and never answers (a stopped daemon whose socket systemd
    holds, a hung one; not health-checked here, so the proxy keeps choosing it): each new
    connection is retried on the live daemon after "timeout server", and its stream is exact."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    with hung, ExitStack() as stack:
        (daemon,) = start_daemons(stack, small, tmp_path, 1)
        hp = start_haproxy(stack, tmp_path, [hung.getsockname()[1], daemon.port],
                           no_check=frozenset({0}))

        async def main() -> None:
            rng = np.random.default_rng(23)
            for i in range(2):
                t0 = time.monotonic()
                c = await Client.open(hp.port, additional_headers=AUTH)
                waited = time.monotonic() - t0
                # tried on the hung server first, then redispatched
                assert SERVER_TIMEOUT_S * 0.9 < waited < SERVER_TIMEOUT_S + 15, waited
                await stream_once(c, f"r{i}", offline, rng)
                await c.close()
            assert await done_streams(daemon.port) == 2
        asyncio.run(main())
        st = hp.stats()
        assert int(st["BACKEND"]["wredis"]) == 2, st["BACKEND"]  # both redispatched
        assert int(st["codecd2"]["stot"]) == 2 and int(st["codecd2"]["hrsp_1xx"]) == 2


def test_sigterm_drains_and_new_streams_go_to_the_other(proxy: Proxy, offline: Any) -> None:
    """SIGTERM to one daemon: its open stream finishes, every new stream (before and after the
    check marks it down) completes on the other daemon with no error, and it exits 0."""
    async def main() -> int:
        rng = np.random.default_rng(22)
        held = await Client.open(proxy.port, additional_headers=AUTH)
        counts = [await conns(d.port) for d in proxy.daemons]
        victim, survivor = (0, 1) if counts == [1, 0] else (1, 0)
        assert sorted(counts) == [0, 1]
        levels = codes(rng)
        k = len(levels[0]) // 2  # whole level-0 groups in the first half
        half = [x[: k * len(x) // len(levels[0])] for x in levels]
        await held.send(start_msg("held", format=FMT))
        await send_stream(held, "held", half, "orpheus_ids", rng, end=False)
        await held.until(lambda: len(held.rec("held")["audio"]) > 0, 10)
        before = await done_streams(proxy.daemons[survivor].port)

        proxy.daemons[victim].proc.send_signal(signal.SIGTERM)
        # at once, before any check has failed: the retry on the other daemon covers the window
        early = [await Client.open(proxy.port, additional_headers=AUTH) for _ in range(2)]
        await asyncio.gather(*(stream_once(c, f"early{i}", offline, rng)
                               for i, c in enumerate(early)))
        deadline = time.monotonic() + 15
        while not proxy.haproxy.server_status(victim).startswith("DOWN"):
            assert time.monotonic() < deadline, "the health check never marked the daemon down"
            await asyncio.sleep(0.05)
        late = [await Client.open(proxy.port, additional_headers=AUTH) for _ in range(2)]
        await asyncio.gather(*(stream_once(c, f"late{i}", offline, rng)
                               for i, c in enumerate(late)))
        assert await done_streams(proxy.daemons[survivor].port) - before == 4
        for c in early + late:
            assert not c.conn_errors
            await c.close()

        # the draining daemon still serves its open stream to the end
        rest = [x[k * len(x) // len(levels[0]):] for x in levels]
        await send_stream(held, "held", rest, "orpheus_ids", rng)
        t = await held.terminal("held", 10)
        assert t["type"] == "done", t
        assert_same_audio(bytes(held.rec("held")["audio"]), expected(offline, levels, FMT, SR),
                          FMT)
        assert await held.closed(10) == 1001  # going away, after the drain
        return victim
    d = proxy.daemons[asyncio.run(main())]
    assert d.proc.wait(timeout=10) == 0, d.log.read_text(errors="replace")
