"""The websocket connection under a session, without a task switch per message.

websockets' asyncio connection hands every message to the handler through its assembler (a
future resolved, the handler's task woken) and wraps every send in a context manager that
ends in ``drain()``. At a front's load (hundreds of streams, a 40-byte frame of codes in and
a frame of PCM out per stream per frame period, each in a loop turn of its own) those hops
were about as costly as the session's own work (``python -m bench frames --conns 64``,
docs/benchmarks.md). :class:`SessionConnection` keeps websockets' protocol, handshake,
keep-alive, flow control and closing, and adds two short ways:

- **In**: a complete binary frame is handed to the connection's ``on_binary`` callback from
  ``data_received`` itself, when nothing is ahead of it: no message waits in the assembler
  for the handler, no fragmented message is in progress, and the callback's ``may_take()``
  says the session takes input now (its queue of outgoing frames is below the mark above
  which a connection is not read). Any other frame (text, fragments, a binary frame behind
  one of them or while the session holds back) goes through the assembler to the handler as
  before, and every later frame follows it there until the handler has taken them all, so
  messages reach the session in the order they were sent.
- **Out**: :meth:`send_now` frames messages and writes them with one ``writelines`` while
  the connection is open and the transport's buffer has room under its high-water mark
  (``write_limit``), at most one message past it, as ``send()`` would have; it returns how
  many it wrote. The caller sends the rest with ``send()`` and, when the buffer is over the
  mark after the last one, waits for ``drain()``: both under its deadline, so a client that
  does not read is still caught (``slow_reader``) and the buffer stays as small as before.

While the transport's buffer is over its mark, the connection's input is not read either:
a client that does not read what it is sent cannot make the server write more (the pong
that websockets answers every ping with, the errors its bad frames earn) into a buffer that
only grows. Its input waits in the kernel, and the send deadline or the keep-alive closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Union

from websockets.asyncio.server import ServerConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import State

__all__ = ["SessionConnection"]

Message = Union[bytes, str]


class SessionConnection(ServerConnection):
    """A :class:`~websockets.asyncio.server.ServerConnection` with a direct path for
    complete binary frames and a batched send (module docstring). ``serve(...,
    create_connection=SessionConnection)``; the handler calls :meth:`take_binary` to start
    the direct path and :meth:`took` for each message it gets from ``recv()``."""

    _on_binary: Callable[[bytes], None] | None = None
    _may_take: Callable[[], bool] | None = None
    #: complete messages put in the assembler that the handler has not taken yet (a
    #: fragmented message's frames go there too; RFC 6455 allows no other data frame before
    #: its last, and websockets fails one that comes, so no flag of its own is needed)
    _queued = 0
    #: the assembler asked to stop reading (it holds ``max_queue`` frames)
    _assembler_full = False
    #: binary frames handed to ``on_binary`` (the direct path), for tests and benchmarks
    direct_frames = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # the assembler and the write buffer both decide whether the socket is read
        self.recv_messages.pause = self._assembler_over
        self.recv_messages.resume = self._assembler_under

    def _assembler_over(self) -> None:
        self._assembler_full = True
        self._set_reading()

    def _assembler_under(self) -> None:
        self._assembler_full = False
        self._set_reading()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._set_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._set_reading()

    def _set_reading(self) -> None:
        t = self.transport
        if t.is_closing():
            return
        if self._assembler_full or self.paused:
            t.pause_reading()
        else:
            t.resume_reading()

    def take_binary(self, on_binary: Callable[[bytes], None],
                    may_take: Callable[[], bool]) -> None:
        """From now on, hand complete binary frames to ``on_binary`` while ``may_take()``."""
        self._on_binary, self._may_take = on_binary, may_take

    def stop_taking(self) -> None:
        """No more frames to ``on_binary`` (the handler ends; the callback's references go)."""
        self._on_binary = self._may_take = None

    def took(self) -> None:
        """The handler got a message from ``recv()`` (one the assembler held)."""
        self._queued -= 1

    def process_event(self, event: Any) -> None:
        if not isinstance(event, Frame):  # the opening handshake's request
            super().process_event(event)
            return
        op = event.opcode
        if op is Opcode.BINARY and event.fin and not self._queued and \
                self._on_binary is not None and self._may_take is not None and self._may_take():
            data = event.data
            self.direct_frames += 1
            self._on_binary(data if type(data) is bytes else bytes(data))
            return
        if event.fin and (op is Opcode.BINARY or op is Opcode.TEXT or op is Opcode.CONT):
            self._queued += 1  # a message complete in the assembler
        super().process_event(event)

    def send_now(self, items: Sequence[Message]) -> int:
        """Frame the leading ``items`` (bytes as binary, str as text messages) that the
        transport's buffer has room for under its high-water mark, the last one crossing it
        (as ``send()`` writes a message and then waits), and write them at once, again while
        the socket takes what was written; how many. 0 while the connection is not open or
        the buffer is over the mark."""
        t, p = self.transport, self.protocol
        high = self.write_limit_high if self.write_limit_high is not None else 1 << 62
        n = 0
        while n < len(items) and not self.paused and p.state is State.OPEN and \
                not t.is_closing():
            room = high - t.get_write_buffer_size()
            if room <= 0:
                break
            while n < len(items) and room > 0:
                m = items[n]
                if isinstance(m, str):
                    b = m.encode()
                    p.send_text(b)
                else:
                    b = m
                    p.send_binary(b)
                room -= len(b)
                n += 1
            t.writelines(p.data_to_send())  # the kernel takes what fits; the rest is buffered
        return n
