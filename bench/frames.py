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
    args = ap.parse_args()
    import websockets

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# websockets {websockets.__version__}, Python {platform.python_version()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs · {stamp} · "
          f"`{' '.join(sys.argv)}`")
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
