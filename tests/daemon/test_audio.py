"""Output conversion (codecd.audio): PCM formats, mu-law, streaming resampling."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from codecd import audio as A

soxr = pytest.importorskip("soxr")


def test_s16le_scaling_rounding_clipping():
    """float32 -> s16le scales by 32767, rounds to nearest and clips out-of-range values."""
    x = np.array([0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 2.6 / 32767, np.nan], dtype=np.float32)
    y = np.frombuffer(A.f32_to_s16le(x), dtype="<i2")
    assert y.tolist() == [0, 32767, -32767, 16384, 32767, -32768, 3, 0]


def _s16_rule(x: np.ndarray) -> np.ndarray:
    """The documented rule, written out: non-finite cleaned (NaN 0, +-inf +-1), then
    clip(rint(float64(x) * 32767), -32768, 32767)."""
    a = np.nan_to_num(x.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(np.rint(a.astype(np.float64) * 32767.0), -32768, 32767).astype(np.int16)


@pytest.mark.parametrize("special", [False, True])
def test_s16_matches_the_rule_at_every_edge(special):
    """The front's conversion equals the rule for random samples, every half-way point
    (k + 0.5) / 32767 that float32 holds, out-of-range values and, in one array, NaN and
    +-inf (the conversion's shortcut must take the cleaning path for them)."""
    rng = np.random.default_rng(7)
    k = np.arange(-32770, 32770, dtype=np.float64)
    halves = ((k + 0.5) / 32767.0).astype(np.float32)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 0.5, halves,
                        np.array([1.0, -1.0, 3e38, -3e38, 1.0000001, -1.0000001], np.float32)])
    if special:
        x[[5, 77, 900]] = [np.nan, np.inf, -np.inf]
    got = A.f32_to_s16(x)
    assert got.dtype == np.int16
    assert np.array_equal(got, _s16_rule(x))
    assert np.frombuffer(A.f32_to_s16le(x), "<i2").tolist() == _s16_rule(x).tolist()


def test_s16_of_non_finite_samples_warns_nothing():
    """+inf and -inf in one chunk, and a signalling NaN, take the cleaning path without a
    numpy warning (a caller that turns warnings into errors converts them too)."""
    snan = np.array([0x7FA00000], dtype=np.uint32).view(np.float32)[0]
    x = np.array([0.5, np.inf, -np.inf, snan, -0.25], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert A.f32_to_s16(x).tolist() == [16384, 32767, -32767, 0, -8192]


def test_f32le_passthrough():
    """pcm_f32le is the samples as little-endian float32."""
    x = np.array([0.25, -0.5, 1.25], dtype=np.float32)
    assert np.frombuffer(A.f32_to_f32le(x), dtype="<f4").tolist() == [0.25, -0.5, 1.25]


def test_mulaw_known_values():
    """G.711 mu-law of known values: silence 0xFF, full scale 0x80/0x00, small negatives 0x7E."""
    s = np.array([0, 32767, -32768, -1, 1, 8159 * 4, -8159 * 4], dtype=np.int16)
    assert A.s16_to_mulaw(s).tolist() == [0xFF, 0x80, 0x00, 0x7E, 0xFF, 0x80, 0x00]
    assert A.f32_to_mulaw(np.array([0.0, 1.0, -1.0], dtype=np.float32)) == b"\xff\x80\x00"
    assert A.mulaw_to_s16(b"\xff\x80\x00\x7f").tolist() == [0, 32124, -32124, 0]


def test_mulaw_matches_audioop():
    """mu-law encoding and decoding equal audioop's for every int16 / every byte (when present)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    s = np.arange(-32768, 32768, dtype=np.int16)
    ref = np.frombuffer(audioop.lin2ulaw(s.astype("<i2").tobytes(), 2), dtype=np.uint8)
    assert np.array_equal(A.s16_to_mulaw(s), ref)
    u = bytes(range(256))
    assert np.array_equal(A.mulaw_to_s16(u), np.frombuffer(audioop.ulaw2lin(u, 2), "<i2"))


def test_mulaw_round_trip_error():
    """mu-law round trip error stays within the segment's quantisation step (~3%)."""
    s = np.linspace(-30000, 30000, 2001).astype(np.int16)
    back = A.mulaw_to_s16(A.s16_to_mulaw(s)).astype(np.int32)
    err = np.abs(back - s.astype(np.int32))
    assert np.all(err <= np.maximum(8, 0.035 * np.abs(s.astype(np.int32))))


def test_encode_pcm_unknown_format():
    """An unknown format name is a ValueError."""
    with pytest.raises(ValueError):
        A.encode_pcm(np.zeros(3, np.float32), "wav")


def _signal(n: int, rate: int) -> np.ndarray:
    t = np.arange(n) / rate
    return (0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t)).astype(
        np.float32)


@pytest.mark.parametrize("out_rate", [8000, 16000, 44100, 48000])
def test_resampler_streaming_equals_one_shot(out_rate):
    """Chunked streaming resampling equals soxr's one-shot result and conserves length."""
    n, rate = 24000, 24000
    x = _signal(n, rate)
    rs = A.StreamResampler(rate, out_rate)
    rng = np.random.default_rng(0)
    parts, i = [], 0
    while i < n:
        k = int(rng.integers(1, 2048))
        parts.append(rs.process(x[i:i + k]))
        i += k
    parts.append(rs.process(np.zeros(0, np.float32), last=True))
    y = np.concatenate(parts)
    ref = soxr.resample(x, rate, out_rate)
    assert abs(y.size - n * out_rate / rate) <= 1
    assert y.size == ref.size
    assert np.max(np.abs(y - ref)) < 1e-3


def test_converter_counts_output_samples():
    """OutputConverter returns bytes and output-sample counts; totals match n * out / in."""
    conv = A.OutputConverter(24000, 8000, "mulaw")
    x = _signal(24000, 24000)
    total_bytes, total_n = 0, 0
    for i in range(0, 24000, 512):
        b, n = conv.feed(x[i:i + 512])
        assert len(b) == n
        total_bytes, total_n = total_bytes + len(b), total_n + n
    b, n = conv.flush()
    total_bytes, total_n = total_bytes + len(b), total_n + n
    assert total_n == conv.samples_out == 8000 == total_bytes
    assert conv.flush() == (b"", 0)


def test_converter_without_resampling():
    """Same-rate conversion is a pure format change: no delay, flush is empty."""
    conv = A.OutputConverter(24000, 24000, "pcm_s16le")
    b, n = conv.feed(np.full(10, 0.5, np.float32))
    assert n == 10 and len(b) == 20
    assert conv.flush() == (b"", 0)
    with pytest.raises(RuntimeError):
        conv.feed(np.zeros(1, np.float32))
