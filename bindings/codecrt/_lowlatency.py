"""LowLatencyStream: a smaller lookahead than exact streaming, finalized by a short crossfade.

An exact stream lags its input by the decoder's right receptive field
(``latency_samples``, 198 ms for SNAC 24 kHz). A low-latency stream emits audio
``lookahead`` samples behind the input instead:

* samples the exact stream has finalized are emitted as they are;
* past them, up to ``input - lookahead``, it emits a provisional estimate: an
  offline decode of the recent frames, as if the utterance ended there (the
  future is zero padding), over a window wide enough that its left edge does
  not matter (twice the receptive field);
* the last ``crossfade`` samples of each emission are held back; the next
  estimate of those samples (more context, often final) replaces them through
  a linear crossfade, so a provisional estimate never meets the next one in a
  step.

Latency is ``lookahead + crossfade`` samples. With ``lookahead >=
latency_samples`` every emitted sample is final and the output equals the
offline decode exactly. The cost is one extra decode of about
``2 * latency_samples`` per tick; the measured error per lookahead is in
docs/streaming.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._context import Context
from ._errors import E_INVALID_ARGUMENT, _fail
from ._stream import Stream, step_exact
from ._streaming import StreamStats

__all__ = ["LowLatencyStream"]


class LowLatencyStream:
    """An exact :class:`Stream` plus provisional samples for a shorter lookahead.

    A :class:`codecrt.CodecStream`: it steps with the exact streams of its context
    (its runtime stream is :attr:`native`), and :meth:`pull` emits what is due.
    """

    stepper = staticmethod(step_exact)

    def __init__(self, ctx: Context, *, lookahead: int, crossfade: int = 256,
                 noise: bool = False, seed: int = 0) -> None:
        if lookahead < 0 or crossfade < 0:
            _fail(E_INVALID_ARGUMENT, "lookahead and crossfade must be >= 0")
        self._ctx = ctx
        self.stream: Stream = ctx.stream(noise=noise, seed=seed)
        info = ctx.model_info
        self._hop = info.hop_length
        self._strides = info.level_strides
        self._mult = info.frame_multiple
        self._latency = self.stream.info.latency_samples
        self.lookahead = int(lookahead)
        self.crossfade = int(crossfade)
        self._noise, self._seed = noise, seed
        self._codes: list[list[npt.NDArray[np.int32]]] = [[] for _ in self._strides]
        self._final = np.zeros(0, np.float32)  # final samples not emitted yet
        self._final_start = 0                  # absolute offset of self._final[0]
        self._pending = np.zeros(0, np.float32)  # estimate of [emitted, emitted + K), held back
        self.emitted = 0
        self.provisional_samples = 0           # emitted samples that were not final

    @property
    def latency_samples(self) -> int:
        """Output lag behind the last complete pushed frame."""
        return min(self.lookahead, self._latency) + self.crossfade

    @property
    def native(self) -> Stream:
        """The exact runtime stream that a tick advances."""
        return self.stream

    def push(self, levels: Sequence[npt.ArrayLike]) -> None:
        """Append codes, as :meth:`Stream.push`."""
        self.stream.push(levels)  # validates first
        for i, lv in enumerate(levels):
            a = np.ascontiguousarray(lv, dtype=np.int32).reshape(-1)
            if a.size:
                self._codes[i].append(a)

    def finish(self) -> None:
        self.stream.finish()

    def _levels(self) -> list[npt.NDArray[np.int32]]:
        for i, parts in enumerate(self._codes):
            if len(parts) > 1:
                self._codes[i] = [np.concatenate(parts)]
        return [p[0] if p else np.zeros(0, np.int32) for p in self._codes]

    def update(self) -> npt.NDArray[np.float32]:
        """Step the exact stream while it is ready, then return the newly emitted samples."""
        while self._ctx.step([self.stream]):
            pass
        return self.collect()

    def collect(self) -> npt.NDArray[np.float32]:
        """Emit what is due after ticks (use after ``ctx.step`` over many streams)."""
        self._final = np.concatenate([self._final, self.stream.pull()])
        final_end = self._final_start + len(self._final)
        info = self.stream.info
        levels = self._levels()
        frames = min(len(lv) * s for lv, s in zip(levels, self._strides))
        frames -= frames % self._mult
        finished = info.finished
        total = info.total_samples if finished else frames * self._hop
        target = total if finished and info.done else min(total, frames * self._hop - self.lookahead)
        hold = 0 if finished and info.done else self.crossfade
        end = max(self.emitted, target)
        if end <= self.emitted:
            return np.zeros(0, np.float32)
        est = np.empty(end - self.emitted, np.float32)
        n_final = max(0, min(end, final_end) - self.emitted)
        if n_final:
            est[:n_final] = self._final[self.emitted - self._final_start:][:n_final]
        if n_final < len(est):  # provisional: decode recent frames as if the utterance ended there
            first = self.emitted + n_final
            w0 = max(0, (first - 2 * self._latency) // self._hop)
            w0 -= w0 % self._mult
            window = [lv[w0 // s: frames // s] for lv, s in zip(levels, self._strides)]
            pcm = self._ctx.decode(window, noise=self._noise, seed=self._seed)
            est[n_final:] = pcm[first - w0 * self._hop: end - w0 * self._hop]
            self.provisional_samples += len(est) - n_final
        k = min(len(self._pending), len(est))
        if k:  # the held-back samples move from their old estimate to the new one
            ramp = np.arange(1, k + 1, dtype=np.float32) / np.float32(k + 1)
            old = self._pending[:k]
            est[:k] = old + (est[:k] - old) * ramp
        n_out = max(0, len(est) - hold)
        out, self._pending = est[:n_out], est[n_out:]
        self.emitted += n_out
        # final samples of emitted times are not needed any more (those still to
        # come for already emitted times are dropped as they arrive)
        drop = min(max(0, self.emitted - self._final_start), len(self._final))
        self._final = self._final[drop:]
        self._final_start += drop
        return out

    def pull(self) -> npt.NDArray[np.float32]:
        """The samples emitted since the last pull (after ticks): :meth:`collect`."""
        return self.collect()

    @property
    def done(self) -> bool:
        info = self.stream.info
        return info.done and info.total_samples >= 0 and self.emitted >= info.total_samples

    @property
    def stats(self) -> StreamStats:
        st = self.stream.stats
        done = st.done and st.total_samples >= 0 and self.emitted >= st.total_samples
        return st._replace(done=done)

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> LowLatencyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
