"""The engine's configuration: one object for the pool, its engines and their workers.

The daemon builds one :class:`EngineConfig`; every worker receives it whole
(serialised once, :meth:`EngineConfig.to_json`), with its device and index
beside it. Settings that belong to one family of codecs travel in
``family_options`` under the family's name (``codecd.families``), so the engine
and the worker carry them without knowing what they mean.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by every worker of a pool (the device is per worker)."""

    models: dict[str, str]  # model name -> GGUF path
    #: model name -> the precision of its products ("f32", "bf16"; absent: "f32"), asked of
    #: its family in the worker (codecd.families.load_model)
    precisions: dict[str, str] = field(default_factory=dict)
    n_threads: int = 0  # CPU threads per context (0: all cores); split them over CPU workers
    max_streams: int = 64  # per model per worker (the runtime's slot pool)
    max_batch: int = 64  # streams per tick
    stream_chunk_frames: int = 0  # 0: the model's default (its frame_multiple)
    #: the tick graph's batch rounded up to a power of two (True) or exact (False; None, the
    #: daemon's batch_shapes = auto, is exact too); the daemon always passes its setting, this
    #: default is for EnginePools built directly (tests, benches)
    batch_bucket: bool | None = True
    #: batch buckets warmed at start-up; None: the largest and 1
    #: (codecd.families.native.default_buckets)
    warm_buckets: tuple[int, ...] | None = None
    gather_ms: float = 2.0
    #: > 0: a stream that becomes ready waits until this long after the last tick started (the
    #: next multiple of it on the monotonic clock after an idle spell) unless every open stream
    #: is ready, instead of gather_ms; -1: the shortest tick period of the worker's models when
    #: their contexts run on a GPU, else off
    tick_align_ms: float = 0.0
    #: how much longer than the period an aligned tick waits for streams not ready yet (the
    #: daemon's default 5 ms, tuned on the H200: docs/benchmarks.md, one tick a period)
    tick_slack_ms: float = 0.0
    #: "now": a stream's ticks until its first audio run at once, in a tick of their own (on a
    #: GPU only the one that brings it, once the codes reach it; the aligned ticks take those
    #: before it), instead of at the aligned ticks ("cadence"); "auto" (the daemon's default):
    #: now, except on a GPU whose first_audio_gap_ms is 0
    first_audio: str = "cadence"
    #: first_audio "now": the longest gap (ms) after a stream's first audio that its express
    #: tick may open (the worker holds the tick until it does not); 0: no bound; -1 (the
    #: daemon's default, auto): twice the models' shortest tick period on a GPU, else 0
    first_audio_gap_ms: float = 0.0
    #: aligned ticks: a stream whose codes missed its round (they came after it started) is
    #: stepped in a small tick of its own once they are in, if that tick ends before the next
    #: round is due, instead of a period later with that round; at most this many such ticks
    #: between two rounds (0: none). The streams that missed a round mostly come in while it
    #: computes and take the first; a straggler after that may take a second; later ones wait
    #: for the next round, so that streams late every time (a language model slower than real
    #: time) cost at most that many small graphs a period. Off by default until it is measured
    #: against none on a GPU (docs/benchmarks.md, "Several fronts, one worker")
    tick_catch_up: int = 0
    #: when a worker warms only its smallest bucket before it reports ready and reserves the
    #: larger ones in the background, between ticks while it is idle: "restart" (a worker
    #: restarted after a crash serves again within a second or two; a first start warms all
    #: before READY=1), "always", "never"
    background_warm: str = "restart"
    #: set by the engine for a worker it restarts (not a setting)
    restarted: bool = False
    #: a push is refused (BackpressureError) when its stream has more than this many
    #: frames pushed and not yet returned as audio
    max_backlog_frames: int = 4096
    #: most commands queued for one worker before open/push are refused (BusyError)
    max_queued_commands: int = 4096
    start_timeout_s: float = 120.0  # spawn, load and warm-up of one worker
    stop_timeout_s: float = 5.0
    restart_backoff_s: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
    #: a worker up this long has its restart backoff reset
    stable_after_s: float = 60.0
    #: probe() kills a worker that does not answer in time (it is then restarted)
    kill_unresponsive: bool = True
    debug_commands: bool = False  # tests: allow the worker's "_crash" command
    #: voice name -> voice file, for models that need a voice (S3Gen)
    voices: dict[str, str] = field(default_factory=dict)
    #: family name -> that family's settings (JSON-able; Family.engine_options)
    family_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> EngineConfig:
        """The configuration :meth:`to_json` wrote (tuples restored); ValueError otherwise."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("an engine configuration is a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown engine settings {sorted(unknown)}")
        for k in ("warm_buckets", "restart_backoff_s"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(str(e)) from None
