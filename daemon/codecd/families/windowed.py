"""Windowed streaming for non-causal decoders (WavTokenizer, NeuCodec, XCodec2), batched.

These decoders attend over the whole utterance (global attention, GroupNorm
statistics over all frames), so no stream can equal the offline decode. A stream
decodes overlapping *windows* of codes offline and joins them with a short
overlap-add: NeuTTS' scheme (neuphonic/neutts, ``NeuTTS._infer_stream_ggml`` and
``_linear_overlap_add``: ``streaming_frames_per_chunk`` 25,
``streaming_lookback`` 50, ``streaming_lookforward`` 5,
``streaming_overlap_frames`` 1), stated here as a definition that a stream
reproduces bit for bit whatever pieces its codes arrive in.

**Definition** (:class:`WindowParams` ``chunk`` C, ``lookback`` L,
``lookahead`` A, ``overlap`` O; codes ``c[0..N)``, ``hop`` samples per frame).
Pieces k = 0, 1, ..., each starting at frame kC:

* a *regular* piece k exists when N - kC >= C + A: it decodes the window
  ``c[max(kC - L - O, 0) : kC + C + A)`` offline (one ``Context.decode`` of that
  window alone) and keeps its frames ``[kC, kC + C + 2O)``;
* after the last regular piece (K of them), if N > KC, the *final* piece decodes
  ``c[max(KC - L - O, 0) : N)`` and keeps frames ``[KC, N)``;
* overlap-add: a piece's kept samples (length P) get NeuTTS' triangle weights
  ``w(t) = 0.5 - |t - 0.5|``, ``t = linspace(0, 1, P + 2)[1:-1]`` (float32).
  Where two pieces overlap (the 2O frames after each regular piece's chunk) the
  output is ``(w_a a + w_b b) / (w_a + w_b)`` (float32, in that order); elsewhere
  it is the piece's sample itself.

With a *prefix* of P codes (NeuTTS' voice prompt codes, which lead its LM's
output), piece k starts at frame P + kC instead of kC: the prefix is left context
and is never output.

The output has exactly ``(N - P) * hop`` samples. :func:`windowed_decode` computes it
offline from a decode function; a :class:`WindowedStream` yields the same
samples, bit for bit, as codes arrive: a regular piece is decoded once its C + A
codes from kC on have arrived, the final one when the stream is finished. The
first audio thus needs C + A frames of codes and the lag is at most
``(C + A) * hop`` samples. An utterance of fewer than C + A frames is one final
piece: the stream then equals the offline decode exactly.

This is NeuTTS' loop as it runs (one code per LM step; its window end ``+ O``
never exists when a piece is decoded), except its final piece, which starts one
frame early but is placed at frame KC (one frame misaligned, one frame too
long; ``tests/references/neucodec.py`` replays it with ``upstream_final=True``
and the definition here with ``upstream_final=False``), and that NeuTTS divides
every sample by its weight (``w x / w``, an ulp away from ``x``). With the
defaults (C 25, L 50, A 5, O 1) a steady window decodes 81 frames for 25 new
ones.

Batching: :func:`step_windows` (the stepper of :class:`WindowedStream`, see
``codecrt.step``) decodes the windows of every ready stream of one tick, one
``Context.decode`` per window length (steady windows of all streams have the
same length, L + O + C + A), at most ``Context.max_batch`` windows per call. The
runtime's batched decode equals its single-sequence decode bit for bit
(``tests/codecs/test_windowed.py`` checks it), so batching does not change a stream's
output.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .base import Family, LoadedModel, ModelSpec, StreamPlan, StreamRefused
from .native import default_buckets, make_context

__all__ = ["WindowParams", "DEFAULT_WINDOW", "LOW_WINDOW", "MAX_WINDOW_FRAMES", "MAX_WINDOW_COST",
           "windowed_decode", "WindowedStream", "step_windows", "WindowedModel", "WindowedFamily"]

logger = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class WindowParams:
    """A windowed stream's window, in frames (see the module docstring)."""

    chunk: int = 25      # C: frames a regular piece makes final
    lookback: int = 50   # L: frames of left context before a piece (plus O)
    lookahead: int = 5   # A: frames of right context after a piece's chunk
    overlap: int = 1     # O: a regular piece keeps 2 O frames beyond its chunk, overlap-added

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.lookback < 0 or self.lookahead < 0 or self.overlap < 0:
            raise ValueError(f"window {self}: chunk >= 1, lookback, lookahead, overlap >= 0")
        if 2 * self.overlap > min(self.lookahead, self.chunk):
            raise ValueError(f"window {self}: 2 * overlap must be <= lookahead and <= chunk")

    @property
    def latency_frames(self) -> int:
        """Frames of codes needed before the first audio (and the largest lag)."""
        return self.chunk + self.lookahead

    @property
    def steady_frames(self) -> int:
        """Frames of a steady window (lookback + overlap + chunk + lookahead)."""
        return self.lookback + self.overlap + self.chunk + self.lookahead

    @classmethod
    def of(cls, options: Mapping[str, Any], default: WindowParams | None = None) -> WindowParams:
        base = asdict(default or cls())
        base.update({k: int(v) for k, v in options.items() if k in cls.__dataclass_fields__})
        return cls(**base)


#: NeuTTS' scheme: 25-frame chunks, 50 frames back, 5 ahead, 1 overlap frame each side
DEFAULT_WINDOW = WindowParams()
#: latency "low": 10-frame chunks, 2 frames ahead (12 frames before the first audio), 25 back
#: (so a window decodes about as many frames per output frame as NeuTTS' default: 3.6 vs 3.0)
LOW_WINDOW = WindowParams(chunk=10, lookback=25, lookahead=2, overlap=1)


#: bounds of a window a client asks for (``start.window``): frames in one window decode
#: (lookback + overlap + chunk + lookahead), and frames decoded per frame of output
#: (that sum over the chunk), so that no stream can make its model decode without end
MAX_WINDOW_FRAMES = 256
MAX_WINDOW_COST = 8


def _client_window(fields: Mapping[str, Any], presets: Mapping[str, WindowParams],
                   base: WindowParams) -> WindowParams:
    """The window of ``start.window`` (``fields``: ``preset`` and frames overriding it; no preset:
    ``base``, the one the latency picked); ValueError naming what is wrong."""
    name = fields.get("preset")
    if name is not None:
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(presets)}")
        base = presets[name]
    win = WindowParams.of({k: v for k, v in fields.items() if k != "preset"}, base)
    if win.steady_frames > MAX_WINDOW_FRAMES:
        raise ValueError(f"lookback + overlap + chunk + lookahead = {win.steady_frames} frames, "
                         f"more than {MAX_WINDOW_FRAMES}")
    if win.steady_frames > MAX_WINDOW_COST * win.chunk:
        raise ValueError(f"a window of {win.steady_frames} frames for a chunk of {win.chunk} "
                         f"decodes more than {MAX_WINDOW_COST} frames per frame it outputs")
    return win


def _triangle(n: int) -> F32:
    """NeuTTS' overlap-add weights of a piece of n samples (float32)."""
    t = np.linspace(0, 1, n + 2, dtype=np.float32)[1:-1]
    w: F32 = (np.float32(0.5) - np.abs(t - np.float32(0.5))).astype(np.float32)
    return w


class _Pieces:
    """The windowed decode's bookkeeping for one utterance (shared by the offline
    reference and the stream, so that both compute the same samples)."""

    def __init__(self, params: WindowParams, hop: int) -> None:
        self.p = params
        self.hop = hop
        self.codes = np.zeros(0, dtype=np.int32)  # codes from frame `base` on
        self.base = 0                    # codes before it are no window's any more: dropped
        self.finished = False
        self.first = 0                   # codes before it are left context only (a prompt)
        self.k = 0                       # regular pieces decoded
        self.frames_final = 0            # frames (from `first` on) whose samples are final
        self.final_done = False
        self.held = np.zeros(0, dtype=np.float32)    # previous piece's overlap samples
        self.held_w = np.zeros(0, dtype=np.float32)  # and their weights

    @property
    def n(self) -> int:
        """Codes pushed so far."""
        return self.base + int(self.codes.size)

    def append(self, codes: I32) -> None:
        self.codes = np.concatenate([self.codes, codes]) if self.codes.size else codes

    def slice(self, start: int, end: int) -> I32:
        return self.codes[start - self.base:end - self.base]

    @property
    def done(self) -> bool:
        return self.finished and (self.final_done or self.frames_final >= self.n)

    def set_prefix(self, codes: I32) -> None:
        """Codes before the utterance (NeuTTS' voice prompt): left context, never output."""
        self.append(codes)
        self.first = self.frames_final = int(codes.size)

    def window(self) -> tuple[int, int] | None:
        """The next piece's window [start, end) of codes, or None if it cannot be decoded yet."""
        if self.done:
            return None
        p, s, n = self.p, self.first + self.k * self.p.chunk, self.n
        start = max(s - p.lookback - p.overlap, 0)
        if n - s >= p.chunk + p.lookahead:
            return start, s + p.chunk + p.lookahead
        if self.finished and n > s:
            return start, n
        return None

    def apply(self, start: int, end: int, pcm: F32) -> F32:
        """Place the decode ``pcm`` of window [start, end): the samples it makes final."""
        p, hop = self.p, self.hop
        if pcm.shape != ((end - start) * hop,):
            raise ValueError(f"window of {end - start} frames decoded to {pcm.shape} samples")
        s = self.first + self.k * p.chunk
        final = end - s < p.chunk + p.lookahead
        e = end if final else s + p.chunk + 2 * p.overlap
        piece = np.array(pcm[(s - start) * hop:(e - start) * hop], dtype=np.float32)
        h = min(self.held.size, piece.size)
        if h:
            w = _triangle(piece.size)
            piece[:h] = (self.held_w[:h] * self.held[:h] + w[:h] * piece[:h]) \
                / (self.held_w[:h] + w[:h])
        if final:
            self.final_done = True
            self.frames_final = end
            self.held = self.held_w = np.zeros(0, dtype=np.float32)
            return piece
        keep = p.chunk * hop
        self.held = piece[keep:].copy()
        self.held_w = _triangle(piece.size)[keep:].copy()
        self.frames_final = s + p.chunk
        self.k += 1
        drop = max(self.first + self.k * p.chunk - p.lookback - p.overlap, 0) - self.base
        if drop > 0:  # the next window starts there: keep the codes bounded
            self.codes = self.codes[drop:].copy()
            self.base += drop
        return piece[:keep]


def windowed_decode(decode: Callable[[I32], F32], codes: npt.ArrayLike, hop: int,
                    params: WindowParams = DEFAULT_WINDOW, n_prefix: int = 0) -> F32:
    """The windowed decode of a whole utterance ``codes`` [N] (the module's definition):
    ``decode(window_codes) -> pcm`` decodes one window offline (``Context.decode``).
    ``codes[:n_prefix]`` are left context only (NeuTTS' voice prompt): pieces start at
    frame ``n_prefix`` and the output has ``(N - n_prefix) * hop`` samples."""
    pc = _Pieces(params, hop)
    c = np.ascontiguousarray(np.asarray(codes, dtype=np.int32).reshape(-1))
    if not 0 <= n_prefix <= c.size:
        raise ValueError(f"n_prefix {n_prefix} outside 0..{c.size}")
    pc.set_prefix(c[:n_prefix])
    pc.append(c[n_prefix:])
    pc.finished = True
    out: list[F32] = []
    while (win := pc.window()) is not None:
        a, b = win
        out.append(pc.apply(a, b, np.asarray(decode(pc.slice(a, b)), dtype=np.float32)))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


# ------------------------------------------------------------------ streams


class WindowedStream:
    """A windowed stream on a ``codecrt.Context`` (the stream protocol, ``codecrt.CodecStream``).

    One level of codes in ``[0, codebook_size)``; output as the module's definition,
    equal to :func:`windowed_decode` of the same codes and window. ``prefix``: codes
    before the utterance (NeuTTS' voice prompt codes), left context never output."""

    def __init__(self, ctx: Any, params: WindowParams = DEFAULT_WINDOW,
                 prefix: npt.ArrayLike | None = None) -> None:
        info = ctx.model_info
        if info.n_levels != 1:
            raise ValueError(f"windowed streams take one level of codes, the model has "
                             f"{info.n_levels}")
        self._ctx = ctx
        self.params = params
        self.hop = int(info.hop_length)
        self.codebook_size = int(info.codebook_sizes[0])
        self._pc = _Pieces(params, self.hop)
        self._ready_pcm: list[F32] = []
        self._closed = False
        if prefix is not None:
            self._pc.set_prefix(self._checked([prefix], 0))

    stepper: ClassVar[Callable[[Any, Sequence[Any]], Any]]

    @property
    def latency_samples(self) -> int:
        return self.params.latency_frames * self.hop

    def push(self, levels: Sequence[npt.ArrayLike], /) -> None:
        import codecrt

        if self._closed:
            raise codecrt.StateError("the stream is closed")
        if self._pc.finished:
            raise codecrt.StateError("codes pushed after finish()")
        a = self._checked(levels, self._pc.n)
        if a.size:
            self._pc.append(a)

    def _checked(self, levels: Sequence[npt.ArrayLike], at: int) -> I32:
        import codecrt

        if len(levels) != 1:
            raise codecrt.CodeShapeError(f"expected 1 level of codes, got {len(levels)}")
        a = np.asarray(levels[0])
        if a.ndim != 1:
            raise codecrt.CodeShapeError(f"codes must be 1-D, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise codecrt.CodeTypeError(f"codes must be integers, got dtype {a.dtype}")
        bad = np.flatnonzero((a < 0) | (a >= self.codebook_size))
        if bad.size:
            j = int(bad[0])
            raise codecrt.CodeRangeError(f"code {int(a[j])} at index {at + j} is outside "
                                         f"[0, {self.codebook_size})")
        return a.astype(np.int32)

    def finish(self) -> None:
        import codecrt

        if self._closed:
            raise codecrt.StateError("the stream is closed")
        self._pc.finished = True

    def pull(self) -> F32:
        if not self._ready_pcm:
            return np.zeros(0, dtype=np.float32)
        out = self._ready_pcm[0] if len(self._ready_pcm) == 1 else np.concatenate(self._ready_pcm)
        self._ready_pcm = []
        return out

    def _window(self) -> tuple[int, int] | None:
        return None if self._closed else self._pc.window()

    def _apply(self, start: int, end: int, pcm: F32) -> None:
        out = self._pc.apply(start, end, pcm)
        if out.size:
            self._ready_pcm.append(out)

    @property
    def stats(self) -> Any:
        import codecrt

        pc = self._pc
        done = pc.done
        return codecrt.StreamStats(frames_pushed=pc.n - pc.first,
                                   frames_decoded=pc.frames_final - pc.first,
                                   total_samples=(pc.n - pc.first) * self.hop if done else -1,
                                   finished=pc.finished, ready=self._window() is not None,
                                   done=done)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._ready_pcm = []


def step_windows(ctx: Any, streams: Sequence[WindowedStream]) -> Any:
    """One piece for every ready stream of ``streams`` (all on ``ctx``): their windows of one
    length decoded together, at most ``ctx.max_batch`` per ``Context.decode``. A failed
    batch is retried window by window, so an error stays with its stream."""
    import codecrt

    if len({id(s) for s in streams}) != len(streams):
        raise codecrt.InputError("a stream appears twice")
    plans: dict[int, tuple[int, int]] = {}
    for i, s in enumerate(streams):
        if s._ctx is not ctx:
            raise codecrt.InputError("every stream must belong to ctx")
        if (w := s._window()) is not None:
            plans[i] = w
    by_len: dict[int, list[int]] = {}
    for i, (a, b) in plans.items():
        by_len.setdefault(b - a, []).append(i)
    errors: dict[int, Any] = {}
    largest, stepped = 0, 0
    limit = max(1, int(ctx.max_batch))
    for group in by_len.values():
        for j in range(0, len(group), limit):
            part = group[j:j + limit]
            largest = max(largest, len(part))
            wins = [streams[i]._pc.slice(*plans[i]) for i in part]
            try:
                pcm = ctx.decode([np.stack(wins)])
                results = {i: pcm[r] for r, i in enumerate(part)}
            except codecrt.CodecrtError:
                results = {}
                for i, win in zip(part, wins):
                    try:
                        results[i] = ctx.decode([win])
                    except codecrt.CodecrtError as e:
                        errors[i] = e
            for i, pcm_i in results.items():
                streams[i]._apply(plans[i][0], plans[i][1], pcm_i)
                stepped += 1
    return codecrt.Tick(stepped, errors, largest)


WindowedStream.stepper = staticmethod(step_windows)


# ------------------------------------------------------------------ worker side


class WindowedModel(LoadedModel):
    """A non-causal model in a worker: one context, windowed streams (exact: ``window``;
    low latency: ``low_window``), optionally led by a voice's prompt codes (left context)."""

    def __init__(self, name: str, model: Any, config: Any, device: str,
                 window: WindowParams = DEFAULT_WINDOW,
                 low_window: WindowParams | None = LOW_WINDOW, precision: str = "f32") -> None:
        self.name = name
        self.model = model
        self.config = config
        self.window = window
        self.low_window = low_window
        self.ctx = make_context(model, config, device, precision)
        self.chunk_frames = window.chunk
        self.latency_samples = window.latency_frames * model.info.hop_length
        self.voices = self._load_voices()

    def _load_voices(self) -> dict[str, Any]:
        """The configured prompt-codes voices of this model's architecture (name -> codes);
        others (S3Gen voices, other codecs') are skipped, unreadable ones logged."""
        from .voices import VoiceError, read_voice

        info = self.model.info
        out: dict[str, Any] = {}
        for name, path in sorted(self.config.voices.items()):
            try:
                d = read_voice(path)
            except VoiceError as e:
                logger.warning("voice %r (%s) skipped for model %s: %s", name, path, self.name, e)
                continue
            if d.model_arch != info.arch:
                continue
            if int(d.prompt_tokens.max()) >= info.codebook_sizes[0]:
                logger.warning("voice %r (%s) skipped for model %s: codes beyond its %d", name,
                               path, self.name, info.codebook_sizes[0])
                continue
            out[name] = d.prompt_tokens
        return out

    def warm(self) -> dict[str, Any]:
        """Reserve the buffers of the longest window at the largest batch bucket (the envelope
        every later window fits: shorter windows, smaller batches), then decode one window at
        batch 1 (a lone stream's first graph). Reserving instead of decoding the largest batch
        spares a large CPU model a minute of start-up."""
        cfg = self.config
        cap = min(cfg.max_batch, cfg.max_streams)
        buckets = list(cfg.warm_buckets or default_buckets(cfg.max_batch, cfg.max_streams))
        buckets = sorted({b for b in buckets if 1 <= b <= cap}, reverse=True)
        frames = max(self.window.steady_frames,
                     self.low_window.steady_frames if self.low_window else 0)
        t0 = time.perf_counter()
        for b in buckets:
            self.ctx.reserve(frames, b)
        self.ctx.decode([np.zeros(frames, dtype=np.int32)])
        st = self.ctx.stats
        self.warm_info = {"buckets": buckets, "window_frames": frames,
                          "ms": round((time.perf_counter() - t0) * 1e3, 3),
                          "graphs_built": st.graphs_built, "reservations": st.reservations,
                          "compute_buffer_bytes": list(st.compute_buffer_bytes)}
        return self.warm_info

    def params_for(self, options: Any) -> WindowParams:
        """The window of a stream opened with ``options`` (``codecd.wire.StreamOptions``)."""
        base = self.low_window if options.latency == "low" and self.low_window else self.window
        extra = getattr(options, "extra", None) or {}
        try:
            return WindowParams.of(extra, base)
        except (TypeError, ValueError) as e:
            raise StreamRefused("bad_window", f"window options: {e}") from None

    def open_stream(self, options: Any) -> tuple[Any, int]:
        prefix = None
        if options.voice is not None:
            prefix = self.voices.get(options.voice)
            if prefix is None:
                raise StreamRefused("unknown_voice", f"model {self.name!r} has no voice "
                                    f"{options.voice!r}; voices: {', '.join(self.voices) or 'none'}")
        s = WindowedStream(self.ctx, self.params_for(options), prefix=prefix)
        return s, s.latency_samples

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


class WindowedFamily(Family):
    """A family of non-causal decoders streamed by windows (WavTokenizer, NeuCodec, XCodec2).
    Streams: "exact" gets :data:`DEFAULT_WINDOW` (NeuTTS' scheme), "low" :data:`LOW_WINDOW`;
    ``start.window`` picks a preset by name ("default", "low") and/or sets its frames, within
    :data:`MAX_WINDOW_FRAMES` and :data:`MAX_WINDOW_COST` (else ``bad_window``)."""

    window: ClassVar[WindowParams] = DEFAULT_WINDOW
    low_window: ClassVar[WindowParams | None] = LOW_WINDOW
    takes_window: ClassVar[bool] = True
    precisions: ClassVar[tuple[str, ...]] = ("f32", "bf16", "bf16x3")  # the runtime's vocos BF16 products

    def presets(self) -> dict[str, WindowParams]:
        """The windows a start may name (``start.window.preset``)."""
        return {"default": self.window, **({"low": self.low_window} if self.low_window else {})}

    def describe(self, spec: ModelSpec) -> dict[str, Any]:
        """The hello's entry, with the window presets (frames) a start may name."""
        return {**super().describe(spec), "windows": {k: asdict(w) for k, w in self.presets().items()}}

    def model_spec(self, name: str, info: Mapping[str, Any]) -> ModelSpec:
        spec = super().model_spec(name, info)
        if self.low_window is None:
            return spec
        from dataclasses import replace

        low = self.low_window.latency_frames * spec.hop_length
        return replace(spec, low_latency_samples=low if low < spec.latency_samples else None)

    def plan_stream(self, spec: ModelSpec, start: Any) -> StreamPlan:
        plan = super().plan_stream(spec, start)
        win = self.low_window if plan.latency == "low" and self.low_window else self.window
        if start.window is not None:
            try:
                win = _client_window(start.window, self.presets(), win)
            except (TypeError, ValueError) as e:
                raise StreamRefused("bad_window", f"model {spec.name!r}: window: {e}") from None
        return StreamPlan(plan.latency, win.latency_frames * spec.hop_length, chunk_frames=win.chunk,
                          options=asdict(win))

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        return WindowedModel(name, model, config, device, self.window, self.low_window,
                             precision=self.precision_of(name, config))
