"""The engine worker's packed data path: a front's PUSH record in one runtime call, a tick's
PCM in one buffer, AUDIO packets split to fit the ring and kept while the ring is full."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import assert_stream_equals_offline
from smallmodel import small_codes


def attach_front(worker: Any, evt_bytes: int) -> Any:
    """A front channel with an event ring of ``evt_bytes``, attached through the worker's
    descriptor socket as main attaches one; this end's (command producer, event consumer)."""
    from codecd.channel import FrontEnds, make_channel, send_msg

    ch = make_channel(cmd_bytes=1 << 20, evt_bytes=evt_bytes)
    ctl, worker.fdsock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker.fdsock.setblocking(False)
    send_msg(ctl, {"op": "attach", "fid": 1}, ch.worker_fds)
    front = FrontEnds.from_fds(list(ch.front_fds))
    for fd in ch.worker_fds[1::2]:  # the doorbells' worker ends (sent); the rings are closed
        os.close(fd)
    return ctl, front


def read_events(front: Any) -> list[Any]:
    from codecd import wire

    front.events.on_doorbell()
    out: list[Any] = []
    for rec in front.events.records():
        out += [m if not isinstance(m, wire.AudioOut) else wire.AudioOut(m.sid, m.pcm.copy())
                for m in wire.decode(bytes(rec))]
    return out


@contextmanager
def running_worker(cfg: Any, evt_bytes: int = 1 << 20, front: bool = True) -> Iterator[Any]:
    """A loaded engine worker in this process and, unless ``front`` is False, one front
    attached to it (attach_front's command producer and event consumer): (worker, front or
    None). The worker, its pipe and the front's channel are closed on exit."""
    from codecd.worker import Worker

    a, b = Pipe()
    w = Worker(a, cfg, "cpu")
    ends = None
    try:
        w.load()
        ends = attach_front(w, evt_bytes) if front else None
        yield w, ends[1] if ends else None
    finally:
        w.close()
        if ends:
            ends[1].close()
            ends[0].close()
        a.close()
        b.close()


def send(front: Any, msgs: list[Any]) -> None:
    """One record of wire messages into the front's command ring, and its doorbell."""
    from codecd import wire

    front.commands.write([wire.encode(msgs)])
    front.commands.ring()


def two_new_streams_in_a_round(w: Any, front: Any, rng: Any) -> None:
    """Open streams 1 and 2 of the small model, push a chunk to each and step both in an
    aligned round, not in express ticks (as when their codes came with the round's trigger)."""
    from codecd import wire

    send(front, [wire.OpenStream(sid, "small") for sid in (1, 2)]
         + [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2)])
    w.drain()
    w._fresh.clear()
    w.run_ticks()



def test_packed_push_and_pull_equal_offline_through_a_small_ring(small: Path, offline: Any
                                                                   ) -> None:
    """20 streams pushed in one PUSH record (one of them with a code out of range): the bad
    one fails alone; every other stream's audio, split into AUDIO packets of a small ring
    and held back while the front does not read, equals its offline decode exactly."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=32, max_batch=32,
                       warm_buckets=(1,), gather_ms=0.0)
    with running_worker(cfg, evt_bytes=4096) as (w, front):
        rng = np.random.default_rng(11)
        levels = {sid: small_codes(4 * int(rng.integers(10, 40)), rng) for sid in range(1, 21)}
        levels[7][2][3] = 4096  # out of range: stream 7 fails, nothing of it is pushed
        send(front, [wire.OpenStream(sid, "small") for sid in levels]
             + [wire.PushCodes(sid, lv) for sid, lv in levels.items()]
             + [wire.FinishStream(sid) for sid in levels])
        audio: dict[int, list[np.ndarray]] = {sid: [] for sid in levels}
        ends: dict[int, Any] = {}
        for _ in range(2000):
            w.drain()
            w.run_ticks()  # the ring fills at once: the rest waits in the worker's backlog
            for m in read_events(front):
                if isinstance(m, wire.AudioOut):
                    audio[m.sid].append(m.pcm)
                elif isinstance(m, (wire.StreamDone, wire.StreamFailed)):
                    ends[m.sid] = m
            w.flush()
            if len(ends) == len(levels) and not any(l.backlog for l in w.fronts.values()):
                break
        assert len(ends) == len(levels)
        assert isinstance(ends[7], wire.StreamFailed) and ends[7].code == "token_range"
        assert w.fronts[1].packets_out > 20  # the audio went in many packets
        for sid, lv in levels.items():
            if sid == 7:
                continue
            assert isinstance(ends[sid], wire.StreamDone)
            got = np.concatenate(audio[sid])
            want = offline(lv)
            assert ends[sid].total_samples == want.size
            assert_stream_equals_offline(got, want, sid)


def _pieces(levels: np.ndarray, rng: np.random.Generator, k: int = 4) -> list[list[np.ndarray]]:
    """A stream's codes cut into up to ``k`` pieces of whole frames of the coarsest level."""
    n = len(levels[0])
    cuts = sorted({0, n, *map(int, rng.integers(1, n, k - 1))})
    return [[x[a * (4 // s):b * (4 // s)] for x, s in zip(levels, (4, 2, 1))]
            for a, b in zip(cuts, cuts[1:])]


def _run_until_ended(w: Any, front: Any, n: int) -> tuple[dict[int, list[np.ndarray]],
                                                           dict[int, list[Any]]]:
    from codecd import wire

    audio: dict[int, list[np.ndarray]] = {}
    ends: dict[int, list[Any]] = {}
    for _ in range(2000):
        w.drain()
        w.run_ticks()
        for m in read_events(front):
            if isinstance(m, wire.AudioOut):
                audio.setdefault(m.sid, []).append(m.pcm)
            elif isinstance(m, (wire.StreamDone, wire.StreamFailed)):
                ends.setdefault(m.sid, []).append(m)
        w.flush()
        if len(ends) == n:
            break
    return audio, ends


def test_push_records_in_a_row_are_applied_in_order(small: Path, offline: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stream's codes cut into pieces, each piece its own PUSH record, the streams'
    pieces interleaved and some streams' FINISH right after their last piece, all in the ring
    before the worker reads it (which ends with PUSH records): the worker applies PUSH
    records in a row in fewer runtime calls than records, a run ending before a record with
    a stream already in it and before any other command. One stream's piece has a code out of
    range: it fails alone, once, naming that code, and is not left among the streams waiting
    for a first tick. Every other stream's audio equals its offline decode exactly."""
    import codecrt

    from codecd import wire
    from codecd.engine.config import EngineConfig

    calls = [0]
    push_many = codecrt.push_many

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return push_many(*a, **k)

    monkeypatch.setattr(codecrt, "push_many", counted)
    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=16, max_batch=16,
                       warm_buckets=(1,), gather_ms=0.0, first_audio="now")
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(13)
        levels = {sid: small_codes(4 * int(rng.integers(6, 20)), rng) for sid in range(1, 9)}
        levels[5][0][2] = 4096  # out of range: stream 5 fails, the others go on
        pieces = {sid: _pieces(lv, rng) for sid, lv in levels.items()}
        send(front, [wire.OpenStream(sid, "small") for sid in levels])
        w.drain()
        records = 0
        for i in range(4):
            for sid in levels:
                if i < len(pieces[sid]):
                    front.commands.write([wire.encode([wire.PushCodes(sid, pieces[sid][i])])])
                    records += 1
                    if i == len(pieces[sid]) - 1 and sid <= 4:
                        front.commands.write([wire.encode([wire.FinishStream(sid)])])
        front.commands.ring()
        calls[0] = 0
        w.drain()  # the whole ring in one read
        assert 0 < calls[0] < records / 2, (calls[0], records)
        assert set(w._fresh) <= set(w.where), "a failed stream waits for a first tick"
        send(front, [wire.FinishStream(sid) for sid in range(5, 9)])
        audio, ends = _run_until_ended(w, front, len(levels))
        assert len(ends[5]) == 1 and ends[5][0].code == "token_range", ends[5]
        assert "4096" in ends[5][0].message, ends[5][0].message
        for sid, lv in levels.items():
            if sid == 5:
                continue
            assert len(ends[sid]) == 1 and isinstance(ends[sid][0], wire.StreamDone), ends[sid]
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(lv), sid)


def test_push_records_of_distinct_streams_are_read_and_applied_at_once(
        small: Path, offline: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PUSH records in a row, no stream in two of them (a tick's records of a front): their
    arrays are read in one pass (``wire.push_arrays_many``) and applied in one runtime call,
    not record by record; a stream with a code out of range fails alone, the others' audio
    equals their offline decode exactly."""
    import codecrt

    from codecd import wire
    from codecd.engine.config import EngineConfig

    calls, one_by_one = [0], [0]
    push_many, push_arrays = codecrt.push_many, wire.push_arrays

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return push_many(*a, **k)

    def alone(*a: Any, **k: Any) -> Any:
        one_by_one[0] += 1
        return push_arrays(*a, **k)

    monkeypatch.setattr(codecrt, "push_many", counted)
    monkeypatch.setattr(wire, "push_arrays", alone)
    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=16, max_batch=16,
                       warm_buckets=(1,), gather_ms=0.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(19)
        levels = {sid: small_codes(4 * int(rng.integers(6, 20)), rng) for sid in range(1, 11)}
        levels[4][1][3] = -1  # out of range: stream 4 fails, the others go on
        send(front, [wire.OpenStream(sid, "small") for sid in levels])
        w.drain()
        for sids in ((1, 2, 3), (4,), (5, 6), (7,), (8, 9, 10)):
            front.commands.write([wire.encode([wire.PushCodes(sid, levels[sid])
                                               for sid in sids])])
        front.commands.ring()
        calls[0] = one_by_one[0] = 0
        w.drain()
        assert (calls[0], one_by_one[0]) == (1, 0)
        send(front, [wire.FinishStream(sid) for sid in levels])
        audio, ends = _run_until_ended(w, front, len(levels))
        assert len(ends[4]) == 1 and ends[4][0].code == "token_range", ends[4]
        for sid, lv in levels.items():
            if sid == 4:
                continue
            assert len(ends[sid]) == 1 and isinstance(ends[sid][0], wire.StreamDone), ends[sid]
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(lv), sid)


def test_a_front_that_dies_during_a_tick_loses_only_its_streams(small: Path) -> None:
    """A front whose process dies while the device computes: the flush before the tick's
    audio is collected (an event was waiting: a failed push read meanwhile) finds its ring
    hung up and detaches it, closing its streams; the worker pulls none of them and goes
    on (it used to die on a pull of a closed stream)."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=32, max_batch=32,
                       warm_buckets=(1,), gather_ms=0.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(3)
        levels = {sid: small_codes(40, rng) for sid in range(1, 5)}
        send(front, [wire.OpenStream(sid, "small") for sid in [*levels, 9]]
             + [wire.PushCodes(sid, lv) for sid, lv in levels.items()])
        w.drain()
        w.flush()
        bad = small_codes(8, rng)
        bad[0][0] = 4096  # out of range: stream 9 fails when the overlap reads it
        send(front, [wire.PushCodes(9, bad)])
        overlap = w._overlap

        def dying(since: Any, defer: bool = True) -> Any:
            t = overlap(since, defer)  # reads the bad push: its StreamFailed waits in w.out
            assert any(isinstance(m, wire.StreamFailed) for m in w.out)
            front.close()  # the front process is gone while the device computes
            return t

        w._overlap = dying
        w.run_ticks()
        assert 1 not in w.fronts and not w.where


def test_an_earlier_models_audio_reaches_the_front_during_the_next_models_tick(
        small: Path) -> None:
    """Two models in a round: the first model's audio, written into the front's ring in
    place, is published while the second model's tick computes, not a round later."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"a": str(small), "b": str(small)}, n_threads=1, max_streams=16,
                       max_batch=16, warm_buckets=(1,), gather_ms=0.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(5)
        send(front, [wire.OpenStream(1, "a"), wire.OpenStream(2, "b"),
                     wire.PushCodes(1, small_codes(400, rng)),
                     wire.PushCodes(2, small_codes(400, rng))])
        w.drain()
        w.flush()
        read_events(front)  # StreamOpened
        seen: list[tuple[str, list[int]]] = []
        overlap, tick = w._overlap, w._tick
        ticking = [""]

        def watched(since: Any, defer: bool = True) -> Any:
            t = overlap(since, defer)
            seen.append((ticking[0], [m.sid for m in read_events(front)
                                      if isinstance(m, wire.AudioOut)]))
            return t

        def named(m: Any, only: Any = None) -> Any:
            ticking[0] = m.name
            return tick(m, only)

        w._overlap, w._tick = watched, named
        for _ in range(4):
            w.run_ticks()
        assert any(name == "b" and 1 in got for name, got in seen), seen


def test_commands_that_would_end_a_tick_wait_for_its_end(small: Path, offline: Any) -> None:
    """Read while a tick is on the device (a GPU's way, ``async_ticks``, set here on the CPU):
    the pushes before the first open are applied, the open and everything behind it (pushes
    included, in order) wait for the tick's end, so the tick's audio is not held back by them;
    the next read applies them first, and every stream's audio equals its offline decode. On
    the CPU backend (whose step_begin computed the tick) nothing waits."""
    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.worker import _FID_SHIFT

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=16, max_batch=16,
                       warm_buckets=(1,), gather_ms=0.0)
    base = 1 << _FID_SHIFT
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(23)
        levels = {sid: small_codes(48, rng) for sid in (1, 2, 3, 7)}
        first = {sid: [x[:24 // s] for x, s in zip(lv, (4, 2, 1))] for sid, lv in levels.items()}
        rest = {sid: [x[24 // s:] for x, s in zip(lv, (4, 2, 1))] for sid, lv in levels.items()}
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2, 3)]
             + [wire.PushCodes(sid, first[sid]) for sid in (1, 2, 3)])
        w.drain()
        send(front, [wire.PushCodes(1, rest[1]), wire.OpenStream(7, "small"),
                     wire.PushCodes(7, levels[7]), wire.PushCodes(2, rest[2]),
                     wire.PushCodes(3, rest[3])])
        seen: list[tuple[bool, int, int]] = []
        overlap = w._overlap

        def watched(since: Any, defer: bool = True) -> Any:
            t = overlap(since, defer)
            pushed = {sid: w.models["small"].streams[base | sid].stream.stats.frames_pushed
                      for sid in (1, 2)}
            seen.append((base | 7 in w.where, pushed[1], pushed[2]))
            return t

        w._overlap = watched
        assert not w.models["small"].async_ticks  # the CPU backend
        w.models["small"].async_ticks = True
        w.run_ticks()
        assert seen and seen[0] == (False, 48, 24), seen  # 1's rest applied, 2's deferred
        assert w.fronts[1].deferred is not None
        assert w._wait(None)  # the loop does not sleep on deferred commands
        w._overlap = overlap
        w.drain()
        assert w.fronts[1].deferred is None and base | 7 in w.where
        send(front, [wire.FinishStream(sid) for sid in levels])
        audio, ends = _run_until_ended(w, front, len(levels))
        for sid, lv in levels.items():
            assert len(ends[sid]) == 1 and isinstance(ends[sid][0], wire.StreamDone), ends[sid]
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(lv), sid)


def test_deferred_commands_go_into_a_new_buffer_and_before_the_next_tick(small: Path,
                                                                         offline: Any) -> None:
    """Commands deferred by a tick (``async_ticks``): the next read copies them into a new
    buffer, as a low-latency stream keeps its pushed codes as views of the old one (a viewed
    bytearray cannot grow: the worker died on it); and they are applied before the next tick
    starts even with no read in between (an express or catch-up tick, a round's next model)."""
    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.worker import _FID_SHIFT

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=16, max_batch=16,
                       warm_buckets=(1,), gather_ms=0.0)
    base = 1 << _FID_SHIFT
    with running_worker(cfg) as (w, front):
        m = w.models["small"]
        m.async_ticks = True
        rng = np.random.default_rng(29)
        levels = {sid: small_codes(96, rng) for sid in (1, 2, 7, 8)}
        part = {sid: [[x[i * 24 // s:(i + 1) * 24 // s] for x, s in zip(lv, (4, 2, 1))]
                      for i in range(4)] for sid, lv in levels.items()}
        send(front, [wire.OpenStream(1, "small"),
                     wire.OpenStream(2, "small", wire.StreamOptions(latency="low")),
                     wire.PushCodes(1, part[1][0])])
        w.drain()
        # stream 2 (low latency) is not ready: stream 1's tick overlaps this read, and 2's
        # codes stay views of the read's buffer
        send(front, [wire.PushCodes(2, part[2][0]), wire.OpenStream(7, "small"),
                     wire.PushCodes(7, levels[7])])
        w.run_ticks()
        assert w.fronts[1].deferred is not None and base | 7 not in w.where
        send(front, [wire.PushCodes(1, part[1][1]), wire.CancelStream(2)])
        w.drain()  # records behind the deferred ones
        assert w.fronts[1].deferred is None and base | 7 in w.where and base | 2 not in w.where
        send(front, [wire.PushCodes(1, part[1][2]), wire.OpenStream(8, "small"),
                     wire.PushCodes(8, levels[8])])
        w.run_ticks()
        assert w.fronts[1].deferred is not None and base | 8 not in w.where
        w._tick(m, only=[])  # a tick with no read before it
        assert w.fronts[1].deferred is None and base | 8 in w.where
        assert m.streams[base | 8].stream.stats.frames_pushed == 96
        send(front, [wire.PushCodes(1, part[1][3])]
             + [wire.FinishStream(sid) for sid in (1, 7, 8)])
        audio, ends = _run_until_ended(w, front, 3)
        for sid in (1, 7, 8):
            assert len(ends[sid]) == 1 and isinstance(ends[sid][0], wire.StreamDone), ends[sid]
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(levels[sid]), sid)


def test_push_records_of_two_models_in_a_row_keep_one_call_a_record(
        small: Path, offline: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PUSH records in a row whose streams are of two models (two contexts) cannot share a
    runtime call: they are applied record by record, each record of one model's streams in
    one call as before, none stream by stream."""
    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.worker import Worker

    one_by_one = [0]
    push = Worker._push

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        one_by_one[0] += 1
        return push(self, *a, **k)

    monkeypatch.setattr(Worker, "_push", counted)
    cfg = EngineConfig(models={"a": str(small), "b": str(small)}, n_threads=1, max_streams=16,
                       max_batch=16, warm_buckets=(1,), gather_ms=0.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(17)
        levels = {sid: small_codes(4 * int(rng.integers(6, 20)), rng) for sid in range(1, 9)}
        model = {sid: "a" if sid % 2 else "b" for sid in levels}
        send(front, [wire.OpenStream(sid, model[sid]) for sid in levels])
        w.drain()
        for sids in ((1, 3), (2, 4), (5, 7), (6, 8)):  # one model's streams a record, alternating
            front.commands.write([wire.encode([wire.PushCodes(sid, levels[sid])
                                               for sid in sids])])
        for sid in levels:
            front.commands.write([wire.encode([wire.FinishStream(sid)])])
        front.commands.ring()
        audio, ends = _run_until_ended(w, front, len(levels))
        assert one_by_one[0] == 0
        for sid, lv in levels.items():
            assert isinstance(ends[sid][0], wire.StreamDone), ends[sid]
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(lv), sid)


def test_batch_shapes_setting_reaches_the_workers_context(tmp_path: Path, small: Path) -> None:
    """batch_shapes: auto (the default: exact shapes, on every device), pow2 and exact become
    the engine's batch_bucket and the context's; anything else is a configuration error naming
    the setting."""
    import pytest

    from codecd.config import ConfigError, load_config
    from codecd.families.native import make_context
    from codecd.server import engine_config

    toml = tmp_path / "c.toml"
    toml.write_text(f'[[models]]\nname = "small"\nsource = "{small}"\n')
    auto = engine_config(load_config(str(toml), env={}), {"small": str(small)})
    assert auto.batch_bucket is None
    pow2 = load_config(str(toml), env={"CODECD_BATCH_SHAPES": "pow2"})
    assert engine_config(pow2, {"small": str(small)}).batch_bucket is True
    exact = load_config(str(toml), env={"CODECD_BATCH_SHAPES": "Exact"})
    assert engine_config(exact, {"small": str(small)}).batch_bucket is False
    with pytest.raises(ConfigError, match="batch_shapes"):
        load_config(str(toml), env={"CODECD_BATCH_SHAPES": "pow3"})
    import codecrt

    made: list[bool] = []
    real = codecrt.Context

    def recording(*args: Any, **kw: Any) -> Any:  # the real context, its batch_bucket noted
        made.append(kw["batch_bucket"])
        return real(*args, **kw)

    with pytest.MonkeyPatch.context() as mp, codecrt.Model(str(small)) as m:
        mp.setattr(codecrt, "Context", recording)
        for cfg in (auto, engine_config(exact, {"small": str(small)})):
            make_context(m, cfg, "cpu").close()
    assert made == [False, False]  # auto: exact; exact as asked


def test_tick_align_auto_on_the_cpu_waits_for_load(tmp_path: Path, small: Path) -> None:
    """tick_align_ms = -1 (the default): the models' tick period on a GPU worker; on a CPU
    one the same period, kept only while the worker is loaded (cadence.py), so an idle one
    gathers for gather_ms; another negative value is refused."""
    import pytest

    from codecd.config import ConfigError, load_config
    from codecd.engine.config import EngineConfig
    from codecd.server import engine_config

    toml = tmp_path / "c.toml"
    toml.write_text(f'[[models]]\nname = "small"\nsource = "{small}"\n')
    assert engine_config(load_config(str(toml), env={}), {"small": str(small)}).tick_align_ms == -1
    with pytest.raises(ConfigError, match="tick_align_ms"):
        load_config(str(toml), env={"CODECD_TICK_ALIGN_MS": "-2"})
    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=4, max_batch=4,
                       warm_buckets=(1,), tick_align_ms=-1.0)
    with running_worker(cfg, front=False) as (w, _):
        info = w.models["small"].lm.model.info
        period = w.models["small"].lm.chunk_frames * info.hop_length / info.sample_rate
        assert w.cadence.fixed_s == 0.0 and w.cadence.loaded_s == period > 0
        assert w._align_s() == 0.0 and w.gather_s > 0


def test_first_audio_auto_is_now_on_the_cpu(tmp_path: Path, small: Path) -> None:
    """first_audio = "auto" (the daemon's default; the engine's is "cadence"): express ticks on
    a worker whose models run on the CPU (docs/benchmarks.md: 12 of 12 runs at this machine's
    capacity edge against 6 of 12); "cadence" and "now" as asked; another value is refused.
    A closed stream leaves the fresh streams, also when no gather takes them."""
    import pytest

    from codecd import wire
    from codecd.config import ConfigError, load_config
    from codecd.engine.config import EngineConfig
    from codecd.server import engine_config

    toml = tmp_path / "c.toml"
    toml.write_text(f'[[models]]\nname = "small"\nsource = "{small}"\n')
    daemon = engine_config(load_config(str(toml), env={}), {"small": str(small)})
    assert (daemon.first_audio, daemon.tick_slack_ms, daemon.first_audio_gap_ms) == ("auto", 5.0, -1.0)
    with pytest.raises(ConfigError, match="first_audio"):
        load_config(str(toml), env={"CODECD_FIRST_AUDIO": "soon"})
    with pytest.raises(ConfigError, match=r"first_audio_gap_ms: must be >= 0, got -2.0 \(or -1: auto\)"):
        load_config(str(toml), env={"CODECD_FIRST_AUDIO_GAP_MS": "-2"})
    gap = load_config(str(toml), env={"CODECD_FIRST_AUDIO_GAP_MS": "150"})
    assert engine_config(gap, {"small": str(small)}).first_audio_gap_ms == 150.0
    for mode, express in (("auto", True), ("cadence", False), ("now", True)):
        cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=4,
                           max_batch=4, warm_buckets=(1,), first_audio=mode, first_audio_gap_ms=-1.0)
        with running_worker(cfg, front=mode == "auto") as (w, front):
            assert w.express is express, mode
            assert w.first_gap_ms == 0.0  # auto on the CPU: no bound
            if front is not None:
                send(front, [
                    wire.OpenStream(1, "small"),
                    wire.PushCodes(1, small_codes(4, np.random.default_rng(7))),
                    wire.CancelStream(1)])
                w.drain()
                assert not w._fresh


def test_pushes_read_during_a_tick_wait_for_the_next_aligned_tick(small: Path, offline: Any
                                                                  ) -> None:
    """With ticks aligned to a cadence, a front's record that arrives while a tick is out is
    read in that tick's shadow (codecrt.step_begin .. step_end; its finish ends the tick early)
    but its codes wait for the next tick: one run_ticks is one round. Each stream still equals
    its offline decode."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=4, max_batch=4,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(5)
        levels = {sid: small_codes(4 * 12, rng) for sid in (1, 2)}
        half = [{sid: [x[:len(x) // 2] for x in lv] for sid, lv in levels.items()},
                {sid: [x[len(x) // 2:] for x in lv] for sid, lv in levels.items()}]
        send(front, [wire.OpenStream(sid, "small") for sid in levels]
             + [wire.PushCodes(sid, lv) for sid, lv in half[0].items()])
        w.drain()
        m = w.models["small"]
        link = w.fronts[1]
        assert link.packets_in == 1
        send(front, [wire.PushCodes(sid, lv) for sid, lv in half[1].items()]
             + [wire.FinishStream(sid) for sid in levels])
        w.run_ticks()
        assert link.packets_in == 2  # read while the tick was out, with no drain in between
        assert m.ticks == 1  # and not ticked at once: the loop gates the next tick to its boundary
        audio: dict[int, list[np.ndarray]] = {sid: [] for sid in levels}
        ends: dict[int, Any] = {}
        for _ in range(200):
            for msg in read_events(front):
                if isinstance(msg, wire.AudioOut):
                    audio[msg.sid].append(msg.pcm)
                elif isinstance(msg, (wire.StreamDone, wire.StreamFailed)):
                    ends[msg.sid] = msg
            if len(ends) == len(levels):
                break
            w.drain()
            w.run_ticks()
        assert all(isinstance(e, wire.StreamDone) for e in ends.values()), ends
        for sid, lv in levels.items():
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(lv), sid)
        # every tick's parts were recorded, split at the two halves, and add up to the tick
        an = w.stats()["models"]["small"]["tick_anatomy"]
        assert an["ticks"] == m.ticks >= 2
        for which in ("all", "slowest"):
            t = an[which]
            assert t["launch"] > 0 and t["wait"] >= 0 and t["overlap"] >= 0 and t["collect"] > 0
            parts = t["launch"] + t["overlap"] + t["wait"] + t["collect"]
            assert abs(t["total"] - parts) < 0.01, t
            assert 1 <= t["batch"] <= 2
        assert an["slowest"]["total"] >= an["all"]["total"]
        assert w.stats()["gc"]["collections"] >= 0


def test_express_ticks_only_what_ends_before_the_aligned_tick(small: Path) -> None:
    """first_audio = "now": new streams' codes are ticked at once, but only as many as the
    model's tick cost says end before the aligned tick is due, those with the most silent steps
    (nearest their first audio) first; the rest wait for another express tick while time is
    left, and for the aligned tick once none fits (on the H200, unguarded express ticks
    delayed the aligned ones: 632 late frames at 1,000 streams)."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.worker import _FID_SHIFT

    def fresh() -> list[int]:  # the front's stream ids of the worker's fresh streams
        return [sid & ((1 << _FID_SHIFT) - 1) for sid in w._fresh]

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now")
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(6)
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2, 3, 4)]
             + [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2, 3, 4)])
        w.drain()
        assert fresh() == [1, 2, 3, 4]  # in the order their codes came
        for sid, st in w._fresh.items():  # streams 3 and 4 have stepped once without audio
            st.silent_steps = int(sid & ((1 << _FID_SHIFT) - 1) >= 3)
        m = w.models["small"]
        # ticks that cost 100 ms plus 150 ms a stream: long enough that the time between this
        # clock reading and the worker's own (a loaded box may deschedule us) does not matter
        m.cost.add(1, 250.0)
        m.cost.add(8, 1300.0)
        w._express(time.monotonic() + 0.6)  # 0.9 * 600 - 1 = 539 ms: two streams (400), not three
        assert (m.ticks, list(m.batches)) == (1, [2])
        assert fresh() == [1, 2]  # tried again while time is left
        w._express(time.monotonic() + 0.005)  # 3.5 ms: not even one
        assert m.ticks == 1 and not w._fresh  # they wait for the aligned tick
        w.run_ticks()
        assert list(m.batches) == [2, 2]
        st = w.stats()  # what /metrics shows of it (codecd_express_ticks, codecd_tick_cost_seconds)
        assert st["cadence"] == {"period_ms": 1000.0, "slack_ms": 0.0, "first_audio": "now",
                                 "first_audio_gap_ms": 0.0, "catch_up": 0}
        assert st["models"]["small"]["express_ticks"] == 1
        fixed_ms, per_ms = st["models"]["small"]["tick_cost_ms"]
        assert fixed_ms >= 0 and per_ms > 0


def test_catch_up_ticks_the_streams_that_missed_their_round(small: Path) -> None:
    """tick_catch_up: a round that starts without streams stepped in the round before marks
    them missed; once their codes are in, a catch-up tick steps as many as the tick cost says
    end before the next round is due (the rest wait), at most tick_catch_up such ticks
    between two rounds. A stream caught up after one miss is waited for by the next round
    again; one that missed two rounds in a row is not."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig
    from codecd.tickcost import TickCost

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="cadence", tick_catch_up=2)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(9)
        sids = (1, 2, 3, 4)
        send(front, [wire.OpenStream(sid, "small") for sid in sids]
             + [wire.PushCodes(sid, small_codes(4, rng)) for sid in sids])
        w.drain()
        w.run_ticks()  # every stream in the first round
        m = w.models["small"]
        assert list(m.batches) == [4] and not w._missed
        send(front, [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2)])
        w.drain()
        w.run_ticks()  # 3 and 4 missed it
        assert list(m.batches) == [4, 2]
        missed = sorted(st.sid for st in w._missed.values())
        assert len(missed) == 2
        st3, st4 = (w._missed[sid] for sid in missed)
        assert not st3.on_cadence and st3.misses == 1
        st3.maybe_ready = True  # as a push that does not complete a chunk leaves it
        w._catch_up(time.monotonic() + 1.0)  # no chunk in yet: no tick, both still owed one
        assert m.catch_up_ticks == 0 and len(w._missed) == 2 and w._catch_ups_left == 2
        send(front, [wire.PushCodes(sid, small_codes(4, rng)) for sid in (3, 4)])
        w.drain()
        m.cost = TickCost()  # ticks that cost 100 ms plus 150 ms a stream (not the real ones;
        m.cost.add(1, 250.0)  # long, so that a descheduled test does not change what fits)
        m.cost.add(8, 1300.0)
        w._catch_up(time.monotonic() + 0.4)  # 0.9 * 400 - 1 = 359 ms: one stream (250), not two
        assert (m.catch_up_ticks, m.catch_up_streams, list(m.batches)) == (1, 1, [4, 2, 1])
        assert st3.on_cadence and st3.stepped_since and len(w._missed) == 1
        w._catch_up(time.monotonic() + 0.005)  # 3.5 ms: none fits, it waits for the round
        assert m.catch_up_ticks == 1 and len(w._missed) == 1
        w._catch_up(time.monotonic() + 1.0)  # the second and last catch-up tick
        assert (m.catch_up_ticks, list(m.batches)) == (2, [4, 2, 1, 1]) and not w._missed
        # a third round: stream 4 misses again (two in a row), stream 3 is in
        send(front, [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2, 3)])
        w.drain()
        w.run_ticks()
        assert list(m.batches)[-1] == 3 and set(w._missed) == {st4.sid} and st4.misses == 2
        send(front, [wire.PushCodes(4, small_codes(4, rng))])
        w.drain()
        w._catch_up(time.monotonic() + 1.0)
        assert m.catch_up_ticks == 3 and not st4.on_cadence  # late twice: not waited for
        assert w.stats()["models"]["small"]["catch_up_streams"] == 3


def test_a_round_steps_every_ready_stream_when_more_than_one_graph_holds(small: Path,
                                                                        offline: Any) -> None:
    """max_streams above max_batch: an aligned round steps all 10 ready streams in graphs of
    at most max_batch (4 + 4 + 2), not 4 a round with the rest waiting for later rounds (as
    on an H200 at 1,200 streams under --max-batch 1024, where some streams' audio stopped for
    2.9 s); the audio of every stream still equals its offline decode."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=12, max_batch=4,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="cadence")
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(21)
        sids = list(range(1, 11))
        levels = {sid: small_codes(12, rng) for sid in sids}
        send(front, [wire.OpenStream(sid, "small") for sid in sids])
        w.drain()
        m = w.models["small"]
        for k in range(3):  # three rounds of one 4-frame chunk each
            send(front, [wire.PushCodes(sid, [x[4 * k * (4 // s):4 * (k + 1) * (4 // s)]
                                              for x, s in zip(levels[sid], (4, 2, 1))])
                         for sid in sids])
            w.drain()
            before = m.stream_ticks
            w.run_ticks()  # aligned: one round
            assert m.stream_ticks - before == 10, (k, list(m.batches))
            assert list(m.batches)[-3:] == [4, 4, 2]
        send(front, [wire.FinishStream(sid) for sid in sids])
        audio, ends = _run_until_ended(w, front, len(sids))
        assert len(ends) == len(sids)
        for sid in sids:
            assert isinstance(ends[sid][-1], wire.StreamDone)
            assert_stream_equals_offline(np.concatenate(audio[sid]), offline(levels[sid]), sid)


def test_a_stream_an_express_tick_ran_ahead_has_not_missed_its_round(small: Path) -> None:
    """first_audio = "now" with catch-up ticks: a stream whose next codes an express tick
    stepped before the next round is not ready at that round because it ran ahead, not late:
    no miss counted, no catch-up tick owed (counted, it took catch-up ticks every period and
    the rounds waited for it)."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", tick_catch_up=2)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(10)
        two_new_streams_in_a_round(w, front, rng)
        m = w.models["small"]
        assert list(m.batches) == [2]
        send(front, [wire.PushCodes(1, small_codes(4, rng))])
        w.drain()
        w._express(time.monotonic() + 1.0)  # stream 1 (no audio yet) ahead of the cadence
        assert list(m.batches) == [2, 1] and m.express_ticks == 1
        send(front, [wire.PushCodes(2, small_codes(4, rng))])
        w.drain()
        w._fresh.clear()
        w.run_ticks()  # stream 2 alone: stream 1 is ahead, not late
        assert list(m.batches) == [2, 1, 1]
        assert not w._missed
        assert all(st.misses == 0 for st in m.streams.values())


def test_first_audio_gap_holds_an_express_tick_until_its_gap_fits(small: Path) -> None:
    """first_audio_gap_ms: an express tick that would give first audio too long before the
    stream's next (the aligned round a period after the one due) waits until the gap fits, with
    the worker asleep meanwhile, then runs; the held streams never wait past the aligned round.
    Unbounded, on an H100 at 1,300 streams, express ticks brought first audio p99 from 326-364
    to 241 ms and the gap after it to 189-194 ms (docs/history.md, 2026-12-06)."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=1250.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(7)
        # streams 1 and 2 have codes; 3 has none, so the round is not all-ready before the deadline
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2, 3)]
             + [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2)])
        w.drain()
        m = w.models["small"]
        m.cost.add(1, 25.0)  # ticks that cost 10 ms plus 15 ms a stream
        m.cost.add(8, 130.0)
        # a round of the 3 open streams 55 ms, an express tick of 2 40 ms: 400 ms before the round
        # due, the gap would be 400 + 1000 + 55 - 40 = 1415 ms, so the tick waits 165 ms
        t0 = time.monotonic()
        w._express(t0 + 0.4)
        assert m.ticks == 0 and len(w._fresh) == 2 and set(w._holds) == {"small"}
        hold = w._holds["small"]  # deadline - 235 ms, whenever the worker read its clock
        assert 0.150 < hold - t0 < 0.170
        assert w.stats()["models"]["small"]["express_holds"] == 1  # codecd_express_holds

        starts: list[float] = []
        tick, wait = w._tick, w._wait
        waits = [0]

        def timed_tick(*args: Any, **kw: Any) -> int:
            starts.append(time.monotonic())
            return tick(*args, **kw)

        def counted_wait(*args: Any, **kw: Any) -> bool:
            waits[0] += 1
            return wait(*args, **kw)

        w._tick, w._wait = timed_tick, counted_wait
        t0 = time.monotonic()
        assert w._gather_until(t0 + 0.4) == "boundary"
        assert m.express_ticks == 1 and list(m.batches) == [2]
        # when the gap fits (not at once: at the hold, or later if the worker recomputed it
        # from this later deadline), and before the round
        assert starts[0] >= hold and starts[0] - t0 < 0.39, (starts[0] - hold, starts[0] - t0)
        assert waits[0] < 20  # asleep while held, not polling
        w._tick, w._wait = tick, wait

        # unbounded: the same tick runs at once
        w.first_gap_ms = 0.0
        send(front, [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2)])
        w.drain()
        for st in m.streams.values():
            if st.maybe_ready:
                w._fresh[st.sid] = st
        w._express(time.monotonic() + 0.4)
        assert m.express_ticks == 2 and not w._holds


def test_first_audio_auto_on_a_gpu_bounds_the_gap_at_two_periods() -> None:
    """first_audio and first_audio_gap_ms auto on a worker whose models run on a GPU: express
    ticks, bounded at twice the shortest tick period in whole ms (SNAC 24 kHz's 4 frames of 512
    samples: 85.3 ms, so 170); a GPU model whose bound is set to 0 keeps the cadence, and a CPU
    model expresses unbounded. Models stand in for loaded ones: only their context's backends
    and stream shape are read."""
    from types import SimpleNamespace

    from codecd.families.native import ExactStreamModel
    from codecd.worker import audio_steps_only, auto_express, auto_first_gap_ms

    def model(backend: str, hop: int, sr: int, chunk: int = 4) -> Any:
        lm = ExactStreamModel.__new__(ExactStreamModel)
        lm.ctx = SimpleNamespace(stats=SimpleNamespace(backends=(backend, "CPU")))
        lm.model = SimpleNamespace(info=SimpleNamespace(hop_length=hop, sample_rate=sr))
        lm.chunk_frames = chunk
        return SimpleNamespace(lm=lm)

    snac = model("CUDA0", 512, 24000)
    mimi = model("CUDA0", 1920, 24000, chunk=1)  # 80 ms a tick
    assert auto_first_gap_ms([snac]) == 170.0
    assert auto_first_gap_ms([snac, mimi]) == 160.0
    assert auto_express([snac], 170.0) and not auto_express([snac], 0.0)
    cpu = model("CPU", 512, 24000)
    assert auto_first_gap_ms([cpu]) == 0.0 and auto_express([cpu], 0.0)
    # off the CPU express ticks take only the steps that reach a new stream's first audio
    assert audio_steps_only(snac.lm) and not audio_steps_only(cpu.lm)


def test_first_audio_gap_allows_for_slow_rounds(small: Path) -> None:
    """The gap after an express tick ends at the aligned round a period on, and the bound is on the
    gaps' tail: the hold takes that round as slow as the tick cost's spread says rounds run
    (_GAP_TAIL_SPREADS of it), not at the line's mean. With the mean alone a 155 ms bound gave
    first-audio gaps of 184 to 200 ms at their 99th percentile (H100, 1,300 streams)."""
    import pytest

    from codecd.engine.config import EngineConfig
    from codecd.tickcost import TickCost
    from codecd.worker import _GAP_TAIL_SPREADS

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=1250.0)
    with running_worker(cfg, front=False) as (w, _):
        m = w.models["small"]
        steady, noisy = TickCost(), TickCost()
        for i in range(400):  # 10 ms plus 15 ms a stream; the noisy one 6 ms either side of it,
            n = 1 + i % 8    # alternating every 8 ticks, so that every size sees both signs
            steady.add(n, 10.0 + 15.0 * n)
            noisy.add(n, 10.0 + 15.0 * n + (6.0 if (i // 8) % 2 else -6.0))
        holds = []
        for cost in (steady, noisy):
            m.cost = cost
            holds.append(w._first_gap_hold_ms(m, 2, 100.4, 100.0))
    # no stream open: a round of 0 streams costs the line's 10 ms; 400 + 1000 + 10 - 40 - 1250
    assert holds[0] == pytest.approx(120.0, abs=0.1)
    assert holds[1] - holds[0] == pytest.approx(_GAP_TAIL_SPREADS * 6.0, rel=0.05)


def test_a_new_stream_does_not_hold_the_next_round(small: Path) -> None:
    """first_audio = "now" off the CPU (express ticks only for a new stream's first audio):
    stream 1, past its first audio, and new stream 2 are both ready at an aligned round's start
    and stepped in it. The next round waits for stream 1's codes, not for stream 2's: a new
    stream's codes come at its own phase (or an express tick takes them first), and waited for,
    new streams arriving every period kept every round at its deadline, a period and the slack
    after the last one: every stream fell behind real time by the slack each period (an H100,
    streams starting over 3 s; docs/benchmarks.md, session 53)."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1, 2), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=0.0)
    with running_worker(cfg) as (w, front):
        w.models["small"].audio_steps_only = True  # as off the CPU
        rng = np.random.default_rng(9)
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2)]
             + [wire.PushCodes(1, small_codes(4 * 10, rng))])  # its first audio's 9 steps and 1
        w.drain()
        m = w.models["small"]
        one, two = sorted(m.streams.values(), key=lambda st: st.sid)
        assert one.to_audio == two.to_audio == 9  # latency 135 samples, 16 a step
        while one.fresh:  # rounds alone (no express tick) until stream 1's first audio
            w._fresh.clear()
            w.run_ticks()
        assert one.silent_steps == 8 and one.stream.stats.frames_decoded == 4 * 9
        send(front, [wire.PushCodes(2, small_codes(4, rng))])
        w.drain()
        w._fresh.clear()
        w.run_ticks()
        assert list(m.batches)[-1] == 2
        assert one.on_cadence and not two.on_cadence
        assert not w._all_waiting()  # stream 1's next codes are not in yet
        send(front, [wire.PushCodes(1, small_codes(4, rng))])  # stream 1's next codes
        w.drain()
        assert w._all_waiting()  # stream 2's are not in, and the round does not wait for them


def test_a_stream_stepped_by_an_express_tick_does_not_hold_the_next_round(small: Path) -> None:
    """On the CPU (express ticks take every step of a new stream) streams 1 and 2, new, are
    ready at an aligned round's start and stepped in it: the next round waits for each. Stream
    2 then takes its next chunk in an express tick: it ran ahead of the cadence, so the next
    round may start as soon as stream 1's codes are in, not at its deadline (waited for, new
    streams arriving every period kept every round at its deadline)."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1, 2), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=0.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(9)
        two_new_streams_in_a_round(w, front, rng)
        m = w.models["small"]
        assert not m.audio_steps_only
        assert m.ticks == 1 and all(st.on_cadence for st in m.streams.values())
        two = next(st for st in m.streams.values() if st.sid & 0xFFFF == 2)  # (the front's id above)
        send(front, [wire.PushCodes(2, small_codes(4, rng))])
        w.drain()
        assert two.fresh and list(w._fresh.values()) == [two]
        w._express(time.monotonic() + 0.5)
        assert m.express_ticks == 1 and not two.maybe_ready
        assert not w._all_waiting()  # stream 1's codes are not in yet
        send(front, [wire.PushCodes(1, small_codes(4, rng))])
        w.drain()
        assert w._all_waiting()


def test_codes_short_of_a_chunk_take_no_express_tick(small: Path) -> None:
    """Chunks of 8 frames: streams 1 and 2, stepped in a round, are waited for by the next.
    Four frames of stream 2's next chunk come (a client sending a frame a message): it cannot
    step yet, so no express tick takes it and it stays on the cadence (an express tick of such
    a stream stepped nothing and took it off the cadence all the same)."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1, 2), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=0.0, stream_chunk_frames=8)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(15)
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2)]
             + [wire.PushCodes(sid, small_codes(8, rng)) for sid in (1, 2)])
        w.drain()
        w._fresh.clear()
        w.run_ticks()
        m = w.models["small"]
        assert m.ticks == 1 and all(st.on_cadence for st in m.streams.values())
        two = next(st for st in m.streams.values() if st.sid & 0xFFFF == 2)  # (the front's id above)
        send(front, [wire.PushCodes(2, small_codes(4, rng)), wire.PushCodes(1, small_codes(8, rng))])
        w.drain()
        assert two.maybe_ready and not two.stream.stats.ready
        w._express(time.monotonic() + 10.0)
        assert m.express_ticks == 1 and list(m.batches)[-1] == 1  # stream 1 alone
        assert two.on_cadence  # the round after the next waits for its chunk again


def test_a_new_stream_a_round_left_out_has_not_missed_it(small: Path) -> None:
    """tick_catch_up with express ticks: new streams 1 and 2 stepped in a round, then a round
    with stream 1's next codes alone. Stream 2's codes coming later are no miss and take no
    catch-up tick while it is new: an express tick takes them (off the CPU no round waits for
    a new stream at all)."""
    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1, 2), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=0.0, tick_catch_up=2)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(13)
        two_new_streams_in_a_round(w, front, rng)
        send(front, [wire.PushCodes(1, small_codes(4, rng))])
        w.drain()
        w._fresh.clear()
        w.run_ticks()
        m = w.models["small"]
        assert list(m.batches) == [2, 1]
        assert not w._missed and all(st.misses == 0 for st in m.streams.values())


def test_express_ticks_take_only_the_steps_that_bring_first_audio(small: Path) -> None:
    """Off the CPU a new stream's express tick runs only when it brings the stream's first audio
    at once: the stream can step and the codes pushed so far reach its first audio, or it is
    finished. A step short of it stays for the aligned round (the stream stays ready). SNAC 24 kHz's first audio comes at a stream's
    third step; taking every step, the express ticks ran up to 30 a period and took 30 to 75 % of
    the worker's time while 1,600 to 2,200 streams arrived over 3 s on an H100."""
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"small": str(small)}, n_threads=1, max_streams=8, max_batch=8,
                       warm_buckets=(1, 2), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=0.0)
    with running_worker(cfg) as (w, front):
        w.models["small"].audio_steps_only = True  # as off the CPU: to_audio 9 at open
        rng = np.random.default_rng(12)
        # stream 1: one chunk of the 9 its first audio needs; 2: all 9, pushed ahead;
        # 3: one chunk, then finished; 4: 8 chunks
        send(front, [wire.OpenStream(sid, "small") for sid in (1, 2, 3, 4)]
             + [wire.PushCodes(1, small_codes(4, rng)), wire.PushCodes(2, small_codes(36, rng)),
                wire.PushCodes(3, small_codes(4, rng)), wire.FinishStream(3),
                wire.PushCodes(4, small_codes(32, rng))])
        w.drain()
        m = w.models["small"]
        by = {st.sid & 0xFFFF: st for st in m.streams.values()}  # (the front's id above)
        assert set(w._fresh.values()) == set(by.values())
        w._express(time.monotonic() + 10.0)
        assert m.express_ticks == 1 and list(m.batches) == [2]  # streams 2 and 3
        assert by[1].maybe_ready and by[1].stream.stats.frames_decoded == 0
        assert by[1] not in w._fresh.values()  # until its next codes
        assert by[2] in w._fresh.values()  # the next of its chunks at once too
        w._fresh.clear()
        w.run_ticks()  # the aligned round takes the step left to it
        assert by[1].stream.stats.frames_decoded == 4 and by[1].silent_steps == 1
        send(front, [wire.PushCodes(1, small_codes(32, rng)), wire.PushCodes(4, small_codes(4, rng))])
        w.drain()  # streams 1 and 4 now hold their first audio's codes
        w._express(time.monotonic() + 10.0)
        assert m.express_ticks == 2 and list(m.batches)[-1] == 2  # 1 and 4
        m.audio_steps_only = False  # on the CPU: every step of a new stream (opened now) at once
        send(front, [wire.OpenStream(5, "small"), wire.PushCodes(5, small_codes(4, rng))])
        w.drain()
        w._express(time.monotonic() + 10.0)
        assert m.express_ticks == 3 and list(m.batches)[-1] == 3  # 5, and 1 and 4 again

    # a stream that its rounds bring to its first audio while it waits in the express ticks'
    # list (held, or not yet reached) leaves it: past its first audio, its next codes are the
    # rounds' (an express tick ahead of them would hold the next round again)
    with running_worker(cfg) as (w, front):
        send(front, [wire.OpenStream(1, "small"), wire.PushCodes(1, small_codes(4 * 10, rng))])
        w.drain()
        m = w.models["small"]
        (one,) = m.streams.values()
        assert list(w._fresh.values()) == [one]
        while one.fresh:
            w.run_ticks()
        assert not w._fresh and one.on_cadence
        send(front, [wire.PushCodes(1, small_codes(4, rng))])
        w.drain()
        w._express(time.monotonic() + 10.0)
        assert not w._fresh and m.express_ticks == 0


def test_first_audio_gap_holds_one_model_not_the_others(small: Path, caplog: Any) -> None:
    """A hold (first_audio_gap_ms) is per model: while one model's new streams wait, another's
    take their express tick at once; a hold that would end past the aligned round leaves its
    streams to that round, ready. The setting does nothing, and says so, without express ticks."""
    import logging
    import time

    from codecd import wire
    from codecd.engine.config import EngineConfig

    cfg = EngineConfig(models={"a": str(small), "b": str(small)}, n_threads=1, max_streams=8,
                       max_batch=8, warm_buckets=(1,), gather_ms=0.0, tick_align_ms=1000.0,
                       first_audio="now", first_audio_gap_ms=1010.0)
    with running_worker(cfg) as (w, front):
        rng = np.random.default_rng(8)
        # model a: streams 1, 2 with codes, 3 without; model b: stream 4, whose codes come later
        send(front, [wire.OpenStream(sid, "a") for sid in (1, 2, 3)] + [wire.OpenStream(4, "b")]
             + [wire.PushCodes(sid, small_codes(4, rng)) for sid in (1, 2)])
        w.drain()
        ma, mb = w.models["a"], w.models["b"]
        ma.cost.add(1, 25.0)  # a: 10 ms plus 15 ms a stream; b: no tick yet, no cost: never held
        ma.cost.add(8, 130.0)
        # a, 1 s before the round: its tick of 2 would open 1000 + 1000 + 55 - 40 = 2015 ms of
        # gap, so it waits 1005 ms, past the round (a bound under period + round: the cadence
        # for a); 1 s leaves b's express tick below ample time on a loaded box
        deadline = time.monotonic() + 1.0
        w._express(deadline)
        assert (ma.express_ticks, ma.express_holds, set(w._holds)) == (0, 1, {"a"})
        send(front, [wire.PushCodes(4, small_codes(4, rng))])
        w.drain()
        assert not w._held() and w._fresh_wait_s(time.monotonic()) == 0.0  # b may go
        w._express(deadline)
        assert (mb.express_ticks, ma.express_ticks, ma.express_holds) == (1, 0, 1)
        assert w._held()  # only a's streams are left, and a is held
        # b's first tick (its graph built) may itself have taken the round's time
        assert w._gather_until(deadline) in ("boundary", "boundary-passed")
        assert ma.express_ticks == 0
        assert sum(st.maybe_ready for st in ma.streams.values()) == 2  # left to the aligned round
        w.run_ticks()
        assert list(ma.batches) == [2]

    with caplog.at_level(logging.WARNING, logger="codecd.worker"):
        with running_worker(EngineConfig(models={"a": str(small)}, n_threads=1, max_streams=2,
                                         max_batch=2, warm_buckets=(1,), first_audio="cadence",
                                         first_audio_gap_ms=150.0), front=False):
            pass
    assert "first_audio_gap_ms 150 does nothing" in caplog.text
