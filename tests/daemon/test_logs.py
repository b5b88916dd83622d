"""The daemon's logging never blocks the process that logs (codecd.logs): records are
formatted where they are logged and written by a thread, so a stderr that nobody reads
stalls the log, not the event loops. Real processes, real pipes left unread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from codecd.engine import child_pythonpath


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODECD_")}
    env["PYTHONPATH"] = child_pythonpath()
    return env


def test_logging_into_an_unread_pipe_does_not_block():
    """60,000 records (about 6 MB) into a pipe that nobody reads: with a plain StreamHandler
    the process blocks at the pipe's 64 KiB; here it finishes, dropping what the queue
    cannot hold, and exits within the writer's flush bound."""
    code = textwrap.dedent("""
        import logging, sys, time
        from codecd.logs import setup_logging, flush_logs
        setup_logging("text", "info")
        log = logging.getLogger("codecd.test")
        t0 = time.monotonic()
        for i in range(60000):
            log.info("record %d of a log that nobody reads %s", i, "x" * 60)
        print(f"logged in {time.monotonic() - t0:.2f} s", flush=True)
        print(f"flushed {flush_logs(0.2)}", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        try:  # neither pipe is read until the process has exited: stdout's two lines fit
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the process blocked logging into a pipe that nobody reads")
        out, err = p.stdout.read(), p.stderr.read()
        assert rc == 0, err[-2000:]
        assert "logged in" in out, out
        assert "flushed False" in out  # nobody read: the records could not all be written
        assert "record 0 of a log" in err  # what the pipe held was written, in order
    finally:
        if p.poll() is None:
            p.kill()


def test_json_records_keep_their_fields_through_the_queue():
    """Formatting happens before the queue: a front's records keep its index, an
    exception its traceback field, and a dropped count is reported once there is room."""
    code = textwrap.dedent("""
        import logging
        from codecd.logs import setup_logging, flush_logs
        setup_logging("json", "info", front=2)
        log = logging.getLogger("codecd.test")
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("it failed")
        log.info("plain %s", "args", extra={"stream": 7})
        assert flush_logs(5.0)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in r.stderr.splitlines()]
    assert [x["msg"] for x in recs] == ["it failed", "plain args"]
    assert recs[0]["front"] == 2 and "ZeroDivisionError" in recs[0]["exc"]
    assert recs[0]["level"] == "error" and recs[1]["stream"] == 7


def test_dropped_records_are_counted_and_reported():
    """A writer that stalls and then catches up: the records past the queue's bound are
    dropped, and the next record after it has room again is preceded by their count."""
    code = textwrap.dedent("""
        import logging, sys, threading
        import codecd.logs as logs
        gate = threading.Event()
        real = sys.stderr
        class Slow:  # a stderr without a descriptor whose writes wait for the gate
            def write(self, s):
                gate.wait()
                real.write(s)
            def flush(self):
                real.flush()
        sys.stderr = Slow()
        logs.setup_logging("text", "info")
        sys.stderr = real
        log = logging.getLogger("codecd.test")
        for i in range(logs.QUEUE_RECORDS + 500):
            log.info("r%d", i)
        gate.set()
        assert logs.flush_logs(30.0)
        log.info("after")
        assert logs.flush_logs(30.0)
    """)
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    dropped = [ln for ln in lines if "log record(s) dropped" in ln]
    assert len(dropped) == 1, dropped
    n = int(dropped[0].split(" log record(s)")[0].rsplit(" ", 1)[1])
    assert any(ln.endswith(" r0") for ln in lines)
    assert 499 <= n <= 500  # the writer held one record while it stalled, or not yet
    assert lines[-1].endswith("after") and lines[-2] == dropped[0]


def test_a_daemon_with_an_unread_stderr_keeps_serving(tmp_path):
    """`codecd serve` whose stderr is a pipe that nobody reads (the bench's old
    spawn_server): 700 connections, two log lines each, fill 64 KiB many times over; the
    daemon keeps accepting and /metrics answers."""
    import asyncio

    from conftest import codecrt_or_skip
    from serverkit import http_get, serve_process, wait_ready
    from smallmodel import write_small_snac
    from websockets.sync.client import connect

    codecrt_or_skip()
    gguf = write_small_snac(tmp_path / "small.gguf")
    log = tmp_path / "serve.log"
    with serve_process(gguf, log, "--max-connections-per-ip", "5000", unread_stderr=True) as (p, port):
        asyncio.run(wait_ready(port, p, log, timeout=90))
        for _ in range(700):
            with connect(f"ws://127.0.0.1:{port}", open_timeout=10) as ws:
                assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        status, body = asyncio.run(asyncio.wait_for(http_get(port, "/metrics"), 10))
        assert status == 200 and "codecd_" in body
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("codecd serve did not stop on SIGTERM with its stderr unread")
