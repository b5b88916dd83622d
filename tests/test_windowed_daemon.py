"""WavTokenizer, NeuCodec and XCodec2 through the daemon: windowed streams on a real server.

Small random-weight models (codecd.convert.random_vocos, through the real
converters; no reference package needed). Each codec serves 10 concurrent
streams over one websocket on 127.0.0.1, in the LM token layouts and in
``levels``; every stream's s16 output must equal, byte for byte, the s16 of the
windowed decode (codecd.families.windowed.windowed_decode) done offline with
codecrt.Context.decode on the same codes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip
from serverkit import Client

pytest.importorskip("websockets")
pytest.importorskip("gguf")

from codecd.audio import f32_to_s16le  # noqa: E402
from codecd.config import Config, ModelSource  # noqa: E402
from codecd.convert.random_vocos import write_random_vocos  # noqa: E402
from codecd.families.lmtokens import LLASA_SPEECH_END, LLASA_SPEECH_START, LLASA_TOKEN_OFFSET  # noqa: E402
from codecd.families.windowed import DEFAULT_WINDOW, LOW_WINDOW, WindowParams, windowed_decode  # noqa: E402
from codecd.server import Server  # noqa: E402

#: name -> (random_vocos kind, codebook size, LM layout)
CODECS = {"wt": ("wavtokenizer-75", 4096, "outetts_wavtokenizer"),
          "neu": ("neucodec", 65536, "neutts"),
          "xc": ("xcodec2", 65536, "llasa")}
N_STREAMS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    codecrt_or_skip()
    root = tmp_path_factory.mktemp("windowed")
    return {name: write_random_vocos(kind, root / f"{name}.gguf", seed=7, small=True)
            for name, (kind, _, _) in CODECS.items()}


@contextlib.asynccontextmanager
async def serving(models: dict[str, Path], names: list[str],
                  voices_dir: Path | None = None) -> AsyncIterator[Server]:
    cfg = Config(listen="127.0.0.1:0", models=[ModelSource(n, str(models[n])) for n in names],
                 devices=["cpu"], threads=2, max_ahead_s=0.0, send_timeout_s=10.0,
                 drain_timeout_s=2.0, **({"voices_dir": str(voices_dir)} if voices_dir else {}))
    assert not cfg.validate()
    srv = Server(cfg, {n: str(models[n]) for n in names},
                 engine_overrides={"start_timeout_s": 120.0})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def offline_windowed(path: Path, codes: np.ndarray, params: WindowParams,
                     n_prefix: int = 0) -> np.ndarray:
    import codecrt

    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu", n_threads=2) as ctx:
        return windowed_decode(lambda c: ctx.decode([c]), codes, m.info.hop_length, params,
                               n_prefix=n_prefix)


def test_ten_streams_per_codec_equal_the_offline_windowed_decode(models: dict[str, Path]) -> None:
    """10 concurrent streams of each codec, sent in uneven pieces and interleaved, some "low"
    latency, some in the LM layout, some in levels: s16 equal to the offline windowed decode."""
    rng = np.random.default_rng(11)
    plan: dict[str, tuple[str, np.ndarray, str, str]] = {}  # sid -> (model, codes, layout, latency)
    for name, (_, cb, lm_layout) in CODECS.items():
        for i in range(N_STREAMS):
            n = int(rng.integers(1, 140))
            layout = lm_layout if i % 2 == 0 else "levels"
            plan[f"{name}{i}"] = (name, rng.integers(0, cb, n).astype(np.int32), layout,
                                  "low" if i % 3 == 2 else "exact")

    async def one_codec(port: int, name: str) -> dict[str, tuple[bytes, dict[str, Any]]]:
        # one connection per codec (a connection holds at most 16 streams)
        mine = {sid: v for sid, v in plan.items() if v[0] == name}
        c = await Client.open(port)
        for sid, (_, _, layout, latency) in mine.items():
            await c.send({"type": "start", "stream_id": sid, "model": name, "layout": layout,
                          "format": "pcm_s16le", "latency": latency})
        pos = dict.fromkeys(mine, 0)
        while any(pos[s] < mine[s][1].size for s in mine):
            for sid, (_, codes, layout, _) in mine.items():
                a = pos[sid]
                if a >= codes.size:
                    continue
                b = min(codes.size, a + int(rng.integers(1, 40)))
                part = codes[a:b].tolist()
                msg: dict[str, Any] = {"type": "tokens", "stream_id": sid}
                msg.update({"levels": [part]} if layout == "levels" else {"tokens": part})
                await c.send(msg)
                pos[sid] = b
                if b == codes.size:
                    await c.send({"type": "end", "stream_id": sid})
            await asyncio.sleep(0)
        out = {}
        for sid in mine:
            t = await c.terminal(sid, 240)
            assert t["type"] == "done", (sid, t)
            started = next(m for m in c.rec(sid)["msgs"] if m["type"] == "started")
            out[sid] = (bytes(c.rec(sid)["audio"]), started)
        assert c.ws.close_code is None
        await c.close()
        return out

    async def main() -> dict[str, bytes]:
        async with serving(models, list(CODECS)) as srv:
            c = await Client.open(srv.port)
            specs = {m["name"]: m for m in c.hello["models"]}
            await c.close()
            assert specs["wt"]["layouts"] == ["outetts_wavtokenizer", "levels"]
            assert specs["neu"]["layouts"] == ["neutts", "levels"]
            assert specs["xc"]["layouts"] == ["llasa_ids", "llasa", "levels"]
            parts = await asyncio.gather(*(one_codec(srv.port, n) for n in CODECS))
            stats = await srv.pool.fetch_stats()
            (w,) = stats["workers"]
            for name in CODECS:
                ws = w["worker"]["models"][name]
                assert ws["streams_done"] == N_STREAMS and ws["streams_open"] == 0
                assert ws["max_batch_seen"] >= 2  # windows of several streams in one decode
        out = {}
        for part in parts:
            for sid, (audio, started) in part.items():
                name, _, _, latency = plan[sid]
                p = LOW_WINDOW if latency == "low" else DEFAULT_WINDOW
                hop = {"wt": 320, "neu": 480, "xc": 320}[name]
                assert started["latency"] == latency
                assert started["latency_samples"] == p.latency_frames * hop, started
                out[sid] = audio
        return out

    got = asyncio.run(main())
    for sid, (name, codes, _, latency) in plan.items():
        p = LOW_WINDOW if latency == "low" else DEFAULT_WINDOW
        want = f32_to_s16le(offline_windowed(models[name], codes, p))
        assert got[sid] == want, (sid, len(got[sid]), len(want))


def test_llasa_ids_and_range_errors(models: dict[str, Path]) -> None:
    """llasa_ids: the start id is dropped, the end id ends the stream; codes outside the
    layout's range (OuteTTS' <|4096|>, an id that is no speech token) are token_range errors."""
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 65536, 37).astype(np.int32)
    ids = [LLASA_SPEECH_START, *(codes + LLASA_TOKEN_OFFSET).tolist(), LLASA_SPEECH_END]

    async def main() -> bytes:
        async with serving(models, ["wt", "xc"]) as srv:
            c = await Client.open(srv.port)
            await c.send({"type": "start", "stream_id": "ids", "model": "xc", "layout": "llasa_ids",
                          "format": "pcm_s16le"})
            await c.send({"type": "tokens", "stream_id": "ids", "tokens": ids[:10]})
            await c.send({"type": "tokens", "stream_id": "ids", "tokens": ids[10:]})
            await c.send({"type": "start", "stream_id": "bad", "model": "xc", "layout": "llasa_ids"})
            await c.send({"type": "tokens", "stream_id": "bad", "tokens": [LLASA_SPEECH_START, 5]})
            await c.send({"type": "start", "stream_id": "o", "model": "wt",
                          "layout": "outetts_wavtokenizer"})
            await c.send({"type": "tokens", "stream_id": "o", "tokens": [1, 2, 4096]})
            await c.send({"type": "start", "stream_id": "nl", "model": "wt", "layout": "neutts"})
            for sid, code in (("bad", "token_range"), ("o", "token_range"), ("nl", "bad_layout")):
                t = await c.terminal(sid, 60)
                assert t["type"] == "error" and t["code"] == code, (sid, t)
            t = await c.terminal("ids", 120)
            assert t["type"] == "done" and t["samples"] == codes.size * 320, t
            audio = bytes(c.rec("ids")["audio"])
            await c.close()
            return audio

    got = asyncio.run(main())
    assert got == f32_to_s16le(offline_windowed(models["xc"], codes, DEFAULT_WINDOW))


def test_prompt_codes_voice_leads_the_stream(models: dict[str, Path], tmp_path: Path) -> None:
    """A NeuCodec voice of prompt codes (NeuTTS' reference codes): the stream decodes them as
    left context and outputs only its own codes, as NeuTTS' loop does; an XCodec2 voice is not
    offered on NeuCodec models; an unknown voice is refused."""
    from codecd.families.voices import prompt_codes_voice, write_voice

    rng = np.random.default_rng(9)
    prompt = rng.integers(0, 65536, 60).astype(np.int32)
    codes = rng.integers(0, 65536, 71).astype(np.int32)
    write_voice(prompt_codes_voice("ella", prompt, "neucodec"), tmp_path / "ella.voice.gguf")
    write_voice(prompt_codes_voice("llasa1", prompt[:9], "xcodec2"), tmp_path / "llasa1.voice.gguf")

    async def main() -> bytes:
        async with serving(models, ["neu"], voices_dir=tmp_path) as srv:
            c = await Client.open(srv.port)
            (spec,) = [m for m in c.hello["models"] if m["name"] == "neu"]
            assert spec["voices"] == ["ella"]
            await c.send({"type": "start", "stream_id": "v", "model": "neu", "layout": "neutts",
                          "voice": "ella"})
            await c.send({"type": "tokens", "stream_id": "v", "tokens": codes[:40].tolist()})
            await c.send({"type": "tokens", "stream_id": "v", "tokens": codes[40:].tolist()})
            await c.send({"type": "end", "stream_id": "v"})
            await c.send({"type": "start", "stream_id": "u", "model": "neu", "layout": "neutts",
                          "voice": "llasa1"})
            t = await c.terminal("u", 60)
            assert t["type"] == "error" and t["code"] == "unknown_voice", t
            t = await c.terminal("v", 120)
            assert t["type"] == "done" and t["samples"] == codes.size * 480, t
            audio = bytes(c.rec("v")["audio"])
            await c.close()
            return audio

    got = asyncio.run(main())
    want = offline_windowed(models["neu"], np.concatenate([prompt, codes]), DEFAULT_WINDOW,
                            n_prefix=prompt.size)
    assert got == f32_to_s16le(want)
