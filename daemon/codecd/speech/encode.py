"""Streaming encoders for the speech endpoint: float32 mono PCM in, bytes of the format out.

``pcm`` (s16le, headerless) and ``wav`` (s16le after a 44-byte header whose sizes are
0xFFFFFFFF: the length is not known when the header is sent, as in OpenAI's streamed wav)
need nothing but numpy. ``opus`` (Ogg Opus, resampled to 48 kHz), ``mp3``, ``flac`` and
``aac`` (ADTS) go through PyAV, FFmpeg's encoders: the optional extra ``codecd[codecs]``.
An encoder is fed as audio arrives (:meth:`Encoder.feed`) and returns whatever bytes the
muxer has written so far; :meth:`Encoder.close` flushes the encoder and the container.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..audio import f32_to_s16le

__all__ = ["FORMATS", "CONTENT_TYPES", "CodecsMissing", "Encoder", "make_encoder",
           "codecs_available"]

logger = logging.getLogger(__name__)

FORMATS = ("pcm", "wav", "opus", "mp3", "flac", "aac")
CONTENT_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "opus": "audio/ogg",
                 "mp3": "audio/mpeg", "flac": "audio/flac", "aac": "audio/aac"}

#: format -> (container, codec, encoder sample rate or None for the input's, bit rate)
_AV: dict[str, tuple[str, str, int | None, int | None]] = {
    "opus": ("ogg", "libopus", 48000, 64000),
    "mp3": ("mp3", "libmp3lame", None, 128000),
    "flac": ("flac", "flac", None, None),
    "aac": ("adts", "aac", None, 96000),
}


class CodecsMissing(RuntimeError):
    """PyAV (``pip install 'codecd[codecs]'``) is not installed, or lacks the encoder."""


def codecs_available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


class Encoder:
    """Base: ``feed(pcm) -> bytes``, ``close() -> bytes``."""

    def feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        raise NotImplementedError

    def close(self) -> bytes:
        return b""


class PcmEncoder(Encoder):
    def feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        return f32_to_s16le(pcm)


class WavEncoder(Encoder):
    """s16le in a RIFF/WAVE header sent first, with unknown (0xFFFFFFFF) sizes."""

    def __init__(self, sample_rate: int) -> None:
        self.header: bytes | None = struct.pack(
            "<4sI4s4sIHHIIHH4sI", b"RIFF", 0xFFFFFFFF, b"WAVE", b"fmt ", 16, 1, 1,
            sample_rate, sample_rate * 2, 2, 16, b"data", 0xFFFFFFFF)

    def _take_header(self) -> bytes:
        h, self.header = self.header, None
        return h or b""

    def feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        return self._take_header() + f32_to_s16le(pcm)

    def close(self) -> bytes:
        return self._take_header()  # an empty stream is still a (0-sample) wav


class _Sink:
    """A write-only, non-seekable file for PyAV's muxer: bytes are drained as written."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


@dataclass
class _AvState:
    container: Any
    stream: Any
    resampler: Any


class AvEncoder(Encoder):
    """One PyAV output container; int16 mono frames in, resampled where the codec needs."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        try:
            import av
        except ImportError:
            raise CodecsMissing(f"response_format {fmt!r} needs PyAV: pip install 'codecd[codecs]'"
                                ) from None
        container_fmt, codec, rate, bit_rate = _AV[fmt]
        self.fmt = fmt
        self.in_rate = sample_rate
        self.sink = _Sink()
        try:
            # Ogg pages of at most 20 ms (the muxer's default is 1 s: no streaming)
            opts = {"page_duration": "20000"} if container_fmt == "ogg" else {}
            container: Any = av.open(self.sink, mode="w", format=container_fmt, options=opts)
            stream: Any = container.add_stream(codec, rate=rate or sample_rate)
        except (av.FFmpegError, ValueError) as e:
            raise CodecsMissing(f"response_format {fmt!r}: FFmpeg encoder {codec!r} is not "
                                f"available in this PyAV build ({e})") from None
        stream.layout = "mono"
        if bit_rate:
            stream.bit_rate = bit_rate
        # the codec's own sample format (s16 for libopus/flac, s16p or fltp for mp3/aac)
        fmt_name = stream.codec_context.codec.audio_formats[0].name
        self.av = av
        self.state = _AvState(container, stream, av.AudioResampler(
            format=fmt_name, layout="mono", rate=rate or sample_rate))
        self.pts = 0
        self.closed = False

    def _mux(self, frames: list[Any]) -> None:
        for fr in frames:
            for pkt in self.state.stream.encode(fr):
                self.state.container.mux(pkt)

    def feed(self, pcm: npt.NDArray[np.float32]) -> bytes:
        if pcm.size == 0:
            return b""
        s16 = np.frombuffer(f32_to_s16le(pcm), dtype=np.int16).reshape(1, -1)
        frame = self.av.AudioFrame.from_ndarray(s16, format="s16", layout="mono")
        frame.sample_rate = self.in_rate
        frame.pts = self.pts
        self.pts += s16.shape[1]
        self._mux(self.state.resampler.resample(frame))
        return self.sink.take()

    def close(self) -> bytes:
        if self.closed:
            return b""
        self.closed = True
        self._mux(self.state.resampler.resample(None))
        for pkt in self.state.stream.encode(None):
            self.state.container.mux(pkt)
        self.state.container.close()
        return self.sink.take()


def make_encoder(fmt: str, sample_rate: int) -> Encoder:
    """The streaming encoder of ``fmt`` (one of :data:`FORMATS`) for mono PCM at ``sample_rate``."""
    if fmt == "pcm":
        return PcmEncoder()
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt in _AV:
        return AvEncoder(fmt, sample_rate)
    raise ValueError(f"unknown format {fmt!r}")
