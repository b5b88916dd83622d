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

from conftest import codecrt_or_skip, load_layouts
from smallmodel import small_codes, write_small_snac

pytest.importorskip("gguf")
pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")

from websockets.asyncio.client import connect  # noqa: E402

from codecd.protocol import encode_token_frame, parse_audio  # noqa: E402
from test_server import (  # noqa: E402
    SR,
    Client,
    assert_same_audio,
    expected,
    running,
    send_stream,
    start_msg,
)

LAYOUTS = load_layouts()


@pytest.fixture(scope="module")
def codecrt() -> Any:
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, codecrt: Any) -> Path:
    return write_small_snac(tmp_path_factory.mktemp("hostile") / "small.gguf", seed=5)


@pytest.fixture(scope="module")
def offline(codecrt: Any, small: Path) -> Any:
    model = codecrt.Model(small)
    ctx = codecrt.Context(model, device="cpu", n_threads=1, max_frames=1 << 14)

    def decode(levels: list[np.ndarray]) -> np.ndarray:
        return ctx.decode(levels).copy()

    yield decode
    ctx.close()
    model.close()


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


@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_slow_steady_reader_is_held_to_the_output_budget(small: Path, offline: Any,
                                                         budget: float) -> None:
    """A client reading at half real time: with an output budget the audio queued for it
    stays within the budget and it gets all its audio, exact; another connection's stream
    finishes at full speed. Without one (control), the queue grows to most of the stream."""
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
            slow = asyncio.create_task(slow_reader(srv.port, "slow", toks, speed=0.5))
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
                assert t_other < 2.0, t_other
            else:
                assert peak[0] > 1.2, peak[0]
            assert elapsed > 3.0, elapsed  # it did read at half speed
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

