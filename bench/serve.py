"""Load test of a running codecd server: N concurrent real-time Orpheus streams.

    python -m bench serve --url ws://127.0.0.1:8765 --model snac_24khz [--n 1,4,16]
    python -m bench serve --spawn demo              # starts `codecd serve --model demo=demo`
    python -m bench serve --spawn path/model.gguf --search --max-n 256

Each client opens one stream (``--per-conn`` streams share a connection) and
sends raw Orpheus token ids, 7 tokens (one group = 2048 samples at 24 kHz) per
message, paced at the codec's real rate (``--speed`` times it), for
``--seconds`` of audio; starts are staggered over one frame period (``--ramp S``: over S
seconds, so that the streams that start late meet the load of those before them, as
arrivals at a busy server do, rather than all starting at once). Reported per N:

* time to first audio (first tokens sent -> first audio frame), p50 / p99;
* inter-chunk gap p99 (arrival gaps of audio frames within a stream);
* underruns: a gap longer than the audio the client had buffered so far (playback
  starting at the first frame, no priming; playout restarts after each underrun);
* busy refusals (``busy`` / ``too_many_streams`` / HTTP 503) and other errors;
* server CPU (utime+stime of the server and its worker processes, from /proc, when
  ``--spawn``ed; as cores = CPU seconds / wall seconds), and the workers' part of it;
* the workers' ticks (from the servers' ``/metrics``): ticks per second, the mean
  batch and the mean tick time of recent ticks: how full the batches were.

``--daemons K`` spawns K servers on K ports (several daemon processes on one
device, as behind the shipped HAProxy config) and deals connections to them in
turn; ``--client-procs P`` spreads the clients over P processes, so that the
load generator is not the bottleneck.

Tokens arrive one frame period apart, so gaps are ~85.3 ms by construction; the
criterion is the p99 gap's *excess* over that nominal spacing: p99 gap - 85.3 ms < 85.3 ms
(a stream is late by less than one frame). ``--search`` doubles N until that fails or a
stream is refused, then bisects: the largest N that meets it. Loopback only; every
run is bounded by ``--seconds`` plus a timeout. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))

from codecd.client import Client, ServerError  # noqa: E402

SR = 24000
GROUP = 2048
PERIOD = GROUP / SR
BASE = 128266


@dataclass(frozen=True)
class Load:
    """What one stream of the load sends: Orpheus ids (7 per message, one SNAC 24 kHz frame
    period apart) or frames of ``codebooks`` codes in the levels layout (one JSON message of
    one frame per ``period``: Mimi, the Qwen3 tokenizer)."""

    layout: str = "orpheus_ids"
    sample_rate: int = SR
    period: float = PERIOD          # seconds of audio per message
    codebooks: int = 0              # levels layout: codes per frame
    codebook_size: int = 4096

    def describe(self) -> str:
        if self.layout == "orpheus_ids":
            return "Orpheus ids"
        return f"frames of {self.codebooks} codebooks (levels layout)"


ORPHEUS = Load()
MIMI_FRAME = 1920  # samples of one 12.5 Hz frame at 24 kHz (Mimi and the Qwen3 tokenizer)


def levels_load(codebooks: int, codebook_size: int) -> Load:
    """A Mimi or Qwen3 tokenizer stream: one 80 ms frame of ``codebooks`` codes per message."""
    return Load("levels", SR, MIMI_FRAME / SR, codebooks, codebook_size)


@dataclass
class StreamResult:
    ttfa: float | None = None
    gaps: list[float] = field(default_factory=list)
    underruns: int = 0
    samples: int = 0
    refused: bool = False
    error: str | None = None
    t_first: float = 0.0  # time.monotonic() of the first audio frame (system-wide clock)
    sizes: list[int] = field(default_factory=list)  # samples of each audio frame, in order
    conn: int = -1        # the load's connection index
    # seconds each message went out behind its schedule (the load generator's own lag: its
    # event loop busy; a frame sent late reaches the daemon late whatever the daemon does)
    send_lags: list[float] = field(default_factory=list)


def _p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


@dataclass
class RunResult:
    n: int
    streams: list[StreamResult]
    wall: float
    cpu_s: float | None
    speed: float = 1.0
    worker_cpu_s: float | None = None
    ticks: dict[str, float] | None = None  # from /metrics: per_s, batch, tick_ms
    period: float = PERIOD  # the load's message period (seconds of audio per message)

    def _all(self, attr: str) -> np.ndarray:
        return np.array([getattr(s, attr) for s in self.streams if getattr(s, attr) is not None])

    def ttfa(self, q: float) -> float:
        v = self._all("ttfa")
        return float(np.percentile(v, q)) if v.size else float("nan")

    def ttfa_later_half(self, q: float) -> float:
        """TTFA percentile of the half of the streams that started last (first tokens sent at
        or after the median start): with ``--ramp``, the arrivals that met most of the load."""
        sent = [(s.t_first - s.ttfa, s.ttfa) for s in self.streams if s.ttfa is not None]
        if not sent:
            return float("nan")
        sent.sort()
        return float(np.percentile([t for _, t in sent[len(sent) // 2:]], q))

    def gap_p99(self) -> float:
        return _p99([g for s in self.streams for g in s.gaps])

    def gap_p99_split(self) -> tuple[float, float]:
        """The p99 of the gaps after each stream's first audio, and of its later gaps: an
        early first audio (first_audio now) lengthens the first, a tick that misses a stream
        the later ones; gap_p99, the criterion's, pools both."""
        return (_p99([s.gaps[0] for s in self.streams if s.gaps]),
                _p99([g for s in self.streams for g in s.gaps[1:]]))

    def send_lag(self, q: float) -> float:
        """Percentile q (100: the largest) of every message's lag behind its send schedule, s."""
        v = [x for st in self.streams for x in st.send_lags]
        return float(np.percentile(v, q)) if v else float("nan")

    @property
    def underruns(self) -> int:
        return sum(s.underruns for s in self.streams)

    @property
    def refused(self) -> int:
        return sum(s.refused for s in self.streams)

    @property
    def errors(self) -> int:
        return sum(s.error is not None and not s.refused for s in self.streams)

    @property
    def ok(self) -> bool:
        excess = self.gap_p99() - self.period / self.speed
        return self.refused == 0 and self.errors == 0 and excess < self.period


def ids_for(n_groups: int, rng: np.random.Generator) -> np.ndarray:
    codes = rng.integers(0, 4096, size=7 * n_groups)
    return (codes + BASE + (np.arange(codes.size) % 7) * 4096).astype(np.int64)


async def one_stream(c: Client, model: str, n_groups: int, speed: float, delay: float,
                     seed: int, load: Load = ORPHEUS, conn: int = -1) -> StreamResult:
    r = StreamResult(conn=conn)
    rng = np.random.default_rng(seed)
    if load.layout == "orpheus_ids":
        ids = ids_for(n_groups, rng)
    else:  # [frame, codebook]
        codes = rng.integers(0, load.codebook_size, (n_groups, load.codebooks))
    await asyncio.sleep(delay)
    try:
        s = await c.start(model, layout=load.layout, format="pcm_s16le",
                          codebooks=load.codebooks or None)
    except ServerError as e:
        r.refused = e.code in ("busy", "too_many_streams")
        r.error = e.code
        return r
    t_send: list[float] = []

    async def feed() -> None:
        t0 = time.monotonic()
        for g in range(n_groups):
            due = t0 + g * load.period / speed
            d = due - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            now = time.monotonic()
            r.send_lags.append(max(0.0, now - due))
            if not t_send:
                t_send.append(now)
            if load.layout == "orpheus_ids":
                await s.send_tokens(ids[7 * g:7 * g + 7], binary=True)
            else:  # one JSON message per frame: one array of one code per codebook
                await s.send_levels(codes[g][:, None])
        await s.end()

    task = asyncio.create_task(feed())
    last = None
    play_t0 = 0.0
    played_base = 0  # samples received when playout (re)started
    try:
        async for ch in s:
            t = ch.received_at
            if last is None:
                r.ttfa = t - t_send[0] if t_send else 0.0
                r.t_first = t
                play_t0, played_base = t, 0
            else:
                r.gaps.append(t - last)
                if (t - play_t0) * load.sample_rate > r.samples - played_base:  # ran dry
                    r.underruns += 1
                    play_t0, played_base = t, r.samples
            last = t
            r.samples += len(ch)
            r.sizes.append(len(ch))
        await task
    except ServerError as e:
        r.error = e.code
        task.cancel()
    return r


def _cpu_of_tree(pid: int) -> tuple[float, float]:
    """utime+stime (s) of pid and its live descendants: (all of them, the descendants alone)."""
    tck = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2:].split()
        p = int(d)
        kids.setdefault(int(f[1]), []).append(p)
        stats[p] = (int(f[11]) + int(f[12])) / tck
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo.extend(kids.get(p, []))
    return total, total - stats.get(pid, 0.0)


async def load_part(urls: list[str], model: str, n: int, seconds: float, speed: float, per_conn: int,
                    token: str | None, timeout: float, part: int = 0, parts: int = 1,
                    load: Load = ORPHEUS, ramp: float = 0.0) -> list[StreamResult]:
    """The streams of connections part, part + parts, ...: connection ci goes to urls[ci % len(urls)];
    each stream starts at a uniform random time within one frame period, or within ``ramp`` seconds."""
    n_groups = max(1, int(round(seconds / load.period)))
    spread = max(load.period, ramp)
    rnd = random.Random(n * 1000 + part)
    n_conn = -(-n // per_conn)

    async def conn_task(ci: int) -> list[StreamResult]:
        k = min(per_conn, n - ci * per_conn)
        url = urls[ci % len(urls)]
        try:
            async with Client(url, token=token, queue_size=1024) as c:
                return list(await asyncio.gather(*(
                    one_stream(c, model, n_groups, speed, rnd.uniform(0, spread),
                               ci * per_conn + j, load, ci) for j in range(k))))
        except ServerError as e:
            return [StreamResult(refused=True, error=e.code) for _ in range(k)]
        except Exception as e:  # noqa: BLE001 - HTTP 503 on the upgrade, resets
            refused = "503" in str(e)
            return [StreamResult(refused=refused, error=type(e).__name__) for _ in range(k)]

    res = await asyncio.wait_for(asyncio.gather(*(conn_task(i) for i in range(part, n_conn, parts))), timeout)
    return [s for lst in res for s in lst]


def _load_part_proc(job: tuple) -> list[StreamResult]:
    return asyncio.run(load_part(*job))


def scrape_ticks(urls: list[str], token: str | None) -> tuple[float, float, float] | None:
    """(ticks so far, mean recent batch, mean recent tick ms) over the servers' /metrics, or None."""
    total, batches, times = 0.0, [], []
    for url in urls:
        req = urllib.request.Request(url.replace("ws://", "http://", 1).rstrip("/") + "/metrics")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("codecd_ticks_total{"):
                total += float(value)
            elif name.startswith("codecd_batch_size_recent{"):
                batches.append(float(value))
            elif name.startswith("codecd_tick_seconds_mean{"):
                times.append(1e3 * float(value))
    return (total, sum(batches) / len(batches) if batches else 0.0,
            sum(times) / len(times) if times else 0.0)


def run_load(urls: list[str], model: str, n: int, seconds: float, speed: float, per_conn: int,
             token: str | None, server_pids: list[int], timeout: float, procs: int = 1,
             load: Load = ORPHEUS, ramp: float = 0.0) -> RunResult:
    def cpu_now() -> tuple[float, float]:
        trees = [_cpu_of_tree(p) for p in server_pids]
        return sum(t for t, _ in trees), sum(w for _, w in trees)

    cpu0 = cpu_now()
    tick0 = scrape_ticks(urls, token)
    t0 = time.monotonic()
    parts = max(1, min(procs, -(-n // per_conn)))
    jobs = [(urls, model, n, seconds, speed, per_conn, token, timeout, i, parts, load, ramp)
            for i in range(parts)]
    if parts == 1:
        streams = _load_part_proc(jobs[0])
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(parts) as pool:
            streams = [s for lst in pool.map(_load_part_proc, jobs) for s in lst]
    wall = time.monotonic() - t0
    cpu1 = cpu_now()
    tick1 = scrape_ticks(urls, token)
    ticks = None
    if tick0 is not None and tick1 is not None:
        ticks = {"per_s": (tick1[0] - tick0[0]) / wall, "batch": tick1[1], "tick_ms": tick1[2]}
    if not server_pids:
        return RunResult(n, streams, wall, None, speed, None, ticks, load.period)
    return RunResult(n, streams, wall, cpu1[0] - cpu0[0], speed, cpu1[1] - cpu0[1], ticks, load.period)


def server_env() -> dict[str, str]:
    """The environment of a spawned ``codecd serve``: it imports codecrt from where this process
    finds it (an installed extension, as on the GPU machine, must not be shadowed by the source
    tree's bindings/, which has no compiled module)."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("codecrt")
    bindings = Path(spec.origin).parent.parent if spec and spec.origin else ROOT / "bindings"
    env["PYTHONPATH"] = os.pathsep.join([str(bindings), str(ROOT / "daemon"), env.get("PYTHONPATH", "")])
    return env


def spawn_server(source: str, args) -> tuple[subprocess.Popen, str]:
    """Start ``codecd serve`` on a free loopback port and wait for ``/readyz``. Its log goes to
    a file (``proc.log_path``; ``--server-log`` names it), never to a pipe: nobody reads a pipe
    while the load runs, and a daemon whose log fills the pipe's 64 KiB (two lines per
    connection: a few rows of a thousand streams) blocks in its logging on every front, which a
    run would measure as the daemon's own stalls."""
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    env = server_env()
    cmd = [sys.executable, "-m", "codecd.cli", "serve", "--listen", f"127.0.0.1:{port}",
           "--model", f"{args.model}={source}", *args.serve_arg]
    named = getattr(args, "server_log", None)
    if named:
        log_path = Path(named).with_name(f"{Path(named).stem}-{port}{Path(named).suffix}")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 (the daemon's, closed below once handed over)
    else:
        fd, name = tempfile.mkstemp(prefix="codecd-bench-serve-", suffix=".log")
        log, log_path = os.fdopen(fd, "wb"), Path(name)
    with log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log_path = log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + args.startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"codecd serve exited {proc.returncode}: {log_tail(log_path, 2000)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status != 200:
                    raise OSError(r.status)
            return proc, f"ws://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"codecd serve did not listen in time: {log_tail(log_path, 2000)}")


def log_tail(path: Path, n_bytes: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - n_bytes))
        return f.read().decode(errors="replace")


def log_summary(proc: subprocess.Popen, most: int = 12) -> str:
    """A spawned daemon's log after its rows: its size, and its warnings and errors (the
    last ``most`` of them), so that a run says whether the daemon complained."""
    path: Path = proc.log_path  # type: ignore[attr-defined]
    lines = path.read_text(errors="replace").splitlines()
    bad = [ln for ln in lines if any(w in ln for w in ("WARNING", "ERROR", "CRITICAL", "Traceback",
                                                       '"warning"', '"error"', '"critical"'))]
    out = f"daemon log {path}: {len(lines)} lines, {len(bad)} warnings or errors"
    return out + "".join(f"\n    {ln[:300]}" for ln in bad[-most:])


def row(r: RunResult) -> str:
    cpu = f"{r.cpu_s / r.wall:.2f}" if r.cpu_s is not None else "-"
    if r.worker_cpu_s is not None:
        cpu += f" ({r.worker_cpu_s / r.wall:.2f} workers)"
    t = r.ticks
    ticks = f"{t['per_s']:.0f} / {t['batch']:.1f} / {t['tick_ms']:.1f}" if t else "-"
    return (f"| {r.n} | {1000 * r.ttfa(50):.1f} | {1000 * r.ttfa(99):.1f} | "
            f"{1000 * r.gap_p99():.1f} | {r.underruns} | {r.refused} | {r.errors} | {cpu} | {ticks} | "
            f"{'yes' if r.ok else 'no'} |")


HEADER = ("| N | TTFA p50 ms | TTFA p99 ms | gap p99 ms | underruns | busy | errors | "
          "server CPU cores | ticks/s / batch / tick ms | p99 excess < 85.3 ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--url", help="a running server, ws://127.0.0.1:PORT")
    g.add_argument("--spawn", metavar="SOURCE", help="start codecd serve with this model "
                   "source (a GGUF path or demo)")
    ap.add_argument("--model", default="snac_24khz", help="model name (default snac_24khz)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for codecd serve (repeatable), e.g. --serve-arg=--threads=2")
    ap.add_argument("--n", default="1,4,16", help="comma-separated client counts (without --search)")
    ap.add_argument("--search", action="store_true", help="find the largest N meeting the p99 gap")
    ap.add_argument("--max-n", type=int, default=256)
    ap.add_argument("--max-runs", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=3.0, help="audio per utterance")
    ap.add_argument("--speed", type=float, default=1.0, help="token rate, times real time")
    ap.add_argument("--per-conn", type=int, default=1, help="streams per connection")
    ap.add_argument("--ramp", type=float, default=0.0, metavar="S",
                    help="start the streams over S seconds (default: over one frame period)")
    ap.add_argument("--token", default=os.environ.get("CODECD_TOKEN"))
    ap.add_argument("--startup-timeout", type=float, default=120.0)
    ap.add_argument("--server-log", default="", metavar="PATH",
                    help="the spawned daemon's log file (its port is added to the name; default: a temporary file); its warnings and errors are printed after the rows")
    ap.add_argument("--daemons", type=int, default=1, help="with --spawn: servers to start (one port each)")
    ap.add_argument("--client-procs", type=int, default=1, help="processes the clients are spread over")
    args = ap.parse_args()

    procs: list[subprocess.Popen] = []
    urls = [args.url] if args.url else []
    timeout = args.ramp + args.seconds / args.speed + 60.0
    results: list[RunResult] = []

    def run(n: int) -> RunResult:
        r = run_load(urls, args.model, n, args.seconds, args.speed, args.per_conn, args.token,
                     [p.pid for p in procs], timeout, args.client_procs, ramp=args.ramp)
        results.append(r)
        print(row(r), file=sys.stderr, flush=True)
        return r

    try:
        for _ in range(args.daemons if args.spawn else 0):
            proc, url = spawn_server(args.spawn, args)
            procs.append(proc)
            urls.append(url)
        print(HEADER, file=sys.stderr)
        if not args.search:
            for n in (int(x) for x in args.n.split(",")):
                run(n)
            best = None
        else:
            good, bad, n = 0, None, 1
            while n <= args.max_n and len(results) < args.max_runs:
                if run(n).ok:
                    good, n = n, n * 2
                else:
                    bad = n
                    break
            while bad is not None and bad - good > 1 and len(results) < args.max_runs:
                mid = (good + bad) // 2
                if run(mid).ok:
                    good = mid
                else:
                    bad = mid
            best = good
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"\n{args.seconds:g} s utterances of Orpheus ids, 7 tokens per message at "
          f"{args.speed:g}x real time; frame period {1000 * PERIOD:.1f} ms; "
          f"starts over {max(PERIOD, args.ramp):g} s; "
          f"{len(urls)} server(s), clients in {args.client_procs} process(es)\n")
    print(HEADER)
    for r in sorted(results, key=lambda r: r.n):
        print(row(r))
    if best is not None:
        print(f"\nlargest N with p99 inter-chunk gap - period < {1000 * PERIOD:.1f} ms, no refusals: "
              f"{best}{' (search hit --max-n/--max-runs)' if best >= args.max_n else ''}")
    for i, proc in enumerate(procs):
        print(f"daemon {i}: " + log_summary(proc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
