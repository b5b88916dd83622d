"""Two CPU engine workers in one daemon, through the whole daemon (issue 5).

``devices = ["cpu", "cpu"]``: one worker process per entry, each with ``threads``
threads. Streams are placed on the least-loaded worker; killing one worker
process fails only the streams it held (with an error naming the engine), while
the other worker's streams complete with correct audio on the same connection;
the supervisor then restarts the killed worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from smallmodel import small_codes
from serverkit import (
    SR,
    Client,
    assert_same_audio,
    expected,
    http_get,
    metric_value,
    metrics,
    running,
    send_stream,
    start_msg,
)

# float output: the subject is placement and isolation, not s16 rounding of batch-dependent GEMMs
FMT = "pcm_f32le"


def halves(levels: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The codes cut after half of the level-0 codes (whole groups on every level)."""
    k, n = len(levels[0]) // 2, len(levels[0])
    return [x[: k * len(x) // n] for x in levels], [x[k * len(x) // n:] for x in levels]


def per_worker(m: dict[str, list[Any]], name: str) -> list[float]:
    return [metric_value(m, name, worker=w) for w in ("0", "1")]


async def until_ready(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (await http_get(port, "/readyz"))[0] != 200:
        assert time.monotonic() < deadline, "not ready again after the worker restart"
        await asyncio.sleep(0.05)


def test_two_workers_spread_and_isolate_failures(small: Path, offline: Any) -> None:
    """Four streams go two per worker (both tick in /metrics); SIGKILL of one worker ends its two
    streams with engine_error, the other two finish exact, and the worker comes back."""
    async def main() -> None:
        rng = np.random.default_rng(31)
        async with running(small, devices=["cpu", "cpu"], threads=1) as srv:
            assert len(srv.pool.engines) == 2
            assert len({e.pid for e in srv.pool.engines}) == 2  # two processes
            c = await Client.open(srv.port)
            levels = {f"s{i}": small_codes(400, rng) for i in range(4)}
            for sid, lv in levels.items():
                await c.send(start_msg(sid, format=FMT))
                await send_stream(c, sid, halves(lv)[0], "orpheus_ids", rng, end=False)
            await c.until(lambda: all(len(c.rec(s)["audio"]) for s in levels), 15)
            assert [e.n_streams for e in srv.pool.engines] == [2, 2]
            m = await metrics(srv.port)
            assert per_worker(m, "codecd_worker_up") == [1, 1]
            assert all(t > 0 for t in per_worker(m, "codecd_ticks_total")), "a worker never ticked"

            os.kill(srv.pool.engines[0].pid, signal.SIGKILL)
            await c.until(lambda: sum(c.rec(s)["terminal"] is not None for s in levels) == 2, 10)
            on_victim = [s for s in levels if c.rec(s)["terminal"] is not None]
            for s in on_victim:
                t = c.rec(s)["terminal"]
                assert t["type"] == "error" and t["code"] == "engine_error", t
                assert t["message"], t
            survivors = [s for s in levels if s not in on_victim]
            # the survivors get the rest of their codes and finish with the right audio
            for sid in survivors:
                await send_stream(c, sid, halves(levels[sid])[1], "orpheus_ids", rng)
            for sid in survivors:
                t = await c.terminal(sid, 15)
                assert t["type"] == "done", t
                assert_same_audio(bytes(c.rec(sid)["audio"]),
                                  expected(offline, levels[sid], FMT, SR), FMT)
            assert c.ws.close_code is None and not c.conn_errors

            # the supervisor restarted the killed worker; new streams are served again
            await until_ready(srv.port)
            m = await metrics(srv.port)
            assert per_worker(m, "codecd_worker_restarts_total") == [1, 0]
            assert per_worker(m, "codecd_worker_up") == [1, 1]
            lv = small_codes(40, rng)
            await c.send(start_msg("after", format=FMT))
            await send_stream(c, "after", lv, "orpheus_ids", rng)
            t = await c.terminal("after", 15)
            assert t["type"] == "done", t
            assert_same_audio(bytes(c.rec("after")["audio"]), expected(offline, lv, FMT, SR), FMT)
            await c.close()
    asyncio.run(main())
