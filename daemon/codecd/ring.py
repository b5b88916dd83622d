"""Single-producer single-consumer byte rings in shared memory, with a doorbell.

The data path between a front process and an engine worker: records (one
batch of many streams' frames each) are written into a ring of shared memory
by one process and read in place by the other, so PCM and codes cross without
pickling and without a kernel copy. The memory is an anonymous ``memfd``
passed between the processes as a file descriptor: it has no name that a
process could leak by dying.

Layout of the segment (little-endian, 8-byte aligned)::

    0     u64 magic            "CODECRG1" (name and layout version)
    8     u64 capacity         bytes in the data area (a multiple of 8)
    64    u64 head             consumer position (bytes consumed, ever)
    128   u64 tail             producer position (bytes produced, ever)
    256   data[capacity]       records

A record is ``u32 length, u32 0, payload[length]``, padded to 8 bytes. A
record never wraps: when it does not fit before the end of the data area the
producer writes ``u32 0xFFFFFFFF`` there and starts again at offset 0.

**Ordering.** The producer publishes a batch by storing ``tail`` and then
writing that tail value (8 bytes) to the doorbell, a stream socket the
consumer waits on. The consumer never trusts the tail it could read from
shared memory: it reads records only up to the largest tail it has received
through the doorbell. The two system calls order the producer's stores before
the consumer's loads on every architecture (x86-64 would not need it; arm64
does). The head travels the other way through shared memory only: the
producer reads it to know how much room there is, and a stale head only makes
the ring look fuller than it is.

A full ring is not an error: :meth:`Producer.write` returns False and the
caller keeps the batch (backpressure). Nothing here allocates per record.
:meth:`Producer.reserve` and :meth:`Producer.commit` let a producer compute a
record in the ring itself (a worker pulls a tick's PCM straight into it).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Union

import numpy as np

__all__ = ["RingError", "Producer", "Consumer", "create_ring", "doorbell_pair", "HEADER_BYTES"]

MAGIC = int.from_bytes(b"CODECRG1", "little")
HEADER_BYTES = 256
_HEAD, _TAIL_WORD = 8, 16  # u64 word indices of head and tail
_WRAP = 0xFFFFFFFF
_REC = struct.Struct("<II")
_NOTICE = struct.Struct("<Q")

Part = Union[bytes, bytearray, memoryview, np.ndarray]


class RingError(Exception):
    """A descriptor that is not a ring, or a record that can never fit."""


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class _Segment:
    """A ring segment mapped from its file descriptor."""

    def __init__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES + 64:
            raise RingError(f"fd {fd}: {size} bytes is too small for a ring")
        self.map = mmap.mmap(fd, size)
        # u64 words read and written as single aligned stores (numpy scalars)
        self.words = np.ndarray((HEADER_BYTES // 8,), dtype=np.uint64, buffer=self.map)
        self.capacity = int(self.words[1])
        if int(self.words[0]) != MAGIC or self.capacity <= 0 or self.capacity % 8 or \
                HEADER_BYTES + self.capacity > size:
            self.close()
            raise RingError(f"fd {fd} is not a codecd ring")
        self.data = memoryview(self.map)[HEADER_BYTES:HEADER_BYTES + self.capacity]

    def close(self) -> None:
        if hasattr(self, "data"):
            self.data.release()
            del self.data
        if hasattr(self, "words"):
            del self.words
        self.map.close()


def create_ring(capacity: int) -> int:
    """A new ring of ``capacity`` data bytes (rounded up to 8), as a memfd the caller owns.

    Map it with :class:`Producer` or :class:`Consumer`, hand the descriptor to
    the other process (``socket.send_fds``), then close it: the memory goes with
    the last mapping.
    """
    capacity = _pad8(max(capacity, 64))
    fd = os.memfd_create("codecd-ring", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, HEADER_BYTES + capacity)
        with mmap.mmap(fd, HEADER_BYTES + capacity) as m:
            words = np.ndarray((HEADER_BYTES // 8,), dtype=np.uint64, buffer=m)
            words[1] = capacity
            words[0] = MAGIC
            del words
    except BaseException:
        os.close(fd)
        raise
    return fd


def doorbell_pair() -> tuple[socket.socket, socket.socket]:
    """(producer end, consumer end): a non-blocking stream socketpair for tail notices."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (a, b):
        s.setblocking(False)
    return a, b


class Producer:
    """The writing end: :meth:`write` appends records, :meth:`ring` publishes them."""

    def __init__(self, fd: int, doorbell: socket.socket) -> None:
        self._seg = _Segment(fd)
        self._bell = doorbell
        self._tail = int(self._seg.words[_TAIL_WORD])
        self._published = self._tail
        self._reserved: tuple[int, int] | None = None  # (offset, room) of reserve()'s record

    @property
    def capacity(self) -> int:
        return self._seg.capacity

    def free(self) -> int:
        """Bytes free now (the head may be stale: never more than this)."""
        return self._seg.capacity - (self._tail - int(self._seg.words[_HEAD]))

    def fits(self, n: int) -> bool:
        """Whether a record of ``n`` payload bytes fits now."""
        need = 8 + _pad8(n)
        off = self._tail % self._seg.capacity
        waste = self._seg.capacity - off if self._seg.capacity - off < need else 0
        return need + waste <= self.free()

    def _place(self, n: int) -> int | None:
        """Where a record of ``n`` payload bytes starts (its header's offset), a wrap marker
        written before it when it would not fit before the end; None when it does not fit now."""
        cap = self._seg.capacity
        need = 8 + _pad8(n)
        if need > cap:
            raise RingError(f"a record of {n} bytes can never fit a ring of {cap} bytes")
        if self._reserved is not None:
            raise RingError("a reserved record is not committed yet")
        if not self.fits(n):
            return None
        off = self._tail % cap
        if cap - off < need:  # offsets and the capacity are multiples of 8: a marker fits
            _REC.pack_into(self._seg.data, off, _WRAP, 0)
            self._tail += cap - off
            off = 0
        return off

    def _close_record(self, off: int, n: int) -> None:
        _REC.pack_into(self._seg.data, off, n, 0)
        self._tail += 8 + _pad8(n)

    def write(self, parts: Sequence[Part]) -> bool:
        """Append one record made of ``parts`` (concatenated, each C-contiguous); False when it
        does not fit now (nothing is written then)."""
        n = 0
        for p in parts:
            n += p.nbytes if isinstance(p, (memoryview, np.ndarray)) else len(p)
        off = self._place(n)
        if off is None:
            return False
        data = self._seg.data
        pos = off + 8
        for p in parts:
            if isinstance(p, (bytes, bytearray)):
                mv: bytes | bytearray | memoryview = p
            elif isinstance(p, np.ndarray):
                mv = p.reshape(-1).view(np.uint8).data
            else:
                mv = p.cast("B")
            k = len(mv)
            data[pos:pos + k] = mv
            pos += k
        self._close_record(off, n)
        return True

    def reserve(self, n: int) -> memoryview | None:
        """Room for one record of at most ``n`` payload bytes, to fill in place (a producer
        that computes its payload there copies nothing); :meth:`commit` writes the record.
        None when it does not fit now. Nothing else may be written until it is committed."""
        off = self._place(n)
        if off is None:
            return None
        self._reserved = (off, n)
        return self._seg.data[off + 8:off + 8 + n]

    def commit(self, n: int) -> None:
        """Write the reserved record with its first ``n`` bytes (``n`` at most the room
        reserved; 0: no record). The view :meth:`reserve` gave must not be used after."""
        if self._reserved is None:
            raise RingError("no reserved record to commit")
        off, room = self._reserved
        if not 0 <= n <= room:
            raise RingError(f"a commit of {n} bytes into a reservation of {room}")
        self._reserved = None
        if n:
            self._close_record(off, n)

    @property
    def unpublished(self) -> bool:
        """Whether records were written since the last :meth:`ring` that reached the consumer."""
        return self._tail != self._published

    def ring(self) -> bool:
        """Publish every record written so far: store the tail, then send it to the consumer.

        Returns False when the consumer has gone. When the doorbell's buffer is
        full (a consumer that left tens of thousands of notices unread) the
        notice is sent again at the next call: call this once per batch and once
        per idle turn of the producer's loop.
        """
        if self._tail == self._published:
            return True
        self._seg.words[_TAIL_WORD] = self._tail
        try:
            self._bell.send(_NOTICE.pack(self._tail))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        self._published = self._tail
        return True

    def close(self) -> None:
        self._seg.close()


class Consumer:
    """The reading end: :meth:`on_doorbell` when the doorbell is readable, then :meth:`records`."""

    def __init__(self, fd: int, doorbell: socket.socket) -> None:
        self._seg = _Segment(fd)
        self._bell = doorbell
        self._head = int(self._seg.words[_HEAD])
        self._known_tail = self._head
        self._partial = b""

    @property
    def doorbell(self) -> socket.socket:
        return self._bell

    def on_doorbell(self) -> bool:
        """Take every pending tail notice (non-blocking); False when the producer has gone."""
        while True:
            try:
                b = self._bell.recv(8 * 1024)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not b:
                return False
            b = self._partial + b
            whole = len(b) - len(b) % 8
            self._partial = b[whole:]
            for i in range(0, whole, 8):
                t = _NOTICE.unpack_from(b, i)[0]
                if t > self._known_tail:
                    self._known_tail = t

    def pending(self) -> bool:
        """Whether published records wait."""
        return self._head < self._known_tail

    def records(self) -> Iterator[memoryview]:
        """Each published record, in place. A record's room is freed when the next one is
        taken or the iteration ends: never keep a view past that."""
        data = self._seg.data
        cap = self._seg.capacity
        words = self._seg.words
        while self._head < self._known_tail:
            off = self._head % cap
            n = _REC.unpack_from(data, off)[0]
            if n == _WRAP:
                self._head += cap - off
                continue
            view = data[off + 8:off + 8 + n]
            try:
                yield view
            finally:
                view.release()
                self._head += 8 + _pad8(n)
                words[_HEAD] = self._head

    def close(self) -> None:
        self._seg.close()
