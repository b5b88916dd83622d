"""codecd.ring: shared-memory SPSC rings with a doorbell, in one process and across two."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from codecd import ring

ROOT = Path(__file__).resolve().parents[2]


def pair(capacity: int):
    fd = ring.create_ring(capacity)
    a, b = ring.doorbell_pair()
    try:
        return ring.Producer(fd, a), ring.Consumer(fd, b)
    finally:
        os.close(fd)


def drain(c: ring.Consumer, out: list[bytes]) -> None:
    assert c.on_doorbell()
    for r in c.records():
        out.append(bytes(r))


def test_records_in_order_through_wraps():
    """2,000 records of varied sizes through a 4 KiB ring arrive whole and in order across its wraps."""
    p, c = pair(4096)
    got: list[bytes] = []
    for i in range(2000):
        payload = np.full(i % 97 + 1, i, np.int32)
        while not p.write([b"hd", payload]):
            p.ring()
            drain(c, got)
        if i % 7 == 0:
            p.ring()
    p.ring()
    drain(c, got)
    assert len(got) == 2000
    for i, g in enumerate(got):
        assert g[:2] == b"hd"
        np.testing.assert_array_equal(np.frombuffer(g[2:], np.int32), np.full(i % 97 + 1, i, np.int32))
    p.close()
    c.close()


def test_full_ring_refuses_then_accepts():
    """A full ring refuses a record (False, nothing written) until the consumer frees room."""
    p, c = pair(1024)
    n = 0
    while p.write([bytes(100)]):
        n += 1
    assert n == 1024 // 112  # 8-byte header, payload padded to 104
    assert p.free() == 1024 - 112 * n and not p.write([bytes(100)])
    p.ring()
    got: list[bytes] = []
    drain(c, got)
    assert len(got) == n
    assert p.write([bytes(100)])


def test_unpublished_records_stay_invisible():
    """Records written but not rung are not seen, even if the consumer polls."""
    p, c = pair(1024)
    p.write([b"abc"])
    got: list[bytes] = []
    c.on_doorbell()
    assert not c.pending() and list(c.records()) == []
    p.ring()
    drain(c, got)
    assert got == [b"abc"]


def test_records_filled_in_place_through_wraps():
    """Records reserved for more than they hold, filled in place and committed with what
    they hold (some with nothing), mixed with written ones, arrive whole and in order across
    the ring's wraps; a full ring refuses a reservation; nothing else is written while one
    is open."""
    p, c = pair(4096)
    got: list[bytes] = []
    want: list[bytes] = []
    for i in range(3000):
        payload = np.full(i % 61 + 1, i, np.int32).tobytes()
        if i % 3:
            view = p.reserve(len(payload) + 200)
            while view is None:
                p.ring()
                drain(c, got)
                view = p.reserve(len(payload) + 200)
            with pytest.raises(ring.RingError, match="not committed"):
                p.write([b"x"])
            keep = 0 if i % 11 == 0 else len(payload)  # 0: no record
            view[:keep] = payload[:keep]
            view.release()
            p.commit(keep)
            if keep:
                want.append(payload)
        else:
            while not p.write([payload]):
                p.ring()
                drain(c, got)
            want.append(payload)
        if i % 5 == 0:
            p.ring()
    assert p.unpublished
    p.ring()
    assert not p.unpublished
    drain(c, got)
    assert got == want
    with pytest.raises(ring.RingError, match="no reserved record"):
        p.commit(1)
    p.close()
    c.close()
    p, c = pair(4096)
    big = p.reserve(3000)
    assert big is not None
    big.release()
    with pytest.raises(ring.RingError, match="into a reservation of"):
        p.commit(3001)
    p.commit(3000)
    assert p.reserve(3000) is None  # full until the consumer reads
    p.close()
    c.close()


def test_oversized_record_is_an_error():
    """A record that can never fit raises RingError instead of blocking forever."""
    p, _ = pair(256)
    with pytest.raises(ring.RingError, match="can never fit"):
        p.write([bytes(1000)])


def test_not_a_ring():
    """A descriptor that is not a ring is refused."""
    fd = os.memfd_create("x")
    os.ftruncate(fd, 4096)
    with pytest.raises(ring.RingError, match="not a codecd ring"):
        ring.Consumer(fd, socket.socketpair()[0])
    os.close(fd)


CHILD = textwrap.dedent("""
    import hashlib, socket, sys, select
    sys.path.insert(0, {daemon!r})
    from codecd import ring
    ctl = socket.socket(fileno=int(sys.argv[1]))
    msg, fds, _, _ = socket.recv_fds(ctl, 16, 2)
    bell = socket.socket(fileno=fds[1])
    bell.setblocking(False)
    c = ring.Consumer(fds[0], bell)
    h, n = hashlib.sha256(), 0
    while True:
        select.select([bell], [], [], 5)
        alive = c.on_doorbell()
        for r in c.records():
            h.update(r)
            n += 1
        if not alive:
            break
    ctl.sendall(f"{{n}} {{h.hexdigest()}}".encode())
""")


def test_across_processes_and_producer_exit():
    """A child process reads every record in place (same checksum), and sees the producer go."""
    fd = ring.create_ring(1 << 16)
    bell_p, bell_c = ring.doorbell_pair()
    ctl, ctl_child = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(daemon=str(ROOT / "daemon")),
                              str(ctl_child.fileno())], pass_fds=[ctl_child.fileno()])
    ctl_child.close()
    socket.send_fds(ctl, [b"ring"], [fd, bell_c.fileno()])
    bell_c.close()
    p = ring.Producer(fd, bell_p)
    os.close(fd)
    import hashlib

    h = hashlib.sha256()
    rng = np.random.default_rng(1)
    for i in range(3000):
        rec = rng.integers(0, 255, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes()
        while not p.write([rec]):
            p.ring()
        h.update(rec)
        if i % 5 == 0:
            p.ring()
    p.ring()
    p.close()
    bell_p.close()  # the producer goes: the consumer's doorbell reads EOF
    reply = ctl.recv(200).decode().split()
    assert child.wait(timeout=20) == 0
    assert reply == ["3000", h.hexdigest()]
