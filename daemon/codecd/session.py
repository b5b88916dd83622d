"""Per-connection state machine of codecd, sans-I/O.

A :class:`Session` is fed what the connection receives (:meth:`Session.receive_text`,
:meth:`Session.receive_binary`, or already parsed messages with
:meth:`Session.receive`) and what the decode engine reports
(:meth:`Session.on_opened`, :meth:`Session.on_audio`, :meth:`Session.on_done`,
:meth:`Session.on_engine_error`),
plus a periodic :meth:`Session.tick`. Every call returns a list of *actions*
(:mod:`codecd.actions`) for the server shell to carry out, in order: engine
commands (``EngineOpen``, ``EnginePush``, ``EngineFinish``, ``EngineCancel``) and
connection output (``SendText``, ``SendBinary``, ``Close``).
Nothing here does I/O, sleeps or imports asyncio.

Stream life cycle: ``start`` -> ``EngineOpen`` -> engine ``on_opened`` ->
``started``; tokens (``EnginePush`` of whole groups, accepted before
``started`` too) -> ``end`` (``EngineFinish``) -> engine ``on_done`` -> ``done``.
The session owns the order of what the client hears: ``started`` only once the
engine has the stream (before any audio), a refusal (``busy``, an engine error)
instead of it, never both. Every stream ends with exactly one terminal message
to the client: ``done``, ``cancelled`` or an ``error`` carrying its ``stream_id``.
After that its id is *closed*: tokens, ``end`` and ``cancel`` for it are dropped
silently (the client may have had them in flight) until a new ``start`` reuses
it. Engine keys are unique per (session, stream), so late engine results for
an old stream never reach a new one with the same id.

Errors: a protocol error with a ``stream_id`` fails that stream only (engine
cancelled, slot released, other streams unaffected); one without closes the
connection (``error`` then :class:`Close` with the code's close code).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
import numpy.typing as npt

from . import __version__
from .actions import (
    Action,
    Close,
    EngineCancel,
    EngineFinish,
    EngineOpen,
    EnginePush,
    GenerateText,
    SendBinary,
    SendText,
    StreamKey,
)
from .audio import OutputConverter
from .budget import DEFAULT_OUTPUT_BUDGET_S, OutputBudget
from .families import ModelSpec, StreamRefused, family_for, get_layout
from .families.layout import Assembler, LayoutError
from .protocol import (
    DEFAULT_LIMITS,
    FORMATS,
    LAYOUTS,
    MULAW_DEFAULT_RATE,
    OPUS_SAMPLE_RATE,
    SEQUENCE_KEY,
    Cancel,
    ClientMessage,
    End,
    ErrorCode,
    Hello,
    Limits,
    Mark,
    ProtocolError,
    Start,
    TokenChunk,
    close_code_for,
    encode_audio,
    encode_cancelled,
    encode_done,
    encode_error,
    encode_hello,
    encode_mark,
    encode_started,
    parse_binary,
    parse_text,
    truncate_reason,
)
from .speech.encode import CodecsMissing, OpusPackets, opus_available

__all__ = ["SessionLimits", "SessionMetrics", "Session", "MAX_PENDING_MARKS"]

logger = logging.getLogger(__name__)

#: unanswered ``mark`` messages one stream may hold
MAX_PENDING_MARKS = 1024


# ------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class SessionLimits:
    """Per-connection limits (the server-wide stream limit is the ``admit`` hook's)."""

    max_streams: int = 16
    #: tokens accepted but not yet decoded, per stream (~100 s of Orpheus audio)
    max_pending_tokens: int = 8192
    #: seconds of audio that a stream's pushed frames may cover
    max_duration_s: float = 600.0
    #: an open stream (before ``end``) without input for this long fails
    idle_timeout_s: float = 30.0
    #: streams ended but not reported done by the engine after this long fail
    finish_timeout_s: float = 120.0
    #: closed stream ids remembered for dropping their in-flight messages
    max_closed_ids: int = 1024
    #: seconds of audio the connection may owe its client (queued, or decodable in the
    #: engine) before its streams' codes wait (back-pressure); <= 0: no budget
    output_budget_s: float = DEFAULT_OUTPUT_BUDGET_S
    protocol: Limits = DEFAULT_LIMITS


@dataclass
class SessionMetrics:
    """Counters for the server to export. Pass one instance to many sessions to aggregate."""

    streams_started: int = 0
    streams_done: int = 0
    streams_cancelled: int = 0
    streams_failed: int = 0
    streams_refused: int = 0
    tokens_received: int = 0
    samples_sent: int = 0
    audio_bytes_sent: int = 0
    messages_received: int = 0
    messages_dropped: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "errors"}
        d["errors"] = dict(self.errors)
        return d


_session_ids = itertools.count(1)


# ------------------------------------------------------------------------ streams


_OPEN = "open"
_ENDING = "ending"


@dataclass(eq=False)
class _Stream:
    key: StreamKey
    start: Start
    spec: ModelSpec
    out_rate: int
    #: the output path: PCM conversion, or the ``opus`` encoder (packets of 20 ms)
    converter: OutputConverter | OpusPackets
    admitted: bool
    last_input: float
    assembler: Assembler  # the layout's: tokens -> per-level codes
    takes_levels: bool  # the layout reads ``levels`` (else ``tokens``) of tokens messages
    strides: tuple[int, ...]  # of the levels this stream sends (the plan's)
    codes_per_frame: float
    started: str = ""  # the ``started`` message, sent once the engine has opened the stream
    opened: bool = False
    state: str = _OPEN
    ended_at: float = 0.0
    level_codes: list[int] = field(default_factory=list)  # codes pushed per level
    tokens_accepted: int = 0
    samples_in: int = 0  # model-rate samples from the engine
    seq: int = 0
    samples_sent: int = 0  # output samples in the audio frames sent (opus: of the packets)
    #: where the stream's audio begins in its output samples (opus: the encoder's pre-skip)
    offset0: int = 0
    marks: list[tuple[int, str | int]] = field(default_factory=list)  # (output offset, id)
    from_text: bool = False  # a start with ``text``: the tokens come from the upstream LM
    hold_tokens: float = 0.0  # the tokens the decoder holds back by design (its look-ahead)

    @property
    def stream_id(self) -> str:
        return self.start.stream_id

    def frames_pushed(self) -> int:
        return max((c * s for c, s in zip(self.level_codes, self.strides)), default=0)

    def pending_tokens(self) -> float:
        decoded_frames = self.samples_in / self.spec.hop_length
        return self.tokens_accepted - decoded_frames * self.codes_per_frame


def _as_sent(e: LayoutError, m: TokenChunk) -> tuple[str, dict[str, Any]]:
    """The message and details of a layout error, with ``value`` as the client sent it:
    a token beyond int64 reaches the layouts clamped, and its text was kept by the parser
    (``value`` is then that decimal text, as a string)."""
    details = dict(e.details)
    value = details.get("value")
    if not m.wide or not isinstance(value, int):
        return str(e), details
    level = details.get("level")
    key = SEQUENCE_KEY if level is None else int(level)
    arr = m.tokens if level is None else (m.levels or {}).get(key)
    texts = m.wide.get(key, {})
    if arr is None or not texts:
        return str(e), details
    hits = np.flatnonzero(arr == value)
    if not hits.size or int(hits[0]) not in texts:
        return str(e), details
    text = texts[int(hits[0])]
    details["value"] = text
    short = text if len(text) <= 40 else f"{text[:20]}...({len(text.lstrip('-'))} digits)"
    return str(e).replace(str(value), short, 1), details


class _Fail(Exception):
    """Internal: fail the current stream with this error."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# ------------------------------------------------------------------------ session


class Session:
    """State of one client connection: its streams, their token assembly and output.

    ``admit()`` is asked before each stream opens (server-wide limit): False
    refuses the start with ``busy``. ``release()`` is called exactly once for
    every admitted stream when it is freed (done, cancelled, failed, closed).
    """

    def __init__(self, models: Mapping[str, ModelSpec], limits: SessionLimits = SessionLimits(),
                 clock: Callable[[], float] = time.monotonic, *,
                 admit: Callable[[], bool] = lambda: True,
                 release: Callable[[], None] = lambda: None,
                 metrics: SessionMetrics | None = None,
                 hello_info: Mapping[str, Any] | None = None) -> None:
        self.models = dict(models)
        self.limits = limits
        self.clock = clock
        self.admit = admit
        self.release = release
        self.metrics = metrics if metrics is not None else SessionMetrics()
        self.hello_info = hello_info
        self.id = next(_session_ids)
        self.closed = False
        self.client_hello: Hello | None = None
        self._serial = itertools.count()
        self._streams: dict[str, _Stream] = {}
        self._by_key: dict[StreamKey, _Stream] = {}
        self._closed_ids: OrderedDict[str, None] = OrderedDict()
        self._drop_bare = False  # the bare-array stream is gone (done, cancelled, failed): drop its tail
        self.budget = OutputBudget(limits.output_budget_s)

    # --------------------------------------------------------------- inspection

    @property
    def open_streams(self) -> list[str]:
        return list(self._streams)

    def stream_key(self, stream_id: str) -> StreamKey | None:
        st = self._streams.get(stream_id)
        return st.key if st else None

    def default_hello(self) -> dict[str, Any]:
        pl = self.limits.protocol
        return {
            "server": f"codecd/{__version__}",
            "models": [family_for(m.arch, generic=True).describe(m) for m in self.models.values()],
            "formats": [f for f in FORMATS if f != "opus" or opus_available()],
            "layouts": list(LAYOUTS),
            "limits": {
                "max_message_bytes": pl.max_message_bytes,
                "max_tokens_per_message": pl.max_tokens_per_message,
                "max_stream_id_len": pl.max_stream_id_len,
                "max_streams": self.limits.max_streams,
                "max_pending_tokens": self.limits.max_pending_tokens,
                "max_duration_s": self.limits.max_duration_s,
                "idle_timeout_s": self.limits.idle_timeout_s,
                "output_budget_s": self.limits.output_budget_s,
            },
        }

    # ------------------------------------------------------------ connection

    def connect(self) -> list[Action]:
        """The server's ``hello``, sent first on a new connection."""
        return [SendText(encode_hello(self.hello_info if self.hello_info is not None
                                      else self.default_hello()))]

    def receive_text(self, data: str) -> list[Action]:
        """A text frame from the client."""
        if self.closed:
            return []
        self.metrics.messages_received += 1
        try:
            msg = parse_text(data, self.limits.protocol)
        except ProtocolError as e:
            return self._protocol_error(e)
        return self._dispatch(msg)

    def receive_binary(self, data: bytes) -> list[Action]:
        """A binary frame from the client."""
        if self.closed:
            return []
        self.metrics.messages_received += 1
        try:
            msg = parse_binary(data, self.limits.protocol)
        except ProtocolError as e:
            return self._protocol_error(e)
        return self._dispatch(msg)

    def receive(self, msg: ClientMessage) -> list[Action]:
        """An already parsed client message."""
        if self.closed:
            return []
        self.metrics.messages_received += 1
        return self._dispatch(msg)

    def fail_connection(self, code: ErrorCode | str, message: str, *,
                        name_streams: bool = False) -> list[Action]:
        """End the connection with an error (server-side reasons: ``slow_reader``,
        ``unauthorized``, ``shutting_down``, ...): ``error``, engine cancels, ``Close``.
        ``name_streams``: first an ``error`` with the same code for each open stream, so
        that every stream the client started ends with a message naming it."""
        if self.closed:
            return []
        code = ErrorCode(code)
        self._count_error(code)
        logger.info("session %d: closing: %s: %s", self.id, code.value, message)
        acts: list[Action] = []
        if name_streams:
            acts += [SendText(encode_error(code, message, sid)) for sid in self._streams]
        acts.append(SendText(encode_error(code, message)))
        acts += self._drop_all(failed=True)
        acts.append(Close(close_code_for(code), truncate_reason(f"{code.value}: {message}")))
        self.closed = True
        return acts

    def shutdown(self, message: str = "server is shutting down") -> list[Action]:
        """``shutting_down`` for each open stream, then for the connection, and Close(1001)."""
        return self.fail_connection(ErrorCode.SHUTTING_DOWN, message, name_streams=True)

    def connection_lost(self) -> list[Action]:
        """The connection closed (either side): cancel every stream, release their slots."""
        if self.closed and not self._streams:
            return []
        self.closed = True
        return self._drop_all(failed=False)

    def tick(self, now: float | None = None) -> list[Action]:
        """Periodic check of time limits: idle open streams and ended streams the engine
        returns no audio for (since ``end`` or their last audio) fail with ``idle_timeout``
        / ``engine_error``."""
        if self.closed:
            return []
        t = self.clock() if now is None else now
        acts: list[Action] = []
        for st in list(self._streams.values()):
            if st.state == _OPEN and t - st.last_input > self.limits.idle_timeout_s:
                acts += self._fail(st, ErrorCode.IDLE_TIMEOUT,
                                   f"no input for {self.limits.idle_timeout_s:g} s")
            elif st.state == _ENDING and t - st.ended_at > self.limits.finish_timeout_s:
                acts += self._fail(st, ErrorCode.ENGINE_ERROR,
                                   f"decoder made no progress for "
                                   f"{self.limits.finish_timeout_s:g} s after end")
        return acts

    # ---------------------------------------------------------- output budget

    def output_room_s(self, key: StreamKey) -> float:
        """Seconds of audio the stream's codes may add in the engine now (the connection's
        output budget; ``inf`` without one). The server holds back what does not fit."""
        st = self._by_key.get(key)
        if st is None:
            return float("inf")
        group_s = max(st.strides) * st.spec.hop_length / st.spec.sample_rate
        return self.budget.room_s(key, group_s)

    def on_released(self, key: StreamKey, frames: int) -> None:
        """The server handed ``frames`` finest-level frames of the stream to the engine."""
        st = self._by_key.get(key)
        if st is not None and frames:
            self.budget.released(key, frames * st.spec.hop_length / st.spec.sample_rate)

    def on_sent(self, action: SendBinary) -> None:
        """An audio frame was written to the socket (or dropped with the connection)."""
        if action.audio_s:
            self.budget.sent(action.audio_s, len(action.data))

    # ---------------------------------------------------------------- engine

    def on_opened(self, key: StreamKey) -> list[Action]:
        """The engine has opened the stream: now the client hears ``started``."""
        st = self._by_key.get(key)
        if st is None or st.opened:
            return []
        st.opened = True
        return [SendText(st.started)]

    def on_audio(self, key: StreamKey, pcm_f32: npt.ArrayLike) -> list[Action]:
        """Decoded audio (float32, model rate) for a stream; stale keys are ignored."""
        st = self._by_key.get(key)
        if st is None:
            return []
        acts = [] if st.opened else self.on_opened(key)  # started always comes first
        pcm = np.asarray(pcm_f32, dtype=np.float32).reshape(-1)
        st.samples_in += int(pcm.size)
        self.budget.produced(key, pcm.size / st.spec.sample_rate)
        if st.state == _ENDING:  # progress: the finish deadline counts from the last audio
            st.ended_at = self.clock()
        return acts + self._audio_frames(st, pcm, False) + self._marks_due(st, False)

    def on_done(self, key: StreamKey, total_samples: int) -> list[Action]:
        """The engine finished a stream: flush its converter, send ``done``, free it."""
        st = self._by_key.get(key)
        if st is None:
            return []
        if st.state != _ENDING:
            logger.warning("session %d: engine reported %s done before end", self.id, key)
        acts = [] if st.opened else self.on_opened(key)
        if total_samples != st.samples_in:
            logger.warning("session %d: %s: engine reports %d samples, %d received", self.id,
                           key, total_samples, st.samples_in)
        acts += self._audio_frames(st, np.zeros(0, dtype=np.float32), True)
        acts += self._marks_due(st, True)
        acts.append(SendText(encode_done(st.stream_id, st.samples_sent, st.out_rate)))
        self._free(st)
        self.metrics.streams_done += 1
        if not self._streams:  # an LM's ids printed after its stop, still in flight
            self._drop_bare = True
        return acts

    def on_engine_error(self, key: StreamKey, code: str, message: str) -> list[Action]:
        """The engine failed a stream: ``error`` (the given code when it is a protocol
        code, else ``engine_error``) and the stream fails; other streams continue."""
        st = self._by_key.get(key)
        if st is None:
            return []
        try:
            ec = ErrorCode(code)
        except ValueError:
            ec = ErrorCode.ENGINE_ERROR
            message = f"{code}: {message}"
        if ec == ErrorCode.BUSY and st.opened:
            # busy refuses a start; a stream already told started lost its decoder
            # (a worker that died and is restarting): that is engine_error
            ec = ErrorCode.ENGINE_ERROR
            message = f"decoder lost: {message}"
        return self._fail(st, ec, message)

    # ------------------------------------------------------------- internals

    def _count_error(self, code: ErrorCode) -> None:
        self.metrics.errors[code.value] += 1

    def _audio_frames(self, st: _Stream, pcm: npt.NDArray[np.float32],
                      last: bool) -> list[Action]:
        """Model-rate audio through the stream's output path (``last``: flush it): PCM in
        one binary frame, opus one frame per packet."""
        conv = st.converter
        if isinstance(conv, OpusPackets):
            chunks = conv.flush() if last else conv.feed(pcm)
        else:
            chunks = [conv.flush() if last else conv.feed(pcm)]
        acts: list[Action] = []
        for data, n in chunks:
            acts += self._audio_frame(st, data, n)
        return acts

    def _audio_frame(self, st: _Stream, data: bytes, n: int) -> list[Action]:
        if not n:
            return []
        offset = st.samples_sent
        st.samples_sent += n
        frame = encode_audio(st.stream_id, st.seq, offset, data)
        st.seq += 1
        self.metrics.samples_sent += n
        self.metrics.audio_bytes_sent += len(data)
        seconds = n / st.out_rate
        self.budget.queued(seconds, len(frame))
        return [SendBinary(frame, st.key, seconds)]

    def _marks_due(self, st: _Stream, final: bool) -> list[Action]:
        """``mark`` answers whose audio has all been sent (all of them at the end)."""
        out: list[Action] = []
        sent = st.samples_sent
        while st.marks and (final or st.marks[0][0] <= sent):
            off, mid = st.marks.pop(0)
            out.append(SendText(encode_mark(st.stream_id, mid, min(off, sent))))
        return out

    def _on_mark(self, m: Mark) -> list[Action]:
        r = self._resolve(m.stream_id)
        if not isinstance(r, _Stream):
            return r
        st = r
        if len(st.marks) >= MAX_PENDING_MARKS:
            return self._fail(st, ErrorCode.BAD_MESSAGE,
                              f"more than {MAX_PENDING_MARKS} marks pending")
        # the output sample where the audio of frames pushed after the mark begins
        model_samples = st.frames_pushed() * st.spec.hop_length
        off = model_samples * st.out_rate // st.spec.sample_rate + st.offset0
        st.marks.append((off, m.id))
        return self._marks_due(st, False)

    def _mark_closed(self, stream_id: str) -> None:
        self._closed_ids[stream_id] = None
        self._closed_ids.move_to_end(stream_id)
        while len(self._closed_ids) > self.limits.max_closed_ids:
            self._closed_ids.popitem(last=False)

    def _free(self, st: _Stream) -> None:
        if isinstance(st.converter, OpusPackets):
            st.converter.close()  # done, cancelled, failed or dropped: the encoder goes
        self._streams.pop(st.stream_id, None)
        self._by_key.pop(st.key, None)
        self.budget.drop(st.key)
        self._mark_closed(st.stream_id)
        if st.admitted:
            st.admitted = False
            self.release()

    def _fail(self, st: _Stream, code: ErrorCode, message: str,
              details: Mapping[str, Any] | None = None) -> list[Action]:
        """Fail one stream: ``error`` scoped to it, EngineCancel, free."""
        logger.info("session %d: stream %r failed: %s: %s", self.id, st.stream_id, code.value,
                    message)
        self._count_error(code)
        self.metrics.streams_failed += 1
        self._free(st)
        if not self._streams:
            self._drop_bare = True
        return [EngineCancel(st.key), SendText(encode_error(code, message, st.stream_id, details))]

    def _refuse(self, stream_id: str, code: ErrorCode, message: str,
                details: Mapping[str, Any] | None = None) -> list[Action]:
        """An error scoped to a stream id that is not open (a refused start, unknown id)."""
        self._count_error(code)
        self._mark_closed(stream_id)
        return [SendText(encode_error(code, message, stream_id, details))]

    def _drop_all(self, failed: bool) -> list[Action]:
        acts: list[Action] = []
        for st in list(self._streams.values()):
            acts.append(EngineCancel(st.key))
            self._free(st)
            if failed:
                self.metrics.streams_failed += 1
            else:
                self.metrics.streams_cancelled += 1
        return acts

    def _bare_targets(self) -> list[_Stream]:
        """The streams a bare array may be meant for: the open ones or, when none is open, the
        connection's only stream, ending (a stop id or ``end`` came first: its trailing ids are
        that stream's ``bad_message``, not the connection's ``unknown_stream``)."""
        opened = [s for s in self._streams.values() if s.state == _OPEN]
        if not opened and len(self._streams) == 1:
            return list(self._streams.values())
        return opened

    def _protocol_error(self, e: ProtocolError) -> list[Action]:
        sid = e.stream_id
        if sid is None and e.bare:
            # a bad bare array belongs to the connection's only open stream, if any
            opened = self._bare_targets()
            if len(opened) == 1:
                sid = opened[0].stream_id
            elif not opened and self._drop_bare:
                self.metrics.messages_dropped += 1
                return []
        if sid is None:
            return self.fail_connection(e.code, e.message)
        st = self._streams.get(sid)
        if st is not None:
            return self._fail(st, e.code, e.message, e.details)
        if e.msg_type != "start" and sid in self._closed_ids:
            self.metrics.messages_dropped += 1
            return []
        if e.msg_type == "start":
            self.metrics.streams_refused += 1
        return self._refuse(sid, e.code, e.message, e.details)

    def _dispatch(self, msg: ClientMessage) -> list[Action]:
        try:
            if isinstance(msg, TokenChunk):
                return self._on_tokens(msg)
            if isinstance(msg, Start):
                return self._on_start(msg)
            if isinstance(msg, End):
                return self._on_end(msg)
            if isinstance(msg, Cancel):
                return self._on_cancel(msg)
            if isinstance(msg, Mark):
                return self._on_mark(msg)
            if isinstance(msg, Hello):
                if self.client_hello is not None:
                    return self.fail_connection(ErrorCode.BAD_MESSAGE, "hello: sent twice")
                self.client_hello = msg
                logger.debug("session %d: client hello %r", self.id, msg)
                return []
        except ProtocolError as e:
            return self._protocol_error(e)
        except Exception as e:  # a bug: end the connection, keep the server
            logger.exception("session %d: internal error", self.id)
            return self.fail_connection(ErrorCode.INTERNAL_ERROR, type(e).__name__)
        raise TypeError(f"not a client message: {type(msg).__name__}")

    # ----------------------------------------------------------------- start

    def _on_start(self, m: Start) -> list[Action]:
        sid = m.stream_id
        old = self._streams.get(sid)
        if old is not None:
            # the client believes the id is free: continuing the old stream would mix audio
            self.metrics.streams_refused += 1
            return self._fail(old, ErrorCode.DUPLICATE_STREAM,
                              f"stream {sid!r} is already open; the open stream and this "
                              "start are both failed")

        def refuse(code: ErrorCode, message: str) -> list[Action]:
            self.metrics.streams_refused += 1
            return self._refuse(sid, code, message)

        if len(self._streams) >= self.limits.max_streams:
            return refuse(ErrorCode.TOO_MANY_STREAMS,
                          f"connection has {len(self._streams)} open streams (limit "
                          f"{self.limits.max_streams})")
        spec = self.models.get(m.model)
        if spec is None:
            return refuse(ErrorCode.UNKNOWN_MODEL,
                          f"model {m.model!r} is not loaded; models: {', '.join(self.models)}")
        if m.layout not in spec.layouts:
            return refuse(ErrorCode.BAD_LAYOUT, f"model {spec.name!r} takes layouts "
                                                f"{', '.join(spec.layouts)}, not {m.layout!r}")
        speaker = None
        if m.text is not None:  # the voice is the LM's speaker, not the decoder's
            from .speech.prompt import DEFAULT_VOICE, OPENAI_VOICES, ORPHEUS_VOICES

            speaker = OPENAI_VOICES.get(m.voice or DEFAULT_VOICE, m.voice or DEFAULT_VOICE)
            if speaker not in ORPHEUS_VOICES:
                return refuse(ErrorCode.UNKNOWN_VOICE,
                              f"voice {m.voice!r} is not an Orpheus voice "
                              f"({', '.join(ORPHEUS_VOICES)}) or one of OpenAI's names")
        try:
            plan = family_for(spec.arch, generic=True).plan_stream(
                spec, m if m.text is None else replace(m, voice=None))
        except StreamRefused as e:
            return refuse(ErrorCode(e.code), e.message)
        out_rate = m.sample_rate or (MULAW_DEFAULT_RATE if m.format == "mulaw"
                                     else OPUS_SAMPLE_RATE if m.format == "opus"
                                     else spec.sample_rate)
        if m.format == "opus" and not opus_available():
            return refuse(ErrorCode.BAD_FORMAT, "format opus is not available on this server: "
                                                "it needs PyAV with libopus "
                                                "(pip install 'codecd[codecs]')")
        conv: OutputConverter | OpusPackets
        try:
            if m.format == "opus":
                conv = OpusPackets(spec.sample_rate, m.bitrate)
            else:
                conv = OutputConverter(spec.sample_rate, out_rate, m.format)
        except (ValueError, ImportError, CodecsMissing) as e:
            return refuse(ErrorCode.BAD_FORMAT, f"cannot produce {m.format} at {out_rate} Hz: "
                                                f"{e}")
        if not self.admit():
            if isinstance(conv, OpusPackets):
                conv.close()
            return refuse(ErrorCode.BUSY, "server is at its stream limit; retry later")

        key = StreamKey(self.id, next(self._serial), sid)
        layout = get_layout(m.layout)
        n = plan.n_levels or spec.n_levels  # the levels this stream sends
        strides = spec.level_strides[:n]
        st = _Stream(key=key, start=m, spec=spec, out_rate=out_rate, converter=conv,
                     admitted=True, last_input=self.clock(),
                     assembler=layout.assembler(spec.codebook_sizes[:n], strides),
                     takes_levels=layout.takes_levels, strides=strides,
                     codes_per_frame=sum(1.0 / s for s in strides), level_codes=[0] * n)
        self._streams[sid] = st
        self._by_key[key] = st
        # what the decoder holds back by design: its look-ahead, one chunk, one group
        chunk = plan.chunk_frames or spec.chunk_frames
        hold = plan.latency_samples + (chunk + max(strides)) * spec.hop_length
        self.budget.open(key, hold / spec.sample_rate)
        st.hold_tokens = hold / spec.hop_length * st.codes_per_frame
        self._closed_ids.pop(sid, None)
        self._drop_bare = False
        self.metrics.streams_started += 1

        lat_out = int(round(plan.latency_samples * out_rate / spec.sample_rate))
        codec = None
        if isinstance(conv, OpusPackets):
            st.offset0 = conv.pre_skip
            codec = conv.codec_info()
        st.started = encode_started(sid, out_rate, m.format, lat_out, plan.latency, codec)
        logger.debug("session %d: start %s model=%s layout=%s %s@%d", self.id, key, spec.name,
                     m.layout, m.format, out_rate)
        out: list[Action] = [EngineOpen(key, spec.name, noise=m.noise, seed=m.seed,
                                        latency=plan.latency,
                                        voice=m.voice if speaker is None else None,
                                        options=dict(plan.options))]
        if m.text is not None and speaker is not None:
            st.from_text = True
            out.append(GenerateText(key, m.text, speaker))
        return out

    # ---------------------------------------------------------------- tokens

    def _resolve(self, stream_id: str | None) -> _Stream | list[Action]:
        """The target stream, or the actions that answer a message for no open stream."""
        if stream_id is None:  # bare array
            opened = self._bare_targets()
            if len(opened) == 1:
                return opened[0]
            if not opened and self._drop_bare:
                self.metrics.messages_dropped += 1
                return []
            if not opened:
                return self.fail_connection(ErrorCode.UNKNOWN_STREAM,
                                            "bare token array but no stream is open")
            return self.fail_connection(ErrorCode.BAD_MESSAGE,
                                        f"bare token array is ambiguous: {len(opened)} streams "
                                        "are open; use a tokens message with stream_id")
        st = self._streams.get(stream_id)
        if st is not None:
            return st
        if stream_id in self._closed_ids:
            self.metrics.messages_dropped += 1
            return []
        return self._refuse(stream_id, ErrorCode.UNKNOWN_STREAM,
                            f"no open stream {stream_id!r} (send start first)")

    def _on_tokens(self, m: TokenChunk) -> list[Action]:
        r = self._resolve(m.stream_id)
        if not isinstance(r, _Stream):
            return r
        st = r
        if st.from_text:
            return self._fail(st, ErrorCode.BAD_MESSAGE, "tokens for a stream started with text")
        try:
            return self._accept_tokens(st, m)
        except _Fail as f:
            return self._fail(st, f.code, f.message, f.details or None)

    def _accept_tokens(self, st: _Stream, m: TokenChunk) -> list[Action]:
        if st.state != _OPEN:
            raise _Fail(ErrorCode.BAD_MESSAGE, "tokens after end")
        n = m.count
        self.metrics.tokens_received += n
        st.last_input = self.clock()
        if n == 0:
            return []
        if st.pending_tokens() + n > self.limits.max_pending_tokens:
            raise _Fail(ErrorCode.BACKLOG_EXCEEDED,
                        f"{int(st.pending_tokens()) + n} tokens would wait for the decoder "
                        f"(limit {self.limits.max_pending_tokens}); send no faster than the "
                        "audio plays out")
        layout = st.start.layout
        # a binary frame's level byte the stream cannot take is a bad binary frame
        form = ErrorCode.BAD_BINARY if m.binary else ErrorCode.BAD_MESSAGE
        if st.takes_levels:
            if m.levels is None:
                raise _Fail(form, f"stream has layout {layout!r}: send 'levels' "
                                  "(or binary frames with a level index)")
            bad = [l for l in m.levels if l >= len(st.strides)]
            if m.binary and bad:
                raise _Fail(form, f"binary frame for level {bad[0]}: the stream has "
                                  f"{len(st.strides)} levels")
            payload: Any = m.levels
        else:
            if m.tokens is None:
                raise _Fail(form, f"stream has layout {layout!r}: send "
                                  "'tokens' (or binary level 0xFF)")
            payload = m.tokens
        try:
            levels = st.assembler.feed(payload)
        except LayoutError as e:
            msg, details = _as_sent(e, m)
            raise _Fail(ErrorCode(e.code), msg, **details) from None
        st.tokens_accepted += n
        if levels is None:
            return []
        frames = max((c + int(a.size)) * s for c, a, s in
                     zip(st.level_codes, levels, st.strides))
        dur = frames * st.spec.hop_length / st.spec.sample_rate
        if dur > self.limits.max_duration_s:
            raise _Fail(ErrorCode.DURATION_EXCEEDED,
                        f"stream would cover {dur:.1f} s of audio (limit "
                        f"{self.limits.max_duration_s:g} s)")
        for l, a in enumerate(levels):
            st.level_codes[l] += int(a.size)
        out: list[Action] = [EnginePush(st.key, levels)]
        if st.assembler.ended:  # a stop id (chatterbox_ids) ends the stream like `end`
            st.state = _ENDING
            st.ended_at = self.clock()
            out.append(EngineFinish(st.key))
        return out

    # ----------------------------------------------------------- end, cancel

    def _on_end(self, m: End) -> list[Action]:
        r = self._resolve(m.stream_id)
        if not isinstance(r, _Stream):
            return r
        st = r
        if st.from_text:
            return self._fail(st, ErrorCode.BAD_MESSAGE, "end for a stream started with text "
                                                         "(it ends with its text)")
        return self._end(st)

    # ------------------------------------------------------ text streams (upstream LM)

    def text_tokens(self, key: StreamKey, ids: npt.NDArray[np.int64]) -> list[Action]:
        """Tokens the upstream LM generated for a stream started with ``text``."""
        st = self._by_key.get(key)
        if st is None:
            return []
        try:
            return self._accept_tokens(st, TokenChunk(st.stream_id, tokens=ids))
        except _Fail as f:
            return self._fail(st, f.code, f.message, f.details or None)

    def text_room(self, key: StreamKey) -> bool:
        """Whether a text stream takes more LM ids now: its undecoded tokens (held for pacing
        or the output budget, or in the engine) beyond what its decoder holds back by design
        under half of ``max_pending_tokens`` (a wait below the look-ahead would never end: no
        audio comes until more ids do); a gone stream always (its generation is cancelled)."""
        st = self._by_key.get(key)
        return (st is None or
                st.pending_tokens() - st.hold_tokens <= self.limits.max_pending_tokens / 2)

    def text_end(self, key: StreamKey) -> list[Action]:
        """The upstream LM has spoken the whole text: decode the rest, then ``done``."""
        st = self._by_key.get(key)
        return [] if st is None or st.state != _OPEN else self._end(st)

    def text_failed(self, key: StreamKey, code: str, message: str) -> list[Action]:
        """The upstream LM failed: ``upstream_error`` (its own code in ``upstream_code``)."""
        st = self._by_key.get(key)
        if st is None:
            return []
        return self._fail(st, ErrorCode.UPSTREAM_ERROR, message, {"upstream_code": code})

    def _end(self, st: _Stream) -> list[Action]:
        if st.assembler.ended and st.state == _ENDING:
            return []  # a stop id already ended it
        if st.state != _OPEN:
            return self._fail(st, ErrorCode.BAD_MESSAGE, "end sent twice")
        try:
            st.assembler.end(st.level_codes)
        except LayoutError as e:
            return self._fail(st, ErrorCode(e.code), str(e), e.details or None)
        st.state = _ENDING
        st.ended_at = self.clock()
        return [EngineFinish(st.key)]

    def _on_cancel(self, m: Cancel) -> list[Action]:
        st = self._streams.get(m.stream_id)
        if st is None:
            if m.stream_id in self._closed_ids:
                self.metrics.messages_dropped += 1
                return []
            return self._refuse(m.stream_id, ErrorCode.UNKNOWN_STREAM,
                                f"no open stream {m.stream_id!r}")
        self._free(st)
        self.metrics.streams_cancelled += 1
        if not self._streams:
            self._drop_bare = True
        return [EngineCancel(st.key), SendText(encode_cancelled(st.stream_id))]

