"""Exact streaming through codecrt.Stream: equal to offline for any chunking, batched ticks, slots."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip

POS_LEVEL = (0, 1, 2, 2, 1, 2, 2)  # Orpheus: the level of each token of a 7-token group


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


def offline(ctx, levels, noise=False, seed=0):
    return ctx.decode(levels, noise=noise, seed=seed)


def run_stream(ctx, pushes, *, noise=False, seed=0, tick_every=1):
    """Push each item of `pushes` (a list of per-level arrays), ticking as we go; return all PCM."""
    s = ctx.stream(noise=noise, seed=seed)
    out = []
    for i, p in enumerate(pushes):
        s.push(p)
        if i % tick_every == 0:
            s.decode_ready()
            out.append(s.pull())
    s.finish()
    s.decode_ready()
    out.append(s.pull())
    assert s.done
    info = s.info
    s.close()
    return np.concatenate(out), info


def one_token_at_a_time(levels):
    """Orpheus order, one code per push, to the level it belongs to."""
    k = len(levels[0])
    pos = [0, 0, 0]
    pushes = []
    for _ in range(k):
        for p in range(7):
            lv = POS_LEVEL[p]
            piece = [np.zeros(0, np.int32)] * 3
            piece[lv] = levels[lv][pos[lv]:pos[lv] + 1]
            pos[lv] += 1
            pushes.append(piece)
    return pushes


def random_splits(levels, strides, rng, max_frames):
    """Random large chunks: cut the frame axis at random points (each level at its own stride)."""
    n = len(levels[-1]) * strides[-1]
    cuts = sorted(set(int(c) for c in rng.integers(0, n, 6)) | {0, n})
    return [[lv[a // s:b // s] for lv, s in zip(levels, strides)] for a, b in zip(cuts, cuts[1:])]


def test_snac24_orpheus_one_token_at_a_time(codecrt, snac_cases):
    """24 kHz: pushing one Orpheus token at a time gives the offline samples, exactly n_frames*hop of them."""
    case = snac_cases("24khz")
    rng = np.random.default_rng(1)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        levels = reference.random_codes(m.info, 40, None, rng)
        want = offline(ctx, levels)
        got, info = run_stream(ctx, one_token_at_a_time(levels), tick_every=7)
    assert len(got) == len(want) == 40 * 512 == info.total_samples
    assert np.abs(got - want).max() < 1e-5
    # the first and the last frames are there, and they are not silence
    assert np.abs(got[:512]).max() > 0 and np.abs(got[-1024:]).max() > 0
    np.testing.assert_allclose(got[:512], want[:512], atol=1e-6)
    np.testing.assert_allclose(got[-1024:], want[-1024:], atol=1e-6)


def test_snac24_orpheus_groups_split_randomly_with_noise(codecrt, snac_cases):
    """24 kHz, noise on: Orpheus groups split at random points give the offline decode with the same seed."""
    from codecd.families import orpheus as layouts

    case = snac_cases("24khz")
    rng = np.random.default_rng(2)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        levels = reference.random_codes(m.info, 36, None, rng)
        tokens = layouts.levels_to_orpheus(levels)
        want = offline(ctx, levels, noise=True, seed=99)
        cuts = sorted(set(int(c) for c in rng.integers(1, len(tokens), 10)) | {0, len(tokens)})
        pushes = []
        pos = [0, 0, 0]
        for a, b in zip(cuts, cuts[1:]):  # each piece is any run of tokens, groups broken anywhere
            piece = [[], [], []]
            for i in range(a, b):
                piece[POS_LEVEL[i % 7]].append(levels[POS_LEVEL[i % 7]][pos[POS_LEVEL[i % 7]]])
                pos[POS_LEVEL[i % 7]] += 1
            pushes.append([np.array(p, dtype=np.int32) for p in piece])
        got, _ = run_stream(ctx, pushes, noise=True, seed=99)
    assert len(got) == len(want)
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("name", ["24khz", "32khz", "44khz"])
@pytest.mark.parametrize("noise,ops", [(False, "cpu"), (True, "cpu"), (True, "portable"), (True, "fused")])
def test_random_large_chunks_equal_offline(codecrt, snac_cases, name, noise, ops, monkeypatch):
    """Every SNAC configuration: random large chunks, noise off and on, equal the offline decode;
    also through the time-fastest graphs that GPUs run (CODECRT_PORTABLE_OPS), composed and with
    each residual unit's core as one op (CODECRT_FUSED_UNIT=1: the op's C function here)."""
    if ops in ("portable", "fused"):
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
        monkeypatch.setenv("CODECRT_FUSED_UNIT", "1" if ops == "fused" else "0")
    case = snac_cases(name)
    rng = np.random.default_rng(3)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        n = 3 * m.info.frame_multiple if m.info.frame_multiple > 4 else 48
        levels = reference.random_codes(m.info, n, None, rng)
        want = offline(ctx, levels, noise=noise, seed=5)
        got, info = run_stream(ctx, random_splits(levels, m.info.level_strides, rng, n),
                               noise=noise, seed=5)
    assert len(got) == len(want) == n * m.info.hop_length
    err = float(np.abs(got - want).max())
    print(f"\nSNAC {name} noise={noise} ops={ops}: streamed vs offline max |diff| {err:.1e}, "
          f"latency {info.latency_samples} samples")
    assert err < 1e-5


@pytest.mark.parametrize("ops", ["cpu", "portable", "fused", "one-graph", "fused-one-graph"])
def test_batched_ticks_equal_alone_with_joins_and_leaves(codecrt, snac_cases, ops, monkeypatch):
    """N streams stepped together, joining and leaving at different ticks, each equal its own
    offline decode; also with the portable graphs that GPUs run (CODECRT_PORTABLE_OPS), composed
    and with the units' cores as one op (CODECRT_FUSED_UNIT=1), and with
    every stream of a tick that has edge streams in the masked graph (CODECRT_STREAM_GRAPHS=one),
    and both, as a GPU runs them (the masks applied inside the unit and upconv tail ops).
    Two of them have noise on: the first ticks (stream 0 alone) and the last ones run graphs
    without noise inputs, the ticks between graphs with them."""
    if ops in ("portable", "fused", "fused-one-graph"):
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
        monkeypatch.setenv("CODECRT_FUSED_UNIT", "0" if ops == "portable" else "1")
    if ops in ("one-graph", "fused-one-graph"):
        monkeypatch.setenv("CODECRT_STREAM_GRAPHS", "one")
    case = snac_cases("24khz")
    rng = np.random.default_rng(4)
    with codecrt.Model(case.gguf) as m, \
         codecrt.Context(m, device="cpu", batch_bucket=True, max_batch=8, max_streams=8) as ctx:
        utter = [reference.random_codes(m.info, f, None, rng) for f in (8, 28, 4, 40, 16, 12)]
        noisy = {1, 4}
        want = [offline(ctx, u, noise=i in noisy, seed=i) for i, u in enumerate(utter)]
        live: dict[int, object] = {}
        got = {i: [] for i in range(len(utter))}
        fed = {i: 0 for i in range(len(utter))}
        computes0, ticked = ctx.stats.computes, 0
        for tick in range(80):
            if tick < len(utter) * 2 and tick % 2 == 0:  # a new stream joins every other tick
                i = tick // 2
                live[i] = ctx.stream(noise=i in noisy, seed=i)
            for i, s in live.items():  # feed one Orpheus group (4 frames) per tick, mixed chunk sizes
                u = utter[i]
                n = len(u[2])
                step = 4 * (1 + i % 3)
                if fed[i] < n:
                    a, b = fed[i], min(n, fed[i] + step)
                    s.push([u[0][a // 4:b // 4], u[1][a // 2:b // 2], u[2][a:b]])
                    fed[i] = b
                    if b == n:
                        s.finish()
            ticked += ctx.step(list(live.values())) > 0
            for i, s in list(live.items()):
                got[i].append(s.pull())
                if s.done:
                    s.close()  # leaves while the others go on
                    del live[i]
        assert not live
        st = ctx.stats
        computes = st.computes - computes0
    for i, w in enumerate(want):
        g = np.concatenate(got[i])
        assert len(g) == len(w)
        assert np.abs(g - w).max() < 1e-5, f"stream {i}"
    assert st.streams_active == 0
    # a tick runs a steady graph, an edge graph or both (split); one (one-graph)
    assert computes == ticked if ops.endswith("one-graph") else computes > ticked


@pytest.mark.slow
def test_bad_stream_graphs_is_refused(codecrt, snac_cases, monkeypatch):
    """CODECRT_STREAM_GRAPHS other than split or one: the context is refused, saying why."""
    monkeypatch.setenv("CODECRT_STREAM_GRAPHS", "three")
    with codecrt.Model(snac_cases("24khz").gguf) as m:
        with pytest.raises(codecrt.CodecrtError, match="CODECRT_STREAM_GRAPHS is 'three'"):
            codecrt.Context(m, device="cpu")


def test_thousand_streams_reuse_slots_and_graphs(codecrt, snac_cases):
    """1,000 streams opened and closed: no growth of memory, state pool or graphs built after warm-up.
    (One thread: on a graph this small a second one only adds a wake-up per node, 2.5x the time.)"""
    import gc

    from conftest import rss_kib

    case = snac_cases("tiny")
    rng = np.random.default_rng(5)
    with codecrt.Model(case.gguf) as m, \
         codecrt.Context(m, device="cpu", max_streams=4, batch_bucket=True, n_threads=1) as ctx:
        levels = reference.random_codes(m.info, 8, None, rng)
        want = offline(ctx, levels)
        for _ in range(20):
            run_stream(ctx, [levels])
        gc.collect()
        before, st0 = rss_kib(), ctx.stats
        for i in range(1000):
            s = ctx.stream()
            s.push(levels)
            if i % 4 == 3:  # cancelled mid-stream
                ctx.step([s])
            else:
                s.finish()
                s.decode_ready()
                if i % 100 == 0:
                    assert np.abs(s.pull() - want).max() < 1e-5
            s.close()
        gc.collect()
        after, st1 = rss_kib(), ctx.stats
    print(f"\n1000 streams: RSS {before} -> {after} KiB, graphs built {st0.graphs_built} -> "
          f"{st1.graphs_built}, state {st1.state_bytes} bytes")
    assert st1.graphs_built == st0.graphs_built
    assert st1.state_bytes == st0.state_bytes and st1.streams_active == 0
    assert after - before < 8 * 1024


def test_slots_exhausted(codecrt, snac_cases):
    """All slots taken: the next stream raises TooLargeError; closing one frees its slot at once."""
    case = snac_cases("tiny")
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu", max_streams=2) as ctx:
        a, b = ctx.stream(), ctx.stream()
        with pytest.raises(codecrt.TooLargeError, match="slots"):
            ctx.stream()
        a.close()
        ctx.stream().close()
        b.close()


def test_bad_input_leaves_stream_defined_and_others_untouched(codecrt, snac_cases):
    """Out-of-range code, push after finish, broken group: typed errors, the stream unchanged, others intact."""
    case = snac_cases("tiny")
    rng = np.random.default_rng(6)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu") as ctx:
        levels = reference.random_codes(m.info, 8, None, rng)
        want = offline(ctx, levels)
        other = ctx.stream()
        other.push(levels)
        s = ctx.stream()
        bad = [lv.copy() for lv in levels]
        bad[2][5] = 4096
        with pytest.raises(codecrt.CodeRangeError, match="level 2"):
            s.push(bad)
        assert s.info.frames_pushed == 0  # nothing appended
        s.push([levels[0][:1], levels[1][:1], levels[2][:3]])  # a group broken mid-way
        with pytest.raises(codecrt.CodeShapeError, match="incomplete"):
            s.finish()
        s.reset()
        s.push(levels)
        s.finish()
        with pytest.raises(codecrt.StateError, match="after finish"):
            s.push(levels)
        other.finish()
        ctx.step([s, other])
        s.decode_ready()
        other.decode_ready()
        assert np.abs(s.pull() - want).max() < 1e-5
        assert np.abs(other.pull() - want).max() < 1e-5
        s.close()
        other.close()
        with pytest.raises(codecrt.StateError):
            s.push(levels)


def test_push_many_pull_many_equal_one_by_one(codecrt, snac_cases):
    """Packed pushes and one-buffer pulls of many streams give the per-stream calls' samples;
    a bad stream fails alone, a short buffer keeps the rest, bad packing is refused whole."""
    case = snac_cases("tiny")
    rng = np.random.default_rng(7)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu", max_streams=8) as ctx:
        utts = [reference.random_codes(m.info, 8, None, rng) for _ in range(3)]
        want = [offline(ctx, lv) for lv in utts]
        ss = [ctx.stream() for _ in range(3)]
        bad = [lv.copy() for lv in utts[1]]
        bad[2][3] = 4096
        batch = [utts[0], bad, utts[2]]
        nlev = np.array([len(lv) for lv in batch], np.uint32)
        lengths = np.array([len(a) for lv in batch for a in lv], np.uint32)
        codes = np.concatenate([a for lv in batch for a in lv]).astype(np.int32)
        with pytest.raises(codecrt.InputError):  # the lengths overrun the codes: nothing pushed
            codecrt.push_many(ss, nlev, lengths, codes[:-1])
        assert all(s.info.frames_pushed == 0 for s in ss)
        errors = codecrt.push_many(ss, nlev, lengths, codes)
        assert list(errors) == [1] and isinstance(errors[1], codecrt.CodeRangeError)
        assert "level 2" in str(errors[1]) and ss[1].info.frames_pushed == 0
        ss[1].push(utts[1])
        for s in ss:
            s.finish()
        got: list[list[np.ndarray]] = [[], [], []]
        out = np.empty(3 * 4096, np.float32)
        while any(not s.done for s in ss):
            ctx.step(ss)
            counts, flags = codecrt.pull_many(ss, out[:1000])  # short: the rest stays
            at = 0
            for i, c in enumerate(counts.tolist()):
                got[i].append(out[at:at + c].copy())
                at += c
            assert not (flags & codecrt.PULL_MORE).any() or counts.sum() == 1000
            while (flags & codecrt.PULL_MORE).any():
                counts, flags = codecrt.pull_many(ss, out)
                at = 0
                for i, c in enumerate(counts.tolist()):
                    got[i].append(out[at:at + c].copy())
                    at += c
        assert all(flags & codecrt.PULL_DONE)
        for g, w in zip(got, want):
            assert np.array_equal(np.concatenate(g), w)
        for s in ss:
            s.close()


@pytest.mark.parametrize("chosen", [None, "active"])
def test_openmp_wait_policy_passive_unless_chosen(codecrt, chosen):
    """Importing codecrt makes the OpenMP threads of ggml's CPU backend wait passively (ticks of many
    small nodes spun away most of their CPU time on shared cores); a policy the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if chosen:
        env["OMP_WAIT_POLICY"] = chosen
    out = subprocess.run([sys.executable, "-c", "import os, codecrt; print(os.environ['OMP_WAIT_POLICY'])"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == (chosen or "passive")


def test_step_in_two_halves_takes_pushes_between(codecrt, snac_cases):
    """codecrt.step_begin / step_end with codes pushed (packed) while the tick is out and a
    stream opened mid-tick (which ends the tick early): every stream equals its offline decode,
    and step_end reports each tick's count either way."""
    case = snac_cases("tiny")
    rng = np.random.default_rng(11)
    with codecrt.Model(case.gguf) as m, codecrt.Context(m, device="cpu", max_streams=8) as ctx:
        utts = [reference.random_codes(m.info, 16, None, rng) for _ in range(3)]
        want = [offline(ctx, lv) for lv in utts]
        ss = [ctx.stream() for _ in range(2)]
        fed = [0, 0, 0]  # level-0 codes pushed
        got: list[list[np.ndarray]] = [[], [], []]
        stepped = 0
        for tick in range(200):
            live = [s for s in ss if not s.done]
            if not live:
                break
            codecrt.step_begin(ctx, live)
            batch, nlev, to = [], [], []
            for i, s in enumerate(ss):
                n = fed[i]
                if n < len(utts[i][0]):
                    take = 1 + (tick + i) % 2  # codes of level 0 (the coarsest), the rest in proportion
                    batch.append([a[(n * len(a)) // len(utts[i][0]):((n + take) * len(a)) // len(utts[i][0])]
                                  for a in utts[i]])
                    fed[i] = min(n + take, len(utts[i][0]))
                    nlev.append(len(utts[i]))
                    to.append(s)
            if to:
                lengths = np.array([len(a) for lv in batch for a in lv], np.uint32)
                codes = np.concatenate([a for lv in batch for a in lv]).astype(np.int32)
                assert not codecrt.push_many(to, np.array(nlev, np.uint32), lengths, codes)
            if tick == 3:  # an open mid-tick: the runtime ends the tick first
                ss.append(ctx.stream())
                ss[2].push(utts[2])
                ss[2].finish()
                fed[2] = len(utts[2][0])
            for i, s in enumerate(ss):
                if fed[i] == len(utts[i][0]) and not s.info.finished:
                    s.finish()
            n = codecrt.step_end(ctx)
            assert 0 <= n <= len(live)
            stepped += n
            for i, s in enumerate(ss):
                got[i].append(s.pull())
        assert stepped > 0 and all(s.done for s in ss)
        for g, w in zip(got, want):
            assert np.array_equal(np.concatenate(g), w)
        for s in ss:
            s.close()
