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


def test_per_stream_windows_equal_their_offline_windowed_decode(models: dict[str, Path]) -> None:
    """start.window: streams of one model with different windows (a preset by name, explicit
    frames, a preset with one field changed, one of the default's length so that both share a
    batched decode), sent interleaved on one connection, each equal in s16 to the offline
    windowed decode with its own window; bad windows get bad_window for their stream only, and
    the connection and the other streams go on."""
    rng = np.random.default_rng(21)
    good: dict[str, tuple[str, Any, str, WindowParams]] = {
        "d": ("neu", None, "exact", DEFAULT_WINDOW),
        "p": ("neu", "low", "exact", LOW_WINDOW),
        "e": ("neu", {"chunk": 20, "lookback": 55, "lookahead": 5, "overlap": 1}, "exact",
              WindowParams(20, 55, 5, 1)),  # 81 frames, as the default's windows
        "m": ("neu", {"preset": "low", "chunk": 6}, "exact", WindowParams(6, 25, 2, 1)),
        "l": ("wt", {"lookahead": 4}, "low", WindowParams(10, 25, 4, 1)),
        "z": ("wt", {"chunk": 30, "lookback": 0, "lookahead": 0, "overlap": 0}, "exact",
              WindowParams(30, 0, 0, 0)),
    }
    bad = {  # sid -> (model, window, what the error names)
        "b0": ("neu", {"chunk": 0}, "chunk >= 1"),
        "b1": ("neu", {"preset": "fast"}, "unknown preset"),
        "b2": ("neu", {"lookback": 250}, "more than 256"),
        "b3": ("neu", {"chunk": 2, "lookback": 50, "overlap": 0}, "more than 8 frames"),
        "b4": ("neu", {"overlap": 3}, "2 * overlap"),
        "b5": ("wt", {"chunk": "x"}, "integer"),
        "b6": ("wt", {"size": 3}, "unknown field"),
        "b7": ("wt", 7, "preset name or an object"),
        "b8": ("wt", {"chunk": -1}, "integer of frames"),
    }
    codes = {sid: rng.integers(0, 4096 if m == "wt" else 65536, int(rng.integers(60, 150)))
             .astype(np.int32) for sid, (m, _, _, _) in good.items()}

    async def main() -> dict[str, bytes]:
        async with serving(models, ["wt", "neu"]) as srv:
            c = await Client.open(srv.port)
            (spec,) = [m for m in c.hello["models"] if m["name"] == "neu"]
            assert spec["windows"] == {"default": {"chunk": 25, "lookback": 50, "lookahead": 5,
                                                   "overlap": 1},
                                       "low": {"chunk": 10, "lookback": 25, "lookahead": 2,
                                               "overlap": 1}}
            for i, (sid, (m, win, latency, _)) in enumerate(good.items()):
                msg = {"type": "start", "stream_id": sid, "model": m, "layout": "levels",
                       "latency": latency, **({"window": win} if win is not None else {})}
                await c.send(msg)
                bsid, (bm, bwin, _) = list(bad.items())[i]
                await c.send({"type": "start", "stream_id": bsid, "model": bm, "layout": "levels",
                              "window": bwin})
            for bsid, (bm, bwin, _) in list(bad.items())[len(good):]:
                await c.send({"type": "start", "stream_id": bsid, "model": bm, "layout": "levels",
                              "window": bwin})
            pos = dict.fromkeys(good, 0)
            while any(pos[s] < codes[s].size for s in good):
                for sid in good:
                    a = pos[sid]
                    if a < codes[sid].size:
                        b = min(codes[sid].size, a + int(rng.integers(1, 30)))
                        await c.send({"type": "tokens", "stream_id": sid,
                                      "levels": [codes[sid][a:b].tolist()]})
                        pos[sid] = b
                        if b == codes[sid].size:
                            await c.send({"type": "end", "stream_id": sid})
                await asyncio.sleep(0)
            for bsid, (_, _, what) in bad.items():
                t = await c.terminal(bsid, 60)
                assert t["type"] == "error" and t["code"] == "bad_window", (bsid, t)
                assert what in t["message"], (bsid, t["message"])
            out = {}
            for sid, (m, _, latency, p) in good.items():
                t = await c.terminal(sid, 240)
                hop = {"wt": 320, "neu": 480}[m]
                assert t["type"] == "done" and t["samples"] == codes[sid].size * hop, (sid, t)
                started = next(x for x in c.rec(sid)["msgs"] if x["type"] == "started")
                assert started["latency"] == latency
                assert started["latency_samples"] == p.latency_frames * hop, (sid, started)
                out[sid] = bytes(c.rec(sid)["audio"])
            assert c.ws.close_code is None
            await c.close()
        return out

    got = asyncio.run(main())
    for sid, (m, _, _, p) in good.items():
        assert got[sid] == f32_to_s16le(offline_windowed(models[m], codes[sid], p)), sid


def test_cli_stream_window_option(models: dict[str, Path], tmp_path: Path) -> None:
    """``codecd stream --window 10/0/2/1`` and ``--window low`` send start.window: the WAVs equal
    the offline windowed decodes with those windows; a bad one exits with the server's
    bad_window message."""
    import subprocess
    import sys

    sf = pytest.importorskip("soundfile")
    from serverkit import serve_process, wait_ready

    codes = np.random.default_rng(3).integers(0, 65536, 77).astype(np.int32)
    np.savez(tmp_path / "codes.npz", level0=codes)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "codecd.cli", "stream", *args],
                              capture_output=True, text=True, timeout=120)

    log = tmp_path / "serve.log"
    with serve_process(models["neu"], log) as (p, port):
        asyncio.run(wait_ready(port, p, log))
        url = f"ws://127.0.0.1:{port}"
        for i, win in enumerate(("10/0/2/1", "low")):
            r = cli("--url", url, "--model", "small", str(tmp_path / "codes.npz"), "--window", win,
                    "-o", str(tmp_path / f"{i}.wav"), "--rate", "max")
            assert r.returncode == 0, r.stderr + log.read_text()
        r = cli("--url", url, "--model", "small", str(tmp_path / "codes.npz"), "--window", "1/50/0/0",
                "-o", str(tmp_path / "bad.wav"), "--rate", "max")
        assert r.returncode != 0 and "bad_window" in r.stderr, r.stderr
    for i, params in enumerate((WindowParams(10, 0, 2, 1), LOW_WINDOW)):
        got, _ = sf.read(tmp_path / f"{i}.wav", dtype="int16")
        want = f32_to_s16le(offline_windowed(models["neu"], codes, params))
        assert got.tobytes() == want, i
    r = cli("--model", "small", "x.npz", "-o", "y.wav", "--window", "1/2/3")
    assert r.returncode == 2 and "CHUNK/LOOKBACK/LOOKAHEAD/OVERLAP" in r.stderr
