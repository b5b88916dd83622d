"""Wire format v1 (codecd.protocol): round trips, every error path, fuzzing."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codecd import protocol as P
from codecd.protocol import ErrorCode, Limits, ProtocolError

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def perr(fn, *args) -> ProtocolError:
    with pytest.raises(ProtocolError) as ei:
        fn(*args)
    return ei.value


def obj(**kw) -> str:
    return json.dumps(kw)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("msg", [
    P.Hello(),
    P.Hello(version=1, client="orpheus-fe/2"),
    P.Start("a", "snac_24khz", "orpheus_ids"),
    P.Start("utt 7", "m", "levels", format="mulaw", sample_rate=16000, latency="low",
            noise=True, seed=2**64 - 1, voice="tara"),
    P.Start("é✓", "m", "orpheus", format="pcm_f32le"),
    P.End("a"),
    P.Cancel("a"),
])
def test_client_text_round_trip(msg):
    """Every client text message survives encode_client -> parse_text unchanged."""
    assert P.parse_text(P.encode_client(msg)) == msg


def test_tokens_text_round_trip():
    """A tokens message with a token sequence round-trips."""
    m = P.parse_text(P.encode_client(P.TokenChunk("s", tokens=np.array([1, 2, 128266]))))
    assert isinstance(m, P.TokenChunk) and m.stream_id == "s" and m.levels is None
    assert m.tokens is not None and m.tokens.tolist() == [1, 2, 128266]


def test_levels_text_round_trip():
    """A tokens message with levels of different lengths round-trips."""
    lv = {0: np.array([5]), 1: np.array([], dtype=np.int64), 2: np.array([1, 2, 3, 4])}
    m = P.parse_text(P.encode_client(P.TokenChunk("s", levels=lv)))
    assert isinstance(m, P.TokenChunk) and m.tokens is None and m.levels is not None
    assert {k: v.tolist() for k, v in m.levels.items()} == {0: [5], 1: [], 2: [1, 2, 3, 4]}


def test_bare_array_round_trip():
    """A bare JSON array parses as tokens with no stream id."""
    m = P.parse_text("[128266, 132362]")
    assert isinstance(m, P.TokenChunk) and m.stream_id is None
    assert m.tokens is not None and m.tokens.tolist() == [128266, 132362]
    assert P.encode_client(m) == "[128266,132362]"


@pytest.mark.parametrize("level", [None, 0, 2])
def test_binary_tokens_round_trip(level):
    """Binary token frames carry id, level and int32 tokens (negative included)."""
    toks = [0, 4095, -1, 2**31 - 1, -(2**31)]
    data = P.encode_token_frame("str-ëam", toks, level)
    m = P.parse_binary(data)
    assert m.stream_id == "str-ëam"
    if level is None:
        assert m.tokens is not None and m.tokens.tolist() == toks
    else:
        assert m.levels is not None and list(m.levels) == [level]
        assert m.levels[level].tolist() == toks


def test_binary_header_layout():
    """The token frame header is kind, level, id_len, id, then int32 LE."""
    data = P.encode_token_frame("ab", [1, 256])
    assert data == b"\x01\xff\x02ab" + struct.pack("<ii", 1, 256)


def test_empty_binary_payload_is_valid():
    """A token frame with no tokens parses to an empty chunk."""
    m = P.parse_binary(b"\x01\xff\x01x")
    assert m.tokens is not None and m.tokens.size == 0 and m.count == 0


def test_server_messages_round_trip():
    """Every server text message survives encode_* -> parse_server_text."""
    hello = P.parse_server_text(P.encode_hello({"server": "codecd/0.1.0", "models": [],
                                                 "formats": list(P.FORMATS), "limits": {}}))
    assert hello == P.ServerHello({"version": 1, "server": "codecd/0.1.0", "models": [],
                                   "formats": list(P.FORMATS), "limits": {}})
    assert P.parse_server_text(P.encode_started("s", 24000, "pcm_s16le", 512)) == \
        P.Started("s", 24000, "pcm_s16le", 512, channels=1, latency="exact")
    assert P.parse_server_text(P.encode_done("s", 24000, 24000)) == P.Done("s", 24000, 1.0)
    assert P.parse_server_text(P.encode_cancelled("s")) == P.Cancelled("s")
    assert P.parse_server_text(P.encode_error(ErrorCode.BUSY, "full")) == \
        P.Error("busy", "full", None)
    assert P.parse_server_text(
        P.encode_error("token_range", "bad", "s", {"index": 3})) == \
        P.Error("token_range", "bad", "s", {"index": 3})


def test_audio_frame_round_trip():
    """Audio frames: kind 0x02, id, u32 seq, u64 offset, raw PCM."""
    pcm = b"\x01\x02\x03\x04"
    data = P.encode_audio("s1", 7, 2**40, pcm)
    assert data[:4] == b"\x02\x02s1" and data[4:16] == struct.pack("<IQ", 7, 2**40)
    assert P.parse_audio(data) == P.AudioFrame("s1", 7, 2**40, pcm)
    assert perr(P.parse_audio, data[:10]).code == ErrorCode.BAD_BINARY


def test_error_close_codes():
    """Every error code maps to a websockets close code; fatal iff no stream id."""
    assert set(P.ERRORS) == set(ErrorCode)
    assert P.close_code_for("message_too_big") == 1009
    assert P.close_code_for("busy") == 1013
    assert P.close_code_for("shutting_down") == 1001
    assert P.close_code_for("engine_error") == 1011
    assert P.close_code_for("no_such_code") == 1008
    assert ProtocolError("bad_json", "x").fatal
    assert not ProtocolError("token_range", "x", "s").fatal


def test_docs_list_every_error_code():
    """docs/protocol.md documents every error code with its close code, and is v1."""
    text = DOC.read_text()
    assert "v1" in text.splitlines()[0]
    for code, info in P.ERRORS.items():
        row = re.search(rf"^\| `{code.value}` \|.*\| ({info.close_code}) \|$", text, re.M)
        assert row, f"{code.value} (close {info.close_code}) missing from docs/protocol.md"


def test_truncate_reason():
    """Close reasons are cut to 123 bytes without splitting a character."""
    r = P.truncate_reason("é" * 100)
    assert len(r.encode()) <= 123 and r == "é" * 61


# ------------------------------------------------------------------- text errors


@pytest.mark.parametrize("data", ["{", "", "nope", "{'a': 1}", '"str"', "3", "null", "true",
                                  '{"type": NaN}', "[Infinity]", "1" * 5000, "[" * 50000])
def test_bad_json(data):
    """Frames that are not a JSON object/array fail with bad_json (connection-fatal)."""
    e = perr(P.parse_text, data)
    assert e.code == ErrorCode.BAD_JSON and e.fatal and e.close_code == 1008


@pytest.mark.parametrize("data,scoped", [
    (obj(), False),
    (obj(type=1), False),
    (obj(type="pause"), False),
    (obj(type="pause", stream_id="s"), True),
    (obj(type="start", stream_id="s"), True),  # no model
    (obj(type="start", stream_id="s", model=3, layout="orpheus"), True),
    (obj(type="start", stream_id="s", model="m"), True),  # no layout
    (obj(type="start", stream_id="s", model="m", layout="orpheus", noise="yes"), True),
    (obj(type="start", stream_id="s", model="m", layout="orpheus", seed=-1), True),
    (obj(type="start", stream_id="s", model="m", layout="orpheus", seed=1.5), True),
    (obj(type="start", stream_id="s", model="m", layout="orpheus", latency="fast"), True),
    (obj(type="start", stream_id="s", model="m", layout="orpheus", voice=""), True),
    (obj(type="start", stream_id="s", model="m", layout="orpheus", sample_rate="8k"), True),
    (obj(type="tokens", stream_id="s"), True),
    (obj(type="tokens", stream_id="s", tokens=[1], levels=[[1]]), True),
    (obj(type="tokens", stream_id="s", tokens=[1, 2.0]), True),
    (obj(type="tokens", stream_id="s", tokens=[True]), True),
    (obj(type="tokens", stream_id="s", tokens="1 2"), True),
    (obj(type="tokens", stream_id="s", levels=[1, 2]), True),
    (obj(type="tokens", stream_id="s", levels=[]), True),
    (obj(type="end"), False),
    (obj(type="cancel", stream_id=""), False),
    (obj(type="end", stream_id="x" * 65), False),
    (obj(type="end", stream_id="a\nb"), False),
    (obj(type="end", stream_id=5), False),
    (obj(type="hello", version=2), False),
    (obj(type="hello", version=2, stream_id="s"), False),  # a hello is the connection's
    (obj(type="hello", version="1"), False),
    ("[1, 2, \"3\"]", False),
])
def test_bad_message(data, scoped):
    """Unknown types and missing/mistyped fields fail with bad_message, scoped when possible."""
    e = perr(P.parse_text, data)
    assert e.code == ErrorCode.BAD_MESSAGE, e
    assert (e.stream_id == "s") if scoped else e.fatal


def test_bad_layout_and_format():
    """An unknown layout is bad_layout, an unknown format or rate bad_format, scoped."""
    base = {"type": "start", "stream_id": "s", "model": "m", "layout": "orpheus"}
    e = perr(P.parse_text, json.dumps({**base, "layout": "dac"}))
    assert (e.code, e.stream_id) == (ErrorCode.BAD_LAYOUT, "s")
    e = perr(P.parse_text, json.dumps({**base, "format": "wav"}))
    assert (e.code, e.stream_id) == (ErrorCode.BAD_FORMAT, "s")
    for rate in (0, 7999, 192001):
        e = perr(P.parse_text, json.dumps({**base, "sample_rate": rate}))
        assert (e.code, e.stream_id) == (ErrorCode.BAD_FORMAT, "s")


def test_defaults_of_start():
    """start defaults: pcm_s16le, model rate, exact latency, no noise."""
    m = P.parse_text(obj(type="start", stream_id="s", model="m", layout="levels",
                         format=None, future_field={"x": 1}))
    assert m == P.Start("s", "m", "levels", "pcm_s16le", None, "exact", False, None, None)


def test_oversized_text():
    """A text frame over max_message_bytes fails with message_too_big (1009), UTF-8 counted."""
    lim = Limits(max_message_bytes=100)
    e = perr(P.parse_text, "[" + "1," * 60 + "1]", lim)
    assert e.code == ErrorCode.MESSAGE_TOO_BIG and e.fatal and e.close_code == 1009
    # 40 characters, 120 bytes of UTF-8
    e = perr(P.parse_text, obj(type="end", stream_id="✓" * 40), lim)
    assert e.code == ErrorCode.MESSAGE_TOO_BIG
    assert isinstance(P.parse_text(obj(type="end", stream_id="s"), lim), P.End)


def test_too_many_tokens_in_message():
    """More tokens than max_tokens_per_message fail with message_too_big for that stream."""
    lim = Limits(max_tokens_per_message=4)
    e = perr(P.parse_text, obj(type="tokens", stream_id="s", tokens=[1] * 5), lim)
    assert (e.code, e.stream_id) == (ErrorCode.MESSAGE_TOO_BIG, "s")
    e = perr(P.parse_text, obj(type="tokens", stream_id="s", levels=[[1] * 3, [1] * 2]), lim)
    assert (e.code, e.stream_id) == (ErrorCode.MESSAGE_TOO_BIG, "s")
    e = perr(P.parse_binary, P.encode_token_frame("s", [1] * 5), lim)
    assert (e.code, e.stream_id) == (ErrorCode.MESSAGE_TOO_BIG, "s")
    e = perr(P.parse_text, "[1, 1, 1, 1, 1]", lim)
    assert e.code == ErrorCode.MESSAGE_TOO_BIG and e.bare


def test_huge_and_negative_ints_parse():
    """Negative and beyond-int64 JSON integers parse (range is the session's check)."""
    m = P.parse_text(obj(type="tokens", stream_id="s", tokens=[-5, 10**30, -(10**30)]))
    assert isinstance(m, P.TokenChunk) and m.tokens is not None
    assert m.tokens.tolist() == [-5, 2**63 - 1, -(2**63)]
    assert m.wide == {P.SEQUENCE_KEY: {1: str(10**30), 2: str(-(10**30))}}


@pytest.mark.parametrize("digits", [4300, 4301, 20000])
def test_ints_beyond_the_int_string_limit_parse(digits):
    """Integers of thousands of digits (Python's int-string limit is 4300) parse: clamped,
    their text kept as sent, in token arrays, levels and bare arrays."""
    big = "7" * digits
    m = P.parse_text('{"type":"tokens","stream_id":"s","tokens":[1,-%s]}' % big)
    assert m.tokens.tolist() == [1, -(2**63)] and m.wide == {P.SEQUENCE_KEY: {1: "-" + big}}
    m = P.parse_text('{"type":"tokens","stream_id":"s","levels":[[1],[%s]]}' % big)
    assert m.levels[1].tolist() == [2**63 - 1] and m.wide == {1: {0: big}}
    m = P.parse_text("[%s]" % big)
    assert m.stream_id is None and m.wide == {P.SEQUENCE_KEY: {0: big}}


def test_huge_ints_in_other_fields_are_bad_message():
    """A huge integer where a bounded one belongs is bad_message for the stream, briefly."""
    e = perr(P.parse_text, '{"type":"start","stream_id":"s","model":"m","layout":"orpheus",'
                           '"seed":%s}' % ("9" * 5000))
    assert (e.code, e.stream_id) == (ErrorCode.BAD_MESSAGE, "s") and len(e.message) < 200
    e = perr(P.parse_text, '{"type":"hello","version":%s}' % ("9" * 5000))
    assert e.code == ErrorCode.BAD_MESSAGE


def test_binary_chunks_are_marked_binary():
    """Token chunks from binary frames say so (the session's bad_binary for bad levels)."""
    assert P.parse_binary(P.encode_token_frame("s", [1], 2)).binary
    assert not P.parse_text(obj(type="tokens", stream_id="s", tokens=[1])).binary


# ----------------------------------------------------------------- binary errors


@pytest.mark.parametrize("data", [b"", b"\x01", b"\x01\xff", b"\x01\xff\x05abc",
                                  b"\x02\xff\x01a", b"\x01\xff\x00",
                                  b"\x01\xff\x02\xc3\x28", b"\x01\xff\x01\n"])
def test_bad_binary_header(data):
    """Truncated headers, a wrong kind, empty/invalid ids are bad_binary, connection-fatal."""
    e = perr(P.parse_binary, data)
    assert e.code == ErrorCode.BAD_BINARY and e.fatal


@pytest.mark.parametrize("extra", [1, 2, 3, 7])
def test_binary_payload_not_whole_int32(extra):
    """A payload that is not a whole number of int32 is bad_binary for that stream."""
    e = perr(P.parse_binary, P.encode_token_frame("s", [1]) + b"\x00" * extra)
    assert (e.code, e.stream_id) == (ErrorCode.BAD_BINARY, "s")


def test_binary_too_big():
    """A binary frame over max_message_bytes is message_too_big (fatal, 1009)."""
    e = perr(P.parse_binary, P.encode_token_frame("s", [1] * 30), Limits(max_message_bytes=64))
    assert e.code == ErrorCode.MESSAGE_TOO_BIG and e.fatal


def test_binary_level_out_of_range():
    """A level index beyond max_levels (other than 0xFF) is bad_binary for the stream."""
    e = perr(P.parse_binary, P.encode_token_frame("s", [1], 200))
    assert (e.code, e.stream_id) == (ErrorCode.BAD_BINARY, "s")


def test_stream_id_rules():
    """Stream ids: 1..64 printable chars, <= 255 UTF-8 bytes."""
    assert P.valid_stream_id("a") and P.valid_stream_id("x" * 64)
    assert P.valid_stream_id("utt 1")
    assert not P.valid_stream_id("") and not P.valid_stream_id("x" * 65)
    assert not P.valid_stream_id("a\tb") and not P.valid_stream_id("\ud800")
    assert not P.valid_stream_id("𝄞" * 64)  # 256 bytes
    assert not P.valid_stream_id(3)


# ------------------------------------------------------------------------ fuzz

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=5),
    max_leaves=8)
_msgs = st.fixed_dictionaries(
    {"type": st.sampled_from(["hello", "start", "tokens", "end", "cancel", "x"])},
    optional={"stream_id": st.one_of(st.text(max_size=70), _json),
              "model": st.one_of(st.text(max_size=5), _json),
              "layout": st.sampled_from(P.LAYOUTS + ("bad",)), "format": _json,
              "sample_rate": st.integers(), "tokens": st.lists(st.integers()) | _json,
              "levels": st.lists(st.lists(st.integers(), max_size=5), max_size=4) | _json,
              "version": _json, "seed": _json, "noise": _json, "voice": _json})


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_parse_text_str(data):
    """Arbitrary strings raise nothing but ProtocolError."""
    try:
        P.parse_text(data)
    except ProtocolError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.one_of(_msgs, _json))
def test_fuzz_parse_text_json(value):
    """Arbitrary JSON values and message-like objects raise nothing but ProtocolError."""
    try:
        P.parse_text(json.dumps(value))
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80) | st.builds(lambda b: b"\x01" + b, st.binary(max_size=80)))
def test_fuzz_parse_binary(data):
    """Arbitrary bytes raise nothing but ProtocolError."""
    try:
        P.parse_binary(data)
    except ProtocolError:
        pass


def test_start_window_shapes():
    """start.window: a preset name or an object of preset and frames, kept as sent (its values'
    bounds are the family's); any other shape, an unknown field or a value that is not a count
    of frames is bad_window for that stream, never for the connection."""
    def start(window):
        return json.dumps({"type": "start", "stream_id": "s", "model": "m", "layout": "levels",
                           "window": window})

    assert P.parse_text(start("low")).window == {"preset": "low"}
    w = {"preset": "low", "chunk": 6, "lookback": 0, "lookahead": 2, "overlap": 1}
    assert P.parse_text(start(w)).window == w
    assert P.parse_text(json.dumps({"type": "start", "stream_id": "s", "model": "m",
                                    "layout": "levels"})).window is None
    msg = P.parse_text(start({"chunk": 7}))
    assert P.parse_text(P.encode_client(msg)) == msg
    for bad in ({}, [], 3, True, {"size": 1}, {"chunk": "7"}, {"chunk": -1}, {"chunk": 1.5},
                {"chunk": 1 << 17}, {"preset": 3}, {"preset": ""}, {"chunk": True}):
        e = perr(P.parse_text, start(bad))
        assert e.code == ErrorCode.BAD_WINDOW and e.stream_id == "s" and not e.fatal, bad
