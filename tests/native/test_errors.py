"""Bad input raises a typed codecrt exception with a useful message; nothing aborts the process."""

from __future__ import annotations


import numpy as np
import pytest

import reference
from conftest import codecrt_or_skip


@pytest.fixture(scope="module")
def codecrt():
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def gguf24(snac_cases):
    return snac_cases("24khz").gguf


@pytest.fixture(scope="module")
def ctx(codecrt, gguf24):
    with codecrt.Model(gguf24) as m, codecrt.Context(m, device="cpu", max_frames=64, max_batch=4) as c:
        yield c


def good(ctx, n_frames=8):
    return reference.random_codes(ctx.model_info, n_frames, None, np.random.default_rng(0))


def test_code_out_of_range(codecrt, ctx):
    """A code >= codebook size raises CodeRangeError naming the level."""
    lv = good(ctx)
    lv[1][3] = 4096
    with pytest.raises(codecrt.CodeRangeError, match="level 1"):
        ctx.decode(lv)


def test_negative_code(codecrt, ctx):
    """A negative code raises CodeRangeError."""
    lv = good(ctx)
    lv[2][0] = -1
    with pytest.raises(codecrt.CodeRangeError, match="-1"):
        ctx.decode(lv)


def test_inconsistent_levels(codecrt, ctx):
    """Levels covering different frame counts raise CodeShapeError."""
    lv = good(ctx)
    lv[2] = lv[2][:-1]
    with pytest.raises(codecrt.CodeShapeError, match="inconsistent"):
        ctx.decode(lv)


def test_wrong_level_count(codecrt, ctx):
    """Two levels for a three-level model raise CodeShapeError."""
    with pytest.raises(codecrt.CodeShapeError, match="3"):
        ctx.decode(good(ctx)[:2])


def test_zero_frames(codecrt, ctx):
    """Empty levels raise CodeShapeError (zero frames)."""
    with pytest.raises(codecrt.CodeShapeError, match="zero frames"):
        ctx.decode([np.zeros(0, np.int32)] * 3)


def test_too_many_frames(codecrt, ctx):
    """More frames than the context's max_frames raise TooLargeError."""
    with pytest.raises(codecrt.TooLargeError, match="max_frames"):
        ctx.decode(good(ctx, 68))


def test_batch_too_large(codecrt, ctx):
    """A batch above max_batch raises TooLargeError."""
    lv = reference.random_codes(ctx.model_info, 4, 5, np.random.default_rng(1))
    with pytest.raises(codecrt.TooLargeError, match="max_batch"):
        ctx.decode(lv)


def test_wrong_dtype(codecrt, ctx):
    """Float codes raise CodeTypeError (also a TypeError)."""
    lv = [a.astype(np.float32) for a in good(ctx)]
    with pytest.raises(codecrt.CodeTypeError):
        ctx.decode(lv)
    with pytest.raises(TypeError):
        ctx.decode(lv)


def test_wrong_layout(codecrt, ctx):
    """Levels mixing 1-D and 2-D raise CodeShapeError; a 3-D level too."""
    lv = good(ctx)
    with pytest.raises(codecrt.CodeShapeError):
        ctx.decode([lv[0][None, :], lv[1], lv[2]])
    with pytest.raises(codecrt.CodeShapeError):
        ctx.decode([a[None, None, :] for a in lv])


def test_wide_ints_and_noncontiguous_accepted(codecrt, ctx):
    """int64 and strided integer levels decode like int32 contiguous ones."""
    lv = good(ctx)
    want = ctx.decode(lv)
    wide = [a.astype(np.int64) for a in lv]
    strided = [np.repeat(a, 2)[::2] for a in lv]
    assert np.array_equal(ctx.decode(wide), want)
    assert np.array_equal(ctx.decode(strided), want)


def test_output_buffer_too_small(codecrt, ctx):
    """An out buffer smaller than the decode raises BufferTooSmallError."""
    out = np.empty(100, np.float32)
    with pytest.raises(codecrt.BufferTooSmallError, match="100"):
        ctx.decode(good(ctx), out=out)


def test_errors_leave_context_usable(codecrt, ctx):
    """After every kind of rejected decode the context decodes correctly and built no extra graph."""
    lv = good(ctx)
    want = ctx.decode(lv)
    built = ctx.stats.graphs_built
    for bad in ([lv[0], lv[1], lv[2][:-1]], [lv[0] + 5000, lv[1], lv[2]]):
        with pytest.raises(codecrt.InputError):
            ctx.decode(bad)
    assert np.array_equal(ctx.decode(lv), want)
    assert ctx.stats.graphs_built == built


def test_missing_file(codecrt, tmp_path):
    """A missing model file raises ModelFileError, also an OSError."""
    with pytest.raises(codecrt.ModelFileError) as e:
        codecrt.Model(tmp_path / "nope.gguf")
    assert isinstance(e.value, OSError) and e.value.status_name == "CODECRT_E_IO"


def test_not_gguf(codecrt, tmp_path):
    """A text file raises NotGGUFError."""
    p = tmp_path / "x.gguf"
    p.write_text("hello")
    with pytest.raises(codecrt.NotGGUFError, match="not a GGUF"):
        codecrt.Model(p)


def test_truncated(codecrt, gguf24, tmp_path):
    """A file cut in its tensor data raises TruncatedModelError; cut in the header, CorruptModelError."""
    data = gguf24.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(codecrt.TruncatedModelError, match="truncated"):
        codecrt.Model(p)
    p.write_bytes(data[:100])
    with pytest.raises((codecrt.CorruptModelError, codecrt.TruncatedModelError)):
        codecrt.Model(p)


def test_corrupt_header(codecrt, gguf24, tmp_path):
    """Random bytes over the header never crash: each load fails with a ModelError or loads."""
    data = bytearray(gguf24.read_bytes()[:4096])
    rng = np.random.default_rng(9)
    p = tmp_path / "flip.gguf"
    for _ in range(40):
        d = bytearray(data)
        for i in rng.integers(4, len(d), 6):
            d[i] ^= int(rng.integers(1, 256))
        p.write_bytes(bytes(d))
        with pytest.raises(codecrt.ModelError):
            codecrt.Model(p)


def _rewrite(src, dst, *, arch=None, drop=None, reshape=None):
    """Copy a GGUF with the architecture renamed, one tensor dropped, or one tensor's shape changed."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch or "snac")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, [int(f.parts[i][0]) for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(f.name, f.parts[f.data[0]][0], vt)
    for t in r.tensors:
        if t.name == drop:
            continue
        a = np.array(t.data)
        if t.name == reshape:
            a = np.concatenate([a, a[..., :1]], axis=-1)
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_other_architecture(codecrt, gguf24, tmp_path):
    """A GGUF of another architecture raises UnknownArchitectureError naming it."""
    p = _rewrite(gguf24, tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(codecrt.UnknownArchitectureError, match="llama"):
        codecrt.Model(p)


def test_missing_tensor(codecrt, gguf24, tmp_path):
    """A model without one tensor raises MissingTensorError naming the tensor."""
    p = _rewrite(gguf24, tmp_path / "missing.gguf", drop="decoder.block.2.res.1.pw.weight")
    with pytest.raises(codecrt.MissingTensorError, match=r"decoder\.block\.2\.res\.1\.pw\.weight"):
        codecrt.Model(p)


def test_misshapen_tensor(codecrt, gguf24, tmp_path):
    """A tensor of the wrong shape raises TensorError with both shapes."""
    p = _rewrite(gguf24, tmp_path / "shape.gguf", reshape="decoder.in_pw.weight")
    with pytest.raises(codecrt.TensorError, match="expected"):
        codecrt.Model(p)


def test_unknown_device(codecrt, gguf24):
    """An unknown device name raises InputError; an absent GPU raises BackendError."""
    with codecrt.Model(gguf24) as m:
        with pytest.raises(codecrt.InputError, match="unknown device"):
            codecrt.Context(m, device="tpu")
        for name in ("cpu\x00x", "cpu\udcff", "cpu\n"):  # a NUL once cut the name to "cpu"
            with pytest.raises(codecrt.InputError, match="not a device name"):
                codecrt.Context(m, device=name)
        with pytest.raises(codecrt.BackendError, match="not available"):
            codecrt.Context(m, device="cuda:7")


@pytest.mark.parametrize("name, values", [
    ("CODECRT_OFFLINE_LAYOUT", ("time", "channels")),
    ("CODECRT_STREAM_GRAPHS", ("one", "split")),
    ("CODECRT_FUSED_UNIT", ("1", "0")),
    ("CODECRT_GRAPH_INPUTS", ("device", "host")),
    ("CODECRT_PRECISE_SIN", ("1", "0")),
])
def test_environment_switches(codecrt, gguf24, monkeypatch, name, values):
    """Each of the context's environment switches (read when a context is created) takes auto,
    empty or its two values, and refuses anything else with InputError naming itself and its
    choices, rather than falling back to a default that the caller did not ask for."""
    with codecrt.Model(gguf24) as m:
        for value in ("auto", "", *values):
            monkeypatch.setenv(name, value)
            with codecrt.Context(m, device="cpu", max_frames=16) as c:
                assert len(c.decode(good(c))) > 0
        monkeypatch.setenv(name, "yes")
        with pytest.raises(codecrt.InputError, match=f"{name} is 'yes': use auto, .*{values[0]}"):
            codecrt.Context(m, device="cpu")


def test_tensor_too_large_planned_before_ggml(codecrt, gguf24):
    """A decode whose one graph would pass 2^31 elements (ggml's CUDA kernels assert) is planned in
    pieces before ggml sees it: here the output capacity is checked, and refused, before any compute.
    (The shape guard's refusals, for what cannot be split, are in test_long_decode.)"""
    with codecrt.Model(gguf24) as m, codecrt.Context(m, device="cpu", max_frames=4096, max_batch=64) as c:
        lv = reference.random_codes(m.info, 4096, 64, np.random.default_rng(2))
        with pytest.raises(codecrt.BufferTooSmallError, match="decode needs"):
            c.decode(lv, out=np.empty(1, np.float32))
        assert c.stats.computes == 0


def test_samples_for_frames_never_wraps(codecrt, gguf24):
    """A frame count whose samples pass int64 is an InputError, not a wrapped negative count."""
    with codecrt.Model(gguf24) as m:
        hop = m.info.hop_length
        assert m.samples_for_frames(7) == 7 * hop
        assert m.samples_for_frames((2**63 - 1) // hop) == (2**63 - 1) // hop * hop
        for n in (2**63 - 1, 2**61, (2**63 - 1) // hop + 1, -1):
            with pytest.raises(codecrt.InputError):
                m.samples_for_frames(n)


def test_noise_arguments(codecrt):
    """codecrt.noise: each argument must fit its C field, at most 2**31 - 1 draws a call."""
    a = codecrt.noise(1, 2, 3, 5)
    assert a.shape == (5,) and np.array_equal(a, codecrt.noise(1, 2, 3, 5))
    assert codecrt.noise(2**64 - 1, 2**32 - 1, 2**64 - 1, 1).shape == (1,)
    for args in ((-1, 0, 0, 1), (2**64, 0, 0, 1), (0, -1, 0, 1), (0, 2**32, 0, 1),
                 (0, 0, -1, 1), (0, 0, 0, -5), (0, 0, 0, 10**13), (0, 0, 0, 2.5)):
        with pytest.raises(codecrt.InputError):
            codecrt.noise(*args)


def test_streams_of_another_type(codecrt, ctx):
    """Something that is not a stream, where a batch call takes streams: an InputError naming it
    (pull_many and push_many skip None entries: a packed batch's gaps)."""
    out = np.empty(8, np.float32)
    for x in (None, 1, object()):
        with pytest.raises(codecrt.InputError, match="not a codecrt"):
            ctx.step([x])
        with pytest.raises(codecrt.InputError, match="not a codecrt"):
            codecrt.step(ctx, [x])
    for x in (1, object()):
        with pytest.raises(codecrt.InputError, match="not a codecrt"):
            codecrt.pull_many([x], out)
