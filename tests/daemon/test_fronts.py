"""``codecd serve --fronts N``: several front processes on one listening socket, one engine worker,
real processes and real websockets on 127.0.0.1, the small SNAC model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from smallmodel import small_codes
from serverkit import (
    serve_process,
    Client,
    assert_same_audio,
    expected,
    http_get,
    metric_value,
    metrics,
    send_stream,
    start_msg,
    wait_ready,
)

from websockets.exceptions import InvalidStatus  # noqa: E402

T = TypeVar("T")


def daemon(small: Path, log: Path, *flags: str, buckets: str | None = "1"
           ) -> contextlib.AbstractContextManager[tuple[subprocess.Popen[bytes], int]]:
    """``codecd serve`` (main, its fronts, one CPU worker) on a socket passed as systemd passes
    one (fd 3), unpaced, draining for 5 s; yields the main process and the port; SIGTERM (then
    SIGKILL) at the end."""
    return serve_process(small, log, "--max-ahead-s", "0", "--drain-timeout-s", "5", *flags,
                         buckets=buckets, backlog=256)


def children(pid: int, what: str) -> list[int]:
    """Child processes of ``pid`` whose command line contains ``what`` (codecd.front, ...)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and what in cmd:
            out.append(int(d))
    return sorted(out)


def fronts_of(main: int, n: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        got = children(main, "codecd.front")
        if len(got) == n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def owner(c: Client, pids: list[int]) -> int | None:
    """The front process that holds the server side of client ``c``'s connection."""
    lport = c.ws.transport.get_extra_info("sockname")[1]
    inodes: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    t = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if t.startswith("socket:["):
                        inodes[t[8:-1]] = pid
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if int(parts[2].split(":")[1], 16) == lport and parts[9] in inodes:
                return inodes[parts[9]]
    return None


async def spread(port: int, pids: list[int], n: int, min_per_front: int = 1,
                 tries: int = 60) -> dict[int, list[Client]]:
    """``n`` connections with at least ``min_per_front`` on every front (the kernel picks the
    front: open more and close the surplus until the spread is right)."""
    by: dict[int, list[Client]] = {p: [] for p in pids}
    for _ in range(tries):
        if sum(len(v) for v in by.values()) >= n and \
                all(len(v) >= min_per_front for v in by.values()):
            break
        for _ in range(100):  # a surplus connection just closed may not be released yet
            try:
                c = await Client.open(port)
                break
            except InvalidStatus as e:
                assert e.response.status_code == 503
                await asyncio.sleep(0.02)
        pid = owner(c, pids)
        assert pid is not None
        total = sum(len(v) for v in by.values())
        if total >= n or (len(by[pid]) >= min_per_front and
                          total >= n - sum(max(0, min_per_front - len(v)) for v in by.values())):
            await c.close()
            continue
        by[pid].append(c)
    assert all(len(v) >= min_per_front for v in by.values()), {p: len(v) for p, v in by.items()}
    return by


def run(coro: Any, timeout: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


# -------------------------------------------------------------------- tests


def test_fifty_streams_over_two_fronts_batch_in_one_worker(small: Path, offline: Any,
                                                           tmp_path: Path) -> None:
    """50 streams over connections on both fronts: every one equals the offline decode, the
    worker batched streams of both fronts in one tick (a batch larger than either front's
    share), and /metrics on any front counts the whole daemon."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        assert len(pids) == 2
        by = await spread(port, pids, 25, min_per_front=8)
        rng = np.random.default_rng(3)
        cases = []
        for pid, cs in by.items():
            for c in cs:
                for k in range(2):
                    sid = f"s{k}"
                    levels = small_codes(4 * int(rng.integers(40, 120)), rng)
                    await c.send(start_msg(sid, "levels", format="pcm_f32le"))
                    cases.append((pid, c, sid, levels))
        # every stream's codes before any end: the worker holds them all at once
        await asyncio.gather(*(send_stream(c, sid, lv, "levels", np.random.default_rng(i),
                                           end=False)
                               for i, (_, c, sid, lv) in enumerate(cases)))
        m = await metrics(port)
        share = {pid: sum(1 for q, *_ in cases if q == pid) for pid in pids}
        assert metric_value(m, "codecd_streams_active") == 50
        assert sorted(metric_value(m, "codecd_front_streams", front=str(i)) for i in range(2)) \
            == sorted(share.values())
        for _, c, sid, _ in cases:
            await c.send({"type": "end", "stream_id": sid})
        for _, c, sid, levels in cases:
            t = await c.terminal(sid, 60)
            assert t["type"] == "done", t
            assert_same_audio(bytes(c.rec(sid)["audio"]), expected(offline, levels, "pcm_f32le",
                                                                  24000), "pcm_f32le")
        for _ in range(6):  # whichever front answers: the same totals
            m = await metrics(port)
            assert metric_value(m, "codecd_streams_total", outcome="done") == 50
            assert metric_value(m, "codecd_time_to_first_audio_seconds_count") == 50
            assert metric_value(m, "codecd_connections_active") == 25
        # first_audio = "auto" resolved on this CPU worker (docs/server.md)
        assert metric_value(m, "codecd_first_audio", worker="0", mode="now") == 1
        # first_audio_gap_ms auto is no bound on a CPU worker: no express tick is held back
        holds = [s for s in m.get("codecd_express_holds", []) if s.labels.get("model") == "small"]
        assert [s.value for s in holds] == [0.0], holds
        bmax = metric_value(m, "codecd_batch_size_max", worker="0", model="small")
        print(f"\nlargest batch {bmax:.0f}, streams per front {sorted(share.values())}")
        assert bmax > max(share.values()), (bmax, share)
        # the worker's tick anatomy reaches /metrics through the fronts (a loaded machine may
        # answer one scrape from stats older than the ticks: a few scrapes)
        parts = {}
        for _ in range(10):
            parts = {(which, f, part): metric_value(m, f, part=part, worker="0", model="small",
                                                    ticks=which)
                     for which in ("all", "slowest")
                     for f, part in (("codecd_tick_part_seconds", "total"),
                                     ("codecd_tick_part_mean", "batch"))}
            if all(v > 0 for v in parts.values()):
                break
            await asyncio.sleep(0.5)
            m = await metrics(port)
        assert all(v > 0 for v in parts.values()), parts
        assert all(v >= 1 for k, v in parts.items() if k[2] == "batch"), parts
        # each front's stalls (codecd.stalls): its loop's wake-ups (5 ms apart while it has
        # streams, 100 ms apart idle; the front with fewer streams may have had them briefly),
        # counted per front
        for i in range(2):
            wakes = metric_value(m, "codecd_front_loop_late_seconds_count", front=str(i))
            inf = metric_value(m, "codecd_front_loop_late_seconds_bucket", front=str(i), le="+Inf")
            assert wakes > 0 and inf == wakes, (i, wakes, inf)
            assert metric_value(m, "codecd_front_gc_pause_seconds_count", front=str(i)) > 0
        for cs in by.values():
            for c in cs:
                await c.close()

    with daemon(small, log, "--fronts", "2", "--max-batch", "64") as (p, port):
        run(main(p, port))
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0


def test_limits_count_across_fronts(small: Path, tmp_path: Path) -> None:
    """max_streams and max_connections are the daemon's, whichever front a client reaches: the
    (max+1)-th stream is refused with busy on every front, a freed slot is taken again."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        by = await spread(port, pids, 6, min_per_front=3)
        conns = [c for cs in by.values() for c in cs]
        for c in conns[:4]:  # 4 streams, max_streams
            await c.send(start_msg("a", "levels"))
            await c.until(lambda c=c: any(m["type"] == "started" for m in c.rec("a")["msgs"]))
        for cs in by.values():  # one more on each front: busy
            c = cs[-1]
            await c.send(start_msg("b", "levels"))
            t = await c.terminal("b")
            assert (t["type"], t["code"]) == ("error", "busy"), t
        with pytest.raises(InvalidStatus) as e:  # the 7th connection: 503 (max_connections 6)
            await Client.open(port)
        assert e.value.response.status_code == 503
        await conns[0].send({"type": "cancel", "stream_id": "a"})
        await conns[0].terminal("a")
        c = conns[-1]
        # the cancel's release reaches main from conns[0]'s front, this start's admission
        # from conns[-1]'s, on another socket: under load the start may overtake it and be
        # refused busy (a CI run, 2026-12-07), so it is retried; the slot must be taken in 5 s
        for i in range(100):
            sid = f"c{i}"
            await c.send(start_msg(sid, "levels"))
            await c.until(lambda sid=sid: any(m["type"] in ("started", "error")
                                              for m in c.rec(sid)["msgs"]))
            msgs = c.rec(sid)["msgs"]
            if any(m["type"] == "started" for m in msgs):
                break
            assert [m.get("code") for m in msgs if m["type"] == "error"] == ["busy"], msgs
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the freed slot was not taken again within 5 s")
        m = await metrics(port)
        assert metric_value(m, "codecd_streams_active") == 4
        for c in conns:
            await c.close()
        for _ in range(50):  # releases reach main: a new connection is admitted
            if metric_value(await metrics(port), "codecd_connections_active") == 0:
                break
            await asyncio.sleep(0.05)
        for _ in range(100):  # the releases reach main: connections are admitted again
            try:
                c = await Client.open(port)
                break
            except InvalidStatus:
                await asyncio.sleep(0.02)
        await c.close()

    with daemon(small, log, "--fronts", "2", "--max-streams", "4", "--max-connections",
                "6") as (p, port):
        run(main(p, port))


def test_killed_front_leaves_the_others_alone_and_comes_back(small: Path, offline: Any,
                                                             tmp_path: Path) -> None:
    """SIGKILL one front mid-stream: the other front's streams finish equal to the offline
    decode, the worker is untouched, main releases the dead front's slots and restarts it."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        worker = children(p.pid, "codecd.worker")
        by = await spread(port, pids, 6, min_per_front=3)
        victim, other = pids
        rng = np.random.default_rng(5)
        cases = []
        for pid, cs in by.items():
            for c in cs:
                levels = small_codes(4 * 80, rng)
                await c.send(start_msg("x", "levels", format="pcm_f32le"))
                await send_stream(c, "x", [lv[: len(lv) // 2] for lv in levels], "levels", rng,
                                  end=False)
                cases.append((pid, c, levels))
        await asyncio.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        for pid, c, levels in cases:
            if pid == other:
                await send_stream(c, "x", [lv[len(lv) // 2:] for lv in levels], "levels", rng)
        for pid, c, levels in cases:
            if pid == other:
                t = await c.terminal("x", 60)
                assert t["type"] == "done", t
                assert_same_audio(bytes(c.rec("x")["audio"]),
                                  expected(offline, levels, "pcm_f32le", 24000), "pcm_f32le")
            else:
                assert await c.closed(10) == 1006  # its process is gone
        deadline = time.monotonic() + 15
        while True:
            m = await metrics(port)
            if metric_value(m, "codecd_front_restarts_total", front=str(pids.index(victim))) \
                    == 1 and metric_value(m, "codecd_ready") == 1:
                break
            assert time.monotonic() < deadline, "the front was not restarted"
            await asyncio.sleep(0.1)
        assert metric_value(m, "codecd_streams_active") == 0  # the dead front's slots released
        assert children(p.pid, "codecd.worker") == worker
        assert metric_value(m, "codecd_worker_restarts_total", worker="0") == 0
        new = fronts_of(p.pid, 2)
        assert other in new and victim not in new
        by2 = await spread(port, new, 2, min_per_front=1)  # the new front serves streams
        for cs in by2.values():
            c = cs[0]
            levels = small_codes(4 * 20, rng)
            await c.send(start_msg("y", "levels", format="pcm_f32le"))
            await send_stream(c, "y", levels, "levels", rng)
            assert (await c.terminal("y", 30))["type"] == "done"
            assert_same_audio(bytes(c.rec("y")["audio"]),
                              expected(offline, levels, "pcm_f32le", 24000), "pcm_f32le")
            await c.close()
        for pid, c, _ in cases:
            if pid == other:
                await c.close()

    with daemon(small, log, "--fronts", "2") as (p, port):
        run(main(p, port))


#: a killed worker's replacement (a new process that loads and warms its model) is back in
#: about half a second on an idle machine; the product's 5 s bound is measured by `python -m
#: bench fronts --kill-worker` (docs/benchmarks.md). A test on a loaded 2-core CI box (load up
#: to 12) allows it more, as test_engine.py's RESTART_S does
RESTART_S = 30.0


def test_killed_worker_fails_streams_keeps_connections_and_serves_again(
        small: Path, offline: Any, tmp_path: Path) -> None:
    """SIGKILL the worker (default batch buckets) with streams on both fronts: each gets the
    documented engine_restarted error, every connection stays open, and a new stream on the
    same connections decodes once the worker is back (within RESTART_S here; the 5 s target:
    `python -m bench fronts --kill-worker`)."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        # the default buckets: the first start warms bucket 64 too, where the other tests'
        # daemons warm bucket 1 (30 s ran out with the test at nice 10 beside 6 busy loops:
        # wait_ready's default, 90 s, allows for it)
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        (worker,) = children(p.pid, "codecd.worker")
        by = await spread(port, pids, 4, min_per_front=2)
        conns = [c for cs in by.values() for c in cs]
        rng = np.random.default_rng(7)
        for c in conns:
            await c.send(start_msg("x", "levels"))
            await send_stream(c, "x", small_codes(4 * 40, rng), "levels", rng, end=False)
        for c in conns:
            await c.until(lambda c=c: any(m["type"] == "started" for m in c.rec("x")["msgs"]))
        t_kill = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        for c in conns:
            t = await c.terminal("x", RESTART_S)
            assert (t["type"], t["code"]) == ("error", "engine_error"), t
            assert t["message"].startswith("engine_restarted:"), t
        levels = small_codes(4 * 12, rng)
        first_audio = None
        while first_audio is None:  # retry a refused (busy: restarting) start
            assert time.monotonic() - t_kill < RESTART_S, \
                f"no new stream decoded within {RESTART_S:.0f} s of the kill"
            c = conns[0]
            sid = f"n{int((time.monotonic() - t_kill) * 1000)}"
            await c.send(start_msg(sid, "levels", format="pcm_f32le"))
            await send_stream(c, sid, levels, "levels", rng)
            t = await c.terminal(sid, RESTART_S)
            if t["type"] == "done":
                first_audio = time.monotonic() - t_kill
                assert_same_audio(bytes(c.rec(sid)["audio"]),
                                  expected(offline, levels, "pcm_f32le", 24000), "pcm_f32le")
            else:
                assert t["code"] == "busy", t
                await asyncio.sleep(0.05)
        print(f"\na new stream decoded {first_audio:.2f} s after the worker was killed "
              f"(the product's target: 5 s; this test allows {RESTART_S:.0f} s)")
        assert first_audio < RESTART_S
        for c in conns:  # every connection is still open and serves
            sid = "after"
            await c.send(start_msg(sid, "levels"))
            await send_stream(c, sid, levels, "levels", rng)
            assert (await c.terminal(sid, RESTART_S))["type"] == "done"
            assert c.ws.close_code is None
        m = await metrics(port)
        assert metric_value(m, "codecd_worker_restarts_total", worker="0") == 1
        for c in conns:
            await c.close()

    with daemon(small, log, "--fronts", "2", "--max-batch", "64", buckets=None) as (p, port):
        run(main(p, port), 90 + 6 * RESTART_S)


def test_a_stream_closed_while_its_tick_computes_leaves_the_worker_alive(small: Path, offline: Any,
                                                                         tmp_path: Path) -> None:
    """A client that hangs up as soon as its stream's first audio arrives: the close is read
    while the stream's next tick is on the device, and that tick's streams are then all gone.
    The worker must carry on (it died of an IndexError there, and `bench fronts --kill-worker`'s
    probes took each restart down again); the next stream decodes on the same worker."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        (worker,) = children(p.pid, "codecd.worker")
        rng = np.random.default_rng(5)
        for _ in range(6):
            c = await Client.open(port)
            await c.send(start_msg("x", "levels"))
            await send_stream(c, "x", small_codes(4 * 64, rng), "levels", rng)
            await c.until(lambda c=c: len(c.rec("x")["audio"]) > 0)
            await c.close()
        c = await Client.open(port)
        levels = small_codes(4 * 12, rng)
        await c.send(start_msg("y", "levels", format="pcm_f32le"))
        await send_stream(c, "y", levels, "levels", rng)
        assert (await c.terminal("y", 10))["type"] == "done"
        assert_same_audio(bytes(c.rec("y")["audio"]), expected(offline, levels, "pcm_f32le", 24000),
                          "pcm_f32le")
        await c.close()
        assert children(p.pid, "codecd.worker") == [worker]
        m = await metrics(port)
        assert metric_value(m, "codecd_worker_restarts_total", worker="0") == 0

    with daemon(small, log, "--fronts", "2") as (p, port):
        run(main(p, port))


def test_sigterm_drains_every_front(small: Path, offline: Any, tmp_path: Path) -> None:
    """SIGTERM with streams open on both fronts: /readyz turns 503, every stream finishes (its
    end arrives after the signal), then main and every child exit, status 0."""
    log = tmp_path / "d.log"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        worker = children(p.pid, "codecd.worker")
        by = await spread(port, pids, 4, min_per_front=2)
        conns = [c for cs in by.values() for c in cs]
        rng = np.random.default_rng(9)
        cases = []
        for c in conns:
            levels = small_codes(4 * 60, rng)
            await c.send(start_msg("x", "levels", format="pcm_f32le"))
            await send_stream(c, "x", levels, "levels", rng, end=False)
            cases.append((c, levels))
        for c in conns:
            await c.until(lambda c=c: any(m["type"] == "started" for m in c.rec("x")["msgs"]))
        p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while True:  # no longer ready: 503, or refused once every front stopped accepting
            try:
                if (await asyncio.wait_for(http_get(port, "/readyz"), 1.0))[0] == 503:
                    break
            except (OSError, asyncio.TimeoutError):
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        for c, _ in cases:
            await c.send({"type": "end", "stream_id": "x"})
        for c, levels in cases:
            t = await c.terminal("x", 20)
            assert t["type"] == "done", t
            assert_same_audio(bytes(c.rec("x")["audio"]),
                              expected(offline, levels, "pcm_f32le", 24000), "pcm_f32le")
        for c in conns:
            assert await c.closed(15) in (1000, 1001)
        assert await asyncio.to_thread(p.wait, 20) == 0
        for pid in pids + worker:
            assert not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().split()[2] == "Z"

    with daemon(small, log, "--fronts", "2") as (p, port):
        run(main(p, port))


@pytest.mark.parametrize("cores, devices, want", [
    (1, ["cuda:0"], 1), (2, ["auto"], 1), (4, ["cuda:0"], 2), (8, ["cuda:0"], 6),
    (8, ["cuda:0", "cuda:1"], 5), (16, ["auto"], 8), (64, [f"cuda:{i}" for i in range(8)], 8),
    (16, ["cpu"], 1), (16, ["cpu", "cuda:0"], 8)])
def test_default_fronts_follow_the_cores_this_process_may_use(
        monkeypatch: pytest.MonkeyPatch, cores: int, devices: list[str], want: int) -> None:
    """fronts = 0: one front per usable core beyond one per worker and one for main, 1 to 8
    (a daemon pinned to 8 of 16 cores counts 8); 1 when every worker decodes on the CPU."""
    from codecd import daemon

    monkeypatch.setattr(daemon, "usable_cores", lambda: cores)
    assert daemon.default_fronts(devices) == want


def test_usable_cores_are_the_affinity_within_the_cgroup_quota(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from codecd.daemon import usable_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    cpu_max = tmp_path / "cpu.max"
    for text, want in (("max 100000", 16), ("200000 100000", 2), ("150000 100000", 2),
                       ("5000 100000", 1), ("3200000 100000", 16), ("garbage", 16)):
        cpu_max.write_text(text + "\n")
        assert usable_cores(str(cpu_max)) == want, text
    assert usable_cores(str(tmp_path / "none")) == 16


def test_channel_rings_carry_batches_larger_than_a_ring(tmp_path: Path) -> None:
    """A front's commands of one turn, and a worker's events of one tick, larger than a ring
    record may be: split into packets in order, and a full ring keeps the rest for later
    (the reader frees room, the writer goes on): every message arrives once, in order."""
    from codecd import wire
    from codecd.channel import FrontEnds, WorkerEnds, make_channel, packets

    ch = make_channel(cmd_bytes=1 << 16, evt_bytes=1 << 16)
    try:  # each side gets its own descriptors, as from socket.recv_fds; main closes its own
        front = FrontEnds.from_fds([os.dup(fd) for fd in ch.front_fds])
        worker = WorkerEnds.from_fds([os.dup(fd) for fd in ch.worker_fds])
    finally:
        ch.close()
    rng = np.random.default_rng(0)
    msgs = [wire.PushCodes(i, [rng.integers(0, 4096, int(rng.integers(1, 1500)),
                                            dtype=np.int32) for _ in range(3)])
            for i in range(200)]
    pkts = packets(msgs, front.commands.capacity // 4)
    assert len(pkts) > 10 and all(front.commands.fits(len(p)) for p in pkts)
    got: list[Any] = []
    pending = list(pkts)
    while pending or len(got) < len(msgs):
        while pending and front.commands.write([pending[0]]):
            pending.pop(0)
        front.commands.ring()
        time.sleep(0.001)
        worker.commands.on_doorbell()
        for rec in worker.commands.records():
            got += wire.decode(bytes(rec))
    assert [m.sid for m in got] == list(range(200))
    for a, b in zip(msgs, got):
        assert all(np.array_equal(x, y) for x, y in zip(a.levels, b.levels))
    front.close()
    worker.close()


def test_a_ticks_audio_is_handed_on_in_slices() -> None:
    """A worker's AUDIO record for 64 streams, each message taking 0.5 ms to hand on (a slow
    session): the front hands them on in order, and in slices with the loop running between
    them (it reads its sockets there), not in one 32 ms callback. (The 2 ms budget is checked
    every 16 messages: here a slice is 8 ms; a real front's messages take tens of us.)"""
    from codecd import wire
    from codecd.channel import FrontEnds, WorkerEnds, make_channel
    from codecd.engine import EngineConfig
    from codecd.front import RingEngine

    ch = make_channel(cmd_bytes=1 << 16, evt_bytes=1 << 20)
    try:
        front = FrontEnds.from_fds([os.dup(fd) for fd in ch.front_fds])
        worker = WorkerEnds.from_fds([os.dup(fd) for fd in ch.worker_fds])
    finally:
        ch.close()
    got: list[Any] = []

    def deliver(ev: Any) -> None:
        got.append(ev.key)
        time.sleep(0.0005)

    loop = asyncio.new_event_loop()
    eng = RingEngine(0, front, {}, EngineConfig(models={}), deliver, loop)
    recs = [eng._streams.add(i, "m", [1], 512, 1) for i in range(64)]
    sids = np.array([r.sid for r in recs], dtype=np.uint64)
    pcm = np.zeros(64 * 512, dtype=np.float32)
    assert worker.events.write(wire.audio_packet(sids, np.full(64, 512, np.uint32), pcm))
    worker.events.ring()
    seen: list[int] = []  # what the loop saw handed on, each time it ran between callbacks

    async def main() -> None:
        for _ in range(2000):
            await asyncio.sleep(0)
            seen.append(len(got))
            if len(got) == 64:
                return

    try:
        loop.run_until_complete(main())
    finally:
        loop.remove_reader(front.events.doorbell.fileno())
        loop.close()
        front.close()
        worker.close()
    assert got == list(range(64))
    assert len({n for n in seen if 0 < n < 64}) >= 2, seen


@pytest.mark.parametrize("align_ms", [0.0, 1000.0])
def test_tick_align_puts_spread_streams_in_one_tick(small: Path, align_ms: float) -> None:
    """Four streams whose first chunk arrives spread over 450 ms (150 ms apart: a loaded box
    must stall the worker that long to let two meet): with ticks on a 1 s cadence they share
    one tick (the boundary after them); with gather_ms alone, each ticks alone."""
    from codecd.engine import EngineConfig, EnginePool

    async def main() -> list[int]:
        pool = EnginePool(EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8,
                                       max_batch=8, warm_buckets=(1,), gather_ms=2.0,
                                       tick_align_ms=align_ms), ["cpu"], on_event=lambda e: None)
        await pool.start()
        try:
            for i in range(4):
                pool.open(i, "small")
            await pool.fetch_stats()  # opened (commands are answered in order)
            # start right after a boundary of the cadence (CLOCK_MONOTONIC is the machine's)
            while not 0.02 < time.monotonic() % 1.0 < 0.1:
                await asyncio.sleep(0.005)
            rng = np.random.default_rng(1)
            t0 = time.monotonic()
            for i in range(4):  # the last at most 0.55 s after the boundary: before the next
                await asyncio.sleep(max(0.0, t0 + 0.15 * i - time.monotonic()))
                pool.push(i, small_codes(4, rng))  # one chunk: ready at once
            for _ in range(100):  # until every chunk was stepped (the 1 s boundary's tick)
                st = (await pool.fetch_stats())["workers"][0]["worker"]["models"]["small"]
                if sum(st["recent_batches"]) >= 4:
                    break
                await asyncio.sleep(0.05)
            return list(st["recent_batches"])
        finally:
            await pool.close()

    batches = asyncio.run(main())
    assert sum(batches) == 4, batches
    if align_ms:
        assert batches == [4], batches
    else:  # each push ticks on its own (a loaded machine may let two meet)
        assert len(batches) >= 3, batches


def aligned_pool(small: Path, align_ms: float, on_event: Any = None, **kw: Any) -> Any:
    """An EnginePool of the small model on one CPU worker with ticks aligned to ``align_ms``
    (``kw``: more EngineConfig settings)."""
    from codecd.engine import EngineConfig, EnginePool

    cfg = dict(models={"small": str(small)}, n_threads=1, max_streams=4, max_batch=4,
               warm_buckets=(1, 2), gather_ms=2.0, tick_align_ms=align_ms)
    return EnginePool(EngineConfig(**{**cfg, **kw}), ["cpu"],
                      on_event=on_event or (lambda e: None))


async def open_two(pool: Any) -> None:
    """Open streams 0 and 1 of the small model and wait until the worker has them."""
    pool.open(0, "small")
    pool.open(1, "small")
    await pool.fetch_stats()


#: a tick-trace round's start (printed to 0.1 ms) against a time this process took on the same
#: monotonic clock
EPS = 0.001


def trace_rows(trace: Path) -> list[list[str]]:
    """Worker 0's rounds in the tick trace CODECD_TICK_TRACE=``trace`` wrote (to
    ``trace``.worker0): start_s phase_ms ready open stepped wall_ms trigger, each as a string."""
    return [line.split() for line in Path(f"{trace}.worker0").read_text().splitlines()[1:]]


def laid_out(run: Callable[[int], T], broken: Callable[[T], str | None], tries: int = 3) -> T:
    """``run(i)`` again, at most ``tries`` times, while ``broken`` says (why, else None) that a
    loaded box laid the scenario out otherwise than the test needs it: a push sent, or a
    round that the claim does not judge started, late. ``broken`` reads the times the test and
    the tick trace recorded, never what the test then asserts."""
    why = []
    for i in range(tries):
        got = run(i)
        w = broken(got)
        if w is None:
            return got
        print(f"\nrun {i}: {w}; once more")
        why.append(w)
    raise AssertionError(f"the scenario was not laid out in {tries} runs: {why}")


Sent = dict[tuple[int, int], float]


def two_stream_rounds(small: Path, trace: Path, monkeypatch: pytest.MonkeyPatch, period: float,
                      last_gap: float, seed: int, **kw: Any
                      ) -> tuple[list[int], list[list[str]], Sent]:
    """Two streams on a cadence of ``period`` s: codes of stream 0 just after a multiple of the
    period, of stream 1 100 ms later (both ready: a tick), of stream 0 again 100 ms after
    that, of stream 1 ``last_gap`` s after that (each counted from when stream 1's first were
    sent); the batches of the ticks that followed, their rounds in the tick trace (written to
    ``trace``) and when each push was sent ((stream, its n-th push): monotonic s)."""
    monkeypatch.setenv("CODECD_TICK_TRACE", str(trace))
    sent: Sent = {}

    async def main() -> list[int]:
        pool = aligned_pool(small, 1e3 * period, **kw)
        await pool.start()
        try:
            await open_two(pool)
            rng = np.random.default_rng(seed)
            while not 0.02 < time.monotonic() % period < 0.06:  # just after a multiple
                await asyncio.sleep(0.005)
            for sid, n, since, after in ((0, 0, None, 0.0), (1, 0, (0, 0), 0.1),
                                         (0, 1, (1, 0), 0.1), (1, 1, (1, 0), 0.1 + last_gap)):
                if since is not None:
                    await asyncio.sleep(max(0.0, sent[since] + after - time.monotonic()))
                sent[sid, n] = time.monotonic()
                pool.push(sid, small_codes(4, rng))
            await asyncio.sleep(2 * period)
            st = (await pool.fetch_stats())["workers"][0]["worker"]["models"]["small"]
            return list(st["recent_batches"])
        finally:
            await pool.close()

    batches = asyncio.run(main())
    return batches, trace_rows(trace), sent


def test_a_tick_started_by_every_stream_being_ready_keeps_its_phase(
        small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams on a 400 ms cadence whose codes arrive 100 ms apart, the second's later in
    the period: their first tick starts when both are ready, mid-period, and the next one a
    period after it at the latest, sooner when both are ready again. Not at the cadence's
    multiple in between with the first stream alone and then the second alone (3 ticks for 2
    periods' codes; docs/server.md). The second round's codes: stream 0's before the multiple
    of the period that follows the first tick, stream 1's after it, within a period of the
    first tick. Judged against the times the pushes were sent and the tick trace's rounds
    started: a loaded box that sends stream 1's codes late only moves the round to the
    period's end."""
    P = 0.4

    def broken(got: tuple[list[int], list[list[str]], Sent]) -> str | None:
        _, rows, sent = got
        if not rows:
            return "no round"
        multiple = (float(rows[0][0]) // P + 1) * P  # the first one after the first round
        if not sent[0, 1] < multiple < sent[1, 1]:
            return (f"stream 0's codes {sent[0, 1] - multiple:+.3f} s, stream 1's "
                    f"{sent[1, 1] - multiple:+.3f} s from the multiple after the first round")
        return None

    batches, rows, sent = laid_out(
        lambda i: two_stream_rounds(small, tmp_path / f"trace{i}", monkeypatch, P, 0.25, seed=2),
        broken)
    assert sum(batches) == 4 and len(rows) >= 2, (batches, rows)
    r1, r2 = float(rows[0][0]), float(rows[1][0])
    assert rows[0][4] == "2", rows  # the first round: both streams, when stream 1's came
    # the second: not at the multiple in between, but when stream 1's codes came (sent before
    # the first round's period was over), or at that period's end
    assert r2 >= min(sent[1, 1], r1 + P) - EPS, (r2 - r1, sent[1, 1] - r1, rows)
    if r2 < r1 + P - EPS:  # before the period's end: both again
        assert rows[1][4] == "2" and batches == [2, 2], (batches, rows)


@pytest.mark.parametrize("slack_ms", [0.0, 200.0])
def test_tick_slack_waits_for_late_codes(small: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         slack_ms: float) -> None:
    """The second tick is due a period after the first started, when the stream whose codes
    started the first should send again. Its codes 100 ms late (a 400 ms cadence) miss that
    tick without slack (the first stream ticks alone at the period's end, the late one a
    period later) and make it with 200 ms of slack (tick_slack_ms): that round waits past the
    period for them (to the slack's end at most, if the box held them back longer)."""
    P, slack = 0.4, slack_ms / 1e3

    def broken(got: tuple[list[int], list[list[str]], Sent]) -> str | None:
        _, rows, sent = got
        if not rows:
            return "no round"
        late = sent[1, 1] - (float(rows[0][0]) + P)
        return None if late > 0.0 else f"stream 1's codes {late:+.3f} s after the period"

    batches, rows, sent = laid_out(
        lambda i: two_stream_rounds(small, tmp_path / f"trace{i}", monkeypatch, P, 0.4, seed=3,
                                    tick_slack_ms=slack_ms),
        broken)
    assert sum(batches) == 4 and len(rows) >= 2, (batches, rows)
    r1, r2 = float(rows[0][0]), float(rows[1][0])
    assert rows[0][4] == "2", rows  # the first round: both streams, when stream 1's came
    if not slack:  # at the period's end, without stream 1's codes (sent after it)
        assert r1 + P - EPS <= r2 < sent[1, 1], (r2 - r1, sent[1, 1] - r1, rows)
        assert batches == [2, 1, 1], (batches, rows)
    else:  # past it: when stream 1's codes came, or at the slack's end
        assert r2 >= min(sent[1, 1], r1 + P + slack) - EPS, (r2 - r1, sent[1, 1] - r1, rows)
        if r2 < r1 + P + slack - EPS:  # before the slack's end: both
            assert rows[1][4] == "2" and batches == [2, 2], (batches, rows)


@pytest.mark.parametrize("catch_up", [2, 0])
def test_codes_that_miss_their_round_catch_up(small: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              catch_up: int) -> None:
    """Two streams on a 400 ms cadence with 60 ms of slack, a chunk each a period, stream 1's
    50 ms after stream 0's: each round starts when both are in. In the fifth period stream
    1's codes come 200 ms late, after the round (due a period and the slack after the last
    one started) went without them. With tick_catch_up they are stepped at once, in a tick
    of their own (the tick trace's "catch-up"), before stream 0's next codes come, and the
    next round waits for the stream again; without, they wait for that round, about 150 ms
    later, which starts when stream 0's codes come (or at its deadline, if a loaded box held
    them back past it). Judged against the times the pushes were sent and the rounds
    started."""
    P, slack = 0.4, 0.06

    def run(i: int) -> tuple[Sent, list[list[str]], dict[str, Any]]:
        trace = tmp_path / f"trace{i}"
        monkeypatch.setenv("CODECD_TICK_TRACE", str(trace))
        sent: Sent = {}

        async def main() -> dict[str, Any]:
            pool = aligned_pool(small, 1e3 * P, warm_buckets=(1, 2), tick_catch_up=catch_up,
                                tick_slack_ms=1e3 * slack, first_audio="cadence")
            await pool.start()
            try:
                await open_two(pool)
                rng = np.random.default_rng(8)
                while not 0.02 < time.monotonic() % P < 0.06:  # just after a multiple of P
                    await asyncio.sleep(0.005)
                t0 = time.monotonic()
                for k in range(7):
                    for sid, at in ((0, 0.0), (1, 0.25 if k == 4 else 0.05)):
                        await asyncio.sleep(max(0.0, t0 + k * P + at - time.monotonic()))
                        sent[sid, k] = time.monotonic()
                        pool.push(sid, small_codes(4, rng))
                await asyncio.sleep(0.3)
                return (await pool.fetch_stats())["workers"][0]["worker"]["models"]["small"]
            finally:
                await pool.close()

        st = asyncio.run(main())
        return sent, trace_rows(trace), st

    def broken(got: tuple[Sent, list[list[str]], dict[str, Any]]) -> str | None:
        sent, rows, _ = got
        # the fifth round started on stream 0's codes, before stream 1's late ones were sent
        if not any(sent[0, 4] < float(r[0]) < sent[1, 4] for r in rows):
            return "no round between stream 0's fifth codes and stream 1's late ones"
        if catch_up and sent[0, 5] - sent[1, 4] < 0.1:  # the time the catch-up has
            return f"stream 1's late codes sent {sent[0, 5] - sent[1, 4]:.3f} s before stream 0's"
        return None

    sent, rows, st = laid_out(run, broken)
    t_late, t_next = sent[1, 4], sent[0, 5]
    before = [float(r[0]) for r in rows if float(r[0]) < t_late]
    after = [(float(r[0]), r[4], r[6]) for r in rows if float(r[0]) > t_late]
    assert before and after, rows
    start, stepped, trigger = after[0]
    print(f"\nthe first round after stream 1's late codes: {start - t_late:+.3f} s from them, "
          f"{start - t_next:+.3f} s from stream 0's next, {trigger}")
    if catch_up:  # at once, in a catch-up tick, before stream 0's next codes
        assert trigger == "catch-up" and start < t_next, (t_late, t_next, rows)
        # one, unless a loaded machine made another push miss its round too
        assert st["catch_up_ticks"] >= 1, rows
        assert st["catch_up_streams"] == st["catch_up_ticks"], rows
    else:  # with the next round: when stream 0's codes come, or at that round's deadline
        due = before[-1] + P + slack
        assert trigger != "catch-up" and start >= min(t_next, due) - EPS, (t_late, t_next, rows)
        if start < due - EPS:  # before the deadline: with stream 0's codes
            assert stepped == "2", (t_late, t_next, rows)
        assert st["catch_up_ticks"] == 0, st
        assert all(r[6] != "catch-up" for r in rows), rows


@pytest.mark.parametrize("poke", ["none", "stats", "open_cancel"])
def test_a_silent_stream_does_not_slow_the_cadence(small: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  poke: str) -> None:
    """One stream sends a chunk every 200 ms (the cadence), another is open and silent. The
    rounds wait for the streams that were ready at the last round's start, not for the silent
    one: each starts when the active stream's codes come, a period apart. Waiting for every
    open stream, each round ran at its deadline (a period and the 60 ms slack after the last
    one's start): every stream behind real time by the slack each period (docs/server.md).
    Commands between the rounds (a stats request, as each /metrics scrape makes; a third
    stream opened and cancelled) wake the worker without a round and change nothing."""
    monkeypatch.setenv("CODECD_TICK_TRACE", str(tmp_path / "trace"))
    P, slack = 0.2, 0.06

    async def main() -> None:
        pool = aligned_pool(small, 1e3 * P, warm_buckets=(1,), tick_slack_ms=1e3 * slack,
                            first_audio="cadence")
        await pool.start()
        try:
            await open_two(pool)
            rng = np.random.default_rng(6)
            t0 = time.monotonic()
            for k in range(12):
                await asyncio.sleep(max(0.0, t0 + k * P - time.monotonic()))
                pool.push(0, small_codes(4, rng))
                if poke != "none" and k > 1:
                    await asyncio.sleep(0.1)  # after the round, before the next push
                    if poke == "stats":
                        await pool.fetch_stats()
                    else:
                        pool.open(100 + k, "small")
                        await asyncio.sleep(0.01)
                        pool.cancel(100 + k)
            await asyncio.sleep(0.3)
        finally:
            await pool.close()

    asyncio.run(main())
    rows = trace_rows(tmp_path / "trace")
    starts = [float(r[0]) for r in rows]
    assert all(r[4] == "1" for r in rows), rows  # the silent stream is never stepped
    gaps = np.diff(starts)
    assert len(gaps) >= 9, rows
    # a period apart (a loaded machine may start one late, and the next on time again), not
    # a period and the slack: the median within half the slack of the period, and the rounds
    # at most 1.5 periods (0.3 s) behind over all the gaps. Waiting for the silent stream,
    # every gap is the period and the slack: the median the whole slack off, and 9 to 11 gaps
    # (10 rounds before the close, or 12) 0.54 to 0.66 s behind
    assert abs(float(np.median(gaps)) - P) < slack / 2, gaps
    assert starts[-1] - starts[0] < (len(gaps) + 1.5) * P, gaps
    assert sum(r[6] == "all-ready" for r in rows[1:]) >= len(gaps) - 2, rows


def test_new_streams_every_period_do_not_slow_the_cadence(small: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Express ticks on a 200 ms cadence with 60 ms of slack: stream 0 sends a chunk every
    period, and every period a new stream opens, its first chunk coming with stream 0's (the
    round takes both) and its second mid-period (an express tick takes it: no audio yet). The
    rounds keep the period. Waiting for the new stream whose chunk the express tick had taken,
    every round ran at its deadline, a period and the slack after the last one: every stream
    behind real time by the slack each period (an H100 with streams starting over 3 s failed at
    1,000 so; docs/benchmarks.md, session 53)."""
    monkeypatch.setenv("CODECD_TICK_TRACE", str(tmp_path / "trace"))
    P, slack = 0.2, 0.06

    async def main() -> None:
        pool = aligned_pool(small, 1e3 * P, warm_buckets=(1, 2, 4), tick_slack_ms=1e3 * slack,
                            first_audio="now", first_audio_gap_ms=0.0, max_streams=16,
                            max_batch=16)
        await pool.start()
        try:
            pool.open(0, "small")
            await pool.fetch_stats()
            rng = np.random.default_rng(14)
            t0 = time.monotonic()
            for k in range(12):
                await asyncio.sleep(max(0.0, t0 + k * P - time.monotonic()))
                if k >= 1:  # a new stream whose first codes come with stream 0's
                    pool.open(100 + k, "small")
                    pool.push(100 + k, small_codes(4, rng))
                pool.push(0, small_codes(4, rng))
                if k >= 1:
                    await asyncio.sleep(max(0.0, t0 + k * P + 0.1 - time.monotonic()))
                    pool.push(100 + k, small_codes(4, rng))  # mid-period: an express tick's
            await asyncio.sleep(0.3)
        finally:
            await pool.close()

    asyncio.run(main())
    rows = trace_rows(tmp_path / "trace")
    starts = [float(r[0]) for r in rows if r[6] not in ("express", "catch-up")]
    gaps = np.diff(starts)
    assert len(gaps) >= 9, rows
    assert any(r[6] == "express" for r in rows), rows
    # a period apart (a loaded machine may start one late, and the next on time again), not
    # a period and the slack: as in test_a_silent_stream_does_not_slow_the_cadence
    assert abs(float(np.median(gaps)) - P) < slack / 2, gaps
    assert starts[-1] - starts[0] < (len(gaps) + 1.5) * P, gaps


def test_first_audio_now_does_not_wait_for_the_cadence(small: Path) -> None:
    """Two streams open on a 500 ms cadence, one silent (so that not every stream is ready);
    the other's 4 chunks of codes pushed at once just after a multiple of the period, then its
    end. With first_audio = "cadence" its first tick waits for the next multiple (most of a
    period): its first audio comes after it; with "now" its chunks are stepped at once, in
    ticks of their own, until its first audio, which comes before that multiple. Both give the
    same samples."""
    from codecd.engine import Audio, Done

    P = 0.5

    async def main(mode: str) -> tuple[float, float, np.ndarray]:
        got: list[tuple[float, Any]] = []
        pool = aligned_pool(small, 1e3 * P, lambda e: got.append((time.monotonic(), e)),
                            warm_buckets=(1,), first_audio=mode)
        await pool.start()
        try:
            await open_two(pool)
            while not 0.02 < time.monotonic() % P < 0.06:  # just after a multiple of P
                await asyncio.sleep(0.005)
            t0 = time.monotonic()
            pool.push(0, small_codes(16, np.random.default_rng(4)))
            pool.finish(0)
            for _ in range(400):
                if any(isinstance(e, Done) and e.key == 0 for _, e in got):
                    break
                await asyncio.sleep(0.01)
            audio = [(t, e.pcm) for t, e in got
                     if isinstance(e, Audio) and e.key == 0 and len(e.pcm)]
            # the cadence's next tick after the push: the multiple of P that follows it (the
            # worker's monotonic clock is this process's)
            boundary = (t0 // P + 1) * P
            return audio[0][0] - t0, boundary - t0, np.concatenate([a for _, a in audio])
        finally:
            await pool.close()

    ttfa_cadence, boundary_cadence, pcm_cadence = asyncio.run(main("cadence"))
    ttfa_now, boundary_now, pcm_now = asyncio.run(main("now"))
    print(f"\nfirst audio {ttfa_cadence:.3f} s after the push with the cadence (its tick "
          f"{boundary_cadence:.3f} s after it), {ttfa_now:.3f} s now (the tick "
          f"{boundary_now:.3f} s after it)")
    # the aligned tick can start no sooner than the boundary, and the audio follows it
    assert ttfa_cadence > boundary_cadence, (ttfa_cadence, boundary_cadence)
    # the express ticks' audio comes before that tick would start (over 0.4 s after the push)
    assert ttfa_now < boundary_now, (ttfa_now, boundary_now)
    assert np.array_equal(pcm_now, pcm_cadence)


def test_tick_trace_writes_a_line_per_round(small: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """CODECD_TICK_TRACE=PATH: worker 0 writes PATH.worker0, a header and one line per round
    that stepped streams (docs/server.md): two streams ready together on a 200 ms cadence make
    one round of both, started because every stream was ready."""
    monkeypatch.setenv("CODECD_TICK_TRACE", str(tmp_path / "trace"))

    async def main() -> None:
        pool = aligned_pool(small, 200.0)
        await pool.start()
        try:
            await open_two(pool)
            rng = np.random.default_rng(5)
            pool.push(0, small_codes(4, rng))
            pool.push(1, small_codes(4, rng))
            await asyncio.sleep(0.6)
        finally:
            await pool.close()

    asyncio.run(main())
    lines = (tmp_path / "trace.worker0").read_text().splitlines()
    assert lines[0] == "# start_s phase_ms ready open stepped wall_ms trigger"
    rows = [line.split() for line in lines[1:]]
    assert len(rows) == 1, rows
    start, phase, ready, n_open, stepped, wall, trigger = rows[0]
    assert (ready, n_open, stepped, trigger) == ("2", "2", "2", "all-ready")
    assert 0.0 <= float(phase) < 200.0 and float(wall) > 0.0 and float(start) > 0.0


def test_browser_tickets_redeem_on_any_front(small: Path, tmp_path: Path) -> None:
    """A browser ticket from GET /auth/ticket (whichever front answers it) opens a websocket on
    whichever front the upgrade reaches, once: main keeps the tickets of every front."""
    import json

    from websockets.asyncio.client import connect

    log = tmp_path / "d.log"
    token = "s3cret-Token_1"

    async def main(p: subprocess.Popen[bytes], port: int) -> None:
        await wait_ready(port, p, log)
        pids = fronts_of(p.pid, 2)
        me = "http://x"  # the page's own origin for http_get's "Host: x"
        url = f"ws://127.0.0.1:{port}/"
        served: set[int] = set()
        # the kernel deals connections to the fronts by a hash of their addresses: go on until
        # both have served one (12 tries left one front unserved once in a CI run: 1 in 2,048)
        for i in range(64):
            if i >= 4 and served == set(pids):
                break
            st, body = await http_get(port, "/auth/ticket",
                                      {"Authorization": f"Bearer {token}", "Origin": me})
            assert st == 200, body
            offer = json.loads(body)["subprotocols"]
            async with connect(url, subprotocols=offer, origin=me, open_timeout=5) as ws:
                assert json.loads(await ws.recv())["type"] == "hello"
                c = Client(ws)
                served.add(owner(c, pids) or 0)
            with pytest.raises(InvalidStatus) as ei:  # single use, on every front
                await connect(url, subprotocols=offer, origin=me, open_timeout=5)
            assert ei.value.response.status_code == 401
        assert served == set(pids), served  # upgrades on both fronts

    with daemon(small, log, "--fronts", "2", "--auth-token", token) as (p, port):
        run(main(p, port))
