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
- **Out**: :meth:`send_now` frames a batch of messages and writes them with one
  ``writelines`` while the connection is open and the transport is below its high-water
  mark; otherwise it sends nothing and the caller uses ``send()``, which waits for the
  buffer to drain (and is timed out by the caller: a client that does not read).
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
    #: complete messages put in the assembler that the handler has not taken yet
    _queued = 0
    #: a fragmented message is arriving (its frames go to the assembler)
    _fragment = False

    def take_binary(self, on_binary: Callable[[bytes], None],
                    may_take: Callable[[], bool]) -> None:
        """From now on, hand complete binary frames to ``on_binary`` while ``may_take()``."""
        self._on_binary, self._may_take = on_binary, may_take

    def took(self) -> None:
        """The handler got a message from ``recv()`` (one the assembler held)."""
        self._queued -= 1

    def process_event(self, event: Any) -> None:
        if not isinstance(event, Frame):  # the opening handshake's request
            super().process_event(event)
            return
        op = event.opcode
        if op is Opcode.BINARY or op is Opcode.TEXT:
            if not event.fin:
                self._fragment = True
            elif op is Opcode.BINARY and not self._queued and not self._fragment and \
                    self._on_binary is not None and self._may_take is not None and \
                    self._may_take():
                data = event.data
                self._on_binary(data if type(data) is bytes else bytes(data))
                return
            else:
                self._queued += 1
        elif op is Opcode.CONT and event.fin:
            self._fragment = False
            self._queued += 1
        super().process_event(event)

    def send_now(self, items: Sequence[Message]) -> bool:
        """Frame ``items`` (bytes as binary, str as text messages) and write them at once, if
        the connection is open and its transport is not above its high-water mark; False (and
        nothing sent) otherwise."""
        if self.paused or self.protocol.state is not State.OPEN or self.transport.is_closing():
            return False
        p = self.protocol
        for m in items:
            if isinstance(m, str):
                p.send_text(m.encode())
            else:
                p.send_binary(m)
        data = p.data_to_send()
        if all(data):
            self.transport.writelines(data)
        else:  # an end-of-stream marker (b""): not after data frames of an open connection
            self.transport.writelines([d for d in data if d])
            if self.transport.can_write_eof():
                self.transport.write_eof()
        return True
