"""Codec families (codecd.families): the one table, what each family tells the daemon, and that
nothing outside the families branches on a model kind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codecd import protocol as P
from codecd.families import (
    FAMILIES,
    ModelSpec,
    StreamRefused,
    UnknownFamilyError,
    engine_options,
    family_for,
    find_family,
    layout_names,
    model_spec,
)

ROOT = Path(__file__).resolve().parents[2]

SNAC_INFO = {"arch": "snac", "sample_rate": 24000, "hop_length": 512, "n_levels": 3,
             "codebook_sizes": [4096] * 3, "level_strides": [4, 2, 1], "latency_samples": 4757,
             "voices": [], "precision": "f32"}


def _start(**kw):
    base = dict(stream_id="a", model="m", layout="levels", format="pcm_s16le")
    base.update(kw)
    return P.Start(**base)


def test_table_covers_protocol_layouts_and_converters():
    """Every wire layout is some family's, every architecture one family's, every family's
    converter is registered (and every converter has its family)."""
    from codecd.convert import ARCHITECTURES

    assert set(layout_names()) == set(P.LAYOUTS)
    claimed = [a for f in FAMILIES for a in f.architectures]
    assert len(claimed) == len(set(claimed))
    assert {f.converter for f in FAMILIES} == set(ARCHITECTURES)
    for f in FAMILIES:
        assert family_for(f.architectures[0]) is f and find_family(f.architectures[0]) is f


def test_unknown_architecture():
    """An architecture no family claims: an error for the worker, generic defaults for a spec."""
    assert find_family("nosuchcodec") is None
    with pytest.raises(UnknownFamilyError, match="nosuchcodec"):
        family_for("nosuchcodec")
    spec = model_spec("toy", dict(SNAC_INFO, arch="nosuchcodec", codebook_sizes=[1024] * 3))
    assert spec.layouts == ("levels",) and spec.low_latency_samples is None
    assert not spec.needs_voice
    with pytest.raises(UnknownFamilyError):
        family_for("nosuchcodec", generic=True).load("toy", None, None, "cpu")


def test_snac_spec_layouts_and_low_latency():
    """SNAC 24 kHz: the Orpheus layouts fit, a low mode below the exact latency is offered."""
    spec = model_spec("snac_24khz", SNAC_INFO)
    assert spec.layouts == ("orpheus_ids", "orpheus", "levels")
    assert spec.low_latency_samples is not None and spec.low_latency_samples < 4757
    assert spec.frame_rate == pytest.approx(24000 / 512)
    other = model_spec("snac_32khz", dict(SNAC_INFO, n_levels=4, codebook_sizes=[4096] * 4,
                                          level_strides=[8, 4, 2, 1]))
    assert other.layouts == ("levels",)


def test_plan_stream_grants_and_refuses():
    """plan_stream: low where offered (else exact), unknown voices and a missing voice refused."""
    snac = model_spec("snac_24khz", SNAC_INFO)
    fam = family_for("snac")
    low = fam.plan_stream(snac, _start(latency="low"))
    assert (low.latency, low.latency_samples) == ("low", snac.low_latency_samples)
    assert fam.plan_stream(snac, _start()).latency == "exact"
    with pytest.raises(StreamRefused) as ei:
        fam.plan_stream(snac, _start(voice="alice"))
    assert ei.value.code == "unknown_voice"
    s3 = ModelSpec("s3", "s3gen", 24000, 960, 1, (6561,), (1,), layouts=("levels", "chatterbox_ids"),
                   latency_samples=16320, voices=("alice",), needs_voice=True)
    fam = family_for("s3gen")
    plan = fam.plan_stream(s3, _start(voice="alice", latency="low"))
    assert (plan.latency, plan.latency_samples) == ("exact", 16320)
    with pytest.raises(StreamRefused, match="needs a voice"):
        fam.plan_stream(s3, _start())


def test_engine_options_come_from_the_config():
    """Each family's settings reach the engine configuration under its name."""
    from codecd.config import Config

    opts = engine_options(Config(flow_first_chunk=5, flow_chunk=9, flow_steps=3, flow_chunk_growth=2.0))
    assert opts == {"s3gen": {"first_chunk": 5, "chunk": 9, "chunk_growth": 2.0, "max_chunk": 0, "steps": 3,
                              "precision": "f32"}}


def test_flow_streams_get_the_growth_settings(monkeypatch):
    """FlowModel's streams are FlowStreams with the family's chunk_growth and max_chunk (0: None,
    FlowStream's default of 4 x chunk)."""
    from types import SimpleNamespace

    import codecrt
    from codecd.families.s3gen import FlowModel, FlowOptions

    made = []
    monkeypatch.setattr(codecrt, "FlowStream", lambda ctx, voice, **kw: made.append(kw) or kw)
    for opts, want in ((FlowOptions(), (1.0, None)), (FlowOptions(chunk_growth=2.0, max_chunk=80), (2.0, 80))):
        fm = FlowModel.__new__(FlowModel)  # no context: the stream constructor is the patched one
        fm.options, fm.voices, fm.ctx, fm.latency_samples = opts, {"v": object()}, None, 0
        kw, _ = fm.open_stream(SimpleNamespace(voice="v", seed=3))
        assert (kw["chunk_growth"], kw["max_chunk"], kw["chunk"], kw["seed"]) == (*want, opts.chunk, 3)


def test_growth_that_pacing_would_cut_is_logged(caplog):
    """With flow_chunk_growth > 1, a model says when max_ahead_s or output_budget_s hold the
    worker's codes to less than its largest chunk's audio (4 s for 100 tokens of S3Gen)."""
    import logging
    from types import SimpleNamespace

    from codecd.config import Config
    from codecd.families.s3gen import FlowModel, FlowOptions

    info = SimpleNamespace(hop_length=960, sample_rate=24000)

    def warned(opts: FlowOptions, **cfg) -> str:
        fm = FlowModel.__new__(FlowModel)
        fm.name, fm.options, fm.config = "s3", opts, Config(**cfg)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="codecd.families.s3gen"):
            fm._warn_if_growth_is_paced(info)
        return caplog.text

    grown = FlowOptions(chunk_growth=2.0)
    assert "max_ahead_s = 1 s and output_budget_s = 2.5 s" in warned(grown)  # the defaults
    assert warned(grown, max_ahead_s=0.0, output_budget_s=5.0) == ""
    assert warned(FlowOptions()) == ""  # no growth: nothing to cut


# The criterion, kept: a model-kind branch lives in a family or in the converter
# registry. The bindings mirror the C API's needs_voice field (codecrt_model_info).
_KIND = re.compile(r'needs_voice|"s3gen"|arch ==|voices is None')
_ALLOWED = ("daemon/codecd/families/", "daemon/codecd/convert/", "bindings/codecrt/_cdef.h",
            "bindings/codecrt/_model.py")


def test_no_model_kind_branches_outside_the_families():
    """grep for needs_voice, "s3gen", arch ==, voices is None finds them only where allowed."""
    hits = []
    for folder in ("daemon", "bindings"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".h") or not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(_ALLOWED):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _KIND.search(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_a_family_with_per_stream_levels_plugs_into_the_session(monkeypatch):
    """A codec whose streams pick their number of codebooks at start (Mimi-like): its family's
    plan sets the stream's levels and worker options; the session needs no change."""
    import json

    import numpy as np

    import codecd.families as F
    from codecd.families import Family, StreamPlan
    from codecd.actions import EngineOpen, EnginePush, SendText
    from codecd.session import Session

    class PerStream(Family):
        name = "perstream"
        architectures = ("perstream",)
        converter = ""

        def plan_stream(self, spec, start):  # the start's seed stands in for a codebook count
            return StreamPlan("exact", spec.latency_samples, n_levels=start.seed,
                              options={"n_codebooks": start.seed})

        def load(self, name, model, config, device):
            raise NotImplementedError

    monkeypatch.setitem(F._BY_ARCH, "perstream", PerStream())
    spec = ModelSpec("m", "perstream", 24000, 1920, 8, (2048,) * 8, (1,) * 8)
    s = Session({"m": spec})
    acts = s.receive_text(json.dumps({"type": "start", "stream_id": "a", "model": "m",
                                      "layout": "levels", "seed": 2}))
    assert isinstance(acts[0], EngineOpen) and acts[0].options == {"n_codebooks": 2}
    acts = s.receive_text(json.dumps({"type": "tokens", "stream_id": "a",
                                      "levels": [[1, 2], [3, 4]]}))
    (push,) = [a for a in acts if isinstance(a, EnginePush)]
    assert [a.tolist() for a in push.levels] == [[1, 2], [3, 4]]
    acts = s.receive_text(json.dumps({"type": "tokens", "stream_id": "a",
                                      "levels": [[1], [2], [3]]}))
    (err,) = [json.loads(a.data) for a in acts if isinstance(a, SendText)]
    assert err["code"] == "bad_message" and "model has 2 levels" in err["message"]
    assert np.asarray(push.levels[0]).dtype == np.int32


def test_window_is_refused_by_models_that_do_not_stream_by_windows():
    """start.window on a model whose family takes no window (SNAC here) is bad_window; a windowed
    family turns presets and frames into the stream's window, its lag and its chunk."""
    from codecd.families import StreamRefused, family_for
    from codecd.protocol import Start

    snac = ModelSpec("s", "snac", 24000, 512, 3, (4096,) * 3, (4, 2, 1))
    with pytest.raises(StreamRefused) as e:
        family_for("snac").plan_stream(snac, Start("a", "s", "levels", window={"preset": "low"}))
    assert e.value.code == "bad_window" and "does not stream by windows" in e.value.message
    neu = ModelSpec("n", "neucodec", 24000, 480, 1, (65536,), (1,), latency_samples=30 * 480,
                    low_latency_samples=12 * 480)
    plan = family_for("neucodec").plan_stream(neu, Start("a", "n", "levels", latency="low",
                                                         window={"lookahead": 4}))
    assert plan.options == {"chunk": 10, "lookback": 25, "lookahead": 4, "overlap": 1}
    assert plan.latency_samples == 14 * 480 and plan.chunk_frames == 10
    plan = family_for("neucodec").plan_stream(neu, Start("a", "n", "levels", window={"preset": "low"}))
    assert plan.options["chunk"] == 10 and plan.latency == "exact"


def _tiny_models(root: Path) -> dict[str, Path]:
    """family name -> a tiny random model of it (S3Gen's random model is full-size: its BF16
    is checked through the daemon in tests/daemon/test_s3gen_daemon.py)."""
    from smallmodel import write_small_snac

    from codecd.convert.random_dac import write_random_dac
    from codecd.convert.random_mimi import write_random_mimi
    from codecd.convert.random_qwen3 import write_random_qwen3
    from codecd.convert.random_vocos import write_random_vocos

    out = {"snac": write_small_snac(root / "snac.gguf"), "dac": write_random_dac("tiny", root / "dac.gguf"),
           "mimi": write_random_mimi(root / "mimi.gguf", config="tiny"),
           "qwen3": write_random_qwen3(root / "qwen3.gguf", config="tiny")}
    for kind in ("wavtokenizer-75", "neucodec", "xcodec2"):
        out[kind.split("-")[0]] = write_random_vocos(kind, root / f"{kind}.gguf", small=True)
    return out


def test_family_precisions_are_what_the_runtime_gives(tmp_path: Path) -> None:
    """A family lists bf16 exactly when the runtime makes BF16 contexts of its models (on a CPU
    with AVX512-BF16): the daemon's refusal at start and the runtime's agree."""
    from conftest import codecrt_or_skip, cpu_has_bf16

    codecrt = codecrt_or_skip()
    if not cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16: the runtime refuses BF16 for every model")
    paths = _tiny_models(tmp_path)
    assert set(paths) == {f.name for f in FAMILIES} - {"s3gen"}
    for name, path in paths.items():
        with codecrt.Model(str(path)) as m:
            fam = family_for(m.info.arch)
            assert fam.name == name
            try:
                codecrt.Context(m, device="cpu", precision="bf16").close()
                takes = True
            except codecrt.UnsupportedError:
                takes = False
        assert ("bf16" in fam.precisions) == takes, name


def test_precision_of_reads_the_model_entry_and_s3gen_flow_precision():
    """A model's precision comes from its entry (f32 when it has none) through the engine
    configuration; S3Gen's flow_precision = bf16 raises every S3Gen model to bf16."""
    from codecd.config import Config, ModelSource
    from codecd.server import engine_config

    models = [ModelSource("neu", "/m/neu.gguf", "bf16"), ModelSource("s3", "/m/s3.gguf"),
              ModelSource("snac", "/m/snac.gguf")]
    paths = {m.name: m.source for m in models}
    for flow, s3 in (("f32", "f32"), ("bf16", "bf16")):
        ec = engine_config(Config(models=models, devices=["cpu"], flow_precision=flow,
                                  voices_dir="/nonexistent"), paths)
        assert ec.precisions == {"neu": "bf16", "s3": "f32", "snac": "f32"}
        assert family_for("neucodec").precision_of("neu", ec) == "bf16"
        assert family_for("s3gen").precision_of("s3", ec) == s3
        assert family_for("snac").precision_of("snac", ec) == "f32"
        assert family_for("snac").precision_of("unlisted", ec) == "f32"
    ec = engine_config(Config(models=[ModelSource("s3", "/m/s3.gguf", "bf16")], devices=["cpu"],
                              voices_dir="/nonexistent"), {"s3": "/m/s3.gguf"})
    assert family_for("s3gen").precision_of("s3", ec) == "bf16"
