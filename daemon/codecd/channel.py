"""Channels between the processes of one ``codecd serve``: control messages with descriptors,
and the shared-memory data channel of a (front, worker) pair.

Control (main <-> front, main -> worker): a ``SOCK_SEQPACKET`` unix socketpair; one
message is one JSON object, with up to :data:`MAX_FDS` file descriptors riding along
(``SCM_RIGHTS``). Message boundaries are the socket's, so there is no framing, and a
peer that dies is an EOF (an empty read).

Data (front <-> worker): per pair, two :mod:`codecd.ring` rings, each with its
doorbell: the *command* ring (the front produces :mod:`codecd.wire` packets: open,
push, finish, cancel) and the *event* ring (the worker produces: opened, audio,
done, failed). One ring record is one wire packet, so the codes of many streams
travel in one PUSH batch record and the PCM of one tick in one AUDIO batch record.
Main creates the memfds and doorbells (:func:`make_channel`), hands one end of
each to either side, and closes its copies: a side that dies is an EOF on the
other's doorbell, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from .ring import Consumer, Producer, create_ring

__all__ = ["MAX_FDS", "send_msg", "recv_msg", "control_pair", "make_channel", "FrontEnds", "CtlLink",
           "WorkerEnds", "Channel"]

MAX_FDS = 8
_RECV_BYTES = 1 << 20  # largest control message (a metrics snapshot of every worker)
#: default ring sizes: commands are small; a tick's PCM of 1,000 SNAC 24 kHz streams is ~8 MiB
#: (2048-sample chunks), spread over the fronts
CMD_RING_BYTES = 4 << 20
EVT_RING_BYTES = 16 << 20


def packets(msgs: list[Any], limit: int) -> list[bytes]:
    """``msgs`` as wire packets of at most about ``limit`` bytes each, in order (one ring
    record each): a ring record can never be larger than its ring."""
    from . import wire

    out: list[bytes] = []
    start, size = 0, 0
    for i, m in enumerate(msgs):
        if isinstance(m, wire.PushCodes):
            n = 32 + sum(8 + a.nbytes for a in m.levels)
        elif isinstance(m, wire.AudioOut):
            n = 32 + m.pcm.nbytes
        elif isinstance(m, wire.StreamFailed):
            n = 64 + 4 * (len(m.code) + len(m.message))
        else:
            n = 256
        if size and size + n > limit:
            out.append(wire.encode(msgs[start:i]))
            start, size = i, 0
        size += n
    if start < len(msgs):
        out.append(wire.encode(msgs[start:]))
    return out


def control_pair() -> tuple[socket.socket, socket.socket]:
    """A connected SOCK_SEQPACKET pair (both ends blocking; callers change that)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, 1 << 21)
            except OSError:
                pass
    return a, b


def send_msg(sock: socket.socket, msg: dict[str, Any], fds: list[int] | tuple[int, ...] = ()
             ) -> None:
    """One message (and descriptors); OSError when the peer is gone or the socket full."""
    data = json.dumps(msg, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and its descriptors (the caller owns them); None at EOF.
    BlockingIOError on a non-blocking socket with nothing waiting; ValueError for a message
    that is not a JSON object or was cut."""
    data, fds, flags, _ = socket.recv_fds(sock, _RECV_BYTES, MAX_FDS)
    if not data and not fds:
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("a control message was cut (too large)")
    try:
        msg = json.loads(data)
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    if not isinstance(msg, dict):
        for fd in fds:
            os.close(fd)
        raise ValueError("a control message is a JSON object")
    return msg, list(fds)


@dataclass
class FrontEnds:
    """A front's side of a channel: produces commands, consumes events."""

    commands: Producer
    events: Consumer

    @classmethod
    def from_fds(cls, fds: list[int]) -> FrontEnds:
        cmd_fd, cmd_bell, evt_fd, evt_bell = fds
        try:
            p = Producer(cmd_fd, _sock(cmd_bell))
            c = Consumer(evt_fd, _sock(evt_bell))
        finally:
            os.close(cmd_fd)  # the mappings keep the memory
            os.close(evt_fd)
        return cls(p, c)

    def close(self) -> None:
        for end in (self.commands, self.events):
            end.close()
        for b in (self.commands._bell, self.events.doorbell):
            b.close()


@dataclass
class WorkerEnds:
    """A worker's side of a channel: consumes commands, produces events."""

    commands: Consumer
    events: Producer

    @classmethod
    def from_fds(cls, fds: list[int]) -> WorkerEnds:
        cmd_fd, cmd_bell, evt_fd, evt_bell = fds
        try:
            c = Consumer(cmd_fd, _sock(cmd_bell))
            p = Producer(evt_fd, _sock(evt_bell))
        finally:
            os.close(cmd_fd)
            os.close(evt_fd)
        return cls(c, p)

    def close(self) -> None:
        for end in (self.commands, self.events):
            end.close()
        for b in (self.commands.doorbell, self.events._bell):
            b.close()


def _sock(fd: int) -> socket.socket:
    s = socket.socket(fileno=fd)
    s.setblocking(False)
    return s


@dataclass
class Channel:
    """The descriptors of one new (front, worker) channel, before they are handed over."""

    front_fds: list[int]
    worker_fds: list[int]

    def close(self) -> None:
        """Close main's copies (after sending them, or when the send failed)."""
        for fd in {*self.front_fds, *self.worker_fds}:
            try:
                os.close(fd)
            except OSError:
                pass


def make_channel(cmd_bytes: int = CMD_RING_BYTES, evt_bytes: int = EVT_RING_BYTES) -> Channel:
    """Two rings and their doorbells: ``front_fds`` = (command ring, its producer bell, event
    ring, its consumer bell), ``worker_fds`` = (command ring, its consumer bell, event ring,
    its producer bell)."""
    cmd = create_ring(cmd_bytes)
    evt = create_ring(evt_bytes)
    cp, cc = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ep, ec = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel([cmd, cp.detach(), evt, ec.detach()], [cmd, cc.detach(), evt, ep.detach()])


class CtlLink:
    """One end of a control socket on an asyncio loop: messages in (``on_msg(msg, fds)``,
    then ``on_eof()`` once), messages out without ever blocking the loop (a full socket
    queues them, with duplicates of their descriptors, until it drains)."""

    def __init__(self, sock: socket.socket, loop: Any,
                 on_msg: Any, on_eof: Any) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._loop = loop
        self._on_msg = on_msg
        self._on_eof = on_eof
        self._queue: list[tuple[dict[str, Any], list[int]]] = []
        self.closed = False
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, msg: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> bool:
        """Send (or queue) a message; the caller keeps its descriptors. False once closed."""
        if self.closed:
            return False
        if not self._queue:
            try:
                send_msg(self.sock, msg, fds)
                return True
            except BlockingIOError:
                pass
            except OSError:
                self._eof()
                return False
            self._loop.add_writer(self.sock.fileno(), self._writable)
        self._queue.append((msg, [os.dup(fd) for fd in fds]))
        return True

    def _writable(self) -> None:
        while self._queue:
            msg, fds = self._queue[0]
            try:
                send_msg(self.sock, msg, fds)
            except BlockingIOError:
                return
            except OSError:
                self._eof()
                return
            self._queue.pop(0)
            for fd in fds:
                os.close(fd)
        self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        while not self.closed:
            try:
                got = recv_msg(self.sock)
            except BlockingIOError:
                return
            except ValueError as e:
                import logging
                logging.getLogger(__name__).warning("bad control message: %s", e)
                continue
            except OSError:
                got = None
            if got is None:
                self._eof()
                return
            self._on_msg(*got)

    def _eof(self) -> None:
        if self.closed:
            return
        self.close()
        self._on_eof()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fd = self.sock.fileno()
        if fd >= 0:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        for _, fds in self._queue:
            for f in fds:
                os.close(f)
        self._queue.clear()
        self.sock.close()
