"""codecd doctor (codecd.doctor): what a bug report needs, each section on its own."""

from __future__ import annotations

import os

import pytest

from conftest import codecrt_or_skip

from codecd import cli, doctor


def test_doctor_prints_what_a_bug_report_needs(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """codecd doctor prints versions, the probed ggml devices, PortAudio and the config with secrets redacted."""
    codecrt_or_skip()
    monkeypatch.setenv("CODECD_MODELS", "d=demo")
    monkeypatch.setenv("CODECD_AUTH_TOKEN", "s3cret-token")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for want in ("== versions", "codecd 0.1.0", "codecrt ", "websockets ", "== devices",
                 "auto    -> CPU", "cuda    -> ", "== PortAudio", "== config in effect",
                 'source = "demo"'):
        assert want in out, want
    assert "s3cret-token" not in out


def test_doctor_sections_survive_each_others_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A section that raises is reported as failed; the other sections still print."""
    def broken() -> list[str]:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(doctor, "devices", broken)
    out = doctor.report()
    assert "failed: RuntimeError: probe exploded" in out
    assert "== versions" in out and "== PortAudio" in out and "== config in effect" in out


def test_doctor_shows_a_config_serve_would_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no model configured, doctor says serve would refuse, and still prints the settings."""
    for k in [k for k in os.environ if k.startswith("CODECD_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("CODECD_MAX_BATCH", "12")
    lines = doctor.config_in_effect()
    assert lines[0].startswith("invalid, codecd serve would refuse it: models: none configured")
    assert "max_batch = 12" in lines
