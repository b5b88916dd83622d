"""Where the engine worker's tick goes: its host work per stream against the runtime alone.

    python -m bench worker --spawn light --n 64,256,1000 --device cpu --threads 1
    python -m bench worker --spawn demo --n 256,512,1000 --device cuda:0   (bench/gpu/run.sh)

One real :class:`codecd.worker.Worker` in this process, with one real front channel
(the shared-memory rings and doorbells of ``codecd serve``, attached through its
descriptor socket as main attaches a front). This process plays the front: it opens
N streams, then per tick writes one PUSH record with the next 4 frames of every
stream (as a front does once per event-loop turn), lets the worker apply it and
tick, and reads the AUDIO record back (checking that every stream got its chunk).
The worker's own phase timers (``Worker.phase_s``, also in /metrics as
``codecd_worker_phase_seconds``) split each tick's wall time into

* ingest: the front's records read and decoded, every stream's codes pushed;
* step: ``codecrt.step`` (the runtime: inputs, graph compute, outputs);
* collect: every stream's PCM pulled and its state read;
* flush: the events routed to their front, encoded, written to the ring.

Then the runtime alone in the same process, on the same device, same N and chunk:
``codecrt.step`` over N streams with their codes pushed ahead and a pull per stream
(as ``python -m bench gpu`` times it). Printed per N: the phases in µs per stream
per tick, the step's ms, the whole tick's ms and its p99, the runtime alone's p99,
the process CPU time per tick, and the ratio tick / runtime alone. Steady ticks
only (the first ticks inside the decoder's latency are run and not timed).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "daemon"))

PERIOD_FRAMES = 4  # SNAC 24 kHz: 4 frames = one tick = 85.3 ms
PULL_SAMPLES = 4096  # per stream per pull: a tick's audio (SNAC 2,048, Mimi and Qwen3 1,920)
HOST = ("ingest", "collect", "flush")  # the worker's phases that are not the runtime's step
ANATOMY = ("total", "launch", "acquire", "inputs", "enqueue", "overlap", "wait", "collect", "gc")


def tiny_model() -> Path:
    """A random SNAC with the 24 kHz layout and 16 decoder channels: its step is cheap on a
    CPU, so the worker's host work per stream is what the tick shows."""
    from bench.fronts import small_snac24

    return small_snac24("tiny", latent_dim=8, decoder_dim=16)


def model_path(source: str) -> str:
    if source == "tiny":
        return str(tiny_model())
    if source == "light":
        from bench.fronts import light_model
        return str(light_model())
    if source == "demo":
        from codecd.config import ensure_demo_model
        return str(ensure_demo_model())
    return source


class FrontSide:
    """This process's end of one front channel: the front's command producer and event
    consumer. ``ctl``: the daemon's end of the worker's descriptor socket."""

    def __init__(self, ctl: socket.socket, fid: int) -> None:
        from codecd.channel import FrontEnds, make_channel, send_msg

        ch = make_channel()
        send_msg(ctl, {"op": "attach", "fid": fid}, ch.worker_fds)
        self.ends = FrontEnds.from_fds(list(ch.front_fds))
        for fd in ch.worker_fds[1::2]:  # the doorbells' worker ends (sent); from_fds closed the rings
            os.close(fd)

    def send(self, msgs, per_record: int = 0) -> None:
        """``msgs`` in one ring record, or in records of ``per_record`` messages each (a front
        flushes what a millisecond gathered: a few streams' codes a record)."""
        from codecd import wire

        step = per_record or max(1, len(msgs))
        for i in range(0, len(msgs), step):
            if not self.ends.commands.write([wire.encode(msgs[i:i + step])]):
                raise SystemExit("the command ring is full")
        self.ends.commands.ring()

    def events(self):
        from codecd import wire

        self.ends.events.on_doorbell()
        out = []
        for rec in self.ends.events.records():
            out += [m for m in wire.decode(bytes(rec))]
        return out


def attach_fronts(worker, fronts: int) -> tuple[socket.socket, list[FrontSide]]:
    """``fronts`` channels attached to ``worker`` through its descriptor socket, as the daemon's
    main process attaches each front's."""
    ctl, worker.fdsock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker.fdsock.setblocking(False)
    return ctl, [FrontSide(ctl, f + 1) for f in range(fronts)]


def run_daemon_side(path: str, n: int, ticks: int, device: str, threads: int, rng,
                    per_record: int = 0, fronts: int = 1) -> dict:
    """The worker with ``fronts`` front channels (stream i on front i % fronts, as the
    daemon's fronts share connections): N streams, ``ticks`` timed ticks; each tick's codes
    of a front in one PUSH record, or in records of ``per_record`` streams."""
    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.channel import EVT_RING_BYTES
    from codecd.worker import PHASES, Worker

    per_tick = -(-n // fronts) * 4 * PERIOD_FRAMES * 512  # a front's PCM bytes a tick
    if per_tick > EVT_RING_BYTES:
        raise SystemExit(f"a tick's audio of {-(-n // fronts)} streams ({per_tick >> 20} MiB) "
                         f"does not fit a front's event ring ({EVT_RING_BYTES >> 20} MiB): "
                         "use more --fronts")
    cfg = EngineConfig(models={"m": path}, n_threads=threads, max_streams=n, max_batch=n,
                       warm_buckets=(n,), gather_ms=0.0)
    a, _b = Pipe()
    w = Worker(a, cfg, device)
    w.load()
    _ctl, sides = attach_fronts(w, fronts)
    mine = [list(range(f, n, fronts)) for f in range(fronts)]  # stream indices per front
    for side, idx in zip(sides, mine):
        side.send([wire.OpenStream(j + 1, "m") for j in range(len(idx))])
    w.drain()
    w.flush()
    opened = sum(isinstance(m, wire.StreamOpened) for side in sides for m in side.events())
    if opened != n:
        raise SystemExit(f"{opened} of {n} streams opened")
    strides = (4, 2, 1)
    # not timed: the ticks inside the decoder's latency (edge graphs), and enough ticks for the
    # PCM to go once round every event ring (its pages are touched for the first time then)
    warm = 4 + -(-EVT_RING_BYTES // per_tick)
    walls, cpus, snaps, snaps_cpu = [], [], [], []
    for t in range(warm + ticks):
        if t == warm:  # the anatomy of the timed ticks only
            w.models["m"].anatomy.ticks.clear()
        codes = rng.integers(0, 4096, size=(n, 7 * PERIOD_FRAMES // 4), dtype=np.int32)
        for side, idx in zip(sides, mine):
            side.send([wire.PushCodes(j + 1, [codes[i, :PERIOD_FRAMES // s] for s in strides])
                       for j, i in enumerate(idx)], per_record)
        before, before_cpu = dict(w.phases.wall), dict(w.phases.cpu)
        c0, t0 = time.process_time(), time.perf_counter()
        w.drain()
        w.run_ticks()
        t1, c1 = time.perf_counter(), time.process_time()
        got = sum(isinstance(m, wire.AudioOut) for side in sides for m in side.events())
        if t >= warm:
            if got != n:
                raise SystemExit(f"tick {t}: audio for {got} of {n} streams")
            walls.append(t1 - t0)
            cpus.append(c1 - c0)
            snaps.append({k: w.phases.wall[k] - before[k] for k in PHASES})
            snaps_cpu.append({k: w.phases.cpu[k] - before_cpu[k] for k in PHASES})
    anatomy = w.models["m"].anatomy.summary()
    w.close()
    phases = {k: float(np.mean([s[k] for s in snaps])) for k in PHASES}
    phases_cpu = {k: float(np.mean([s[k] for s in snaps_cpu])) for k in PHASES}
    return {"phases": phases, "phases_cpu": phases_cpu, "wall": walls, "cpu": cpus,
            "anatomy": anatomy}


def run_runtime_alone(path: str, n: int, ticks: int, device: str, threads: int, rng,
                      max_batch: int = 0, batch_bucket: bool = True, chunk_frames: int = 0,
                      feed: Callable[[int, list], None] | None = None) -> list[float]:
    """codecrt.step over N streams and one ``pull_many`` of all N, as the daemon's worker
    pulls (``max_batch``: the daemon's, which decides the tick graph's batch bucket, default N;
    with more streams than it, a tick is one step per ``max_batch`` of them). Tick times after
    4 warm-up ticks. SNAC's codes for every tick are pushed before the first; ``feed(t,
    streams)`` instead pushes tick t's codes inside the timed tick (a levels model's frame per
    stream in one ``push_many``, ``bench.fronts.levels_feed``), with ``chunk_frames`` the
    context's tick."""
    import codecrt

    with codecrt.Model(path) as model, codecrt.Context(
            model, device=device, n_threads=threads, max_batch=max_batch or n, max_streams=n,
            stream_chunk_frames=chunk_frames, batch_bucket=batch_bucket) as ctx:
        ss = [ctx.stream() for _ in range(n)]
        if feed is None:
            for s in ss:
                s.push([rng.integers(0, 4096, (4 + ticks) * PERIOD_FRAMES // st, dtype=np.int32)
                        for st in (4, 2, 1)])
        times = []
        mb = max_batch or n  # more streams than a graph holds: one graph per max_batch of them
        pcm = np.empty(n * PULL_SAMPLES, dtype=np.float32)  # a tick's audio of all N, reused
        for t in range(4 + ticks):
            t0 = time.perf_counter()
            if feed is not None:
                feed(t, ss)
            for i in range(0, n, mb):
                ctx.step(ss[i:i + mb])
            while (codecrt.pull_many(ss, pcm)[1] & codecrt.PULL_MORE).any():
                pass  # the buffer ran out before every stream's tick fitted: pull the rest
            if t >= 4:
                times.append(time.perf_counter() - t0)
        for s in ss:
            s.close()
    return times


def p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spawn", default="light", metavar="SOURCE",
                    help="a GGUF path, demo (SNAC 24 kHz, random weights), light (the SNAC "
                    "24 kHz layout with 64 decoder channels) or tiny (16: the cheapest decode)")
    ap.add_argument("--n", default="64,256", help="comma-separated stream counts")
    ap.add_argument("--ticks", type=int, default=20, help="timed ticks per N")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads of the runtime")
    ap.add_argument("--per-record", type=int, default=0, metavar="K",
                    help="streams per PUSH record (0: a tick's codes in one record; a front's "
                    "1 ms flush gathers about 6 at 500 streams a front)")
    ap.add_argument("--fronts", type=int, default=1, metavar="F",
                    help="front channels, stream i on front i %% F (a front's event ring holds "
                    "a tick's audio of about 2,000 SNAC streams)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="cProfile the worker side and print its K costliest functions per N")
    args = ap.parse_args()
    path = model_path(args.spawn)
    from codecd.worker import PHASES

    rng = np.random.default_rng(0)
    print(f"worker tick against the runtime alone: {args.spawn}, {args.device}, "
          f"threads {args.threads}, {PERIOD_FRAMES} frames per tick, {args.ticks} ticks per N, "
          f"{args.per_record or 'all'} streams per PUSH record, {args.fronts} front(s)")
    print("\nhost phases in µs of the worker thread's CPU per stream per tick (wall in "
          "parentheses); step = codecrt.step's wall")
    print("\n| N | ingest | collect | flush | host total | step ms | tick ms mean | tick ms p99 "
          "| runtime alone ms p99 | tick p99 / runtime alone p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    anatomy: list[str] = []
    for n in (int(x) for x in args.n.split(",")):
        prof = None
        if args.profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        d = run_daemon_side(path, n, args.ticks, args.device, args.threads, rng,
                            args.per_record, args.fronts)
        if prof is not None:
            import pstats
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
        alone = run_runtime_alone(path, n, args.ticks, args.device, args.threads, rng)
        ph, pc = d["phases"], d["phases_cpu"]
        cell = {k: f"{1e6 * pc[k] / n:.1f} ({1e6 * ph[k] / n:.1f})" for k in PHASES}
        host_cpu = sum(pc[k] for k in HOST) * 1e6 / n
        host_wall = sum(ph[k] for k in HOST) * 1e6 / n
        print(f"| {n} | {cell['ingest']} | {cell['collect']} | {cell['flush']} | "
              f"{host_cpu:.1f} ({host_wall:.1f}) | {1e3 * ph['step']:.1f} | "
              f"{1e3 * np.mean(d['wall']):.1f} | {1e3 * p99(d['wall']):.1f} | "
              f"{1e3 * p99(alone):.1f} | {p99(d['wall']) / p99(alone):.2f} |", flush=True)
        for which in ("all", "slowest"):
            a = d["anatomy"][which]
            anatomy.append(f"| {n} | {which} | " + " | ".join(f"{a.get(p, 0.0):.2f}" for p in ANATOMY)
                           + " |")
    print("\nthe timed ticks' anatomy (codecd.anatomy, ms; launch = codecrt.step_begin, split by the "
          "runtime into acquire / inputs / enqueue; overlap = the front's records read meanwhile; "
          "wait = codecrt.step_end)\n")
    print("| N | ticks | " + " | ".join(ANATOMY) + " |\n|---|---|" + "---|" * len(ANATOMY))
    print("\n".join(anatomy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
