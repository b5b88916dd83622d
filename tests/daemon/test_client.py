"""codecd.client and ``codecd stream``: against an in-process protocol server (the real
Session state machine with a synthetic engine) and, when ``codecd.server`` exists,
against the real ``codecd serve`` (with the tiny random SNAC model)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from codecd.client import Client, ServerError
from codecd.engine import child_pythonpath
from fakeserver import BASE, HOP, FakeServer, orpheus_ids  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake():
    srv = FakeServer()
    yield srv
    srv.stop()


# --------------------------------------------------------------- client tests


async def _utterance(c: Client, ids: np.ndarray, *, model: str = "fake", binary: bool = False,
                     fmt: str = "pcm_s16le", chunk: int = 7):
    s = await c.start(model, layout="orpheus_ids", format=fmt)

    async def feed() -> None:
        for i in range(0, ids.size, chunk):
            await s.send_tokens(ids[i:i + chunk], binary=binary)
            await asyncio.sleep(0)
        await s.end()

    task = asyncio.create_task(feed())
    chunks = [ch async for ch in s]
    await task
    return s, chunks


def _check_contiguous(chunks) -> int:
    off = 0
    for i, ch in enumerate(chunks):
        assert ch.seq == i
        assert ch.sample_offset == off
        off += len(ch)
    return off


def test_hello_and_one_stream(fake):
    async def main():
        async with Client(fake.url) as c:
            assert c.hello["version"] == 1
            assert "fake" in c.models
            s, chunks = await _utterance(c, orpheus_ids(5))
            assert s.started is not None and s.sample_rate == 24000
            assert all(ch.pcm.dtype == np.dtype("<i2") for ch in chunks)
            n = _check_contiguous(chunks)
            assert n == 5 * 2048 == s.done_info["samples"]
            assert not c.open_streams
    asyncio.run(main())


def test_binary_tokens_and_f32(fake):
    async def main():
        async with Client(fake.url) as c:
            s, chunks = await _utterance(c, orpheus_ids(3), binary=True, fmt="pcm_f32le",
                                         chunk=5)
            assert all(ch.pcm.dtype == np.dtype("<f4") for ch in chunks)
            assert _check_contiguous(chunks) == 3 * 2048
            pcm = np.concatenate([ch.pcm for ch in chunks])
            assert np.abs(pcm).max() <= 0.26 and np.abs(pcm).max() > 0.2
    asyncio.run(main())


def test_multiplexed_streams(fake):
    async def main():
        async with Client(fake.url) as c:
            res = await asyncio.gather(*(_utterance(c, orpheus_ids(2 + i, seed=i), chunk=3)
                                         for i in range(5)))
            for i, (s, chunks) in enumerate(res):
                assert _check_contiguous(chunks) == (2 + i) * 2048 == s.done_info["samples"]
            ids = {s.stream_id for s, _ in res}
            assert len(ids) == 5
    asyncio.run(main())


def test_stream_error_raises_in_iterator(fake):
    async def main():
        async with Client(fake.url) as c:
            s = await c.start("fake", layout="orpheus_ids")
            good = await c.start("fake", layout="orpheus_ids")
            await s.send_tokens([5, 6, 7])  # not Orpheus ids: token_range
            with pytest.raises(ServerError) as ei:
                async for _ in s:
                    pass
            assert ei.value.code == "token_range" and ei.value.stream_id == s.stream_id
            # the connection and the other stream are fine
            await good.send_tokens(orpheus_ids(1))
            await good.end()
            assert (await good.read_all()).size == 2048
    asyncio.run(main())


def test_refused_start_and_cancel(fake):
    async def main():
        async with Client(fake.url) as c:
            with pytest.raises(ServerError) as ei:
                await c.start("nope", layout="orpheus_ids")
            assert ei.value.code == "unknown_model"
            s = await c.start("fake", layout="orpheus_ids")
            await s.send_tokens(orpheus_ids(2))
            first = await s.__anext__()
            assert first.sample_offset == 0
            await s.cancel()
            rest = [ch async for ch in s]
            assert s.cancelled and s.done_info is None
            assert all(ch.seq > 0 for ch in rest)
    asyncio.run(main())


def test_busy_refusal(fake):
    async def main():
        async with Client(fake.url) as c:
            open_ = [await c.start("fake", layout="orpheus") for _ in range(fake.max_streams)]
            with pytest.raises(ServerError) as ei:
                await c.start("fake", layout="orpheus")
            assert ei.value.code in ("busy", "too_many_streams")
            for s in open_:
                await s.cancel()
                async for _ in s:
                    pass
    asyncio.run(main())


def test_connection_lost_fails_open_streams(fake):
    async def main():
        c = Client(fake.url)
        await c.connect()
        s = await c.start("fake", layout="orpheus_ids")
        await c._ws.send("{not json")  # fatal: bad_json closes the connection
        with pytest.raises(ServerError) as ei:
            async for _ in s:
                pass
        assert ei.value.code in ("bad_json", "connection_closed")
        await c.close()
    asyncio.run(main())


def _run_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = child_pythonpath()
    return subprocess.run([sys.executable, "-m", "codecd.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("fmt,rate", [("pcm_s16le", "max"), ("pcm_f32le", "realtime")])
def test_cli_stream(fake, tmp_path, fmt, rate):
    codes = tmp_path / "ids.txt"
    ids = orpheus_ids(4)
    codes.write_text(" ".join(map(str, ids)))
    out = tmp_path / "out.wav"
    r = _run_cli(["stream", "--url", fake.url, "--model", "fake", str(codes), "-o", str(out),
                  "--format", fmt, "--rate", rate, "--chunk-tokens", "7"])
    assert r.returncode == 0, r.stderr
    assert "time to first audio" in r.stdout
    if fmt == "pcm_s16le":
        with wave.open(str(out)) as w:
            assert w.getnframes() == 4 * 2048 and w.getframerate() == 24000
    else:
        assert out.stat().st_size > 4 * 2048 * 4


def test_cli_stream_levels_npz(fake, tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "codes.npz"
    np.savez(p, level0=rng.integers(0, 4096, 3), level1=rng.integers(0, 4096, 6),
             level2=rng.integers(0, 4096, 12))
    out = tmp_path / "out.wav"
    r = _run_cli(["stream", "--url", fake.url, "--model", "fake", str(p), "-o", str(out),
                  "--rate", "max", "--binary"])
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        assert w.getnframes() == 12 * HOP


def test_cli_stream_unreachable(tmp_path):
    codes = tmp_path / "ids.txt"
    codes.write_text(" ".join(map(str, orpheus_ids(1))))
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    r = _run_cli(["stream", "--url", f"ws://127.0.0.1:{port}", "--model", "x", str(codes),
                  "-o", str(tmp_path / "o.wav")])
    assert r.returncode == 1 and "codecd: error:" in r.stderr


# --------------------------------------------------------------- real server


def _real_server_or_skip():
    if importlib.util.find_spec("codecd.server") is None:
        pytest.skip("codecd.server does not exist yet (the server is being written)")
    from codecd import cli

    if "serve" not in cli.build_parser()._subparsers._group_actions[0].choices:
        pytest.skip("codecd serve is not wired into the CLI yet")


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    _real_server_or_skip()
    from conftest import codecrt_or_skip
    from smallmodel import write_small_snac

    codecrt_or_skip()
    d = tmp_path_factory.mktemp("serve")
    gguf = write_small_snac(d / "small.gguf")
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = child_pythonpath()
    proc = subprocess.Popen([sys.executable, "-m", "codecd.cli", "serve", "--listen",
                             f"127.0.0.1:{port}", "--model", f"small={gguf}", "--devices", "cpu",
                             "--threads", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"ws://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"codecd serve exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status != 200:
                    raise OSError(r.status)
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.skip("codecd serve did not listen within 60 s")
    yield url, gguf
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_real_server_matches_offline(real_server):
    url, gguf = real_server
    import codecrt
    from conftest import load_layouts

    L = load_layouts()
    ids = orpheus_ids(6, seed=3)

    async def main():
        async with Client(url) as c:
            assert "small" in c.models
            res = await asyncio.gather(*(_utterance(c, ids, model="small", fmt="pcm_f32le",
                                                    chunk=c_) for c_ in (7, 3)))
            return res

    res = asyncio.run(main())
    m = codecrt.Model(str(gguf))
    ctx = codecrt.Context(m, device="cpu", n_threads=1)
    ref = ctx.decode(L.orpheus_to_levels(L.orpheus_ids_to_codes(ids)))
    ctx.close()
    m.close()
    for s, chunks in res:
        n = _check_contiguous(chunks)
        assert n == s.done_info["samples"] == ref.size
        pcm = np.concatenate([ch.pcm for ch in chunks])
        np.testing.assert_allclose(pcm, ref, atol=1e-4)
