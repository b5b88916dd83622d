"""Mimi from the command line: ``codecd decode`` of a Moshi-style ``.npz`` (8 of Mimi's 32
codebooks) and ``codecd stream`` of the same file to a ``codecd serve`` process, which sends
``start.codebooks`` = 8 for it. The tiny random Mimi (``codecd.convert.random_mimi``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import codecrt_or_skip

sf = pytest.importorskip("soundfile")
pytest.importorskip("websockets")
from serverkit import serve_process, wait_ready  # noqa: E402


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "codecd.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_decode_and_stream_eight_codebooks(tmp_path: Path) -> None:
    from codecd.convert.random_mimi import write_random_mimi

    codecrt_or_skip()
    gguf = Path(write_random_mimi(tmp_path / "mimi.gguf", config="tiny", seed=1))
    rng = np.random.default_rng(0)
    codes = tmp_path / "codes.npz"
    np.savez(codes, **{f"level{i}": rng.integers(0, 64, 25) for i in range(8)})

    r = _cli("decode", "--model", str(gguf), str(codes), "-o", str(tmp_path / "d.wav"))
    assert r.returncode == 0, r.stderr
    offline, sr = sf.read(tmp_path / "d.wav", dtype="int16")
    assert sr == 24000 and len(offline) == 25 * 1920

    log = tmp_path / "serve.log"
    with serve_process(gguf, log) as (p, port):
        asyncio.run(wait_ready(port, p, log))
        r = _cli("stream", "--url", f"ws://127.0.0.1:{port}", "--model", "small", str(codes),
                 "-o", str(tmp_path / "s.wav"), "--rate", "max")
        assert r.returncode == 0, r.stderr + log.read_text()
    streamed, _ = sf.read(tmp_path / "s.wav", dtype="int16")
    # the exact stream equals the offline decode up to f32 noise: at most one s16 step
    assert len(streamed) == len(offline)
    assert np.abs(streamed.astype(int) - offline).max() <= 1
