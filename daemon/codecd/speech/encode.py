"""Streaming encoders for the speech endpoint: float32 mono PCM in, bytes of the format out.

``pcm`` (s16le, headerless) and ``wav`` (s16le after a 44-byte header whose sizes are
0xFFFFFFFF: the length is not known when the header is sent, as in OpenAI's streamed wav)
need nothing but numpy. ``opus`` (Ogg Opus, resampled to 48 kHz), ``mp3``, ``flac`` and
``aac`` (ADTS) go through PyAV, FFmpeg's encoders: the optional extra ``codecd[codecs]``.
An encoder is fed as audio arrives (:meth:`Encoder.feed`) and returns whatever bytes the
muxer has written so far; :meth:`Encoder.close` flushes the encoder and the container.

:class:`OpusPackets` is the websocket protocol's ``opus`` format: raw Opus packets of
20 ms at 48 kHz, no container (docs/protocol.md), one per binary audio message.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..audio import StreamResampler, f32_to_s16le

__all__ = ["FORMATS", "CONTENT_TYPES", "CodecsMissing", "Encoder", "make_encoder",
           "codecs_available", "opus_available", "OpusPackets", "OPUS_RATE", "OPUS_FRAME_MS",
           "OPUS_DEFAULT_BITRATE", "OPUS_MIN_BITRATE", "OPUS_MAX_BITRATE"]

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


_opus_ok: bool | None = None


def opus_available() -> bool:
    """PyAV is installed and its FFmpeg has the libopus encoder (checked once)."""
    global _opus_ok
    if _opus_ok is None:
        try:
            import av

            av.Codec("libopus", "w")
            _opus_ok = True
        except Exception:  # ImportError, or an FFmpeg without libopus
            _opus_ok = False
    return _opus_ok


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


# ----------------------------------------------------- raw Opus packets (websocket)

#: the websocket ``opus`` format: 48 kHz mono, 20 ms packets, 64 kb/s unless asked otherwise
OPUS_RATE = 48000
OPUS_FRAME_MS = 20
OPUS_DEFAULT_BITRATE = 64000
#: the bit rate range (b/s): libopus' 6000..510000, less FFmpeg's cap of 256000 per channel
OPUS_MIN_BITRATE = 6000
OPUS_MAX_BITRATE = 256000
#: libopus' ``application``: "audio" (music and speech fidelity; "voip" would favour
#: intelligibility at low rates)
OPUS_APPLICATION = "audio"


class OpusPackets:
    """One websocket stream's ``opus`` output: float32 mono PCM at ``in_rate`` in, raw
    Opus packets of 20 ms at 48 kHz out (libopus through PyAV, no container).

    The audio is resampled to 48 kHz (soxr, as the PCM formats), cut into 960-sample
    frames, each encoded into one packet at once; less than one frame waits for the next
    :meth:`feed` (the only audio held here). :meth:`flush` pads the last partial frame
    with silence and drains the encoder, whose look-ahead (:attr:`pre_skip` samples)
    needs one more packet: a stream of ``n`` samples at 48 kHz gives
    ``ceil((n + pre_skip) / 960)`` packets. Every packet decodes to 960 samples.

    :meth:`feed` and :meth:`flush` return ``[(packet, 960), ...]``; :attr:`samples_out`
    totals the samples of the packets returned (the decoder's output, pre-skip included).
    :meth:`close` frees the encoder (after flush, or instead of it on cancel or error).
    """

    def __init__(self, in_rate: int, bitrate: int | None = None, *,
                 application: str = OPUS_APPLICATION, quality: str = "HQ") -> None:
        try:
            import av
        except ImportError:
            raise CodecsMissing("format 'opus' needs PyAV: pip install 'codecd[codecs]'"
                                ) from None
        if in_rate <= 0:
            raise ValueError("sample rate must be positive")
        self.bitrate = OPUS_DEFAULT_BITRATE if bitrate is None else int(bitrate)
        if not OPUS_MIN_BITRATE <= self.bitrate <= OPUS_MAX_BITRATE:
            raise ValueError(f"opus bitrate {self.bitrate} outside "
                             f"[{OPUS_MIN_BITRATE}, {OPUS_MAX_BITRATE}]")
        self.in_rate = in_rate
        self.sample_rate = OPUS_RATE
        self.frame_samples = OPUS_RATE * OPUS_FRAME_MS // 1000
        self.application = application
        try:
            ctx: Any = av.CodecContext.create("libopus", "w")
        except (av.FFmpegError, ValueError) as e:
            raise CodecsMissing(f"format 'opus': FFmpeg encoder 'libopus' is not available "
                                f"in this PyAV build ({e})") from None
        ctx.sample_rate = OPUS_RATE
        ctx.layout = "mono"
        ctx.format = "flt"
        ctx.bit_rate = self.bitrate
        ctx.options = {"application": application, "frame_duration": str(OPUS_FRAME_MS)}
        ctx.open()
        if ctx.frame_size != self.frame_samples:
            raise CodecsMissing(f"libopus opened with frames of {ctx.frame_size} samples, "
                                f"not {self.frame_samples}")
        self.av = av
        self._ctx: Any = ctx
        self.pre_skip = _opus_pre_skip(ctx)
        self._rs = (StreamResampler(in_rate, OPUS_RATE, quality) if in_rate != OPUS_RATE
                    else None)
        self._buf = np.zeros(0, dtype=np.float32)  # < one frame
        self._pts = 0
        self.samples_in = 0
        self.samples_out = 0
        self.packets = 0
        self._flushed = False

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def codec_info(self) -> dict[str, Any]:
        """The ``codec`` object of ``started``: what a decoder needs, no Ogg header."""
        return {"name": "opus", "sample_rate": self.sample_rate, "channels": 1,
                "frame_ms": OPUS_FRAME_MS, "frame_samples": self.frame_samples,
                "pre_skip": self.pre_skip, "bitrate": self.bitrate,
                "application": self.application}

    def _encode(self, frame: npt.NDArray[np.float32] | None) -> list[tuple[bytes, int]]:
        if frame is None:
            packets = self._ctx.encode(None)
        else:
            fr = self.av.AudioFrame.from_ndarray(frame.reshape(1, -1), format="flt",
                                                 layout="mono")
            fr.sample_rate = OPUS_RATE
            fr.pts = self._pts
            self._pts += frame.size
            packets = self._ctx.encode(fr)
        out = [(bytes(p), self.frame_samples) for p in packets]
        self.packets += len(out)
        self.samples_out += self.frame_samples * len(out)
        return out

    def _frames(self, x: npt.NDArray[np.float32]) -> list[tuple[bytes, int]]:
        buf = np.concatenate([self._buf, x]) if self._buf.size else x
        fs = self.frame_samples
        whole = buf.size - buf.size % fs
        out: list[tuple[bytes, int]] = []
        for i in range(0, whole, fs):
            out += self._encode(np.ascontiguousarray(buf[i:i + fs], dtype=np.float32))
        self._buf = np.array(buf[whole:], dtype=np.float32)
        return out

    def feed(self, pcm: npt.ArrayLike) -> list[tuple[bytes, int]]:
        if self._flushed or self._ctx is None:
            raise RuntimeError("opus encoder already flushed or closed")
        x = np.nan_to_num(np.asarray(pcm, dtype=np.float32).reshape(-1), nan=0.0,
                          posinf=1.0, neginf=-1.0)
        self.samples_in += int(x.size)
        if self._rs is not None:
            x = self._rs.process(x)
        return self._frames(np.clip(x, -1.0, 1.0))

    def flush(self) -> list[tuple[bytes, int]]:
        """The rest: the resampler's tail, the last frame padded with silence, then the
        encoder's own tail (its look-ahead). Then :meth:`close`."""
        if self._flushed or self._ctx is None:
            return []
        self._flushed = True
        out: list[tuple[bytes, int]] = []
        if self._rs is not None:
            out += self._frames(np.clip(self._rs.process(np.zeros(0, np.float32), last=True),
                                        -1.0, 1.0))
        if self._buf.size:
            # a short last frame: libopus pads it with silence to 20 ms, and FFmpeg counts
            # only its real samples when it drains the look-ahead (no packet more than needed)
            last, self._buf = self._buf, np.zeros(0, dtype=np.float32)
            out += self._encode(np.ascontiguousarray(last))
        out += self._encode(None)
        self.close()
        return out

    def close(self) -> None:
        """Free the encoder (idempotent); nothing is sent after it."""
        self._ctx = None
        self._rs = None
        self._buf = np.zeros(0, dtype=np.float32)


def _opus_pre_skip(ctx: Any) -> int:
    """The encoder's look-ahead in 48 kHz samples: the OpusHead's pre-skip (RFC 7845; FFmpeg
    puts the header in the context's extradata), else the context's ``delay``."""
    head = bytes(ctx.extradata or b"")
    if len(head) >= 12 and head[:8] == b"OpusHead":
        return int(struct.unpack_from("<H", head, 10)[0])
    return int(getattr(ctx, "delay", 0) or 0)
