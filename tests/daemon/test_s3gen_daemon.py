"""S3Gen through the daemon: voices, layouts, errors, on a real server on 127.0.0.1.

The model is a random-weight S3Gen (codecd.convert.random_s3gen: no reference
package needed); its audio is noise, so the checks compare the daemon's
stream with codecrt.FlowStream run directly on the same voice, seed and
chunking, which must be identical.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip, cpu_has_bf16
from serverkit import Client

pytest.importorskip("websockets")
pytest.importorskip("gguf")

from codecd.config import Config, ModelSource  # noqa: E402
from codecd.convert.random_s3gen import write_random_s3gen  # noqa: E402
from codecd.server import Server  # noqa: E402
from codecd.families.voices import VoiceData, write_voice  # noqa: E402

FIRST, CHUNK = 4, 6
STEPS = 2  # fewer flow steps than the model's 10: shorter tests, and the setting reaches the worker


def _voice_arrays(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(prompt_tokens=rng.integers(0, 6561, n).astype(np.int32),
                prompt_mel=rng.normal(-4, 2, (2 * n, 80)).astype(np.float32),
                speaker=rng.normal(0, 1, 192).astype(np.float32))


@pytest.fixture(scope="module")
def s3env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    codecrt_or_skip()
    root = tmp_path_factory.mktemp("s3daemon")
    model = write_random_s3gen(root / "s3.gguf", seed=3)
    voices = root / "voices"
    voices.mkdir()
    arrays = {"alice": _voice_arrays(1, 6), "bob": _voice_arrays(2, 4)}
    for name, a in arrays.items():
        write_voice(VoiceData(name, **a), voices / f"{name}.voice.gguf")
    (voices / "broken.voice.gguf").write_bytes(b"GGUF not really")
    return {"model": model, "voices": voices, "arrays": arrays}


@contextlib.asynccontextmanager
async def serving(env: dict[str, Any], precision: str = "f32") -> AsyncIterator[Server]:
    cfg = Config(listen="127.0.0.1:0", models=[ModelSource("s3", str(env["model"]))], devices=["cpu"],
                 threads=2, max_ahead_s=0.0, send_timeout_s=5.0, drain_timeout_s=2.0,
                 voices_dir=str(env["voices"]), flow_first_chunk=FIRST, flow_chunk=CHUNK,
                 flow_steps=STEPS, flow_precision=precision)
    assert not cfg.validate()
    srv = Server(cfg, {"s3": str(env["model"])}, engine_overrides={"start_timeout_s": 120.0})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def direct(env: dict[str, Any], voice: str, tokens: np.ndarray, seed: int, precision: str = "f32") -> np.ndarray:
    import codecrt

    with codecrt.Model(env["model"]) as m, \
            codecrt.Context(m, device="cpu", n_threads=2, precision=precision) as ctx, \
            codecrt.Voice(m, **env["arrays"][voice]) as v:
        fs = codecrt.FlowStream(ctx, v, seed=seed, first_chunk=FIRST, chunk=CHUNK, n_steps=STEPS)
        fs.push(tokens)
        fs.finish()
        return fs.decode_all()


def start(sid: str, layout: str = "levels", **kw: Any) -> dict[str, Any]:
    return {"type": "start", "stream_id": sid, "model": "s3", "layout": layout, "format": "pcm_f32le",
            **kw}


def test_voices_layouts_and_errors(s3env: dict[str, Any]) -> None:
    rng = np.random.default_rng(4)
    t1 = rng.integers(0, 6561, 17).astype(np.int32)
    t2 = rng.integers(0, 6561, 11).astype(np.int32)

    async def main() -> None:
        async with serving(s3env) as srv:
            c = await Client.open(srv.port)
            (spec,) = [m for m in c.hello["models"] if m["name"] == "s3"]
            assert spec["voices"] == ["alice", "bob"]  # the broken file is skipped
            assert set(spec["layouts"]) == {"levels", "chatterbox_ids"}
            # plain payload ids, in pieces
            await c.send(start("a", voice="alice", seed=5))
            for i in range(0, t1.size, 5):
                await c.send({"type": "tokens", "stream_id": "a", "levels": [t1[i:i + 5].tolist()]})
            await c.send({"type": "end", "stream_id": "a"})
            # LM ids: start-of-speech dropped, stop-of-speech ends the stream (no `end`)
            ids = [6561, *t2.tolist(), 6562]
            await c.send(start("b", layout="chatterbox_ids", voice="bob", seed=6))
            await c.send({"type": "tokens", "stream_id": "b", "tokens": ids[:4]})
            await c.send({"type": "tokens", "stream_id": "b", "tokens": ids[4:]})
            # refusals while those two run
            await c.send(start("nv"))
            await c.send(start("uv", voice="carol"))
            await c.send(start("bad", layout="chatterbox_ids", voice="alice"))
            await c.send({"type": "tokens", "stream_id": "bad", "tokens": [6561, 1, 7000]})
            await c.send(start("orph", layout="orpheus_ids", voice="alice"))
            for sid, code in (("nv", "unknown_voice"), ("uv", "unknown_voice"), ("bad", "token_range"),
                              ("orph", "bad_layout")):
                t = await c.terminal(sid, 30)
                assert t["type"] == "error" and t["code"] == code, t
            ta = await c.terminal("a", 120)
            tb = await c.terminal("b", 120)
            assert ta["type"] == "done" and tb["type"] == "done", (ta, tb)
            got_a = np.frombuffer(bytes(c.rec("a")["audio"]), "<f4")
            got_b = np.frombuffer(bytes(c.rec("b")["audio"]), "<f4")
            assert c.ws.close_code is None
            await c.close()
            (w,) = (await srv.pool.fetch_stats())["workers"]
            ws = w["worker"]["models"]["s3"]
            assert ws["batched"] is True and 1 <= ws["max_batch_seen"] <= 2
            assert ws["streams_done"] == 2 and ws["streams_open"] == 0
        want_a = direct(s3env, "alice", t1, 5)
        want_b = direct(s3env, "bob", t2, 6)
        assert got_a.size == t1.size * 960 and got_b.size == t2.size * 960
        np.testing.assert_allclose(got_a, want_a, atol=1e-6, rtol=0)
        np.testing.assert_allclose(got_b, want_b, atol=1e-6, rtol=0)

    asyncio.run(main())


def test_bf16_precision_reaches_the_worker(s3env: dict[str, Any]) -> None:
    """flow_precision = bf16: hello says so, and the stream equals a BF16 FlowStream run directly."""
    if not cpu_has_bf16():
        pytest.skip("this CPU has no AVX512-BF16")
    t = np.random.default_rng(9).integers(0, 6561, 13).astype(np.int32)

    async def main() -> np.ndarray:
        async with serving(s3env, precision="bf16") as srv:
            c = await Client.open(srv.port)
            (spec,) = [m for m in c.hello["models"] if m["name"] == "s3"]
            assert spec["precision"] == "bf16"
            await c.send(start("a", voice="alice", seed=2))
            await c.send({"type": "tokens", "stream_id": "a", "levels": [t.tolist()]})
            await c.send({"type": "end", "stream_id": "a"})
            assert (await c.terminal("a", 120))["type"] == "done"
            got = np.frombuffer(bytes(c.rec("a")["audio"]), "<f4")
            await c.close()
            return got

    got = asyncio.run(main())
    want, f32 = direct(s3env, "alice", t, 2, "bf16"), direct(s3env, "alice", t, 2)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    assert not np.allclose(got, f32, atol=1e-5, rtol=0)  # BF16 really ran


def test_model_spec_of_s3gen_info():
    """The session's spec of an S3Gen model: levels and chatterbox_ids, its voices, a voice required."""
    from codecd.families import model_spec

    info = {"arch": "s3gen", "sample_rate": 24000, "hop_length": 960, "codebook_sizes": [6561],
            "level_strides": [1], "latency_samples": 16320, "needs_voice": True,
            "voices": ["alice", "bob"], "chunk_frames": 25}
    spec = model_spec("s3", info)
    assert spec.layouts == ("levels", "chatterbox_ids") and spec.voices == ("alice", "bob")
    assert spec.needs_voice and spec.low_latency_samples is None and spec.latency_samples == 16320


def test_config_flow_settings(tmp_path: Path) -> None:
    """voices_dir and the flow settings come from TOML and env, and bad values are reported."""
    from codecd.config import ConfigError, load_config

    toml = tmp_path / "c.toml"
    toml.write_text('voices_dir = "/v"\nflow_first_chunk = 5\nflow_steps = 3\n'
                    '[[models]]\nname = "s3"\nsource = "demo"\n')
    cfg = load_config(str(toml), env={"CODECD_FLOW_CHUNK": "30"}, args={"flow_steps": 4})
    assert (cfg.voices_dir, cfg.flow_first_chunk, cfg.flow_chunk, cfg.flow_steps) == ("/v", 5, 30, 4)
    assert cfg.flow_precision == "f32" and (cfg.flow_chunk_growth, cfg.flow_max_chunk) == (1.0, 0)
    grown = load_config(str(toml), env={"CODECD_FLOW_CHUNK_GROWTH": "2", "CODECD_FLOW_MAX_CHUNK": "100"})
    assert (grown.flow_chunk_growth, grown.flow_max_chunk) == (2.0, 100)
    bf16 = load_config(str(toml), env={"CODECD_FLOW_PRECISION": "BF16", "CODECD_DEVICES": "cpu"})
    assert (bf16.flow_precision, bf16.devices) == ("bf16", ["cpu"])
    for env in ({"CODECD_FLOW_STEPS": "101"}, {"CODECD_FLOW_CHUNK": "0"}, {"CODECD_FLOW_PRECISION": "fp16"},
                {"CODECD_FLOW_CHUNK_GROWTH": "0.5"}, {"CODECD_FLOW_MAX_CHUNK": "24"},
                {"CODECD_FLOW_PRECISION": "bf16"}, {"CODECD_FLOW_PRECISION": "bf16", "CODECD_DEVICES": "cpu,cuda:0"}):
        with pytest.raises(ConfigError, match="flow_"):
            load_config(str(toml), env=env)
