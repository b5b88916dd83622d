"""An in-process codecd protocol server for client tests: websockets serving the real Session
state machine, with a synthetic engine that emits HOP samples of a sine per finest-level frame (so
sample counts are exact: 2048 per Orpheus group). Used by tests/daemon/test_client.py and
test_playback.py."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from codecd.actions import (
    Close, EngineCancel, EngineFinish, EngineOpen, EnginePush, SendBinary, SendText,
)
from codecd.families import ModelSpec
from codecd.session import Session, SessionLimits

HOP = 512
BASE = 128266


def orpheus_ids(n_groups: int, seed: int = 0) -> np.ndarray:
    codes = np.random.default_rng(seed).integers(0, 4096, size=7 * n_groups)
    return codes + BASE + (np.arange(codes.size) % 7) * 4096


# --------------------------------------------------------------- fake server


def _synth(key_serial: int, start: int, n: int) -> np.ndarray:
    t = np.arange(start, start + n, dtype=np.float64)
    return (0.25 * np.sin(2 * np.pi * (220 + 10 * key_serial) * t / 24000)).astype(np.float32)


class FakeServer:
    """websockets server running the real Session, with an engine that emits HOP samples of a
    sine per finest-level frame (so sample counts are exact: 2048 per Orpheus group)."""

    def __init__(self, max_streams: int = 8) -> None:
        self.spec = ModelSpec("fake", "snac", 24000, HOP, 3, (4096,) * 3, (4, 2, 1),
                              layouts=("orpheus_ids", "orpheus", "levels"))
        self.max_streams = max_streams
        self.open = 0
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        self._stop = asyncio.Event()
        async with serve(self._handler, "127.0.0.1", 0, max_size=2**20) as srv:
            port = srv.sockets[0].getsockname()[1]
            self.url = f"ws://127.0.0.1:{port}"
            self._ready.set()
            await self._stop.wait()

    def _admit(self) -> bool:
        if self.open >= self.max_streams:
            return False
        self.open += 1
        return True

    def _release(self) -> None:
        self.open -= 1

    async def _handler(self, ws) -> None:
        sess = Session({"fake": self.spec}, SessionLimits(), admit=self._admit,
                       release=self._release)
        pos: dict = {}

        async def run(actions) -> bool:
            queue = list(actions)
            while queue:
                a = queue.pop(0)
                if isinstance(a, SendText):
                    await ws.send(a.data)
                elif isinstance(a, SendBinary):
                    await ws.send(a.data)
                elif isinstance(a, Close):
                    await ws.close(a.code, a.reason)
                    return False
                elif isinstance(a, EngineOpen):  # this engine opens at once
                    pos[a.key] = 0
                    queue[:0] = sess.on_opened(a.key)
                elif isinstance(a, EnginePush):
                    n = int(a.levels[2].size) * HOP
                    if n:
                        pcm = _synth(a.key.serial, pos[a.key], n)
                        pos[a.key] += n
                        queue[:0] = sess.on_audio(a.key, pcm)
                elif isinstance(a, EngineFinish):
                    queue[:0] = sess.on_done(a.key, pos.pop(a.key, 0))
                elif isinstance(a, EngineCancel):
                    pos.pop(a.key, None)
            return True

        await run(sess.connect())
        try:
            async for data in ws:
                acts = (sess.receive_binary(data) if isinstance(data, bytes)
                        else sess.receive_text(data))
                if not await run(acts):
                    break
        finally:
            sess.connection_lost()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
