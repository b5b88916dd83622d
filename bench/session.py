"""codecd's own work per message in a front, without sockets: one core's CPU per step.

``python -m bench session [--messages 20000] [--repeat 3]``

A front's work per stream per frame is the websockets layer's (``python -m bench frames``) plus
codecd's own: the client's binary frame of 7 Orpheus ids parsed, checked and split into the
model's levels (``Session.receive_binary``), and a tick's 2,048 float32 samples turned into
s16 and framed for the client (``Session.on_audio``). This suite times those on one SNAC 24 kHz
stream of one session, the steps alone and whole, best of ``--repeat`` passes of
``--messages`` messages each, in microseconds per message; then a push's way on to the worker
(its wire packet, ring record and doorbell), one push a record and six (what a front's flush
gathers in a millisecond at 500 streams; ``codecd.front._FLUSH_S``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any, Callable

import numpy as np


def _session() -> tuple[Any, Any]:
    """A session with one open SNAC 24 kHz stream (orpheus_ids, pcm_s16le) and its key."""
    from codecd.actions import EngineOpen
    from codecd.families import ModelSpec
    from codecd.session import Session, SessionLimits

    snac = ModelSpec("snac_24khz", "snac", 24000, 512, 3, (4096, 4096, 4096), (4, 2, 1),
                     layouts=("orpheus_ids", "orpheus", "levels"), latency_samples=1536)
    s = Session({"snac_24khz": snac}, SessionLimits(max_duration_s=1e9))
    acts = s.receive_text(json.dumps(dict(type="start", stream_id="a", model="snac_24khz",
                                          layout="orpheus_ids", format="pcm_s16le")))
    key = next(a for a in acts if isinstance(a, EngineOpen)).key
    s.on_opened(key)
    return s, key


def _best(fn: Callable[[int], None], n: int, repeat: int) -> float:
    """Best of ``repeat`` passes of fn(n): microseconds per message."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def run(n: int, repeat: int) -> list[tuple[str, float]]:
    from codecd import audio, protocol
    from codecd.actions import EnginePush, SendBinary
    from codecd.families.orpheus import ORPHEUS_IDS, ORPHEUS_TOKEN_BASE

    rng = np.random.default_rng(0)
    base = ORPHEUS_TOKEN_BASE + np.arange(7, dtype=np.int64) * 4096
    frames = [protocol.encode_token_frame("a", base + rng.integers(0, 4096, 7)) for _ in range(n)]
    pcm = (rng.standard_normal(2048) * 0.1).astype(np.float32)
    ids = [protocol.parse_binary(f).tokens for f in frames]

    def parse(k: int) -> None:
        for f in frames[:k]:
            protocol.parse_binary(f)

    def assemble(k: int) -> None:
        a = ORPHEUS_IDS.assembler([4096] * 3, [4, 2, 1])
        for t in ids[:k]:
            a.feed(t)

    def convert(k: int) -> None:
        for _ in range(k):
            audio.f32_to_s16le(pcm)

    def inbound(k: int) -> None:
        for i, f in enumerate(frames[:k]):
            if i % 1000 == 0:  # a new stream before the session's backlog limit (8,192 tokens)
                s, key = _session()
            acts = s.receive_binary(f)
            s.on_released(key, 4)  # as the server's pacer does once it hands them on
            assert isinstance(acts[-1], EnginePush), acts

    def outbound(k: int) -> None:
        s, key = _session()
        for _ in range(k):
            s.on_released(key, 4)
            for a in s.on_audio(key, pcm):
                assert isinstance(a, SendBinary), a
                s.on_sent(a)  # as the server's writer does once it is written

    def to_ring(per: int) -> Callable[[int], None]:
        """The way of a push to the worker (``RingEngine._flush``): ``per`` PushCodes a ring
        record, its doorbell rung; a consumer reads the ring now and then."""
        import os

        from codecd.channel import FrontEnds, WorkerEnds, make_channel, packets
        from codecd.wire import PushCodes

        ch = make_channel()
        wfds = list(ch.worker_fds)
        wfds[0], wfds[2] = os.dup(wfds[0]), os.dup(wfds[2])  # both ends in this process
        fe, we = FrontEnds.from_fds(list(ch.front_fds)), WorkerEnds.from_fds(wfds)
        prod, cons = fe.commands, we.commands
        levels = [rng.integers(0, 4096, k).astype(np.int32) for k in (1, 2, 4)]

        def go(k: int) -> None:
            out: list[Any] = []
            for i in range(k):
                out.append(PushCodes(i, levels))
                if len(out) == per:
                    for pkt in packets(out, prod.capacity // 4):
                        assert prod.write([pkt])
                    prod.ring()
                    out.clear()
                    if i % 256 < per:
                        cons.on_doorbell()
                        for r in cons.records():
                            bytes(r)
        return go

    return [("parse_binary: a binary frame of 7 ids", _best(parse, n, repeat)),
            ("assembler feed: 7 ids checked, split into 3 levels", _best(assemble, n, repeat)),
            ("Session.receive_binary: the two, the stream's checks, EnginePush",
             _best(inbound, n, repeat)),
            ("f32_to_s16le: 2,048 samples", _best(convert, n, repeat)),
            ("Session.on_audio: conversion, audio frame header, output budget",
             _best(outbound, n, repeat)),
            ("a push to the worker's ring, one a ring record (wire packet, record, doorbell)",
             _best(to_ring(1), n, repeat)),
            ("a push to the worker's ring, six a ring record", _best(to_ring(6), n, repeat))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench session", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = run(args.messages, args.repeat)
    print(f"Python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}; "
          f"{args.messages} messages a pass, best of {args.repeat}\n")
    print("| step | us per message |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    inb, outb = rows[2][1], rows[4][1]
    print(f"\nper stream-frame (a token message in, an audio message out): {inb + outb:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
