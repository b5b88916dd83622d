"""The one stream protocol (codecrt.CodecStream, codecrt.step): every kind of stream, stepped alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip
from smallmodel import small_codes, write_small_snac

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def codecrt() -> Any:
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def snac(codecrt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_small_snac(tmp_path_factory.mktemp("proto") / "small.gguf", seed=5)
    with codecrt.Model(path) as m, codecrt.Context(m, device="cpu", n_threads=1) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def flow(codecrt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from codecd.convert.random_s3gen import write_random_s3gen

    path = write_random_s3gen(tmp_path_factory.mktemp("proto") / "s3.gguf", seed=3)
    rng = np.random.default_rng(1)
    with codecrt.Model(path) as m, codecrt.Context(m, device="cpu", n_threads=1) as ctx, \
            codecrt.Voice(m, rng.integers(0, 6561, 4).astype(np.int32),
                          rng.normal(-4, 2, (8, 80)).astype(np.float32),
                          rng.normal(0, 1, 192).astype(np.float32)) as voice:
        yield ctx, voice
        Path(path).unlink()


def _drain(codecrt: Any, ctx: Any, streams: Sequence[Any]) -> list[np.ndarray]:
    """Step all streams together until every one is done; each one's pulled samples."""
    out: list[list[np.ndarray]] = [[] for _ in streams]
    while not all(s.stats.done for s in streams):
        tick = codecrt.step(ctx, streams)
        assert not tick.errors
        for o, s in zip(out, streams):
            o.append(s.pull())
        assert tick.stepped or all(s.stats.done for s in streams)
    return [np.concatenate(o) for o in out]


def test_every_stream_kind_is_a_codec_stream(codecrt, snac, flow):
    """Stream, LowLatencyStream and FlowStream all satisfy the CodecStream protocol."""
    ctx_f, voice = flow
    kinds = [snac.stream(), codecrt.LowLatencyStream(snac, lookahead=64),
             codecrt.FlowStream(ctx_f, voice, first_chunk=4, chunk=4)]
    try:
        for s in kinds:
            assert isinstance(s, codecrt.CodecStream), type(s).__name__
            st = s.stats
            assert (st.frames_pushed, st.total_samples, st.ready, st.done) == (0, -1, False, False)
    finally:
        for s in kinds:
            s.close()
    assert all(s.closed for s in kinds)


def test_exact_and_low_latency_streams_share_one_graph(codecrt, snac):
    """step() over an exact and a low-latency stream runs one graph for both; outputs as offline."""
    codes = small_codes(32, np.random.default_rng(2))
    exact, low = snac.stream(), codecrt.LowLatencyStream(snac, lookahead=8, crossfade=4)
    try:
        for s in (exact, low):
            s.push(codes)
            s.finish()
        first = codecrt.step(snac, [exact, low])
        assert (first.stepped, first.largest_batch, first.errors) == (2, 2, {})
        got_exact, got_low = _drain(codecrt, snac, [exact, low])
        total = exact.stats.total_samples
    finally:
        exact.close()
        low.close()
    want = snac.decode(codes)
    np.testing.assert_allclose(got_exact, want, rtol=0, atol=5e-4)
    assert got_low.size == want.size == total


class _Countdown:
    """A stream kind of the test's own, with its own stepper: each step counts one frame down
    and emits one sample; a stream pushed a negative count fails its own step."""

    calls: list[int] = []

    def __init__(self, frames: int) -> None:
        self.left, self.out, self.closed = frames, [], False

    @staticmethod
    def _step(ctx: Any, streams: Sequence[_Countdown]) -> Any:
        import codecrt

        _Countdown.calls.append(len(streams))
        errors = {i: codecrt.InputError("negative") for i, s in enumerate(streams) if s.left < 0}
        ready = [s for i, s in enumerate(streams) if i not in errors and s.left > 0]
        for s in ready:
            s.left -= 1
            s.out.append(1.0)
        return codecrt.Tick(len(ready), errors, len(ready))

    stepper = _step

    def push(self, levels: Sequence[Any], /) -> None:
        self.left += int(np.asarray(levels[0]).size)

    def finish(self) -> None:
        pass

    def pull(self) -> np.ndarray:
        out, self.out = np.asarray(self.out, np.float32), []
        return out

    @property
    def stats(self) -> Any:
        import codecrt

        return codecrt.StreamStats(0, 0, -1, True, self.left > 0, self.left == 0)

    def close(self) -> None:
        self.closed = True


def test_step_groups_a_mix_of_kinds_by_stepper(codecrt, snac):
    """A new kind of stream plugs in: step() calls each stepper once with its own streams and
    reports errors at their positions in the mix."""
    assert isinstance(_Countdown(0), codecrt.CodecStream)
    exact = snac.stream()
    try:
        exact.push(small_codes(8, np.random.default_rng(3)))
        mix = [_Countdown(2), exact, _Countdown(-1), _Countdown(1)]
        _Countdown.calls.clear()
        tick = codecrt.step(snac, mix)
        assert _Countdown.calls == [3]
        assert sorted(tick.errors) == [2] and isinstance(tick.errors[2], codecrt.InputError)
        assert tick.stepped == 3 and tick.largest_batch == 2
        assert mix[0].left == 1 and mix[3].left == 0
    finally:
        exact.close()
    assert codecrt.step(snac, []) == codecrt.Tick(0, {}, 0)


def test_flow_stream_takes_levels_and_closes(codecrt, flow):
    """FlowStream.push takes one level (as every stream does) or tokens; close() ends it."""
    ctx, voice = flow
    tokens = np.arange(7, dtype=np.int32)
    a = codecrt.FlowStream(ctx, voice, first_chunk=4, chunk=4, n_steps=1)
    b = codecrt.FlowStream(ctx, voice, first_chunk=4, chunk=4, n_steps=1)
    a.push(tokens)
    b.push([tokens[:3]])
    b.push([tokens[3:]])
    with pytest.raises(codecrt.InputError, match="one level"):
        b.push([tokens, tokens])
    assert a.stats == b.stats and a.stats.frames_pushed == 7 and a.stats.ready
    for s in (a, b):
        s.finish()
    pcm_a, pcm_b = _drain(codecrt, ctx, [a, b])
    np.testing.assert_array_equal(pcm_a, pcm_b)
    assert a.stats.done and a.stats.total_samples == pcm_a.size == 7 * 960
    c = codecrt.FlowStream(ctx, voice, first_chunk=4, chunk=4)
    c.push(tokens)
    c.close()
    c.close()
    assert c.closed and not c.stats.ready and c.pull().size == 0
    with pytest.raises(codecrt.StateError):
        c.push(tokens)
