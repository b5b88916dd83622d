"""DAC through the daemon: a real server on 127.0.0.1, real websockets clients, a tiny DAC.

The model is a random DAC in the released layout (weight_g / weight_v, the tiny config of
tests/references/dac.py: strides 8, 5, 4, 2, 4 codebooks) written with numpy alone and
converted by codecd.convert; the daemon's streams must give the offline decode's samples,
bit for bit in s16, for the ``dac_frames`` layout and per-level codes, 10 streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import assert_stream_equals_offline, codecrt_or_skip
from serverkit import Client, expected

pytest.importorskip("websockets")
pytest.importorskip("gguf")

from codecd.config import Config, ModelSource  # noqa: E402
from codecd.convert.random_dac import CONFIGS, write_random_dac  # noqa: E402
from codecd.families.dac import levels_to_frames, parse_outetts_text  # noqa: E402
from codecd.families.layout import LayoutRangeError, LayoutShapeError  # noqa: E402
from codecd.protocol import encode_token_frame  # noqa: E402
from codecd.server import Server  # noqa: E402

KWARGS = CONFIGS["tiny"]
NQ = KWARGS["n_codebooks"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    codecrt_or_skip()
    path = tmp_path_factory.mktemp("dacdaemon") / "dac.gguf"
    return write_random_dac("tiny", path, seed=7)


@pytest.fixture(scope="module")
def offline(tiny: Path) -> Any:
    import codecrt

    model = codecrt.Model(tiny)
    ctx = codecrt.Context(model, device="cpu", n_threads=1)
    yield lambda levels: ctx.decode(levels).copy()
    ctx.close()
    model.close()


@contextlib.asynccontextmanager
async def serving(tiny: Path) -> AsyncIterator[Server]:
    cfg = Config(listen="127.0.0.1:0", models=[ModelSource("dac", str(tiny))], devices=["cpu"],
                 threads=1, max_ahead_s=0.0, max_batch=16, max_streams=16, send_timeout_s=5.0,
                 drain_timeout_s=2.0, gather_ms=5.0)
    assert not cfg.validate()
    srv = Server(cfg, {"dac": str(tiny)}, engine_overrides={"start_timeout_s": 60.0, "warm_buckets": (1,)})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def start(sid: str, layout: str, fmt: str = "pcm_s16le") -> dict[str, Any]:
    return {"type": "start", "stream_id": sid, "model": "dac", "layout": layout, "format": fmt}


async def send_codes(c: Client, sid: str, levels: list[np.ndarray], layout: str, rng: np.random.Generator) -> None:
    """The codes in random pieces (frames split anywhere in dac_frames), JSON and binary frames mixed."""
    if layout == "dac_frames":
        toks = levels_to_frames(levels)
        cuts = sorted({0, toks.size, *map(int, rng.integers(0, toks.size, 5))})
        for a, b in zip(cuts, cuts[1:]):
            if rng.random() < 0.5:
                await c.send({"type": "tokens", "stream_id": sid, "tokens": toks[a:b].tolist()})
            else:
                await c.send(encode_token_frame(sid, toks[a:b]))
    else:
        n = len(levels[0])
        cuts = sorted({0, n, *map(int, rng.integers(0, n, 3))})
        for a, b in zip(cuts, cuts[1:]):
            await c.send({"type": "tokens", "stream_id": sid, "levels": [lv[a:b].tolist() for lv in levels]})
    await c.send({"type": "end", "stream_id": sid})


def test_ten_streams_bit_identical_to_offline(tiny: Path, offline: Any) -> None:
    """10 concurrent streams (dac_frames and levels, s16 and f32): each one's audio is the
    offline decode's, bit for bit."""
    async def main() -> None:
        async with serving(tiny) as srv:
            c = await Client.open(srv.port)
            (spec,) = [m for m in c.hello["models"] if m["name"] == "dac"]
            assert spec["arch"] == "dac" and spec["n_levels"] == NQ
            assert spec["layouts"] == ["dac_frames", "levels"]
            rng = np.random.default_rng(1)
            jobs = []
            for i in range(10):
                layout = "dac_frames" if i % 2 == 0 else "levels"
                fmt = "pcm_f32le" if i % 3 == 0 else "pcm_s16le"
                n = int(rng.integers(1, 60))
                levels = [rng.integers(0, 1024, n).astype(np.int32) for _ in range(NQ)]
                await c.send(start(f"s{i}", layout, fmt))
                jobs.append((f"s{i}", levels, layout, fmt))
            await asyncio.gather(*(send_codes(c, sid, lv, lay, rng) for sid, lv, lay, _ in jobs))
            for sid, levels, _, fmt in jobs:
                t = await c.terminal(sid, 60)
                assert t["type"] == "done", t
                got = bytes(c.rec(sid)["audio"])
                want = expected(offline, levels, fmt, 24000)
                assert len(got) == len(want) == len(levels[0]) * 320 * (2 if fmt == "pcm_s16le" else 4)
                dt = "<i2" if fmt == "pcm_s16le" else "<f4"
                assert_stream_equals_offline(np.frombuffer(got, dt), np.frombuffer(want, dt), sid)
            await c.close()
    asyncio.run(main())


def test_bad_codes_and_broken_frames(tiny: Path) -> None:
    """A code outside the codebook (OuteTTS' <|c1_1024|>) is token_range; an end in the middle
    of a frame is broken_group; another stream on the connection is untouched."""
    async def main() -> None:
        async with serving(tiny) as srv:
            c = await Client.open(srv.port)
            await c.send(start("ok", "dac_frames"))
            await c.send(start("range", "dac_frames"))
            await c.send(start("broken", "dac_frames"))
            await c.send({"type": "tokens", "stream_id": "range", "tokens": [1, 2, 3, 4, 5, 1024]})
            await c.send({"type": "tokens", "stream_id": "broken", "tokens": [1, 2, 3, 4, 5, 6]})
            await c.send({"type": "end", "stream_id": "broken"})
            await c.send({"type": "tokens", "stream_id": "ok", "tokens": list(range(4 * 12))})
            await c.send({"type": "end", "stream_id": "ok"})
            t = await c.terminal("range", 30)
            assert t["type"] == "error" and t["code"] == "token_range", t
            t = await c.terminal("broken", 30)
            assert t["type"] == "error" and t["code"] == "broken_group", t
            t = await c.terminal("ok", 30)
            assert t["type"] == "done" and len(c.rec("ok")["audio"]) == 12 * 320 * 2, t
            await c.close()
    asyncio.run(main())


def test_outetts_text() -> None:
    """OuteTTS 1.0's printed audio tokens: c1 and c2 in order (word markers and features
    skipped), cut to the shorter list as outetts does; <|c1_1024|> is refused."""
    text = ("<|audio_start|>\n<|word_start|>hi<|features|><|t_0.27|><|energy_3|><|code|>"
            "<|c1_5|><|c2_1023|><|c1_0|><|c2_7|><|word_end|>\n<|word_start|>x<|code|><|c1_9|><|audio_end|>")
    c1, c2 = parse_outetts_text(text)
    assert c1.tolist() == [5, 0] and c2.tolist() == [1023, 7]
    assert levels_to_frames([c1, c2]).tolist() == [5, 1023, 0, 7]
    with pytest.raises(LayoutRangeError, match="c2_1024"):
        parse_outetts_text("<|c1_1|><|c2_1024|>")
    with pytest.raises(LayoutShapeError):
        parse_outetts_text("<|c1_1|>")
