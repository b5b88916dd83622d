"""The graph lifecycle manager through codecrt: reuse, fresh allocations, free orders, flat memory."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip, rss_kib


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def model24(codecrt, snac_cases):
    case = snac_cases("24khz")
    with codecrt.Model(case.gguf) as m:
        yield m


@pytest.fixture(scope="module")
def tiny(codecrt, snac_cases):
    """The 24 kHz layout with 64 decoder channels: the loops below run thousands of decodes
    (through one-thread contexts: on graphs this small a second thread only adds a wake-up per
    node)."""
    case = snac_cases("tiny")
    with codecrt.Model(case.gguf) as m:
        yield m


def test_two_decodes_identical_and_not_silent(codecrt, model24):
    """The seed's check: two decodes through one context give identical, non-silent audio."""
    rng = np.random.default_rng(1)
    levels = reference.random_codes(model24.info, 32, None, rng)
    with codecrt.Context(model24, device="cpu") as ctx:
        a = ctx.decode(levels)
        b = ctx.decode(levels)
        st = ctx.stats
    assert np.array_equal(a, b)
    assert float(np.sqrt(np.mean(a**2))) > 0.01
    assert (st.graphs_built, st.graphs_reused) == (1, 1)


@pytest.mark.slow
def test_interleaved_decodes_equal_fresh_contexts(codecrt, tiny):
    """500 interleaved decodes of mixed lengths and batch sizes each equal the same decode on a fresh context."""
    rng = np.random.default_rng(2)
    shapes = [(4, 1), (8, 2), (12, 1), (4, 3), (16, 1), (8, 1)]
    cases = [reference.random_codes(tiny.info, f, b, rng) for f, b in shapes]
    expected = []
    for levels in cases:
        with codecrt.Context(tiny, device="cpu", max_batch=4, n_threads=1) as fresh:
            expected.append(fresh.decode(levels))
    with codecrt.Context(tiny, device="cpu", max_batch=4, n_threads=1) as ctx:
        for i in range(500):
            k = ((i // 2) * 5) % len(cases)  # each shape twice in a row, then another
            got = ctx.decode(cases[k])
            assert np.array_equal(got, expected[k]), f"decode {i} (case {k}) differs"
        st = ctx.stats
    assert st.graphs_built + st.graphs_reused == 500
    assert st.graphs_reused > 0 and st.sched_resets >= st.graphs_built


def test_recreate_policy(codecrt, model24):
    """With the recreate policy each release frees and recreates the scheduler; results are unchanged."""
    rng = np.random.default_rng(3)
    a = reference.random_codes(model24.info, 8, None, rng)
    b = reference.random_codes(model24.info, 12, None, rng)
    with codecrt.Context(model24, device="cpu") as plain:
        want_a, want_b = plain.decode(a), plain.decode(b)
    with codecrt.Context(model24, device="cpu") as ctx:
        ctx.set_recreate_policy("decode", True)
        for _ in range(5):
            assert np.array_equal(ctx.decode(a), want_a)
            assert np.array_equal(ctx.decode(b), want_b)
        st = ctx.stats
    assert st.sched_recreations == 9  # every release but the last (at close)
    assert st.reservations == st.sched_recreations + 1


@pytest.mark.parametrize("ops", ["cpu", "portable-fused"])
def test_buckets_do_not_change_samples(codecrt, model24, ops, monkeypatch):
    """Frame and batch buckets share graphs across shapes and never change the valid samples: with
    the CPU's ops, and with the ops that a CUDA device runs (their C functions here), where the
    transposed convs' tail op applies each bucket's mask (ops/ops_upconv.c)."""
    if ops == "portable-fused":
        monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")
        monkeypatch.setenv("CODECRT_FUSED_UNIT", "1")
    rng = np.random.default_rng(4)
    cases = [reference.random_codes(model24.info, f, b, rng) for f, b in [(4, 1), (12, 3), (8, 2)]]
    with codecrt.Context(model24, device="cpu") as exact, \
         codecrt.Context(model24, device="cpu", frame_bucket=16, batch_bucket=True) as bucketed:
        for levels in cases:
            np.testing.assert_allclose(bucketed.decode(levels), exact.decode(levels), atol=2e-6)
        st = bucketed.stats
    assert st.graphs_built <= 3


def test_many_contexts_and_free_orders(codecrt, snac_cases):
    """Many contexts share one model; model and contexts can be closed in any order."""
    case = snac_cases("24khz")
    rng = np.random.default_rng(5)
    m = codecrt.Model(case.gguf)
    levels = reference.random_codes(m.info, 8, None, rng)
    ctxs = [codecrt.Context(m, device="cpu", n_threads=1) for _ in range(6)]
    m.close()  # the contexts keep the weights alive
    outs = [c.decode(levels) for c in ctxs]
    for c in ctxs[::2]:
        c.close()
    outs += [c.decode(levels) for c in ctxs[1::2]]
    for c in ctxs:
        c.close()
        c.close()  # idempotent
    assert all(np.array_equal(o, outs[0]) for o in outs)
    with pytest.raises(codecrt.StateError):
        ctxs[0].decode(levels)


@pytest.mark.slow
def test_resident_memory_flat(codecrt, tiny):
    """Resident memory stays flat over 2,000 decodes through one context (bound: 8 MiB after warm-up)."""
    rng = np.random.default_rng(6)
    cases = [reference.random_codes(tiny.info, f, b, rng) for f, b in [(4, 1), (8, 1), (4, 2)]]
    with codecrt.Context(tiny, device="cpu", n_threads=1) as ctx:
        for levels in cases * 10:
            ctx.decode(levels)
        gc.collect()
        before = rss_kib()
        for i in range(2000):
            ctx.decode(cases[i % 3])
        gc.collect()
        after = rss_kib()
        st = ctx.stats
    growth = after - before
    print(f"\nRSS before {before} KiB, after 2000 decodes {after} KiB, growth {growth} KiB; "
          f"compute buffer {st.compute_buffer_bytes[0]} bytes")
    assert growth < 8 * 1024
    assert st.reservations <= 3


def _tick_threads(codecrt, model, n_streams, n_threads):
    """Threads of a steady 4-frame tick of n_streams streams, and the tick's audio."""
    rng = np.random.default_rng(3)
    levels = reference.random_codes(model.info, 16, None, rng)
    out = []
    with codecrt.Context(model, device="cpu", n_threads=n_threads, stream_chunk_frames=4) as ctx:
        streams = [ctx.stream() for _ in range(n_streams)]
        threads = []
        for f in range(0, 16, 4):
            for s in streams:
                s.push([lv[f // st:(f + 4) // st] for lv, st in zip(levels, model.info.level_strides)])
            ctx.step(streams)
            threads.append(ctx.stats.last_threads)
            out.append(np.concatenate([s.pull() for s in streams]))
        for s in streams:
            s.close()
    return threads[-1], np.concatenate(out)


def test_threads_per_graph(codecrt, model24, monkeypatch):
    """A graph gets the threads its work per node pays for (threads.c): a one-stream tick runs
    on one thread of a two-thread context, a tick of four streams and an offline decode on
    both; CODECRT_THREAD_WORK=0 gives every graph all threads; the samples do not depend on it."""
    one, audio_one = _tick_threads(codecrt, model24, 1, 2)
    four, _ = _tick_threads(codecrt, model24, 4, 2)
    assert (one, four) == (1, 2)
    assert _tick_threads(codecrt, model24, 4, 1)[0] == 1
    with codecrt.Context(model24, device="cpu", n_threads=2) as ctx:
        assert ctx.stats.last_threads == 0  # nothing computed yet
        ctx.decode(reference.random_codes(model24.info, 64, None, np.random.default_rng(4)))
        assert ctx.stats.last_threads == 2
    monkeypatch.setenv("CODECRT_THREAD_WORK", "0")
    forced, audio_forced = _tick_threads(codecrt, model24, 1, 2)
    assert forced == 2
    assert np.array_equal(audio_one, audio_forced)
