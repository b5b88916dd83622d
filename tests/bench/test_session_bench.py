"""``python -m bench session``: every step runs on the real session, layout and ring code."""

from __future__ import annotations


def test_session_bench_times_every_step() -> None:
    from bench.session import run

    rows = run(300, 1)
    assert [name.split(":")[0] for name, _ in rows][:5] == [
        "parse_binary", "assembler feed", "Session.receive_binary", "f32_to_s16le",
        "Session.on_audio"]
    assert len(rows) == 7 and all(us > 0 for _, us in rows)
