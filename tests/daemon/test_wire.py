"""The engine <-> worker wire (codecd.wire): byte layouts, round trips, typed errors on bad bytes,
the version check at the hello, and codes the wire cannot carry."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codecd import wire as W
from codecd.engine import EngineConfig, child_pythonpath

I32 = np.int32


def _levels(*ns: int) -> list[np.ndarray]:
    return [np.arange(n, dtype=I32) * (i + 1) - 3 for i, n in enumerate(ns)]


ALL = [
    W.Hello(),
    W.Configure(EngineConfig(models={"m": "/m.gguf"}).to_json(), "cpu", 1, 42),
    W.OpenStream(7, "snac", W.StreamOptions(True, 2**63, "low", "alice", {"n_codebooks": 8})),
    W.PushCodes(7, _levels(1, 2, 4)),
    W.PushCodes(2**64 - 1, _levels(0, 5)),
    W.PushCodes(8, []),
    W.FinishStream(7), W.CancelStream(7), W.Probe(3), W.StatsRequest(4), W.Stop(),
    W.Crash("hang"),
    W.Ready({"models": {"m": {"sample_rate": 24000, "voices": []}}}),
    W.Failed("ModelFileError: no such file"),
    W.StreamOpened(7, 4757, 24000, 4),
    W.AudioOut(7, np.linspace(-1, 1, 9, dtype=np.float32)),
    W.AudioOut(9, np.zeros(0, np.float32)),
    W.StreamDone(7, 2**40), W.StreamFailed(7, "token_range", "code 4096 \u2260 [0, 4096)"),
    W.ProbeReply(3), W.Stats(4, {"models": {}, "uptime_s": 1.5}), W.Log(30, "x: warn"),
    W.Stopped(),
]


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, W.PushCodes):
        return a.sid == b.sid and len(a.levels) == len(b.levels) and all(
            x.dtype == I32 and np.array_equal(x, y) for x, y in zip(b.levels, a.levels))
    if isinstance(a, W.AudioOut):
        return a.sid == b.sid and b.pcm.dtype == np.float32 and np.array_equal(a.pcm, b.pcm)
    return bool(a == b)


def test_every_message_round_trips():
    """encode then decode gives every message back, in order, arrays as int32 / float32."""
    out = W.decode(W.encode(ALL))
    assert len(out) == len(ALL)
    for a, b in zip(ALL, out):
        assert _same(a, b), (a, b)
    assert W.decode(b"") == []


def test_hot_records_have_their_documented_layout():
    """Pushes and audio are batch records (fixed structs, raw arrays, 8-aligned); a run of them
    shares one record, and anything in between keeps its place."""
    lv = [np.array([1], I32), np.array([2, 3], I32), np.array([4, 5, 6, 7], I32)]
    push = W.encode([W.PushCodes(5, lv)])
    body = struct.pack("<QIIII", 5, 3, 1, 2, 4) + struct.pack("<7i", 1, 2, 3, 4, 5, 6, 7)
    assert push == struct.pack("<BBHI", 0x12, 0, 1, len(body)) + body + bytes(-len(body) % 8)
    two = W.encode([W.PushCodes(5, lv[:1]), W.PushCodes(6, lv[1:])])
    body = (struct.pack("<QQIIIII", 5, 6, 1, 2, 1, 2, 4) + bytes(4)
            + struct.pack("<7i", 1, 2, 3, 4, 5, 6, 7))
    assert two == struct.pack("<BBHI", 0x12, 0, 2, len(body)) + body + bytes(-len(body) % 8)
    pcm = np.array([0.5, -0.25, 1.0], np.float32)
    audio = W.encode([W.AudioOut(9, pcm)])
    body = struct.pack("<QI", 9, 3) + bytes(4) + pcm.astype("<f4").tobytes()
    assert audio == struct.pack("<BBHI", 0x23, 0, 1, len(body)) + body + bytes(4)
    assert W.encode([W.StreamDone(9, 3)]) == struct.pack("<BBHIQq", 0x24, 0, 0, 16, 9, 3)
    mixed = [W.PushCodes(1, lv), W.PushCodes(2, lv), W.FinishStream(1), W.PushCodes(3, lv)]
    packet = W.encode(mixed)
    kinds, at = [], 0
    while at < len(packet):  # every record starts 8-byte aligned
        assert at % 8 == 0
        kinds.append(packet[at])
        at += 8 + struct.unpack_from("<I", packet, at + 4)[0]
        at += -at % 8
    assert kinds == [0x12, 0x13, 0x12]
    assert [(type(m).__name__, m.sid) for m in W.decode(packet)] == [
        ("PushCodes", 1), ("PushCodes", 2), ("FinishStream", 1), ("PushCodes", 3)]


def test_decoded_arrays_are_views_of_the_packet():
    """Codes and PCM come out as read-only views, not copies."""
    (push, audio) = W.decode(W.encode([W.PushCodes(1, _levels(3)), W.AudioOut(1, np.ones(4, np.float32))]))
    assert not push.levels[0].flags.writeable and not push.levels[0].flags.owndata
    assert not audio.pcm.flags.writeable and not audio.pcm.flags.owndata


def test_every_truncation_is_a_typed_error():
    """A packet cut anywhere but between records raises TruncatedError; at a boundary it
    decodes to the messages of the records before the cut."""
    packet = W.encode(ALL)
    whole = W.decode(packet)
    bounds, at, n = {0: 0}, 0, 0
    while at < len(packet):
        kind, _, count, size = struct.unpack_from("<BBHI", packet, at)
        n += count if kind in (0x12, 0x23) else 1  # batch records hold `count` messages
        at += 8 + size + (-size % 8)
        bounds[at] = n
    assert n == len(whole) == len(ALL)
    for cut in range(len(packet)):
        if cut in bounds:
            got = W.decode(packet[:cut])
            assert len(got) == bounds[cut] and all(_same(a, b) for a, b in zip(whole, got))
        else:
            with pytest.raises(W.TruncatedError):
                W.decode(packet[:cut])


def _record(kind: int, body: bytes, count: int = 0) -> bytes:
    return struct.pack("<BBHI", kind, 0, count, len(body)) + body + bytes(-len(body) % 8)


@pytest.mark.parametrize("raw, match", [
    (_record(0x7F, b""), "unknown record kind"),
    (_record(0x12, struct.pack("<QII", 1, 1, 5) + bytes(8), count=1), "do not fill"),
    (_record(0x12, struct.pack("<Q", 1), count=3), "for 3 streams"),
    (_record(0x12, struct.pack("<QI", 1, 9), count=1), "for 9 levels"),
    (_record(0x23, struct.pack("<QII", 1, 9, 0) + bytes(8), count=1), "do not fill"),
    (_record(0x23, struct.pack("<Q", 1), count=1), "for 1 streams"),
    (_record(0x24, bytes(8)), "expected 16"),
    (_record(0x25, struct.pack("<QHHI", 1, 2, 0, 1) + b"\xff\xfeX"), "StreamFailed"),
    (_record(0x11, b"{not json"), "not JSON"),
    (_record(0x11, b"[1, 2]"), "not a JSON object"),
    (_record(0x11, b'{"sid": 1}'), "OpenStream"),
    (_record(0x17, b"x"), "has no body"),
])
def test_garbled_records_are_malformed(raw, match):
    """Unknown kinds, sizes that disagree, bad utf-8 and bad JSON raise MalformedError."""
    with pytest.raises(W.MalformedError, match=match):
        W.decode(raw)


def test_hello_checks_magic_and_version():
    """A hello of another version or magic, or none, is a VersionError."""
    assert W.check_hello(W.decode(W.encode([W.Hello(), W.Stop()]))) == [W.Stop()]
    with pytest.raises(W.VersionError, match="version 2"):
        W.check_hello([W.Hello(2)])
    with pytest.raises(W.VersionError, match="did not start"):
        W.check_hello([W.Stop()])
    with pytest.raises(W.VersionError, match="magic"):
        W.decode(_record(0x01, struct.pack("<4sHH", b"HTTP", 1, 0)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_wire_errors(data):
    """Whatever the bytes, decode returns messages or raises a WireError."""
    try:
        W.decode(data)
    except W.WireError:
        pass


def _push_spans(packets: list[bytes]) -> tuple[bytes, list[int], list[int], list[int]]:
    """Packets in a row as a worker copies them from a ring, and their records' spans."""
    buf, starts, counts, sizes = b"", [], [], []
    for p in packets:
        for kind, count, start, size in W.spans(p):
            assert kind == W.PushCodes.kind
            starts.append(len(buf) + start)
            counts.append(count)
            sizes.append(size)
        buf += p
    return buf, starts, counts, sizes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 2**40), st.lists(st.integers(0, 9), max_size=4)),
                         min_size=1, max_size=5), min_size=1, max_size=6))
def test_push_records_in_a_row_read_at_once_equal_each_read_alone(records):
    """push_arrays_many over PUSH records in a row equals push_arrays of each, concatenated:
    any number of streams a record, of levels a stream, of codes a level (none included)."""
    packets = [W.encode([W.PushCodes(sid, _levels(*ns)) for sid, ns in rec]) for rec in records]
    buf, starts, counts, sizes = _push_spans(packets)
    got = W.push_arrays_many(buf, starts, counts, sizes)
    assert got is not None
    alone = [W.push_arrays(memoryview(buf)[a:a + n], k) for a, k, n in zip(starts, counts, sizes)]
    for g, parts in zip(got, zip(*alone)):
        want = np.concatenate(parts)
        assert g.dtype == want.dtype and g.dtype.isnative and g.flags.c_contiguous
        assert np.array_equal(g, want)


def test_spans_at_are_the_spans_shifted_and_refuse_the_same():
    """spans_at (a packet inside a larger buffer) equals spans with offsets moved, for a
    packet of one record and of several; bad bytes raise the same errors."""
    for msgs in ([W.PushCodes(7, _levels(3, 2))], ALL):
        p = W.encode(msgs)
        want = [(k, c, 40 + s, n) for k, c, s, n in W.spans(p)]
        assert W.spans_at(p, 40) == want and W.spans_at(memoryview(p), 40) == want
    for bad in (b"\x12\x00", _record(0x7F, b""), W.encode([W.Stop()])[:-1]):
        with pytest.raises(W.WireError):
            list(W.spans(bad))
        with pytest.raises(W.WireError):
            W.spans_at(bad, 0)


def test_push_records_read_at_once_refuse_what_each_read_alone_refuses():
    """Bytes that are not PUSH bodies give None (the caller reads them one by one, and
    push_arrays names the fault): level counts past the body, lengths that do not fill it,
    a count of 0 streams, an unaligned record."""
    good = W.encode([W.PushCodes(7, _levels(3, 2))])
    other = W.encode([W.PushCodes(8, _levels(1))])
    buf, starts, counts, sizes = _push_spans([good, other])
    assert W.push_arrays_many(buf, starts, counts, sizes) is not None
    bad_levels = bytearray(buf)
    struct.pack_into("<I", bad_levels, starts[0] + 8, 1000)  # n_levels of stream 7
    bad_length = bytearray(buf)
    struct.pack_into("<I", bad_length, starts[0] + 12, 99)  # its first level's length
    for data, st_, ks in ((bytes(bad_levels), starts, counts),
                          (bytes(bad_length), starts, counts),
                          (buf, starts, [0, counts[1]]),
                          (buf, [starts[0] + 4, starts[1]], counts)):
        assert W.push_arrays_many(data, st_, ks, sizes) is None
    with pytest.raises(W.WireError):
        W.push_arrays(memoryview(bytes(bad_levels))[starts[0]:starts[0] + sizes[0]], 1)
    with pytest.raises(W.WireError):
        W.push_arrays(memoryview(bytes(bad_length))[starts[0]:starts[0] + sizes[0]], 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 9)), min_size=1, max_size=12))
def test_an_audio_record_completed_in_place_equals_the_packet_of_its_arrays(streams):
    """PCM written where audio_head says, then audio_record_into: the bytes audio_packet gives
    for the streams with samples (those without left out, the PCM moved down), padded."""
    sids = np.array([sid for sid, _ in streams], dtype=np.uint64)
    counts = np.array([n for _, n in streams], dtype=np.int64)
    pcm = np.arange(int(counts.sum()), dtype=np.float32) + 0.5
    at = W.audio_head(len(streams))
    room = at + 4 * pcm.size
    buf = bytearray(b"\xee" * (room + 8))  # stale bytes where the pads go
    buf[at:room] = pcm.tobytes()
    size = W.audio_record_into(memoryview(buf), sids, counts)
    keep = counts > 0
    if not keep.any():
        assert size == 0
        return
    want = b"".join(bytes(p) for p in W.audio_packet(sids[keep], counts[keep].astype(np.uint32),
                                                       pcm))
    assert size == len(want) and bytes(buf[:size]) == want
    got = W.decode(bytes(buf[:size]))
    assert [m.sid for m in got] == sids[keep].tolist()
    assert np.array_equal(np.concatenate([m.pcm for m in got]), pcm)


def test_engine_config_round_trips_as_json():
    """One configuration object, serialised once: JSON round trip, tuples restored, bad input refused."""
    cfg = EngineConfig(models={"a": "/a.gguf"}, warm_buckets=(8, 1), voices={"v": "/v"},
                       family_options={"s3gen": {"chunk": 9}})
    assert EngineConfig.from_json(cfg.to_json()) == cfg
    for bad in ("[]", '{"models": {}, "nope": 1}', '{"n_threads": 1}'):
        with pytest.raises(ValueError):
            EngineConfig.from_json(bad)


def _worker(first: bytes) -> list[W.Message]:
    """Start a real worker process, send it one packet, return what it answers."""
    import os

    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import codecd.worker as w; w.serve_fd({child.fileno()})"],
                            pass_fds=(child.fileno(),), env=env)
    child.close()
    conn = Connection(parent.detach())
    try:
        conn.send_bytes(first)
        assert conn.poll(30)
        return W.decode(conn.recv_bytes())
    finally:
        conn.close()
        assert proc.wait(30) == 3


def test_worker_refuses_another_wire_version():
    """A worker whose parent speaks another version answers its own hello and Failed, and exits."""
    cfg = EngineConfig(models={}).to_json()
    hello, failed = _worker(W.encode([W.Hello(99), W.Configure(cfg, "cpu", 0, 0)]))
    assert hello == W.Hello() and isinstance(failed, W.Failed) and "version 99" in failed.message
    hello, failed = _worker(W.encode([W.Hello(), W.Stop()]))
    assert "no configuration" in failed.message


def test_engine_refuses_a_worker_of_another_version(monkeypatch, tmp_path: Path):
    """The engine checks the worker's hello: another version fails the start, typed."""
    from codecd.engine import EnginePool, EngineStartError

    monkeypatch.setattr(W, "WIRE_VERSION", 2)  # this end now expects 2; the worker says 1

    async def main() -> None:
        pool = EnginePool(EngineConfig(models={"m": str(tmp_path / "m.gguf")},
                                       start_timeout_s=30.0), ["cpu"])
        with pytest.raises(EngineStartError, match="wire version 1"):
            await pool.start()

    asyncio.run(main())


def test_codes_the_wire_cannot_carry_fail_their_stream(tmp_path: Path):
    """Codes that are not integers, do not fit int32 or are not 1-D end their stream with the
    runtime's code, as an event; other streams go on."""
    from conftest import codecrt_or_skip
    from smallmodel import small_codes, write_small_snac

    from codecd.engine import Done, EnginePool, StreamError

    pytest.importorskip("gguf")
    codecrt_or_skip()
    small = write_small_snac(tmp_path / "small.gguf", seed=3)

    async def main() -> None:
        events: dict[str, list[Any]] = {}
        pool = EnginePool(EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8,
                                       max_batch=8, start_timeout_s=30.0),
                          ["cpu"], on_event=lambda e: events.setdefault(e.key, []).append(e))
        await pool.start()
        try:
            bad = {"float": [np.zeros(1), np.zeros(2), np.zeros(4)],
                   "big": [np.zeros(1, np.int64), np.zeros(2, np.int64),
                           np.array([0, 0, 0, 2**40])],
                   "2d": [np.zeros((1, 1), I32), np.zeros(2, I32), np.zeros(4, I32)]}
            for key, codes in bad.items():
                pool.open(key, "small")
                pool.push(key, codes)
            pool.open("good", "small")
            pool.push("good", [c.astype(np.int64) for c in small_codes(16, np.random.default_rng(1))])
            pool.finish("good")
            for _ in range(500):
                if all(any(isinstance(e, (Done, StreamError)) for e in events.get(k, []))
                       for k in (*bad, "good")):
                    break
                await asyncio.sleep(0.01)
            codes = {k: [e.code for e in events[k] if isinstance(e, StreamError)] for k in bad}
            assert codes == {"float": ["bad_codes"], "big": ["token_range"], "2d": ["broken_group"]}
            assert isinstance(events["good"][-1], Done)
            stats = (await pool.fetch_stats())["workers"][0]["worker"]["models"]["small"]
            assert stats["streams_open"] == 0 and stats["codecrt"]["streams_active"] == 0
        finally:
            await pool.close()

    asyncio.run(main())
