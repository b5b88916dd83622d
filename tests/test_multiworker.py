"""Two CPU engine workers in one daemon, through the whole daemon (issue 5).

Streams are placed on the least-loaded worker; killing one worker process fails
only the streams it held (with an error naming the engine), while the other
worker's streams complete with correct audio, on the same connections.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

from smallmodel import small_codes
from test_server import (SR, Client, assert_same_audio, codecrt, expected, metric_value, metrics,  # noqa: F401
                         offline, running, send_stream, small, start_msg)


def test_two_workers_spread_and_isolate_failures(small: Path, offline: Any) -> None:
    async def main() -> None:
        rng = np.random.default_rng(31)
        async with running(small, devices=["cpu", "cpu"]) as srv:
            assert len(srv.pool.engines) == 2
            c = await Client.open(srv.port)
            # four open streams: two per worker
            levels = {f"s{i}": small_codes(400, rng) for i in range(4)}
            for sid, lv in levels.items():
                await c.send(start_msg(sid))
                await send_stream(c, sid, [x[: len(x) // 2] for x in lv], "orpheus_ids", rng, end=False)
            await c.until(lambda: all(len(c.rec(s)["audio"]) for s in levels), 15)
            assert [e.n_streams for e in srv.pool.engines] == [2, 2]
            m = await metrics(srv.port)
            assert metric_value(m, "codecd_worker_up") == 2
            os.kill(srv.pool.engines[0].pid, signal.SIGKILL)
            await c.until(lambda: sum(c.rec(s)["terminal"] is not None for s in levels) == 2, 10)
            on_victim = [s for s in levels if c.rec(s)["terminal"] is not None]
            assert len(on_victim) == 2
            for s in on_victim:
                t = c.rec(s)["terminal"]
                assert t["type"] == "error" and t["code"] == "engine_error", t
            # the survivors get the rest of their codes and finish with the right audio
            for sid, lv in levels.items():
                if sid in on_victim:
                    continue
                await send_stream(c, sid, [x[len(x) // 2:] for x in lv], "orpheus_ids", rng)
            for sid, lv in levels.items():
                if sid in on_victim:
                    continue
                t = await c.terminal(sid, 15)
                assert t["type"] == "done", t
                assert_same_audio(bytes(c.rec(sid)["audio"]), expected(offline, lv, "pcm_s16le", SR),
                                  "pcm_s16le")
            assert c.ws.close_code is None
            await c.close()
    asyncio.run(main())
