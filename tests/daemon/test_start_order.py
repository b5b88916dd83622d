"""The session owns the order of a start's answer: ``started`` once the engine has opened the
stream, a refusal or an engine error instead of it, never both."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip
from smallmodel import write_small_snac

from codecd.actions import EngineOpen, SendBinary, SendText
from codecd.families import ModelSpec
from codecd.session import Session

SNAC = ModelSpec("snac_24khz", "snac", 24000, 512, 3, (4096,) * 3, (4, 2, 1),
                 layouts=("orpheus_ids", "orpheus", "levels"), latency_samples=1536)


def _start(s: Session, sid: str = "a") -> Any:
    (open_,) = s.receive_text(json.dumps({"type": "start", "stream_id": sid, "model": "snac_24khz",
                                          "layout": "levels"}))
    assert isinstance(open_, EngineOpen)
    return open_.key


def _texts(acts: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in acts if isinstance(a, SendText)]


def test_started_waits_for_the_engine():
    """start -> EngineOpen only; started when the engine reports the stream open, once."""
    s = Session({"snac_24khz": SNAC})
    key = _start(s)
    (started,) = _texts(s.on_opened(key))
    assert started["type"] == "started" and started["latency_samples"] == 1536
    assert s.on_opened(key) == []


def test_an_engine_error_before_opened_is_the_only_answer():
    """The engine fails the stream before opening it: error, no started, nothing after."""
    s = Session({"snac_24khz": SNAC})
    key = _start(s)
    (err,) = _texts(s.on_engine_error(key, "engine_restarted", "the worker died"))
    assert (err["type"], err["code"], err["stream_id"]) == ("error", "engine_error", "a")
    assert err["message"].startswith("engine_restarted:")
    assert s.on_opened(key) == [] and s.on_audio(key, np.ones(4, np.float32)) == []


def test_audio_never_precedes_started():
    """Audio or done for a stream not reported open yet send started first."""
    s = Session({"snac_24khz": SNAC})
    key = _start(s)
    acts = s.on_audio(key, np.ones(4096, np.float32))
    assert isinstance(acts[0], SendText) and json.loads(acts[0].data)["type"] == "started"
    assert isinstance(acts[1], SendBinary)
    key = _start(s, "b")
    s.receive_text(json.dumps({"type": "end", "stream_id": "b"}))
    assert [m["type"] for m in _texts(s.on_done(key, 0))] == ["started", "done"]


def test_worker_dying_between_open_and_started_gives_one_answer(tmp_path: Path):
    """The old race, reproduced: the worker dies after the server queued the open and before it
    answered. The client gets the stream's error and never a started."""
    codecrt_or_skip()
    pytest.importorskip("gguf")
    from websockets.asyncio.client import connect

    from codecd.config import Config, ModelSource
    from codecd.server import Server

    small = write_small_snac(tmp_path / "small.gguf", seed=5)
    cfg = Config(listen="127.0.0.1:0", models=[ModelSource("small", str(small))], devices=["cpu"],
                 threads=1, max_ahead_s=0.0, send_timeout_s=2.0, drain_timeout_s=1.0)

    async def main() -> list[dict[str, Any]]:
        srv = Server(cfg, {"small": str(small)},
                     engine_overrides={"debug_commands": True, "start_timeout_s": 30.0,
                                       "warm_buckets": (1,)})
        await srv.start()
        try:
            engine = srv.pool.engines[0]
            async with connect(f"ws://127.0.0.1:{srv.port}") as ws:
                assert json.loads(await ws.recv())["type"] == "hello"
                engine._crash("hang")  # the worker stops reading: the open stays unanswered
                await ws.send(json.dumps({"type": "start", "stream_id": "s", "model": "small",
                                          "layout": "levels"}))
                with pytest.raises(asyncio.TimeoutError):  # no started while nothing opened it
                    await asyncio.wait_for(ws.recv(), 0.5)
                os.kill(engine.pid, signal.SIGKILL)
                got = [json.loads(await asyncio.wait_for(ws.recv(), 10.0))]
                try:  # and nothing more for the stream
                    got.append(json.loads(await asyncio.wait_for(ws.recv(), 0.5)))
                except asyncio.TimeoutError:
                    pass
                return got
        finally:
            await srv.close()

    got = asyncio.run(main())
    assert [(m["type"], m.get("code"), m.get("stream_id")) for m in got] == [
        ("error", "engine_error", "s")]
    assert got[0]["message"].startswith("engine_restarted:")
