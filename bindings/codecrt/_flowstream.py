"""FlowStream: chunked streaming for flow-matching models (S3Gen), CosyVoice2's scheme, tightened.

Exact streaming is impossible for S3Gen (its encoder and estimator attend over
the whole sequence), so a stream decodes in chunks of tokens:

* chunk k covers tokens [offset, offset + hop) and runs the flow over every
  token so far plus the next 3 (the PreLookahead layer's right context; with
  ``finalize=False`` the flow emits no mel for them), keeping the new mel
  frames only. The first chunk is smaller (``first_chunk``) for a short time
  to first audio. With ``chunk_growth`` > 1 the later chunks may grow
  (CosyVoice's ``stream_scale_factor``): chunk k decodes at most
  ``min(max_chunk, chunk * chunk_growth ** (k - 1))`` tokens and at least
  ``chunk``, as many as have arrived: a token source ahead of real time (a
  language model faster than 25 tokens/s) gets fewer, longer chunks, each of
  which recomputes the flow over every token so far, while a source at real
  time keeps chunks of ``chunk`` tokens;
* the flow's starting noise is keyed by (seed, bin, absolute frame), so every
  chunk sees the same noise sequence as the offline decode (CosyVoice keeps a
  fixed random buffer for the same reason);
* the vocoder runs on the new mel plus the last ``MEL_CACHE`` frames of the
  previous chunk's mel; the previous chunk's harmonic source replaces the start
  of the new one (no phase jump inside the overlap) and its sine noise is keyed
  by absolute sample (``sample_offset``), so the overlap is computed from the
  same source as before;
* the last ``MEL_CACHE * mel_hop`` samples of each chunk are held back and
  crossfaded with the start of the next chunk (raised cosine, complementary:
  unit gain, where CosyVoice's Hamming halves add up to 1.08).

The output has exactly ``n_tokens * hop_length`` samples, starts with the
offline decode's fade-in, and its first ``first_chunk`` tokens are available
after ``first_chunk + 3`` tokens have arrived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._context import Context
from ._errors import E_INVALID_ARGUMENT, E_STATE, CodecrtError, CodeRangeError, _fail
from ._native import lib
from ._streaming import StreamStats, Tick
from ._twostage import flow_batch, vocode_batch
from ._voice import Voice

__all__ = ["FlowStream", "FlowTick", "step_flows"]

#: what :func:`step_flows` did (the stream protocol's :class:`Tick`)
FlowTick = Tick

LOOKAHEAD = 3      # tokens of right context of the encoder's PreLookahead layer
MEL_CACHE = 8      # mel frames re-vocoded at each boundary (CosyVoice2: 8)
MEL_PER_TOKEN = 2
FADE_SAMPLES = 480  # the reference's trim_fade: 20 ms zero, then 20 ms raised cosine


@dataclass(frozen=True)
class _Chunk:
    """What a stream's next step decodes: the flow's tokens, whether it is the last chunk,
    and the token index its audio ends at."""

    tokens: npt.NDArray[np.int32]
    last: bool
    end: int


def _fade_in(n_trim: int = FADE_SAMPLES) -> npt.NDArray[np.float32]:
    f = np.zeros(2 * n_trim, dtype=np.float32)
    f[n_trim:] = (np.cos(np.linspace(np.pi, 0.0, n_trim, dtype=np.float32)) + 1.0) / 2.0
    return f


def _crossfade(n: int) -> npt.NDArray[np.float32]:
    """Fade-in weights over n samples; the fade-out is 1 - w, so the gain stays 1.

    (CosyVoice2's Hamming halves sum to 1.08, a bump at every boundary.)
    """
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)


def step_flows(ctx: Context, streams: Sequence[FlowStream]) -> Tick:
    """One chunk for every ready stream of ``streams`` (all on ``ctx``, each once), batched.

    Flows of one shape (prompt length, tokens so far, last chunk or not) run as
    one batch, and vocoder calls of one length as another (at most the
    context's ``max_batch`` each), so streams in step share each graph; the
    result of every stream is that of its own ``step()`` up to float rounding.
    A failed batch is retried stream by stream, so an error stays with its
    stream. The stepper of :class:`FlowStream` (see :func:`codecrt.step`).
    """
    if len({id(fs) for fs in streams}) != len(streams):
        _fail(E_INVALID_ARGUMENT, "a stream appears twice")
    for fs in streams:
        if fs._ctx is not ctx:
            _fail(E_INVALID_ARGUMENT, "every stream must belong to ctx")
    plans = {i: c for i, fs in enumerate(streams) if (c := fs._plan()) is not None}
    errors: dict[int, CodecrtError] = {}
    mels: dict[int, npt.NDArray[np.float32]] = {}
    limit = max(1, min(int(lib.CODECRT_MAX_FLOW_BATCH), ctx.max_batch))
    largest = 0

    def run(group: list[int], batch: Any, single: Any, into: dict[int, Any]) -> None:
        nonlocal largest
        for j in range(0, len(group), limit):
            part = group[j: j + limit]
            largest = max(largest, len(part))
            try:
                for i, r in zip(part, batch(part)):
                    into[i] = r
            except CodecrtError:
                for i in part:  # find whose input failed; the others still get their chunk
                    try:
                        into[i] = single(i)
                    except CodecrtError as e:
                        errors[i] = e

    by_flow: dict[tuple[object, ...], list[int]] = {}
    for i, c in plans.items():
        by_flow.setdefault(streams[i]._flow_key(c), []).append(i)
    for group in by_flow.values():
        fs0 = streams[group[0]]
        run(group,
            lambda part, fs0=fs0: flow_batch(ctx, np.stack([plans[i].tokens for i in part]),
                                             [streams[i]._voice for i in part],
                                             seeds=[streams[i]._seed for i in part], n_steps=fs0._n_steps,
                                             cfg_rate=fs0._cfg, finalize=plans[part[0]].last),
            lambda i: ctx.flow(plans[i].tokens, streams[i]._voice, seed=streams[i]._seed,
                               n_steps=streams[i]._n_steps, cfg_rate=streams[i]._cfg, finalize=plans[i].last),
            mels)

    voc = {i: streams[i]._vocoder_input(plans[i], mel) for i, mel in mels.items()}
    outs: dict[int, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]] = {}
    by_len: dict[int, list[int]] = {}
    for i, (mel, _, _) in voc.items():
        by_len.setdefault(mel.shape[1], []).append(i)
    for group in by_len.values():
        run(group,
            lambda part: zip(*vocode_batch(ctx, np.stack([voc[i][0] for i in part]),
                                           seeds=[streams[i]._seed for i in part],
                                           sample_offsets=[voc[i][1] for i in part],
                                           cache_sources=[voc[i][2] for i in part], return_source=True)),
            lambda i: ctx.vocode(voc[i][0], seed=streams[i]._seed, sample_offset=voc[i][1],
                                 cache_source=voc[i][2], return_source=True),
            outs)
    for i, (pcm, source) in outs.items():
        streams[i]._commit(plans[i], voc[i][0], pcm, source)
    return Tick(len(outs), errors, largest)


class FlowStream:
    """``FlowStream(ctx, voice, seed=0, first_chunk=10, chunk=25, chunk_growth=1.0, max_chunk=None)``.

    ``push(tokens)`` appends speech token ids (0..6560), ``finish()`` ends the
    utterance, ``step()`` decodes one chunk when one is ready (returns whether
    it did), ``pull()`` returns the new final samples. ``n_steps`` /
    ``cfg_rate`` as for ``Context.decode``. ``chunk_growth`` (1 to 8) and ``max_chunk``
    (``chunk`` to 4096; default 4 x ``chunk``, at most 4096) let later chunks grow as the module
    docstring says. A :class:`codecrt.CodecStream`: its
    one level of codes is the tokens, and :func:`step_flows` steps many at once.
    """

    stepper = staticmethod(step_flows)

    def __init__(self, ctx: Context, voice: Voice, *, seed: int = 0, first_chunk: int = 10, chunk: int = 25,
                 chunk_growth: float = 1.0, max_chunk: int | None = None,
                 n_steps: int = 0, cfg_rate: float | None = None) -> None:
        info = ctx.model_info
        if info.n_mels <= 0:
            _fail(E_INVALID_ARGUMENT, f"model '{info.arch}' is not a flow model (use Context.stream)")
        if not (1 <= int(first_chunk) <= 4096 and 1 <= int(chunk) <= 4096):
            _fail(E_INVALID_ARGUMENT, f"first_chunk={first_chunk} and chunk={chunk} must be in [1, 4096]")
        max_chunk = self.default_max_chunk(chunk) if max_chunk is None else max_chunk
        if not (1.0 <= float(chunk_growth) <= 8.0 and int(chunk) <= int(max_chunk) <= 4096):
            _fail(E_INVALID_ARGUMENT, f"chunk_growth={chunk_growth} must be in [1, 8] and "
                                      f"max_chunk={max_chunk} in [chunk={chunk}, 4096]")
        self._growth, self._max_chunk = float(chunk_growth), int(max_chunk)
        self._ctx, self._voice = ctx, voice
        self._seed, self._n_steps, self._cfg = int(seed), int(n_steps), cfg_rate
        self._first, self._chunk = int(first_chunk), int(chunk)
        self._hop = info.mel_hop
        self._hop_length = info.hop_length
        self._codebook = info.codebook_sizes[0]
        self._tokens: list[int] = []
        self._offset = 0                 # tokens whose audio is decoded
        self._chunks = 0                 # chunks decoded
        self._finished = False
        self._done = False
        self._closed = False
        self._cache_mel: npt.NDArray[np.float32] | None = None     # [80, MEL_CACHE]
        self._cache_source: npt.NDArray[np.float32] | None = None  # [MEL_CACHE * hop]
        self._held: npt.NDArray[np.float32] | None = None          # held-back tail, to crossfade
        self._emitted = 0                # samples emitted so far (absolute index of the next one)
        self._ready: list[npt.NDArray[np.float32]] = []
        self._window = _crossfade(MEL_CACHE * self._hop)
        self._fade = _fade_in()

    # ------------------------------------------------------------- input

    def push(self, tokens: npt.ArrayLike | Sequence[npt.ArrayLike]) -> None:
        """Append speech tokens: a 1-D array, or (as every stream takes codes) a sequence
        of one level's array."""
        if self._closed:
            _fail(E_STATE, "the stream is closed")
        if self._finished:
            _fail(E_STATE, "push after finish")
        t = np.asarray(tokens)
        if t.ndim == 2:  # levels: a flow model has one
            if t.shape[0] != 1:
                _fail(E_INVALID_ARGUMENT, f"a flow model takes one level of tokens, not {t.shape[0]}")
            t = t[0]
        t = t.reshape(-1)
        if t.size and t.dtype.kind not in "iu":
            _fail(E_INVALID_ARGUMENT, f"tokens must be integers, not {t.dtype}")
        if t.size and (int(t.min()) < 0 or int(t.max()) >= self._codebook):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise CodeRangeError(f"token {bad} is outside [0, {self._codebook})")
        self._tokens.extend(int(x) for x in t)

    def finish(self) -> None:
        if self._finished:
            _fail(E_STATE, "finish called twice")
        if not self._tokens:
            _fail(E_STATE, "finish on an empty stream: push at least one token")
        self._finished = True

    # ------------------------------------------------------------ decode

    @property
    def done(self) -> bool:
        return self._done

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def tokens_decoded(self) -> int:
        """Tokens whose audio has been decoded (emitted, or held back for the next crossfade)."""
        return self._offset

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def stats(self) -> StreamStats:
        done = self._done
        return StreamStats(len(self._tokens), self._offset,
                           len(self._tokens) * self._hop_length if done else -1,
                           self._finished, self.ready, done)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Drop the tokens, caches and pending samples: nothing is ready afterwards. Idempotent."""
        self._closed = self._done = True
        self._tokens.clear()
        self._ready.clear()
        self._cache_mel = self._cache_source = self._held = None

    def __enter__(self) -> FlowStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def default_max_chunk(chunk: int) -> int:
        """``max_chunk`` when none is given: 4 x ``chunk``, at most 4096 tokens."""
        return min(4096, 4 * int(chunk))

    def chunk_ceiling(self, k: int) -> int:
        """The most tokens chunk ``k`` (0: the first) decodes: ``first_chunk``, then ``chunk``
        grown by ``chunk_growth`` per chunk up to ``max_chunk``."""
        if k <= 0:
            return self._first
        return min(self._max_chunk, round(self._chunk * self._growth ** min(k - 1, 64)))  # no overflow

    @property
    def next_chunk(self) -> int:
        """The most tokens the next chunk decodes (its ceiling; see :meth:`chunk_ceiling`)."""
        return self.chunk_ceiling(self._chunks)

    def _next_hop(self) -> int:
        """The fewest tokens the next chunk waits for (besides the lookahead)."""
        return self._first if self._offset == 0 else self._chunk

    @property
    def ready(self) -> bool:
        """A call to step() would decode a chunk."""
        if self._done:
            return False
        if self._finished:
            return True
        return len(self._tokens) >= self._offset + self._next_hop() + LOOKAHEAD

    def step(self) -> bool:
        """Decode the next chunk if one is ready (see :func:`step_flows` for many streams at once)."""
        chunk = self._plan()
        if chunk is None:
            return False
        mel_all = self._ctx.flow(chunk.tokens, self._voice, seed=self._seed, n_steps=self._n_steps,
                                 cfg_rate=self._cfg, finalize=chunk.last)
        mel, start, cache = self._vocoder_input(chunk, mel_all)
        pcm, source = self._ctx.vocode(mel, seed=self._seed, sample_offset=start, cache_source=cache,
                                       return_source=True)
        self._commit(chunk, mel, pcm, source)
        return True

    # The pieces of a step, so that step_flows can batch the compute of many streams.

    def _plan(self) -> _Chunk | None:
        if not self.ready:
            return None
        hop = self._next_hop()
        if self._offset > 0:  # as many as have arrived, up to this chunk's ceiling
            hop = max(hop, min(self.next_chunk, len(self._tokens) - self._offset - LOOKAHEAD))
        last = self._finished and len(self._tokens) <= self._offset + hop + LOOKAHEAD
        end = len(self._tokens) if last else self._offset + hop
        tokens = self._tokens if last else self._tokens[: end + LOOKAHEAD]
        return _Chunk(np.asarray(tokens, dtype=np.int32), last, end)

    def _flow_key(self, chunk: _Chunk) -> tuple[int, int, bool, int, float | None]:
        """Flows with equal keys have one shape and schedule: they can share a batch."""
        return (self._voice.n_prompt_tokens, chunk.tokens.size, chunk.last, self._n_steps, self._cfg)

    def _vocoder_input(self, chunk: _Chunk, mel_all: npt.NDArray[np.float32]) -> tuple[
            npt.NDArray[np.float32], int, npt.NDArray[np.float32] | None]:
        """The vocoder call for this chunk: mel (the cached frames, then the new ones), the
        absolute index of its first sample, the previous chunk's source for the overlap."""
        new = mel_all[:, MEL_PER_TOKEN * self._offset: MEL_PER_TOKEN * chunk.end]
        # the held-back tail is exactly the cached mel's audio, so the call
        # starts at the first sample not emitted yet
        mel = new if self._cache_mel is None else np.concatenate([self._cache_mel, new], axis=1)
        return np.ascontiguousarray(mel), self._emitted, self._cache_source

    def _commit(self, chunk: _Chunk, mel: npt.NDArray[np.float32], pcm: npt.NDArray[np.float32],
                source: npt.NDArray[np.float32]) -> None:
        """Fade, crossfade with the held-back tail, hold back the new tail, emit the rest."""
        n_over = MEL_CACHE * self._hop
        pcm = pcm.copy()
        if self._emitted == 0:
            pcm[: self._fade.size] *= self._fade[: pcm.size]
        if self._held is not None:
            # the overlap: previous tail fading out, this chunk's start fading in
            k = self._held.size
            w = self._window if k == n_over else _crossfade(k)
            pcm[:k] = pcm[:k] * w + self._held * (1.0 - w)
        if chunk.last:
            out, self._held = pcm, None
        else:
            keep = min(n_over, pcm.size)
            out, self._held = pcm[: pcm.size - keep], pcm[pcm.size - keep:].copy()
            self._cache_mel = mel[:, -MEL_CACHE:].copy()
            self._cache_source = source[-keep:].copy()
        if out.size:
            self._ready.append(out)
            self._emitted += out.size
        self._offset = chunk.end
        self._chunks += 1
        if chunk.last:
            self._done = True

    def pull(self) -> npt.NDArray[np.float32]:
        """The final samples produced since the last pull (may be empty)."""
        if not self._ready:
            return np.zeros(0, dtype=np.float32)
        out = np.concatenate(self._ready)
        self._ready.clear()
        return out

    def decode_all(self) -> npt.NDArray[np.float32]:
        """Run every remaining chunk (after finish) and return what was not pulled yet."""
        if not self._finished:
            _fail(E_STATE, "decode_all needs finish() first")
        while self.step():
            pass
        return self.pull()
