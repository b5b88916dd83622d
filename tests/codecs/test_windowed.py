"""Windowed streaming of the non-causal decoders (codecd.families.windowed).

* the definition is NeuTTS' streaming loop (replayed by tests/references/neucodec.py's
  ``neutts_stream`` with ``upstream_final=False``) on the same window decoder;
* a WindowedStream equals windowed_decode bit for bit, however its codes arrive and
  however many streams share a batch; batched window decodes equal single ones;
* an utterance shorter than chunk + lookahead streams to exactly the offline decode;
* with the PyTorch references (when installed): our windowed decode equals NeuTTS'
  loop run on the reference decoder (f32 relative L2 <= 1e-4).

Small random-weight models (codecd.convert.random_vocos) unless said otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip

pytest.importorskip("gguf")

from codecd.convert.random_vocos import write_random_vocos  # noqa: E402
from codecd.families.windowed import (  # noqa: E402
    DEFAULT_WINDOW,
    LOW_WINDOW,
    WindowedStream,
    WindowParams,
    windowed_decode,
)
from references.neucodec import neutts_stream  # noqa: E402  (numpy only)

KINDS = {"wavtokenizer-75": 4096, "neucodec": 65536, "xcodec2": 65536}
ODD = WindowParams(chunk=8, lookback=5, lookahead=3, overlap=1)


@pytest.fixture(scope="module")
def ctxs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    codecrt = codecrt_or_skip()
    root = tmp_path_factory.mktemp("windowed")
    out = {}
    for kind in KINDS:
        m = codecrt.Model(str(write_random_vocos(kind, root / f"{kind}.gguf", seed=3, small=True)))
        out[kind] = codecrt.Context(m, device="cpu", n_threads=2, max_batch=8)
    yield out
    for ctx in out.values():
        ctx.close()


def _codes(kind: str, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, KINDS[kind], n).astype(np.int32)


def _decoder(ctx: Any):
    return lambda c: ctx.decode([np.asarray(c, dtype=np.int32)])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("params", [DEFAULT_WINDOW, LOW_WINDOW, ODD], ids=["neutts", "low", "odd"])
def test_definition_is_the_neutts_loop(ctxs, kind, params):
    """windowed_decode == NeuTTS' loop (codes one at a time, final piece at its frame) on the same
    window decoder, up to NeuTTS' w*x/w rounding, for lengths around every piece boundary."""
    ctx = ctxs[kind]
    hop = ctx.model_info.hop_length
    c, a = params.chunk, params.lookahead
    for n in sorted({1, c + a - 1, c + a, c + a + 1, 2 * c + a, 3 * c + a + 7}):
        codes = _codes(kind, n, n)
        ours = windowed_decode(_decoder(ctx), codes, hop, params)
        theirs = np.concatenate(list(neutts_stream(
            _decoder(ctx), codes, hop, chunk=c, lookback=params.lookback, lookforward=a,
            overlap=params.overlap, upstream_final=False)))
        assert ours.shape == (n * hop,) == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=4e-7 * float(np.abs(theirs).max()),
                                   err_msg=f"{kind} n={n}")


def _drain(codecrt: Any, ctx: Any, streams: list[WindowedStream]) -> int:
    largest = 0
    while True:
        tick = codecrt.step(ctx, streams)
        assert not tick.errors
        largest = max(largest, tick.largest_batch)
        if not tick.stepped:
            return largest


@pytest.mark.parametrize("kind", list(KINDS))
def test_streams_equal_the_windowed_decode_bitwise(ctxs, kind):
    """Streams of various lengths and windows, codes pushed in random pieces and stepped
    together (windows batched across streams): bit-identical to windowed_decode."""
    import codecrt

    ctx = ctxs[kind]
    hop = ctx.model_info.hop_length
    rng = np.random.default_rng(1)
    params = [DEFAULT_WINDOW, DEFAULT_WINDOW, DEFAULT_WINDOW, LOW_WINDOW, LOW_WINDOW, ODD,
              DEFAULT_WINDOW, WindowParams(chunk=4, lookback=0, lookahead=0, overlap=0)]
    utts = [_codes(kind, int(n), i) for i, n in enumerate(rng.integers(0, 120, len(params)))]
    utts[0] = _codes(kind, 110, 99)  # two streams in step: their windows share batches
    utts[1] = _codes(kind, 110, 98)
    streams = [WindowedStream(ctx, p) for p in params]
    pos = [0] * len(streams)
    out: list[list[np.ndarray]] = [[] for _ in streams]
    largest = 0
    while any(p < u.size for p, u in zip(pos, utts)):
        for i, (s, u) in enumerate(zip(streams, utts)):
            if pos[i] < u.size:
                b = pos[i] + int(rng.integers(1, 30)) if i > 1 else pos[i] + 10
                s.push([u[pos[i]:b]])
                pos[i] = min(b, u.size)
                if pos[i] == u.size:
                    s.finish()
        largest = max(largest, _drain(codecrt, ctx, streams))
        for i, s in enumerate(streams):
            out[i].append(s.pull())
    for s in streams:
        if not s.stats.finished:
            s.finish()
    _drain(codecrt, ctx, streams)
    for i, (s, u, p) in enumerate(zip(streams, utts, params)):
        out[i].append(s.pull())
        st = s.stats
        assert st.done and st.total_samples == u.size * hop and st.frames_decoded == u.size
        got = np.concatenate(out[i])
        want = windowed_decode(_decoder(ctx), u, hop, p)
        assert got.shape == want.shape and np.array_equal(got, want), (i, p, u.size)
        s.close()
    assert largest >= 2


def test_batched_windows_equal_single_decodes(ctxs):
    """The runtime's batched decode equals its one-sequence decode bit for bit (what lets
    step_windows batch windows of many streams without changing any stream's output)."""
    for kind, ctx in ctxs.items():
        codes = np.stack([_codes(kind, DEFAULT_WINDOW.steady_frames, s) for s in range(5)])
        batch = ctx.decode([codes])
        for i in range(5):
            assert np.array_equal(batch[i], ctx.decode([codes[i]])), kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_short_utterance_streams_to_the_offline_decode(ctxs, kind):
    """Fewer than chunk + lookahead frames: one window, the whole utterance; the stream's
    output is the offline decode, exactly."""
    import codecrt

    ctx = ctxs[kind]
    n = DEFAULT_WINDOW.latency_frames - 1
    codes = _codes(kind, n, 5)
    s = WindowedStream(ctx)
    s.push([codes[:10]])
    assert not s.stats.ready and not codecrt.step(ctx, [s]).stepped  # waiting for more codes
    s.push([codes[10:]])
    assert not s.stats.ready
    s.finish()
    assert s.stats.ready
    _drain(codecrt, ctx, [s])
    assert np.array_equal(s.pull(), ctx.decode([codes]))
    assert s.stats.done


def test_latency_first_audio_after_chunk_plus_lookahead(ctxs):
    """No audio before chunk + lookahead codes; then chunk frames final per piece."""
    import codecrt

    ctx = ctxs["neucodec"]
    hop = ctx.model_info.hop_length
    p = DEFAULT_WINDOW
    s = WindowedStream(ctx, p)
    codes = _codes("neucodec", 200, 2)
    s.push([codes[:p.latency_frames - 1]])
    _drain(codecrt, ctx, [s])
    assert s.pull().size == 0
    s.push([codes[p.latency_frames - 1:p.latency_frames]])
    _drain(codecrt, ctx, [s])
    assert s.pull().size == p.chunk * hop and s.stats.frames_decoded == p.chunk
    assert s.latency_samples == p.latency_frames * hop
    s.close()


def test_stream_errors(ctxs):
    """Bad codes, shapes and order are typed errors; a closed stream is never ready."""
    import codecrt

    ctx = ctxs["wavtokenizer-75"]
    s = WindowedStream(ctx)
    with pytest.raises(codecrt.CodeRangeError, match="4096"):
        s.push([np.array([1, 4096])])
    with pytest.raises(codecrt.CodeRangeError):
        s.push([np.array([-1])])
    with pytest.raises(codecrt.CodeShapeError):
        s.push([np.array([1]), np.array([2])])
    with pytest.raises(codecrt.CodeShapeError):
        s.push([np.zeros((2, 2), dtype=np.int32)])
    with pytest.raises(codecrt.CodeTypeError):
        s.push([np.array([1.5])])
    assert s.stats.frames_pushed == 0  # nothing of a failed push was taken
    s.push([np.array([1, 2, 3])])
    s.finish()
    with pytest.raises(codecrt.StateError):
        s.push([np.array([1])])
    s.close()
    assert s.closed and not s.stats.ready and s.pull().size == 0
    with pytest.raises(codecrt.InputError):
        codecrt.step(ctx, [s, s])
    with pytest.raises(ValueError):
        WindowParams(chunk=0)
    with pytest.raises(ValueError):
        WindowParams(lookahead=1, overlap=1)  # 2 overlap frames need 2 frames of lookahead


def test_empty_stream_is_done_at_finish(ctxs):
    import codecrt

    ctx = ctxs["xcodec2"]
    s = WindowedStream(ctx)
    s.finish()
    assert s.stats.done and s.stats.total_samples == 0
    assert not codecrt.step(ctx, [s]).stepped
    assert windowed_decode(_decoder(ctx), np.zeros(0, np.int32), 320).size == 0


# ------------------------------------------------------------- against the PyTorch references


def _ref_case(arch: str, root: Path) -> tuple[Any, Any, Path]:
    """(reference module, seeded tiny reference model, our converted GGUF)."""
    import importlib.util
    import json

    from codecd.convert import convert

    pytest.importorskip("torch")
    package = "outetts" if arch == "wavtokenizer" else arch
    if importlib.util.find_spec(package) is None:  # imported the way the references do
        pytest.skip(f"{package} (reference) is not installed")
    if arch == "wavtokenizer":
        import references.wavtokenizer as ref

        model = ref.build_reference(ref.CONFIGS["tiny"], 4)
        ref.save_released_layout(model, ref.CONFIGS["tiny"], root / arch, layout="outetts")
        return ref, model, convert(root / arch, root / f"{arch}.gguf", progress=False)
    mod = __import__(f"references.{arch}", fromlist=["x"])
    cfg = mod.CONFIGS["tiny"]
    model = mod.build_reference(cfg, 4)
    mod.save_released_layout(model, root / arch)
    over = {"heads": cfg["heads"]}
    if arch == "xcodec2":
        over = {**json.loads((root / arch / "config.json").read_text()), **over}
    return mod, model, convert(root / arch, root / f"{arch}.gguf", config=over, progress=False)


@pytest.mark.parametrize("arch", ["wavtokenizer", "neucodec", "xcodec2"])
def test_parity_with_neutts_loop_on_the_reference(arch, tmp_path, record_property):
    """Our windowed decode of the converted model == NeuTTS' loop run on the PyTorch reference
    decoder (``reference_windowed_decode(..., upstream_final=False)``): f32 rel L2 <= 1e-4."""
    codecrt = codecrt_or_skip()
    ref, model, gguf = _ref_case(arch, tmp_path)
    rng = np.random.default_rng(6)
    with codecrt.Model(str(gguf)) as m, codecrt.Context(m, device="cpu", n_threads=2) as ctx:
        codes = rng.integers(0, m.info.codebook_sizes[0], 97).astype(np.int32)
        ours = windowed_decode(_decoder(ctx), codes, m.info.hop_length)
    theirs = ref.reference_windowed_decode(model, codes, upstream_final=False)
    rel = float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))
    record_property("rel_l2", rel)
    assert ours.shape == theirs.shape and rel <= 1e-4, rel


def test_long_stream_keeps_only_the_codes_windows_need(ctxs):
    """Codes older than the next window's start are dropped: a stream's memory stays bounded."""
    import codecrt

    ctx = ctxs["xcodec2"]
    p = DEFAULT_WINDOW
    s = WindowedStream(ctx, p)
    codes = _codes("xcodec2", 400, 8)
    for i in range(0, 400, 20):
        s.push([codes[i:i + 20]])
        _drain(codecrt, ctx, [s])
        assert s._pc.codes.size <= p.steady_frames + 20
    s.finish()
    _drain(codecrt, ctx, [s])
    assert s.stats.done and s.stats.frames_pushed == 400


def test_families_spec_layouts_and_windows():
    """The three families: their layouts fit their models, "low" is offered below the exact
    latency, and a start's plan carries the window to the worker."""
    from codecd import protocol as P
    from codecd.families import family_for, model_spec

    def info(arch: str, hop: int, sr: int, cb: int) -> dict[str, Any]:
        return {"arch": arch, "sample_rate": sr, "hop_length": hop, "n_levels": 1,
                "codebook_sizes": [cb], "level_strides": [1],
                "latency_samples": DEFAULT_WINDOW.latency_frames * hop}

    cases = {"wavtokenizer": (320, 24000, 4096, ("outetts_wavtokenizer", "levels")),
             "neucodec": (480, 24000, 65536, ("neutts", "levels")),
             "xcodec2": (320, 16000, 65536, ("llasa_ids", "llasa", "levels"))}
    for arch, (hop, sr, cb, layouts) in cases.items():
        spec = model_spec("m", info(arch, hop, sr, cb))
        assert spec.layouts == layouts and not spec.needs_voice
        assert spec.low_latency_samples == LOW_WINDOW.latency_frames * hop < spec.latency_samples
        fam = family_for(arch)
        start = P.Start(stream_id="a", model="m", layout="levels", format="pcm_s16le",
                        latency="low")
        plan = fam.plan_stream(spec, start)
        assert plan.latency == "low" and plan.latency_samples == spec.low_latency_samples
        assert WindowParams.of(plan.options) == LOW_WINDOW
    # a 40 tokens/s WavTokenizer takes OuteTTS' layout too (4096 codes); a 1024-code model not
    assert model_spec("m", info("wavtokenizer", 600, 24000, 4096)).layouts[0] == "outetts_wavtokenizer"
    assert model_spec("m", info("wavtokenizer", 320, 24000, 1024)).layouts == ("levels",)


@pytest.mark.parametrize("n_prefix", [3, 40, 120])
def test_prefix_is_left_context_as_in_neutts(ctxs, n_prefix):
    """NeuTTS' voice prompt codes lead the stream as left context and are never output: the
    windowed decode with a prefix equals NeuTTS' loop with n_prefix, and a stream opened with
    the prefix yields it bit for bit."""
    import codecrt

    ctx = ctxs["neucodec"]
    hop = ctx.model_info.hop_length
    codes = _codes("neucodec", n_prefix + 83, n_prefix)
    ours = windowed_decode(_decoder(ctx), codes, hop, DEFAULT_WINDOW, n_prefix=n_prefix)
    theirs = np.concatenate(list(neutts_stream(_decoder(ctx), codes, hop, n_prefix=n_prefix,
                                               upstream_final=False)))
    assert ours.shape == theirs.shape == (83 * hop,)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=4e-7 * float(np.abs(theirs).max()))
    s = WindowedStream(ctx, prefix=codes[:n_prefix])
    for i in range(n_prefix, codes.size, 7):
        s.push([codes[i:i + 7]])
        _drain(codecrt, ctx, [s])
    s.finish()
    _drain(codecrt, ctx, [s])
    st = s.stats
    assert st.done and st.frames_pushed == 83 and st.total_samples == 83 * hop
    assert np.array_equal(s.pull(), ours)
