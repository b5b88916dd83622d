"""The websockets layer under a front: server CPU per frame, by event loop and send pattern.

``python -m bench frames [--frames 40000] [--batch 8] [--repeat 2]``

A front's work per message is the websocket layer's (frame parsing, framing, the event loop's
callbacks and transports) plus codecd's own (the session, the wire). This suite measures the
first alone on loopback: a client process receives ``--frames`` 4 KiB binary frames (a tick's
audio for one stream) while it sends as many 40-byte ones (a frame of Orpheus ids), and the
server's process CPU per frame pair is timed, for each event loop (asyncio's, uvloop's where
installed: the ``fast`` extra) and each way of sending (``wait_for`` around every send, as the
server's writer did, or the frames queued together under one timeout re-armed per frame, as
``codecd.server`` sends them now). The rows are what ``codecd[fast]`` and the writer save a
front per message; docs/server.md cites them.

``python -m bench frames --paced 64 [--streams 8] [--seconds 8]``: the traffic of a front
instead of one saturated connection: ``--paced`` connections of ``--streams`` streams each,
every stream sending one 40-byte frame per frame period (85.3 ms, at its own phase) and the
server answering each with a 4 KiB frame at its next tick (one tick a period, as the worker's
AUDIO record arrives), the client in another process on the other CPU. The server's CPU per
frame pair, for each way a connection can take its frames: websockets' handler and a writer
task sending each frame with ``send()`` (codecd before ``codecd.connection``), and
:class:`codecd.connection.SessionConnection` (binary frames into the session from
``data_received``, a tick's frames written at once).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import sys
import time
from typing import Any

OUT = os.urandom(4096)
IN = os.urandom(40)


def _client(port: int, n: int, batch: int) -> None:
    from websockets.asyncio.client import connect

    async def main() -> None:
        async with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
            async def rx() -> None:
                for _ in range(n):
                    await ws.recv()

            async def tx() -> None:
                for i in range(n):
                    await ws.send(IN)
                    if i % batch == 0:
                        await asyncio.sleep(0)

            await asyncio.gather(rx(), tx())

    asyncio.run(main())


async def _serve_once(n: int, batch: int, pattern: str) -> tuple[float, float]:
    from websockets.asyncio.server import serve

    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()

    async def handler(ws: Any) -> None:
        async def writer() -> None:
            for start in range(0, n, batch):
                k = min(batch, n - start)  # exactly n in all: the client stops reading there
                if pattern == "wait_for":
                    for _ in range(k):
                        await asyncio.wait_for(ws.send(OUT), 10.0)
                else:
                    async with asyncio.timeout(None) as deadline:
                        for _ in range(k):
                            deadline.reschedule(loop.time() + 10.0)
                            await ws.send(OUT)
                await asyncio.sleep(0)

        async def reader() -> None:
            got = 0
            async for _ in ws:
                got += 1
                if got == n:
                    return

        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(writer(), reader())
        done.set_result((time.process_time() - c0, time.perf_counter() - t0))

    async with serve(handler, "127.0.0.1", 0, compression=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        p = mp.get_context("spawn").Process(target=_client, args=(port, n, batch))
        p.start()
        cpu, wall = await done
        await loop.run_in_executor(None, p.join)
    return cpu, wall


PERIOD_S = 0.0853333  # SNAC 24 kHz's frame period: one message each way per stream


def _paced_client(port: int, conns: int, streams: int, seconds: float, cpu: int | None,
                  counts: Any) -> None:
    """``counts`` (a shared array): frames sent, frames received, when done."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import random

    from websockets.asyncio.client import connect

    async def one(t0: float, got: list[int], sent: list[int]) -> None:
        async with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
            async def rx() -> None:
                async for _ in ws:
                    got[0] += 1

            reader = asyncio.create_task(rx())
            phases = sorted(random.random() * PERIOD_S for _ in range(streams))
            k = 0
            while k * PERIOD_S < seconds:
                for ph in phases:
                    d = t0 + k * PERIOD_S + ph - time.monotonic()
                    if d > 0:
                        await asyncio.sleep(d)
                    await ws.send(IN)
                    sent[0] += 1
                k += 1
            # the last ticks' answers: every connection's, up to 10 s (a loaded machine's
            # server may run late; a lost frame still shows as got < sent)
            until = time.monotonic() + 10.0
            while got[0] < sent[0] and time.monotonic() < until:
                await asyncio.sleep(0.05)
            reader.cancel()

    async def main() -> None:
        got, sent = [0], [0]
        t0 = time.monotonic() + 0.5
        await asyncio.gather(*(one(t0, got, sent) for _ in range(conns)))
        counts[0], counts[1] = sent[0], got[0]

    _run_loop(main())


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _serve_paced(way: str, conns: int, streams: int, seconds: float,
                       cpus: tuple[int, int] | None) -> tuple[float, float, int, int]:
    """Server CPU s per frame pair and pairs a second over the middle of the run; the frames
    the client sent and received over the whole run."""
    import collections

    from websockets.asyncio.server import serve

    from codecd.connection import SessionConnection

    loop = asyncio.get_running_loop()
    live: dict[Any, list[int]] = {}  # connection -> [frames to answer at the next tick]
    outq: dict[Any, asyncio.Queue[bytes]] = {}
    pairs = [0]

    async def writer(ws: Any) -> None:
        q = outq[ws]
        todo: collections.deque[bytes] = collections.deque()
        while True:
            todo.append(await q.get())
            while not q.empty():
                todo.append(q.get_nowait())
            if way == "direct":  # as codecd.server's writer: what the buffer takes at once
                n = ws.send_now(list(todo))
                pairs[0] += n
                for _ in range(n):
                    todo.popleft()
            async with asyncio.timeout(None) as deadline:
                if way == "direct" and ws.paused:
                    deadline.reschedule(loop.time() + 10.0)
                    await ws.drain()
                while todo:
                    deadline.reschedule(loop.time() + 10.0)
                    await ws.send(todo[0])
                    todo.popleft()
                    pairs[0] += 1

    async def handler(ws: Any) -> None:
        pending = live[ws] = [0]
        outq[ws] = asyncio.Queue()
        w = asyncio.create_task(writer(ws))
        try:
            if way == "direct":
                ws.take_binary(lambda data: pending.__setitem__(0, pending[0] + 1), lambda: True)
            async for _ in ws:
                if way == "direct":
                    ws.took()
                pending[0] += 1
        finally:
            del live[ws]
            w.cancel()

    async def ticker() -> None:
        while True:
            await asyncio.sleep(PERIOD_S)
            for ws, pending in list(live.items()):
                q = outq[ws]
                for _ in range(pending[0]):
                    q.put_nowait(OUT)
                pending[0] = 0

    kw: dict[str, Any] = dict(compression=None, max_size=1 << 20, max_queue=64,
                              write_limit=32768)
    if way == "direct":
        kw["create_connection"] = SessionConnection
    async with serve(handler, "127.0.0.1", 0, **kw) as srv:
        port = srv.sockets[0].getsockname()[1]
        ctx = mp.get_context("spawn")
        counts = ctx.Array("q", 2)
        p = ctx.Process(target=_paced_client, args=(port, conns, streams, seconds,
                                                    None if cpus is None else cpus[1], counts))
        p.start()
        t = asyncio.create_task(ticker())
        await asyncio.sleep(2.0)  # every connection up and paced
        c0, n0, w0 = time.process_time(), pairs[0], time.perf_counter()
        await asyncio.sleep(max(1.0, seconds - 2.5))
        c1, n1, w1 = time.process_time(), pairs[0], time.perf_counter()
        await loop.run_in_executor(None, p.join)
        t.cancel()
    n = max(1, n1 - n0)
    return (c1 - c0) / n, n / (w1 - w0), int(counts[0]), int(counts[1])


def _paced(args: argparse.Namespace) -> None:
    cpus = (0, 1) if len(os.sched_getaffinity(0)) >= 2 else None
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})
    rate = args.paced * args.streams / PERIOD_S
    print(f"{args.paced} connections x {args.streams} streams, a 40 B frame in and a 4 KiB frame "
          f"out per stream per {1e3 * PERIOD_S:.1f} ms ({rate:.0f} pairs a second), "
          f"{args.seconds:g} s a run; server and client on CPUs {cpus or 'any'}; the server "
          f"process's CPU per frame pair over the middle of each run, best of {args.repeat}, "
          f"the ways alternating\n")
    print("| event loop | connection | us CPU per frame pair | pairs/s |")
    print("|---|---|---:|---:|")
    loop = "uvloop" if "uvloop" in _loops() else "asyncio"
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for way in ("handler", "direct"):
            cpu, rate_got, sent, got = _run_loop(_serve_paced(way, args.paced, args.streams,
                                                              args.seconds, cpus))
            if got != sent:
                print(f"{way}: the client received {got} frames of the {sent} it was owed")
            if way not in best or cpu < best[way][0]:
                best[way] = (cpu, rate_got)
    names = {"handler": "websockets' handler, `send()` per frame",
             "direct": "`SessionConnection` (codecd.connection)"}
    for way in ("handler", "direct"):
        cpu, rate_got = best[way]
        print(f"| {loop} | {names[way]} | {1e6 * cpu:.1f} | {rate_got:.0f} |", flush=True)


def _loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench frames", description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=40000, help="frames each way per run")
    ap.add_argument("--batch", type=int, default=8, help="frames the server sends together "
                    "(a connection's streams in one tick)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per row (the best is kept)")
    ap.add_argument("--paced", type=int, default=0, metavar="CONNS",
                    help="a front's traffic over CONNS paced connections instead (docstring)")
    ap.add_argument("--streams", type=int, default=8, help="streams per paced connection")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per paced run")
    args = ap.parse_args()
    import websockets

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# websockets {websockets.__version__}, Python {platform.python_version()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs · {stamp} · "
          f"`{' '.join(sys.argv)}`")
    if args.paced:
        _paced(args)
        return 0
    print(f"{args.frames} frames of 4 KiB out and {args.frames} of 40 B in over loopback, "
          f"sent {args.batch} together; the server process's CPU per frame pair (best of "
          f"{args.repeat})\n")
    print("| event loop | send | us CPU per frame pair | wall s |")
    print("|---|---|---:|---:|")
    for name in _loops():
        for pattern in ("wait_for", "one timeout"):
            best = None
            for _ in range(args.repeat):
                if name == "uvloop":
                    import uvloop

                    run = uvloop.run
                else:
                    run = asyncio.run
                cpu, wall = run(_serve_once(args.frames, args.batch, pattern))
                if best is None or cpu < best[0]:
                    best = (cpu, wall)
            assert best is not None
            print(f"| {name} | {pattern} per {'frame' if pattern == 'wait_for' else 'batch'} | "
                  f"{1e6 * best[0] / args.frames:.1f} | {best[1]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
