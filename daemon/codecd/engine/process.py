"""A worker process seen from the daemon: spawn, pipe, reader and writer threads, exit status.

Why a plain ``subprocess`` (``python -c "import codecd.worker ..."``) with a
socketpair wrapped in ``multiprocessing.connection.Connection``: a fresh
interpreter (``fork`` would copy the daemon's threads, locks, event loop and
CUDA state), and, unlike ``multiprocessing``'s spawn context, no re-import of
the daemon's ``__main__`` in the child (an unguarded main script would run
again there), no hidden process bookkeeping, and an explicit argv, environment
(the parent's ``sys.path`` as PYTHONPATH) and fd. ``Connection`` gives the
length-prefixed framing of :mod:`codecd.wire` packets; a peer that dies mid-packet
is an ``EOFError``. The
daemon side never blocks its event loop on the pipe: one reader thread hands
message batches to the loop with ``call_soon_threadsafe`` and one writer thread
drains a command queue whose depth the engine bounds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .. import wire

__all__ = ["WorkerProcess", "child_env", "child_pythonpath", "describe_exit"]

logger = logging.getLogger(__name__)


def child_pythonpath() -> str:
    """PYTHONPATH for a child that must import codecrt and codecd from where this
    process did: their parent folders first (a source checkout's bindings/ on
    sys.path must not shadow an installed codecrt with its built extension), then
    the rest of sys.path."""
    import codecd
    import codecrt

    first = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__ or "")))
             for m in (codecrt, codecd)]
    return os.pathsep.join(dict.fromkeys([*first, *(p for p in sys.path if p)]))


def child_env() -> dict[str, str]:
    """The environment of a worker or front process: this one's without systemd's
    notification variables (main alone talks to systemd), with :func:`child_pythonpath`, and
    with ``OPENBLAS_NUM_THREADS=1`` unless it is set: numpy's OpenBLAS starts a thread per
    core at import, idle in these processes (ggml runs its own threads, the fronts multiply
    nothing), and 8 fronts and 8 workers on a 64-core host would pass the systemd unit's
    ``TasksMax`` with them."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env["PYTHONPATH"] = child_pythonpath()
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


class WorkerProcess:
    """One incarnation of a worker process: the process, its pipe and its two threads.

    Commands are :mod:`codecd.wire` messages; the writer thread packs whatever is
    queued into one packet. Each packet from the worker (its messages, or None at
    EOF or unreadable bytes) goes to ``on_messages(self, msgs)`` on the event loop,
    in order; the first must start with the worker's hello of this wire version."""

    def __init__(self, generation: int, on_messages: Callable[[WorkerProcess, Any], None]) -> None:
        self.on_messages = on_messages
        self.generation = generation
        self.proc: Any = None
        self.conn: Connection | None = None
        #: the parent's end of a SOCK_SEQPACKET pair for handing the worker the descriptors
        #: of front channels (``socket.send_fds``; see :mod:`codecd.channel`)
        self.fdsock: socket.socket | None = None
        self.queue: queue.SimpleQueue[wire.Message | None] = queue.SimpleQueue()
        # commands put (loop thread) and written (writer thread): each counter has one
        # writer, so their difference is a race-free queue depth
        self.n_put = 0
        self.n_sent = 0
        self.reader: threading.Thread | None = None
        self.writer: threading.Thread | None = None
        self.pid = 0
        self.started_at = 0.0
        self.eof = False
        self.wire_error = ""  # why the worker's bytes were not read (another wire version...)

    def spawn(self, first: list[wire.Message], tag: str, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker and send it ``first`` (hello, configuration) before anything else."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fparent, fchild = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = child_env()
        fd, ffd = child.fileno(), fchild.fileno()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"import codecd.worker as w; w.serve_fd({fd}, {ffd})"],
                pass_fds=(fd, ffd), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        except BaseException:
            parent.close()
            fparent.close()
            raise
        finally:
            child.close()  # the child holds the only other end: its death is EOF here
            fchild.close()
        self.fdsock = fparent
        self.conn = Connection(parent.detach())
        self.pid = int(self.proc.pid)
        self.started_at = time.monotonic()
        for m in first:
            self.send(m)
        self.reader = threading.Thread(target=self._read, args=(loop,), daemon=True,
                                       name=f"codecd-engine-rd-{tag}")
        self.writer = threading.Thread(target=self._write, daemon=True,
                                       name=f"codecd-engine-wr-{tag}")
        self.reader.start()
        self.writer.start()

    @property
    def exitcode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def queued(self) -> int:
        return self.n_put - self.n_sent

    def send(self, cmd: wire.Message) -> None:
        self.n_put += 1
        self.queue.put(cmd)

    def _write(self) -> None:
        conn = self.conn
        assert conn is not None
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            while True:  # coalesce whatever else is queued into one packet
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.queue.put(None)
                    break
                batch.append(more)
            try:
                conn.send_bytes(wire.encode(batch))
            except (OSError, ValueError):  # worker gone (EPIPE) or pipe closed: reader reports
                return
            finally:
                self.n_sent += len(batch)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        conn = self.conn
        assert conn is not None
        hello = False
        while True:
            msgs: list[wire.Message] | None
            try:
                msgs = wire.decode(conn.recv_bytes())
                if not hello:
                    msgs, hello = wire.check_hello(msgs), True
            except (EOFError, OSError, ValueError):
                msgs = None
            except Exception as e:  # another wire version (WireError), a bug: never hang
                self.wire_error = str(e)
                logger.warning("worker %d: unreadable packet: %s: %s", self.pid,
                               type(e).__name__, e)
                msgs = None
            try:
                loop.call_soon_threadsafe(self.on_messages, self, msgs)
            except RuntimeError:  # the loop is closed
                return
            if msgs is None:
                return

    def stop_threads(self) -> None:
        self.queue.put(None)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def close_conn(self, join_s: float = 2.0) -> None:
        """Close the pipe once its two threads are done with it. A thread between two system
        calls on the descriptor's number when it is closed would use whatever socket takes
        that number next (the next worker's pipe: a stale command as its first packet);
        ``shutdown`` ends their blocking calls at once without freeing the number."""
        if self.fdsock is not None:
            self.fdsock.close()
        conn = self.conn
        if conn is None or conn.closed:
            return
        s = socket.socket(fileno=conn.fileno())
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.detach()
        self.stop_threads()
        me = threading.current_thread()
        for t in (self.reader, self.writer):
            if t is not None and t is not me:
                t.join(join_s)
                if t.is_alive():  # never expected: keep the number rather than risk its reuse
                    logger.warning("worker %d: thread %s still runs; its pipe stays open",
                                   self.pid, t.name)
                    return
        try:
            conn.close()
        except OSError:
            pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
