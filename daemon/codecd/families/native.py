"""Models whose streams the runtime decodes exactly (``codecrt.Stream``), in a worker.

What a family of causal convolutional codecs (SNAC today; Mimi, DAC,
WavTokenizer next) shares in the worker: one context per model, warm-up by
dummy streams through whole utterances per batch bucket, exact streams, and
optionally "low" latency streams (``codecrt.LowLatencyStream``) whose
lookahead and crossfade the family chooses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from .base import LoadedModel

__all__ = ["ExactStreamModel", "default_buckets", "make_context"]

logger = logging.getLogger(__name__)


def make_context(model: Any, config: Any, device: str, precision: str = "f32") -> Any:
    """The model's ``codecrt.Context`` with the engine's limits (one per model per worker)."""
    import codecrt

    # auto (None): exact shapes on every device. On a GPU padding costs launches' worth of
    # idle lanes and memory; on the CPU it costs its streams' full compute (a tick of 5 or 6
    # streams computed 8), where rebuilding a graph for a new count inside the reserved
    # buffers costs well under a millisecond (docs/benchmarks.md, one daemon on this CPU)
    bucket = bool(config.batch_bucket)
    return codecrt.Context(model, device=device, n_threads=config.n_threads,
                           max_batch=config.max_batch, batch_bucket=bucket,
                           stream_chunk_frames=config.stream_chunk_frames,
                           max_streams=config.max_streams, precision=precision)


def default_buckets(max_batch: int, max_streams: int) -> list[int]:
    """The batch buckets warm-up runs, largest first: the largest one and 1.

    The largest bucket reserves the compute-buffer envelope that covers every
    smaller batch (later ticks never reserve again); the runtime keeps only one
    live graph per kind, so warming intermediate buckets buys nothing (the next
    bucket's graph replaces it) and 1 goes last, the shape of a lone first
    stream. Rebuilding a graph inside a reserved envelope costs well under a
    millisecond (graph construction only, no allocation).
    """
    cap = max(1, min(max_batch, max_streams))
    return sorted({cap, 1}, reverse=True)


class ExactStreamModel(LoadedModel):
    """A model served by exact streams, and low-latency ones when ``low_params`` is given:
    ``low_params(exact_latency) -> (lookahead, crossfade)`` in samples; its context's products
    in ``precision``."""

    def __init__(self, name: str, model: Any, config: Any, device: str,
                 low_params: Callable[[int], tuple[int, int]] | None = None,
                 precision: str = "f32") -> None:
        self.name = name
        self.model = model
        self.config = config
        self.low_params = low_params
        self.ctx = make_context(model, config, device, precision)
        probe = self.ctx.stream()
        try:
            self.chunk_frames = probe.info.chunk_frames
            self.latency_samples = probe.info.latency_samples
        finally:
            probe.close()

    def warm_buckets(self) -> list[int]:
        """The buckets :meth:`warm` runs, largest first."""
        cfg = self.config
        cap = min(cfg.max_batch, cfg.max_streams)
        buckets = list(cfg.warm_buckets or default_buckets(cfg.max_batch, cfg.max_streams))
        return sorted({b for b in buckets if 1 <= b <= cap}, reverse=True)

    def warm_steps(self, buckets: list[int]) -> Generator[bool, None, None]:
        """The warm-up of ``buckets`` one tick at a time, for a worker that is already serving
        (it steps this between its own ticks, while idle): yields after each tick, True
        while it waits for free stream slots (the dummies need ``bucket`` of them). A bucket
        is removed from ``buckets`` once done, so that a warm-up closed midway (its dummies
        freed for real streams) can be started again on what is left."""
        import codecrt

        ctx, info = self.ctx, self.model.info
        t0 = time.perf_counter()
        chunk_samples = max(1, self.chunk_frames * info.hop_length)
        n_chunks = -(-self.latency_samples // chunk_samples) + 2
        frames = n_chunks * self.chunk_frames
        codes = [np.zeros(frames // s, dtype=np.int32) for s in info.level_strides]
        done: list[int] = []
        while buckets:
            b = buckets[0]
            while True:
                dummies: list[Any] = []
                try:
                    for _ in range(b):
                        dummies.append(ctx.stream())
                    break
                except codecrt.CodecrtError:  # slots taken by real streams: later
                    for d in dummies:
                        d.close()
                    yield True
            try:
                for d in dummies:
                    d.push(codes)
                while ctx.step(dummies):
                    yield False
                for d in dummies:
                    d.finish()
                while ctx.step(dummies):
                    yield False
            finally:
                for d in dummies:
                    d.close()
            done.append(buckets.pop(0))
        st = ctx.stats
        self.warm_info["background"] = {
            "buckets": done, "ms": round((time.perf_counter() - t0) * 1e3, 3),
            "reservations": st.reservations, "compute_buffer_bytes": list(st.compute_buffer_bytes)}

    def warm(self, buckets: list[int] | None = None) -> dict[str, Any]:
        """Reserve the stream graphs: dummy streams through whole utterances, per batch bucket
        (``buckets``: these only, default :meth:`warm_buckets`).

        Each bucket's dummies go through every kind of tick a real stream sees
        (the first ticks inside the decoder's latency, steady ticks, the flush
        after finish), whatever graphs the runtime uses for each. Largest bucket
        first: its reservation is the buffer envelope that covers every smaller
        one, so later ticks never reserve again. The runtime keeps one live graph
        per kind, so the smallest bucket goes last: a real stream's first tick
        then reuses that graph as it is.
        """
        ctx, info = self.ctx, self.model.info
        if buckets is None:
            buckets = self.warm_buckets()
        t0 = time.perf_counter()
        # enough chunks for the output to get past the latency, then two steady ticks
        chunk_samples = max(1, self.chunk_frames * info.hop_length)
        n_chunks = -(-self.latency_samples // chunk_samples) + 2
        frames = n_chunks * self.chunk_frames
        codes = [np.zeros(frames // s, dtype=np.int32) for s in info.level_strides]
        ticks = 0
        for b in buckets:
            dummies = [ctx.stream() for _ in range(b)]
            try:
                for d in dummies:
                    d.push(codes)
                while ctx.step(dummies):
                    ticks += 1
                for d in dummies:
                    d.finish()
                while ctx.step(dummies):
                    ticks += 1
                if not all(d.info.done for d in dummies):
                    logger.warning("warm-up of %s: bucket %d did not finish", self.name, b)
            finally:
                for d in dummies:
                    d.close()
        st = ctx.stats
        self.warm_info = {"buckets": buckets, "ticks": ticks,
                          "ms": round((time.perf_counter() - t0) * 1e3, 3),
                          "graphs_built": st.graphs_built, "reservations": st.reservations,
                          "compute_buffer_bytes": list(st.compute_buffer_bytes),
                          "state_bytes": st.state_bytes}
        return self.warm_info

    def open_stream(self, options: Any) -> tuple[Any, int]:
        import codecrt

        if options.latency == "low" and self.low_params is not None:
            look, fade = self.low_params(self.latency_samples)
            low = codecrt.LowLatencyStream(self.ctx, lookahead=look, crossfade=fade,
                                           noise=options.noise, seed=options.seed)
            return low, low.latency_samples
        return self.ctx.stream(noise=options.noise, seed=options.seed), self.latency_samples

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

