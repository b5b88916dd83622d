"""Asyncio client for the codecd websocket protocol v1 (``docs/protocol.md``).

One :class:`Client` is one websocket connection; it multiplexes any number of
:class:`Stream` objects. A single reader task receives every server frame and
dispatches it by stream id into that stream's bounded queue; iterating a
stream yields :class:`AudioChunk` objects (PCM as numpy arrays in the stream's
output format) until the stream's terminal message::

    async with Client("ws://127.0.0.1:8765") as c:
        print(c.hello["models"])
        s = await c.start("snac_24khz", layout="orpheus_ids")
        await s.send_tokens(ids)            # JSON; binary=True for a binary frame
        await s.end()
        async for chunk in s:               # AudioChunk(pcm, sample_offset, seq, ...)
            play(chunk.pcm)
        print(s.done_info)                  # {"samples": ..., "duration_s": ...}

Back-pressure: when a stream's queue is full the reader waits for that stream's
consumer, which stops reading the socket for *all* streams of the connection
(TCP flow control then reaches the server, which may fail the connection with
``slow_reader``). Consume every stream you start, or cancel it.

Errors the server reports for a stream (``error`` with its ``stream_id``) are
raised as :class:`ServerError` from that stream's iterator (audio received
before the error is yielded first); a ``start`` refused (``busy``,
``unknown_model``, ...) raises from :meth:`Client.start`. A fatal error (no
``stream_id``) or a lost connection raises :class:`ServerError` in every open
stream (code ``connection_closed`` when the server gave none).

An ``opus`` stream (``format="opus"``) yields one chunk per Opus packet: ``pcm`` is the
packet's bytes (uint8), ``len(chunk)`` its 960 samples at 48 kHz, and ``stream.started.codec``
holds the decoder parameters (``pre_skip``, docs/protocol.md).

Encoding and parsing come from :mod:`codecd.protocol` (sans-I/O).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Union

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from . import __version__
from .protocol import (
    PROTOCOL_VERSION,
    AudioFrame,
    Cancel,
    Cancelled,
    Done,
    End,
    Error,
    Hello,
    ProtocolError,
    ServerHello,
    Start,
    Started,
    TokenChunk,
    encode_client,
    encode_token_frame,
    parse_audio,
    parse_server_text,
)

__all__ = ["Client", "Stream", "AudioChunk", "ServerError", "ConnectionLost", "pcm_to_array",
           "to_float32"]

logger = logging.getLogger(__name__)

_stream_serial = itertools.count(1)


class ServerError(Exception):
    """An ``error`` from the server (or a lost connection): ``code``, ``message``."""

    def __init__(self, code: str, message: str, stream_id: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.stream_id = stream_id
        self.details: dict[str, Any] = dict(details or {})


class ConnectionLost(ServerError):
    """The connection closed while the stream was open (code ``connection_closed``)."""


@dataclass(frozen=True, eq=False)
class AudioChunk:
    """One audio frame of a stream: ``pcm`` in the stream's format (int16, float32, uint8
    μ-law bytes, or the uint8 bytes of one Opus packet), ``sample_offset`` = output samples
    of the stream before it."""

    pcm: npt.NDArray[Any]
    sample_offset: int
    seq: int
    #: time.monotonic() when the reader received the frame
    received_at: float = field(default_factory=time.monotonic)
    #: samples the frame decodes to when ``pcm`` is encoded (opus: 960); None: ``pcm.size``
    samples: int | None = None

    def __len__(self) -> int:
        return int(self.pcm.size) if self.samples is None else self.samples


def pcm_to_array(data: bytes, fmt: str) -> npt.NDArray[Any]:
    """Raw PCM bytes of a stream's format as a numpy array (a read-only view)."""
    if fmt == "pcm_s16le":
        return np.frombuffer(data, dtype="<i2")
    if fmt == "pcm_f32le":
        return np.frombuffer(data, dtype="<f4")
    if fmt in ("mulaw", "opus"):  # opus: one packet's bytes
        return np.frombuffer(data, dtype=np.uint8)
    raise ValueError(f"unknown format {fmt!r}")


def to_float32(pcm: npt.NDArray[Any], fmt: str) -> npt.NDArray[np.float32]:
    """PCM in a stream's format as float32 in [-1, 1] (μ-law is expanded, G.711)."""
    if fmt == "pcm_f32le":
        return np.asarray(pcm, dtype=np.float32)
    if fmt == "pcm_s16le":
        return (np.asarray(pcm, dtype=np.float32) / 32768.0).astype(np.float32)
    if fmt == "mulaw":
        u = ~np.asarray(pcm, dtype=np.uint8)
        sign = (u & 0x80) != 0
        exp = (u >> 4) & 0x07
        mant = u & 0x0F
        mag = (((mant.astype(np.int32) << 3) + 0x84) << exp.astype(np.int32)) - 0x84
        return (np.where(sign, -mag, mag) / 32768.0).astype(np.float32)
    raise ValueError(f"unknown format {fmt!r}")


# items of a stream's queue: audio, or one terminal item
_Item = Union[AudioChunk, Done, Cancelled, ServerError]


class Stream:
    """One stream of a :class:`Client`; created by :meth:`Client.start`."""

    def __init__(self, client: Client, stream_id: str, start: Start, queue_size: int) -> None:
        self._client = client
        self.stream_id = stream_id
        self.model = start.model
        self.layout = start.layout
        self.requested: Start = start
        self.started: Started | None = None
        self.done_info: dict[str, Any] | None = None
        self.cancelled = False
        self.error: ServerError | None = None
        self.samples_received = 0
        self.chunks_received = 0
        self.first_audio_at: float | None = None
        self.started_at: float | None = None
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=max(1, queue_size))
        self._started_fut: asyncio.Future[Started] = asyncio.get_running_loop().create_future()
        self._terminal = False  # a terminal item is queued (reader side)
        self._finished = False  # the iterator returned it (consumer side)
        self._ended = False

    # ----------------------------------------------------------- properties

    @property
    def format(self) -> str:
        return self.started.format if self.started else self.requested.format

    @property
    def sample_rate(self) -> int:
        """Output sample rate (from ``started``)."""
        if self.started is None:
            raise RuntimeError("stream not started")
        return int(self.started.sample_rate)

    @property
    def latency_samples(self) -> int:
        return int(self.started.latency_samples) if self.started else 0

    @property
    def open(self) -> bool:
        """True until the terminal message arrived."""
        return not self._terminal

    # ---------------------------------------------------------------- input

    async def send_tokens(self, tokens: npt.ArrayLike, *, binary: bool = False) -> None:
        """Tokens of an orpheus layout (ids or codes), any number, any split."""
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if binary:
            await self._client._send(encode_token_frame(self.stream_id, arr))
        else:
            await self._client._send(encode_client(TokenChunk(self.stream_id, tokens=arr)))

    async def send_levels(self, levels: Sequence[npt.ArrayLike] | Mapping[int, npt.ArrayLike],
                          *, binary: bool = False) -> None:
        """Codes of the levels layout: one array per level (any lengths, may be empty)."""
        items = levels.items() if isinstance(levels, Mapping) else enumerate(levels)
        lv = {int(l): np.asarray(a, dtype=np.int64).reshape(-1) for l, a in items}
        if binary:
            for l, a in sorted(lv.items()):
                if a.size:
                    await self._client._send(encode_token_frame(self.stream_id, a, level=l))
        else:
            await self._client._send(encode_client(TokenChunk(self.stream_id, levels=lv)))

    async def end(self) -> None:
        """No more tokens; the server decodes the rest and then sends ``done``."""
        if self._ended or self._terminal:
            return
        self._ended = True
        await self._client._send(encode_client(End(self.stream_id)))

    async def cancel(self) -> None:
        """Drop the stream now; iteration ends at ``cancelled`` (audio in flight before it is
        still yielded)."""
        if self._terminal:
            return
        await self._client._send(encode_client(Cancel(self.stream_id)))

    # --------------------------------------------------------------- output

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._finished:
            if self.error is not None:
                raise self.error
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, AudioChunk):
            return item
        self._finished = True
        if isinstance(item, Done):
            self.done_info = {"samples": item.samples, "duration_s": item.duration_s}
            raise StopAsyncIteration
        if isinstance(item, Cancelled):
            self.cancelled = True
            raise StopAsyncIteration
        self.error = item
        raise item

    async def read_all(self) -> npt.NDArray[Any]:
        """Every remaining chunk concatenated (in the output format); raises ServerError.
        Not for ``opus`` (packets must stay apart: iterate the stream)."""
        if self.format == "opus":
            raise ValueError("read_all on an opus stream: iterate it, one chunk per packet")
        parts = [c.pcm async for c in self]
        if not parts:
            return pcm_to_array(b"", self.format)
        return np.concatenate(parts)

    # --------------------------------------------------------- reader side

    async def _put(self, item: _Item) -> None:
        if self._terminal:
            return
        if not isinstance(item, AudioChunk):
            self._terminal = True
            self._client._streams.pop(self.stream_id, None)
        else:
            self.samples_received += len(item)
            self.chunks_received += 1
            if self.first_audio_at is None:
                self.first_audio_at = item.received_at
        await self._queue.put(item)

    def _put_nowait_terminal(self, item: ServerError) -> None:
        """Fail the stream without waiting (connection teardown): drop queued audio if full."""
        if self._terminal:
            return
        self._terminal = True
        self._client._streams.pop(self.stream_id, None)
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(item)


class Client:
    """A connection to a codecd server (``async with Client(url) as c``)."""

    def __init__(self, url: str, token: str | None = None, *, queue_size: int = 256,
                 open_timeout: float | None = 10.0, max_size: int | None = 2**24,
                 client_name: str | None = None, send_hello: bool = True) -> None:
        self.url = url
        self.token = token
        self.queue_size = queue_size
        self.open_timeout = open_timeout
        self.max_size = max_size
        self.client_name = client_name or f"codecd-client/{__version__}"
        self.send_hello = send_hello
        self.hello: dict[str, Any] = {}
        #: the fatal error that ended the connection, if any
        self.error: ServerError | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._streams: dict[str, Stream] = {}
        self._send_lock = asyncio.Lock()
        self._closed = False

    # -------------------------------------------------------- connection

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def connect(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        self._ws = await connect(self.url, additional_headers=headers, max_size=self.max_size,
                                 open_timeout=self.open_timeout, compression=None)
        try:
            first = await asyncio.wait_for(self._ws.recv(), self.open_timeout)
        except ConnectionClosed as e:
            raise ConnectionLost("connection_closed", f"closed before hello: {_close_text(e)}"
                                 ) from None
        if not isinstance(first, str):
            await self._ws.close()
            raise ServerError("bad_message", "server sent binary before hello")
        msg = parse_server_text(first)
        if isinstance(msg, Error):
            await self._ws.close()
            raise ServerError(msg.code, msg.message, None, msg.details)
        if not isinstance(msg, ServerHello):
            await self._ws.close()
            raise ServerError("bad_message", f"expected hello, got {type(msg).__name__}")
        self.hello = dict(msg.info)
        if self.hello.get("version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
            await self._ws.close()
            raise ServerError("bad_message", f"server speaks version {self.hello.get('version')}")
        if self.send_hello:
            await self._send(encode_client(Hello(version=PROTOCOL_VERSION,
                                                 client=self.client_name)))
        self._reader = asyncio.create_task(self._read_loop(), name="codecd-client-reader")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        self._fail_all(ConnectionLost("connection_closed", "client closed the connection"))

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        """Models of the server's hello, by name."""
        return {m["name"]: m for m in self.hello.get("models", []) if isinstance(m, dict)}

    @property
    def open_streams(self) -> list[str]:
        return list(self._streams)

    async def start(self, model: str, layout: str = "orpheus_ids", format: str = "pcm_s16le",
                    sample_rate: int | None = None, *, latency: str | None = None,
                    noise: bool | None = None, seed: int | None = None,
                    voice: str | None = None, stream_id: str | None = None,
                    timeout: float | None = 30.0, bitrate: int | None = None,
                    codebooks: int | None = None,
                    window: str | Mapping[str, int | str] | None = None) -> Stream:
        """Open a stream and wait for ``started``; raises ServerError when refused.
        ``bitrate`` (b/s) is for ``format="opus"`` only; ``codebooks``: the model's first
        levels the stream sends (Mimi: 8 for Moshi; None: all of them); ``window``: a windowed
        model's window, a preset name or ``{"preset", "chunk", "lookback", "lookahead",
        "overlap"}`` (any of them; docs/protocol.md)."""
        if self.error is not None:
            raise self.error
        if self._ws is None or self._closed:
            raise RuntimeError("client is not connected")
        sid = stream_id or f"s{next(_stream_serial)}"
        if sid in self._streams:
            raise ValueError(f"stream {sid!r} is open on this connection")
        msg = Start(stream_id=sid, model=model, layout=layout, format=format,
                    sample_rate=sample_rate, latency=latency or "exact",
                    noise=bool(noise), seed=seed, voice=voice, bitrate=bitrate,
                    codebooks=codebooks,
                    window={"preset": window} if isinstance(window, str) else window)
        st = Stream(self, sid, msg, self.queue_size)
        self._streams[sid] = st
        st.started_at = time.monotonic()
        try:
            await self._send(encode_client(msg))
            st.started = await asyncio.wait_for(asyncio.shield(st._started_fut), timeout)
        except BaseException:
            if self._streams.get(sid) is st:
                del self._streams[sid]
            raise
        return st

    # --------------------------------------------------------- internals

    async def _send(self, data: str | bytes) -> None:
        if self.error is not None:
            raise self.error
        if self._ws is None:
            raise RuntimeError("client is not connected")
        try:
            async with self._send_lock:
                await self._ws.send(data)
        except ConnectionClosed as e:
            raise self.error or ConnectionLost("connection_closed", _close_text(e)) from None

    async def _read_loop(self) -> None:
        assert self._ws is not None
        try:
            async for data in self._ws:
                if isinstance(data, bytes):
                    await self._on_audio(parse_audio(data))
                else:
                    await self._on_text(data)
        except ConnectionClosed as e:
            self._fail_all(self.error or ConnectionLost("connection_closed", _close_text(e)))
            return
        except ProtocolError as e:
            self.error = ServerError(str(e.code), f"bad frame from server: {e}")
            self._fail_all(self.error)
            await self._ws.close(1002, "bad frame")
            return
        except asyncio.CancelledError:
            self._fail_all(ConnectionLost("connection_closed", "reader cancelled"))
            raise
        except Exception as e:  # noqa: BLE001 - never leave streams hanging
            logger.exception("codecd client reader failed")
            self._fail_all(ConnectionLost("internal_error", f"client reader failed: {e}"))
            return
        rcvd = self._ws.close_code
        self._fail_all(self.error or ConnectionLost(
            "connection_closed", f"connection closed (code {rcvd})"))

    async def _on_audio(self, f: AudioFrame) -> None:
        st = self._streams.get(f.stream_id)
        if st is None:
            logger.debug("audio for unknown stream %r dropped", f.stream_id)
            return
        samples = None
        if st.format == "opus":
            codec = st.started.codec if st.started is not None else None
            samples = int((codec or {}).get("frame_samples", 960))
        await st._put(AudioChunk(pcm_to_array(f.data, st.format), int(f.sample_offset),
                                 int(f.seq), samples=samples))

    async def _on_text(self, data: str) -> None:
        msg = parse_server_text(data)
        if isinstance(msg, Started):
            st = self._streams.get(msg.stream_id)
            if st is not None and not st._started_fut.done():
                st.started = msg  # before start() resumes: the audio after it reads it
                st._started_fut.set_result(msg)
        elif isinstance(msg, (Done, Cancelled)):
            st = self._streams.get(msg.stream_id)
            if st is not None:
                await st._put(msg)
        elif isinstance(msg, Error):
            err = ServerError(msg.code, msg.message, msg.stream_id, msg.details)
            if msg.stream_id is None:
                self.error = err
                self._fail_all(err)
                return
            st = self._streams.get(msg.stream_id)
            if st is None:
                return
            if not st._started_fut.done():  # refused start
                st._started_fut.set_exception(err)
                self._streams.pop(msg.stream_id, None)
                return
            await st._put(err)
        elif isinstance(msg, ServerHello):
            logger.warning("second hello from server ignored")

    def _fail_all(self, err: ServerError) -> None:
        for st in list(self._streams.values()):
            e = type(err)(err.code, err.message, st.stream_id, err.details)
            if not st._started_fut.done():
                st._started_fut.set_exception(e)
                st._started_fut.exception()  # mark retrieved
            st._put_nowait_terminal(e)
        self._streams.clear()


def _close_text(e: ConnectionClosed) -> str:
    rcvd = e.rcvd
    if rcvd is None:
        return "connection closed without a close frame"
    return f"connection closed ({rcvd.code}{': ' + rcvd.reason if rcvd.reason else ''})"
