"""Output budget of one connection, sans-I/O: how much audio the server may owe its client.

A connection *owes* audio from the moment a stream's codes go to the engine until
the frames that carry the audio are written to the socket. What it owes is

* the audio queued for sending (every stream's, also of streams that have ended), and
* per open stream, the audio of the codes the engine has and has not returned yet,
  less what its decoder holds back by design (the look-ahead and one chunk): that
  part cannot come out before more codes go in, so counting it could stall a stream.

The server hands a stream's codes to the engine only while the connection owes
less than its budget (:meth:`OutputBudget.room_s`). A client that reads slower
than real time thus slows its own decode: its streams keep their state and their
engine slots and wait (back-pressure), and the audio held for it stays within the
budget plus each open stream's decoder hold. A client that stops reading is the
send deadline's business (``slow_reader``).

Queued audio is counted in integer microseconds, so that adding and taking away
the same frames leaves exactly zero (float sums drift).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["OutputBudget", "DEFAULT_OUTPUT_BUDGET_S"]

#: seconds of audio a connection may owe its client (``output_budget_s``)
DEFAULT_OUTPUT_BUDGET_S = 2.5


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


@dataclass(eq=False)
class _Ledger:
    """One open stream: audio handed to the engine, audio back from it, what it may hold."""

    hold_us: int
    released_us: int = 0
    produced_us: int = 0

    def in_engine_us(self) -> int:
        return max(0, self.released_us - self.produced_us - self.hold_us)


class OutputBudget:
    """The audio one connection owes its client; ``limit_s`` <= 0: no budget (never limits)."""

    def __init__(self, limit_s: float = DEFAULT_OUTPUT_BUDGET_S) -> None:
        self.limit_s = float(limit_s)
        self._limit_us = _us(limit_s)
        self._queued_us = 0
        self._queued_bytes = 0
        self.peak_queued_s = 0.0  # the most ever queued (tests, metrics)
        self._streams: dict[Hashable, _Ledger] = {}

    @property
    def enabled(self) -> bool:
        return self._limit_us > 0

    # ------------------------------------------------------------ queries

    @property
    def queued_s(self) -> float:
        """Audio in frames queued for sending and not yet written to the socket."""
        return self._queued_us / 1e6

    @property
    def queued_bytes(self) -> int:
        """The size of those frames."""
        return self._queued_bytes

    @property
    def owed_s(self) -> float:
        """Queued audio plus the audio of codes in the engine beyond the decoders' hold."""
        return (self._queued_us + sum(s.in_engine_us() for s in self._streams.values())) / 1e6

    def room_s(self, key: Hashable, group_s: float) -> float:
        """Seconds of audio the stream's codes may add now. ``group_s`` is the smallest
        amount that can go (one group of the coarsest level): a budget with less room
        than that lets nothing go while queued audio waits for the client, and exactly
        one group when nothing is queued (what the engine holds then is the decoders'
        own, and must not stall a stream)."""
        if not self.enabled or key not in self._streams:
            return math.inf
        room = (self._limit_us - self._queued_us
                - sum(s.in_engine_us() for s in self._streams.values())) / 1e6
        if room >= group_s:
            return room
        return group_s if self._queued_us == 0 else 0.0

    # ------------------------------------------------------------ events

    def open(self, key: Hashable, hold_s: float) -> None:
        """A stream opens; its decoder may hold ``hold_s`` of audio back by design."""
        self._streams[key] = _Ledger(hold_us=_us(hold_s))

    def drop(self, key: Hashable) -> None:
        """A stream is gone (done, cancelled, failed): the engine owes nothing more for it.
        Its frames still queued stay counted until written."""
        self._streams.pop(key, None)

    def released(self, key: Hashable, seconds: float) -> None:
        """The audio of codes handed to the engine for a stream."""
        st = self._streams.get(key)
        if st is not None:
            st.released_us += _us(seconds)

    def produced(self, key: Hashable, seconds: float) -> None:
        """Audio the engine returned for a stream."""
        st = self._streams.get(key)
        if st is not None:
            st.produced_us += _us(seconds)

    def queued(self, seconds: float, nbytes: int) -> None:
        """A frame of ``seconds`` of audio (``nbytes`` long) is queued for sending."""
        self._queued_us += _us(seconds)
        self._queued_bytes += nbytes
        self.peak_queued_s = max(self.peak_queued_s, self.queued_s)

    def sent(self, seconds: float, nbytes: int) -> None:
        """A queued frame was written to the socket (or thrown away with the connection)."""
        self._queued_us = max(0, self._queued_us - _us(seconds))
        self._queued_bytes = max(0, self._queued_bytes - nbytes)
