"""The family interface: everything codecd knows about one kind of codec, in one module.

The runtime describes any model generically (``codecrt.ModelInfo``: sample rate,
hop length, levels, codebooks, strides). What it does not say lives in a
*family*, one module per kind of codec (``families/snac.py``, ``families/s3gen.py``),
registered in the one table of ``codecd/families/__init__.py``. The daemon's
layers ask the family and never branch on a model kind::

    daemon process (front)
      server    family.engine_options(config)  -> EngineConfig.family_options[name]
                family.model_spec(name, info)  -> ModelSpec (from the worker's hello)
      session   spec.layouts -> Layout.assembler()   (tokens -> per-level codes)
                family.plan_stream(spec, start) -> StreamPlan, or StreamRefused
      hello     family.describe(spec)

    worker process (one per device)
      load      family.load(name, model, config, device) -> LoadedModel
                  .warm()            its warm-up shapes
                  .describe()        its model info for the hello
                  .open_stream(opts) a stream of the one protocol (codecrt.CodecStream)
      ticks     codecrt.step(ctx, streams): every kind of stream alike

What a family declares (class attributes and methods of :class:`Family`):

* ``name``, the ``architectures`` it claims (GGUF ``general.architecture``) and its
  ``converter`` (the entry of ``codecd.convert.ARCHITECTURES``);
* its code ``layouts`` (:mod:`codecd.families.layout`): how a language model's
  tokens become per-level codes, which of them fit a loaded model;
* whether a model needs a voice, its sample rate and frame rate, its latency
  and the low-latency option where it has one: :meth:`Family.model_spec`
  turns the worker's model info into the :class:`ModelSpec` the session uses;
* what a ``start`` asks of a model (:meth:`Family.plan_stream`): the latency
  granted, the options the worker opens the stream with, or a refusal;
* its settings from the daemon's configuration (:meth:`Family.engine_options`),
  handed to the workers inside the one engine configuration;
* the ``precisions`` of products its models' contexts can take (``bf16`` where
  the runtime has BF16 products for its architectures) and the one a model is
  asked to run in (:meth:`Family.precision_of`); the worker refuses a model
  asked for one its family lacks (:func:`codecd.families.load_model`), and
  :meth:`Family.load` makes the context in :meth:`Family.precision_of`'s;
* in the worker, :meth:`Family.load` returns a :class:`LoadedModel`: how its
  context is made, its warm-up shapes (:meth:`LoadedModel.warm`), what the hello
  says about it (:meth:`LoadedModel.describe`) and how a stream is opened
  (:meth:`LoadedModel.open_stream`). Streams are stepped by the worker's one
  loop through ``codecrt.step``: each kind of stream brings its own stepper.

How the codecs to come fit, without touching server, session, engine or worker:

* a causal stateful codec with exact streaming (Mimi, DAC, WavTokenizer): the
  runtime's ``codecrt.Stream``; a number of codebooks fixed per stream at
  ``start`` is a :meth:`Family.plan_stream` that reads it from the start and
  returns the stream's ``n_levels`` (the session then takes and checks that many
  levels) and its worker ``options``, and an
  ``open_stream`` that passes it to the runtime's stream parameters;
* a windowed attention codec (WavTokenizer, NeuCodec, XCodec2): a stream class
  of its own (:mod:`codecd.families.windowed`: overlapping windows, an
  overlap-add; its own stepper batching equal windows), opened by
  ``open_stream`` with the window of the plan's ``options``;
  :meth:`Family.plan_stream` reports the latency it implies.

Adding a codec: the runtime's C file and its registration, a converter module
(``codecd/convert``), a family module here with its entry in the table, its
tests and its docs page.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .layout import LEVELS, Layout, get_layout, layout_names

if TYPE_CHECKING:
    from ..protocol import Start

__all__ = ["Family", "LoadedModel", "ModelSpec", "StreamPlan", "StreamRefused"]


# ------------------------------------------------------------------ front side


@dataclass(frozen=True)
class ModelSpec:
    """What the session needs to know of a loaded model.

    ``level_strides[l]`` is the number of finest-level frames per code of level
    ``l`` (SNAC 24 kHz: 4, 2, 1); one finest frame is ``hop_length`` samples at
    ``sample_rate``. ``latency_samples`` is the decoder's look-ahead in exact
    mode, ``low_latency_samples`` in low mode (None: low mode not offered, a
    ``latency: low`` start gets exact). ``voices`` empty: the model has none;
    ``needs_voice``: every start must name one of them.
    """

    name: str
    arch: str
    sample_rate: int
    hop_length: int
    n_levels: int
    codebook_sizes: tuple[int, ...]
    level_strides: tuple[int, ...]
    layouts: tuple[str, ...] = ("levels",)
    latency_samples: int = 0
    low_latency_samples: int | None = None
    voices: tuple[str, ...] = ()
    needs_voice: bool = False
    precision: str = "f32"  # of the model's products: "f32", "bf16" or "bf16x3"
    chunk_frames: int = 0  # frames a stream's decoder steps at once (it may hold one back)

    def __post_init__(self) -> None:
        if len(self.codebook_sizes) != self.n_levels or len(self.level_strides) != self.n_levels:
            raise ValueError(f"{self.name}: codebook_sizes and level_strides need "
                             f"{self.n_levels} entries")
        bad = set(self.layouts) - set(layout_names())
        if bad:
            raise ValueError(f"{self.name}: unknown layouts {sorted(bad)}")
        for name in self.layouts:
            problem = get_layout(name).check(self.n_levels, self.codebook_sizes, self.level_strides)
            if problem:
                raise ValueError(f"{self.name}: {problem}")

    @property
    def codes_per_frame(self) -> float:
        """Codes of all levels per finest-level frame (Orpheus: 7/4)."""
        return sum(1.0 / s for s in self.level_strides)

    @property
    def frame_rate(self) -> float:
        """Finest-level frames per second."""
        return self.sample_rate / self.hop_length

    def describe(self) -> dict[str, Any]:
        """The model's entry in the server's hello."""
        return {"name": self.name, "arch": self.arch, "sample_rate": self.sample_rate,
                "n_levels": self.n_levels, "layouts": list(self.layouts),
                "voices": list(self.voices), "precision": self.precision}


class StreamRefused(Exception):
    """A start the model cannot take; ``code`` is the protocol error code for the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StreamPlan:
    """What a start gets: the latency mode granted and its lag in model samples, the
    levels the stream sends (the model's first ``n_levels``; None: all of them), and the
    family's own options for the worker's :meth:`LoadedModel.open_stream`."""

    latency: str = "exact"
    latency_samples: int = 0
    n_levels: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: frames per step of this stream where it is its own (a windowed stream's chunk); None:
    #: the model's ``chunk_frames``
    chunk_frames: int | None = None


class Family(ABC):
    """One kind of codec (see the module docstring). Subclasses are stateless singletons."""

    #: the family's name (also its key in engine options)
    name: ClassVar[str]
    #: the GGUF ``general.architecture`` values it claims
    architectures: ClassVar[tuple[str, ...]]
    #: its entry in ``codecd.convert.ARCHITECTURES``
    converter: ClassVar[str]
    #: every layout it may offer, in the order the hello lists them
    layouts: ClassVar[tuple[Layout, ...]] = (LEVELS,)
    #: every start must name a voice
    needs_voice: ClassVar[bool] = False
    #: its streams take ``start.window`` (windowed decoders); others refuse it
    takes_window: ClassVar[bool] = False
    #: the precisions of products its models' contexts take (``codecrt.Context(precision=)``):
    #: "bf16" and "bf16x3" only where the runtime has BF16 products for its architectures
    precisions: ClassVar[tuple[str, ...]] = ("f32",)

    # ---------------------------------------------------------- front (daemon)

    def model_spec(self, name: str, info: Mapping[str, Any]) -> ModelSpec:
        """The session's view of a loaded model, from the worker's model info."""
        sizes = tuple(int(c) for c in info["codebook_sizes"])
        strides = tuple(int(s) for s in info["level_strides"])
        fits = tuple(lay.name for lay in self.layouts
                     if lay.check(len(strides), sizes, strides) is None)
        exact = int(info.get("latency_samples", 0))
        return ModelSpec(name=name, arch=str(info.get("arch", "")),
                         sample_rate=int(info["sample_rate"]), hop_length=int(info["hop_length"]),
                         n_levels=len(strides), codebook_sizes=sizes, level_strides=strides,
                         layouts=fits, latency_samples=exact,
                         low_latency_samples=self.low_latency_samples(exact),
                         voices=tuple(info.get("voices", ())), needs_voice=self.needs_voice,
                         precision=str(info.get("precision", "f32")),
                         chunk_frames=int(info.get("chunk_frames", 0)))

    def low_latency_samples(self, exact_latency: int) -> int | None:
        """The lag of a "low" latency stream (a shorter lookahead, finalized by a crossfade)
        for a model whose exact streams lag ``exact_latency`` samples; None: no low mode."""
        return None

    def plan_stream(self, spec: ModelSpec, start: Start) -> StreamPlan:
        """What ``start`` gets from this model; :class:`StreamRefused` if it cannot have it.

        The default: a named voice must be one of the model's, a model that needs a
        voice needs one named, and "low" latency is granted where the model has it
        (otherwise exact)."""
        if start.voice is not None and start.voice not in spec.voices:
            raise StreamRefused("unknown_voice",
                                f"model {spec.name!r} has no voice {start.voice!r}; voices: "
                                f"{', '.join(spec.voices) or 'none'}")
        if start.window is not None and not self.takes_window:
            raise StreamRefused("bad_window", f"model {spec.name!r} does not stream by windows: "
                                              "'window' is for windowed models (hello: models[].windows)")
        if start.voice is None and spec.needs_voice:
            raise StreamRefused("unknown_voice",
                                f"model {spec.name!r} needs a voice: start with \"voice\": one of "
                                f"{', '.join(spec.voices) or 'none (the server has no voices)'}")
        if start.latency == "low" and spec.low_latency_samples is not None:
            return StreamPlan("low", spec.low_latency_samples)
        return StreamPlan("exact", spec.latency_samples)

    def describe(self, spec: ModelSpec) -> dict[str, Any]:
        """The model's entry in the server's hello."""
        return spec.describe()

    def precision_of(self, name: str, config: Any) -> str:
        """The precision of products model ``name`` is asked to run in: its entry in the engine
        configuration's ``precisions`` (f32 when it has none). :meth:`load` makes its context
        in this precision; the worker refuses it first when it is not in ``precisions``."""
        return str(config.precisions.get(name, "f32"))

    def engine_options(self, config: Any) -> dict[str, Any]:
        """This family's settings from the daemon's ``codecd.config.Config``, for the workers
        (JSON-able; they reach :meth:`load` as ``config.family_options[name]``)."""
        return {}

    # ---------------------------------------------------------- worker

    @abstractmethod
    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        """In the worker: the loaded ``codecrt.Model`` served as ``name``, ready to warm up and
        serve. ``config`` is the engine's configuration, ``device`` the worker's."""


class LoadedModel(ABC):
    """One model in one worker: its context(s) and how its streams are opened."""

    #: the name it is served as, the ``codecrt.Model``, the engine configuration
    name: str
    model: Any
    config: Any
    #: the context the model's streams run on (``codecrt.step(ctx, streams)``)
    ctx: Any
    #: frames (flow models: tokens) per step of a stream, and an exact stream's lag in samples
    chunk_frames: int = 0
    latency_samples: int = 0
    #: what :meth:`warm` did
    warm_info: dict[str, Any]
    #: the voices its streams may name (name -> ``codecrt.Voice``), and whether one is required
    voices: Mapping[str, Any] = {}
    needs_voice: bool = False

    @abstractmethod
    def warm(self) -> dict[str, Any]:
        """Build and reserve the graphs a stream will need (its warm-up shapes); what was done."""

    def describe(self) -> dict[str, Any]:
        """The model's info for the worker's ``ready`` message (JSON-able);
        :meth:`Family.model_spec` reads it back in the daemon."""
        info, ctx = self.model.info, self.ctx
        return {
            "path": self.model.path,
            "device": ctx.device,
            "precision": ctx.precision,
            "arch": info.arch,
            "sample_rate": info.sample_rate,
            "hop_length": info.hop_length,
            "n_levels": info.n_levels,
            "codebook_sizes": list(info.codebook_sizes),
            "level_strides": list(info.level_strides),
            "frame_multiple": info.frame_multiple,
            "chunk_frames": self.chunk_frames,
            "latency_samples": self.latency_samples,
            "max_streams": self.config.max_streams,
            "warm": dict(getattr(self, "warm_info", {})),
            "needs_voice": self.needs_voice,
            "voices": sorted(self.voices),
            "batched": True,  # flow streams: where their chunks' shapes agree
        }

    @abstractmethod
    def open_stream(self, options: Any) -> tuple[Any, int]:
        """A new stream (a ``codecrt.CodecStream``) for ``options`` (``codecd.wire.StreamOptions``)
        and its latency in samples. Raises :class:`StreamRefused` or a ``codecrt.CodecrtError``."""

    @abstractmethod
    def close(self) -> None:
        """Free the context(s) and anything else the model holds."""
