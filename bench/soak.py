"""Soak test of codecd (issue 18; not CI): a long churn of streams, faults and bad input.

    python bench/soak.py --spawn demo --minutes 30              # the record run
    python bench/soak.py --spawn demo --minutes 3 --kill-every 1  # a quick look
    python bench/soak.py --url ws://127.0.0.1:8765 --model snac_24khz --server-pid PID

For ``--minutes`` a set of client loops run against one server (``--spawn``ed with
``codecd serve --model NAME=SOURCE``, or a running one):

* finishers: a stream of 0.5-3 s of audio, tokens paced at ``--speed`` x real time, ``end``,
  ``done`` with every sample (checked);
* cancellers: tokens, then ``cancel`` mid-stream (``cancelled`` expected);
* disconnectors: tokens, then the socket is closed without a word;
* slow readers: a whole stream sent at once, audio read at half real time (the output
  budget's back-pressure; ``done`` expected);
* bad input at a low rate: junk JSON, huge integers, bad binary frames, duplicate
  headers (each must get its documented error and a clean answer);
* a worker kill (SIGKILL) every ``--kill-every`` minutes (its streams: ``engine_error``).

Every ``--report-every`` seconds one row: the resident memory of the daemon's main and
front processes (where connections live), and of it the private part (less the pages of the
shared-memory rings to the workers, which count once touched, up to the rings' 20 MiB a
worker, and start again with a restarted worker's new rings), of its workers, their open file
descriptors, device memory (``nvidia-smi``, when there is one), open streams and connections
(``/metrics``), and the client-side outcome counts. At the end, after the clients have gone:
open streams and connections back to zero, file descriptors back to their idle count (+2),
the main and fronts' private resident memory within 10 % of its level at the end of the first
period (after warm-up and the first churn), no unexpected outcome. Exit 1 when one fails.
Loopback only. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from bench.serve import server_env  # noqa: E402
from codecd.protocol import encode_token_frame, parse_audio  # noqa: E402

BASE = 128266
GROUP = 7


# ------------------------------------------------------------------ the process side


def _proc_tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError):
                raw = Path(f"/proc/{d}/stat").read_text()
                kids.setdefault(int(raw[raw.rindex(")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _roles(pid: int) -> dict[str, list[int]]:
    """The daemon's children by role (``codecd serve``: main, front processes, workers)."""
    out: dict[str, list[int]] = {"front": [], "worker": []}
    for p in _proc_tree(pid)[1:]:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
            if b"codecd.front" in cmd:
                out["front"].append(p)
            elif b"codecd.worker" in cmd:
                out["worker"].append(p)
    return out


def _rss(pid: int, field: str = "VmRSS") -> int:
    """Bytes of a process's resident memory (``/proc/PID/status``: VmRSS, or a part of it such
    as RssShmem, the shared-memory rings' pages it has touched)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return -1


def _gpu_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=10).stdout
        return float(sum(float(x) for x in out.split()))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _metrics(port: int, token: str | None) -> dict[str, float]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(req, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(("codecd_streams_active ", "codecd_connections_active ")):
                    k, v = line.split()
                    out[k] = float(v)
    return out


def spawn(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    env = server_env()
    cmd = [sys.executable, "-m", "codecd.cli", "serve", "--listen", f"127.0.0.1:{port}",
           "--model", f"{args.model}={args.spawn}", "--log-level", "warning", *args.serve_arg]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(args.log, "wb"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"codecd serve exited {proc.returncode}; see {args.log}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("codecd serve did not get ready in time")


# ------------------------------------------------------------------ the client side


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    def bad(self, what: str) -> None:
        self.outcomes["UNEXPECTED"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(what)


class Soak:
    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.args = args
        self.port = port
        self.url = f"ws://127.0.0.1:{port}/"
        self.tally = Tally()
        self.rng = np.random.default_rng(args.seed)
        self.stop = asyncio.Event()
        self.serial = 0
        self.busy = False  # the last start was refused: back off a little

    def ids(self, seconds: float) -> np.ndarray:
        groups = max(1, int(seconds * 24000 / 2048))
        codes = self.rng.integers(0, 4096, size=groups * GROUP)
        return BASE + codes + (np.arange(codes.size) % GROUP) * 4096

    async def open(self, **kw: object) -> object:
        hdrs = {"Authorization": f"Bearer {self.args.token}"} if self.args.token else {}
        ws = await connect(self.url, additional_headers=hdrs, compression=None, max_size=None,
                           open_timeout=10, **kw)  # type: ignore[arg-type]
        await ws.recv()
        return ws

    def sid(self) -> str:
        self.serial += 1
        return f"s{self.serial}"

    async def finisher(self, slow: bool = False) -> None:
        ws = await self.open(max_queue=1) if slow else await self.open()
        sid = self.sid()
        ids = self.ids(random.uniform(0.5, 3.0))
        await ws.send(json.dumps({"type": "start", "stream_id": sid, "model": self.args.model,
                                  "layout": "orpheus_ids"}))
        samples = 0
        speed = self.args.speed

        async def feed() -> None:
            for i in range(0, ids.size, GROUP * 4):
                await ws.send(encode_token_frame(sid, ids[i:i + GROUP * 4]))
                if not slow:
                    await asyncio.sleep(4 * 2048 / 24000 / speed)
            await ws.send(json.dumps({"type": "end", "stream_id": sid}))

        feeder = asyncio.create_task(feed())
        try:
            while True:
                m = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(m, bytes):
                    n = len(parse_audio(m).data) // 2
                    samples += n
                    if slow:
                        await asyncio.sleep(n / 24000 / 0.5)
                    continue
                d = json.loads(m)
                if d["type"] == "started":
                    continue
                if d["type"] == "done":
                    want = ids.size // GROUP * 2048
                    if d["samples"] != want or samples != want:
                        self.tally.bad(f"{sid}: done with {samples}/{d['samples']} of {want}")
                    self.tally.outcomes["slow_done" if slow else "done"] += 1
                elif d["type"] == "error" and d.get("code") in ("engine_error", "busy"):
                    self.tally.outcomes[d["code"]] += 1
                    self.busy = d["code"] == "busy"
                else:
                    self.tally.bad(f"{sid}: {d}")
                break
        finally:
            feeder.cancel()
            with contextlib.suppress(BaseException):
                await feeder
            await ws.close()

    async def canceller(self, disconnect: bool) -> None:
        ws = await self.open()
        sid = self.sid()
        ids = self.ids(2.0)
        await ws.send(json.dumps({"type": "start", "stream_id": sid, "model": self.args.model,
                                  "layout": "orpheus_ids"}))
        await ws.send(encode_token_frame(sid, ids[: ids.size // 2 // GROUP * GROUP]))
        await asyncio.sleep(random.uniform(0.05, 0.5))
        if disconnect:
            ws.transport.abort()
            self.tally.outcomes["disconnected"] += 1
            return
        await ws.send(json.dumps({"type": "cancel", "stream_id": sid}))
        while True:
            m = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(m, bytes):
                continue
            d = json.loads(m)
            if d["type"] == "cancelled":
                self.tally.outcomes["cancelled"] += 1
                break
            if d["type"] == "error":
                if d.get("code") in ("engine_error", "busy"):
                    self.tally.outcomes[d["code"]] += 1
                    self.busy = d["code"] == "busy"
                else:
                    self.tally.bad(f"{sid}: {d}")
                break
        await ws.close()

    async def hostile(self) -> None:
        kind = random.choice(["json", "huge", "binary", "header"])
        if kind == "header":
            r, w = await asyncio.open_connection("127.0.0.1", self.port)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n\r\n")
            data = await asyncio.wait_for(r.read(), 10)
            w.close()
            ok = data.startswith(b"HTTP/1.1 400")
            self.tally.outcomes["bad_header_400"] += ok
            if not ok:
                self.tally.bad(f"duplicate header: {data[:60]!r}")
            return
        ws = await self.open()
        want = "bad_json"
        if kind == "json":
            await ws.send("{not json")
        elif kind == "huge":
            await ws.send(json.dumps({"type": "start", "stream_id": "h", "model": self.args.model,
                                      "layout": "orpheus_ids"}))
            await ws.send('{"type":"tokens","stream_id":"h","tokens":[%s]}' % ("9" * 5000))
            want = "token_range"
        else:
            await ws.send(b"\x01\xff")
            want = "bad_binary"
        try:
            while True:
                m = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(m, str):
                    d = json.loads(m)
                    if d["type"] == "error":
                        if d["code"] == want:
                            self.tally.outcomes[want] += 1
                        elif d["code"] == "busy":  # the worker is restarting
                            self.tally.outcomes["busy"] += 1
                            self.busy = True
                        else:
                            self.tally.bad(f"{kind}: {d}")
                        break
        except ConnectionClosed:
            self.tally.bad(f"{kind}: closed without an error")
        await ws.close()

    async def loop(self, job: str) -> None:
        while not self.stop.is_set():
            if self.busy:
                self.busy = False
                await asyncio.sleep(0.25)
            try:
                if job == "finisher":
                    await self.finisher()
                elif job == "slow":
                    await self.finisher(slow=True)
                elif job == "cancel":
                    await self.canceller(disconnect=False)
                elif job == "disconnect":
                    await self.canceller(disconnect=True)
                else:
                    await asyncio.sleep(random.uniform(0.5, 2.0))
                    await self.hostile()
            except InvalidStatus as e:
                # 503 while a worker restarts (readiness is off): expected, retried
                if e.response.status_code == 503:
                    self.tally.outcomes["refused_503"] += 1
                else:
                    self.tally.bad(f"{job}: {e}")
                await asyncio.sleep(0.25)
            except (ConnectionClosed, OSError, asyncio.TimeoutError) as e:
                self.tally.bad(f"{job}: {type(e).__name__}: {e}")
                await asyncio.sleep(0.5)
            except Exception as e:  # a bug of the soak or a surprise: counted, never silent
                self.tally.bad(f"{job}: {type(e).__name__}: {e}")
                await asyncio.sleep(0.5)


async def soak(args: argparse.Namespace, port: int, pid: int) -> int:
    s = Soak(args, port)
    jobs = (["finisher"] * args.finishers + ["slow"] * args.slow + ["cancel", "disconnect"]
            + ["hostile"])
    def fds() -> int:  # the connections' descriptors live in the fronts
        return _fds(pid) + sum(_fds(p) for p in _roles(pid)["front"])

    idle_fds = fds()
    print(f"soak: {args.minutes:g} min against pid {pid} on port {port}; jobs {jobs}; the "
          f"machine may be shared", flush=True)
    print("| min | main + fronts RSS MiB | of it private MiB | workers RSS MiB | "
          "fds (main + fronts) | GPU MiB | streams | conns | outcomes |")
    print("|---|---|---|---|---|---|---|---|---|")
    tasks = [asyncio.create_task(s.loop(j)) for j in jobs]
    t0 = time.monotonic()
    next_kill = t0 + args.kill_every * 60
    rows: list[tuple[float, int]] = []
    kills = 0

    def report(label: str) -> int:
        roles = _roles(pid)
        procs = [pid, *roles["front"]]  # connections live in fronts
        rss = sum(_rss(p) for p in procs)
        # the rings to the workers: their pages count once touched, up to the rings' size,
        # and a restarted worker's rings are new ones; not what a leak would grow
        shm = sum(_rss(p, "RssShmem") for p in procs)
        wrss = sum(_rss(p) for p in roles["worker"])
        m = _metrics(port, args.metrics_token or args.token)
        gpu = _gpu_mib()
        out = ", ".join(f"{k} {v}" for k, v in sorted(s.tally.outcomes.items()))
        print(f"| {label} | {rss / 2**20:.1f} | {(rss - shm) / 2**20:.1f} | "
              f"{wrss / 2**20:.1f} | {fds()} | "
              f"{'-' if gpu is None else f'{gpu:.0f}'} | "
              f"{m.get('codecd_streams_active', -1):.0f} | "
              f"{m.get('codecd_connections_active', -1):.0f} | {out}; kills {kills} |",
              flush=True)
        return rss - shm

    end = t0 + args.minutes * 60
    next_report = t0 + args.report_every
    while time.monotonic() < end:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        if args.kill_every > 0 and now >= next_kill:
            workers = _roles(pid)["worker"]
            if workers:
                with contextlib.suppress(OSError):
                    os.kill(workers[0], signal.SIGKILL)
                kills += 1
            next_kill = now + args.kill_every * 60
        if now >= next_report:
            rows.append((now - t0, report(f"{(now - t0) / 60:.1f}")))
            next_report += args.report_every
    s.stop.set()
    await asyncio.wait(tasks, timeout=90)
    for t in tasks:
        t.cancel()
    await asyncio.sleep(3.0)  # let the server see the last connections go
    final_rss = report("end")
    m = _metrics(port, args.metrics_token or args.token)
    fails = []
    if m.get("codecd_streams_active", -1) != 0 or m.get("codecd_connections_active", -1) != 0:
        fails.append(f"streams/connections not back to zero: {m}")
    if fds() > idle_fds + 2:
        fails.append(f"file descriptors {fds()} (idle {idle_fds})")
    if rows and final_rss > rows[0][1] * 1.10:
        fails.append(f"main + fronts private RSS {final_rss / 2**20:.1f} MiB > 110 % of "
                     f"{rows[0][1] / 2**20:.1f} MiB after the first period")
    if s.tally.unexpected:
        fails.append("unexpected outcomes: " + "; ".join(s.tally.unexpected))
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("OK: flat memory and descriptors, no stream left, no unexpected outcome")
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--spawn", metavar="SOURCE", help="start codecd serve with this model source")
    g.add_argument("--url", help="a running server, ws://127.0.0.1:PORT (needs --server-pid)")
    ap.add_argument("--server-pid", type=int, help="with --url: the daemon's pid")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--report-every", type=float, default=60.0, help="seconds")
    ap.add_argument("--kill-every", type=float, default=5.0, help="minutes (0: never)")
    ap.add_argument("--finishers", type=int, default=4)
    ap.add_argument("--slow", type=int, default=2)
    ap.add_argument("--speed", type=float, default=2.0, help="token rate of finishers, x real time")
    ap.add_argument("--token", default=os.environ.get("CODECD_TOKEN"))
    ap.add_argument("--metrics-token", default=os.environ.get("CODECD_METRICS_TOKEN"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default="/tmp/codecd-soak.log", help="the spawned server's stderr")
    args = ap.parse_args()
    random.seed(args.seed)
    proc = None
    if args.spawn:
        proc, port = spawn(args)
        pid = proc.pid
    else:
        if args.server_pid is None:
            ap.error("--url needs --server-pid")
        port = int(args.url.rsplit(":", 1)[1].strip("/"))
        pid = args.server_pid
    try:
        return asyncio.run(soak(args, port, pid))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
