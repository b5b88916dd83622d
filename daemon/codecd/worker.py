"""The engine worker: one child process per device that owns the native runtime.

Started by :mod:`codecd.engine` as ``python -c "import codecd.worker ...; serve_fd(FD)"``
with one end of a socketpair as FD (:func:`serve_fd`; the first message carries
the engine's configuration). Everything that can crash the process (a ggml
abort, a segfault, a GPU running out of memory inside a kernel) happens here,
never in the daemon. Each model is loaded by its family (``codecd.families``),
which opens its streams; every stream speaks the one stream protocol
(``codecrt.CodecStream``), so this loop steps them all alike.

Wire: :mod:`codecd.wire` packets (typed records with explicit byte layouts, no
pickle), one batch per syscall each way. The parent's first packet is its hello
and the configuration (:class:`~codecd.wire.Configure`); this end answers with its
hello, then ``Ready`` (or ``Failed``). Commands: ``OpenStream``, ``PushCodes``,
``FinishStream``, ``CancelStream``, ``Probe``, ``StatsRequest``, ``Stop`` (and
``Crash``, tests only). Events: ``StreamOpened``, ``AudioOut``, ``StreamDone``,
``StreamFailed`` (that stream only; its slot is freed), ``ProbeReply``, ``Stats``,
``Log``, ``Stopped``.

Fronts (``codecd serve``, :mod:`codecd.daemon`): the parent also hands the worker,
on a SOCK_SEQPACKET socket (``fdsock``), the worker's ends of each front's
channel (:mod:`codecd.channel`: a command ring it reads, an event ring it
writes, with their doorbells). A front's streams are commands in its ring;
their events go back one ring record per tick per front. Every stream of every
front is stepped in the same ticks. A front whose doorbell hangs up (it died)
has its streams closed; one that leaves too many event records unread has its
channel closed (it asks main for a new one).

Packed path (exact streams, the bulk of a GPU's load): a front's PUSH record is applied by
one runtime call on the record's own arrays (``codecrt.push_many``), a model's tick pulls
every stream's PCM in one call into one buffer (``codecrt.pull_many``), and each front gets
one AUDIO packet made of its slice of that buffer (the tick's streams are sorted by sid,
whose high bits are the front). Other kinds of streams go one by one. ``phases`` times
each part of the loop (ingest, step, collect, flush) for the stats and ``/metrics``.

``sid`` is the parent's integer stream id (never reused within a worker), not
the caller's key. Commands for an unknown ``sid`` (a stream that already failed
or finished while the command was in flight) are dropped.

Loop: block until a command arrives; apply every command that is waiting; when
a stream became ready while the worker was idle, keep gathering commands for up
to ``gather_ms`` (so that streams arriving together share a tick), or, with
``tick_align_ms``, until one period after the last tick started (the next multiple
of it on the monotonic clock after an idle period), so that streams whose codes
arrive spread over a frame period share one tick, unless every open stream is
ready already; then tick:
for each model, ``codecrt.step`` over its streams that may be ready, one tick
per model per round, until no stream is ready. Between rounds, waiting commands are
applied first (probes, cancels), so a long backlog never makes the worker deaf.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from operator import attrgetter
from typing import Any, NoReturn

import numpy as np

from .anatomy import TickAnatomy, TickParts
from .cadence import Cadence
from .tickcost import TickCost
from .channel import WorkerEnds, packets, recv_msg
from .stalls import GcClock
from .engine.config import EngineConfig
from .families import LoadedModel, StreamRefused, load_model
from .families.native import ExactStreamModel
from . import wire
from .wire import StreamOptions

logger = logging.getLogger(__name__)

__all__ = ["Worker", "main", "serve_fd", "error_code_for"]

_PR_SET_PDEATHSIG = 1
#: exit status of a worker whose start-up failed (bad model, bad device)
EXIT_START_FAILED = 3
_RECENT = 128  # ticks kept for the stats' recent batch sizes and tick times
_MAX_DRAIN = 256  # command messages applied before the worker ticks again
#: a front's stream ids live in the worker as ``fid << _FID_SHIFT | sid`` (the control
#: pipe's own streams, fid 0, keep their sids): every front numbers its streams from 1
_FID_SHIFT = 40
_SID_MASK = (1 << _FID_SHIFT) - 1
_RETRY_S = 0.002  # poll timeout while a front's event ring is full
#: a background warm-up tick (seconds for a large bucket on a CPU) runs only after the worker
#: has had no stream open and no command for this long: a stream that comes back after a
#: restart is not kept waiting behind one
_BACKGROUND_IDLE_S = 2.0
#: event packets (one per tick) a front may leave unread before its channel is closed
_MAX_FRONT_BACKLOG = 1024
_SID = attrgetter("sid")
_SILENT_STEPS = attrgetter("silent_steps")
#: the loop's phases timed in ``Worker.phases`` (stats ``phase_s``, ``phase_cpu_s``; /metrics
#: ``codecd_worker_phase_seconds``): where a tick's host time goes
PHASES = ("ingest", "step", "collect", "flush")


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


#: express ticks (first_audio = "now") in a row before the worker reads commands again: a
#: stream pushed far ahead still reaches its first audio in a few, and the rest wait a turn
_EXPRESS_ROUNDS = 8
#: an express tick must be expected to end this long before the aligned tick is due (ms), and
#: within this share of the time left: the estimate is a mean, a tick may take longer
_EXPRESS_MARGIN_MS = 1.0
_EXPRESS_SHARE = 0.9
#: new streams in an express tick before the model has ticked once (its cost unknown)
_EXPRESS_FIRST = 64
#: first_audio_gap_ms takes the aligned round after an express tick as this many of the tick
#: cost's spreads slower than its line (about its 99th percentile, were the spread normal): a
#: gap bound of 155 ms gave first-audio gaps of 184 to 200 ms at their 99th percentile with the
#: mean alone (H100, 1,300 streams, 2026-12-06), where the slow ticks ran 20 ms over it
_GAP_TAIL_SPREADS = 2.33
#: a tick whose garbage-collector pauses took longer than this (ms) is not a steady one: it
#: informs the tick cost's line but not its spread
_GC_STEADY_MS = 1.0


def _tick_trace(index: int) -> Any:
    """CODECD_TICK_TRACE=PATH: worker ``index`` writes one line per tick round to
    ``PATH.worker<index>`` (Worker._trace_round), to see when ticks start and why: what
    decides a late frame at the edge of capacity. Off (None) unless set."""
    path = os.environ.get("CODECD_TICK_TRACE")
    if not path:
        return None
    f = open(f"{path}.worker{index}", "a", buffering=1)  # noqa: SIM115 (the worker's lifetime)
    f.write("# start_s phase_ms ready open stepped wall_ms trigger\n")
    return f


def runs_on_cpu(lm: LoadedModel) -> bool:
    """Whether a loaded model's context computes on the CPU alone."""
    return all(b.upper().startswith("CPU") for b in lm.ctx.stats.backends)


def auto_express(models: Any, gap_ms: float) -> bool:
    """``first_audio = "auto"``: express ticks where every exact-stream model runs on the CPU,
    and on a GPU where the gap after a first audio is bounded (``gap_ms`` > 0: its auto is).
    On this CPU, at its capacity edge (12 SNAC streams on 2 cores, the tick filling most of the
    period), they met the bench's criterion in 12 runs of 12 against 6 of 12 with the cadence
    and brought the first audio 20 to 40 ms sooner. On an H100 unbounded they opened gaps of
    184 to 205 ms p99 after the first audio (the bench allows 170.6); bounded at 170 ms they met
    the criterion in 6 runs of 6 at 1,000 and 1,200 streams with first audio p99 240 to 284 ms,
    against the cadence's 279 to 321 (docs/benchmarks.md)."""
    exact = [m.lm for m in models if isinstance(m.lm, ExactStreamModel)]
    return bool(exact) and (gap_ms > 0.0 or all(runs_on_cpu(lm) for lm in exact))


def audio_steps_only(lm: LoadedModel) -> bool:
    """``_Model.audio_steps_only``: an exact-stream model that does not run on the CPU alone
    (:func:`runs_on_cpu`), where a tick has a large fixed cost."""
    return isinstance(lm, ExactStreamModel) and not runs_on_cpu(lm)


def tick_period_s(lm: ExactStreamModel) -> float:
    """The seconds of audio a tick adds to each of a model's streams."""
    info = lm.model.info
    return float(lm.chunk_frames * info.hop_length / info.sample_rate)


def auto_first_gap_ms(models: Any) -> float:
    """``first_audio_gap_ms = -1`` (auto): twice the shortest tick period of the exact-stream
    models that run on a GPU, in whole ms (170 for SNAC 24 kHz's 85.3 ms; the bench's criterion
    allows a gap of less than two periods), or 0 (no bound) where none does: on the CPU the
    unbounded express ticks keep the gaps within it (see :func:`auto_express`)."""
    periods = [tick_period_s(m.lm) for m in models
               if isinstance(m.lm, ExactStreamModel) and not runs_on_cpu(m.lm)]
    return float(math.floor(2e3 * min(periods))) if periods else 0.0


def auto_cadence(models: Any) -> Cadence:
    """``tick_align_ms = -1``: the shortest tick period (seconds of audio a tick adds) of the
    exact-stream models, kept always when their contexts run on a GPU, where a tick has a
    large fixed cost and full ticks pay (1,000 SNAC streams on an H200 were measured so,
    docs/benchmarks.md), and on the CPU only while the worker is loaded (cadence.py)."""
    gpu: list[float] = []
    cpu: list[float] = []
    for m in models:
        lm = m.lm
        if isinstance(lm, ExactStreamModel):
            (cpu if runs_on_cpu(lm) else gpu).append(tick_period_s(lm))
    if gpu:
        return Cadence(fixed_s=min(gpu))
    return Cadence(loaded_s=min(cpu, default=0.0))


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
    """Queues this process's WARNING+ log records as ``log`` events for the parent, into the
    worker's outbox of the moment (each flush swaps ``worker.out`` for a new list: a handler
    holding the first list would send nothing after the first flush)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(logging.WARNING)
        self.worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.worker.out.append(wire.Log(record.levelno,
                                            f"{record.name}: {record.getMessage()}"))
        except Exception:  # never let logging take the worker down
            pass


# ------------------------------------------------------------------------ state


class PhaseClock:
    """Seconds spent per phase of the loop (:data:`PHASES`), wall (``perf_counter``) and this
    thread's CPU (``thread_time``: what the phase cost, without the time another process
    held the core). A few calls per tick, never per stream."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def add(self, phase: str, since: tuple[float, float]) -> tuple[float, float]:
        """Charge the time since ``since`` to ``phase``; the clocks now."""
        t = self.now()
        self.wall[phase] += t[0] - since[0]
        self.cpu[phase] += t[1] - since[1]
        return t


@dataclass(eq=False)
class _Stream:
    sid: int
    stream: Any  # a codecrt.CodecStream (exact, low-latency, flow, ...)
    maybe_ready: bool = False
    fresh: bool = True  # no audio yet (first_audio = "now": express ticks, _express)
    #: ready at the start of the last aligned round that stepped streams, and not stepped by an
    #: express tick since (nor new, where the rounds take a new stream's first steps:
    #: ``to_audio`` > 1): an aligned round waits for these streams' codes (``_all_waiting``),
    #: not for a silent or a late one's, nor a new one's
    on_cadence: bool = False
    #: kept only under tick_catch_up, as are the two below: stepped since the start of the
    #: last aligned round that stepped streams (in it or in a catch-up tick after it): a stream
    #: that was and is not ready at the next round's start missed that round, and its codes,
    #: once in, take a catch-up tick (``_catch_up``)
    stepped_since: bool = False
    misses: int = 0  # aligned rounds in a row it missed so (``_catch_up``)
    #: stepped by an express tick since the last aligned round's start: not ready at the next
    #: round because it ran ahead, not late (no miss)
    express_since: bool = False
    silent_steps: int = 0  # its steps without audio so far (counted while fresh, under "now")
    #: its steps from the start to its first audio, where the express ticks take only the
    #: steps that reach it at once (``_brings_audio``; an exact stream of a model off the CPU:
    #: its latency over a tick's samples, plus one), else 1 (every step at once)
    to_audio: int = 1


@dataclass(eq=False)
class _Model:
    """A loaded model (its family's LoadedModel) and the worker's bookkeeping of it."""

    name: str
    lm: LoadedModel
    streams: dict[int, _Stream] = field(default_factory=dict)
    ticks: int = 0
    stream_ticks: int = 0
    max_batch_seen: int = 0
    batches: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))
    tick_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    streams_opened: int = 0
    streams_done: int = 0
    streams_failed: int = 0
    #: where a tick's PCM is pulled when it cannot go straight into a front's ring (the pipe's
    #: streams, a full ring), a part a run of streams (reused: a tick's AUDIO packets point
    #: into it until flush writes them or copies them into the backlog)
    pcm: Any = None
    #: the parts of its recent ticks (stats ``tick_anatomy``)
    anatomy: TickAnatomy = field(default_factory=TickAnatomy)
    graphs_built: int = 0
    buffer_bytes: int = 0
    #: its ticks' wall time against their batch (first_audio = "now" fits express ticks by it)
    cost: TickCost = field(default_factory=TickCost)
    express_ticks: int = 0  # ticks of new streams alone (first_audio = "now")
    express_holds: int = 0  # express ticks held back for first_audio_gap_ms
    catch_up_ticks: int = 0  # ticks of streams whose codes missed their round (tick_catch_up)
    catch_up_streams: int = 0  # stream-steps in them
    #: the device computes a launched tick while this thread goes on (not the CPU backend,
    #: whose step_begin computes it): commands that would end it wait (``_read_front``)
    async_ticks: bool = False
    #: express ticks take only the steps that reach a new exact stream's first audio at once
    #: (``_brings_audio``), and a new one holds no round: where a tick has a large fixed cost
    #: (``audio_steps_only``: off the CPU; on an H100 the express ticks of every step took 30
    #: to 75 % of the worker's time while 1,600 to 2,200 streams arrived). On the CPU a tick
    #: costs its streams' compute, and taking every step at once brought the first audio 18 to
    #: 27 ms sooner at p99 for the same work (docs/cpu/express-steps-2026-12-07.md)
    audio_steps_only: bool = False


@dataclass(eq=False)
class _FrontLink:
    """A front attached to this worker: its rings, its streams, packets waiting for room."""

    fid: int
    ends: WorkerEnds
    sids: set[int] = field(default_factory=set)  # worker-side sids of its open streams
    backlog: deque[Any] = field(default_factory=deque)  # bytes, or a _Packet until flushed
    packets_in: int = 0
    packets_out: int = 0
    #: commands read while a tick was on the device from the first one that would end the tick
    #: early on (an open, a finish, a cancel): the records' bytes and their items, applied
    #: first at the next read after the tick (``Worker._read_front``)
    deferred: tuple[bytearray, list[tuple[int, int, int, int]]] | None = None


def _local(m: wire.Message) -> wire.Message:
    """An event for a front, with the front's own stream id."""
    if type(m) is wire.AudioOut:
        return wire.AudioOut(m.sid & _SID_MASK, m.pcm)
    if type(m) is wire.StreamDone:
        return wire.StreamDone(m.sid & _SID_MASK, m.total_samples)
    if type(m) is wire.StreamFailed:
        return wire.StreamFailed(m.sid & _SID_MASK, m.code, m.message)
    assert type(m) is wire.StreamOpened
    return wire.StreamOpened(m.sid & _SID_MASK, m.latency_samples, m.sample_rate,
                             m.chunk_frames)


_STREAM_EVENTS = (wire.AudioOut, wire.StreamDone, wire.StreamFailed, wire.StreamOpened)


@dataclass(eq=False)
class _Packet:
    """A front's AUDIO packet built from the tick's arrays (``wire.audio_packet`` parts, which
    point into a reused buffer): written to the ring as it is, or copied into the backlog."""

    fid: int
    parts: list[Any]

    def materialize(self) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p.tobytes() for p in self.parts)


class Worker:
    """The worker's state and loop (runs in the child; see the module docstring)."""

    def __init__(self, conn: Connection, cfg: EngineConfig, device: str = "auto",
                 index: int = 0, fdsock: socket.socket | None = None) -> None:
        self.conn = conn
        self.fdsock = fdsock
        self.fronts: dict[int, _FrontLink] = {}
        self._poller: Any = None
        self.cfg = cfg
        self.device = device
        self.index = index
        #: events waiting for flush: wire messages, and AUDIO packets built from arrays
        self.out: list[Any] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            wire.PushCodes: self._on_push, wire.OpenStream: self._on_open,
            wire.FinishStream: self._on_finish, wire.CancelStream: self._on_cancel,
            wire.Probe: self._on_probe, wire.StatsRequest: self._on_stats,
            wire.Stop: self._on_stop, wire.Crash: self._on_crash}
        self.models: dict[str, _Model] = {}
        self.where: dict[int, _Model] = {}  # sid -> its model
        self.gather_s = max(0.0, cfg.gather_ms) / 1e3
        #: the period ticks keep (tick_align_ms; < 0, auto: set by load())
        self.cadence = Cadence(fixed_s=max(0.0, cfg.tick_align_ms) / 1e3)
        #: how long past the period an aligned tick waits for streams whose codes are late
        self.slack_s = max(0.0, cfg.tick_slack_ms) / 1e3
        #: first_audio = "now": the fresh streams with codes waiting, for the express ticks
        #: (those whose codes reach their first audio ticked at once on their own)
        self.express = cfg.first_audio == "now"
        self._fresh: dict[int, _Stream] = {}
        #: first_audio_gap_ms: the longest gap an express tick may open after a first audio
        #: (< 0, auto: set by load()), and per model, when the fresh streams it holds back may
        #: tick (monotonic s)
        self.first_gap_ms = max(0.0, cfg.first_audio_gap_ms)
        self._holds: dict[str, float] = {}
        #: tick_catch_up: the streams that missed the last aligned round (their codes came
        #: after it started), and how many catch-up ticks may still run before the next round
        self.catch_up = max(0, cfg.tick_catch_up)
        self._missed: dict[int, _Stream] = {}
        self._catch_ups_left = 0
        self._round_t = 0.0  # monotonic start of the current tick round
        self._tick_t = 0.0  # ... and of the last one that stepped streams (the cadence gates the next)
        #: what started the next tick round (the tick trace's last column)
        self._trigger = "idle"
        self._trace = _tick_trace(index)
        self.running = True
        self.t_start = time.monotonic()
        self.commands = 0
        self.rounds = 0
        self.warmup_ms = 0.0
        #: warm-ups still to run between ticks (LoadedModel.warm_steps generators)
        self._background: list[tuple[ExactStreamModel, list[int]]] = []
        self._warming: Generator[bool, None, None] | None = None
        self._background_wait_until = 0.0
        self.phases = PhaseClock()
        self.gc = GcClock().install()

    # ------------------------------------------------------------- start-up

    def load(self) -> dict[str, Any]:
        """Load every model through its family, warm it up; the ``ready`` info."""
        import codecrt

        t0 = time.perf_counter()
        bw = self.cfg.background_warm
        background = bw == "always" or (bw == "restart" and self.cfg.restarted)
        for name, path in self.cfg.models.items():
            model = codecrt.Model(path)
            try:
                lm = load_model(name, model, self.cfg, self.device)
            except BaseException:
                model.close()
                raise
            self.models[name] = _Model(name, lm, async_ticks=lm.ctx.device != "CPU",
                                       audio_steps_only=audio_steps_only(lm))
            if background and isinstance(lm, ExactStreamModel):
                # the smallest bucket now (a lone first stream's graph, ~0.3 s on a CPU),
                # the larger ones between ticks while idle (seconds: their reservation)
                buckets = lm.warm_buckets()
                lm.warm(buckets[-1:])
                if buckets[:-1]:
                    self._background.append((lm, buckets[:-1]))
            else:
                lm.warm()
        self.warmup_ms = (time.perf_counter() - t0) * 1e3
        if self.cfg.tick_align_ms < 0:
            self.cadence = auto_cadence(self.models.values())
        if self.cfg.first_audio_gap_ms < 0:
            self.first_gap_ms = auto_first_gap_ms(self.models.values())
        if self.cfg.first_audio == "auto":
            self.express = auto_express(self.models.values(), self.first_gap_ms)
        if self.cfg.first_audio_gap_ms > 0 and not self.express:  # set, and for nothing
            logger.warning("first_audio_gap_ms %g does nothing here: first audio comes at the "
                           "cadence's ticks (first_audio %s), not from express ticks",
                           self.first_gap_ms, self.cfg.first_audio)
        # the first streams after a restart come right after ready: let them in first
        self._background_wait_until = time.monotonic() + _BACKGROUND_IDLE_S
        return {
            "pid": os.getpid(),
            "index": self.index,
            "device": self.device,
            "load_ms": round(self.warmup_ms, 3),
            "models": {name: m.lm.describe() for name, m in self.models.items()},
        }

    # ------------------------------------------------------------- commands

    def apply(self, cmd: wire.Message) -> None:
        self.commands += 1
        handler = self._handlers.get(type(cmd))
        if handler is None:
            logger.warning("unexpected command %s", type(cmd).__name__)
        else:
            handler(cmd)

    def _on_push(self, m: wire.PushCodes) -> None:
        self._push(m.sid, m.levels)

    def _on_open(self, m: wire.OpenStream) -> None:
        self._open(m.sid, m.model, m.options)

    def _on_finish(self, m: wire.FinishStream) -> None:
        self._finish(m.sid)

    def _on_cancel(self, m: wire.CancelStream) -> None:
        self._close(m.sid)

    def _on_probe(self, m: wire.Probe) -> None:
        self.out.append(wire.ProbeReply(m.token))

    def _on_stats(self, m: wire.StatsRequest) -> None:
        self.out.append(wire.Stats(m.token, self.stats()))

    def _on_stop(self, m: wire.Stop) -> None:
        self.running = False

    def _on_crash(self, m: wire.Crash) -> None:
        if self.cfg.debug_commands:
            _crash(m.how)
        else:
            logger.warning("crash command refused (debug_commands is off)")

    def _fail(self, sid: int, code: str, message: str) -> None:
        m = self.where.get(sid)
        if m is not None:
            m.streams_failed += 1
        self._close(sid)
        self.out.append(wire.StreamFailed(sid, code, message))

    def _open(self, sid: int, model: str, options: StreamOptions) -> None:
        import codecrt

        m = self.models.get(model)
        if m is None:
            self.out.append(wire.StreamFailed(sid, "unknown_model",
                                              f"model {model!r} is not loaded"))
            return
        if sid in self.where:
            self.out.append(wire.StreamFailed(sid, "duplicate_stream",
                                              f"stream {sid} is already open"))
            return
        try:
            try:
                stream, latency = m.lm.open_stream(options)
            except codecrt.TooLargeError:
                if not self._pause_warm():  # a warm-up's dummies held the slots: retry
                    raise
                stream, latency = m.lm.open_stream(options)
        except StreamRefused as e:
            self.out.append(wire.StreamFailed(sid, e.code, e.message))
            return
        except codecrt.CodecrtError as e:
            self.out.append(wire.StreamFailed(sid, error_code_for(e), str(e)))
            return
        st = m.streams[sid] = _Stream(sid, stream)
        if m.audio_steps_only and type(stream) is codecrt.Stream:  # (an exact-stream model)
            st.to_audio = int(latency) // (m.lm.chunk_frames * m.lm.model.info.hop_length) + 1
        m.streams_opened += 1
        self.where[sid] = m
        self.out.append(wire.StreamOpened(sid, latency, m.lm.model.info.sample_rate,
                                          m.lm.chunk_frames))

    def _push(self, sid: int, levels: Sequence[Any]) -> None:
        import codecrt

        m = self.where.get(sid)
        if m is None:
            logger.debug("push for unknown stream %d dropped", sid)
            return
        st = m.streams[sid]
        try:
            st.stream.push(levels)
        except codecrt.CodecrtError as e:
            self._fail(sid, error_code_for(e), str(e))
            return
        self._made_ready(st)

    def _finish(self, sid: int) -> None:
        import codecrt

        m = self.where.get(sid)
        if m is None:
            return
        st = m.streams[sid]
        try:
            st.stream.finish()
        except codecrt.CodecrtError as e:
            self._fail(sid, error_code_for(e), str(e))
            return
        self._made_ready(st)

    def _made_ready(self, st: _Stream) -> None:
        """A push (one or a front's batch) or a finish gave ``st`` something to step (a new
        stream's too, for its express tick)."""
        st.maybe_ready = True
        if self.express and st.fresh:
            self._fresh[st.sid] = st

    def _close(self, sid: int) -> None:
        m = self.where.pop(sid, None)
        if m is None:
            return
        st = m.streams.pop(sid)
        st.stream.close()
        self._fresh.pop(sid, None)  # bounded by the open streams, also while never gathering
        self._missed.pop(sid, None)
        if sid > _SID_MASK:
            link = self.fronts.get(sid >> _FID_SHIFT)
            if link is not None:
                link.sids.discard(sid)

    # ---------------------------------------------------------------- fronts

    def _on_control(self) -> None:
        """A message from the daemon on the descriptor socket: attach or detach a front."""
        assert self.fdsock is not None
        while True:
            try:
                got = recv_msg(self.fdsock)
            except BlockingIOError:
                return
            except ValueError as e:
                logger.warning("bad control message: %s", e)
                continue
            if got is None:
                raise EOFError("the daemon closed the descriptor socket")
            msg, fds = got
            op = msg.get("op")
            if op == "attach" and len(fds) == 4:
                fid = int(msg["fid"])
                if fid in self.fronts:
                    self._detach(fid)
                self.fronts[fid] = _FrontLink(fid, WorkerEnds.from_fds(fds))
                self._poller = None
            elif op == "detach":
                for fd in fds:
                    os.close(fd)
                self._detach(int(msg["fid"]))
            else:
                for fd in fds:
                    os.close(fd)
                logger.warning("unexpected control message %r", op)

    def _detach(self, fid: int) -> None:
        """A front has gone: its streams are closed (nobody is left to hear about them)."""
        link = self.fronts.pop(fid, None)
        if link is None:
            return
        for sid in list(link.sids):
            self._close(sid)
        link.ends.close()
        self._poller = None

    def _read_front(self, link: _FrontLink, during_tick: bool = False) -> None:
        """The records a front's ring holds. PUSH records in a row (a front flushes what a
        millisecond gathered, a few streams' codes a record, and the worker finds tens of them
        after a tick) are applied together (``_push_run``): the cost of a runtime call per
        record, then of reading each record's arrays, was most of the worker's ingest
        (``python -m bench worker --per-record 5``).

        ``during_tick``: a tick is on the device. Pushes are applied; the first command that
        would end the tick early (an open, a finish, a cancel: the runtime waits for the device
        first) and everything behind it wait in ``link.deferred`` for the tick's end, so that
        a burst of opens (a thousand clients starting within a period) no longer holds back
        the tick's audio of every other stream; the next read applies them first."""
        if during_tick and link.deferred is not None:
            return  # commands wait for this tick's end; newer records queue behind them
        cons = link.ends.commands
        alive = cons.on_doorbell()
        base = link.fid << _FID_SHIFT
        # every record, copied (arrays outlive the ring's room), after those deferred: in a new
        # buffer, as the deferred one may still be viewed (a low-latency stream keeps its
        # pushed codes as views until they are decoded) and a viewed bytearray cannot grow
        buf = bytearray()
        items: list[tuple[int, int, int, int]] = []  # (kind, count, body offset in buf, size)
        if link.deferred is not None:
            viewed, items = link.deferred
            buf += viewed
            link.deferred = None
        for rec in cons.records():
            link.packets_in += 1
            items += wire.spans_at(rec, len(buf))
            buf += rec
        self._apply_items(link, base, buf, items, during_tick)
        if not alive:
            self._detach(link.fid)

    def _apply_items(self, link: _FrontLink, base: int, buf: bytearray,
                     items: list[tuple[int, int, int, int]], during_tick: bool) -> None:
        """A front's commands (``_read_front``'s items: kind, count, body offset in ``buf``,
        size), in order; during a tick, up to the first that would end it (the rest deferred)."""
        view = memoryview(buf)
        run: list[tuple[int, int, int, int]] = []
        for i, item in enumerate(items):
            kind, count, start, size = item
            if kind == wire.PushCodes.kind:
                self.commands += count
                run.append(item)
                continue
            if run:
                self._push_run(base, buf, run)
                run = []
            if during_tick:
                view.release()
                link.deferred = (buf, items[i:])
                return
            for cmd in wire.read_record(kind, count, view[start:start + size]):
                self.commands += 1
                if isinstance(cmd, wire.OpenStream):
                    self._open(base | cmd.sid, cmd.model, cmd.options)
                    if base | cmd.sid in self.where:
                        link.sids.add(base | cmd.sid)
                elif isinstance(cmd, wire.CancelStream):
                    self._close(base | cmd.sid)
                elif isinstance(cmd, wire.FinishStream):
                    self._finish(base | cmd.sid)
                else:
                    logger.warning("unexpected command %s from front %d",
                                   type(cmd).__name__, link.fid)
        if run:
            self._push_run(base, buf, run)

    def _push_run(self, base: int, buf: bytearray, run: list[tuple[int, int, int, int]]) -> None:
        """PUSH records in a row (``_read_front``'s items). When no stream is in two of them
        and all are exact streams of one context: their arrays read at once
        (``wire.push_arrays_many``) and one runtime call. Otherwise record by record, in runs
        that end before a record with a stream already in them, so that a stream is in one
        runtime call once (its failure is its only one, its later codes find it closed)."""
        if len(run) > 1:
            arrays = wire.push_arrays_many(buf, [r[2] for r in run], [r[1] for r in run],
                                           [r[3] for r in run])
            if arrays is not None and np.unique(arrays[0]).size == arrays[0].size:
                sts, packed = self._resolve(base, arrays[0])
                if packed:
                    self._push_batch(base, *arrays, streams=(sts, packed))
                    return
        view = memoryview(buf)
        pushes: list[tuple[Any, Any, Any, Any]] = []
        in_run: set[int] = set()
        for _kind, count, start, size in run:
            arrays = wire.push_arrays(view[start:start + size], count)
            ids = arrays[0].tolist()
            if pushes and not in_run.isdisjoint(ids):
                self._push_batches(base, pushes)
                pushes, in_run = [], set()
            pushes.append(arrays)
            in_run.update(ids)
        if pushes:
            self._push_batches(base, pushes)

    def _push_batches(self, base: int, pushes: list[tuple[Any, Any, Any, Any]]) -> None:
        """PUSH records' arrays (sids, level counts, lengths, codes), in order: as one batch
        when all their streams can share one runtime call, else record by record as they came
        (a record of one model's exact streams keeps its one call)."""
        if len(pushes) == 1:
            self._push_batch(base, *pushes[0])
            return
        sids, nlev, lengths, codes = (np.concatenate(a) for a in zip(*pushes))
        sts, packed = self._resolve(base, sids)
        if packed:
            self._push_batch(base, sids, nlev, lengths, codes, streams=(sts, packed))
        else:
            for arrays in pushes:
                self._push_batch(base, *arrays)

    def _resolve(self, base: int, sids: Any) -> tuple[list[_Stream | None], bool]:
        """The streams of a PUSH batch's sids (None: not open), and whether they are all exact
        streams of one context (one ``codecrt.push_many`` for all)."""
        import codecrt

        sts: list[_Stream | None] = []
        ctx = None
        packed = True
        for sid in sids.tolist():
            m = self.where.get(base | sid)
            if m is None:
                sts.append(None)
                continue
            st = m.streams[base | sid]
            sts.append(st)
            if packed and (type(st.stream) is not codecrt.Stream or
                           (ctx is not None and ctx is not m.lm.ctx)):
                packed = False
            ctx = m.lm.ctx
        return sts, packed

    def _push_batch(self, base: int, sids: Any, nlev: Any, lengths: Any, codes: Any,
                    streams: tuple[list[_Stream | None], bool] | None = None) -> None:
        """A front's PUSH batch: one runtime call for its streams when they are all exact
        streams of one context (``codecrt.push_many``, the arrays read in place), else one
        push per stream. ``streams``: ``_resolve``'s answer, when the caller has it."""
        import codecrt

        sts, packed = streams if streams is not None else self._resolve(base, sids)
        if not packed:
            for msg in wire.push_messages(sids, nlev, lengths, codes):
                self._push(base | msg.sid, msg.levels)
            return
        errors = codecrt.push_many([x.stream if x is not None else None for x in sts],
                                   nlev, lengths, codes)
        for i, x in enumerate(sts):
            if x is None:
                logger.debug("push for unknown stream %d dropped", base | int(sids[i]))
            elif i in errors:
                self._fail(x.sid, error_code_for(errors[i]), str(errors[i]))
            else:
                self._made_ready(x)

    def _wait(self, timeout: float | None) -> bool:
        """Whether the pipe, the descriptor socket or a front's doorbell is readable within
        ``timeout`` seconds (None: until one is), or commands deferred during a tick wait."""
        if self.fdsock is None:
            return bool(self.conn.poll(timeout))
        if any(link.deferred is not None for link in self.fronts.values()):
            return True
        if self._poller is None:
            p = select.poll()
            p.register(self.conn.fileno(), select.POLLIN)
            p.register(self.fdsock.fileno(), select.POLLIN)
            for link in self.fronts.values():
                p.register(link.ends.commands.doorbell.fileno(), select.POLLIN)
            self._poller = p
        if timeout is None and any(link.backlog for link in self.fronts.values()):
            timeout = _RETRY_S
        ms = -1 if timeout is None else max(0, int(timeout * 1e3 + 0.999))
        return bool(self._poller.poll(ms))

    # ---------------------------------------------------------------- ticks

    def _tick(self, m: _Model, only: list[_Stream] | None = None) -> int:
        """One step of one model's streams that may be ready, or of ``only`` those: one
        graph (``codecrt.step``) for each ``max_batch`` of them; collects their output.

        More streams than one graph holds (``max_streams`` above ``max_batch``) are all
        stepped, in graphs one after the other. The runtime steps at most ``max_batch`` a
        graph and leaves the rest for the next; with one graph a round, those waited for the
        rounds that a rotation by one stream a tick brought round to them: on an H200 with
        ``--max-batch 1024`` and 1,200 streams, some streams' audio stopped for 2.9 s after
        their first (docs/benchmarks.md, session 55)."""
        # commands deferred by the last tick go first: an express, catch-up or next model's
        # tick can follow it with no drain in between
        self._apply_deferred()
        cands = only if only is not None else [st for st in m.streams.values() if st.maybe_ready]
        if not cands:
            return 0
        cands.sort(key=_SID)  # each front's streams side by side: one AUDIO record per front
        cap = self.cfg.max_batch
        if len(cands) > cap:
            r = m.ticks % len(cands)  # which streams take the later graphs: rotated for fairness
            cands = cands[r:] + cands[:r]
        n = 0
        for i in range(0, len(cands), cap):
            part = cands[i:i + cap]
            if i:
                self._apply_deferred()  # a command read during the last graph may close some
                part = [st for st in part if m.streams.get(st.sid) is st]
            if part:
                n += self._tick_graph(m, part)
        return n

    def _tick_graph(self, m: _Model, cands: list[_Stream]) -> int:
        """One graph over ``cands`` (at most ``max_batch``): the step, its errors, the
        accounting of the tick and the collection of its output; the streams stepped."""
        import codecrt

        t0 = t = self.phases.now()
        gc0 = self.gc.ms
        parts = TickParts(batch=len(cands))
        align_s = self.cadence.period_s(self._round_t)
        if align_s:
            parts.late = round((self._round_t % align_s) * 1e3, 3)
        native = all(type(st.stream) is codecrt.Stream for st in cands)
        ta = tb = None  # the clocks after the launch and after the overlap (a split tick)
        try:
            if native and self.fronts:
                # the graph computes on the device while this thread reads the fronts'
                # pushes (codes may be pushed mid-tick: codecrt_context_step_begin)
                codecrt.step_begin(m.lm.ctx, [st.stream for st in cands])
                ta = self.phases.add("step", t0)
                # on the CPU backend step_begin computed the tick: nothing to wait for
                t = tb = self._overlap(ta, defer=m.async_ticks)
                n = codecrt.step_end(m.lm.ctx)
                tick = codecrt.Tick(n, {}, n)
                # a command read meanwhile may have closed some of them
                cands = [st for st in cands if m.streams.get(st.sid) is st]
            else:
                tick = codecrt.step(m.lm.ctx, [st.stream for st in cands])
        except codecrt.CodecrtError as e:
            # which streams were in the failed graph is not reported: fail all candidates
            logger.warning("tick of %s failed (%d streams): %s", m.name, len(cands), e)
            for st in cands:
                if m.streams.get(st.sid) is st:
                    self._fail(st.sid, error_code_for(e), f"decode failed: {e}")
            return 0
        t1 = self.phases.add("step", t)
        dt = (t1[0] - t0[0]) * 1e3
        if ta is not None and tb is not None:  # a split tick; else the step is all launch
            parts.launch = (ta[0] - t0[0]) * 1e3
            parts.overlap = (tb[0] - ta[0]) * 1e3
            parts.wait = (t1[0] - tb[0]) * 1e3
        else:
            parts.launch = dt
        if tick.errors:  # each ended only its own stream's step
            for i, err in tick.errors.items():
                st = cands[i]
                logger.warning("step of %s stream %d failed: %s", m.name, st.sid, err)
                self._fail(st.sid, error_code_for(err), f"decode failed: {err}")
            cands = [st for st in cands if st.sid in m.streams]
        n = tick.stepped
        if n:
            m.ticks += 1
            m.stream_ticks += n
            m.batches.append(tick.largest_batch)
            m.tick_ms.append(dt)
            m.max_batch_seen = max(m.max_batch_seen, tick.largest_batch)
        if native:
            self._collect_batch(m, cands)
        else:
            for st in cands:
                self._collect(m, st)
        t2 = self.phases.add("collect", t1)
        if n:
            parts.collect = (t2[0] - t1[0]) * 1e3
            parts.total = (t2[0] - t0[0]) * 1e3
            parts.gc = self.gc.ms - gc0
            self._account_graphs(m, parts)
            m.cost.add(parts.batch, parts.total,
                       steady=not (parts.graphs or parts.grew or parts.gc > _GC_STEADY_MS))
            m.anatomy.add(parts)
        return n

    @staticmethod
    def _account_graphs(m: _Model, parts: TickParts) -> None:
        """The graphs the runtime built for this tick and whether its buffers grew."""
        c = m.lm.ctx.stats
        built, nbytes = c.graphs_built, sum(c.compute_buffer_bytes)
        parts.acquire, parts.inputs, parts.enqueue = (c.last_acquire_ms, c.last_inputs_ms,
                                                      c.last_enqueue_ms)
        parts.graphs = built - m.graphs_built if m.graphs_built else 0
        parts.grew = int(bool(m.buffer_bytes) and nbytes > m.buffer_bytes)
        m.graphs_built, m.buffer_bytes = built, nbytes

    def _apply_deferred(self) -> None:
        """The commands every front's last read deferred during a tick (``_read_front``)."""
        for link in self.fronts.values():  # (applying commands attaches or detaches none)
            if link.deferred is not None:
                buf, items = link.deferred
                link.deferred = None
                self._apply_items(link, link.fid << _FID_SHIFT, buf, items, False)

    def _overlap(self, since: tuple[float, float], defer: bool = True) -> tuple[float, float]:
        """Host work done while a tick is on the device: the events waiting (earlier models'
        audio of this round) and every front's commands; the phase clock after it. Pushes
        leave the tick alone; an open, a finish or a cancel ends it early (the runtime
        waits for it first)."""
        t = since
        if self.out or any(link.ends.events.unpublished for link in self.fronts.values()):
            self._flush()  # (an earlier model's audio, written in place, is published here)
            t = self.phases.add("flush", t)
        for link in list(self.fronts.values()):
            self._read_front(link, during_tick=defer)
        return self.phases.add("ingest", t)

    def _collect(self, m: _Model, st: _Stream) -> None:
        s = st.stream
        pcm = s.pull()
        if pcm.size:
            self.out.append(wire.AudioOut(st.sid, pcm))
            if st.fresh:  # its first audio: no more express ticks (a round may have given it)
                st.fresh = False
                self._fresh.pop(st.sid, None)
        elif st.fresh:
            st.silent_steps += 1
        stats = s.stats
        if stats.done:
            self.out.append(wire.StreamDone(st.sid, stats.total_samples))
            m.streams_done += 1
            self._close(st.sid)
        elif not stats.ready:
            st.maybe_ready = False

    def _collect_batch(self, m: _Model, cands: list[_Stream]) -> None:
        """:meth:`_collect` for exact streams of one context, sorted by sid: a front's streams'
        PCM pulled straight into AUDIO records in its event ring (``_audio_in_place``: a tick's
        PCM, 20 MB at 2,400 SNAC streams, copied once instead of twice); where its ring has no
        room, into ``m.pcm``, then AUDIO packets made of slices of it (``_audio_packets``)."""
        import codecrt

        n = len(cands)
        if not n:  # every stream of the tick was closed while it computed (a client hung up)
            return
        per = m.lm.chunk_frames * m.lm.model.info.hop_length  # samples a tick adds
        if m.pcm is None or m.pcm.size < n * per:
            m.pcm = np.empty(n * per, dtype=np.float32)
        if self.out:  # events queued before this audio reach each front first
            self._flush()
            # a front whose ring hung up (or that stopped reading) was detached by that
            # flush, its streams closed: they take no pull
            cands = [st for st in cands if m.streams.get(st.sid) is st]
            n = len(cands)
            if not n:
                return
        sids = np.fromiter((st.sid for st in cands), dtype=np.uint64, count=n)
        fids = sids >> np.uint64(_FID_SHIFT)
        bounds = [0, *(np.flatnonzero(fids[1:] != fids[:-1]) + 1).tolist(), n]
        counts = np.zeros(n, dtype=np.int64)
        flags = np.zeros(n, dtype=np.int32)
        for a, b in zip(bounds, bounds[1:]):
            link = self.fronts.get(int(fids[a])) if fids[a] else None
            streams = [st.stream for st in cands[a:b]]
            if link is not None and not link.backlog:
                took = self._audio_in_place(link, sids[a:b] & np.uint64(_SID_MASK), streams, per,
                                            counts[a:b], flags[a:b])
                a, streams = a + took, streams[took:]
                if a == b:
                    continue
            pcm = m.pcm[a * per:b * per]  # this run's part of the buffer
            c, f = codecrt.pull_many(streams, pcm)
            counts[a:b], flags[a:b] = c, f
            if link is None:  # the pipe's streams: one message each, copied (m.pcm is reused)
                offs = np.concatenate(([0], np.cumsum(c)))
                for i in np.flatnonzero(c).tolist():
                    self.out.append(wire.AudioOut(int(sids[a + i]), pcm[offs[i]:offs[i + 1]].copy()))
                continue
            keep = c > 0
            self._audio_packets(link, sids[a:b][keep] & np.uint64(_SID_MASK),
                                c[keep].astype(np.uint32), pcm[:int(c.sum())])
        if self.express:  # a stream's first audio ends its express ticks
            for st, got in zip(cands, (counts > 0).tolist()):
                if st.fresh:
                    if got:  # (a round may have given it: no more express ticks)
                        st.fresh = False
                        self._fresh.pop(st.sid, None)
                    else:
                        st.silent_steps += 1
        for i in np.flatnonzero(flags & codecrt.PULL_MORE).tolist():  # the buffer ran out
            rest = cands[i].stream.pull()
            self.out.append(wire.AudioOut(cands[i].sid, rest))
        for i in np.flatnonzero(flags & codecrt.PULL_DONE).tolist():
            st = cands[i]
            self.out.append(wire.StreamDone(st.sid, st.stream.stats.total_samples))
            m.streams_done += 1
            self._close(st.sid)
        for i in np.flatnonzero((flags & (codecrt.PULL_DONE | codecrt.PULL_READY)) == 0).tolist():
            cands[i].maybe_ready = False

    def _audio_in_place(self, link: _FrontLink, sids: Any, streams: list[Any], per: int,
                        counts: Any, flags: Any) -> int:
        """A front's streams' audio of this tick pulled straight into AUDIO records reserved
        in its event ring (``sids``: their front-local ids), as many streams a record as a
        quarter of the ring holds at ``per`` samples each (as ``_audio_packets`` cuts them);
        ``counts`` and ``flags`` get ``codecrt.pull_many``'s. Returns how many streams (from
        the first) it took: fewer than all when the ring ran out of room."""
        import codecrt

        prod = link.ends.events
        limit = max(1, (prod.capacity // 4 - 64) // 4)  # samples a record, as _audio_packets
        group = max(1, min(65535, limit // max(1, per)))
        done = 0
        while done < len(streams):
            k = min(group, len(streams) - done)
            at = wire.audio_head(k)
            room = at + 4 * k * per
            room += -room % 8
            if 8 + room > prod.capacity:  # never fits (a tiny ring): the packets' way
                break
            view = prod.reserve(room)
            if view is None:  # full: the rest waits in the backlog, copied
                break
            size = 0
            try:
                c, f = codecrt.pull_many(streams[done:done + k], np.frombuffer(
                    view, dtype=np.float32, count=k * per, offset=at))
                counts[done:done + k], flags[done:done + k] = c, f
                size = wire.audio_record_into(view, sids[done:done + k], c)
            finally:  # the record is written (or none: size 0) whatever happened
                view.release()
                prod.commit(size)
            if size:
                link.packets_out += 1
            done += k
        return done

    def _audio_packets(self, link: _FrontLink, sids: Any, counts: Any, pcm: Any) -> None:
        """A front's audio of one tick as AUDIO packets of at most a quarter of its event ring
        (a ring record can never be larger than the ring) and 65,535 streams each."""
        limit = max(1, (link.ends.events.capacity // 4 - 64) // 4)  # samples per packet
        ends = np.cumsum(counts, dtype=np.int64)
        a, at = 0, 0
        while a < len(sids):
            b = int(np.searchsorted(ends, at + limit, side="right"))
            b = min(max(b, a + 1), a + 65535, len(sids))
            end = int(ends[b - 1])
            self.out.append(_Packet(link.fid, wire.audio_packet(sids[a:b], counts[a:b],
                                                                pcm[at:end])))
            a, at = b, end

    def _align_s(self) -> float:
        """The period the next tick waits for now (0: gather_ms instead)."""
        return self.cadence.period_s(time.monotonic())

    def _busy(self) -> bool:
        return any(st.maybe_ready for m in self.models.values() for st in m.streams.values())

    def _all_waiting(self) -> bool:
        """Every stream the round waits for may be ready already: aligned, those ready at the
        start of the last round that stepped streams (``on_cadence``), or every open stream when
        none was; unaligned (gather_ms), every open stream. A stream that was not (a silent one,
        one whose codes come late every time, as from a language model slower than real time,
        one an express tick took ahead, a new one on a GPU) joins whichever round it is ready
        for but holds none back: with it counted, every round waited for its deadline, the next
        one due a period after that, so every other stream fell behind real time by the slack
        each period (about 6 % with the 5 ms default)."""
        aligned = bool(self._align_s())
        gated = loose = False  # a stream on the cadence seen; one off it not ready yet
        for m in self.models.values():  # one pass that stops at the first gated stream waiting
            for st in m.streams.values():
                if aligned and st.on_cadence:
                    if not st.maybe_ready:
                        return False
                    gated = True
                elif not st.maybe_ready:
                    if not aligned:
                        return False
                    loose = True
        return gated or not loose

    def run_ticks(self) -> None:
        """Tick rounds (one tick per model each) until nothing is ready or commands wait."""
        while True:
            self._round_t = time.monotonic()
            if self._trace is not None:
                ready = sum(st.maybe_ready for m in self.models.values() for st in m.streams.values())
            # which streams the next aligned round waits for: those ready now (but new exact
            # streams off the CPU: to_audio > 1), if this round steps (a turn of the loop that
            # steps nothing, after a command, leaves them be)
            at_start = ([(st, st.maybe_ready) for m in self.models.values() for st in m.streams.values()]
                        if self._align_s() else None)
            stepped = 0
            for m in self.models.values():
                stepped += self._tick(m)
            self.rounds += 1
            if stepped:  # the cadence counts from rounds that stepped, not from idle passes
                self._tick_t = self._round_t
                self.cadence.round(self._tick_t, time.monotonic())
                for st, was_ready in at_start or ():
                    # a new stream whose first steps are the rounds' (to_audio > 1: express
                    # ticks only for the step of its first audio) does not hold the next round:
                    # its next codes come at its own phase, or an express tick takes them
                    # first; with streams arriving every period the rounds waited for one of
                    # them every time, to their deadline, a period and the slack after the
                    # last: every stream fell behind real time by the slack each period (an
                    # H100, 1,000 to 2,400 streams starting over 3 s; docs/benchmarks.md,
                    # session 53). On the CPU (every step express) a stream that an express
                    # tick stepped holds none (_express)
                    st.on_cadence = was_ready and not (self.express and st.fresh
                                                       and st.to_audio > 1)
                if at_start and self.catch_up:
                    self._note_misses(at_start)
            self.flush()
            if self._trace is not None and stepped:
                self._trace_round(self._round_t, ready, stepped, self._trigger)
            if not stepped or self._align_s() or self._wait(0):  # aligned: the loop gates the next
                return
            self._trigger = "again"

    def _trace_round(self, start: float, ready: int, stepped: int, trigger: str) -> None:
        """One line of the tick trace (CODECD_TICK_TRACE): the round's start (monotonic s),
        its phase in the cadence's period (ms; -1 unaligned), the streams ready and open at
        its start, those stepped, its wall time (ms) and what started it."""
        align_s = self._align_s()
        phase = 1e3 * (start % align_s) if align_s else -1.0
        n_open = sum(len(m.streams) for m in self.models.values())
        self._trace.write(f"{start:.4f} {phase:.1f} {ready} {n_open} {stepped} "
                          f"{1e3 * (time.monotonic() - start):.1f} {trigger}\n")

    def _express(self, deadline: float) -> None:
        """first_audio = "now": the streams that have had no audio yet and have codes waiting,
        stepped at once in a tick of their own instead of at the cadence's next tick. A SNAC
        24 kHz stream's first audio needs its third 4-frame chunk (198 ms of lookahead), and on
        a GPU at 1,000 streams that chunk waited up to a period for the tick and then computed
        for 60 to 80 ms in a graph of every stream (time to first audio p99 353 to 449 ms on an
        H200; docs/history.md, 2026-12-05). Here a small graph of the new streams alone runs between the large ones,
        as many of them as its model's tick cost (:class:`TickCost`) says end before
        ``deadline`` (monotonic s), when the aligned tick is due; the rest wait for that tick
        (they are express again at their next codes). The streams with the most silent steps
        go first: they are nearest their first audio (a SNAC 24 kHz stream's third step gives
        it, its first two give none; a stream whose codes were pushed ahead may need all
        three), so when not all fit, the express ticks give first audio rather than steps that
        the aligned ticks could take as well. Off the CPU (``to_audio`` > 1) only streams whose
        codes reach their first audio are taken (``_brings_audio``), the others' steps are the
        aligned rounds'; on the CPU every new stream's. Streams past their first audio are the
        rounds'. Unaligned workers tick at once anyway."""
        fresh, self._fresh = self._fresh, {}
        if not self._align_s():
            return
        groups: dict[str, tuple[_Model, list[_Stream]]] = {}
        now = time.monotonic()
        for st in fresh.values():  # in the order their codes came
            m = self.where.get(st.sid)
            if m is None or not st.fresh or not st.maybe_ready or m.streams.get(st.sid) is not st:
                continue  # gone, past its first audio (a round gave it), or nothing to step
            if self._holds.get(m.name, now) > now:  # held back (first_audio_gap_ms): later
                self._fresh[st.sid] = st
            elif self._brings_audio(m, st):
                groups.setdefault(m.name, (m, []))[1].append(st)
        ran = False
        for m, cands in groups.values():  # (a model held back is not among them: above)
            now = time.monotonic()
            self._holds.pop(m.name, None)
            cands.sort(key=_SILENT_STEPS, reverse=True)  # stable: then in the order codes came
            budget_ms = _EXPRESS_SHARE * (deadline - now) * 1e3 - _EXPRESS_MARGIN_MS
            if m.cost.known:
                k = m.cost.most_within(budget_ms, len(cands))
            else:  # its first tick: a few, if any time is left
                k = min(len(cands), _EXPRESS_FIRST) if budget_ms > 0 else 0
            if not k:  # none fits: they tick with the others at the deadline
                continue
            hold_ms = self._first_gap_hold_ms(m, k, deadline, now)
            if hold_ms > 0.0:  # too early: its audio would lead the stream's next by too much
                m.express_holds += 1
                for st in cands:
                    self._fresh[st.sid] = st
                self._holds[m.name] = now + hold_ms / 1e3
                continue
            for st in cands[k:]:  # the later ones: another express tick if time is left
                self._fresh[st.sid] = st
            cands = cands[:k]  # _tick sorts them by sid
            self._round_t = start = time.monotonic()
            n = self._tick(m, cands)
            ran = True
            if n:
                m.express_ticks += 1
                if self._trace is not None:
                    self._trace_round(start, len(cands), n, "express")
            for st in cands:  # codes pushed ahead: the next chunk at once too, until audio
                # ahead of the cadence, not late: the next round does not wait for its next
                # chunk (it joins the first round it is ready for); waited for, with new
                # streams arriving every period some always were (see run_ticks)
                st.on_cadence = False
                if self.catch_up:  # (read only by _note_misses)
                    st.express_since = True
                if st.fresh and st.maybe_ready and m.streams.get(st.sid) is st:
                    self._fresh[st.sid] = st
        if ran:
            self.flush()

    def _brings_audio(self, m: _Model, st: _Stream) -> bool:
        """Whether an express tick now takes new stream ``st`` to its first audio with no round
        in between: it can step and the codes pushed so far reach its first audio (the codes of
        its next step, or more, pushed ahead as a language model faster than real time does),
        or it is finished. A step that gives no audio and that the next round takes as well is
        left to that round (the stream stays ready): SNAC 24 kHz's first audio comes at a
        stream's third step, and with 1,600 to 2,200 streams starting over 3 s on an H100 the
        express ticks, taking every step, ran up to 30 a period and took 30 to 75 % of the
        worker's time while streams arrived (session 53's tick traces, docs/benchmarks.md).
        With codes at real time the first two steps go to the rounds of the periods their
        codes come in and the third to an express tick at once; where a round took the second
        only after the third chunk came, the express tick takes both (on this CPU the first
        audio's p99 rose 18 to 27 ms: ``audio_steps_only`` is off there). Streams of other kinds
        (``to_audio`` 1), and every stream of a CPU model: whenever they can step (an express
        tick of a stream whose codes fill no chunk yet stepped nothing and took the stream off
        the cadence all the same)."""
        stats = st.stream.stats
        if not stats.ready:  # codes short of a chunk (a push a frame): nothing to step yet
            return False
        return st.to_audio <= 1 or stats.finished or \
            stats.frames_pushed >= st.to_audio * m.lm.chunk_frames

    def _note_misses(self, at_start: list[tuple[_Stream, bool]]) -> None:
        """tick_catch_up, after an aligned round that stepped streams: the streams stepped
        since the round before (in it or in a catch-up tick, not ahead of it in an express
        tick) and not ready at this one's start missed it (``_catch_up``). ``at_start``: each
        open stream and whether it was ready at the round's start; the round itself changes
        neither flag read here."""
        missed: dict[int, _Stream] = {}
        for st, was_ready in at_start:
            if was_ready:
                st.misses = 0
            elif st.stepped_since and not st.express_since and not (self.express and st.fresh):
                # (a new stream's late codes are an express tick's, not a catch-up tick's; off
                # the CPU no round waits for it at all)
                st.misses += 1
                missed[st.sid] = st
            st.stepped_since = was_ready
            st.express_since = False
        self._missed = missed
        self._catch_ups_left = self.catch_up

    def _catch_up(self, deadline: float) -> None:
        """tick_catch_up: the streams whose codes missed the last aligned round (stepped in the
        period before it, not ready at its start) and have come since, stepped at once in a
        tick of their own, as many as the model's tick cost says end before ``deadline``, when
        the next round is due. Without it such a stream waits a period for that round: a gap of
        two periods in its audio and a period more latency from then on, since a round steps a
        stream one chunk. On a GPU at 2,000 streams, 0.2 to 3 % of stream-steps missed their
        round (codes a front held back past the slack; docs/benchmarks.md), and over 1 % puts
        the gaps' 99th percentile past the bench's bound of two periods. A stream caught up
        after one miss is waited for by the next round again, as before it (else the round
        may start before its next codes too, and the streams off the cadence grow round by
        round); one that missed two in a row is not (its codes come late every time: a
        language model slower than real time) and takes the catch-up ticks."""
        groups: dict[str, tuple[_Model, list[_Stream]]] = {}
        for sid, st in list(self._missed.items()):
            m = self.where.get(sid)
            if m is None or m.streams.get(sid) is not st:
                del self._missed[sid]
            elif st.maybe_ready and not (self.express and st.fresh) and st.stream.stats.ready:
                # (maybe_ready is set by any push; a chunk may need several: those wait here)
                groups.setdefault(m.name, (m, []))[1].append(st)
        ran = False
        for m, cands in groups.values():
            if self._catch_ups_left <= 0:
                break
            now = time.monotonic()
            budget_ms = _EXPRESS_SHARE * (deadline - now) * 1e3 - _EXPRESS_MARGIN_MS
            k = m.cost.most_within(budget_ms, len(cands)) if m.cost.known else 0
            if not k:  # none fits: they tick with the next round
                continue
            cands = cands[:k]
            for st in cands:
                del self._missed[st.sid]
            self._catch_ups_left -= 1
            self._round_t = start = time.monotonic()
            n = self._tick(m, cands)
            ran = True
            if n:
                m.catch_up_ticks += 1
                m.catch_up_streams += n
                for st in cands:
                    st.stepped_since = True
                    st.on_cadence = st.misses < 2
                if self._trace is not None:
                    self._trace_round(start, len(cands), n, "catch-up")
        if ran:
            self.flush()

    def _first_gap_hold_ms(self, m: _Model, k: int, deadline: float, now: float) -> float:
        """How long an express tick of ``k`` of ``m``'s new streams must wait so that the gap
        after the first audio it gives stays within ``first_audio_gap_ms`` (0: at once). Their
        codes came after the last aligned round started, so their next codes come after the
        one due at ``deadline`` and their next audio from the round a period later, ending
        about ``deadline + period + A`` (A: a round of all the model's streams, by its tick
        cost); the express tick ends ``E`` (a tick of k) after it starts. The gap is
        ``deadline + period + A - start - E``; each ms the tick starts earlier is a ms of
        earlier first audio and a ms more of that gap (on an H100 at 1,300 streams, unbounded:
        first audio p99 241 ms against the cadence's 326 to 364, gap p99 189 to 194 ms against
        the bench's 170.6 ms bound; docs/history.md, 2026-12-06). A stream with codes pushed ahead gets
        its next audio sooner than this assumes, so it may wait more than it must, never past
        the aligned round. A is taken at a slow round's (the line plus ``_GAP_TAIL_SPREADS``
        of its spread), since the bound is on the gaps' tail, not their mean. The tick can end
        before ``deadline`` only if the bound exceeds ``period + A``: below that every express
        tick waits into the aligned round, which is the cadence (as with 110 ms on this CPU,
        where A is about 45 ms)."""
        if not self.first_gap_ms or not m.cost.known:
            return 0.0
        period_ms = self._align_s() * 1e3
        slow_ms = m.cost.predict(len(m.streams)) + _GAP_TAIL_SPREADS * m.cost.spread()
        gap_ms = (deadline - now) * 1e3 + period_ms + slow_ms - m.cost.predict(k)
        return max(0.0, gap_ms - self.first_gap_ms)

    # ----------------------------------------------------------------- loop

    def drain(self) -> None:
        """Apply every command waiting: the pipe's (at most _MAX_DRAIN messages), the
        descriptor socket's, every front's ring."""
        if self.fdsock is not None:
            t0 = self.phases.now()
            self._on_control()
            for link in list(self.fronts.values()):
                self._read_front(link)
            self.phases.add("ingest", t0)
        for _ in range(_MAX_DRAIN):
            if not self.conn.poll(0):
                return
            for cmd in wire.decode(self.conn.recv_bytes()):
                self.apply(cmd)
                if not self.running:
                    return

    def flush(self) -> None:
        """Send what is waiting: the pipe's messages in one packet, each front's events in one
        ring record (one batch: the audio of every stream of that front in this tick)."""
        t0 = self.phases.now()
        self._flush()
        self.phases.add("flush", t0)

    def _flush(self) -> None:
        if self.out:
            out, self.out = self.out, []
            if self.fronts:
                mine: list[wire.Message] = []
                per: dict[int, list[Any]] = {}
                for m in out:
                    if type(m) is _Packet:
                        per.setdefault(m.fid, []).append(m)
                    elif isinstance(m, _STREAM_EVENTS) and m.sid > _SID_MASK:
                        per.setdefault(m.sid >> _FID_SHIFT, []).append(_local(m))
                    else:
                        mine.append(m)
                for fid, msgs in per.items():
                    link = self.fronts.get(fid)
                    if link is not None:
                        self._queue_front(link, msgs)
                out = mine
            if out:
                self.conn.send_bytes(wire.encode(out))
        for link in list(self.fronts.values()):
            if link.backlog or link.ends.events.unpublished:  # or audio written in place
                self._send_front(link)

    def _queue_front(self, link: _FrontLink, msgs: list[Any]) -> None:
        """A front's events, in order, into its backlog: runs of messages as wire packets,
        AUDIO packets as they are."""
        run: list[wire.Message] = []
        for x in msgs:
            if type(x) is _Packet:
                if run:
                    link.backlog.extend(packets(run, link.ends.events.capacity // 4))
                    run = []
                link.backlog.append(x)
            else:
                run.append(x)
        if run:
            link.backlog.extend(packets(run, link.ends.events.capacity // 4))

    def _send_front(self, link: _FrontLink) -> None:
        prod = link.ends.events
        if len(link.backlog) > _MAX_FRONT_BACKLOG:
            # a front that does not read (wedged, stopped) must not grow this process
            # without bound: its channel closes, its streams end; it asks main for a new one
            logger.error("front channel %d: %d event packets unread; closing it",
                         link.fid, len(link.backlog))
            self._detach(link.fid)
            return
        while link.backlog:
            x = link.backlog[0]
            if not prod.write(x.parts if type(x) is _Packet else [x]):
                # full: the front reads, we retry on the next turn; an AUDIO packet's
                # arrays point into a buffer the next tick reuses: copied now
                for i, y in enumerate(link.backlog):
                    if type(y) is _Packet:
                        link.backlog[i] = y.materialize()
                break
            link.backlog.popleft()
            link.packets_out += 1
        if not prod.ring():
            self._detach(link.fid)

    def loop(self) -> None:
        while self.running:
            busy = self._busy()
            self._trigger = "ready" if busy else "pushed"  # unless a gather below decides
            idle_timeout = None
            if self._background:
                now = time.monotonic()
                if self.where:  # open streams: a warm-up tick would delay theirs
                    self._background_wait_until = max(self._background_wait_until,
                                                      now + _BACKGROUND_IDLE_S)
                idle_timeout = max(0.0, self._background_wait_until - now)
            gathered = False
            if self._wait(0 if busy else idle_timeout):
                if self._background:
                    self._background_wait_until = time.monotonic() + _BACKGROUND_IDLE_S
                self.drain()
                self.flush()
                align_s = self._align_s()
                if not busy and self.running and self._busy() and \
                        (self.gather_s or align_s) and not self._all_waiting():
                    now = time.monotonic()
                    if align_s:
                        self._trigger = self._gather_until(self._tick_due(align_s, now))
                    else:
                        self._trigger = self._gather_until(now + self.gather_s)
                    gathered = True
            else:
                self.flush()  # a full event ring: try again
                if not busy and self._background:
                    self._warm_step()
            align_s = self._align_s()
            if align_s and not gathered:
                if self.running and self._busy() and not self._all_waiting():
                    # streams made ready while the last tick was on the device (its pushes are
                    # read then) wait until a period after that tick's start (and the slack):
                    # one tick a period, all of them in it (at once if the tick overran it)
                    self._trigger = self._gather_until(self._tick_t + align_s + self.slack_s)
                else:
                    self._trigger = "all-ready" if self._busy() else "idle"
            if self.running:
                self.run_ticks()

    def _tick_due(self, align_s: float, now: float) -> float:
        """When an idle worker's next aligned tick starts: a period after the last one started,
        or, idle since then, the next multiple of the period on the monotonic clock. A period
        after the last start, not the multiple after it: a tick that started early because every
        stream was ready (the phase the streams' codes arrive at) would otherwise be followed by
        a second one at that multiple, before the period is over, with the streams that came in
        between, and the rest of them in a third: on this CPU 24 streams aligned to 85.3 ms
        (the tick trace, 2026-12-05) ran as 3 ticks every 2 periods (24, 22, 2 streams) where 2
        of 24 each do. Plus ``tick_slack_ms``: a tick that started when the last stream's codes
        came is due a period later, just when that stream's next codes are; without slack, codes
        a little late miss it and wait a period."""
        due = self._tick_t + align_s + self.slack_s
        return due if due > now else (now // align_s + 1) * align_s

    def _gather_until(self, deadline: float) -> str:
        """Apply commands until ``deadline`` (monotonic seconds) or until every open stream
        may be ready (the batch cannot grow), then send what they produced. Which ended it:
        "boundary", "boundary-passed" (on entry), "all-ready" or "stopped"."""
        why = "stopped"
        self._holds.clear()  # the holds were for the round before: that round has run
        while self.running:
            for _ in range(_EXPRESS_ROUNDS):
                if not self._fresh or self._held():
                    break
                self._express(deadline)
            if self._missed and self._catch_ups_left > 0:
                self._catch_up(deadline)
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                why = "boundary-passed"
                break
            wait_s = left
            if self._fresh:  # more express ticks: at once, or when the first held model may go
                wait_s = min(left, self._fresh_wait_s(now))
            if not self._wait(wait_s):
                if self._fresh:  # more express ticks to run and no command waiting
                    continue
                why = "boundary"
                break
            self.drain()
            if self._all_waiting():
                why = "all-ready"
                break
        self.flush()
        return why

    def _held(self) -> bool:
        """Whether every fresh stream's model holds back its express tick (first_audio_gap_ms)."""
        return bool(self._holds) and self._fresh_wait_s(time.monotonic()) > 0.0

    def _fresh_wait_s(self, now: float) -> float:
        """0 while some fresh stream's model may take an express tick, else the seconds until
        the first hold ends."""
        until = None
        for st in self._fresh.values():
            m = self.where.get(st.sid)
            h = self._holds.get(m.name) if m is not None else None
            if h is None or h <= now:
                return 0.0
            until = h if until is None else min(until, h)
        return 0.0 if until is None else until - now

    def _warm_step(self) -> None:
        """One tick of a background warm-up (the worker was idle)."""
        if time.monotonic() < self._background_wait_until:
            return
        if self._warming is None:
            lm, buckets = self._background[0]
            self._warming = lm.warm_steps(buckets)
        try:
            waiting = next(self._warming)
        except StopIteration:
            self._warming = None
            self._background.pop(0)
            return
        except Exception as e:  # never let a warm-up take the worker down
            logger.warning("background warm-up failed: %s", e)
            self._warming = None
            self._background.pop(0)
            return
        if waiting:  # its dummies need stream slots that real streams hold: later
            self._background_wait_until = time.monotonic() + 0.5

    def _pause_warm(self) -> bool:
        """Free the stream slots a background warm-up holds (it starts its bucket again later);
        whether it held any."""
        if self._warming is None:
            return False
        self._warming.close()  # its finally closes the dummies
        self._warming = None
        self._background_wait_until = time.monotonic() + 1.0
        return True

    def close(self) -> None:
        self.gc.uninstall()
        self._pause_warm()
        self._background.clear()
        for m in self.models.values():
            for st in list(m.streams.values()):
                st.stream.close()
            m.streams.clear()
            m.lm.close()
        self.where.clear()

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        models: dict[str, Any] = {}
        for name, m in self.models.items():
            ms = list(m.tick_ms)
            pending = 0
            for st in m.streams.values():
                i = st.stream.stats
                pending += max(0, i.frames_pushed - i.frames_decoded)
            models[name] = {
                "codecrt": asdict(m.lm.ctx.stats),
                "precision": m.lm.ctx.precision,
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
                "tick_ms_p99": round(sorted(ms)[min(len(ms) - 1, (99 * len(ms)) // 100)], 4)
                if ms else None,
                "tick_anatomy": m.anatomy.summary(),
                "chunk_frames": m.lm.chunk_frames,
                "latency_samples": m.lm.latency_samples,
                "warm": dict(m.lm.warm_info),
                "batched": True,  # flow streams: where their chunks' shapes agree
                "express_ticks": m.express_ticks,
                "express_holds": m.express_holds,
                "catch_up_ticks": m.catch_up_ticks,
                "catch_up_streams": m.catch_up_streams,
                # the fit express ticks are sized by: ms a tick, ms a stream (None: no fit yet)
                "tick_cost_ms": m.cost.line(),
            }
        return {"pid": os.getpid(), "index": self.index, "device": self.device,
                "uptime_s": round(time.monotonic() - self.t_start, 3),
                "commands": self.commands, "rounds": self.rounds,
                "fronts": {str(f): {"streams": len(l.sids), "packets_in": l.packets_in,
                                    "packets_out": l.packets_out, "backlog": len(l.backlog)}
                           for f, l in self.fronts.items()},
                "load_ms": round(self.warmup_ms, 3), "models": models,
                # the cadence as resolved (auto settings follow the device and the load)
                "cadence": {"period_ms": round(self._align_s() * 1e3, 3),
                            "slack_ms": round(self.slack_s * 1e3, 3),
                            "first_audio": "now" if self.express else "cadence",
                            "first_audio_gap_ms": self.first_gap_ms,
                            "catch_up": self.catch_up},
                "gc": {"ms": round(self.gc.ms, 3), "collections": self.gc.collections},
                "phase_s": {k: round(v, 6) for k, v in self.phases.wall.items()},
                "phase_cpu_s": {k: round(v, 6) for k, v in self.phases.cpu.items()}}


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


def serve_fd(fd: int, fdsock: int = -1) -> None:
    """Process entry point: serve the parent on the connected socket ``fd`` (and take front
    channels from the SOCK_SEQPACKET socket ``fdsock``, when given).

    The first packet is the parent's hello and the configuration; a parent of another
    wire version is answered with this end's hello and ``Failed``."""
    conn = Connection(fd)
    try:
        first = wire.decode(conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(EXIT_START_FAILED)
    except wire.WireError as e:
        _refuse(conn, f"unreadable first packet: {e}")
    try:
        rest = wire.check_hello(first)
    except wire.VersionError as e:
        _refuse(conn, str(e))
    if not rest or not isinstance(rest[0], wire.Configure):
        _refuse(conn, "the first packet has no configuration")
    c = rest[0]
    try:
        cfg = EngineConfig.from_json(c.config)
    except ValueError as e:
        _refuse(conn, f"bad engine configuration: {e}")
    fs = None
    if fdsock >= 0:
        fs = socket.socket(fileno=fdsock)
        fs.setblocking(False)
    main(conn, cfg, c.device, c.index, c.parent_pid, rest[1:], fs)


def _refuse(conn: Connection, message: str) -> NoReturn:
    try:
        conn.send_bytes(wire.encode([wire.Hello(), wire.Failed(message)]))
    finally:
        os._exit(EXIT_START_FAILED)


def main(conn: Connection, cfg: EngineConfig, device: str, index: int, parent_pid: int,
         pending: Sequence[wire.Message] = (), fdsock: socket.socket | None = None) -> None:
    """Load, warm up, report ready, then run the loop until ``stop`` (or the parent goes)."""
    _die_with_parent(parent_pid)
    # the daemon decides when we stop: Ctrl-C in a terminal and systemd's SIGTERM to
    # the whole cgroup reach the parent, which stops us with a "stop" command
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    w = Worker(conn, cfg, device, index, fdsock)
    w.out.append(wire.Hello())
    root = logging.getLogger()
    root.addHandler(_ForwardHandler(w))
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    try:
        info = w.load()
    except Exception as e:  # codecrt errors, bad paths, bad device: the parent reports it
        try:
            w.out.append(wire.Failed(f"{type(e).__name__}: {e}"))
            w.flush()
        finally:
            os._exit(EXIT_START_FAILED)
    w.out.append(wire.Ready(info))
    w.flush()
    try:
        for cmd in pending:  # commands that came with the configuration
            w.apply(cmd)
        w.flush()
        w.loop()
    except (EOFError, OSError):  # the parent went away
        os._exit(0)
    except wire.WireError as e:  # the parent's bytes are not a packet: a bug; it restarts us
        logger.error("unreadable command packet: %s", e)
        w.flush()
        os._exit(EXIT_START_FAILED)
    w.close()
    try:
        conn.send_bytes(wire.encode([wire.Stopped()]))
    except OSError:
        pass
    conn.close()
