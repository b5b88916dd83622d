"""``mark`` on the websocket protocol: answered with the sample offset of the audio of every
complete frame sent before it, once that audio has been sent; real server, real sockets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import load_layouts
from smallmodel import small_codes
from serverkit import running, start_msg

pytest.importorskip("websockets")

from websockets.asyncio.client import connect  # noqa: E402

from codecd.protocol import encode_token_frame, parse_audio  # noqa: E402

L = load_layouts()
PER_GROUP = 16  # the small model: 4 frames of hop 4 per 7-token group


class Recorder:
    """Everything the server sends, in arrival order, with per-stream audio sample counts."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.samples: dict[str, int] = {}
        self.log: list[tuple[str, Any]] = []  # ("audio", (sid, offset, n)) | ("text", dict)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for m in self.ws:
            if isinstance(m, bytes):
                f = parse_audio(m)
                n = len(f.data) // 2
                assert f.sample_offset == self.samples.get(f.stream_id, 0)
                self.samples[f.stream_id] = f.sample_offset + n
                self.log.append(("audio", (f.stream_id, f.sample_offset, n)))
            else:
                d = json.loads(m)
                if d["type"] == "mark":
                    # answered only once its audio has all been sent (and so received)
                    assert self.samples.get(d["stream_id"], 0) >= d["sample_offset"], d
                self.log.append(("text", d))

    def texts(self, sid: str) -> list[dict[str, Any]]:
        return [d for k, d in self.log if k == "text" and d.get("stream_id") == sid]

    async def until(self, cond: Any, timeout: float = 15.0) -> None:
        async def wait() -> None:
            while not cond():
                await asyncio.sleep(0.01)
        await asyncio.wait_for(wait(), timeout)


def ids_for(n_groups: int, rng: np.random.Generator) -> np.ndarray:
    return L.codes_to_orpheus_ids(L.levels_to_orpheus(small_codes(4 * n_groups, rng)))


def test_marks_offsets_concurrent_streams_resampled_and_cancel(small: Path) -> None:
    async def main() -> None:
        async with running(small, gather_ms=5.0) as srv:
            ws = await connect(f"ws://127.0.0.1:{srv.port}/", max_size=None)
            json.loads(await ws.recv())  # hello
            rec = Recorder(ws)
            rng = np.random.default_rng(7)
            want: dict[str, list[tuple[Any, int]]] = {}
            plans = {f"s{i}": (ids_for(int(rng.integers(30, 90)), rng), 24000) for i in range(4)}
            plans["r16"] = (ids_for(60, rng), 16000)
            for sid, (_, rate) in plans.items():
                await ws.send(json.dumps(start_msg(sid, sample_rate=rate)))

            async def feed(sid: str, ids: np.ndarray, rate: int) -> None:
                marks: list[tuple[Any, int]] = []
                pos = 0
                k = 0
                while pos < ids.size:
                    n = int(rng.integers(1, 60))  # cuts mid-group too
                    await ws.send(encode_token_frame(sid, ids[pos:pos + n]))
                    pos = min(ids.size, pos + n)
                    if rng.random() < 0.5:
                        mid: Any = k if k % 2 else f"m{k}"
                        k += 1
                        await ws.send(json.dumps({"type": "mark", "stream_id": sid, "id": mid}))
                        marks.append((mid, (pos // 7) * PER_GROUP * rate // 24000))
                    await asyncio.sleep(0.002)
                await ws.send(json.dumps({"type": "mark", "stream_id": sid, "id": "last"}))
                marks.append(("last", (ids.size // 7) * PER_GROUP * rate // 24000))
                await ws.send(json.dumps({"type": "end", "stream_id": sid}))
                want[sid] = marks

            await asyncio.gather(*(feed(sid, ids, rate) for sid, (ids, rate) in plans.items()))
            await rec.until(lambda: all(rec.texts(s) and rec.texts(s)[-1]["type"] == "done"
                                        for s in plans))
            for sid in plans:
                msgs = rec.texts(sid)
                assert msgs[0]["type"] == "started" and msgs[-1]["type"] == "done"
                got = [(d["id"], d["sample_offset"]) for d in msgs if d["type"] == "mark"]
                assert got == want[sid], sid
                assert got[-1][1] == rec.samples[sid] == msgs[-1]["samples"]

            # cancel: answered marks are right, pending ones are dropped, later ones ignored
            ids = ids_for(200, rng)
            await ws.send(json.dumps(start_msg("c")))
            await ws.send(encode_token_frame("c", ids[:7 * 100]))
            await ws.send(json.dumps({"type": "mark", "stream_id": "c", "id": 1}))
            await ws.send(encode_token_frame("c", ids[7 * 100:]))
            await ws.send(json.dumps({"type": "mark", "stream_id": "c", "id": 2}))
            await ws.send(json.dumps({"type": "cancel", "stream_id": "c"}))
            await ws.send(json.dumps({"type": "mark", "stream_id": "c", "id": 3}))
            await rec.until(lambda: any(d["type"] == "cancelled" for d in rec.texts("c")))
            await asyncio.sleep(0.2)
            msgs = rec.texts("c")
            assert msgs[-1]["type"] == "cancelled"
            for d in msgs:
                if d["type"] == "mark":
                    assert (d["id"], d["sample_offset"]) in ((1, 100 * PER_GROUP),
                                                             (2, 200 * PER_GROUP))

            # a bad id fails that stream only
            await ws.send(json.dumps(start_msg("b")))
            await ws.send(json.dumps({"type": "mark", "stream_id": "b", "id": [1]}))
            await rec.until(lambda: any(d["type"] == "error" for d in rec.texts("b")))
            assert rec.texts("b")[-1]["code"] == "bad_message"
            await ws.close()
            await rec.task
    asyncio.run(main())
