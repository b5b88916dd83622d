"""The shipped HAProxy configuration in front of two real daemons on loopback.

The config under test is systemd/haproxy/codecd.cfg itself: the test only
points its frontend and servers at loopback ports, shortens the health-check
interval and logs to stderr. Skipped when haproxy is not installed (CI
installs it from .ci/apt-packages.txt).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smallmodel import small_codes
from test_server import (SR, Client, assert_same_audio, codecrt, expected, http_get, metric_value, metrics,  # noqa: F401
                         offline, running, send_stream, small, start_msg)

SHIPPED = Path(__file__).resolve().parent.parent / "systemd" / "haproxy" / "codecd.cfg"
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)

pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt install haproxy)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proxy_config(front: int, backends: list[int]) -> str:
    """The shipped config with loopback ports, a 200 ms check interval and stderr logging."""
    text = SHIPPED.read_text(encoding="utf-8")
    text = text.replace("log /dev/log local0 notice", "log stderr format raw local0 notice")
    text = text.replace("maxconn 20000", "maxconn 2000")  # within a test runner's fd limit
    text, n_bind = re.subn(r"(?m)^(\s*)bind :\d+$", rf"\1bind 127.0.0.1:{front}", text)
    text, n_def = re.subn(r"inter 2s fall 2 rise 2", "inter 200ms fall 1 rise 1", text)
    text, n_srv = re.subn(r"(?m)^\s*server .*\n", "", text)
    assert (n_bind, n_def, n_srv) == (1, 1, 2), "the shipped config changed shape: update this test"
    servers = "".join(f"    server codecd{i + 1} 127.0.0.1:{p}\n" for i, p in enumerate(backends))
    return text.rstrip("\n") + "\n" + servers


def test_shipped_config_is_valid() -> None:
    r = subprocess.run([HAPROXY, "-c", "-f", str(SHIPPED)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout


async def wait_status(port: int, path: str, status: int, timeout: float = 10.0,
                      proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"haproxy exited: {proc.communicate()[0]}")
        try:
            if (await http_get(port, path))[0] == status:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{path} on {port} never answered {status}"
        await asyncio.sleep(0.05)


async def conns(port: int) -> float:
    return metric_value(await metrics(port), "codecd_connections_active")


async def stream_once(c: Client, sid: str, offline: Any, rng: np.random.Generator) -> None:
    levels = small_codes(4 * int(rng.integers(10, 30)), rng)
    await c.send(start_msg(sid))
    await send_stream(c, sid, levels, "orpheus_ids", rng)
    t = await c.terminal(sid, 15)
    assert t["type"] == "done", t
    assert_same_audio(bytes(c.rec(sid)["audio"]), expected(offline, levels, "pcm_s16le", SR), "pcm_s16le")


def test_proxy_balances_and_fails_over(small: Path, offline: Any, tmp_path: Path) -> None:
    async def main() -> None:
        rng = np.random.default_rng(21)
        front = free_port()
        async with running(small) as a, running(small) as b:
            cfg = tmp_path / "haproxy.cfg"
            cfg.write_text(proxy_config(front, [a.port, b.port]), encoding="utf-8")
            proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            try:
                await wait_status(front, "/readyz", 200, proc=proc)
                await asyncio.sleep(0.6)  # both servers seen up by the 200 ms checks
                # four connections held open: least connections puts two on each daemon
                clients = [await Client.open(front) for _ in range(4)]
                assert (await conns(a.port), await conns(b.port)) == (2, 2)
                await asyncio.gather(*(stream_once(c, f"s{i}", offline, rng) for i, c in enumerate(clients)))
                for c in clients:
                    await c.close()
                # stop daemon a (its drain closes the listener): new streams go to b only
                stop = asyncio.create_task(a.close())
                await asyncio.sleep(0.8)  # one failed check marks it down (fall 1, inter 200 ms)
                before = metric_value(await metrics(b.port), "codecd_streams_total", outcome="done")
                late = [await Client.open(front) for _ in range(3)]
                await asyncio.gather(*(stream_once(c, f"late{i}", offline, rng) for i, c in enumerate(late)))
                after = metric_value(await metrics(b.port), "codecd_streams_total", outcome="done")
                assert after - before == 3
                for c in late:
                    assert not c.conn_errors
                    await c.close()
                await stop
            finally:
                proc.terminate()
                out, _ = proc.communicate(timeout=10)
            assert proc.returncode in (0, 143, -15), out
    asyncio.run(main())
