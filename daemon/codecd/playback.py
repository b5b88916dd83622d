"""Live playback: a thread-safe jitter buffer and a sounddevice output stream that reads it.

:class:`JitterBuffer` is a mono float32 ring buffer between a producer (network
audio) and a consumer (the audio device callback). The consumer gets silence
until the buffer is *primed* (``prime`` samples buffered, or the producer
called :meth:`JitterBuffer.end` first); after that every read that finds too
few samples before the end is an **underrun**: the missing part is zeros and
``underruns`` / ``underrun_frames`` count it. After :meth:`JitterBuffer.end`
the consumer drains what is left and :meth:`JitterBuffer.wait_drained` returns.
The read side never blocks and never allocates beyond numpy slicing, so it is
safe in a real-time callback; it is unit-testable without any audio device.

:class:`Player` owns a ``sounddevice.OutputStream`` (imported lazily: it needs
the system PortAudio). Any exception inside the callback aborts the stream
(``sounddevice.CallbackAbort``) and is re-raised by :meth:`Player.wait` in the
calling thread, never in the audio thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

__all__ = ["JitterBuffer", "BufferStats", "Player", "PlaybackError"]


class PlaybackError(RuntimeError):
    """Playback failed (the callback raised, or the device stream ended abnormally)."""


@dataclass(frozen=True)
class BufferStats:
    frames_written: int
    frames_played: int
    #: reads after priming that found fewer samples than asked, before the end
    underruns: int
    underrun_frames: int
    #: zeros output before priming
    prime_frames: int
    overflows: int
    prime: int
    #: seconds from the first write to the buffer being primed (None: not primed)
    time_to_prime_s: float | None
    level: int
    ended: bool
    drained: bool


class JitterBuffer:
    """Ring buffer of mono float32 samples with priming, underrun counting and drain."""

    def __init__(self, capacity: int, prime: int = 0, *, reprime: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be > 0")
        if not (0 <= prime <= capacity):
            raise ValueError(f"prime {prime} must be in [0, capacity {capacity}]")
        self.capacity = int(capacity)
        self.prime = int(prime)
        #: after an underrun, wait for ``prime`` samples again before playing
        self.reprime = reprime
        self._clock = clock
        self._buf = np.zeros(self.capacity, dtype=np.float32)
        self._r = 0  # read index (mod capacity)
        self._n = 0  # samples buffered
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._drained_evt = threading.Event()
        self._primed_evt = threading.Event()
        self._primed = False
        self._ended = False
        self._closed = False
        self.frames_written = 0
        self.frames_played = 0
        self.underruns = 0
        self.underrun_frames = 0
        self.prime_frames = 0
        self.overflows = 0
        self._first_write: float | None = None
        self._primed_at: float | None = None

    # ------------------------------------------------------------ producer

    def write(self, samples: npt.ArrayLike, *, block: bool = True,
              timeout: float | None = None) -> int:
        """Append samples; waits for space when ``block`` (else drops what does not fit and
        counts an overflow). Returns the number of samples written."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        done = 0
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            if self._ended:
                raise RuntimeError("write after end()")
            if self._first_write is None and x.size:
                self._first_write = self._clock()
            while done < x.size:
                free = self.capacity - self._n
                if free == 0:
                    if not block or self._closed:
                        self.overflows += 1
                        break
                    rem = None if deadline is None else deadline - self._clock()
                    if rem is not None and rem <= 0:
                        self.overflows += 1
                        break
                    self._space.wait(rem)
                    continue
                k = min(free, x.size - done)
                w = (self._r + self._n) % self.capacity
                first = min(k, self.capacity - w)
                self._buf[w:w + first] = x[done:done + first]
                if k > first:
                    self._buf[:k - first] = x[done + first:done + k]
                self._n += k
                done += k
                self.frames_written += k
                self._check_primed()
        return done

    def end(self) -> None:
        """No more samples: play out what is buffered (primed now if it was not yet)."""
        with self._lock:
            self._ended = True
            if not self._primed:
                self._set_primed()
            if self._n == 0:
                self._drained_evt.set()

    def close(self) -> None:
        """Unblock writers and waiters (playback is being torn down)."""
        with self._lock:
            self._closed = True
            self._ended = True
            self._space.notify_all()
        self._primed_evt.set()
        self._drained_evt.set()

    # ------------------------------------------------------------ consumer

    def read_into(self, out: npt.NDArray[np.float32]) -> int:
        """Fill ``out`` (1-D float32) from the buffer, zeros where there is nothing to play.
        Returns the number of real samples; never blocks for long (real-time safe)."""
        n = int(out.shape[0])
        with self._lock:
            if not self._primed:
                out[:] = 0.0
                self.prime_frames += n
                return 0
            k = min(n, self._n)
            first = min(k, self.capacity - self._r)
            out[:first] = self._buf[self._r:self._r + first]
            if k > first:
                out[first:k] = self._buf[:k - first]
            out[k:] = 0.0
            self._r = (self._r + k) % self.capacity
            self._n -= k
            self.frames_played += k
            if k < n and not self._ended:
                self.underruns += 1
                self.underrun_frames += n - k
                if self.reprime and self.prime > 0:
                    self._primed = False
            if k:
                self._space.notify_all()
            if self._ended and self._n == 0:
                self._drained_evt.set()
            return k

    def read(self, n: int) -> npt.NDArray[np.float32]:
        out = np.empty(n, dtype=np.float32)
        self.read_into(out)
        return out

    # ------------------------------------------------------------- waiting

    def wait_primed(self, timeout: float | None = None) -> bool:
        return self._primed_evt.wait(timeout)

    def wait_drained(self, timeout: float | None = None) -> bool:
        return self._drained_evt.wait(timeout)

    # --------------------------------------------------------------- state

    @property
    def level(self) -> int:
        with self._lock:
            return self._n

    @property
    def primed(self) -> bool:
        with self._lock:
            return self._primed

    @property
    def drained(self) -> bool:
        return self._drained_evt.is_set()

    def stats(self) -> BufferStats:
        with self._lock:
            ttp = (None if self._primed_at is None or self._first_write is None
                   else max(0.0, self._primed_at - self._first_write))
            return BufferStats(self.frames_written, self.frames_played, self.underruns,
                               self.underrun_frames, self.prime_frames, self.overflows,
                               self.prime, ttp, self._n, self._ended,
                               self._drained_evt.is_set())

    def _check_primed(self) -> None:  # lock held
        if not self._primed and self._n >= max(1, self.prime):
            self._set_primed()

    def _set_primed(self) -> None:  # lock held
        self._primed = True
        if self._primed_at is None:
            self._primed_at = self._clock()
        self._primed_evt.set()


#: how to install the system PortAudio, named in the error when it is missing
PORTAUDIO_HINT = ("install PortAudio: Debian/Ubuntu `apt-get install libportaudio2`, "
                  "Fedora `dnf install portaudio`, macOS `brew install portaudio`")


def import_sounddevice() -> Any:
    """The ``sounddevice`` module, or a :class:`PlaybackError` that says what to install
    (the package comes with the ``play`` extra; the PortAudio library from the system)."""
    try:
        import sounddevice as sd  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise PlaybackError("playback needs the sounddevice package: "
                            "pip install 'codecd[play]'") from None
    except OSError as e:  # sounddevice raises OSError when it cannot load libportaudio
        raise PlaybackError(f"playback needs the PortAudio library ({e}); {PORTAUDIO_HINT}"
                            ) from None
    return sd


def check_output_device(device: Any = None) -> str:
    """The name of the output device playback would use; a :class:`PlaybackError` naming
    the cause when there is none (no PortAudio, or PortAudio sees no output device)."""
    sd = import_sounddevice()
    if isinstance(device, str) and device.isdigit():
        device = int(device)
    try:
        info = sd.query_devices(device, kind="output")
    except (sd.PortAudioError, ValueError) as e:
        apis = ", ".join(h["name"] for h in sd.query_hostapis()) or "none"
        raise PlaybackError(
            f"no audio output device ({e}; PortAudio host APIs: {apis}, devices: "
            f"{len(sd.query_devices())}). Check the sound card or server; on a machine without "
            "one, see docs/playback.md (a PulseAudio null sink)") from None
    return str(info["name"])


class Player:
    """A sounddevice output stream (mono float32) playing a :class:`JitterBuffer`.

    ``start()`` opens and starts the stream (its callback outputs zeros until the
    buffer is primed), ``wait()`` blocks until the buffer drained after ``end()``
    and stops the stream cleanly (pending device buffers play out), raising
    :class:`PlaybackError` if the callback failed.
    """

    def __init__(self, buffer: JitterBuffer, samplerate: int, *, device: Any = None,
                 blocksize: int = 0, latency: str | float = "low") -> None:
        self.buffer = buffer
        self.samplerate = int(samplerate)
        self.device = device
        self.blocksize = int(blocksize)
        self.latency = latency
        self.error: BaseException | None = None
        #: PortAudio's own output underflow flags seen by the callback
        self.device_underflows = 0
        self.callbacks = 0
        self._stream: Any = None
        self._finished = threading.Event()
        self._sd: Any = None
        #: the device's output latency (seconds), as PortAudio reports it after start()
        self.output_latency_s = 0.0

    def _callback(self, outdata: npt.NDArray[np.float32], frames: int, time_info: Any,
                  status: Any) -> None:
        try:
            self.callbacks += 1
            if status and getattr(status, "output_underflow", False):
                self.device_underflows += 1
            self.buffer.read_into(outdata[:, 0])
            if outdata.shape[1] > 1:
                outdata[:, 1:] = outdata[:, :1]
        except Exception as e:  # noqa: BLE001 - never let it reach the audio thread
            self.error = e
            outdata.fill(0)
            raise self._sd.CallbackAbort from None

    def _on_finished(self) -> None:
        self._finished.set()

    def start(self) -> None:
        sd = import_sounddevice()  # needs the system PortAudio; imported only for playback
        self._sd = sd
        self._stream = sd.OutputStream(samplerate=self.samplerate, channels=1, dtype="float32",
                                       device=self.device, blocksize=self.blocksize,
                                       latency=self.latency, callback=self._callback,
                                       finished_callback=self._on_finished)
        self.output_latency_s = float(self._stream.latency)
        self._stream.start()

    def wait(self, timeout: float | None = None, *, stall_s: float | None = None) -> None:
        """Wait for the drain (or a callback failure), then stop and close the stream.

        ``timeout`` bounds the whole wait; ``stall_s`` bounds only a stall: the wait fails
        when the device played nothing for that long. A loaded machine plays slowly (the
        callback thread starves, ALSA recovers from underruns) but keeps making progress;
        a dead device or stream makes none."""
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        played, progress_at = self.buffer.frames_played, now
        while True:
            if self.buffer.wait_drained(0.05):
                break
            if self._finished.is_set() or self.error is not None:
                break
            now = time.monotonic()
            if self.buffer.frames_played != played:
                played, progress_at = self.buffer.frames_played, now
            if deadline is not None and now > deadline:
                self.close(abort=True)
                raise PlaybackError("playback did not drain in time")
            if stall_s is not None and now - progress_at > stall_s:
                self.close(abort=True)
                raise PlaybackError(f"playback stalled: the device played nothing for "
                                    f"{stall_s:g} s")
        drained = self.buffer.drained
        self.close(abort=self.error is not None)
        if self.error is not None:
            raise PlaybackError(f"playback callback failed: {self.error!r}") from self.error
        if not drained:  # the stream finished on its own with audio still buffered
            raise PlaybackError("the output stream stopped before the buffer drained")

    def close(self, abort: bool = False) -> None:
        st, self._stream = self._stream, None
        if st is None:
            return
        try:
            if abort:
                st.abort()
            else:
                st.stop()  # plays out what the device has buffered
        finally:
            st.close()
            self.buffer.close()

    def __enter__(self) -> Player:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(abort=True)
