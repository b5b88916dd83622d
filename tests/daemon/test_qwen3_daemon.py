"""The Qwen3-TTS 12 Hz tokenizer through the daemon and the command line: ``codecd serve``
(in-process Server, real websockets on 127.0.0.1) streams the tiny random decoder
(``codecd.convert.random_qwen3``, numpy only); each stream sends its own number of
codebooks, fixed at ``start``. ``codecd decode`` and ``codecd stream`` of a 16-level ``.npz``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import codecrt_or_skip

pytest.importorskip("websockets")
from serverkit import (  # noqa: E402
    levels_streams,
    offline_s16,
    running,
    s16_worst,
    serve_process,
    wait_ready,
)


BINS = 64  # the tiny config's codebook size


@pytest.fixture(scope="module")
def qwen3_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from codecd.convert.random_qwen3 import write_random_qwen3

    codecrt_or_skip()
    return write_random_qwen3(tmp_path_factory.mktemp("qwen3_daemon") / "tiny.gguf", config="tiny", seed=2)


def test_twenty_streams(qwen3_gguf: Path) -> None:
    """20 concurrent streams (1 to 16 codebooks, 3 to 40 frames, JSON and binary frames in random
    pieces) come back as the offline decode of their codes, in s16; the hello lists the model."""
    import codecrt

    rng = np.random.default_rng(3)
    cases = []
    for i in range(20):
        k = int(rng.choice([16, 16, 1, int(rng.integers(1, 17))]))
        cases.append((f"s{i}", rng.integers(0, BINS, (k, int(rng.integers(3, 41)))).astype(np.int32)))
    with codecrt.Model(str(qwen3_gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        want = {sid: offline_s16(ctx, codes) for sid, codes in cases}

    async def main() -> tuple[dict[str, bytes], dict[str, Any]]:
        async with running(qwen3_gguf, max_batch=32) as srv:
            return await levels_streams(srv.port, cases, rng, bad_codebooks=17,
                                        bad_message="1 to 16")

    got, hello = asyncio.run(main())
    (model,) = [m for m in hello["models"] if m["name"] == "small"]
    assert model["arch"] == "qwen3" and model["n_levels"] == 16, model
    worst, differ = s16_worst(got, want)
    print(f"\nQwen3 via the daemon: 20 streams, {differ} s16 samples differ from offline, by at most {worst}")
    assert worst <= 1, worst  # f32 noise (<= 1e-5) across an s16 rounding boundary


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "codecd.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_decode_and_stream(qwen3_gguf: Path, tmp_path: Path) -> None:
    """``codecd decode`` of a 16-level ``.npz`` and ``codecd stream`` of it to ``codecd serve``:
    the same audio within one s16 step."""
    sf = pytest.importorskip("soundfile")
    rng = np.random.default_rng(0)
    codes = tmp_path / "codes.npz"
    np.savez(codes, **{f"level{i}": rng.integers(0, BINS, 25) for i in range(16)})

    r = _cli("decode", "--model", str(qwen3_gguf), str(codes), "-o", str(tmp_path / "d.wav"))
    assert r.returncode == 0, r.stderr
    offline, sr = sf.read(tmp_path / "d.wav", dtype="int16")
    assert sr == 24000 and len(offline) == 25 * 1920

    log = tmp_path / "serve.log"
    with serve_process(qwen3_gguf, log) as (p, port):
        asyncio.run(wait_ready(port, p, log))
        r = _cli("stream", "--url", f"ws://127.0.0.1:{port}", "--model", "small", str(codes),
                 "-o", str(tmp_path / "s.wav"), "--rate", "max")
        assert r.returncode == 0, r.stderr + log.read_text()
    streamed, _ = sf.read(tmp_path / "s.wav", dtype="int16")
    assert len(streamed) == len(offline)
    assert np.abs(streamed.astype(int) - offline).max() <= 1
