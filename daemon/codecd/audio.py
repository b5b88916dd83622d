"""Output conversion of decoded audio, sans-I/O: float32 PCM -> wire bytes.

* :func:`f32_to_s16le`: THE rounding rule of codecd, used everywhere float32 audio
  becomes 16-bit (the wire, ``codecd decode``'s WAV, ``codecd stream``'s WAV):
  ``clip(rint(float64(x) * 32767), -32768, 32767)``, round half to even, computed in
  float64 (so +-1.0 map to +-32767 and no value is rounded twice). Offline and streamed
  s16 are bit-identical when their float32 samples are;
* :func:`f32_to_f32le`: little-endian float32 as is (NaN/inf become 0 / clipped to +-1);
* :func:`f32_to_mulaw`: G.711 mu-law, 8 bit, from the same int16 samples (the
  classic Sun/CCITT ``linear2ulaw`` on the 14 most significant bits, as
  Python's ``audioop.lin2ulaw``);
* :class:`StreamResampler`: soxr's streaming resampler (``soxr.ResampleStream``);
* :class:`OutputConverter`: one stream's resampler + encoder; ``feed`` on each
  chunk of decoded audio, ``flush`` once at the end of the stream.

Sample counts returned are output samples (after resampling), which is what
the audio headers' ``sample_offset`` and ``done.samples`` count.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FORMATS", "BYTES_PER_SAMPLE", "f32_to_s16", "f32_to_s16le", "f32_to_f32le", "f32_to_mulaw", "s16_to_mulaw",
    "mulaw_to_s16", "encode_pcm", "StreamResampler", "OutputConverter",
]

logger = logging.getLogger(__name__)

FORMATS = ("pcm_s16le", "pcm_f32le", "mulaw")
BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1}

_MU_CLIP = 8159  # 14-bit magnitude clip of G.711 mu-law
_MU_BIAS = 0x84 >> 2
#: upper ends of the 8 mu-law segments (14-bit biased magnitude)
_MU_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)


def _clean(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    a = np.asarray(x, dtype=np.float32).reshape(-1)
    if not np.isfinite(a).all():
        a = np.nan_to_num(a, nan=0.0, posinf=1.0, neginf=-1.0)
    return a


def f32_to_s16(x: npt.ArrayLike) -> npt.NDArray[np.int16]:
    """float32 [-1, 1] -> int16 samples by the one rounding rule (see the module doc).

    Few passes over the samples (a front does this for every stream's every tick): the
    finiteness check, the float64 product, the rounding and the clip in place, the cast.
    Non-finite samples are cleaned first (NaN -> 0, +-inf -> +-1)."""
    a = _clean(x)  # a pass that warns of nothing, the cleaning only where a sample is not finite
    y = np.multiply(a, 32767.0, dtype=np.float64)
    np.rint(y, out=y)
    np.minimum(y, 32767.0, out=y)
    np.maximum(y, -32768.0, out=y)
    return y.astype(np.int16)


_to_int16 = f32_to_s16
_LITTLE = sys.byteorder == "little"


def f32_to_s16le(x: npt.ArrayLike) -> bytes:
    """float32 [-1, 1] -> signed 16-bit little-endian PCM (x * 32767, rounded, clipped)."""
    s = _to_int16(x)
    return s.tobytes() if _LITTLE else s.astype("<i2").tobytes()


def f32_to_f32le(x: npt.ArrayLike) -> bytes:
    """float32 -> little-endian float32 bytes (values kept; non-finite ones replaced)."""
    return _clean(x).astype("<f4").tobytes()


def s16_to_mulaw(s: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """int16 samples -> G.711 mu-law bytes (as ``audioop.lin2ulaw(..., 2)``)."""
    v = np.asarray(s, dtype=np.int32) >> 2  # 14-bit, arithmetic shift like the C code
    neg = v < 0
    mag = np.where(neg, -v, v)
    mask = np.where(neg, 0x7F, 0xFF).astype(np.int32)
    mag = np.minimum(mag, _MU_CLIP) + _MU_BIAS
    seg = np.searchsorted(_MU_SEG_END, mag, side="left").astype(np.int32)  # first end >= mag
    uval = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0xF))
    return (uval ^ mask).astype(np.uint8)


def f32_to_mulaw(x: npt.ArrayLike) -> bytes:
    """float32 [-1, 1] -> G.711 mu-law, one byte per sample (via the int16 conversion)."""
    return s16_to_mulaw(_to_int16(x)).tobytes()


def mulaw_to_s16(u: bytes | npt.ArrayLike) -> npt.NDArray[np.int16]:
    """G.711 mu-law bytes -> int16 samples (as ``audioop.ulaw2lin(..., 2)``)."""
    if isinstance(u, (bytes, bytearray, memoryview)):
        b = np.frombuffer(u, dtype=np.uint8).astype(np.int32)
    else:
        b = np.asarray(u).astype(np.int32) & 0xFF
    b = ~b & 0xFF
    t = (((b & 0x0F) << 3) + 0x84) << ((b & 0x70) >> 4)
    return np.where(b & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


_ENCODERS = {"pcm_s16le": f32_to_s16le, "pcm_f32le": f32_to_f32le, "mulaw": f32_to_mulaw}


def encode_pcm(x: npt.ArrayLike, fmt: str) -> bytes:
    """float32 samples -> bytes of format ``fmt`` (one of :data:`FORMATS`)."""
    try:
        enc = _ENCODERS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}") from None
    return enc(x)


class StreamResampler:
    """Mono float32 streaming resampler (soxr). Feed chunks with :meth:`process`; pass
    ``last=True`` once at the end to flush the filter's tail. Over a whole stream the
    output has ``round(n_in * out_rate / in_rate)`` samples (soxr conserves length)."""

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        import soxr  # type: ignore[import-untyped]

        self.in_rate = in_rate
        self.out_rate = out_rate
        self._rs: Any = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32",
                                            quality=quality)
        self._finished = False

    def process(self, x: npt.ArrayLike, last: bool = False) -> npt.NDArray[np.float32]:
        if self._finished:
            raise RuntimeError("resampler already flushed")
        a = np.ascontiguousarray(_clean(x))
        out = self._rs.resample_chunk(a, last=last)
        if last:
            self._finished = True
        return np.asarray(out, dtype=np.float32).reshape(-1)


class OutputConverter:
    """One stream's output path: optional resampling, then encoding to ``fmt``.

    :meth:`feed` and :meth:`flush` return ``(bytes, n_samples)`` with
    ``n_samples`` counted at the output rate; :attr:`samples_out` totals them.
    """

    def __init__(self, in_rate: int, out_rate: int, fmt: str, quality: str = "HQ") -> None:
        if fmt not in _ENCODERS:
            raise ValueError(f"unknown format {fmt!r}")
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError("sample rates must be positive")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.fmt = fmt
        self.samples_in = 0
        self.samples_out = 0
        self._enc = _ENCODERS[fmt]
        self._rs = StreamResampler(in_rate, out_rate, quality) if in_rate != out_rate else None
        self._flushed = False

    def _emit(self, y: npt.NDArray[np.float32]) -> tuple[bytes, int]:
        n = int(y.size)
        self.samples_out += n
        return (self._enc(y) if n else b""), n

    def feed(self, pcm: npt.ArrayLike) -> tuple[bytes, int]:
        if self._flushed:
            raise RuntimeError("converter already flushed")
        if self._rs is None:  # the encoder cleans what it converts
            x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        else:  # a NaN would spread through the resampler's filter
            x = self._rs.process(_clean(pcm))
        self.samples_in += int(np.size(pcm))
        return self._emit(x)

    def flush(self) -> tuple[bytes, int]:
        if self._flushed:
            return b"", 0
        self._flushed = True
        if self._rs is None:
            return b"", 0
        return self._emit(self._rs.process(np.zeros(0, dtype=np.float32), last=True))
