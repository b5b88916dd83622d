"""The websocket ``opus`` format (issue 22, docs/protocol.md): raw Opus packets of 20 ms at
48 kHz, one per binary audio message, the decoder's parameters in ``started.codec``.

A real server on 127.0.0.1 with the small random SNAC model (tests/smallmodel.py); the
packets are decoded with PyAV's libopus decoder.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip, load_layouts
from smallmodel import small_codes, write_small_snac

pytest.importorskip("gguf")
pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")
av = pytest.importorskip("av")


from codecd import session as session_mod  # noqa: E402
from codecd.client import Client as CodecdClient  # noqa: E402
from codecd.protocol import OPUS_BITRATE_RANGE, encode_token_frame  # noqa: E402
from codecd.speech.encode import OpusPackets  # noqa: E402
from serverkit import Client, running, start_msg  # noqa: E402

L = load_layouts()
FRAME = 960  # 20 ms at 48 kHz


@pytest.fixture(scope="module")
def codecrt() -> Any:
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, codecrt: Any) -> Path:
    return write_small_snac(tmp_path_factory.mktemp("opus") / "small.gguf", seed=5)


class PacketClient(Client):
    """test_server's client, keeping each binary frame's payload apart (one Opus packet)."""

    def on_audio(self, r: dict[str, Any], f: Any) -> None:
        super().on_audio(r, f)
        r.setdefault("packets", []).append(f.data)

def decode_opus(packets: list[bytes]) -> tuple[np.ndarray, list[int]]:
    """The packets through PyAV's libopus decoder at 48 kHz mono: float32 audio (pre-skip
    not removed) and the sample count of each decoded frame."""
    dec: Any = av.CodecContext.create("libopus", "r")
    dec.sample_rate = 48000
    dec.layout = "mono"
    parts: list[np.ndarray] = []
    sizes: list[int] = []
    for p in packets:
        frames = dec.decode(av.Packet(p))
        assert len(frames) == 1, "one packet decodes to one frame"
        for fr in frames:
            a = fr.to_ndarray().reshape(-1)
            if a.dtype == np.int16:
                a = a.astype(np.float32) / 32768.0
            parts.append(a.astype(np.float32))
            sizes.append(fr.samples)
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), sizes


async def send_with_mark(c: Client, sid: str, ids: np.ndarray, cut: int,
                         piece: int = 7 * 200) -> None:
    """Tokens ``[:cut]``, a mark, tokens ``[cut:]``, end; pieces of at most ``piece`` tokens,
    JSON and binary frames in turn."""
    async def send(toks: np.ndarray) -> None:
        for k, i in enumerate(range(0, toks.size, piece)):
            part = toks[i:i + piece]
            if k % 2:
                await c.send(encode_token_frame(sid, part))
            else:
                await c.send({"type": "tokens", "stream_id": sid, "tokens": part.tolist()})
            await asyncio.sleep(0)

    await send(ids[:cut])
    await c.send({"type": "mark", "stream_id": sid, "id": "half"})
    await send(ids[cut:])
    await c.send({"type": "end", "stream_id": sid})


def test_opus_stream_decodes_to_the_pcm_stream(small: Path) -> None:
    """Three streams of the same tokens on one connection at once: ``opus``, ``pcm_f32le`` at
    48 kHz and ``pcm_s16le`` at the model's rate, all done. The opus packets each decode (PyAV's
    libopus) to one 20 ms frame; the headers' sample_offset is 960 * seq; ``done.samples`` is
    the packets' total, ``ceil((n + pre_skip) / 960)`` packets for the n samples of the
    48 kHz PCM stream; the mark's offset is the PCM stream's plus pre_skip; ``started.codec``
    has the decoder parameters.

    The decoded audio from pre_skip on against the pcm_f32le stream (clipped to [-1, 1], as
    the opus encoder's input is): normalized correlation 0.952 measured at the default 64 kb/s
    (asserted >= 0.93), 0.984 at ``bitrate`` 128 kb/s (asserted >= 0.97). The small random
    model's audio is loud broadband noise (37 % of its samples beyond +-1), the worst case
    for a perceptual codec, which keeps band energies rather than the waveform of noise; a
    sine through the same encoder correlates at 0.9996."""
    async def main() -> None:
        rng = np.random.default_rng(22)
        # the small model's hop is 4: 16,000 samples, 0.67 s at 24 kHz, all sent at once
        # (under the backlog limits: 7,000 tokens, 4,000 frames)
        frames = 4 * 1000
        levels = small_codes(frames, rng)
        ids = L.codes_to_orpheus_ids(L.levels_to_orpheus(levels))
        cut = 7 * 500  # the mark after 500 groups (2,000 frames)
        async with running(small) as srv:
            c = await PacketClient.open(srv.port)
            assert "opus" in c.hello["formats"]
            await c.send(start_msg("op", format="opus"))
            await c.send(start_msg("hi", format="opus", bitrate=128000, sample_rate=48000))
            await c.send(start_msg("f32", format="pcm_f32le", sample_rate=48000))
            await c.send(start_msg("s16"))
            await asyncio.gather(*(send_with_mark(c, sid, ids, cut)
                                   for sid in ("op", "hi", "f32", "s16")))
            ts = {sid: await c.terminal(sid, timeout=20) for sid in ("op", "hi", "f32", "s16")}
            assert all(t["type"] == "done" for t in ts.values()), ts
            assert not c.conn_errors
            await c.close()

        raw = np.frombuffer(bytes(c.rec("f32")["audio"]), "<f4")
        n = raw.size
        ref = np.clip(raw, -1.0, 1.0)  # opus carries the audio clipped, as 16-bit PCM does
        assert ts["f32"]["samples"] == n == frames * 4 * 2
        assert ts["s16"]["samples"] == frames * 4

        corr = {}
        for sid, bitrate in (("op", 64000), ("hi", 128000)):
            r = c.rec(sid)
            started = r["msgs"][0]
            assert started["type"] == "started" and started["format"] == "opus"
            assert started["sample_rate"] == 48000 and started["channels"] == 1
            codec = started["codec"]
            pre = codec["pre_skip"]
            assert codec == {"name": "opus", "sample_rate": 48000, "channels": 1,
                             "frame_ms": 20, "frame_samples": FRAME, "pre_skip": pre,
                             "bitrate": bitrate, "application": "audio"}
            assert 0 < pre < FRAME  # libopus: 312 (6.5 ms)
            packets = r["packets"]
            assert len(packets) == -(-(n + pre) // FRAME)
            assert r["frames"] == [(i, i * FRAME) for i in range(len(packets))]
            assert ts[sid]["samples"] == len(packets) * FRAME
            assert ts[sid]["duration_s"] == pytest.approx(len(packets) * 0.02)
            assert max(map(len, packets)) < 2 * bitrate // 8 * 20 // 1000 + 100
            marks = [m for m in r["msgs"] if m["type"] == "mark"]
            pcm_mark = [m for m in c.rec("f32")["msgs"] if m["type"] == "mark"][0]
            assert [m["sample_offset"] for m in marks] == [pcm_mark["sample_offset"] + pre]
            assert pcm_mark["sample_offset"] == 2000 * 4 * 2

            y, sizes = decode_opus(packets)
            assert sizes == [FRAME] * len(packets)  # every packet is 20 ms
            assert y.size == ts[sid]["samples"]
            z = y[pre:pre + n]
            tail = y[pre + n:]  # the padding: silence, plus the codec's noise (~ -17 dB)
            assert 0 < tail.size < FRAME
            assert np.sqrt(np.mean(tail**2)) < 0.25 * np.sqrt(np.mean(ref**2))
            corr[sid] = float(np.dot(z, ref) / (np.linalg.norm(z) * np.linalg.norm(ref)))
        print(f"opus correlation: {corr}")
        assert corr["op"] >= 0.93, corr
        assert corr["hi"] >= 0.97 and corr["hi"] > corr["op"], corr
    asyncio.run(main())


def test_opus_refusals(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bad_format`` for opus at another sample_rate, a bitrate outside libopus' range, a
    bitrate on a PCM stream, and for any opus start on a server without PyAV/libopus (whose
    hello leaves opus out of ``formats``); the connection stays open and a later stream is
    done."""
    async def main() -> None:
        rng = np.random.default_rng(3)
        async with running(small) as srv:
            c = await PacketClient.open(srv.port)
            for sid, kw in (("r24", {"format": "opus", "sample_rate": 24000}),
                            ("r16", {"format": "opus", "sample_rate": 16000}),
                            ("b1", {"format": "opus", "bitrate": 1000}),
                            ("bp", {"format": "pcm_s16le", "bitrate": 64000})):
                await c.send(start_msg(sid, **kw))
                t = await c.terminal(sid)
                assert t["type"] == "error" and t["code"] == "bad_format", t
            assert "48000" in c.rec("r24")["terminal"]["message"]

            monkeypatch.setattr(session_mod, "opus_available", lambda: False)
            c2 = await PacketClient.open(srv.port)
            assert "opus" not in c2.hello["formats"]
            assert "pcm_s16le" in c2.hello["formats"]
            await c2.send(start_msg("na", format="opus"))
            t = await c2.terminal("na")
            assert t["code"] == "bad_format" and "codecd[codecs]" in t["message"], t
            await c2.close()
            monkeypatch.undo()

            # cancel and a failed stream free their encoders at once
            sess = next(iter(srv._conns.values())).session
            ids = L.codes_to_orpheus_ids(L.levels_to_orpheus(small_codes(8, rng)))
            encoders = {}
            for sid in ("cx", "bad"):
                await c.send(start_msg(sid, format="opus"))
                await c.until(lambda s=sid: s in sess._streams)
                encoders[sid] = sess._streams[sid].converter
                assert isinstance(encoders[sid], OpusPackets) and not encoders[sid].closed
            await c.send({"type": "tokens", "stream_id": "cx", "tokens": ids.tolist()})
            await c.send({"type": "cancel", "stream_id": "cx"})
            await c.send({"type": "tokens", "stream_id": "bad", "tokens": [5]})
            assert (await c.terminal("cx"))["type"] == "cancelled"
            assert (await c.terminal("bad"))["code"] == "token_range"
            assert encoders["cx"].closed and encoders["bad"].closed

            await c.send(start_msg("ok", format="opus"))
            await send_with_mark(c, "ok", ids, 7)
            t = await c.terminal("ok")
            assert t["type"] == "done" and not c.conn_errors, t
            assert c.ws.close_code is None
            await c.close()

            # codecd.client: one chunk per packet, len 960, started.codec
            async with CodecdClient(f"ws://127.0.0.1:{srv.port}/") as cc:
                s = await cc.start("small", "orpheus_ids", "opus", bitrate=48000)
                assert s.started is not None and s.started.codec is not None
                assert s.started.codec["bitrate"] == 48000
                await s.send_tokens(ids)
                await s.end()
                chunks = [ch async for ch in s]
                assert chunks and all(len(ch) == FRAME for ch in chunks)
                assert [ch.sample_offset for ch in chunks] == [i * FRAME
                                                               for i in range(len(chunks))]
                assert s.done_info is not None
                assert s.done_info["samples"] == s.samples_received == len(chunks) * FRAME
                assert decode_opus([ch.pcm.tobytes() for ch in chunks])[1] == [FRAME] * len(chunks)
            for _ in range(50):
                if srv.active_streams == 0:
                    break
                await asyncio.sleep(0.02)
            assert srv.active_streams == 0
    asyncio.run(main())


def test_opus_packets_bounded_and_counted() -> None:
    """OpusPackets alone: whatever the chunking, it holds less than one 20 ms frame, returns a
    packet as soon as a frame is whole, and a stream of n samples at 48 kHz gives
    ``ceil((n + pre_skip) / 960)`` packets (none for an empty one); a sine from 24 kHz comes
    back (from pre_skip on) at correlation >= 0.999; after flush or close it is closed."""
    rng = np.random.default_rng(7)
    t = np.arange(24000) / 24000
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    enc = OpusPackets(24000)
    pre = enc.pre_skip
    packets: list[bytes] = []
    i = 0
    while i < x.size:
        k = int(rng.integers(1, 2000))
        out = enc.feed(x[i:i + k])
        i += k
        packets += [p for p, n in out if n == FRAME]
        assert enc._buf.size < FRAME  # the only audio held, besides the resampler's
        assert enc.samples_out == len(packets) * FRAME
    packets += [p for p, _ in enc.flush()]
    assert enc.closed and enc.flush() == []
    assert len(packets) == -(-(48000 + pre) // FRAME)
    y, sizes = decode_opus(packets)
    assert sizes == [FRAME] * len(packets)
    ref = np.sin(2 * np.pi * 440 * np.arange(48000) / 48000) * 0.5
    z = y[pre:pre + 48000]
    assert float(np.dot(z, ref) / (np.linalg.norm(z) * np.linalg.norm(ref))) >= 0.999

    for n in (0, 1, FRAME - pre, FRAME - pre + 1, FRAME, 5000):
        e = OpusPackets(48000)
        got = e.feed(np.full(n, 0.1, np.float32)) + e.flush()
        assert len(got) == (-(-(n + e.pre_skip) // FRAME) if n else 0), n
    e = OpusPackets(16000, 24000)
    assert e.codec_info()["bitrate"] == 24000
    e.feed(np.zeros(100, np.float32))
    e.close()
    assert e.closed
    with pytest.raises(RuntimeError):
        e.feed(np.zeros(10, np.float32))
    with pytest.raises(ValueError):
        OpusPackets(24000, 1000)
    # the ends of the range the protocol admits both open an encoder
    for bitrate in OPUS_BITRATE_RANGE:
        e = OpusPackets(24000, bitrate)
        got = e.feed(np.full(2400, 0.1, np.float32)) + e.flush()
        assert len(got) == -(-(4800 + e.pre_skip) // FRAME), bitrate


def test_opus_wire_fields() -> None:
    """The parser's side: opus takes sample_rate 48000 (or none) and a bitrate in libopus'
    range, PCM formats no bitrate (all bad_format, scoped to the stream); ``encode_client``
    and ``parse_server_text`` carry ``bitrate`` and ``started.codec``."""
    from codecd import protocol as P

    def start(**kw: Any) -> str:
        return json.dumps({"type": "start", "stream_id": "s", "model": "m",
                           "layout": "orpheus", **kw})

    m = P.parse_text(start(format="opus", bitrate=32000))
    assert isinstance(m, P.Start) and m.format == "opus" and m.bitrate == 32000
    assert P.parse_text(P.encode_client(m)) == m
    assert P.parse_text(start(format="opus", sample_rate=48000)).sample_rate == 48000
    for kw in ({"format": "opus", "sample_rate": 24000}, {"format": "opus", "bitrate": 5999},
               {"format": "opus", "bitrate": 256001}, {"bitrate": 64000},
               {"format": "mulaw", "bitrate": 64000}):
        with pytest.raises(P.ProtocolError) as ei:
            P.parse_text(start(**kw))
        assert ei.value.code == P.ErrorCode.BAD_FORMAT and ei.value.stream_id == "s", kw
    codec = {"name": "opus", "sample_rate": 48000, "channels": 1, "frame_ms": 20,
             "frame_samples": 960, "pre_skip": 312, "bitrate": 64000, "application": "audio"}
    st = P.parse_server_text(P.encode_started("s", 48000, "opus", 10, "exact", codec))
    assert isinstance(st, P.Started) and st.codec == codec
    plain = P.parse_server_text(P.encode_started("s", 24000, "pcm_s16le", 10))
    assert isinstance(plain, P.Started) and plain.codec is None
    assert "codec" not in json.loads(P.encode_started("s", 24000, "pcm_s16le", 10))
