"""The engine worker: one child process per device that owns the native runtime.

Started by :mod:`codecd.engine` as ``python -c "import codecd.worker ...; serve_fd(FD)"`` with one
end of a socketpair as FD (:func:`serve_fd`; the first message carries the
:class:`WorkerConfig`). Everything that can crash the process (a ggml abort, a
segfault, a GPU running out of memory inside a kernel) happens here, never in
the daemon.

Wire format (``multiprocessing.connection.Connection``, pickled): every message
in either direction is a *list* of tuples, so one syscall carries a whole
batch. Commands (parent -> worker)::

    ("open", sid, model, noise, seed)   ("push", sid, [level arrays])
    ("finish", sid)                     ("cancel", sid)
    ("probe", token)                    ("stats", token)
    ("stop",)                           ("_crash", how)   # tests only (debug_commands)
    ("config", WorkerConfig)            # first message only

Events (worker -> parent)::

    ("ready", info)                     ("failed", message)        # start-up
    ("opened", sid, latency_samples, sample_rate, chunk_frames)
    ("audio", sid, pcm_f32_bytes)       ("done", sid, total_samples)
    ("error", sid, code, message)       # that stream only; its slot is freed
    ("probe_reply", token)              ("stats", token, dict)
    ("log", levelno, message)           ("stopped",)

``sid`` is the parent's integer stream id (never reused within a worker), not
the caller's key. Commands for an unknown ``sid`` (a stream that already failed
or finished while the command was in flight) are dropped.

Loop: block until a command arrives; apply every command that is waiting; when
a stream became ready while the worker was idle, keep gathering commands for up
to ``gather_ms`` (so that streams arriving together share a tick), then tick:
for each model, ``ctx.step`` over its streams that may be ready, one tick per
model per round, until no stream is ready. Between rounds, waiting commands are
applied first (probes, cancels), so a long backlog never makes the worker deaf.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: latency "low": codecrt.LowLatencyStream's lookahead and crossfade as fractions of
#: the model's exact latency (SNAC 24 kHz: 2046 + 257 samples, 96 ms instead of
#: 198 ms; relative error about 0.01 against offline, docs/benchmarks.md)
LOW_LOOKAHEAD_FRACTION = 0.43
LOW_CROSSFADE_FRACTION = 0.054


def low_latency_params(exact_latency: int) -> tuple[int, int]:
    """(lookahead, crossfade) in samples of a "low" stream for a model's exact latency."""
    return (int(round(LOW_LOOKAHEAD_FRACTION * exact_latency)),
            max(1, int(round(LOW_CROSSFADE_FRACTION * exact_latency))))

__all__ = ["WorkerConfig", "main", "serve_fd", "error_code_for", "default_buckets"]

_PR_SET_PDEATHSIG = 1
#: exit status of a worker whose start-up failed (bad model, bad device)
EXIT_START_FAILED = 3
_RECENT = 128  # ticks kept for the stats' recent batch sizes and tick times
_MAX_DRAIN = 256  # command messages applied before the worker ticks again


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker loads and how it runs (picklable; sent to the child at spawn)."""

    models: dict[str, str]  # name -> GGUF path
    device: str = "auto"
    n_threads: int = 0
    max_streams: int = 64  # per model
    max_batch: int = 64  # streams per tick (per model)
    stream_chunk_frames: int = 0  # 0: the model's default
    batch_bucket: bool = True
    warm_buckets: tuple[int, ...] | None = None  # None: default_buckets()
    gather_ms: float = 2.0
    parent_pid: int = 0
    index: int = 0
    debug_commands: bool = False
    voices: dict[str, str] = field(default_factory=dict)  # name -> voice file (flow models)
    flow_first_chunk: int = 10  # tokens of a flow stream's first chunk
    flow_chunk: int = 25  # tokens of its later chunks
    flow_steps: int = 0  # flow steps per chunk (0: the model's default)
    flow_precision: str = "f32"  # products of flow models' contexts: "f32" or "bf16"


def default_buckets(max_batch: int, max_streams: int, batch_bucket: bool) -> list[int]:
    """The batch buckets warm-up runs, largest first: the largest one and 1.

    The largest bucket reserves the compute-buffer envelope that covers every
    smaller batch (later ticks never reserve again); the runtime keeps only one
    live graph per kind, so warming intermediate buckets buys nothing (the next
    bucket's graph replaces it) and 1 goes last, the shape of a lone first
    stream. Rebuilding a graph inside a reserved envelope costs well under a
    millisecond (graph construction only, no allocation).
    """
    del batch_bucket  # the same two buckets either way
    cap = max(1, min(max_batch, max_streams))
    return sorted({cap, 1}, reverse=True)


def error_code_for(exc: BaseException) -> str:
    """The engine error code of a codecrt exception (protocol codes where one fits)."""
    import codecrt

    if isinstance(exc, codecrt.CodeRangeError):
        return "token_range"
    if isinstance(exc, codecrt.CodeShapeError):
        return "broken_group"
    if isinstance(exc, codecrt.TooLargeError):
        return "busy"
    if isinstance(exc, (codecrt.CodeTypeError, codecrt.InputError)):
        return "bad_codes"
    if isinstance(exc, codecrt.StateError):
        return "bad_state"
    if isinstance(exc, codecrt.OutOfMemoryError):
        return "out_of_memory"
    return "engine_error"


# ------------------------------------------------------------------ process setup


def _die_with_parent(parent_pid: int) -> None:
    """PR_SET_PDEATHSIG(SIGKILL): the kernel kills us when the parent exits (Linux, best effort).

    The signal fires when the *thread* that forked us exits; the engine spawns
    from the event loop's thread, which lives as long as the daemon. The
    getppid() check closes the race of a parent that died before prctl ran.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as e:
            logger.warning("prctl(PR_SET_PDEATHSIG) unavailable: %s", e)
    if parent_pid and os.getppid() != parent_pid:
        os._exit(EXIT_START_FAILED)


class _ForwardHandler(logging.Handler):
    """Queues this process's WARNING+ log records as ``log`` events for the parent."""

    def __init__(self, outbox: list[tuple[Any, ...]]) -> None:
        super().__init__(logging.WARNING)
        self.outbox = outbox

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.outbox.append(("log", record.levelno, f"{record.name}: {record.getMessage()}"))
        except Exception:  # never let logging take the worker down
            pass


# ------------------------------------------------------------------------ state


@dataclass(eq=False)
class _Stream:
    sid: int
    stream: Any  # codecrt.Stream (for a low-latency stream, its exact inner stream)
    maybe_ready: bool = False
    low: Any = None  # codecrt.LowLatencyStream when the stream was opened with latency "low"


class _FlowAdapter:
    """A codecrt.FlowStream (S3Gen) behind the part of codecrt.Stream's surface the worker uses.

    A tick steps every ready flow stream by one chunk through
    codecrt.step_flows, which batches the chunks whose shapes agree (the
    voice's prompt length and the tokens so far: streams in step) and runs the
    others on their own.
    """

    def __init__(self, fs: Any, hop_length: int) -> None:
        self.fs = fs
        self.hop = hop_length

    def push(self, levels: Sequence[Any]) -> None:
        self.fs.push(levels[0] if len(levels) else [])

    def finish(self) -> None:
        self.fs.finish()

    def pull(self) -> Any:
        return self.fs.pull()

    def close(self) -> None:
        self.fs = _ClosedFlow(self.fs)

    @property
    def info(self) -> SimpleNamespace:
        fs = self.fs
        return SimpleNamespace(frames_pushed=fs.n_tokens, frames_decoded=fs.tokens_decoded,
                               done=fs.done, ready=fs.ready,
                               total_samples=fs.n_tokens * self.hop if fs.done else -1)


class _ClosedFlow:
    """What a closed flow stream answers: nothing ready, nothing pending."""

    def __init__(self, fs: Any) -> None:
        self.n_tokens = self.tokens_decoded = fs.n_tokens
        self.done, self.ready = True, False


@dataclass(eq=False)
class _Model:
    name: str
    model: Any  # codecrt.Model
    ctx: Any  # codecrt.Context
    sample_rate: int
    chunk_frames: int = 0
    latency_samples: int = 0
    streams: dict[int, _Stream] = field(default_factory=dict)
    ticks: int = 0
    stream_ticks: int = 0
    max_batch_seen: int = 0
    batches: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))
    tick_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    warm: dict[str, Any] = field(default_factory=dict)
    streams_opened: int = 0
    streams_done: int = 0
    streams_failed: int = 0
    voices: dict[str, Any] | None = None  # flow models: name -> codecrt.Voice; None: not a flow model


class Worker:
    """The worker's state and loop (runs in the child; see the module docstring)."""

    def __init__(self, conn: Connection, cfg: WorkerConfig) -> None:
        self.conn = conn
        self.cfg = cfg
        self.out: list[tuple[Any, ...]] = []
        self.models: dict[str, _Model] = {}
        self.where: dict[int, _Model] = {}  # sid -> its model
        self.gather_s = max(0.0, cfg.gather_ms) / 1e3
        self.running = True
        self.t_start = time.monotonic()
        self.commands = 0
        self.rounds = 0
        self.warmup_ms = 0.0

    # ------------------------------------------------------------- start-up

    def load(self) -> dict[str, Any]:
        """Load every model, create its context, warm it up; the ``ready`` info."""
        import codecrt

        t0 = time.perf_counter()
        for name, path in self.cfg.models.items():
            model = codecrt.Model(path)
            ctx = codecrt.Context(model, device=self.cfg.device, n_threads=self.cfg.n_threads,
                                  max_batch=self.cfg.max_batch, batch_bucket=self.cfg.batch_bucket,
                                  stream_chunk_frames=self.cfg.stream_chunk_frames,
                                  max_streams=self.cfg.max_streams,
                                  precision=self.cfg.flow_precision if model.info.needs_voice else "f32")
            m = _Model(name, model, ctx, model.info.sample_rate)
            self.models[name] = m
            if model.info.needs_voice:
                m.voices = self._load_voices(m)
                self._warm_flow(m)
            else:
                self._warm(m)
        self.warmup_ms = (time.perf_counter() - t0) * 1e3
        return {
            "pid": os.getpid(),
            "index": self.cfg.index,
            "device": self.cfg.device,
            "load_ms": round(self.warmup_ms, 3),
            "models": {name: self._model_info(m) for name, m in self.models.items()},
        }

    def _load_voices(self, m: _Model) -> dict[str, Any]:
        """The configured voices usable with this model (others are logged and skipped)."""
        import codecrt

        from .voices import VoiceError, read_voice

        out: dict[str, Any] = {}
        for name, path in sorted(self.cfg.voices.items()):
            try:
                d = read_voice(path)
                if d.model_arch != m.model.info.arch:
                    raise VoiceError(f"it is a voice for {d.model_arch!r} models")
                out[name] = codecrt.Voice(m.model, d.prompt_tokens, d.prompt_mel, d.speaker, name=name)
            except (VoiceError, codecrt.CodecrtError) as e:
                logger.warning("voice %r (%s) skipped for model %s: %s", name, path, m.name, e)
        if not out:
            logger.warning("model %s needs a voice and has none: its streams will be refused "
                           "(codecd voice add NAME conds.pt)", m.name)
        return out

    def _warm_flow(self, m: _Model) -> None:
        """A flow model: one short stream through the first voice (or a silent one).

        Chunk graphs have per-stream shapes, so this only pays the first
        graph constructions and reservations of the chunk sizes a stream starts with.
        """
        import codecrt

        info = m.model.info
        first, chunk = self.cfg.flow_first_chunk, self.cfg.flow_chunk
        m.chunk_frames = chunk
        # the first audio needs first_chunk + lookahead tokens; the last 8 mel
        # frames of each chunk wait for the next one's crossfade
        m.latency_samples = (first + 3) * info.hop_length + 8 * info.mel_hop
        t0 = time.perf_counter()
        voice = next(iter(m.voices.values()), None) if m.voices else None
        own = None
        if voice is None:
            own = voice = codecrt.Voice(m.model, np.zeros(0, np.int32), np.zeros((0, info.n_mels), np.float32),
                                        np.ones(192, np.float32))
        try:
            fs = codecrt.FlowStream(m.ctx, voice, first_chunk=first, chunk=chunk,
                                    n_steps=self.cfg.flow_steps)
            fs.push(np.zeros(first + chunk + 3, dtype=np.int32))
            fs.finish()
            fs.decode_all()
        finally:
            if own is not None:
                own.close()
        st = m.ctx.stats
        m.warm = {"flow": True, "ms": round((time.perf_counter() - t0) * 1e3, 3),
                  "graphs_built": st.graphs_built, "reservations": st.reservations,
                  "compute_buffer_bytes": list(st.compute_buffer_bytes)}

    def _model_info(self, m: _Model) -> dict[str, Any]:
        info = m.model.info
        return {
            "path": m.model.path,
            "device": m.ctx.device,
            "precision": m.ctx.precision,
            "arch": info.arch,
            "sample_rate": info.sample_rate,
            "hop_length": info.hop_length,
            "n_levels": info.n_levels,
            "codebook_sizes": list(info.codebook_sizes),
            "level_strides": list(info.level_strides),
            "frame_multiple": info.frame_multiple,
            "chunk_frames": m.chunk_frames,
            "latency_samples": m.latency_samples,
            "max_streams": self.cfg.max_streams,
            "warm": dict(m.warm),
            "needs_voice": bool(info.needs_voice),
            "voices": sorted(m.voices) if m.voices is not None else [],
            "batched": True,  # flow streams: where their chunks' shapes agree
        }

    def _warm(self, m: _Model) -> None:
        """Reserve the stream graphs: dummy streams through whole utterances, per batch bucket.

        Each bucket's dummies go through every kind of tick a real stream sees
        (the first ticks inside the decoder's latency, steady ticks, the flush
        after finish), whatever graphs the runtime uses for each. Largest bucket
        first: its reservation is the buffer envelope that covers every smaller
        one, so later ticks never reserve again. The runtime keeps one live graph
        per kind, so the smallest bucket goes last: a real stream's first tick
        then reuses that graph as it is.
        """
        info = m.model.info
        buckets = list(self.cfg.warm_buckets or default_buckets(
            self.cfg.max_batch, self.cfg.max_streams, self.cfg.batch_bucket))
        buckets = sorted({b for b in buckets if 1 <= b <= min(self.cfg.max_batch,
                                                             self.cfg.max_streams)}, reverse=True)
        t0 = time.perf_counter()
        probe = m.ctx.stream()
        try:
            m.chunk_frames = probe.info.chunk_frames
            m.latency_samples = probe.info.latency_samples
        finally:
            probe.close()
        # enough chunks for the output to get past the latency, then two steady ticks
        chunk_samples = max(1, m.chunk_frames * info.hop_length)
        n_chunks = -(-m.latency_samples // chunk_samples) + 2
        frames = n_chunks * m.chunk_frames
        codes = [np.zeros(frames // s, dtype=np.int32) for s in info.level_strides]
        ticks = 0
        for b in buckets:
            dummies = [m.ctx.stream() for _ in range(b)]
            try:
                for d in dummies:
                    d.push(codes)
                while m.ctx.step(dummies):
                    ticks += 1
                for d in dummies:
                    d.finish()
                while m.ctx.step(dummies):
                    ticks += 1
                if not all(d.info.done for d in dummies):
                    logger.warning("warm-up of %s: bucket %d did not finish", m.name, b)
            finally:
                for d in dummies:
                    d.close()
        st = m.ctx.stats
        m.warm = {"buckets": buckets, "ticks": ticks,
                  "ms": round((time.perf_counter() - t0) * 1e3, 3),
                  "graphs_built": st.graphs_built, "reservations": st.reservations,
                  "compute_buffer_bytes": list(st.compute_buffer_bytes),
                  "state_bytes": st.state_bytes}

    # ------------------------------------------------------------- commands

    def apply(self, cmd: Sequence[Any]) -> None:
        self.commands += 1
        op = cmd[0]
        if op == "push":
            self._push(cmd[1], cmd[2])
        elif op == "open":
            self._open(cmd[1], cmd[2], bool(cmd[3]), int(cmd[4]),
                       str(cmd[5]) if len(cmd) > 5 else "exact", cmd[6] if len(cmd) > 6 else None)
        elif op == "finish":
            self._finish(cmd[1])
        elif op == "cancel":
            self._close(cmd[1])
        elif op == "probe":
            self.out.append(("probe_reply", cmd[1]))
        elif op == "stats":
            self.out.append(("stats", cmd[1], self.stats()))
        elif op == "stop":
            self.running = False
        elif op == "_crash" and self.cfg.debug_commands:
            _crash(str(cmd[1]))
        else:
            logger.warning("unknown command %r", op)

    def _fail(self, sid: int, code: str, message: str) -> None:
        m = self.where.get(sid)
        if m is not None:
            m.streams_failed += 1
        self._close(sid)
        self.out.append(("error", sid, code, message))

    def _open(self, sid: int, model: str, noise: bool, seed: int, latency: str = "exact",
              voice: str | None = None) -> None:
        import codecrt

        m = self.models.get(model)
        if m is None:
            self.out.append(("error", sid, "unknown_model", f"model {model!r} is not loaded"))
            return
        if sid in self.where:
            self.out.append(("error", sid, "duplicate_stream", f"stream {sid} is already open"))
            return
        if m.voices is not None:
            self._open_flow(m, sid, seed, voice)
            return
        low = None
        try:
            if latency == "low":
                look, fade = low_latency_params(m.latency_samples)
                low = codecrt.LowLatencyStream(m.ctx, lookahead=look, crossfade=fade,
                                               noise=noise, seed=seed)
                s = low.stream
            else:
                s = m.ctx.stream(noise=noise, seed=seed)
        except codecrt.CodecrtError as e:
            self.out.append(("error", sid, error_code_for(e), str(e)))
            return
        m.streams[sid] = _Stream(sid, s, low=low)
        m.streams_opened += 1
        self.where[sid] = m
        lat = low.latency_samples if low is not None else m.latency_samples
        self.out.append(("opened", sid, lat, m.sample_rate, m.chunk_frames))

    def _open_flow(self, m: _Model, sid: int, seed: int, voice: str | None) -> None:
        import codecrt

        assert m.voices is not None
        v = m.voices.get(voice) if voice is not None else None
        if v is None:
            have = ", ".join(m.voices) or "none (codecd voice add NAME conds.pt)"
            what = f"has no voice {voice!r}" if voice is not None else "needs a voice"
            self.out.append(("error", sid, "unknown_voice", f"model {m.name!r} {what}; voices: {have}"))
            return
        try:
            fs = codecrt.FlowStream(m.ctx, v, seed=seed, first_chunk=self.cfg.flow_first_chunk,
                                    chunk=self.cfg.flow_chunk, n_steps=self.cfg.flow_steps)
        except codecrt.CodecrtError as e:
            self.out.append(("error", sid, error_code_for(e), str(e)))
            return
        m.streams[sid] = _Stream(sid, _FlowAdapter(fs, m.model.info.hop_length))
        m.streams_opened += 1
        self.where[sid] = m
        self.out.append(("opened", sid, m.latency_samples, m.sample_rate, m.chunk_frames))

    def _push(self, sid: int, levels: Sequence[Any]) -> None:
        import codecrt

        m = self.where.get(sid)
        if m is None:
            logger.debug("push for unknown stream %d dropped", sid)
            return
        st = m.streams[sid]
        try:
            (st.low or st.stream).push(levels)
        except codecrt.CodecrtError as e:
            self._fail(sid, error_code_for(e), str(e))
            return
        st.maybe_ready = True

    def _finish(self, sid: int) -> None:
        import codecrt

        m = self.where.get(sid)
        if m is None:
            return
        st = m.streams[sid]
        try:
            (st.low or st.stream).finish()
        except codecrt.CodecrtError as e:
            self._fail(sid, error_code_for(e), str(e))
            return
        st.maybe_ready = True

    def _close(self, sid: int) -> None:
        m = self.where.pop(sid, None)
        if m is None:
            return
        st = m.streams.pop(sid)
        st.stream.close()

    # ---------------------------------------------------------------- ticks

    def _tick(self, m: _Model) -> int:
        """One tick of one model over its streams that may be ready; collects their output."""
        import codecrt

        cands = [st for st in m.streams.values() if st.maybe_ready]
        if not cands:
            return 0
        if len(cands) > self.cfg.max_batch and m.ticks % len(cands):
            r = m.ticks % len(cands)  # more ready than one graph holds: rotate for fairness
            cands = cands[r:] + cands[:r]
        t0 = time.perf_counter()
        try:
            if m.voices is not None:
                n, batch = self._step_flows(m, cands)
                cands = [st for st in cands if st.sid in m.streams]
            else:
                n = batch = m.ctx.step([st.stream for st in cands])
        except codecrt.CodecrtError as e:
            # which streams were in the failed graph is not reported: fail all candidates
            logger.warning("tick of %s failed (%d streams): %s", m.name, len(cands), e)
            for st in cands:
                self._fail(st.sid, error_code_for(e), f"decode failed: {e}")
            return 0
        dt = (time.perf_counter() - t0) * 1e3
        if n:
            m.ticks += 1
            m.stream_ticks += n
            m.batches.append(batch)  # flows: the largest batch of the tick
            m.tick_ms.append(dt)
            m.max_batch_seen = max(m.max_batch_seen, batch)
        for st in cands:
            self._collect(m, st)
        return n

    def _step_flows(self, m: _Model, cands: list[_Stream]) -> tuple[int, int]:
        """Flow streams: one chunk each, batched where shapes agree; a failure ends only its own
        stream. Returns (streams stepped, the largest batch)."""
        import codecrt

        tick = codecrt.step_flows(m.ctx, [st.stream.fs for st in cands])
        for i, e in tick.errors.items():
            st = cands[i]
            logger.warning("chunk of %s stream %d failed: %s", m.name, st.sid, e)
            self._fail(st.sid, error_code_for(e), f"decode failed: {e}")
        return tick.stepped, tick.largest_batch

    def _collect(self, m: _Model, st: _Stream) -> None:
        s = st.stream
        pcm = st.low.collect() if st.low is not None else s.pull()
        if pcm.size:
            self.out.append(("audio", st.sid, pcm.tobytes()))
        info = s.info
        if info.done and (st.low is None or st.low.done):
            self.out.append(("done", st.sid, info.total_samples))
            m.streams_done += 1
            self._close(st.sid)
        elif not info.ready:
            st.maybe_ready = False

    def _busy(self) -> bool:
        return any(st.maybe_ready for m in self.models.values() for st in m.streams.values())

    def _all_waiting(self) -> bool:
        """Every open stream may be ready already: gathering cannot grow the batch."""
        return all(st.maybe_ready for m in self.models.values() for st in m.streams.values())

    def run_ticks(self) -> None:
        """Tick rounds (one tick per model each) until nothing is ready or commands wait."""
        while True:
            stepped = 0
            for m in self.models.values():
                stepped += self._tick(m)
            self.rounds += 1
            self.flush()
            if not stepped or self.conn.poll(0):
                return

    # ----------------------------------------------------------------- loop

    def drain(self) -> None:
        """Apply every command message waiting (at most _MAX_DRAIN messages)."""
        for _ in range(_MAX_DRAIN):
            if not self.conn.poll(0):
                return
            for cmd in self.conn.recv():
                self.apply(cmd)
                if not self.running:
                    return

    def flush(self) -> None:
        if self.out:
            out, self.out = self.out, []
            self.conn.send(out)

    def loop(self) -> None:
        while self.running:
            busy = self._busy()
            if self.conn.poll(0 if busy else None):
                self.drain()
                self.flush()
                if not busy and self.running and self._busy() and self.gather_s \
                        and not self._all_waiting():
                    deadline = time.monotonic() + self.gather_s
                    while self.running:
                        left = deadline - time.monotonic()
                        if left <= 0 or not self.conn.poll(left):
                            break
                        self.drain()
                        if self._all_waiting():
                            break
                    self.flush()
            if self.running:
                self.run_ticks()

    def close(self) -> None:
        for m in self.models.values():
            for st in list(m.streams.values()):
                st.stream.close()
            m.streams.clear()
            m.ctx.close()
            m.model.close()
        self.where.clear()

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        models: dict[str, Any] = {}
        for name, m in self.models.items():
            ms = list(m.tick_ms)
            pending = 0
            for st in m.streams.values():
                i = st.stream.info
                pending += max(0, i.frames_pushed - i.frames_decoded)
            models[name] = {
                "codecrt": asdict(m.ctx.stats),
                "streams_open": len(m.streams),
                "streams_ready": sum(1 for st in m.streams.values() if st.maybe_ready),
                "pending_frames": pending,
                "streams_opened": m.streams_opened,
                "streams_done": m.streams_done,
                "streams_failed": m.streams_failed,
                "ticks": m.ticks,
                "stream_ticks": m.stream_ticks,
                "max_batch_seen": m.max_batch_seen,
                "recent_batches": list(m.batches),
                "tick_ms_last": round(ms[-1], 4) if ms else None,
                "tick_ms_mean": round(sum(ms) / len(ms), 4) if ms else None,
                "tick_ms_max": round(max(ms), 4) if ms else None,
                "chunk_frames": m.chunk_frames,
                "latency_samples": m.latency_samples,
                "warm": dict(m.warm),
                "batched": True,  # flow streams: where their chunks' shapes agree
            }
        return {"pid": os.getpid(), "index": self.cfg.index, "device": self.cfg.device,
                "uptime_s": round(time.monotonic() - self.t_start, 3),
                "commands": self.commands, "rounds": self.rounds,
                "load_ms": round(self.warmup_ms, 3), "models": models}


def _crash(how: str) -> None:
    """Test hook (``debug_commands``): die or wedge the way a native fault would."""
    if how == "abort":
        os.abort()
    elif how == "segv":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(7)
    elif how == "hang":
        while True:
            time.sleep(3600)


def serve_fd(fd: int) -> None:
    """Process entry point: serve the parent on the connected socket ``fd``."""
    conn = Connection(fd)
    try:
        first = conn.recv()
    except (EOFError, OSError):
        os._exit(EXIT_START_FAILED)
    if not first or first[0][0] != "config" or not isinstance(first[0][1], WorkerConfig):
        os._exit(EXIT_START_FAILED)
    main(conn, first[0][1], first[1:])


def main(conn: Connection, cfg: WorkerConfig, pending: Sequence[Any] = ()) -> None:
    """Load, warm up, report ready, then run the loop until ``stop`` (or the parent goes)."""
    _die_with_parent(cfg.parent_pid)
    # the daemon decides when we stop: Ctrl-C in a terminal and systemd's SIGTERM to
    # the whole cgroup reach the parent, which stops us with a "stop" command
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    w = Worker(conn, cfg)
    root = logging.getLogger()
    root.addHandler(_ForwardHandler(w.out))
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    try:
        info = w.load()
    except Exception as e:  # codecrt errors, bad paths, bad device: the parent reports it
        try:
            conn.send([("failed", f"{type(e).__name__}: {e}")])
        finally:
            os._exit(EXIT_START_FAILED)
    w.out.append(("ready", info))
    w.flush()
    try:
        for cmd in pending:  # commands that came with the config
            w.apply(cmd)
        w.flush()
        w.loop()
    except (EOFError, OSError):  # the parent went away
        os._exit(0)
    w.close()
    try:
        conn.send([("stopped",)])
    except OSError:
        pass
    conn.close()
