"""Models served with BF16 products (``--model NAME:bf16=SOURCE``) on a real server.

Small random-weight models (codecd.convert.random_vocos and random_dac, through the real
converters). A BF16 model's streams must give, byte for byte in s16 and f32, what the same
decode gives offline through a BF16 ``codecrt.Context``: the windowed decode
(codecd.families.windowed.windowed_decode) for WavTokenizer, NeuCodec and XCodec2, the
offline decode for DAC; and not what an F32 context gives (proof the mode is on). A model
whose family has no BF16 products, or a context the runtime refuses BF16, fails the
start with the model, the device and the reason; bad values are configuration errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip, cpu_has_bf16
from serverkit import Client, metric_value, metrics, send_stream

pytest.importorskip("websockets")
pytest.importorskip("gguf")

from codecd.audio import f32_to_s16le  # noqa: E402
from codecd.config import Config, ConfigError, ModelSource, format_config, load_config  # noqa: E402
from codecd.convert.random_dac import CONFIGS, write_random_dac  # noqa: E402
from codecd.convert.random_vocos import write_random_vocos  # noqa: E402
from codecd.engine import EngineStartError, child_pythonpath  # noqa: E402
from codecd.families.windowed import DEFAULT_WINDOW, LOW_WINDOW, WindowParams, windowed_decode  # noqa: E402
from codecd.server import Server  # noqa: E402

#: name -> (random_vocos kind, codebook size, hop)
VOCOS = {"wt": ("wavtokenizer-75", 4096, 320), "neu": ("neucodec", 65536, 480),
         "xc": ("xcodec2", 65536, 320)}
DAC_NQ = CONFIGS["tiny"]["n_codebooks"]


def bf16_or_skip() -> None:
    if not cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16: a BF16 model is refused at start here")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    codecrt_or_skip()
    root = tmp_path_factory.mktemp("bf16")
    out = {name: write_random_vocos(kind, root / f"{name}.gguf", seed=7, small=True)
           for name, (kind, _, _) in VOCOS.items()}
    out["dac"] = write_random_dac("tiny", root / "dac.gguf", seed=7)
    return out


@contextlib.asynccontextmanager
async def serving(sources: list[ModelSource], **kw: Any) -> AsyncIterator[Server]:
    cfg = Config(listen="127.0.0.1:0", models=sources, devices=["cpu"], threads=2, max_ahead_s=0.0,
                 send_timeout_s=10.0, drain_timeout_s=2.0, **kw)
    assert not cfg.validate()
    srv = Server(cfg, {m.name: m.source for m in sources},
                 engine_overrides={"start_timeout_s": 120.0, "warm_buckets": (1,)})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def offline(path: Path, precision: str, levels: list[np.ndarray], window: WindowParams | None) -> np.ndarray:
    """The decode of ``levels`` through a CPU context of the model at ``path`` with ``precision``
    products: windowed by ``window`` (one level), or in one piece (None)."""
    import codecrt

    with codecrt.Model(str(path)) as m, \
            codecrt.Context(m, device="cpu", n_threads=2, precision=precision) as ctx:
        if window is None:
            return ctx.decode(levels)
        return windowed_decode(lambda c: ctx.decode([c]), levels[0], m.info.hop_length, window)


def as_bytes(pcm: np.ndarray, fmt: str) -> bytes:
    return f32_to_s16le(pcm) if fmt == "pcm_s16le" else pcm.astype("<f4").tobytes()


async def run_streams(port: int, plan: dict[str, tuple[str, list[np.ndarray], str, str]],
                      rng: np.random.Generator) -> dict[str, bytes]:
    """Every stream of ``plan`` (sid -> model, per-level codes, format, latency) on one
    connection at once, each one's codes in random pieces (JSON and binary frames); sid ->
    audio bytes."""
    c = await Client.open(port)
    for sid, (model, _, fmt, latency) in plan.items():
        await c.send({"type": "start", "stream_id": sid, "model": model, "layout": "levels",
                      "format": fmt, "latency": latency})
    await asyncio.gather(*(send_stream(c, sid, levels, "levels", rng, strides=(1,) * len(levels))
                           for sid, (_, levels, _, _) in plan.items()))
    out = {}
    for sid in plan:
        t = await c.terminal(sid, 240)
        assert t["type"] == "done", (sid, t)
        out[sid] = bytes(c.rec(sid)["audio"])
    await c.close()
    return out


def test_bf16_streams_equal_the_offline_bf16_decode(models: dict[str, Path]) -> None:
    """WavTokenizer, NeuCodec, XCodec2 and DAC served as NAME:bf16 beside an F32 entry of one of
    them: hello, the worker's stats and /metrics give each model's precision; concurrent streams (s16
    and f32, exact and low) equal the same decode offline through a BF16 context, byte for
    byte (the windowed decode for the windowed codecs), and differ from the F32 decode."""
    bf16_or_skip()
    rng = np.random.default_rng(21)
    plan: dict[str, tuple[str, list[np.ndarray], str, str]] = {}
    for name, (_, cb, _) in VOCOS.items():
        for i, (fmt, latency) in enumerate((("pcm_s16le", "exact"), ("pcm_f32le", "exact"),
                                             ("pcm_s16le", "low"))):
            n = int(rng.integers(40, 120))
            plan[f"{name}{i}"] = (name, [rng.integers(0, cb, n).astype(np.int32)], fmt, latency)
    for i, fmt in enumerate(("pcm_s16le", "pcm_f32le")):
        n = int(rng.integers(20, 50))
        plan[f"dac{i}"] = ("dac", [rng.integers(0, 1024, n).astype(np.int32) for _ in range(DAC_NQ)],
                           fmt, "exact")
    plan["f32"] = ("wt_f32", plan["wt0"][1], "pcm_s16le", "exact")
    sources = [ModelSource(n, str(p), "bf16") for n, p in models.items()]
    sources.append(ModelSource("wt_f32", str(models["wt"])))

    async def main() -> dict[str, bytes]:
        async with serving(sources) as srv:
            c = await Client.open(srv.port)
            precision = {m["name"]: m["precision"] for m in c.hello["models"]}
            await c.close()
            assert precision == {**{n: "bf16" for n in models}, "wt_f32": "f32"}
            got = await run_streams(srv.port, plan, rng)
            (w,) = (await srv.pool.fetch_stats())["workers"]
            assert {n: m["precision"] for n, m in w["worker"]["models"].items()} == precision
            m = await metrics(srv.port)
            for n, p in precision.items():
                assert metric_value(m, "codecd_model_precision", model=n, precision=p) == 1
                assert metric_value(m, "codecd_model_precision", model=n) == 1
            return got

    got = asyncio.run(main())
    for sid, (model, levels, fmt, latency) in plan.items():
        name = model.removesuffix("_f32")
        win = None if name == "dac" else LOW_WINDOW if latency == "low" else DEFAULT_WINDOW
        want = {p: as_bytes(offline(models[name], p, levels, win), fmt) for p in ("bf16", "f32")}
        mine = "f32" if model.endswith("_f32") else "bf16"
        other = "bf16" if mine == "f32" else "f32"
        assert len(got[sid]) == len(want[mine]), sid
        assert got[sid] == want[mine], (sid, model, fmt, latency)
        assert got[sid] != want[other], (sid, f"equals the {other} decode")


def serve_refused(sources: list[ModelSource], match: str) -> str:
    async def main() -> None:
        async with serving(sources):
            pass

    with pytest.raises(EngineStartError, match=match) as e:
        asyncio.run(main())
    return str(e.value)


def test_model_without_bf16_products_is_refused_at_start(small: Path) -> None:
    """A SNAC model asked for bf16 stops the start: the error names the model, its family, the
    device and the families that have BF16 products (no F32 served in its place)."""
    msg = serve_refused([ModelSource("orph", str(small), "bf16")], "precision bf16 refused")
    assert "model 'orph' (snac) on device cpu" in msg
    assert "the snac family has no bf16 products" in msg
    assert "dac" in msg and "neucodec" in msg


def test_runtime_refusal_names_model_device_and_reason(models: dict[str, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the runtime refuses BF16 (here: CODECRT_PORTABLE_OPS, which turns off the fused
    kernels; a CPU without AVX512-BF16 is refused the same way), the start fails with its
    reason, the model and the device."""
    monkeypatch.setenv("CODECRT_PORTABLE_OPS", "1")  # inherited by the worker process
    msg = serve_refused([ModelSource("neu", str(models["neu"]), "bf16")], "refused by the runtime")
    assert "model 'neu' (neucodec) on device cpu: precision bf16" in msg
    assert "CODECRT_PORTABLE_OPS" in msg


def test_serve_cli_refuses_bf16_for_the_demo_model(tmp_path: Path) -> None:
    """codecd serve --model demo:bf16=demo exits 1 with the reason on stderr, no traceback."""
    codecrt_or_skip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODECD_")}
    env["PYTHONPATH"] = child_pythonpath()
    r = subprocess.run([sys.executable, "-m", "codecd.cli", "serve", "--model", "demo:bf16=demo",
                        "--devices", "cpu", "--threads", "1", "--batch-buckets", "1",
                        "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "model 'demo' (snac) on device cpu: precision bf16 refused" in r.stderr
    assert "Traceback" not in r.stderr


def test_precision_settings_and_bad_values(tmp_path: Path, small: Path) -> None:
    """NAME:PRECISION=SOURCE in flags and CODECD_MODELS, precision in [[models]] (and in
    check-config's output); f32 by default; a bad value, a misspelt key and bf16 beside a
    non-CPU device are errors."""
    toml = tmp_path / "c.toml"
    toml.write_text(f'devices = ["cpu"]\n[[models]]\nname = "a"\nsource = "{small}"\nprecision = "BF16"\n'
                    f'[[models]]\nname = "b"\nsource = "{small}"\n')
    cfg = load_config(toml, env={})
    assert cfg.models == [ModelSource("a", str(small), "bf16"), ModelSource("b", str(small), "f32")]
    again = tmp_path / "again.toml"  # check-config's output reads back the same
    again.write_text(format_config(cfg))
    assert load_config(again, env={}).models == cfg.models
    cfg = load_config(None, env={"CODECD_MODELS": f"a:bf16={small},b={small}", "CODECD_DEVICES": "cpu"})
    assert [m.precision for m in cfg.models] == ["bf16", "f32"]
    cfg = load_config(None, env={}, args={"models": [f"a:f32={small}", "h:bf16=hf:org/name"],
                                          "devices": "cpu"})
    assert cfg.models[1] == ModelSource("h", "hf:org/name", "bf16")
    cfg = load_config(None, env={}, args={"models": [f"a:bf16x3={small}"], "devices": "cpu"})
    assert cfg.models[0].precision == "bf16x3"
    bad = {f"a:fp16={small}": "models: a: precision: one of f32, bf16, bf16x3, got 'fp16'",
           f"a:={small}": "NAME:PRECISION=SOURCE"}
    for model, match in bad.items():
        with pytest.raises(ConfigError, match=match):
            load_config(None, env={}, args={"models": [model], "devices": "cpu"})
    with pytest.raises(ConfigError, match="models: a: precision bf16 runs on CPU workers only"):
        load_config(None, env={}, args={"models": [f"a:bf16={small}"], "devices": "cpu,cuda:0"})
    toml.write_text(f'[[models]]\nname = "a"\nsource = "{small}"\nprecison = "bf16"\n')
    with pytest.raises(ConfigError, match=r"unknown keys \['precison'\]"):
        load_config(toml, env={})
