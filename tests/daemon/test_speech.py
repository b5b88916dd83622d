"""The speech front (codecd.speech) end to end: a real daemon on 127.0.0.1 with the small
model, a real OpenAI-compatible completions server written here (aiohttp) streaming Orpheus
tokens with pacing, the official ``openai`` client, real websocket streams beside it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")

from aiohttp import ClientSession, web  # noqa: E402

from conftest import load_layouts  # noqa: E402
from smallmodel import small_codes  # noqa: E402
from serverkit import (  # noqa: E402
    SR,
    Client,
    serve_process,
    wait_ready,
    assert_same_audio,
    expected,
    running,
    send_stream,
    start_msg,
)

from codecd.speech.prompt import TokenParser, orpheus_prompt, split_sentences  # noqa: E402

L = load_layouts()
SAMPLES_PER_GROUP = 16  # the small model: 4 finest frames of hop 4 per 7-token group


# ------------------------------------------------------------------ the fake LM


def piece_ids(text: str) -> np.ndarray:
    """The Orpheus token ids the fake LM "generates" for one piece of text (deterministic)."""
    seed = zlib.crc32(text.encode())
    rng = np.random.default_rng(seed)
    n_groups = 12 + seed % 20
    levels = small_codes(4 * n_groups, rng)
    return L.codes_to_orpheus_ids(L.levels_to_orpheus(levels))


def ids_text(ids: np.ndarray) -> str:
    return "".join(f"<custom_token_{int(i) - 128256}>" for i in ids)


def levels_of(ids: np.ndarray) -> list[np.ndarray]:
    return L.orpheus_to_levels(L.orpheus_ids_to_codes(ids))


class FakeLM:
    """An OpenAI-compatible /v1/completions server: streams the tokens of :func:`piece_ids`
    in slices of 1-40 characters (tags cut anywhere) every ``pace_s``. A word in the prompt
    picks a failure: SLOW, STATUS500, STATUS404, BREAKEARLY, BREAKLATE, NOAUDIO, BADFIRST,
    BADLATE, NODONE."""

    def __init__(self, pace_s: float = 0.002) -> None:
        self.pace_s = pace_s
        self.prompts: list[str] = []
        self.active = 0
        self.auth: list[str | None] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def close(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["prompt"]
        assert body["stream"] is True and body["max_tokens"] > 0
        # Orpheus' sampling, and the audio tokens (special tokens) kept in vLLM's text
        assert body["temperature"] == 0.6 and body["skip_special_tokens"] is False
        assert "<custom_token_2>" in body["stop"]
        self.prompts.append(prompt)
        self.auth.append(request.headers.get("Authorization"))
        self.active += 1
        try:
            return await self._answer(request, prompt)
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request, prompt: str) -> web.StreamResponse:
        piece = prompt.split(": ", 1)[1].split("<|eot_id|>")[0]
        if "SLOW" in piece:
            await asyncio.sleep(30)
        if "STATUS500" in piece:
            return web.json_response({"error": "overloaded"}, status=500)
        if "STATUS404" in piece:
            return web.json_response({"error": "no such model"}, status=404)
        if "HUGE500" in piece:  # a 4 MB error body: codecd reads 4 KiB of it
            return web.Response(body=b"x" * (4 << 20), status=500)
        if "LONGLINE" in piece:  # an event line that never ends (200 KB, no newline)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(50):
                await resp.write(b"x" * 4096)
            await asyncio.sleep(1.0)
            return resp
        ids = piece_ids(piece)
        text = ids_text(ids) + "<custom_token_2>"
        if "NOAUDIO" in piece:
            text = "I am a helpful assistant and cannot speak."
        if "BADFIRST" in piece:
            text = "<custom_token_5000>" + text  # position 0 allows 10..4105
        late = len(ids_text(ids[:7 * 10]))  # after 10 groups the LM stalls 0.3 s, then fails
        if "BADLATE" in piece:
            text = text[:late] + "<custom_token_10>" * 2 + text[late:]  # position 1: >= 4106
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rng = np.random.default_rng(len(piece))
        pos = 0
        stalled = False
        while pos < len(text):
            n = int(rng.integers(1, 40))
            if pos < late <= pos + n:
                n = late - pos
            chunk, pos = text[pos:pos + n], pos + n
            ev = {"id": "cmpl-1", "object": "text_completion", "model": "orpheus",
                  "choices": [{"index": 0, "text": chunk, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            if "BREAKEARLY" in piece and pos > 30:
                break
            if pos >= late and not stalled and ("LATE" in piece):
                stalled = True
                await asyncio.sleep(0.3)  # the client has audio by now
                if "BREAKLATE" in piece:
                    break
            await asyncio.sleep(self.pace_s)
        if "BREAK" in piece:
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()  # no [DONE], no end of the chunked body
            return resp
        if "NODONE" not in piece:
            ev = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def speech_server(small: Path, lm: FakeLM | None = None, **kw: Any
                        ) -> AsyncIterator[tuple[Any, FakeLM]]:
    lm = lm or FakeLM()
    await lm.start()
    try:
        kw.setdefault("upstream", lm.url)
        async with running(small, http_port=0, upstream_timeout_s=kw.pop("timeout", 5.0),
                           **kw) as srv:
            yield srv, lm
    finally:
        await lm.close()


def base_url(srv: Any) -> str:
    """The speech front's base URL of an in-process server, or of a port."""
    port = srv if isinstance(srv, int) else srv.speech.port
    return f"http://127.0.0.1:{port}/v1"


def want_pcm(offline: Any, texts: list[str]) -> bytes:
    ids = np.concatenate([piece_ids(t) for t in texts])
    return expected(offline, levels_of(ids), "pcm_s16le", SR)


async def speak(srv: Any, text: str, fmt: str = "pcm", **kw: Any) -> tuple[bytes, float, Any]:
    """The official client, streaming: (body, seconds to the first chunk, response)."""
    client = openai.AsyncOpenAI(base_url=base_url(srv), api_key="sk-none", max_retries=0)
    t0 = time.monotonic()
    first = None
    out = bytearray()
    async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=kw.pop("voice", "tara"), input=text, response_format=fmt,
            **kw) as resp:
        async for chunk in resp.iter_bytes():
            if first is None and chunk:
                first = time.monotonic() - t0
            out += chunk
    await client.close()
    return bytes(out), first or 0.0, resp


async def assert_nothing_running(srv: Any, lm: FakeLM) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (srv.speech.active == 0 and srv.active_streams == 0 and lm.active == 0
                and srv.pool.stats()["streams"] == 0):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"left running: speech {srv.speech.active}, streams "
                         f"{srv.active_streams}, upstream {lm.active}, "
                         f"engine {srv.pool.stats()['streams']}")


async def post(srv: Any, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    async with ClientSession() as s:
        async with s.post(base_url(srv) + "/audio/speech", json=body) as r:
            data = await r.read()
            return r.status, r.headers.copy(), data


# ------------------------------------------------------------------ units


def test_prompt_and_token_parser() -> None:
    """The prompt is the Orpheus project's; tags cut anywhere parse; control tokens skip."""
    assert orpheus_prompt("Hi.", "leo") == ("<custom_token_3><|begin_of_text|>leo: Hi.<|eot_id|>"
                                            "<custom_token_4><custom_token_5><custom_token_1>")
    ids = piece_ids("x")
    text = "<custom_token_4> " + ids_text(ids) + "<custom_token_2><custom_token_77>"
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = TokenParser()
        cuts = sorted({0, len(text), *map(int, rng.integers(0, len(text), 30))})
        got = np.concatenate([p.feed(text[a:b]) for a, b in zip(cuts, cuts[1:])])
        np.testing.assert_array_equal(got, ids)
        assert p.ended and p.n_audio == ids.size
    pieces = split_sentences("One. Two three! " + "word " * 100 + "end? Last.", 60)
    assert all(len(x) <= 60 for x in pieces) and pieces[0] == "One. Two three!"
    assert " ".join(pieces).split() == ("One. Two three! " + "word " * 100 + "end? Last.").split()


# ------------------------------------------------------------------ the endpoint


def test_openai_client_pcm_wav_sse_equal_offline(small: Path, offline: Any) -> None:
    """pcm = the offline decode of the LM's tokens (s16 within 1 LSB as every websocket
    stream); wav parses with soundfile to the same samples; sse deltas concatenate to it;
    long input = consecutive generations, one continuous stream; listings answer."""
    sf = pytest.importorskip("soundfile")
    text = "Hello there, this is codecd. It speaks through Orpheus!"

    async def main() -> None:
        async with speech_server(small) as (srv, lm):
            pcm, ttfa, resp = await speak(srv, text)
            assert resp.headers["content-type"] == "audio/pcm"
            want = want_pcm(offline, [text])
            assert_same_audio(pcm, want, "pcm_s16le")
            assert lm.prompts == [orpheus_prompt(text, "tara")]
            assert lm.auth == [None]

            wav, _, resp = await speak(srv, text, "wav", voice="zac")
            data, rate = sf.read(io.BytesIO(wav), dtype="int16")
            assert rate == SR and resp.headers["content-type"] == "audio/wav"
            assert_same_audio(data.tobytes(), want, "pcm_s16le")

            # sse through the raw HTTP API: every event is one JSON object
            status, headers, body = await post(srv, {"model": "small", "input": text,
                                                     "voice": "mia", "response_format": "pcm",
                                                     "stream_format": "sse"})
            assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
            events = [json.loads(b[len(b"data: "):]) for b in body.split(b"\n\n") if b]
            assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
            assert events[-1]["type"] == "speech.audio.done"
            sse_pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
            assert_same_audio(sse_pcm, want, "pcm_s16le")

            # long input: pieces at sentence ends, one generation each, one audio stream
            long = " ".join(f"Sentence number {i} is here to make the input long."
                            for i in range(12))
            pieces = split_sentences(long, 240)
            assert len(pieces) >= 2
            lm.prompts.clear()
            pcm, _, _ = await speak(srv, long)
            assert lm.prompts == [orpheus_prompt(p, "tara") for p in pieces]
            assert_same_audio(pcm, want_pcm(offline, pieces), "pcm_s16le")

            async with ClientSession() as s:
                async with s.get(base_url(srv) + "/models") as r:
                    assert [m["id"] for m in (await r.json())["data"]] == ["small"]
                async with s.get(base_url(srv) + "/audio/voices") as r:
                    assert "tara" in (await r.json())["voices"]
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_encoded_formats_decode_close_to_pcm(small: Path, offline: Any) -> None:
    """opus (Ogg, 48 kHz), mp3, flac, aac decode with PyAV; correlation with the pcm stated."""
    av = pytest.importorskip("av")
    # a smooth test signal would be kinder; the small random model's output is noise-like,
    # so lossy codecs are judged by correlation after alignment
    text = " ".join(f"Part {i} of a longer sentence for the encoders." for i in range(4))

    def decode(data: bytes) -> tuple[np.ndarray, int]:
        c = av.open(io.BytesIO(data))
        s = c.streams.audio[0]
        rs = av.AudioResampler(format="s16", layout="mono", rate=SR)
        out = [f.to_ndarray().reshape(-1) for fr in c.decode(s) for f in rs.resample(fr)]
        out += [f.to_ndarray().reshape(-1) for f in rs.resample(None)]
        return np.concatenate(out).astype(np.float64) / 32768, s.rate

    def best_corr(x: np.ndarray, y: np.ndarray) -> float:
        best = 0.0
        for lag in range(0, 3000):  # encoder delay / priming samples
            a, b = x[lag:lag + y.size], y[:max(0, x.size - lag)]
            n = min(a.size, b.size)
            if n < y.size // 2:
                break
            c = float(np.corrcoef(a[:n], b[:n])[0, 1])
            best = max(best, c)
        return best

    async def main() -> dict[str, float]:
        async with speech_server(small) as (srv, lm):
            pcm, _, _ = await speak(srv, text)
            ref = np.frombuffer(pcm, "<i2").astype(np.float64) / 32768
            out = {}
            for fmt, rate, min_corr in (("flac", SR, 0.9999), ("opus", 48000, 0.9),
                                        ("mp3", SR, 0.9), ("aac", SR, 0.6)):
                data, _, resp = await speak(srv, text, fmt)
                got, r = decode(data)
                assert r == rate, (fmt, r)
                out[fmt] = best_corr(got, ref)
                assert out[fmt] >= min_corr, (fmt, out[fmt])
            await assert_nothing_running(srv, lm)
            return out
    corr = asyncio.run(main())
    print("correlation with pcm:", {k: round(v, 4) for k, v in corr.items()})


def test_bad_requests_get_400(small: Path) -> None:
    async def main() -> None:
        async with speech_server(small) as (srv, lm):
            ok = {"model": "tts-1", "input": "Hi.", "voice": "tara", "response_format": "pcm"}
            for patch, code in ((dict(speed=1.5), "unsupported_speed"),
                                (dict(speed="fast"), "bad_request"),
                                (dict(voice="nobody"), "unknown_voice"),
                                (dict(response_format="ogg"), "bad_request"),
                                (dict(stream_format="chunks"), "bad_request"),
                                (dict(input=""), "bad_request"),
                                (dict(input="x" * 5000), "bad_request")):
                status, headers, body = await post(srv, {**ok, **patch})
                assert status == 400, (patch, status, body)
                assert json.loads(body)["error"]["code"] == code, (patch, body)
                assert headers.get("X-Request-Id"), (patch, headers)
            assert lm.prompts == []
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_bodies_that_are_not_json_and_the_token(small: Path) -> None:
    """A body that is not JSON (nested too deep for the parser, not UTF-8, under a charset that
    does not exist) is a 400 ``bad_request``, never a 500; with ``auth_token`` set only
    ``Bearer <token>`` (the scheme in any case, RFC 9110) is let in, and nothing reaches the LM."""
    async def main() -> None:
        async with speech_server(small, auth_token="s3cret") as (srv, lm):
            url = base_url(srv) + "/audio/speech"
            ok = {"Authorization": "Bearer s3cret"}
            async with ClientSession() as s:
                for data, ctype in ((b"[" * 60000, "application/json"),
                                    (b"\xff\xfe{", "application/json"),
                                    (b"nope", "application/json; charset=bogus")):
                    async with s.post(url, data=data, headers={**ok, "Content-Type": ctype}) as r:
                        assert r.status == 400, (data[:8], r.status, await r.text())
                        assert (await r.json())["error"]["code"] == "bad_request"
                for auth, status in ((None, 401), ("Bearer wrong", 401), ("Basic s3cret", 401),
                                     ("Bearer s3cret", 400), ("bearer s3cret", 400)):
                    headers = {"Authorization": auth} if auth else {}
                    async with s.post(url, data=b"{}", headers=headers) as r:
                        assert r.status == status, (auth, r.status)
            assert lm.prompts == []
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_upstream_failures(small: Path, offline: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Each upstream failure before audio is its documented HTTP error; after audio, a clean
    end of the stream with the audio decoded so far; nothing is left running."""
    async def main() -> None:
        async with speech_server(small, timeout=3.0) as (srv, lm):
            for word, status, code in (("SLOW", 504, "upstream_timeout"),
                                       ("STATUS500", 502, "upstream_status"),
                                       ("STATUS404", 502, "upstream_status"),
                                       ("HUGE500", 502, "upstream_status"),
                                       ("LONGLINE", 502, "upstream_broken"),
                                       ("BREAKEARLY", 502, "upstream_broken"),
                                       ("NODONE", 502, "upstream_broken"),
                                       ("NOAUDIO", 502, "upstream_no_audio"),
                                       ("BADFIRST", 502, "upstream_bad_tokens")):
                if word == "NODONE":
                    continue  # NODONE ends after audio: below
                st, headers, body = await post(srv, {"input": f"Say {word} now.",
                                                     "voice": "tara", "response_format": "pcm"})
                assert st == status, (word, st, body)
                err = json.loads(body)["error"]
                assert err["code"] == code, (word, err)
                rid = headers["X-Request-Id"]
                assert any(rid in r.getMessage() and code in r.getMessage()
                           for r in caplog.records), word
                await assert_nothing_running(srv, lm)
            # after some audio: a clean end, the audio of the tokens before the failure
            for word in ("BREAKLATE", "BADLATE", "NODONE"):
                text = f"Say {word} now."
                pcm, _, resp = await speak(srv, text)
                assert resp.status_code == 200
                full = want_pcm(offline, [text])
                n_groups = len(pcm) // 2 // SAMPLES_PER_GROUP
                assert len(pcm) == n_groups * SAMPLES_PER_GROUP * 2, word
                assert n_groups == (len(full) // 2 // SAMPLES_PER_GROUP if word == "NODONE"
                                    else 10), (word, n_groups)
                if word == "NODONE":
                    assert_same_audio(pcm, full, "pcm_s16le")
                else:
                    assert len(pcm) < len(full)
                    ids = piece_ids(text)[:7 * n_groups]
                    assert_same_audio(pcm, expected(offline, levels_of(ids), "pcm_s16le", SR),
                                      "pcm_s16le")
                await assert_nothing_running(srv, lm)
            # sse after audio: the deltas so far, an error event, then done
            text = "Say BREAKLATE in sse."
            st, _, body = await post(srv, {"input": text, "response_format": "pcm",
                                           "stream_format": "sse"})
            assert st == 200
            events = [json.loads(b[len(b"data: "):]) for b in body.split(b"\n\n") if b]
            assert [e["type"] for e in events[-2:]] == ["error", "speech.audio.done"]
            assert events[-2]["error"]["code"] == "upstream_broken"
            assert {e["type"] for e in events[:-2]} == {"speech.audio.delta"}
            pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-2])
            ids = piece_ids(text)[:7 * 10]
            assert_same_audio(pcm, expected(offline, levels_of(ids), "pcm_s16le", SR),
                              "pcm_s16le")
            await assert_nothing_running(srv, lm)
            # the client goes away mid-stream: upstream request and engine stream end
            async with ClientSession() as s:
                async with s.post(base_url(srv) + "/audio/speech", json={
                        "input": " ".join(["A long one."] * 60), "response_format": "pcm"}) as r:
                    assert r.status == 200
                    await r.content.read(64)
            await assert_nothing_running(srv, lm)
        # unreachable: nothing listens there
        dead = FakeLM()
        await dead.start()
        url = dead.url
        await dead.close()
        async with speech_server(small, upstream=url) as (srv, lm):
            st, _, body = await post(srv, {"input": "Hi.", "response_format": "pcm"})
            assert st == 502 and json.loads(body)["error"]["code"] == "upstream_unreachable"
            await assert_nothing_running(srv, lm)
    caplog.set_level("INFO", logger="codecd.speech.app")
    asyncio.run(main())


def test_speech_output_is_bounded(small: Path, offline: Any) -> None:
    """A speech request holds at most about its output budget of decoded audio unsent (the
    upstream is no longer read while the client lags), and its audio ends cleanly at
    ``max_stream_duration_s``, whatever the upstream generates."""
    budget_s, max_s = 0.01, 0.1  # the small model: 16 samples per group, 24 kHz: 150 groups

    async def main() -> None:
        async with speech_server(small, output_budget_s=budget_s, max_stream_duration_s=max_s
                                 ) as (srv, lm):
            text = " ".join(["A long one."] * 330)  # 17 pieces, at least 12 groups each
            peak = 0
            out = bytearray()
            async with ClientSession() as s:
                async with s.post(base_url(srv) + "/audio/speech", json={
                        "input": text, "response_format": "pcm"}) as r:
                    assert r.status == 200
                    while True:
                        chunk = await r.content.read(64)
                        if not chunk:
                            break
                        out += chunk
                        peak = max([peak, *(q.queued for q in srv.speech._reqs.values())])
                        await asyncio.sleep(0.002)  # slower than the LM
            # unsent audio: the budget, plus what was pushed before the producer looked
            assert 0 < peak <= int(budget_s * SR) + 64 * SAMPLES_PER_GROUP, peak
            n = len(out) // 2
            assert n == int(max_s * SR) // SAMPLES_PER_GROUP * SAMPLES_PER_GROUP, n
            ids = np.concatenate([piece_ids(t) for t in split_sentences(text, 240)])
            cut = ids[:7 * (n // SAMPLES_PER_GROUP)]  # the stream ends there: decoded as ended
            assert_same_audio(bytes(out), expected(offline, levels_of(cut), "pcm_s16le", SR),
                              "pcm_s16le")
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_twenty_speech_and_twenty_websocket_streams_batched(small: Path, offline: Any) -> None:
    """20 concurrent speech requests and 20 websocket streams: all correct, decoded in the
    same engine with batches > 1 (the worker's own batch statistics)."""
    async def main() -> None:
        async with speech_server(small, max_streams=64, gather_ms=5.0) as (srv, lm):
            rng = np.random.default_rng(4)
            clients = [await Client.open(srv.port) for _ in range(2)]  # 16 streams each at most
            ws_jobs = []
            for i in range(20):
                levels = small_codes(4 * int(rng.integers(40, 120)), rng)
                c = clients[i % 2]
                await c.send(start_msg(f"w{i}"))
                ws_jobs.append((c, f"w{i}", levels))
            texts = [f"Request {i} says hello to everyone here." for i in range(20)]
            res = await asyncio.gather(
                *(speak(srv, t) for t in texts),
                *(send_stream(c, sid, lv, "orpheus_ids", rng) for c, sid, lv in ws_jobs))
            for t, (pcm, _, _) in zip(texts, res[:20]):
                assert_same_audio(pcm, want_pcm(offline, [t]), "pcm_s16le")
            for c, sid, levels in ws_jobs:
                term = await c.terminal(sid, 20)
                assert term["type"] == "done", term
                assert_same_audio(bytes(c.rec(sid)["audio"]),
                                  expected(offline, levels, "pcm_s16le", SR), "pcm_s16le")
            for c in clients:
                await c.close()
            st = (await srv.pool.fetch_stats())["workers"][0]["worker"]["models"]["small"]
            assert st["max_batch_seen"] >= 2, st
            ttfa = sorted(r[1] for r in res[:20])
            print(f"20 concurrent speech requests: first audio p50 {ttfa[10] * 1000:.0f} ms, "
                  f"max {ttfa[-1] * 1000:.0f} ms; batches up to {st['max_batch_seen']}")
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_without_pyav_encoded_formats_say_how(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PyAV, pcm and wav still work and the others name the extra to install."""
    import sys

    from codecd.speech.encode import CodecsMissing, make_encoder

    monkeypatch.setitem(sys.modules, "av", None)  # import av -> ImportError
    x = np.zeros(100, np.float32)
    assert len(make_encoder("pcm", SR).feed(x)) == 200
    assert len(make_encoder("wav", SR).feed(x)) == 244
    for fmt in ("opus", "mp3", "flac", "aac"):
        with pytest.raises(CodecsMissing, match=r"codecd\[codecs\]"):
            make_encoder(fmt, SR)


def test_pipecat_openai_tts_service(small: Path, offline: Any) -> None:
    """Pipecat's OpenAITTSService with base_url speaks through codecd: its frames carry the
    pcm of the offline decode (Pipecat accepts only OpenAI's voice names: nova -> jess)."""
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame
    from pipecat.services.openai.tts import OpenAITTSService

    text = "Pipecat asks and codecd answers."

    async def main() -> None:
        async with speech_server(small) as (srv, lm):
            tts = OpenAITTSService(api_key="unused", base_url=base_url(srv),
                                   settings=OpenAITTSService.Settings(voice="nova",
                                                                      model="orpheus"))
            # what a pipeline's StartFrame sets (no pipeline here: run_tts is called directly)
            tts._sample_rate = SR
            audio = bytearray()
            async for frame in tts.run_tts(text, "ctx-1"):
                assert not isinstance(frame, ErrorFrame), frame
                if isinstance(frame, TTSAudioRawFrame):
                    assert frame.sample_rate == SR and frame.num_channels == 1
                    audio += frame.audio
            assert lm.prompts == [orpheus_prompt(text, "jess")]
            assert_same_audio(bytes(audio), want_pcm(offline, [text]), "pcm_s16le")
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


def test_livekit_openai_tts_plugin(small: Path, offline: Any) -> None:
    """LiveKit Agents' OpenAI TTS plugin with base_url speaks through codecd (it asks for
    sse unless the model is tts-1: the deltas decode to the pcm of the offline decode)."""
    pytest.importorskip("livekit.agents")
    from livekit.plugins import openai as lk_openai

    text = "LiveKit asks and codecd answers."

    async def main() -> None:
        async with speech_server(small) as (srv, lm):
            tts = lk_openai.TTS(base_url=base_url(srv), api_key="unused", model="orpheus",
                                voice="leo", response_format="pcm")
            audio = bytearray()
            async with tts.synthesize(text) as stream:
                async for ev in stream:
                    assert ev.frame.sample_rate == SR and ev.frame.num_channels == 1
                    audio += bytes(ev.frame.data)
            await tts.aclose()
            assert lm.prompts == [orpheus_prompt(text, "leo")]
            want = want_pcm(offline, [text])
            # LiveKit pads its last frame with silence to a whole frame
            assert len(audio) >= len(want) and not any(audio[len(want):])
            assert_same_audio(bytes(audio[:len(want)]), want, "pcm_s16le")
            await assert_nothing_running(srv, lm)
    asyncio.run(main())


@pytest.mark.parametrize("fronts", [1, 2])
def test_serve_cli_http_port_and_sigterm(small: Path, offline: Any, tmp_path: Path,
                                         fronts: int) -> None:
    """``codecd serve --http-port --upstream --fronts F`` (a real daemon process, settings
    from flags and the environment; with two fronts main binds the HTTP port once and both
    accept on it, their streams admitted by main): speech works, the upstream gets its key, SIGTERM exits 0 while a
    request is in flight (it is drained or ended; the daemon stops)."""
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    text = "Spoken by a real daemon process."

    async def main() -> None:
        lm = FakeLM()
        await lm.start()
        try:
            with serve_process(small, log, "--http-port", str(http_port), "--upstream", lm.url,
                               "--fronts", str(fronts), env={"CODECD_UPSTREAM_KEY": "sk-upstream"}) as (p, port):
                await wait_ready(port, p, log)
                pcm, _, _ = await speak(http_port, text)
                assert_same_audio(pcm, want_pcm(offline, [text]), "pcm_s16le")
                assert lm.auth == ["Bearer sk-upstream"]
                pending = asyncio.ensure_future(speak(http_port, " ".join(["Long text."] * 40)))
                await asyncio.sleep(0.3)
                p.send_signal(signal.SIGTERM)
                with contextlib.suppress(Exception):
                    await pending
                assert await asyncio.to_thread(p.wait, 20) == 0, log.read_text()
            assert lm.active == 0
        finally:
            await lm.close()
    asyncio.run(main())
    out = log.read_text()
    assert "speech endpoint on http://127.0.0.1:%d" % http_port in out
    assert "sk-upstream" not in out


def test_demo_model_process_pcm_equals_offline(tmp_path: Path, codecrt: Any) -> None:
    """The full-size SNAC 24 kHz shapes (the ``demo`` source's random weights) in a real
    ``codecd serve`` process: pcm over the official client equals the offline decode of the
    same tokens to 1 LSB almost everywhere, as the websocket streams of test_server."""
    import socket

    from codecd.config import build_demo_model

    demo = build_demo_model(tmp_path / "demo_snac_24khz.gguf")
    text = "The demo model speaks noise, exactly."
    ids = piece_ids(text)
    model = codecrt.Model(str(demo))
    ctx = codecrt.Context(model, device="cpu", n_threads=1)
    ref = ctx.decode(levels_of(ids)).copy()
    ctx.close()
    model.close()
    want = expected(lambda lv: ref, levels_of(ids), "pcm_s16le", SR)
    assert len(want) == 2 * 2048 * (ids.size // 7)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    log = tmp_path / "serve.log"

    async def main() -> None:
        lm = FakeLM()
        await lm.start()
        try:
            with serve_process(demo, log, "--http-port", str(http_port), "--upstream",
                               lm.url) as (p, port):
                await wait_ready(port, p, log, timeout=120)
                pcm, ttfa, _ = await speak(http_port, text)
                assert_same_audio(pcm, want, "pcm_s16le")
                print(f"demo model, {ids.size // 7} groups: first audio after {ttfa * 1000:.0f} "
                      "ms (shared CPU)")
        finally:
            await lm.close()
    asyncio.run(main())


def test_websocket_start_with_text(small: Path, offline: Any) -> None:
    """A websocket ``start`` with ``text`` (and ``voice``) instead of tokens: the same text
    front feeds the stream; upstream failures are ``upstream_error``; tokens from the client
    for such a stream are refused; without --upstream, text starts fail clearly."""
    text = "The websocket speaks text too. Two sentences!"

    async def main() -> None:
        async with speech_server(small) as (srv, lm):
            c = await Client.open(srv.port)
            await c.send({"type": "start", "stream_id": "t", "model": "small", "text": text,
                          "voice": "shimmer"})
            await c.send({"type": "start", "stream_id": "f", "model": "small",
                          "text": "Say STATUS500 now."})
            await c.send({"type": "start", "stream_id": "x", "model": "small",
                          "text": "Say SLOW now."})
            await c.send({"type": "tokens", "stream_id": "x", "tokens": [128266]})
            t = await c.terminal("t")
            assert t["type"] == "done", t
            assert_same_audio(bytes(c.rec("t")["audio"]), want_pcm(offline, [text]),
                              "pcm_s16le")
            assert orpheus_prompt(text, "mia") in lm.prompts
            f = await c.terminal("f")
            assert f["type"] == "error" and f["code"] == "upstream_error", f
            assert f["upstream_code"] == "upstream_status"
            x = await c.terminal("x")
            assert x["type"] == "error" and x["code"] == "bad_message", x
            await c.close()
            await assert_nothing_running(srv, lm)
        async with running(small) as srv:  # no upstream
            c = await Client.open(srv.port)
            await c.send({"type": "start", "stream_id": "t", "model": "small", "text": "Hi."})
            t = await c.terminal("t")
            assert t["code"] == "upstream_error" and t["upstream_code"] == "no_upstream", t
            await c.close()
    asyncio.run(main())


def test_websocket_text_waits_for_its_audio(small: Path, offline: Any) -> None:
    """An LM far faster than the decoder on a websocket text stream: the worker is stopped
    (SIGSTOP) for a moment while the LM streams without a pause, and the stream's backlog limit
    is small (200 frames, 350 tokens; the decoder's look-ahead holds 73 of them). The generation
    waits for the stream's audio instead of overfilling its backlog (``backlog_exceeded`` before
    the wait), and once the worker runs again the whole text is decoded."""
    text = " ".join(f"Sentence number {i} of a long answer, spoken by a fast model."
                    for i in range(12))

    async def main() -> None:
        async with speech_server(small, FakeLM(pace_s=0.0), max_queued_frames=200) as (srv, lm):
            assert srv.session_limits.max_pending_tokens == 350
            c = await Client.open(srv.port)
            await c.send({"type": "start", "stream_id": "t", "model": "small", "text": "Hi."})
            assert (await c.terminal("t"))["type"] == "done"  # the stream is warm
            worker = srv.pool.engines[0].pid
            os.kill(worker, signal.SIGSTOP)
            try:
                await c.send({"type": "start", "stream_id": "u", "model": "small", "text": text})
                await asyncio.sleep(1.0)  # the LM would say it all meanwhile: ~2,000 tokens
            finally:
                os.kill(worker, signal.SIGCONT)
            u = await c.terminal("u", timeout=30.0)
            assert u["type"] == "done", u
            want = want_pcm(offline, split_sentences(text, 240))
            assert_same_audio(bytes(c.rec("u")["audio"]), want, "pcm_s16le")
            await c.close()
            await assert_nothing_running(srv, lm)
    asyncio.run(main())
