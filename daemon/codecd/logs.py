"""The daemon's logging: plain text, or one JSON object per line, written by a thread.

A record is formatted where it is logged and handed to a bounded queue; one thread writes
the queue to stderr. So a slow or stalled stderr (a pipe that nobody reads, a journal that
stopped accepting) delays the log, never an event loop that moves audio: with a plain
``StreamHandler`` every front blocked in ``write`` once a pipe nobody read was full (64 KiB:
two lines per connection, a few hundred connections). Past ``QUEUE_RECORDS`` waiting records
a record is dropped and counted, and the count is logged once the queue has room again.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import sys
import threading
import time
from logging.handlers import QueueHandler
from typing import Any

__all__ = ["JsonFormatter", "setup_logging", "flush_logs", "QUEUE_RECORDS"]

QUEUE_RECORDS = 10_000


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields."""

    _std = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                             "logger": record.name, "msg": record.getMessage()}
        for k, v in record.__dict__.items():
            if k not in self._std and not k.startswith("_"):
                d[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


class _Front(logging.Filter):
    """Tags every record of a front process with its index (``front``)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.front = self.index
        return True


class _Queued(QueueHandler):
    """Formats here, queues without blocking; counts what a full queue drops. ``enqueue``
    runs under the handler's own lock (``Handler.handle``), so ``dropped`` needs no other."""

    def __init__(self, q: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(q)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        q: queue.Queue[logging.LogRecord] = self.queue  # type: ignore[assignment]
        if self.dropped and q.qsize() < QUEUE_RECORDS // 2:
            note = logging.LogRecord("codecd.logs", logging.WARNING, __file__, 0,
                                     "%d log record(s) dropped: stderr did not keep up",
                                     (self.dropped,), None)
            self.dropped = 0
            try:
                q.put_nowait(self.prepare(note))
            except queue.Full:
                pass
        try:
            q.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class _Writer(threading.Thread):
    """Writes the queue's records, already formatted, to stderr's file descriptor (a dup):
    no Python-level lock is held while a write blocks, so neither ``logging.shutdown`` nor
    the interpreter's own exit waits on a stalled stderr. A stream without a descriptor
    (replaced in a test) is written through its ``write``."""

    def __init__(self, q: queue.Queue[logging.LogRecord], stream: Any) -> None:
        super().__init__(name="codecd-log", daemon=True)
        self.q, self.stream = q, stream
        try:
            stream.flush()
            self.fd: int | None = os.dup(stream.fileno())
        except (AttributeError, OSError, ValueError):
            self.fd = None

    def _write(self, text: str) -> None:
        if self.fd is None:
            self.stream.write(text)
            self.stream.flush()
            return
        data = memoryview(text.encode("utf-8", "backslashreplace"))
        while data:
            data = data[os.write(self.fd, data):]

    def run(self) -> None:
        while True:
            record = self.q.get()
            try:
                self._write(record.getMessage() + "\n")
            except Exception:  # a closed or broken stderr: the record is lost, the process is not
                pass
            finally:
                self.q.task_done()


_queue: queue.Queue[logging.LogRecord] | None = None


def flush_logs(timeout: float = 2.0) -> bool:
    """Wait (at most ``timeout`` s) until the queued records are written; False if they were
    not (a stalled stderr). For a process about to ``os._exit``, and at exit."""
    q = _queue
    deadline = time.monotonic() + timeout
    while q is not None and q.unfinished_tasks:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def setup_logging(fmt: str = "text", level: str = "info", front: int | None = None) -> None:
    """Log to stderr through the writer thread; a front process (``front``: its index) tags
    its records with it."""
    global _queue
    if _queue is None:
        _queue = queue.Queue(QUEUE_RECORDS)
        _Writer(_queue, sys.stderr).start()
        atexit.register(flush_logs)
    h = _Queued(_queue)
    if fmt == "json":
        h.setFormatter(JsonFormatter())
    else:
        tag = "" if front is None else f" [front {front}]"
        h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s"))
    if front is not None:
        h.addFilter(_Front(front))
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
    logging.getLogger("websockets").setLevel(max(logging.WARNING, root.level))
