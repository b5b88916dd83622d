"""Per-connection state machine (codecd.session): streams, token assembly, errors, limits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codecd import protocol as P
from codecd.actions import (
    Close,
    EngineCancel,
    EngineFinish,
    EngineOpen,
    EnginePush,
    SendBinary,
    SendText,
)
from codecd.families import ModelSpec
from codecd.session import Session, SessionLimits, SessionMetrics

SNAC = ModelSpec("snac_24khz", "snac", 24000, 512, 3, (4096, 4096, 4096), (4, 2, 1),
                 layouts=("orpheus_ids", "orpheus", "levels"), latency_samples=1536)
TOY = ModelSpec("toy", "dac", 16000, 320, 2, (1024, 1024), (1, 1), layouts=("levels",),
                voices=("tara",))
MODELS = {m.name: m for m in (SNAC, TOY)}
BASE, CB = 128266, 4096


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Harness:
    """A session plus helpers to drive it and read its actions."""

    def __init__(self, limits: SessionLimits | None = None, admit=lambda: True,
                 models: dict[str, ModelSpec] | None = None) -> None:
        limits = limits or SessionLimits()
        self.clock = Clock()
        self.released = 0
        self.metrics = SessionMetrics()

        def release() -> None:
            self.released += 1

        self.s = Session(models or MODELS, limits, self.clock, admit=admit, release=release,
                         metrics=self.metrics)

    def text(self, **kw) -> list:
        return self.s.receive_text(json.dumps(kw))

    def start(self, sid: str = "a", model: str = "snac_24khz", layout: str = "orpheus_ids",
              **kw) -> list:
        """A start, answered by an engine that opens the stream at once."""
        acts = self.text(type="start", stream_id=sid, model=model, layout=layout, **kw)
        for a in list(acts):
            if isinstance(a, EngineOpen):
                acts += self.s.on_opened(a.key)
        return acts

    def tokens(self, sid: str, toks) -> list:
        return self.text(type="tokens", stream_id=sid, tokens=[int(t) for t in toks])

    def key(self, sid: str):
        k = self.s.stream_key(sid)
        assert k is not None
        return k


def msgs(actions) -> list[dict]:
    return [json.loads(a.data) for a in actions if isinstance(a, SendText)]


def errors(actions) -> list[dict]:
    return [m for m in msgs(actions) if m["type"] == "error"]


def only_error(actions) -> dict:
    errs = errors(actions)
    assert len(errs) == 1, actions
    return errs[0]


def pushed(actions, key=None) -> list[np.ndarray]:
    """Concatenated EnginePush codes per level (of one key, if given)."""
    ps = [a for a in actions if isinstance(a, EnginePush) and (key is None or a.key == key)]
    if not ps:
        return []
    n = len(ps[0].levels)
    return [np.concatenate([p.levels[l] for p in ps]) for l in range(n)]


def orpheus_ids(n_groups: int, seed: int = 0) -> np.ndarray:
    codes = np.random.default_rng(seed).integers(0, CB, size=n_groups * 7)
    return codes + BASE + (np.arange(codes.size) % 7) * CB


def has_close(actions):
    cs = [a for a in actions if isinstance(a, Close)]
    return cs[0] if cs else None


# ------------------------------------------------------------------------- start


def test_connect_sends_hello():
    """connect() sends the server hello listing models, formats, layouts and limits."""
    (hello,) = msgs(Harness().s.connect())
    assert hello["type"] == "hello" and hello["version"] == 1
    assert hello["server"].startswith("codecd/")
    assert [m["name"] for m in hello["models"]] == ["snac_24khz", "toy"]
    assert hello["formats"] == list(P.FORMATS) and "max_streams" in hello["limits"]


def test_start_opens_engine_and_reports_started():
    """start -> EngineOpen(key, model, noise, seed) and a started message."""
    h = Harness()
    acts = h.start("a", noise=True, seed=7)
    assert isinstance(acts[0], EngineOpen)
    assert (acts[0].model, acts[0].noise, acts[0].seed) == ("snac_24khz", True, 7)
    assert msgs(acts) == [{"type": "started", "stream_id": "a", "sample_rate": 24000,
                           "format": "pcm_s16le", "channels": 1, "latency_samples": 1536,
                           "latency": "exact"}]
    assert h.metrics.streams_started == 1


def test_start_mulaw_defaults_to_8k():
    """mulaw streams default to 8 kHz output; latency_samples is in output samples."""
    (m,) = msgs(Harness().start("a", format="mulaw"))
    assert (m["sample_rate"], m["format"], m["latency_samples"]) == (8000, "mulaw", 512)


def test_low_latency_falls_back_to_exact():
    """latency=low on a model without a low mode is granted as exact."""
    acts = Harness().start("a", latency="low")
    assert acts[0].latency == "exact" and msgs(acts)[0]["latency"] == "exact"


@pytest.mark.parametrize("kw,code", [
    ({"model": "nope"}, "unknown_model"),
    ({"model": "toy", "layout": "orpheus"}, "bad_layout"),
    ({"layout": "dac"}, "bad_layout"),
    ({"format": "wav"}, "bad_format"),
    ({"sample_rate": 1000}, "bad_format"),
    ({"model": "toy", "layout": "levels", "voice": "leo"}, "unknown_voice"),
    ({"seed": "x"}, "bad_message"),
])
def test_start_refused(kw, code):
    """Invalid starts are refused with a stream-scoped error; nothing is opened or admitted."""
    h = Harness()
    acts = h.start("a", **kw)
    e = only_error(acts)
    assert (e["code"], e["stream_id"]) == (code, "a")
    assert not any(isinstance(a, (EngineOpen, Close)) for a in acts)
    assert h.s.open_streams == [] and h.metrics.streams_refused == 1
    assert h.metrics.errors[code] == 1


def test_voice_passed_to_engine():
    """A voice the model offers is passed in EngineOpen."""
    acts = Harness().start("a", model="toy", layout="levels", voice="tara")
    assert acts[0].voice == "tara"


def test_duplicate_stream_fails_both():
    """start for an open id -> duplicate_stream; the open stream is cancelled (no mixing)."""
    h = Harness()
    h.start("a")
    k = h.key("a")
    acts = h.start("a")
    assert only_error(acts)["code"] == "duplicate_stream"
    assert EngineCancel(k) in acts and h.s.open_streams == [] and h.released == 1
    # its in-flight tokens are dropped silently, and the id can be reused afterwards
    assert h.tokens("a", orpheus_ids(1)) == []
    assert isinstance(h.start("a")[0], EngineOpen) and h.key("a") != k


def test_too_many_streams():
    """Opening more than max_streams per connection is refused with too_many_streams."""
    h = Harness(SessionLimits(max_streams=2))
    h.start("a")
    h.start("b")
    e = only_error(h.start("c"))
    assert (e["code"], e["stream_id"]) == ("too_many_streams", "c")
    assert h.s.open_streams == ["a", "b"]


def test_busy_when_not_admitted():
    """admit() False -> busy (explicit refusal, no queueing) and no release."""
    h = Harness(admit=lambda: False)
    acts = h.start("a")
    assert only_error(acts)["code"] == "busy" and len(acts) == 1
    assert h.released == 0 and h.s.open_streams == []


# ------------------------------------------------------------------------ tokens


def test_orpheus_ids_to_levels_matches_layouts(layouts):
    """Complete groups become per-level codes exactly as codecd.families.orpheus computes them."""
    h = Harness()
    h.start("a")
    ids = orpheus_ids(5)
    acts = h.tokens("a", ids)
    ref = layouts.orpheus_to_levels(layouts.orpheus_ids_to_codes(ids))
    got = pushed(acts)
    assert all(g.dtype == np.int32 for g in got)
    assert [g.tolist() for g in got] == [r.tolist() for r in ref]


def test_one_token_at_a_time_equals_all_at_once():
    """Tokens sent one by one (or in odd splits) give the same EnginePush concatenation."""
    ids = orpheus_ids(6, seed=3)
    h1 = Harness()
    h1.start("a")
    whole = pushed(h1.tokens("a", ids))
    h2 = Harness()
    h2.start("a")
    acts: list = []
    for t in ids:
        acts += h2.tokens("a", [t])
    one = pushed(acts)
    assert sum(isinstance(a, EnginePush) for a in acts) == 6  # one push per completed group
    h3 = Harness()
    h3.start("a")
    acts = []
    for lo, hi in [(0, 3), (3, 4), (4, 15), (15, 15), (15, 42)]:
        acts += h3.tokens("a", ids[lo:hi])
    split = pushed(acts)
    for a, b, c in zip(whole, one, split):
        assert a.tolist() == b.tolist() == c.tolist()


def test_orpheus_codes_layout():
    """The orpheus layout takes codes 0..4095 in group order."""
    h = Harness()
    h.start("a", layout="orpheus")
    got = pushed(h.tokens("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]))
    assert [g.tolist() for g in got] == [[1, 8], [2, 5, 9, 12], [3, 4, 6, 7, 10, 11, 13, 14]]


def test_binary_and_bare_tokens():
    """Binary frames (level 0xFF) and bare arrays feed the same token sequence."""
    h = Harness()
    h.start("a")
    ids = orpheus_ids(2)
    acts = h.s.receive_binary(P.encode_token_frame("a", ids[:5]))
    acts += h.s.receive_text(json.dumps([int(t) for t in ids[5:9]]))
    acts += h.tokens("a", ids[9:])
    ref = Harness()
    ref.start("a")
    assert [g.tolist() for g in pushed(acts)] == [g.tolist() for g in
                                                  pushed(ref.tokens("a", ids))]


@pytest.mark.parametrize("layout,bad_at,value", [
    ("orpheus_ids", 9, BASE + 2 * CB + 5),  # position 2's id at position 2: valid
    ("orpheus_ids", 8, BASE + 5),  # a position-0 id at position 1
    ("orpheus_ids", 3, -1),
    ("orpheus_ids", 0, BASE - 1),
    ("orpheus_ids", 6, BASE + 7 * CB),
    ("orpheus", 4, 4096),
    ("orpheus", 10, -3),
])
def test_token_range(layout, bad_at, value):
    """An out-of-range token fails its stream with token_range naming its stream index."""
    h = Harness()
    h.start("a", layout=layout)
    h.start("b")
    toks = orpheus_ids(2) if layout == "orpheus_ids" else np.arange(14) % 4096
    toks = toks.copy()
    toks[bad_at] = value
    acts = h.tokens("a", toks[:7]) + h.tokens("a", toks[7:])
    pos = bad_at % 7
    lo = BASE + pos * CB if layout == "orpheus_ids" else 0
    if lo <= value < lo + CB:  # the first case is a valid token: no error
        assert errors(acts) == []
        return
    e = only_error(acts)
    assert (e["code"], e["stream_id"], e["index"], e["value"]) == ("token_range", "a", bad_at,
                                                                   value)
    assert EngineCancel(h.key("b")) not in acts and h.s.open_streams == ["b"]
    assert h.metrics.streams_failed == 1 and h.released == 1


def test_levels_layout_any_lengths():
    """levels streams pass per-level codes of any lengths on; end checks frame coverage."""
    h = Harness()
    h.start("a", layout="levels")
    k = h.key("a")
    acts = h.text(type="tokens", stream_id="a", levels=[[1], [2, 3, 4], [5]])
    acts += h.s.receive_binary(P.encode_token_frame("a", [6], level=1))
    acts += h.s.receive_binary(P.encode_token_frame("a", [7, 8, 9, 10, 11, 12, 13], level=2))
    acts += h.text(type="tokens", stream_id="a", levels=[[], [], []])
    acts += h.s.receive_binary(P.encode_token_frame("a", [14], level=0))
    assert [g.tolist() for g in pushed(acts, k)] == [[1, 14], [2, 3, 4, 6],
                                                     [5, 7, 8, 9, 10, 11, 12, 13]]
    assert h.text(type="end", stream_id="a") == [EngineFinish(k)]


def test_levels_token_range():
    """A levels code outside its codebook fails the stream with its level and index."""
    h = Harness()
    h.start("a", model="toy", layout="levels")
    h.text(type="tokens", stream_id="a", levels=[[1, 2], [3]])
    e = only_error(h.text(type="tokens", stream_id="a", levels=[[1], [5, 1024]]))
    assert (e["code"], e["level"], e["index"], e["value"]) == ("token_range", 1, 2, 1024)


def test_levels_wrong_level_count():
    """A levels message with more levels than the model has is bad_message."""
    h = Harness()
    h.start("a", model="toy", layout="levels")
    assert only_error(h.text(type="tokens", stream_id="a", levels=[[1], [1], [1]]))["code"] == \
        "bad_message"


def test_wrong_token_form_for_layout():
    """levels for an orpheus stream (and tokens for a levels stream) are bad_message."""
    h = Harness()
    h.start("a")
    h.start("b", layout="levels")
    assert only_error(h.text(type="tokens", stream_id="a", levels=[[1]]))["code"] == \
        "bad_message"
    assert only_error(h.tokens("b", [1]))["code"] == "bad_message"


def test_tokens_before_start():
    """Tokens for an id never started -> unknown_stream once; the rest is dropped."""
    h = Harness()
    e = only_error(h.tokens("x", [BASE]))
    assert (e["code"], e["stream_id"]) == ("unknown_stream", "x")
    assert h.tokens("x", [BASE]) == [] and h.text(type="end", stream_id="x") == []
    assert h.metrics.messages_dropped == 2 and has_close([]) is None


def test_end_before_start_and_cancel_unknown():
    """end or cancel for an unknown id -> unknown_stream, connection stays open."""
    h = Harness()
    acts = h.text(type="end", stream_id="x") + h.text(type="cancel", stream_id="y")
    assert [e["code"] for e in errors(acts)] == ["unknown_stream", "unknown_stream"]
    assert not h.s.closed


# ----------------------------------------------------------------------- end/done


def test_broken_group_at_end():
    """end with a partial 7-group -> broken_group for that stream only."""
    h = Harness()
    h.start("a")
    h.start("b")
    h.tokens("a", orpheus_ids(2)[:10])
    acts = h.text(type="end", stream_id="a")
    e = only_error(acts)
    assert (e["code"], e["stream_id"], e["index"]) == ("broken_group", "a", 7)
    assert h.s.open_streams == ["b"]


def test_levels_broken_at_end():
    """end of a levels stream whose levels cover different frame counts -> broken_group."""
    h = Harness()
    h.start("a", layout="levels")
    h.text(type="tokens", stream_id="a", levels=[[1], [1, 2], [1, 2, 3]])
    assert only_error(h.text(type="end", stream_id="a"))["code"] == "broken_group"


def test_full_stream_audio_and_done():
    """Audio frames carry seq and output-sample offsets; done reports output samples."""
    h = Harness()
    h.start("a")
    k = h.key("a")
    h.tokens("a", orpheus_ids(2))
    assert h.text(type="end", stream_id="a") == [EngineFinish(k)]
    a1 = h.s.on_audio(k, np.full(3000, 0.5, np.float32))
    a2 = h.s.on_audio(k, np.zeros(1096, np.float32))
    f1 = P.parse_audio(a1[0].data)
    f2 = P.parse_audio(a2[0].data)
    assert (f1.stream_id, f1.seq, f1.sample_offset, len(f1.data)) == ("a", 0, 0, 6000)
    assert (f2.seq, f2.sample_offset, len(f2.data)) == (1, 3000, 2192)
    assert np.frombuffer(f1.data, "<i2")[0] == 16384
    done = h.s.on_done(k, 4096)
    assert msgs(done) == [{"type": "done", "stream_id": "a", "samples": 4096,
                           "duration_s": round(4096 / 24000, 6)}]
    assert h.s.open_streams == [] and h.released == 1 and h.metrics.streams_done == 1
    assert h.metrics.samples_sent == 4096


def test_resampled_stream_conserves_length():
    """A mulaw 8 kHz stream gets n/3 output samples in total, the tail flushed at done."""
    h = Harness()
    h.start("a", format="mulaw")
    k = h.key("a")
    h.tokens("a", orpheus_ids(3))
    h.text(type="end", stream_id="a")
    acts: list = []
    for _ in range(3):
        acts += h.s.on_audio(k, np.sin(np.arange(2048) / 7).astype(np.float32))
    acts += h.s.on_done(k, 3 * 2048)
    frames = [P.parse_audio(a.data) for a in acts if isinstance(a, SendBinary)]
    assert [f.seq for f in frames] == list(range(len(frames)))
    offs = np.cumsum([0] + [len(f.data) for f in frames])
    assert [f.sample_offset for f in frames] == offs[:-1].tolist()
    assert offs[-1] == 2048 == msgs(acts)[-1]["samples"]


def test_tokens_after_end():
    """Tokens after end fail the stream with bad_message."""
    h = Harness()
    h.start("a")
    h.text(type="end", stream_id="a")
    e = only_error(h.tokens("a", orpheus_ids(1)))
    assert (e["code"], e["stream_id"]) == ("bad_message", "a")


# ------------------------------------------------------------- cancel, reuse, engine


def test_cancel_and_reuse_id_never_mixes():
    """cancel -> EngineCancel + cancelled; a reused id gets a new key; old audio is dropped."""
    h = Harness()
    h.start("a")
    old = h.key("a")
    acts = h.text(type="cancel", stream_id="a")
    assert acts[0] == EngineCancel(old) and msgs(acts) == [{"type": "cancelled",
                                                            "stream_id": "a"}]
    assert h.text(type="cancel", stream_id="a") == []  # already closed: dropped
    h.start("a")
    new = h.key("a")
    assert new != old
    assert h.s.on_audio(old, np.ones(512, np.float32)) == [] and h.s.on_done(old, 512) == []
    frame = P.parse_audio(h.s.on_audio(new, np.ones(512, np.float32))[0].data)
    assert (frame.seq, frame.sample_offset) == (0, 0)
    assert h.metrics.streams_cancelled == 1 and h.released == 1


def test_interleaved_streams_stay_independent():
    """Interleaved streams on one session get their own pushes; a failure of one spares the
    other and its accepted audio."""
    h = Harness()
    h.start("a")
    h.start("b", layout="orpheus")
    ka, kb = h.key("a"), h.key("b")
    ids = orpheus_ids(4, seed=1)
    codes = np.random.default_rng(2).integers(0, CB, size=28)
    acts: list = []
    for i in range(0, 28, 3):
        acts += h.tokens("a", ids[i:i + 3])
        acts += h.tokens("b", codes[i:i + 3])
    acts += h.s.on_audio(kb, np.zeros(100, np.float32))
    ra, rb = Harness(), Harness()
    ra.start("a")
    rb.start("b", layout="orpheus")
    for got, ref in [(pushed(acts, ka), pushed(ra.tokens("a", ids))),
                     (pushed(acts, kb), pushed(rb.tokens("b", codes)))]:
        assert [g.tolist() for g in got] == [r.tolist() for r in ref]
    # a fails; b continues, its audio keeps flowing
    assert only_error(h.tokens("a", [0]))["code"] == "token_range"
    frame = P.parse_audio(h.s.on_audio(kb, np.zeros(50, np.float32))[0].data)
    assert (frame.stream_id, frame.seq, frame.sample_offset) == ("b", 1, 100)
    assert pushed(h.tokens("b", codes[:7]), kb)


def test_engine_error_fails_one_stream():
    """on_engine_error -> error for that stream (engine_error), EngineCancel; others go on."""
    h = Harness()
    h.start("a")
    h.start("b")
    ka = h.key("a")
    acts = h.s.on_engine_error(ka, "ComputeError", "graph failed")
    e = only_error(acts)
    assert (e["code"], e["stream_id"]) == ("engine_error", "a") and "graph failed" in e["message"]
    assert EngineCancel(ka) in acts and h.s.open_streams == ["b"]


def test_busy_after_started_is_engine_error():
    """busy refuses a start; once started was sent, a busy from the engine (its worker died
    and is restarting) fails the stream with engine_error: never started then busy."""
    h = Harness()
    h.start("a")  # opened at once: started sent
    h.text(type="start", stream_id="b", model="snac_24khz", layout="orpheus_ids")  # not yet
    ka, kb = h.key("a"), h.key("b")
    e = only_error(h.s.on_engine_error(ka, "busy", "engine 0 is restarting"))
    assert e["code"] == "engine_error" and "restarting" in e["message"]
    assert only_error(h.s.on_engine_error(kb, "busy", "engine 0 is restarting"))["code"] == "busy"


# ------------------------------------------------------------------- bare arrays


def test_bare_array_needs_exactly_one_stream():
    """A bare array with no open stream, or several, closes the connection."""
    h = Harness()
    acts = h.s.receive_text("[1, 2]")
    assert only_error(acts)["code"] == "unknown_stream" and has_close(acts).code == 1008
    h = Harness()
    h.start("a")
    h.start("b")
    acts = h.s.receive_text("[1, 2]")
    assert only_error(acts)["code"] == "bad_message" and has_close(acts).code == 1008
    assert {a.key.stream_id for a in acts if isinstance(a, EngineCancel)} == {"a", "b"}


def test_bare_array_after_cancel_is_dropped():
    """After barge-in cancel, the LM's in-flight bare arrays are dropped silently."""
    h = Harness()
    h.start("a")
    h.text(type="cancel", stream_id="a")
    assert h.s.receive_text("[128266]") == [] and not h.s.closed


def test_bare_array_after_end_or_done():
    """A bare array after the only stream's end is that stream's bad_message (tokens after
    end), not the connection's; one after its done is dropped, as after cancel."""
    h = Harness()
    h.start("a")
    h.text(type="end", stream_id="a")
    acts = h.s.receive_text("[128266]")
    e = only_error(acts)
    assert (e["code"], e["stream_id"]) == ("bad_message", "a") and not h.s.closed
    assert any(isinstance(x, EngineCancel) for x in acts)
    h = Harness()
    h.start("a")
    h.text(type="end", stream_id="a")
    h.s.on_done(h.key("a"), 0)
    assert h.s.receive_text("[128266]") == [] and not h.s.closed
    assert h.s.receive_text('[1, "x"]') == [] and not h.s.closed
    h.start("b")  # a new stream takes bare arrays again
    assert h.s.receive_text("[]") == [] and not h.s.closed


def test_bare_array_bad_token_fails_its_stream():
    """A bad bare array (mistyped token) fails the only open stream, not the connection."""
    h = Harness()
    h.start("a")
    e = only_error(h.s.receive_text('[1, "x"]'))
    assert (e["code"], e["stream_id"]) == ("bad_message", "a") and not h.s.closed


# ------------------------------------------------------------ connection errors


def test_invalid_json_closes_connection():
    """Invalid JSON -> bad_json error, engine cancels, Close(1008); later input is ignored."""
    h = Harness()
    h.start("a")
    k = h.key("a")
    acts = h.s.receive_text("{nope")
    assert only_error(acts)["code"] == "bad_json" and "stream_id" not in only_error(acts)
    assert EngineCancel(k) in acts
    assert has_close(acts) == Close(1008, has_close(acts).reason)
    assert h.s.closed and h.released == 1
    assert h.s.receive_text(json.dumps({"type": "end", "stream_id": "a"})) == []


def test_unknown_type_without_stream_is_fatal():
    """An unknown message type with no stream id closes the connection with bad_message."""
    acts = Harness().text(type="pause")
    assert only_error(acts)["code"] == "bad_message" and has_close(acts).code == 1008


def test_unknown_type_with_stream_fails_that_stream():
    """An unknown message type naming an open stream fails only that stream."""
    h = Harness()
    h.start("a")
    acts = h.text(type="pause", stream_id="a")
    assert only_error(acts)["stream_id"] == "a" and not h.s.closed


def test_oversized_message_closes_1009():
    """A frame over max_message_bytes closes the connection with 1009."""
    h = Harness(SessionLimits(protocol=P.Limits(max_message_bytes=32)))
    acts = h.s.receive_text(json.dumps({"type": "start", "stream_id": "a" * 40}))
    assert only_error(acts)["code"] == "message_too_big" and has_close(acts).code == 1009


def test_truncated_binary_header_is_fatal():
    """A truncated binary header closes the connection with bad_binary."""
    acts = Harness().s.receive_binary(b"\x01\xff\x09abc")
    assert only_error(acts)["code"] == "bad_binary" and has_close(acts).code == 1008


def test_binary_payload_not_int32_fails_stream():
    """A binary payload that is not whole int32s fails only its stream."""
    h = Harness()
    h.start("a")
    acts = h.s.receive_binary(P.encode_token_frame("a", [BASE]) + b"\x00")
    e = only_error(acts)
    assert (e["code"], e["stream_id"]) == ("bad_binary", "a") and not h.s.closed


def test_hello_twice_is_fatal():
    """A client hello is accepted once; a second one closes the connection."""
    h = Harness()
    assert h.text(type="hello", version=1, client="t") == []
    assert has_close(h.text(type="hello")).code == 1008


def test_shutdown_and_connection_lost():
    """shutdown -> shutting_down for each open stream, then for the connection, and
    Close(1001); connection_lost cancels and releases all."""
    h = Harness()
    h.start("a")
    acts = h.s.shutdown()
    errs = errors(acts)
    assert [(e["code"], e.get("stream_id")) for e in errs] == [("shutting_down", "a"),
                                                               ("shutting_down", None)]
    assert has_close(acts).code == 1001 and h.released == 1
    h = Harness()
    h.start("a")
    h.start("b")
    acts = h.s.connection_lost()
    assert len([a for a in acts if isinstance(a, EngineCancel)]) == 2 and h.released == 2
    assert h.s.connection_lost() == []


def test_slow_reader_server_side():
    """fail_connection(slow_reader) sends the error and closes with 1008."""
    acts = Harness().s.fail_connection("slow_reader", "send buffer full")
    assert only_error(acts)["code"] == "slow_reader" and has_close(acts).code == 1008


# ------------------------------------------------------------------------ limits


def test_backlog_exceeded_and_drained():
    """Tokens waiting for the decoder are bounded: over max_pending_tokens -> backlog_exceeded;
    decoded audio frees room."""
    h = Harness(SessionLimits(max_pending_tokens=28))
    h.start("a")
    k = h.key("a")
    ids = orpheus_ids(8)
    assert errors(h.tokens("a", ids[:28])) == []
    h.s.on_audio(k, np.zeros(2 * 2048, np.float32))  # two groups decoded -> 14 tokens free
    assert errors(h.tokens("a", ids[28:42])) == []
    e = only_error(h.tokens("a", ids[42:43]))
    assert (e["code"], e["stream_id"]) == ("backlog_exceeded", "a")


def test_duration_exceeded():
    """Frames pushed beyond max_duration_s of audio fail the stream."""
    h = Harness(SessionLimits(max_duration_s=0.2))  # 2 groups = 4096 samples = 0.17 s
    h.start("a")
    ids = orpheus_ids(3)
    assert errors(h.tokens("a", ids[:14])) == []
    e = only_error(h.tokens("a", ids[14:]))
    assert (e["code"], e["stream_id"]) == ("duration_exceeded", "a")


def test_idle_timeout_via_tick():
    """tick() fails open streams without input for idle_timeout_s; active ones survive."""
    h = Harness(SessionLimits(idle_timeout_s=5.0, finish_timeout_s=50.0))
    h.start("a")
    h.start("b")
    h.clock.t += 4
    h.tokens("b", orpheus_ids(1)[:3])
    h.clock.t += 2
    acts = h.s.tick()
    e = only_error(acts)
    assert (e["code"], e["stream_id"]) == ("idle_timeout", "a")
    assert h.s.open_streams == ["b"]
    h.text(type="cancel", stream_id="b")
    h.start("c")
    h.text(type="end", stream_id="c")
    assert h.s.tick(h.clock.t + 10) == []  # ending streams are not idle
    assert only_error(h.s.tick(h.clock.t + 51))["code"] == "engine_error"


def test_metrics_counters():
    """Metrics count streams started/done/cancelled/failed, tokens, samples, errors by code."""
    h = Harness()
    for sid in "abc":
        h.start(sid)
    h.tokens("a", orpheus_ids(1))
    h.text(type="end", stream_id="a")
    ka = h.key("a")
    h.s.on_audio(ka, np.zeros(2048, np.float32))
    h.s.on_done(ka, 2048)
    h.text(type="cancel", stream_id="b")
    h.tokens("c", [5])
    m = h.metrics.as_dict()
    assert (m["streams_started"], m["streams_done"], m["streams_cancelled"],
            m["streams_failed"]) == (3, 1, 1, 1)
    assert m["tokens_received"] == 8 and m["samples_sent"] == 2048
    assert m["errors"] == {"token_range": 1}


def test_modelspec_validation():
    """ModelSpec rejects orpheus layouts on models that do not have the SNAC 24 kHz shape."""
    with pytest.raises(ValueError):
        ModelSpec("x", "dac", 16000, 320, 2, (1024, 1024), (1, 1), layouts=("orpheus",))
    with pytest.raises(ValueError):
        ModelSpec("x", "dac", 16000, 320, 2, (1024,), (1, 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=60), st.binary(max_size=60),
                          st.lists(st.integers(BASE - 2, BASE + 7 * CB + 2), max_size=12)),
                max_size=6))
def test_fuzz_session_never_raises(frames):
    """Arbitrary frames after a start never raise out of the session; streams stay consistent."""
    h = Harness()
    h.start("a")
    for f in frames:
        if isinstance(f, bytes):
            h.s.receive_binary(b"\x01\xff\x01a" + f)
            h.s.receive_binary(f)
        elif isinstance(f, list):
            h.s.receive_text(json.dumps(f))
        else:
            h.s.receive_text(f)
    h.s.receive_text(json.dumps({"type": "end", "stream_id": "a"}))
    h.s.tick(h.clock.t + 1e6)
    h.s.connection_lost()
    assert h.released == 1 and h.s.open_streams == []


# ------------------------------------------------------- S3Gen: voices, chatterbox_ids

S3 = ModelSpec("s3", "s3gen", 24000, 960, 1, (6561,), (1,), layouts=("levels", "chatterbox_ids"),
               latency_samples=16320, voices=("alice", "bob"), needs_voice=True)
SOS, EOS = 6561, 6562


def s3_harness() -> Harness:
    return Harness(models={"s3": S3, "snac_24khz": SNAC})


def s3_start(h: Harness, sid: str = "a", layout: str = "chatterbox_ids", **kw) -> list:
    return h.start(sid, model="s3", layout=layout, **{"voice": "alice", **kw})


@pytest.mark.parametrize("kw,code", [
    ({"voice": None}, "unknown_voice"),
    ({"voice": "carol"}, "unknown_voice"),
    ({"layout": "orpheus_ids"}, "bad_layout"),
    ({"layout": "orpheus"}, "bad_layout"),
])
def test_s3gen_start_refused(kw, code):
    """An S3Gen start without a voice, with an unknown one or an Orpheus layout is refused."""
    h = s3_harness()
    e = only_error(s3_start(h, **kw))
    assert (e["code"], e["stream_id"]) == (code, "a")
    if code == "unknown_voice":
        assert "alice, bob" in e["message"]
    assert h.s.open_streams == []


def test_chatterbox_ids_refused_for_snac():
    """chatterbox_ids is not a layout of SNAC models."""
    h = s3_harness()
    assert only_error(h.start("a", layout="chatterbox_ids"))["code"] == "bad_layout"


def test_modelspec_chatterbox_needs_one_6561_level():
    """ModelSpec rejects chatterbox_ids on models without one level of 6561 codes."""
    with pytest.raises(ValueError):
        ModelSpec("x", "dac", 16000, 320, 2, (1024, 1024), (1, 1), layouts=("chatterbox_ids",))


def test_s3gen_voice_passed_to_engine():
    """The named voice reaches EngineOpen; started reports the model's latency."""
    acts = s3_start(s3_harness(), voice="bob")
    assert acts[0].voice == "bob" and msgs(acts)[0]["latency_samples"] == 16320


def test_chatterbox_sos_dropped_eos_ends_stream():
    """A leading start-of-speech is dropped; stop-of-speech pushes the rest and finishes."""
    h = s3_harness()
    s3_start(h)
    k = h.key("a")
    a1 = h.tokens("a", [SOS, 5, 6])
    assert [x.tolist() for x in pushed(a1)] == [[5, 6]]
    a2 = h.tokens("a", [7, 6560, EOS])
    assert [x.tolist() for x in pushed(a2)] == [[7, 6560]] and a2[-1] == EngineFinish(k)
    assert h.text(type="end", stream_id="a") == []  # already ended by the stop-of-speech id
    assert h.s.open_streams == ["a"]  # open until the engine's done
    assert msgs(h.s.on_done(k, 4 * 960))[-1]["type"] == "done"


def test_chatterbox_eos_alone_in_a_message():
    """A stop-of-speech id in a message of its own ends the stream too."""
    h = s3_harness()
    s3_start(h)
    h.tokens("a", [1, 2])
    acts = h.tokens("a", [EOS])
    assert acts[-1] == EngineFinish(h.key("a")) and not errors(acts)


@pytest.mark.parametrize("toks,code,index", [
    ([1, 7000, 2], "token_range", 1),
    ([SOS, 1, SOS], "token_range", 2),  # start-of-speech only at the start
    ([1, -1], "token_range", 1),
    ([1, EOS, 2], "bad_message", None),  # ids after stop-of-speech
    ([SOS, EOS], "bad_message", None),  # no speech at all
])
def test_chatterbox_bad_ids(toks, code, index):
    """Ids outside 0..6560 other than the control ids, and ids after the stop, fail the stream."""
    h = s3_harness()
    s3_start(h)
    s3_start(h, "b")
    acts = h.tokens("a", toks)
    e = only_error(acts)
    assert (e["code"], e["stream_id"], e.get("index")) == (code, "a", index)
    assert not pushed(acts) and h.s.open_streams == ["b"]


def test_chatterbox_tokens_after_eos_message():
    """Tokens in a message after the stop-of-speech id fail the stream with bad_message."""
    h = s3_harness()
    s3_start(h)
    h.tokens("a", [1, EOS])
    e = only_error(h.tokens("a", [2]))
    assert (e["code"], e["stream_id"]) == ("bad_message", "a")


def test_s3gen_levels_layout():
    """An S3Gen levels stream pushes payload ids as one level and needs an end."""
    h = s3_harness()
    s3_start(h, layout="levels")
    acts = h.text(type="tokens", stream_id="a", levels=[[1, 6560]])
    assert [x.tolist() for x in pushed(acts)] == [[1, 6560]]
    assert only_error(h.text(type="tokens", stream_id="a", levels=[[6561]]))["code"] == "token_range"


def test_chatterbox_ids_binary_sequence_frames():
    """chatterbox_ids in binary frames (level 0xFF), stop-of-speech included, end the stream."""
    h = s3_harness()
    s3_start(h)
    acts = h.s.receive_binary(P.encode_token_frame("a", [SOS, 3, 4]))
    acts += h.s.receive_binary(P.encode_token_frame("a", [5, EOS]))
    assert [x.tolist() for x in pushed(acts)] == [[3, 4, 5]] and acts[-1] == EngineFinish(h.key("a"))
