"""codecd wire protocol v1, sans-I/O: frames in, messages out; messages in, frames out.

This module never touches a socket and never imports asyncio. The server shell
hands it the payload of each websocket frame (``str`` for text frames, ``bytes``
for binary ones) and gets back a message dataclass, or a :class:`ProtocolError`
carrying a stable error ``code``, a human-readable message and, where the error
can be pinned on one stream, its ``stream_id``. Server messages are produced by
the ``encode_*`` functions. The format is specified in ``docs/protocol.md``; the
two must stay consistent (``tests/daemon/test_protocol.py`` checks that every error
code and close code below appears there).

Client -> server:

* text: JSON objects ``hello``, ``start``, ``tokens``, ``end``, ``cancel``, ``mark``, or a
  bare JSON array of integers (tokens for the connection's only open stream);
* binary: ``u8 kind=0x01 | u8 level | u8 id_len | id | int32le tokens...``.

Server -> client:

* text: JSON objects ``hello``, ``started``, ``mark``, ``done``, ``cancelled``, ``error``;
* binary: ``u8 kind=0x02 | u8 id_len | id | u32le seq | u64le sample_offset | PCM`` (or,
  for an ``opus`` stream, one raw Opus packet).

Scoping rule: a :class:`ProtocolError` with a ``stream_id`` concerns that stream
only (the connection stays open); one without is fatal to the connection, which
is closed with :attr:`ProtocolError.close_code`.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "PROTOCOL_VERSION", "KIND_TOKENS", "KIND_AUDIO", "LEVEL_SEQUENCE", "LAYOUTS", "FORMATS",
    "LATENCIES", "OPUS_SAMPLE_RATE", "OPUS_BITRATE_RANGE", "ErrorCode", "ERRORS", "ErrorInfo", "close_code_for", "ProtocolError", "Limits",
    "Hello", "Start", "TokenChunk", "End", "Cancel", "Mark", "ClientMessage",
    "ServerHello", "Started", "MarkReached", "Done", "Cancelled", "Error", "AudioFrame",
    "ServerMessage", "encode_mark",
    "parse_text", "parse_binary", "encode_hello", "encode_started", "encode_done",
    "encode_cancelled", "encode_error", "encode_audio", "encode_client", "encode_token_frame",
    "parse_server_text", "parse_audio", "valid_stream_id", "truncate_reason", "SEQUENCE_KEY",
]

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1

#: first byte of a client binary frame (tokens) and of a server binary frame (audio)
KIND_TOKENS = 0x01
KIND_AUDIO = 0x02
#: ``level`` byte of a token frame that carries the stream's token sequence (orpheus layouts)
LEVEL_SEQUENCE = 0xFF

LAYOUTS = ("orpheus_ids", "orpheus", "levels", "chatterbox_ids", "dac_frames", "outetts_wavtokenizer",
           "neutts", "llasa", "llasa_ids")
#: the wire's formats; ``opus`` needs PyAV (``codecd[codecs]``): a server without it refuses
#: it (``bad_format``) and leaves it out of ``hello.formats``
FORMATS = ("pcm_s16le", "pcm_f32le", "mulaw", "opus")
LATENCIES = ("exact", "low")
#: output rate of ``mulaw`` streams when ``sample_rate`` is not given
MULAW_DEFAULT_RATE = 8000
#: the one output rate of ``opus`` streams (raw Opus packets of 20 ms)
OPUS_SAMPLE_RATE = 48000
#: ``bitrate`` of an ``opus`` start: libopus' range in b/s
#: b/s: libopus takes up to 510000, but FFmpeg's libopus wrapper (what PyAV encodes with)
#: refuses more than 256000 per channel, and the stream is mono
OPUS_BITRATE_RANGE = (6000, 256000)

_TOKEN_HDR = struct.Struct("<BBB")  # kind, level, id_len
_AUDIO_TAIL = struct.Struct("<IQ")  # seq, sample_offset
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_MAX_ID_BYTES = 255  # the u8 id_len of both binary headers
_MAX_REASON_BYTES = 123  # RFC 6455: a close frame's reason is at most 123 bytes


# ------------------------------------------------------------------ error codes


class ErrorCode(str, Enum):
    """Stable error codes of the ``error`` message (their string values are the wire format)."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_STREAM = "unknown_stream"
    DUPLICATE_STREAM = "duplicate_stream"
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_VOICE = "unknown_voice"
    BAD_LAYOUT = "bad_layout"
    BAD_FORMAT = "bad_format"
    BAD_WINDOW = "bad_window"
    TOKEN_RANGE = "token_range"
    BROKEN_GROUP = "broken_group"
    MESSAGE_TOO_BIG = "message_too_big"
    BAD_BINARY = "bad_binary"
    BUSY = "busy"
    TOO_MANY_STREAMS = "too_many_streams"
    BACKLOG_EXCEEDED = "backlog_exceeded"
    IDLE_TIMEOUT = "idle_timeout"
    DURATION_EXCEEDED = "duration_exceeded"
    SLOW_READER = "slow_reader"
    ENGINE_ERROR = "engine_error"
    UPSTREAM_ERROR = "upstream_error"
    UNAUTHORIZED = "unauthorized"
    BAD_ORIGIN = "bad_origin"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL_ERROR = "internal_error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ErrorInfo:
    """What an error code means and the websocket close code used when it ends the connection."""

    close_code: int
    meaning: str


#: close codes follow websockets/RFC 6455 usage: 1001 going away, 1008 policy
#: violation, 1009 message too big, 1011 internal error, 1013 try again later
ERRORS: Mapping[ErrorCode, ErrorInfo] = {
    ErrorCode.BAD_JSON: ErrorInfo(1008, "text frame is not a JSON object or array"),
    ErrorCode.BAD_MESSAGE: ErrorInfo(
        1008, "unknown type, missing or mistyped field, bad version, message not valid now"),
    ErrorCode.UNKNOWN_STREAM: ErrorInfo(1008, "no open stream has this stream_id"),
    ErrorCode.DUPLICATE_STREAM: ErrorInfo(1008, "start for a stream_id that is already open"),
    ErrorCode.UNKNOWN_MODEL: ErrorInfo(1008, "model is not loaded on this server"),
    ErrorCode.UNKNOWN_VOICE: ErrorInfo(1008, "voice is not offered by the model"),
    ErrorCode.BAD_LAYOUT: ErrorInfo(1008, "layout unknown or not supported by the model"),
    ErrorCode.BAD_FORMAT: ErrorInfo(1008, "output format or sample rate not supported"),
    ErrorCode.BAD_WINDOW: ErrorInfo(
        1008, "start.window: unknown preset or field, a value out of bounds, or a model that "
              "does not stream by windows"),
    ErrorCode.TOKEN_RANGE: ErrorInfo(1008, "token or code out of range for its position"),
    ErrorCode.BROKEN_GROUP: ErrorInfo(
        1008, "incomplete token group, or levels covering different frame counts, at end"),
    ErrorCode.MESSAGE_TOO_BIG: ErrorInfo(1009, "frame or token count over the server's limit"),
    ErrorCode.BAD_BINARY: ErrorInfo(
        1008, "binary frame: unknown kind, truncated header, payload not whole int32s"),
    ErrorCode.BUSY: ErrorInfo(1013, "server at its stream limit; start refused, retry later"),
    ErrorCode.TOO_MANY_STREAMS: ErrorInfo(1008, "connection at its open-stream limit"),
    ErrorCode.BACKLOG_EXCEEDED: ErrorInfo(1008, "too many tokens waiting to be decoded"),
    ErrorCode.IDLE_TIMEOUT: ErrorInfo(1001, "no input for the stream within the idle timeout"),
    ErrorCode.DURATION_EXCEEDED: ErrorInfo(1008, "stream over the maximum audio duration"),
    ErrorCode.SLOW_READER: ErrorInfo(1008, "client does not read audio fast enough"),
    ErrorCode.ENGINE_ERROR: ErrorInfo(1011, "the decoder failed"),
    ErrorCode.UPSTREAM_ERROR: ErrorInfo(1011, "the upstream language model of a text stream "
                                              "failed"),
    ErrorCode.UNAUTHORIZED: ErrorInfo(1008, "missing or invalid credentials"),
    ErrorCode.BAD_ORIGIN: ErrorInfo(1008, "Origin header not allowed"),
    ErrorCode.SHUTTING_DOWN: ErrorInfo(1001, "server is shutting down"),
    ErrorCode.INTERNAL_ERROR: ErrorInfo(1011, "unexpected server error"),
}


def close_code_for(code: ErrorCode | str) -> int:
    """Websocket close code for an error code that ends the connection (1008 for unknown codes)."""
    try:
        return ERRORS[ErrorCode(code)].close_code
    except ValueError:
        return 1008


class ProtocolError(Exception):
    """Root of the protocol's exceptions: input that breaks the wire format or its limits.

    ``code`` is an :class:`ErrorCode`; ``stream_id`` is set when the error can be
    pinned on one stream (then only that stream fails), else the error is fatal
    to the connection (:attr:`fatal`, closed with :attr:`close_code`).
    ``details`` are extra JSON fields of the ``error`` message (e.g. ``index``).
    ``msg_type`` (not sent) is the type of the offending message when known, and
    ``bare`` (not sent) says it was a bare JSON token array.
    """

    def __init__(self, code: ErrorCode | str, message: str, stream_id: str | None = None, *,
                 details: Mapping[str, Any] | None = None, msg_type: str | None = None,
                 bare: bool = False) -> None:
        super().__init__(message)
        self.code: ErrorCode = ErrorCode(code)
        self.message = message
        self.stream_id = stream_id
        self.details: dict[str, Any] = dict(details or {})
        self.msg_type = msg_type
        self.bare = bare

    @property
    def fatal(self) -> bool:
        return self.stream_id is None

    @property
    def close_code(self) -> int:
        return close_code_for(self.code)

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.value!r}, {self.message!r}, stream_id={self.stream_id!r})"


# ------------------------------------------------------------------------ limits


@dataclass(frozen=True)
class Limits:
    """Parser limits. Frames over them are refused with a :class:`ProtocolError`."""

    #: largest text or binary frame (UTF-8 bytes for text)
    max_message_bytes: int = 64 * 1024
    #: most tokens in one message (all levels together)
    max_tokens_per_message: int = 16384
    #: stream ids: 1..max_stream_id_len characters (and at most 255 bytes of UTF-8)
    max_stream_id_len: int = 64
    max_name_len: int = 128  # model, voice, client names
    max_levels: int = 32  # the runtime's CODECRT_MAX_LEVELS (Mimi: 32 codebooks)
    min_sample_rate: int = 8000
    max_sample_rate: int = 192000


DEFAULT_LIMITS = Limits()


# ---------------------------------------------------------------- client messages


@dataclass(frozen=True)
class Hello:
    """Optional client greeting: the protocol version it speaks and a free-form client name."""

    version: int | None = None
    client: str | None = None


@dataclass(frozen=True)
class Start:
    """Open a stream. ``format`` defaults to pcm_s16le; ``sample_rate`` None means the default."""

    stream_id: str
    model: str
    layout: str
    format: str = "pcm_s16le"
    sample_rate: int | None = None
    latency: str = "exact"
    noise: bool = False
    seed: int | None = None
    voice: str | None = None
    #: codebooks (levels) the stream sends, the model's first ones (Mimi: 8 for Moshi, 32 for
    #: CSM); None: every level of the model. The model's family checks it.
    codebooks: int | None = None
    #: text to speak instead of tokens (the server's upstream LM generates them)
    text: str | None = None
    #: ``opus`` only: the encoder's bit rate in b/s (None: the server's default, 64 kb/s)
    bitrate: int | None = None
    #: windowed models (WavTokenizer, NeuCodec, XCodec2): the stream's window, a subset of
    #: :data:`WINDOW_FIELDS` (``preset`` a name, the others frames); None: the one ``latency``
    #: picks. The protocol checks its shape; the model's family its values.
    window: Mapping[str, int | str] | None = None


@dataclass(frozen=True, eq=False)
class TokenChunk:
    """Tokens for a stream: ``tokens`` (the token sequence of orpheus layouts) or ``levels``.

    ``stream_id`` is None for a bare JSON array (the connection's only open
    stream). ``levels`` maps a level index to that level's codes. Arrays are
    int64: JSON integers beyond int64 are clamped to its range (they are out of
    range for every layout anyway), and ``wide`` keeps their decimal text as sent,
    by level (:data:`SEQUENCE_KEY` for ``tokens``) and position in the message, so
    that a ``token_range`` error can name the value that was sent.
    """

    stream_id: str | None
    tokens: npt.NDArray[np.int64] | None = None
    levels: dict[int, npt.NDArray[np.int64]] | None = None
    wide: dict[int, dict[int, str]] = field(default_factory=dict)
    #: it came in a binary frame (a level the stream cannot take is then ``bad_binary``)
    binary: bool = False

    @property
    def count(self) -> int:
        if self.tokens is not None:
            return int(self.tokens.size)
        return sum(int(a.size) for a in (self.levels or {}).values())


@dataclass(frozen=True)
class End:
    """No more tokens for the stream: decode the rest, then ``done``."""

    stream_id: str


@dataclass(frozen=True)
class Cancel:
    """Drop the stream now (barge-in); answered with ``cancelled``."""

    stream_id: str


@dataclass(frozen=True)
class Mark:
    """Answered with ``mark`` (and its ``sample_offset``) once the audio of every complete
    frame sent before it has been sent; ``id`` is the client's (string or integer)."""

    stream_id: str
    id: str | int


ClientMessage = Union[Hello, Start, TokenChunk, End, Cancel, Mark]


# ---------------------------------------------------------------- server messages


@dataclass(frozen=True)
class ServerHello:
    """The server's greeting; ``info`` holds every field but ``type``."""

    info: dict[str, Any]


@dataclass(frozen=True)
class Started:
    stream_id: str
    sample_rate: int
    format: str
    latency_samples: int
    channels: int = 1
    latency: str = "exact"
    #: an encoded format's decoder parameters (``opus``: name, sample_rate, channels,
    #: frame_ms, frame_samples, pre_skip, bitrate, application); None for PCM formats
    codec: dict[str, Any] | None = None


@dataclass(frozen=True)
class Done:
    stream_id: str
    samples: int
    duration_s: float


@dataclass(frozen=True)
class Cancelled:
    stream_id: str


@dataclass(frozen=True)
class Error:
    code: str
    message: str
    stream_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AudioFrame:
    """One binary audio frame: ``seq`` counts frames of the stream from 0, ``sample_offset``
    the output samples sent before this frame; ``data`` is PCM in the stream's format, or
    one raw Opus packet (20 ms) for ``opus``."""

    stream_id: str
    seq: int
    sample_offset: int
    data: bytes


@dataclass(frozen=True)
class MarkReached:
    stream_id: str
    id: str | int
    sample_offset: int


ServerMessage = Union[ServerHello, Started, MarkReached, Done, Cancelled, Error]


# ------------------------------------------------------------------ field helpers


def valid_stream_id(s: object, limits: Limits = DEFAULT_LIMITS) -> bool:
    """1..max_stream_id_len printable characters, at most 255 bytes of UTF-8."""
    if not isinstance(s, str) or not (1 <= len(s) <= limits.max_stream_id_len):
        return False
    if not s.isprintable():  # also rejects lone surrogates
        return False
    return len(s.encode("utf-8")) <= _MAX_ID_BYTES


#: ``TokenChunk.wide`` key of the token sequence (``tokens``, bare arrays)
SEQUENCE_KEY = -1


class _WideInt:
    """A JSON integer too long for Python's int-string conversion limit: its text only."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_wide(text: str) -> int | _WideInt:
    return _WideInt(text) if len(text) > 40 else int(text)


def _is_int(v: object) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, _WideInt)


def _int_text(v: int | _WideInt) -> str:
    return v.text if isinstance(v, _WideInt) else str(v)


def _loads(data: str) -> Any:
    """JSON with integers of any length: the fast parser first; integers beyond Python's
    int-string limit (thousands of digits) are kept as :class:`_WideInt`."""
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except ValueError as e:
        if "integer string conversion" not in str(e):
            raise
    return json.loads(data, parse_constant=_reject_constant, parse_int=_parse_wide)


class _Fields:
    """Typed access to a JSON object's fields, raising bad_message scoped to ``stream_id``."""

    def __init__(self, obj: dict[str, Any], msg_type: str, stream_id: str | None) -> None:
        self.obj = obj
        self.msg_type = msg_type
        self.stream_id = stream_id

    def err(self, message: str, code: ErrorCode = ErrorCode.BAD_MESSAGE) -> ProtocolError:
        return ProtocolError(code, f"{self.msg_type}: {message}", self.stream_id,
                             msg_type=self.msg_type)

    def str_(self, key: str, *, max_len: int, required: bool = False,
             choices: tuple[str, ...] | None = None,
             code: ErrorCode = ErrorCode.BAD_MESSAGE) -> str | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.err(f"missing field {key!r}")
            return None
        if not isinstance(v, str):
            raise self.err(f"field {key!r} must be a string")
        if choices is not None:
            if v not in choices:
                raise self.err(f"{key} {_short(v)!r} is not one of {', '.join(choices)}", code)
            return v
        if not (1 <= len(v) <= max_len) or not v.isprintable():
            raise self.err(f"field {key!r} must be 1..{max_len} printable characters")
        return v

    def int_(self, key: str, lo: int, hi: int,
             code: ErrorCode = ErrorCode.BAD_MESSAGE) -> int | None:
        v = self.obj.get(key)
        if v is None:
            return None
        if not _is_int(v):
            raise self.err(f"field {key!r} must be an integer")
        if isinstance(v, _WideInt) or not (lo <= v <= hi):
            raise self.err(f"{key} {_short(_int_text(v))} is outside [{lo}, {hi}]", code)
        return int(v)

    def bool_(self, key: str, default: bool) -> bool:
        v = self.obj.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.err(f"field {key!r} must be true or false")
        return v


def _short(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _int_array(values: object, what: str, f: _Fields, limits: Limits,
               wide: dict[int, str] | None = None) -> npt.NDArray[np.int64]:
    """The integers of a JSON array as int64; those beyond int64 are clamped to its range
    (out of range for every layout) and their text, as sent, goes into ``wide``."""
    if not isinstance(values, list):
        raise f.err(f"{what} must be an array of integers")
    if len(values) > limits.max_tokens_per_message:
        raise f.err(f"{what}: {len(values)} tokens, limit {limits.max_tokens_per_message}",
                    ErrorCode.MESSAGE_TOO_BIG)
    for j, v in enumerate(values):
        if not _is_int(v):
            raise f.err(f"{what}[{j}] is not an integer")
    try:
        return np.array(values, dtype=np.int64)
    except (OverflowError, TypeError):  # beyond int64, or a _WideInt
        pass
    clamped: list[int] = []
    for j, v in enumerate(values):
        if isinstance(v, int) and _INT64_MIN <= v <= _INT64_MAX:
            clamped.append(v)
            continue
        text = _int_text(v)
        clamped.append(_INT64_MIN if text.startswith("-") else _INT64_MAX)
        if wide is not None:
            wide[j] = text
    return np.array(clamped, dtype=np.int64)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# -------------------------------------------------------------------- client side


def parse_text(data: str, limits: Limits = DEFAULT_LIMITS) -> ClientMessage:
    """Parse one client text frame into a message, or raise :class:`ProtocolError`."""
    n = len(data)
    if n > limits.max_message_bytes or (
            4 * n > limits.max_message_bytes
            and len(data.encode("utf-8", "surrogatepass")) > limits.max_message_bytes):
        raise ProtocolError(ErrorCode.MESSAGE_TOO_BIG,
                            f"text frame over {limits.max_message_bytes} bytes")
    try:
        obj = _loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, nesting
        raise ProtocolError(ErrorCode.BAD_JSON, f"invalid JSON: {_short(str(e), 80)}") from None

    if isinstance(obj, list):  # bare token array (what LM servers print)
        f = _Fields({}, "tokens", None)
        wide: dict[int, str] = {}
        try:
            arr = _int_array(obj, "bare token array", f, limits, wide)
            return TokenChunk(None, tokens=arr, wide={SEQUENCE_KEY: wide} if wide else {})
        except ProtocolError as e:
            e.bare = True
            raise
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "a text frame must be a JSON object or array")

    raw_sid = obj.get("stream_id")
    sid = raw_sid if valid_stream_id(raw_sid, limits) else None
    mtype = obj.get("type")
    if not isinstance(mtype, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "missing or non-string 'type'", sid)
    # a hello belongs to the connection, whatever stream_id it carries
    f = _Fields(obj, mtype, None if mtype == "hello" else sid)

    if mtype == "hello":
        version = f.int_("version", 0, _UINT32_MAX)
        if version is not None and version != PROTOCOL_VERSION:
            raise f.err(f"protocol version {version} not supported (server speaks "
                        f"{PROTOCOL_VERSION})")
        return Hello(version=version, client=f.str_("client", max_len=limits.max_name_len))

    if mtype not in ("start", "tokens", "end", "cancel", "mark"):
        raise f.err(f"unknown message type {_short(mtype)!r}")
    if sid is None:
        if raw_sid is None:
            raise f.err("missing field 'stream_id'")
        raise f.err(f"stream_id must be 1..{limits.max_stream_id_len} printable characters "
                    f"(at most {_MAX_ID_BYTES} bytes of UTF-8)")

    if mtype == "start":
        return _parse_start(f, sid, limits)
    if mtype == "tokens":
        has_t, has_l = obj.get("tokens") is not None, obj.get("levels") is not None
        if has_t == has_l:
            raise f.err("exactly one of 'tokens' and 'levels' is required")
        wides: dict[int, dict[int, str]] = {}
        if has_t:
            wides[SEQUENCE_KEY] = {}
            arr = _int_array(obj["tokens"], "tokens", f, limits, wides[SEQUENCE_KEY])
            return TokenChunk(sid, tokens=arr, wide={k: w for k, w in wides.items() if w})
        lv = obj["levels"]
        if not isinstance(lv, list) or not (1 <= len(lv) <= limits.max_levels):
            raise f.err(f"'levels' must be an array of 1..{limits.max_levels} integer arrays")
        levels = {l: _int_array(a, f"levels[{l}]", f, limits, wides.setdefault(l, {}))
                  for l, a in enumerate(lv)}
        total = sum(int(a.size) for a in levels.values())
        if total > limits.max_tokens_per_message:
            raise f.err(f"{total} codes, limit {limits.max_tokens_per_message}",
                        ErrorCode.MESSAGE_TOO_BIG)
        return TokenChunk(sid, levels=levels, wide={k: w for k, w in wides.items() if w})
    if mtype == "end":
        return End(sid)
    if mtype == "mark":
        mid = obj.get("id")
        if isinstance(mid, bool) or not (
                (isinstance(mid, int) and _INT64_MIN <= mid <= _INT64_MAX)
                or (isinstance(mid, str) and 0 < len(mid) <= limits.max_name_len)):
            raise f.err(f"'id' must be an integer or a string of 1..{limits.max_name_len} "
                        "characters")
        return Mark(sid, mid)
    return Cancel(sid)


#: longest ``text`` of a start (OpenAI's speech input limit)
MAX_TEXT_CHARS = 4096


#: the fields of ``start.window``: a preset's name, then frames that override the preset's
WINDOW_FIELDS = ("preset", "chunk", "lookback", "lookahead", "overlap")
#: the largest frame count ``start.window`` may carry (the family's bounds are tighter)
MAX_WINDOW_FRAMES = 1 << 16


def _parse_window(f: _Fields, limits: Limits) -> dict[str, int | str] | None:
    """``start.window``: a preset name, or an object of :data:`WINDOW_FIELDS` (``bad_window``
    for any other shape; the values' bounds are the model family's to check)."""
    v = f.obj.get("window")
    if v is None:
        return None
    if isinstance(v, str):
        v = {"preset": v}
    if not isinstance(v, dict) or not v:
        raise f.err("'window' must be a preset name or an object of "
                    f"{', '.join(WINDOW_FIELDS)}", ErrorCode.BAD_WINDOW)
    out: dict[str, int | str] = {}
    for key, val in v.items():
        if key not in WINDOW_FIELDS:
            raise f.err(f"window: unknown field {_short(str(key))!r} (fields: "
                        f"{', '.join(WINDOW_FIELDS)})", ErrorCode.BAD_WINDOW)
        if key == "preset":
            if not isinstance(val, str) or not (1 <= len(val) <= limits.max_name_len) \
                    or not val.isprintable():
                raise f.err(f"window.preset must be 1..{limits.max_name_len} printable "
                            "characters", ErrorCode.BAD_WINDOW)
        elif not _is_int(val) or isinstance(val, _WideInt) or not 0 <= val <= MAX_WINDOW_FRAMES:
            raise f.err(f"window.{key} must be an integer of frames in [0, {MAX_WINDOW_FRAMES}]",
                        ErrorCode.BAD_WINDOW)
        out[key] = val if key == "preset" else int(val)
    return out


def _parse_start(f: _Fields, sid: str, limits: Limits) -> Start:
    model = f.str_("model", max_len=limits.max_name_len, required=True)
    text = f.obj.get("text")
    if text is not None and (not isinstance(text, str) or not text.strip()
                             or len(text) > MAX_TEXT_CHARS):
        raise f.err(f"'text' must be a non-empty string of at most {MAX_TEXT_CHARS} characters")
    layout = f.str_("layout", max_len=0, required=text is None, choices=LAYOUTS,
                    code=ErrorCode.BAD_LAYOUT)
    if text is not None:
        if layout not in (None, "orpheus_ids"):
            raise f.err("a start with 'text' takes layout orpheus_ids (or none)",
                        ErrorCode.BAD_LAYOUT)
        layout = "orpheus_ids"
    fmt = f.str_("format", max_len=0, choices=FORMATS, code=ErrorCode.BAD_FORMAT) or "pcm_s16le"
    rate = f.int_("sample_rate", limits.min_sample_rate, limits.max_sample_rate,
                  code=ErrorCode.BAD_FORMAT)
    latency = f.str_("latency", max_len=0, choices=LATENCIES) or "exact"
    noise = f.bool_("noise", False)
    seed = f.int_("seed", 0, _UINT64_MAX)
    voice = f.str_("voice", max_len=limits.max_name_len)
    codebooks = f.int_("codebooks", 1, 64)
    bitrate = f.int_("bitrate", *OPUS_BITRATE_RANGE, code=ErrorCode.BAD_FORMAT)
    window = _parse_window(f, limits)
    if fmt == "opus" and rate is not None and rate != OPUS_SAMPLE_RATE:
        raise f.err(f"format opus is sent at {OPUS_SAMPLE_RATE} Hz only, not {rate}",
                    ErrorCode.BAD_FORMAT)
    if bitrate is not None and fmt != "opus":
        raise f.err(f"'bitrate' is for format opus, not {fmt}", ErrorCode.BAD_FORMAT)
    assert model is not None and layout is not None
    return Start(stream_id=sid, model=model, layout=layout, format=fmt, sample_rate=rate,
                 latency=latency, noise=noise, seed=seed, voice=voice, codebooks=codebooks,
                 text=text, bitrate=bitrate, window=window)


def parse_binary(data: bytes, limits: Limits = DEFAULT_LIMITS) -> TokenChunk:
    """Parse one client binary frame (tokens), or raise :class:`ProtocolError`."""
    if len(data) > limits.max_message_bytes:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_BIG,
                            f"binary frame over {limits.max_message_bytes} bytes")
    if len(data) < _TOKEN_HDR.size:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"truncated header ({len(data)} bytes)")
    kind, level, id_len = _TOKEN_HDR.unpack_from(data)
    if kind != KIND_TOKENS:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"unknown binary frame kind 0x{kind:02x}")
    end = _TOKEN_HDR.size + id_len
    if len(data) < end:
        raise ProtocolError(ErrorCode.BAD_BINARY,
                            f"truncated header: stream id of {id_len} bytes, frame {len(data)}")
    try:
        sid = bytes(data[_TOKEN_HDR.size:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(ErrorCode.BAD_BINARY, "stream id is not valid UTF-8") from None
    if not valid_stream_id(sid, limits):
        raise ProtocolError(ErrorCode.BAD_BINARY,
                            f"stream id must be 1..{limits.max_stream_id_len} printable "
                            "characters")
    payload = memoryview(data)[end:]
    if len(payload) % 4:
        raise ProtocolError(ErrorCode.BAD_BINARY,
                            f"payload of {len(payload)} bytes is not a whole number of int32",
                            sid, msg_type="tokens")
    n = len(payload) // 4
    if n > limits.max_tokens_per_message:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_BIG,
                            f"{n} tokens, limit {limits.max_tokens_per_message}", sid,
                            msg_type="tokens")
    arr = np.frombuffer(payload, dtype="<i4").astype(np.int64)
    if level == LEVEL_SEQUENCE:
        return TokenChunk(sid, tokens=arr, binary=True)
    if level >= limits.max_levels:
        raise ProtocolError(ErrorCode.BAD_BINARY, f"level {level} >= {limits.max_levels}", sid,
                            msg_type="tokens")
    return TokenChunk(sid, levels={level: arr}, binary=True)


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_client(msg: ClientMessage) -> str:
    """A client message as a text frame (for clients and tests); None fields are left out."""
    d: dict[str, Any]
    if isinstance(msg, Hello):
        d = {"type": "hello", "version": msg.version, "client": msg.client}
    elif isinstance(msg, Start):
        d = {"type": "start", "stream_id": msg.stream_id, "model": msg.model,
             "layout": msg.layout, "format": msg.format, "sample_rate": msg.sample_rate,
             "latency": msg.latency, "noise": msg.noise, "seed": msg.seed, "voice": msg.voice,
             "codebooks": msg.codebooks, "text": msg.text, "bitrate": msg.bitrate,
             "window": dict(msg.window) if msg.window is not None else None}
    elif isinstance(msg, TokenChunk):
        if msg.stream_id is None:
            assert msg.tokens is not None
            return _dumps_list([int(v) for v in msg.tokens])
        d = {"type": "tokens", "stream_id": msg.stream_id}
        if msg.tokens is not None:
            d["tokens"] = [int(v) for v in msg.tokens]
        else:
            lv = msg.levels or {}
            d["levels"] = [[int(v) for v in lv.get(l, ())] for l in range(max(lv, default=-1) + 1)]
    elif isinstance(msg, End):
        d = {"type": "end", "stream_id": msg.stream_id}
    elif isinstance(msg, Cancel):
        d = {"type": "cancel", "stream_id": msg.stream_id}
    elif isinstance(msg, Mark):
        d = {"type": "mark", "stream_id": msg.stream_id, "id": msg.id}
    else:
        raise TypeError(f"not a client message: {type(msg).__name__}")
    return _dumps({k: v for k, v in d.items() if v is not None})


def _dumps_list(values: list[int]) -> str:
    return json.dumps(values, separators=(",", ":"))


def _id_bytes(stream_id: str) -> bytes:
    b = stream_id.encode("utf-8")
    if not b or len(b) > _MAX_ID_BYTES:
        raise ValueError(f"stream id of {len(b)} bytes does not fit the header (1..255)")
    return b


def encode_token_frame(stream_id: str, tokens: npt.ArrayLike, level: int | None = None) -> bytes:
    """A binary token frame; ``level`` None is the token sequence (0xFF)."""
    b = _id_bytes(stream_id)
    lv = LEVEL_SEQUENCE if level is None else level
    if not (0 <= lv <= 0xFF):
        raise ValueError(f"level {lv} does not fit a byte")
    payload = np.asarray(tokens, dtype=np.int64)
    if payload.size and (payload.min() < -(2**31) or payload.max() >= 2**31):
        raise ValueError("tokens must fit int32")
    return (_TOKEN_HDR.pack(KIND_TOKENS, lv, len(b)) + b
            + payload.astype("<i4").tobytes())


# -------------------------------------------------------------------- server side


def encode_hello(info: Mapping[str, Any]) -> str:
    """Server ``hello``: the caller's fields (server, models, formats, layouts, limits, ...);
    ``type`` is set here and ``version`` defaults to :data:`PROTOCOL_VERSION`."""
    d: dict[str, Any] = {"type": "hello", "version": PROTOCOL_VERSION}
    d.update({k: v for k, v in info.items() if k != "type"})
    return _dumps(d)


def encode_started(stream_id: str, sample_rate: int, format: str, latency_samples: int,
                   latency: str = "exact", codec: Mapping[str, Any] | None = None) -> str:
    """``started``; ``codec`` (an encoded format's decoder parameters) only when given."""
    d: dict[str, Any] = {"type": "started", "stream_id": stream_id, "sample_rate": sample_rate,
                         "format": format, "channels": 1, "latency_samples": latency_samples,
                         "latency": latency}
    if codec is not None:
        d["codec"] = dict(codec)
    return _dumps(d)


def encode_done(stream_id: str, samples: int, sample_rate: int) -> str:
    """``done``; ``samples`` counts output samples, ``duration_s`` is samples / sample_rate."""
    return _dumps({"type": "done", "stream_id": stream_id, "samples": samples,
                   "duration_s": round(samples / sample_rate, 6) if sample_rate else 0.0})


def encode_mark(stream_id: str, mark_id: str | int, sample_offset: int) -> str:
    return _dumps({"type": "mark", "stream_id": stream_id, "id": mark_id,
                   "sample_offset": sample_offset})


def encode_cancelled(stream_id: str) -> str:
    return _dumps({"type": "cancelled", "stream_id": stream_id})


def encode_error(code: ErrorCode | str, message: str, stream_id: str | None = None,
                 details: Mapping[str, Any] | None = None) -> str:
    d: dict[str, Any] = {"type": "error", "code": str(ErrorCode(code).value), "message": message}
    if stream_id is not None:
        d["stream_id"] = stream_id
    for k, v in (details or {}).items():
        d.setdefault(k, v)
    return _dumps(d)


def encode_audio(stream_id: str, seq: int, sample_offset: int, pcm: bytes) -> bytes:
    """A binary audio frame: header then raw PCM (never a WAV header), or one Opus packet."""
    b = _id_bytes(stream_id)
    return bytes((KIND_AUDIO, len(b))) + b + _AUDIO_TAIL.pack(seq, sample_offset) + pcm


def truncate_reason(reason: str) -> str:
    """A close reason cut to the 123 UTF-8 bytes a close frame allows."""
    b = reason.encode("utf-8")
    if len(b) <= _MAX_REASON_BYTES:
        return reason
    return b[:_MAX_REASON_BYTES].decode("utf-8", "ignore")


def parse_server_text(data: str) -> ServerMessage:
    """Parse a server text frame (client side), or raise :class:`ProtocolError`."""
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(ErrorCode.BAD_JSON, f"invalid JSON: {_short(str(e), 80)}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "expected a JSON object with a 'type'")
    t = obj["type"]
    try:
        if t == "hello":
            return ServerHello({k: v for k, v in obj.items() if k != "type"})
        if t == "started":
            return Started(stream_id=obj["stream_id"], sample_rate=obj["sample_rate"],
                           format=obj["format"], latency_samples=obj["latency_samples"],
                           channels=obj.get("channels", 1), latency=obj.get("latency", "exact"),
                           codec=_codec_field(obj.get("codec")))
        if t == "done":
            return Done(stream_id=obj["stream_id"], samples=obj["samples"],
                        duration_s=float(obj["duration_s"]))
        if t == "cancelled":
            return Cancelled(stream_id=obj["stream_id"])
        if t == "mark":
            return MarkReached(stream_id=obj["stream_id"], id=obj["id"],
                               sample_offset=int(obj["sample_offset"]))
        if t == "error":
            known = {"type", "code", "message", "stream_id"}
            return Error(code=obj["code"], message=obj.get("message", ""),
                         stream_id=obj.get("stream_id"),
                         details={k: v for k, v in obj.items() if k not in known})
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{t}: bad or missing field {e}") from None
    raise ProtocolError(ErrorCode.BAD_MESSAGE, f"unknown message type {_short(t)!r}")


def _codec_field(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise TypeError("'codec' must be an object")
    return dict(v)


def parse_audio(data: bytes) -> AudioFrame:
    """Parse a server binary frame (client side), or raise :class:`ProtocolError`."""
    if len(data) < 2 or data[0] != KIND_AUDIO:
        raise ProtocolError(ErrorCode.BAD_BINARY, "not an audio frame")
    id_len = data[1]
    end = 2 + id_len
    if len(data) < end + _AUDIO_TAIL.size:
        raise ProtocolError(ErrorCode.BAD_BINARY, "truncated audio header")
    try:
        sid = bytes(data[2:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(ErrorCode.BAD_BINARY, "stream id is not valid UTF-8") from None
    seq, off = _AUDIO_TAIL.unpack_from(data, end)
    return AudioFrame(sid, seq, off, bytes(data[end + _AUDIO_TAIL.size:]))

