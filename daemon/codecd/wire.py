"""The wire between the engine and its worker: typed messages with explicit byte layouts.

Both ends use this one module: the engine (``codecd.engine``) and the worker
(``codecd.worker``) exchange *packets*, each the payload of one
``Connection.send_bytes`` (a 4-byte length prefix, then the bytes): a packet is a
sequence of records, so one syscall carries a whole batch, and a later transport
(shared-memory rings with many streams per batch, issue 17) can carry the same
packets slot by slot. No pickle: nothing in a packet runs code when read.

Layout (little-endian; every record starts 8-byte aligned)::

    packet   := record*
    record   := header body pad
    header   := kind:u8 flags:u8 count:u16 size:u32        8 bytes; size = body bytes
    pad      := zero bytes to the next multiple of 8

Hot records: fixed structs, then arrays (readers take numpy views, no copy). A
run of consecutive pushes, or of consecutive audio messages, is one *batch*
record of ``count = k`` streams (k <= 65535), in the order they were sent::

    PUSH      0x12  sid:u64[k] n_levels:u32[k] len:u32[sum(n_levels)] pad
                    codes:i32[sum(len)]                 (pad: zeros to 8-byte alignment)
    AUDIO     0x23  sid:u64[k] n:u32[k] pad  pcm:f32[sum(n)]
    DONE      0x24  sid:u64 total_samples:i64
    OPENED    0x22  sid:u64 latency_samples:u32 sample_rate:u32 chunk_frames:u32
                    reserved:u32
    ERROR     0x25  sid:u64 code_len:u16 reserved:u16 message_len:u32 code:utf8
                    message:utf8
    FINISH    0x13, CANCEL 0x14            sid:u64
    PROBE     0x15, PROBE_REPLY 0x26, STATS_REQUEST 0x16    token:u64

Control records: a JSON object (utf-8) as the body, or nothing::

    HELLO     0x01  magic "CDWK" version:u16 reserved:u16   (first record each way)
    CONFIGURE 0x10  {"config": EngineConfig JSON text, "device", "index", "parent_pid"}
    OPEN      0x11  {"sid", "model", "options": StreamOptions}
    STOP      0x17  -                 CRASH    0x18  {"how"}  (tests only)
    READY     0x20  {"info"}          FAILED   0x21  {"message"}
    STATS     0x27  {"token", "stats"}
    LOG       0x28  {"level", "message"}      STOPPED  0x29  -

Versioning: each end's first record is a :class:`Hello` with
:data:`WIRE_VERSION`; :func:`check_hello` raises :class:`VersionError` for any
other. Reading bytes that are not a packet of this version raises a
:class:`WireError`: :class:`TruncatedError` when a record runs past the end,
:class:`MalformedError` for an unknown kind, an impossible size, bad utf-8 or
JSON, lengths that disagree.
"""

from __future__ import annotations

import json
import struct
from itertools import accumulate
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "WIRE_VERSION", "WireError", "TruncatedError", "MalformedError", "VersionError",
    "StreamOptions", "Hello", "Configure", "OpenStream", "PushCodes", "FinishStream",
    "CancelStream", "Probe", "StatsRequest", "Stop", "Crash", "Ready", "Failed", "StreamOpened",
    "AudioOut", "StreamDone", "StreamFailed", "ProbeReply", "Stats", "Log", "Stopped", "Message",
    "encode", "decode", "check_hello", "records", "spans", "spans_at", "read_record", "push_arrays",
    "push_arrays_many", "push_messages", "audio_packet", "audio_head", "audio_record_into",
]

#: the version this module speaks; both ends must agree (checked at the hello)
WIRE_VERSION = 1
MAGIC = b"CDWK"

_HEADER = struct.Struct("<BBHI")
_U64 = struct.Struct("<Q")
_HELLO = struct.Struct("<4sHH")
_AUDIO = struct.Struct("<QII")
_DONE = struct.Struct("<Qq")
_OPENED = struct.Struct("<QIIII")
_ERROR = struct.Struct("<QHHI")
_PAD = bytes(8)
_MAX_BODY = 2**32 - 1
_MAX_BATCH = 2**16 - 1  # streams in one batch record (its count is a u16)
_I32 = np.dtype("<i4")
_U32A = np.dtype("<u4")
_U64A = np.dtype("<u8")
_F32 = np.dtype("<f4")


# ------------------------------------------------------------------ errors


class WireError(Exception):
    """Bytes that are not a valid packet of this wire version."""


class TruncatedError(WireError):
    """A record (header or body) runs past the end of the packet."""


class MalformedError(WireError):
    """An unknown record kind, an impossible size, bad utf-8 or JSON, lengths that disagree."""


class VersionError(WireError):
    """The peer's hello is missing or names another wire version."""


# ------------------------------------------------------------------ messages


@dataclass(frozen=True)
class StreamOptions:
    """How a stream is opened: the generic options, and the family's own (``extra``,
    from its ``StreamPlan.options``)."""

    noise: bool = False
    seed: int = 0
    latency: str = "exact"  # "exact" or "low"
    voice: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class _Record:
    """A message type: its kind byte, how its body is written and read."""

    kind: ClassVar[int]

    def _count(self) -> int:
        return 0

    def _body(self) -> list[bytes]:
        return []

    @classmethod
    def _read(cls, body: memoryview, count: int) -> Any:
        if len(body):
            raise MalformedError(f"{cls.__name__} has no body, got {len(body)} bytes")
        return cls()


class _Json(_Record):
    """A control message: its fields as one JSON object."""

    def _fields(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload, no-any-return]

    def _body(self) -> list[bytes]:
        return [json.dumps(self._fields(), separators=(",", ":")).encode()]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> Any:
        try:
            d = json.loads(bytes(body).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise MalformedError(f"{cls.__name__}: body is not JSON ({e})") from None
        if not isinstance(d, dict):
            raise MalformedError(f"{cls.__name__}: body is not a JSON object")
        try:
            return cls._from_fields(d)
        except (TypeError, ValueError, KeyError) as e:
            raise MalformedError(f"{cls.__name__}: {e}") from None

    @classmethod
    def _from_fields(cls, d: dict[str, Any]) -> Any:
        return cls(**d)


def _sid_body(cls: type[Any], body: memoryview) -> int:
    if len(body) != 8:
        raise MalformedError(f"{cls.__name__}: body of {len(body)} bytes, expected 8")
    return int(_U64.unpack_from(body)[0])


@dataclass(frozen=True, slots=True)
class Hello(_Record):
    """First record each way: the wire version the sender speaks."""

    version: int = WIRE_VERSION
    kind: ClassVar[int] = 0x01

    def _body(self) -> list[bytes]:
        return [_HELLO.pack(MAGIC, self.version, 0)]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> Hello:
        if len(body) != _HELLO.size:
            raise MalformedError(f"Hello: body of {len(body)} bytes, expected {_HELLO.size}")
        magic, version, _ = _HELLO.unpack_from(body)
        if magic != MAGIC:
            raise VersionError(f"not a codecd worker hello (magic {bytes(magic)!r})")
        return cls(version)


@dataclass(frozen=True, slots=True)
class Configure(_Json):
    """The engine's configuration (``EngineConfig.to_json``) and this worker's place."""

    config: str
    device: str
    index: int
    parent_pid: int
    kind: ClassVar[int] = 0x10


@dataclass(frozen=True, slots=True)
class OpenStream(_Json):
    sid: int
    model: str
    options: StreamOptions = StreamOptions()
    kind: ClassVar[int] = 0x11

    def _fields(self) -> dict[str, Any]:
        return {"sid": self.sid, "model": self.model, "options": asdict(self.options)}

    @classmethod
    def _from_fields(cls, d: dict[str, Any]) -> OpenStream:
        return cls(int(d["sid"]), str(d["model"]), StreamOptions(**d["options"]))


@dataclass(slots=True, eq=False)
class PushCodes:
    """Codes for a stream: one int32 array per level (any lengths, also 0). Consecutive
    pushes travel as one batch record (:data:`PUSH`)."""

    sid: int
    levels: Sequence[npt.NDArray[np.int32]]
    kind: ClassVar[int] = 0x12


@dataclass(frozen=True, slots=True)
class FinishStream(_Record):
    sid: int
    kind: ClassVar[int] = 0x13

    def _body(self) -> list[bytes]:
        return [_U64.pack(self.sid)]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> Any:
        return cls(_sid_body(cls, body))


@dataclass(frozen=True, slots=True)
class CancelStream(FinishStream):
    kind: ClassVar[int] = 0x14


@dataclass(frozen=True, slots=True)
class Probe(_Record):
    token: int
    kind: ClassVar[int] = 0x15

    def _body(self) -> list[bytes]:
        return [_U64.pack(self.token)]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> Any:
        return cls(_sid_body(cls, body))


@dataclass(frozen=True, slots=True)
class StatsRequest(Probe):
    kind: ClassVar[int] = 0x16


@dataclass(frozen=True, slots=True)
class Stop(_Record):
    kind: ClassVar[int] = 0x17


@dataclass(frozen=True, slots=True)
class Crash(_Json):
    """Tests only (``debug_commands``): die or wedge the way a native fault would."""

    how: str
    kind: ClassVar[int] = 0x18


@dataclass(frozen=True, slots=True)
class Ready(_Json):
    """Start-up done: what the worker loaded (per model: its family's hello info)."""

    info: dict[str, Any]
    kind: ClassVar[int] = 0x20


@dataclass(frozen=True, slots=True)
class Failed(_Json):
    """Start-up failed (bad model, bad device, another wire version)."""

    message: str
    kind: ClassVar[int] = 0x21


@dataclass(frozen=True, slots=True)
class StreamOpened(_Record):
    sid: int
    latency_samples: int
    sample_rate: int
    chunk_frames: int
    kind: ClassVar[int] = 0x22

    def _body(self) -> list[bytes]:
        return [_OPENED.pack(self.sid, self.latency_samples, self.sample_rate,
                             self.chunk_frames, 0)]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> StreamOpened:
        if len(body) != _OPENED.size:
            raise MalformedError(f"StreamOpened: body of {len(body)} bytes, expected "
                                 f"{_OPENED.size}")
        sid, lat, rate, chunk, _ = _OPENED.unpack_from(body)
        return cls(sid, lat, rate, chunk)


@dataclass(slots=True, eq=False)
class AudioOut:
    """Final samples of a stream, float32 at the model's rate, in order. Consecutive audio
    messages travel as one batch record (:data:`AUDIO`)."""

    sid: int
    pcm: npt.NDArray[np.float32]
    kind: ClassVar[int] = 0x23


@dataclass(frozen=True, slots=True)
class StreamDone(_Record):
    sid: int
    total_samples: int
    kind: ClassVar[int] = 0x24

    def _body(self) -> list[bytes]:
        return [_DONE.pack(self.sid, self.total_samples)]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> StreamDone:
        if len(body) != _DONE.size:
            raise MalformedError(f"StreamDone: body of {len(body)} bytes, expected {_DONE.size}")
        return cls(*_DONE.unpack_from(body))


@dataclass(frozen=True, slots=True)
class StreamFailed(_Record):
    """That stream only failed (its slot is freed): an error code and a message."""

    sid: int
    code: str
    message: str
    kind: ClassVar[int] = 0x25

    def _body(self) -> list[bytes]:
        code, msg = self.code.encode(), self.message.encode()
        return [_ERROR.pack(self.sid, len(code), 0, len(msg)), code, msg]

    @classmethod
    def _read(cls, body: memoryview, count: int) -> StreamFailed:
        if len(body) < _ERROR.size:
            raise MalformedError(f"StreamFailed: body of {len(body)} bytes")
        sid, n_code, _, n_msg = _ERROR.unpack_from(body)
        if _ERROR.size + n_code + n_msg != len(body):
            raise MalformedError("StreamFailed: code and message lengths do not fill the body")
        raw = bytes(body[_ERROR.size:])
        try:
            return cls(sid, raw[:n_code].decode(), raw[n_code:].decode())
        except UnicodeDecodeError as e:
            raise MalformedError(f"StreamFailed: {e}") from None


@dataclass(frozen=True, slots=True)
class ProbeReply(Probe):
    kind: ClassVar[int] = 0x26


@dataclass(frozen=True, slots=True)
class Stats(_Json):
    token: int
    stats: dict[str, Any]
    kind: ClassVar[int] = 0x27


@dataclass(frozen=True, slots=True)
class Log(_Json):
    """A WARNING+ log record of the worker, for the daemon's log."""

    level: int
    message: str
    kind: ClassVar[int] = 0x28


@dataclass(frozen=True, slots=True)
class Stopped(_Record):
    kind: ClassVar[int] = 0x29


Message = Union[Hello, Configure, OpenStream, PushCodes, FinishStream, CancelStream, Probe,
                StatsRequest, Stop, Crash, Ready, Failed, StreamOpened, AudioOut, StreamDone,
                StreamFailed, ProbeReply, Stats, Log, Stopped]

_KINDS: dict[int, type[_Record]] = {
    c.kind: c for c in (Hello, Configure, OpenStream, FinishStream, CancelStream, Probe,
                        StatsRequest, Stop, Crash, Ready, Failed, StreamOpened, StreamDone,
                        StreamFailed, ProbeReply, Stats, Log, Stopped)}


# ------------------------------------------------------------------ packets


def _runs(messages: Iterable[Message]) -> Iterator[tuple[type[Any], list[Any]]]:
    """Consecutive messages grouped by type (batched kinds) or one by one (the others)."""
    run: list[Any] = []
    kind: type[Any] | None = None
    for m in messages:
        t = type(m)
        if t is kind and len(run) < _MAX_BATCH:
            run.append(m)
            continue
        if run:
            yield kind, run  # type: ignore[misc]
        if t in _BATCHED:
            kind, run = t, [m]
        else:
            kind, run = None, []
            yield t, [m]
    if run:
        yield kind, run  # type: ignore[misc]


def _arrays(arrays: list[Any], dtype: np.dtype[Any]) -> list[Any]:
    """The arrays as C-contiguous arrays of ``dtype`` (the common case: as they are)."""
    if all(a.dtype is dtype or a.dtype == dtype for a in arrays):
        if all(a.flags.c_contiguous for a in arrays):
            return arrays
    return [np.ascontiguousarray(a, dtype) for a in arrays]


def _push_body(run: list[PushCodes]) -> tuple[list[Any], int]:
    levels: list[Any] = []
    for m in run:
        levels += m.levels
    levels = _arrays(levels, _I32)
    sizes = [a.size for a in levels]
    k = len(run)
    head = struct.pack(f"<{k}Q{k}I{len(sizes)}I", *[m.sid for m in run],
                       *[len(m.levels) for m in run], *sizes)
    pad = -len(head) % 8
    return [head, _PAD[:pad], *levels], len(head) + pad + 4 * sum(sizes)


def _audio_body(run: list[AudioOut]) -> tuple[list[Any], int]:
    pcms = _arrays([m.pcm for m in run], _F32)
    sizes = [a.size for a in pcms]
    k = len(run)
    head = struct.pack(f"<{k}Q{k}I", *[m.sid for m in run], *sizes)
    pad = -len(head) % 8
    return [head, _PAD[:pad], *pcms], len(head) + pad + 4 * sum(sizes)


def _slices(flat: Any, lengths: Sequence[int]) -> list[Any]:
    offs = list(accumulate(lengths, initial=0))
    return [flat[a:b] for a, b in zip(offs, offs[1:])]


def push_arrays(body: memoryview, k: int) -> tuple[Any, Any, Any, Any]:
    """A PUSH record's body as its arrays, read in place: (sid u64[k], n_levels u32[k],
    lengths u32[sum(n_levels)], codes i32[sum(lengths)]); a WireError if it is not one."""
    if len(body) < 12 * k:
        raise MalformedError(f"PushCodes: body of {len(body)} bytes for {k} streams")
    sids = np.frombuffer(body, dtype=_U64A, count=k)
    nlev = np.frombuffer(body, dtype=_U32A, count=k, offset=8 * k)
    n = int(nlev.sum(dtype=np.int64))
    start = 12 * k + 4 * n
    start += -start % 8
    if len(body) < start:
        raise MalformedError(f"PushCodes: body of {len(body)} bytes for {n} levels")
    lengths = np.frombuffer(body, dtype=_U32A, count=n, offset=12 * k)
    if start + 4 * int(lengths.sum(dtype=np.int64)) != len(body):
        raise MalformedError(f"PushCodes: {int(lengths.sum(dtype=np.int64))} codes do not fill a "
                             f"body of {len(body)} bytes")
    return sids, nlev, lengths, np.frombuffer(body, dtype=_I32, offset=start)


def _ranges(starts: Any, lens: Any) -> Any:
    """The indices ``starts[i] .. starts[i] + lens[i]``, range after range (int64)."""
    total = int(lens.sum())
    before = np.cumsum(lens) - lens  # where each range begins in the output
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lens)


def push_arrays_many(data: bytes | bytearray, starts: Sequence[int], counts: Sequence[int],
                     sizes: Sequence[int]) -> tuple[Any, Any, Any, Any] | None:
    """The arrays of PUSH records in a row, concatenated as if they were one record (copies):
    what :func:`push_arrays` gives for each, in a fixed number of array operations instead of
    a few a record (a worker reads hundreds of small records a tick). The records' bodies
    are at ``starts`` (8-aligned) in ``data`` (a length of a multiple of 8), of ``counts``
    streams and ``sizes`` bytes. None when any record is not a valid PUSH body: read them one
    by one then (:func:`push_arrays` says what is wrong)."""
    if len(data) % 8:
        return None
    st = np.asarray(starts, dtype=np.int64)
    ks = np.asarray(counts, dtype=np.int64)
    sz = np.asarray(sizes, dtype=np.int64)
    if (st % 8).any() or (ks <= 0).any() or (sz < 12 * ks).any():
        return None
    u32 = np.frombuffer(data, dtype=_U32A)
    sids = np.frombuffer(data, dtype=_U64A)[_ranges(st // 8, ks)]
    nlev = u32[_ranges((st + 8 * ks) // 4, ks)]
    kc = np.concatenate(([0], np.cumsum(ks)))
    nc = np.concatenate(([0], np.cumsum(nlev, dtype=np.int64)))
    n = nc[kc[1:]] - nc[kc[:-1]]  # levels per record
    head = 12 * ks + 4 * n
    cstart = st + head + (-head % 8)  # each record's codes
    if (cstart > st + sz).any():
        return None
    lengths = u32[_ranges((st + 12 * ks) // 4, n)]
    lc = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    ncs = np.concatenate(([0], np.cumsum(n)))
    m = lc[ncs[1:]] - lc[ncs[:-1]]  # codes per record
    if (cstart + 4 * m != st + sz).any():
        return None
    codes = u32[_ranges(cstart // 4, m)].view(_I32)
    return sids, nlev, lengths, codes


def _read_push(body: memoryview, k: int) -> list[PushCodes]:
    return push_messages(*push_arrays(body, k))


def push_messages(sids: Any, nlev: Any, lengths: Any, codes: Any) -> list[PushCodes]:
    """The PushCodes of a PUSH record's arrays (:func:`push_arrays`), levels as views."""
    levels = _slices(codes, lengths.tolist())
    ends = list(accumulate(nlev.tolist(), initial=0))
    return [PushCodes(sid, levels[a:b]) for sid, a, b in zip(sids.tolist(), ends, ends[1:])]


def _read_audio(body: memoryview, k: int) -> list[AudioOut]:
    start = 12 * k + (-12 * k % 8)
    if len(body) < start:
        raise MalformedError(f"AudioOut: body of {len(body)} bytes for {k} streams")
    sids = struct.unpack_from(f"<{k}Q", body)
    counts = struct.unpack_from(f"<{k}I", body, 8 * k)
    if start + 4 * sum(counts) != len(body):
        raise MalformedError(f"AudioOut: {sum(counts)} samples do not fill a body of "
                             f"{len(body)} bytes")
    pcms = _slices(np.frombuffer(body, dtype=_F32, offset=start), counts)
    return [AudioOut(sid, pcm) for sid, pcm in zip(sids, pcms)]


_BATCHED: dict[type[Any], tuple[Callable[[Any], tuple[list[Any], int]],
                           Callable[[memoryview, int], list[Any]]]] = {
    PushCodes: (_push_body, _read_push),
    AudioOut: (_audio_body, _read_audio),
}
_READERS: dict[int, Callable[[memoryview, int], list[Any]]] = {
    t.kind: reader for t, (_, reader) in _BATCHED.items()}


def encode(messages: Iterable[Message]) -> bytes:
    """One packet of ``messages``, in order (consecutive pushes, and consecutive audio
    messages, share one batch record)."""
    parts: list[Any] = []
    for t, run in _runs(messages):
        batched = _BATCHED.get(t)
        if batched is not None:
            body, size = batched[0](run)
            count = len(run)
        else:
            m = run[0]
            body = m._body()
            size = sum(len(b) for b in body)
            count = 0
        if size > _MAX_BODY:
            raise ValueError(f"{t.__name__}: body of {size} bytes is too large")
        parts.append(_HEADER.pack(t.kind, 0, count, size))
        parts += body
        if size % 8:
            parts.append(_PAD[: 8 - size % 8])
    return b"".join(parts)


def spans(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """The records of one packet as (kind, count, body offset, body size), in order; a
    :class:`WireError` if it is not one."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    at, end = 0, len(view)
    unpack = _HEADER.unpack_from
    while at < end:
        if end - at < _HEADER.size:
            raise TruncatedError(f"{end - at} bytes left at offset {at}: not a record header")
        kind, _flags, count, size = unpack(view, at)
        start = at + _HEADER.size
        if start + size > end:
            name = getattr(_KINDS.get(kind), "__name__", f"record 0x{kind:02x}")
            raise TruncatedError(f"{name} at offset {at}: body of {size} bytes, "
                                 f"{end - start} left")
        if kind not in _READERS and kind not in _KINDS:
            raise MalformedError(f"unknown record kind 0x{kind:02x} at offset {at}")
        yield kind, count, start, size
        at = start + size + (-size % 8)
    if at != end:
        raise TruncatedError("the last record's padding runs past the end of the packet")


def spans_at(data: bytes | bytearray | memoryview, at: int) -> list[tuple[int, int, int, int]]:
    """:func:`spans` of one packet that sits at offset ``at`` of a larger buffer (its bodies'
    offsets in that buffer), as a list; a packet of one record, the most common, is read from
    its header alone (a worker takes hundreds of them a tick)."""
    if len(data) >= _HEADER.size:
        kind, _flags, count, size = _HEADER.unpack_from(data)
        if len(data) == _HEADER.size + size + (-size % 8) and (kind in _READERS or
                                                               kind in _KINDS):
            return [(kind, count, at + _HEADER.size, size)]
    return [(kind, count, at + start, size) for kind, count, start, size in spans(data)]


def records(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, memoryview]]:
    """The records of one packet as (kind, count, body), in order; a :class:`WireError` if it
    is not one (for a reader that handles some kinds in bulk: :func:`push_arrays`)."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    for kind, count, start, size in spans(view):
        yield kind, count, view[start:start + size]


def read_record(kind: int, count: int, body: memoryview) -> list[Message]:
    """The messages of one record (:func:`records`)."""
    reader = _READERS.get(kind)
    if reader is not None:
        return reader(body, count)
    return [_KINDS[kind]._read(body, count)]


def decode(data: bytes | bytearray | memoryview) -> list[Message]:
    """The messages of one packet; a :class:`WireError` if it is not one. Arrays in the
    messages are read-only views of ``data``."""
    out: list[Message] = []
    for kind, count, body in records(data):
        out += read_record(kind, count, body)
    return out


def audio_packet(sids: Any, counts: Any, pcm: Any) -> list[Any]:
    """One packet of one AUDIO batch record from arrays, as the parts to concatenate (no
    copy of ``pcm``): the bytes :func:`encode` writes for ``AudioOut(sids[i], pcm of
    counts[i] samples)``, in order. ``sids``: u64[k], ``counts``: u32[k] (each > 0),
    ``pcm``: f32[sum(counts)], C-contiguous; k <= 65535."""
    k = len(sids)
    size = _audio_size(k, len(pcm))
    head = size - 4 * len(pcm)
    return [_HEADER.pack(AudioOut.kind, 0, k, size), np.ascontiguousarray(sids, _U64A),
            np.ascontiguousarray(counts, _U32A), _PAD[:head - 12 * k],
            np.ascontiguousarray(pcm, _F32), _PAD[:-size % 8]]


def _audio_size(k: int, samples: int) -> int:
    """The body size of an AUDIO record of ``k`` streams and ``samples`` in all (sids, counts,
    pad, PCM); ValueError past the wire's limits."""
    if k > _MAX_BATCH:
        raise ValueError(f"an AUDIO record holds at most {_MAX_BATCH} streams, got {k}")
    size = 12 * k + (-12 * k % 8) + 4 * samples
    if size > _MAX_BODY:
        raise ValueError(f"AudioOut: body of {size} bytes is too large")
    return size


def audio_head(k: int) -> int:
    """Bytes of a packet of one AUDIO record of ``k`` streams before its PCM (the record
    header, sids, counts, pad): where :func:`audio_record_into` wants the PCM."""
    return _HEADER.size + 12 * k + (-12 * k % 8)


def audio_record_into(buf: Any, sids: Any, counts: Any) -> int:
    """Complete in place a packet of one AUDIO record whose PCM (``sum(counts)`` f32, stream
    after stream) was written at ``audio_head(len(counts))`` of ``buf`` (a writable buffer):
    the bytes :func:`audio_packet` gives for the streams with samples (those without are
    left out: their entries go, the PCM moves down). ``sids``: u64[k], ``counts``: ints[k].
    Returns the packet's size with its pad (``buf`` holds it), 0 when no stream has samples."""
    counts = np.asarray(counts)
    keep = counts > 0
    k = int(np.count_nonzero(keep))
    if k == 0:
        return 0
    total = int(counts.sum())
    size = _audio_size(k, total)
    at = audio_head(len(counts))
    head = audio_head(k)
    if head != at:  # streams without samples: the PCM moves down (numpy copies overlaps safely)
        np.copyto(np.frombuffer(buf, dtype=_F32, count=total, offset=head),
                  np.frombuffer(buf, dtype=_F32, count=total, offset=at))
    view = memoryview(buf).cast("B")
    _HEADER.pack_into(view, 0, AudioOut.kind, 0, k, size)
    np.frombuffer(view, dtype=_U64A, count=k, offset=8)[:] = np.asarray(sids)[keep]
    np.frombuffer(view, dtype=_U32A, count=k, offset=8 + 8 * k)[:] = counts[keep]
    view[8 + 12 * k:head] = _PAD[:head - 8 - 12 * k]
    end = _HEADER.size + size
    view[end:end + (-size % 8)] = _PAD[:-size % 8]
    return end + (-size % 8)


def check_hello(messages: Sequence[Message]) -> list[Message]:
    """The messages after a leading :class:`Hello` of this version; VersionError otherwise."""
    if not messages or not isinstance(messages[0], Hello):
        got = ", ".join(type(m).__name__ for m in messages[:4]) or "nothing"
        raise VersionError(f"the peer did not start with a hello (its first packet: {got})")
    if messages[0].version != WIRE_VERSION:
        raise VersionError(f"the peer speaks wire version {messages[0].version}, "
                           f"this end {WIRE_VERSION}")
    return list(messages[1:])
