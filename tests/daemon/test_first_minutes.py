"""The first five minutes of a new user (issue 23): the demo model straight from the CLI, its
level, one s16 rounding rule offline and streamed, playback errors that name what to
install, the device named in the log, and what git ignores (``codecd doctor``: test_doctor)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, assert_stream_equals_offline, codecrt_or_skip

from codecd import cli
from codecd.config import DEMO_OUT_GAIN, build_demo_model
from codecd.demo import DEMO_GROUPS, demo_levels


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private XDG cache (the demo model is built into it once for the module)."""
    return tmp_path_factory.mktemp("xdg")


@pytest.fixture()
def xdg(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for k in [k for k in os.environ if k.startswith("CODECD_")]:
        monkeypatch.delenv(k)
    return cache


def _read_s16(p: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(p)) as w:
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2")


def test_demo_model_is_a_real_decode_near_minus_20_dbfs(tmp_path: Path) -> None:
    """The demo model decodes random codes at about -20 dBFS RMS, unsaturated, code-dependent, and says so."""
    codecrt = codecrt_or_skip()
    import gguf

    path = build_demo_model(tmp_path / "demo.gguf")
    r = gguf.GGUFReader(str(path))
    desc = bytes(r.fields["general.description"].parts[-1]).decode()
    assert "-20 dBFS" in desc and "random weights" in desc
    with codecrt.Model(str(path)) as m, codecrt.Context(m, device="cpu", n_threads=2) as ctx:
        a = ctx.decode(demo_levels(12, seed=1)).copy()
        b = ctx.decode(demo_levels(12, seed=2)).copy()
    for x in (a, b):
        dbfs = 20 * math.log10(float(np.sqrt(np.mean(x.astype(np.float64) ** 2))))
        assert -23.0 < dbfs < -17.0, dbfs
        assert float(np.abs(x).max()) < 0.9  # out of the tanh's saturation
    assert float(np.sqrt(np.mean((a - b) ** 2))) > 0.05  # the codes decide the audio
    assert DEMO_OUT_GAIN < 1.0


def test_one_s16_rounding_rule(tmp_path: Path) -> None:
    """decode's WAV writer and the wire round f32 to s16 by the same rule, where a float32 product would not."""
    from codecd.audio import f32_to_s16le

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1.2, 1.2, 200_000),
                        (np.arange(-40, 41) + 0.5) / 32767.0]).astype(np.float32)
    cli.write_wav(tmp_path / "a.wav", x, 24000)
    _, got = _read_s16(tmp_path / "a.wav")
    assert np.array_equal(got, np.frombuffer(f32_to_s16le(x), "<i2"))
    f32_rule = np.round(np.clip(x, -1, 1) * np.float32(32767)).astype(np.int16)  # the old writer
    in_range = np.abs(x) <= 1.0
    assert np.count_nonzero((f32_rule != got) & in_range) > 0  # 1 LSB apart: this test can fail


@pytest.mark.slow  # 21-33 s on the shared 2-core box: the full-size demo model, twice, and a daemon
def test_decode_and_stream_demo_bit_identical(xdg: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """decode/stream --model demo need no checkpoint, no CODES and no server; their s16 WAVs are bit-identical; the log names the device used."""
    codecrt_or_skip()
    off, st = tmp_path / "offline.wav", tmp_path / "streamed.wav"
    assert cli.main(["decode", "--model", "demo", "-o", str(off), "--threads", "2"]) == 0
    err = capsys.readouterr().err
    assert "noise at about -20 dBFS" in err and "decoding on CPU" in err
    with caplog.at_level("INFO"):
        assert cli.main(["stream", "--model", "demo", "-o", str(st), "--rate", "max"]) == 0
    assert "starting a daemon with the demo model" in capsys.readouterr().err
    ready = [r.getMessage() for r in caplog.records if "ready on" in r.getMessage()
             or r.getMessage().startswith("ready:")]
    assert any("CPU (asked: auto)" in m for m in ready), ready
    sr_o, a = _read_s16(off)
    sr_s, b = _read_s16(st)
    assert sr_o == sr_s == 24000 and a.size == DEMO_GROUPS * 2048
    assert_stream_equals_offline(b, a)


def test_commands_without_codes_need_the_demo_model(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Leaving out CODES or --url is a usage error (exit 2) for any model but demo."""
    m = tmp_path / "m.gguf"
    m.write_bytes(b"x")
    assert cli.main(["decode", "--model", str(m), "-o", str(tmp_path / "o.wav")]) == 2
    assert "only --model demo" in capsys.readouterr().err
    assert cli.main(["stream", "--model", "snac", "-o", str(tmp_path / "o.wav")]) == 2
    assert "only --model demo" in capsys.readouterr().err
    codes = tmp_path / "c.txt"
    codes.write_text(" ".join(["0"] * 7))
    assert cli.main(["stream", str(codes), "--model", "snac", "-o", str(tmp_path / "o.wav")]) == 2
    assert "--url is required" in capsys.readouterr().err


_NO_PORTAUDIO = """
import ctypes.util, sys
real = ctypes.util.find_library
ctypes.util.find_library = lambda n: None if "portaudio" in n else real(n)
from codecd import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_play_names_what_to_install(tmp_path: Path) -> None:
    """codecd play without PortAudio names the Debian package; with no output device it says so, before connecting."""
    pytest.importorskip("sounddevice")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["play", "--model", "demo", "--url", "ws://127.0.0.1:9"]
    # PortAudio hidden from ctypes' library search, as on a machine without libportaudio2
    p = subprocess.run([sys.executable, "-c", _NO_PORTAUDIO, *args], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "libportaudio2" in p.stderr and "Traceback" not in p.stderr, p.stderr
    import sounddevice as sd

    if any(d["max_output_channels"] > 0 for d in sd.query_devices()):
        pytest.skip("this machine has an output device")
    p = subprocess.run([sys.executable, "-m", "codecd.cli", *args], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "no audio output device" in p.stderr, p.stderr
    assert "docs/playback.md" in p.stderr and "Traceback" not in p.stderr


def test_git_ignores_venvs_builds_and_caches(tmp_path: Path) -> None:
    """A new user's venv/, build folders and tool caches never show up in git status."""
    paths = ["venv/bin/python", ".venv/bin/python", "env/bin/python", "build/x.o", "dist/a.whl",
             "a/__pycache__/m.pyc", ".pytest_cache/v", ".mypy_cache/x", ".ruff_cache/x",
             ".cache/codecd/demo.gguf", "test-artifacts/page.png", "x.egg-info/PKG-INFO"]
    p = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *paths],
                       capture_output=True, text=True)
    ignored = set(p.stdout.split())
    assert ignored == set(paths), set(paths) - ignored


def test_readme_quick_start_starts_with_a_venv_and_its_commands_exist() -> None:
    """The README's quick start makes a venv first, installs the play extra, and every codecd line in it parses."""
    import re
    import shlex
    import tomllib

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    lines = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines()]
    lines = [ln for ln in lines if ln]
    first_pip = next(i for i, ln in enumerate(lines) if "pip install" in ln)
    assert any("-m venv venv" in ln for ln in lines[:first_pip]), lines
    assert 'pip install ".[play]"' in lines[first_pip]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "sounddevice" in extras["play"]
    parser = cli.build_parser()
    cmds = [shlex.split(ln)[1:] for ln in lines if ln.startswith("codecd ")]
    assert len(cmds) >= 2
    for argv in cmds:
        parser.parse_args(argv)  # SystemExit (a failed test) on an unknown command or flag
