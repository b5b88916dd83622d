"""``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/audio/voices`` on aiohttp.

Why a second port: the websocket listener is the ``websockets`` library, whose HTTP hook
(``process_request``) answers with one complete response; it cannot stream a chunked body
while the language model is still generating. aiohttp serves this front on
``--http-port``, beside the websocket port; both share one :class:`EnginePool`, so speech
requests and websocket streams are decoded in the same batched ticks.

One request (:class:`_Request`): the text is split at sentence boundaries
(:func:`split_sentences`); each piece is one streamed completion from the upstream LM
(:class:`Upstream`) with the Orpheus prompt; the ``<custom_token_N>`` text is parsed as
it arrives (:class:`TokenParser`), its tokens are validated and grouped by the Orpheus
layout and pushed into ONE engine stream for the whole request (consecutive generations
continue the same decoder state: one continuous audio stream). Audio events are encoded
(:mod:`.encode`) and written as they come. The HTTP status is committed with the first
audio: a failure before it is an HTTP error (JSON ``{"error": {"code", "message",
"type"}}``); a failure after it ends the stream cleanly (an ``error`` event first for
``sse``), with the request id in the log.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from aiohttp import web

from ..engine import Audio, Done, EngineError, EngineEvent, EnginePool, StreamError
from ..families import ModelSpec
from ..families.layout import LayoutError
from ..families.orpheus import ORPHEUS_IDS
from ..responses import bearer_ok
from .encode import CONTENT_TYPES, FORMATS, CodecsMissing, Encoder, make_encoder
from .prompt import (
    DEFAULT_VOICE,
    OPENAI_VOICES,
    ORPHEUS_VOICES,
    STOP,
    TokenParser,
    orpheus_prompt,
    split_sentences,
)
from .upstream import Upstream, UpstreamError

__all__ = ["SpeechFront", "SpeechKey", "MAX_INPUT_CHARS", "PIECE_CHARS"]

logger = logging.getLogger(__name__)

#: longest ``input`` (OpenAI's limit)
MAX_INPUT_CHARS = 4096
#: longest piece of text per generation (~15 s of speech; Orpheus was trained on short ones)
PIECE_CHARS = 240
#: ``max_tokens`` per generation: 2048 tokens = 292 SNAC frames = 25 s of audio
PIECE_MAX_TOKENS = 2048
#: Orpheus sampling defaults of the project (temperature, top_p, repetition penalty: vLLM's
#: and llama.cpp's names); vLLM drops special tokens from the text unless told not to, and
#: Orpheus' audio tokens are special tokens
SAMPLING: dict[str, float | bool] = {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3,
                                     "repeat_penalty": 1.3, "skip_special_tokens": False}

_ids = itertools.count(1)


@dataclass(frozen=True)
class SpeechKey:
    """Engine stream key of a speech request (never a websocket ``StreamKey``)."""

    request_id: str


class _Fail(Exception):
    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _error(status: int, code: str, message: str, request_id: str | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"X-Request-Id": request_id} if request_id else None
    return web.json_response({"error": {"message": message, "type": kind, "code": code,
                                        "param": None}}, status=status, headers=headers)


@dataclass(eq=False)
class _Request:
    rid: str
    key: SpeechKey
    events: asyncio.Queue[EngineEvent | _Fail] = field(default_factory=asyncio.Queue)
    producer: asyncio.Task[None] | None = None
    #: decoded samples in ``events`` not yet written to the client: the producer stops
    #: reading the upstream while they exceed the output budget (``drained`` wakes it)
    queued: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    t0: float = field(default_factory=time.monotonic)
    open: bool = False  # the engine stream exists


@dataclass
class SpeechSettings:
    host: str
    port: int
    upstream: str
    upstream_key: str | None = None
    upstream_model: str = "orpheus"
    upstream_timeout_s: float = 30.0
    auth_token: str | None = None
    send_timeout_s: float = 5.0  # a client that does not read for this long is dropped
    #: decoded audio a request may hold unsent before its upstream is no longer read
    output_budget_s: float = 2.5
    #: a request's audio ends (cleanly) past this length, whatever the upstream generates
    max_duration_s: float = 600.0


class SpeechFront:
    """The HTTP speech front of one daemon (started and stopped by :class:`Server`)."""

    def __init__(self, settings: SpeechSettings, pool: EnginePool, specs: dict[str, ModelSpec],
                 admit: Callable[[], Awaitable[bool]], release: Callable[[], None],
                 sock: socket.socket | None = None) -> None:
        # admit: the daemon-wide stream limit (a front asks main); sock: the listening
        # socket main bound for every front (None: bind host:port here)
        self.settings = settings
        self._sock = sock
        self.pool = pool
        self.specs = specs
        self._admit = admit
        self._release = release
        self.upstream = Upstream(settings.upstream, model=settings.upstream_model,
                                 api_key=settings.upstream_key,
                                 timeout_s=settings.upstream_timeout_s, params=dict(SAMPLING))
        self._reqs: dict[Hashable, _Request] = {}
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self.models = [n for n, s in specs.items() if "orpheus_ids" in s.layouts]

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.upstream.open()
        if self.settings.port < 0:  # text streams on the websocket only
            logger.info("text streams from upstream %s", self.upstream.endpoint)
            return
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/audio/voices", self.list_voices)
        # handler_cancellation: a client that goes away cancels its handler (and so its
        # upstream request and engine stream) instead of leaving them running
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        if self._sock is not None:
            self._site = web.SockSite(self._runner, self._sock)
        else:
            self._site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await self._site.start()
        logger.info("speech endpoint on http://%s:%d/v1/audio/speech (upstream %s)",
                    self.settings.host, self.port, self.upstream.endpoint)

    @property
    def port(self) -> int:
        assert self._runner is not None
        addrs = self._runner.addresses
        return int(addrs[0][1])

    async def close(self) -> None:
        """Stop listening, end every request (their engine streams and upstream calls)."""
        if self._runner is not None:
            await self._runner.cleanup()  # cancels handlers still running
            self._runner = None
        for r in list(self._reqs.values()):
            self._end(r)
        await self.upstream.close()

    @property
    def active(self) -> int:
        return len(self._reqs)

    def on_event(self, ev: EngineEvent) -> None:
        r = self._reqs.get(ev.key)
        if r is not None:
            if isinstance(ev, Audio):
                r.queued += int(ev.pcm.size)
            r.events.put_nowait(ev)

    # ------------------------------------------------------------ listings

    def _authorized(self, request: web.Request) -> bool:
        tok = self.settings.auth_token
        return not tok or bearer_ok(request.headers.get("Authorization"), tok)

    async def list_models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "unauthorized", "missing or wrong bearer token")
        return web.json_response({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "codecd"}
            for n in self.models]})

    async def list_voices(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "unauthorized", "missing or wrong bearer token")
        return web.json_response({"voices": list(ORPHEUS_VOICES), "default": DEFAULT_VOICE,
                                  "aliases": dict(OPENAI_VOICES)})

    # ------------------------------------------------------------ speech

    def _parse(self, body: Any) -> tuple[str, str, str, str, str] | web.Response:
        """(model, text, voice, format, stream_format) or a 400 response."""
        if not isinstance(body, dict):
            return _error(400, "bad_request", "the body must be a JSON object")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return _error(400, "bad_request", "input: a non-empty string is required")
        if len(text) > MAX_INPUT_CHARS:
            return _error(400, "bad_request",
                          f"input: {len(text)} characters, at most {MAX_INPUT_CHARS}")
        voice = body.get("voice", DEFAULT_VOICE)
        if isinstance(voice, dict):  # OpenAI's {"id": ...} form
            voice = voice.get("id")
        voice = OPENAI_VOICES.get(voice, voice) if isinstance(voice, str) else voice
        if voice not in ORPHEUS_VOICES:
            return _error(400, "unknown_voice", f"voice: {voice!r} is not one of "
                          f"{', '.join(ORPHEUS_VOICES)} or OpenAI's names "
                          "(GET /v1/audio/voices)")
        fmt = body.get("response_format", "mp3")
        if fmt not in FORMATS:
            return _error(400, "bad_request",
                          f"response_format: one of {', '.join(FORMATS)}, got {fmt!r}")
        sf = body.get("stream_format", "audio")
        if sf not in ("audio", "sse"):
            return _error(400, "bad_request", f"stream_format: audio or sse, got {sf!r}")
        speed = body.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or \
                not 0.25 <= speed <= 4.0:
            return _error(400, "bad_request", f"speed: a number in 0.25..4.0, got {speed!r}")
        if speed != 1.0:
            return _error(400, "unsupported_speed",
                          "speed: only 1.0 is supported (Orpheus has no rate control, and "
                          "resampling would change the pitch)")
        for k in ("instructions",):
            if body.get(k):
                return _error(400, "bad_request", f"{k}: not supported by Orpheus models")
        if not self.models:
            return _error(404, "no_speech_model", "no loaded model takes Orpheus tokens")
        model = body.get("model")
        if model not in self.models:
            model = self.models[0]  # OpenAI names (tts-1, gpt-4o-mini-tts...) -> the default
        return str(model), text, str(voice), str(fmt), str(sf)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id", "")[:64] or f"sp-{uuid.uuid4().hex[:12]}"
        log = {"request_id": rid}
        if not self._authorized(request):
            return _error(401, "unauthorized", "missing or wrong bearer token", rid)
        try:  # the bytes, not request.json(): its charset comes from the client's header
            # (an unknown one raises LookupError) and deep nesting raises RecursionError
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _error(400, "bad_request", "the body is not valid JSON", rid)
        parsed = self._parse(body)
        if isinstance(parsed, web.Response):
            parsed.headers["X-Request-Id"] = rid
            return parsed
        model, text, voice, fmt, sf = parsed
        spec = self.specs[model]
        try:
            enc = make_encoder(fmt, spec.sample_rate)
        except CodecsMissing as e:
            return _error(400, "codecs_unavailable", str(e), rid)
        if not await self._admit():
            return _error(503, "busy", "the server is at its stream limit or shutting down", rid)
        r = _Request(rid, SpeechKey(f"{rid}#{next(_ids)}"))
        self._reqs[r.key] = r
        try:
            try:
                self.pool.open(r.key, model)
            except EngineError as e:
                status = 503 if e.code in ("busy", "shutting_down") else 500
                return _error(status, e.code, str(e), rid)
            r.open = True
            pieces = split_sentences(text, PIECE_CHARS)
            logger.info("speech %s: %d chars in %d piece(s), voice %s, %s/%s, model %s", rid,
                        len(text), len(pieces), voice, fmt, sf, model, extra=log)
            r.producer = asyncio.create_task(self._produce(r, spec, text, voice),
                                             name=f"codecd-speech-{rid}")
            return await self._respond(request, r, enc, fmt, sf, spec)
        finally:
            self._end(r)
            self._release()

    def _end(self, r: _Request) -> None:
        """Drop everything of a request (idempotent): its producer, engine stream, entry."""
        if r.producer is not None and not r.producer.done():
            r.producer.cancel()
        if r.open:
            self.pool.cancel(r.key)
            r.open = False
        self._reqs.pop(r.key, None)

    async def generate_ids(self, text: str, voice: str, rid: str
                           ) -> AsyncIterator[npt.NDArray[np.int64]]:
        """Raw Orpheus token ids of ``text`` spoken by ``voice``, whole 7-token groups only,
        as the upstream generates them: one generation per piece of the text, in order
        (each piece's ids start at position 0 of a group; an incomplete last group of a
        piece is dropped). Raises :class:`UpstreamError` or :class:`_Fail`."""
        for i, piece in enumerate(split_sentences(text, PIECE_CHARS)):
            parser = TokenParser()
            held = np.zeros(0, dtype=np.int64)
            async for chunk in self.upstream.complete(
                    orpheus_prompt(piece, voice), max_tokens=PIECE_MAX_TOKENS, stop=STOP,
                    request_id=rid):
                ids = parser.feed(chunk)
                if parser.n_audio > PIECE_MAX_TOKENS:  # an upstream that ignores max_tokens
                    ids = ids[:max(0, ids.size - (parser.n_audio - PIECE_MAX_TOKENS))]
                    parser.ended = True
                if ids.size:
                    held = np.concatenate([held, ids])
                    k = held.size - held.size % 7
                    if k:
                        yield held[:k]
                        held = held[k:]
                if parser.ended:
                    break
            if parser.n_audio < 7:
                raise _Fail("upstream_no_audio", 502,
                            f"piece {i}: the upstream generation held no audio tokens "
                            f"({parser.n_audio} audio token(s), {parser.skipped_chars} "
                            "other characters); is it an Orpheus model?")
            if held.size:
                logger.info("speech %s: piece %d ended with %d token(s) of an incomplete "
                            "frame (dropped)", rid, i, held.size, extra={"request_id": rid})

    async def feed_session(self, text: str, voice: str, rid: str,
                           on_ids: Callable[[npt.NDArray[np.int64]], None],
                           on_end: Callable[[], None],
                           on_fail: Callable[[str, str], None],
                           room: Callable[[], Awaitable[None]] | None = None) -> None:
        """A websocket stream started with ``text``: the ids go to ``on_ids`` (the session
        validates them), then ``on_end``; a failure goes to ``on_fail(code, message)``.
        ``room()`` returns once the stream can take more ids: an LM faster than real time
        waits there (its HTTP stream back-pressured), as the HTTP path waits on ``drained``,
        instead of filling the stream's backlog until ``backlog_exceeded``."""
        try:
            async for ids in self.generate_ids(text, voice, rid):
                on_ids(ids)
                if room is not None:
                    await room()
        except asyncio.CancelledError:
            raise
        except (UpstreamError, _Fail) as e:
            logger.warning("text stream %s: %s: %s", rid, e.code, e, extra={"request_id": rid})
            on_fail(e.code, str(e))
            return
        except Exception as e:  # a bug: the stream fails, the daemon does not
            logger.exception("text stream %s: generation failed", rid)
            on_fail("internal_error", f"internal error: {e}")
            return
        on_end()

    async def _produce(self, r: _Request, spec: ModelSpec, text: str, voice: str) -> None:
        """Generations in order -> validated tokens -> engine pushes; then finish."""
        try:
            asm = ORPHEUS_IDS.assembler(spec.codebook_sizes, spec.level_strides)
            budget = max(1, int(self.settings.output_budget_s * spec.sample_rate))
            # one 7-id Orpheus group is one coarsest frame: hop_length * level_strides[-1] samples
            per_group = spec.hop_length * max(spec.level_strides)
            groups_left = int(self.settings.max_duration_s * spec.sample_rate) // per_group
            async for ids in self.generate_ids(text, voice, r.rid):
                if ids.size // 7 > groups_left:
                    ids = ids[:groups_left * 7]
                    logger.warning("speech %s: audio reached max_stream_duration_s (%g s); "
                                   "ending it there", r.rid, self.settings.max_duration_s,
                                   extra={"request_id": r.rid})
                groups_left -= ids.size // 7
                try:
                    levels = asm.feed(ids)
                except LayoutError as e:
                    raise _Fail("upstream_bad_tokens", 502,
                                f"the upstream sent a token that is not valid Orpheus audio: "
                                f"{e}") from None
                if levels is not None:
                    self.pool.push(r.key, levels)
                if groups_left <= 0:
                    break
                while r.queued > budget:  # the client reads slower than the LM generates
                    r.drained.clear()
                    await r.drained.wait()
            self.pool.finish(r.key)
        except asyncio.CancelledError:
            raise
        except UpstreamError as e:
            r.events.put_nowait(_Fail(e.code, e.status, str(e)))
        except _Fail as e:
            r.events.put_nowait(e)
        except EngineError as e:
            r.events.put_nowait(_Fail(e.code, 503 if e.code == "backlog_exceeded" else 502,
                                      str(e)))
        except Exception as e:  # a bug: the request fails, the daemon does not
            logger.exception("speech %s: producer failed", r.rid, extra={"request_id": r.rid})
            r.events.put_nowait(_Fail("internal_error", 500, f"internal error: {e}"))

    async def _respond(self, request: web.Request, r: _Request, enc: Encoder, fmt: str, sf: str,
                       spec: ModelSpec) -> web.StreamResponse:
        log = {"request_id": r.rid}
        resp: web.StreamResponse | None = None
        samples = 0
        ended_early: _Fail | None = None
        while True:
            ev = await r.events.get()
            if isinstance(ev, StreamError):
                ev = _Fail(ev.code, 502, f"decode failed: {ev.message}")
                r.open = False
            if isinstance(ev, _Fail):
                if resp is None:
                    logger.warning("speech %s: %s before any audio: %s", r.rid, ev.code, ev,
                                   extra=log)
                    return _error(ev.status, ev.code, str(ev), r.rid)
                if ended_early is None and r.open:
                    # audio was sent: end cleanly with what is decoded so far
                    logger.warning("speech %s: %s after %.2f s of audio, ending the stream: %s",
                                   r.rid, ev.code, samples / spec.sample_rate, ev, extra=log)
                    ended_early = ev
                    try:
                        self.pool.finish(r.key)
                        continue
                    except EngineError:
                        pass
                ended_early = ended_early or ev
                break
            if isinstance(ev, Audio):
                if resp is None:
                    ttfa = time.monotonic() - r.t0
                    logger.info("speech %s: first audio after %.0f ms", r.rid, ttfa * 1000,
                                extra=log)
                    resp = web.StreamResponse(status=200, headers={
                        "Content-Type": "text/event-stream" if sf == "sse" else CONTENT_TYPES[fmt],
                        "Cache-Control": "no-cache", "X-Request-Id": r.rid,
                        "X-Sample-Rate": str(spec.sample_rate)})
                    resp.enable_chunked_encoding()
                    await resp.prepare(request)
                samples += int(ev.pcm.size)
                try:
                    await asyncio.wait_for(self._write(resp, enc.feed(ev.pcm), sf),
                                           self.settings.send_timeout_s)
                    r.queued -= int(ev.pcm.size)
                    r.drained.set()
                except asyncio.TimeoutError:
                    # the client does not read: drop it (the finally of speech() ends the
                    # upstream request and the engine stream)
                    logger.warning("speech %s: client did not read for %.1f s: slow_reader",
                                   r.rid, self.settings.send_timeout_s, extra=log)
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
            elif isinstance(ev, Done):
                r.open = False
                break
        tail = enc.close()
        if resp is None:  # Done without audio (cannot happen with >= 1 frame pushed)
            resp = web.StreamResponse(status=200, headers={
                "Content-Type": "text/event-stream" if sf == "sse" else CONTENT_TYPES[fmt],
                "X-Request-Id": r.rid})
            await resp.prepare(request)
        await self._write(resp, tail, sf)
        if sf == "sse":
            if ended_early is not None:
                await resp.write(_sse({"type": "error", "error": {
                    "code": ended_early.code, "message": str(ended_early)}}))
            await resp.write(_sse({"type": "speech.audio.done", "usage": {
                "input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                "samples": samples, "sample_rate": spec.sample_rate}))
        await resp.write_eof()
        logger.info("speech %s: %s, %.2f s of audio in %.2f s", r.rid,
                    f"ended early ({ended_early.code})" if ended_early else "done",
                    samples / spec.sample_rate, time.monotonic() - r.t0, extra=log)
        return resp

    @staticmethod
    async def _write(resp: web.StreamResponse, data: bytes, sf: str) -> None:
        if not data:
            return
        if sf == "sse":
            await resp.write(_sse({"type": "speech.audio.delta",
                                   "audio": base64.b64encode(data).decode("ascii")}))
        else:
            await resp.write(data)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
