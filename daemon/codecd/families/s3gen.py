"""The S3Gen family (Chatterbox's speech-token decoder): flow matching and a vocoder, with a voice.

* architectures: ``s3gen`` (the original flow and the MeanFlow "Turbo"
  variant); converter ``s3gen``;
* layouts: per-level codes (one level of 6561 speech tokens) and Chatterbox
  T3 ids (``chatterbox_ids``: start and stop ids, the stop ends the stream);
* every stream needs a voice (the daemon's voice files, :mod:`codecd.families.voices`);
* streams: chunked (``codecrt.FlowStream``: exact streaming is impossible
  with full attention), first chunk and chunk sizes, flow steps and the
  products' precision from the daemon's ``flow_*`` settings; no low-latency mode;
* warm-up: one short stream through the first voice (chunk graphs have
  per-stream shapes: this pays the first constructions and reservations).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from .base import Family, LoadedModel, StreamRefused
from .chatterbox import CHATTERBOX_IDS
from .layout import LEVELS, Layout
from .native import make_context

__all__ = ["S3GenFamily", "FlowOptions", "FlowModel"]

logger = logging.getLogger(__name__)

#: tokens of right context of the encoder (codecrt.FlowStream's LOOKAHEAD), and mel
#: frames held back at each chunk boundary for the next crossfade (its MEL_CACHE)
_LOOKAHEAD_TOKENS = 3
_HELD_MEL_FRAMES = 8


@dataclass(frozen=True)
class FlowOptions:
    """The family's settings (the daemon's ``flow_*``), as the workers get them."""

    first_chunk: int = 10  # tokens of a stream's first chunk (time to first audio)
    chunk: int = 25  # tokens of its later chunks (the fewest each waits for)
    chunk_growth: float = 1.0  # later chunk k takes up to min(max_chunk, chunk * growth^(k-1)) tokens
    max_chunk: int = 0  # the most a grown chunk takes (0: 4 x chunk)
    steps: int = 0  # flow steps per chunk (0: the model's default)
    precision: str = "f32"  # products of the context: "f32", "bf16" or "bf16x3"

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> FlowOptions:
        return cls(**{k: v for k, v in options.items() if k in cls.__dataclass_fields__})


class S3GenFamily(Family):
    name = "s3gen"
    architectures = ("s3gen",)
    converter = "s3gen"
    layouts: ClassVar[tuple[Layout, ...]] = (LEVELS, CHATTERBOX_IDS)
    needs_voice = True
    precisions: ClassVar[tuple[str, ...]] = ("f32", "bf16", "bf16x3")

    def engine_options(self, config: Any) -> dict[str, Any]:
        return {"first_chunk": config.flow_first_chunk, "chunk": config.flow_chunk,
                "chunk_growth": config.flow_chunk_growth, "max_chunk": config.flow_max_chunk,
                "steps": config.flow_steps, "precision": config.flow_precision}

    def precision_of(self, name: str, config: Any) -> str:
        """``flow_precision`` when it is not f32 (every S3Gen model's, the setting that came
        first), else the model entry's."""
        flow = FlowOptions.of(config.family_options.get(self.name, {})).precision
        return flow if flow != "f32" else super().precision_of(name, config)

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        options = FlowOptions.of(config.family_options.get(self.name, {}))
        return FlowModel(name, model, config, device,
                         replace(options, precision=self.precision_of(name, config)))


class FlowModel(LoadedModel):
    """An S3Gen model in a worker: its context, its voices, chunked streams."""

    needs_voice = True

    def __init__(self, name: str, model: Any, config: Any, device: str,
                 options: FlowOptions) -> None:
        self.name = name
        self.model = model
        self.config = config
        self.options = options
        self.ctx = make_context(model, config, device, precision=options.precision)
        info = model.info
        self.chunk_frames = options.chunk
        # the first audio needs first_chunk + lookahead tokens; the last mel frames of
        # each chunk wait for the next one's crossfade
        self.latency_samples = ((options.first_chunk + _LOOKAHEAD_TOKENS) * info.hop_length
                                + _HELD_MEL_FRAMES * info.mel_hop)
        self._warn_if_growth_is_paced(info)
        self.voices = self._load_voices()

    def _warn_if_growth_is_paced(self, info: Any) -> None:
        """Growing chunks need codes ahead of real time; the server's pacing (max_ahead_s) and
        each connection's output budget (output_budget_s) hand the worker at most that much."""
        import codecrt

        o, c = self.options, self.config
        if o.chunk_growth <= 1.0:
            return
        largest = o.max_chunk or codecrt.FlowStream.default_max_chunk(o.chunk)
        largest_s = largest * info.hop_length / info.sample_rate
        limits = [f"{k} = {getattr(c, k):g} s" for k in ("max_ahead_s", "output_budget_s")
                  if 0 < getattr(c, k) < largest_s]
        if limits:
            logger.warning("model %s: flow_chunk_growth %g asks chunks of up to %.1f s of audio, but %s "
                           "hand the worker less than that ahead of real time: chunks stay smaller "
                           "(docs/s3gen.md, growing chunks)", self.name, o.chunk_growth, largest_s,
                           " and ".join(limits))

    def _load_voices(self) -> dict[str, Any]:
        """The configured voices usable with this model (others are logged and skipped)."""
        import codecrt

        from .voices import VoiceError, read_voice

        out: dict[str, Any] = {}
        for name, path in sorted(self.config.voices.items()):
            try:
                d = read_voice(path)
                if d.model_arch != self.model.info.arch:
                    raise VoiceError(f"it is a voice for {d.model_arch!r} models")
                out[name] = codecrt.Voice(self.model, d.prompt_tokens, d.prompt_mel, d.speaker,
                                          name=name)
            except (VoiceError, codecrt.CodecrtError) as e:
                logger.warning("voice %r (%s) skipped for model %s: %s", name, path, self.name, e)
        if not out:
            logger.warning("model %s needs a voice and has none: its streams will be refused "
                           "(codecd voice add NAME conds.pt)", self.name)
        return out

    def warm(self) -> dict[str, Any]:
        """One short stream through the first voice (or a silent one)."""
        import codecrt

        info, o = self.model.info, self.options
        t0 = time.perf_counter()
        voice = next(iter(self.voices.values()), None)
        own = None
        if voice is None:
            own = voice = codecrt.Voice(self.model, np.zeros(0, np.int32),
                                        np.zeros((0, info.n_mels), np.float32),
                                        np.ones(192, np.float32))
        try:
            fs = codecrt.FlowStream(self.ctx, voice, first_chunk=o.first_chunk, chunk=o.chunk,
                                    **self._growth(), n_steps=o.steps)
            fs.push(np.zeros(o.first_chunk + o.chunk + _LOOKAHEAD_TOKENS, dtype=np.int32))
            fs.finish()
            fs.decode_all()
        finally:
            if own is not None:
                own.close()
        st = self.ctx.stats
        self.warm_info = {"flow": True, "ms": round((time.perf_counter() - t0) * 1e3, 3),
                          "graphs_built": st.graphs_built, "reservations": st.reservations,
                          "compute_buffer_bytes": list(st.compute_buffer_bytes)}
        return self.warm_info

    def open_stream(self, options: Any) -> tuple[Any, int]:
        import codecrt

        v = self.voices.get(options.voice) if options.voice is not None else None
        if v is None:
            have = ", ".join(self.voices) or "none (codecd voice add NAME conds.pt)"
            what = f"has no voice {options.voice!r}" if options.voice is not None \
                else "needs a voice"
            raise StreamRefused("unknown_voice", f"model {self.name!r} {what}; voices: {have}")
        o = self.options
        fs = codecrt.FlowStream(self.ctx, v, seed=options.seed, first_chunk=o.first_chunk,
                                chunk=o.chunk, **self._growth(), n_steps=o.steps)
        return fs, self.latency_samples

    def _growth(self) -> dict[str, Any]:
        """FlowStream's chunk_growth and max_chunk from the options (max_chunk 0: its default)."""
        o = self.options
        return {"chunk_growth": o.chunk_growth, "max_chunk": o.max_chunk or None}

    def close(self) -> None:
        for v in self.voices.values():
            v.close()
        self.ctx.close()
        self.model.close()
