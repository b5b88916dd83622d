"""The engine's configuration: one object for the pool, its engines and their workers."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by every worker of a pool (the device is per worker)."""

    models: dict[str, str]  # model name -> GGUF path
    n_threads: int = 0  # CPU threads per context (0: all cores); split them over CPU workers
    max_streams: int = 64  # per model per worker (the runtime's slot pool)
    max_batch: int = 64  # streams per tick
    stream_chunk_frames: int = 0  # 0: the model's default (its frame_multiple)
    batch_bucket: bool = True
    #: batch buckets warmed at start-up; None: the largest and 1 (see _worker.default_buckets)
    warm_buckets: tuple[int, ...] | None = None
    gather_ms: float = 2.0
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
    flow_first_chunk: int = 10  # S3Gen streams: tokens of the first chunk (time to first audio)
    flow_chunk: int = 25  # S3Gen streams: tokens per later chunk
    flow_steps: int = 0  # S3Gen streams: flow steps per chunk (0: the model's default)
    flow_precision: str = "f32"  # S3Gen models: "f32" or "bf16" products (codecrt.Context)


