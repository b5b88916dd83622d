"""Helpers of the runtime's streaming tests (codecrt contexts, no daemon): codes in the
levels layout, one stream pushed in pieces, streams stepped together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def levels(codes: np.ndarray) -> list[np.ndarray]:
    """[B, K, T] -> K arrays [B, T] (the runtime's levels layout, one per codebook)."""
    return [np.ascontiguousarray(codes[:, k, :]) for k in range(codes.shape[1])]


def random_pushes(rng: np.random.Generator, total: int, most: int = 9) -> list[int]:
    """Push sizes of 1..most frames drawn from rng, summing to total (the last one cut)."""
    pushes: list[int] = []
    while sum(pushes) < total:
        pushes.append(int(min(rng.integers(1, most + 1), total - sum(pushes))))
    return pushes


def stream_decode(ctx: Any, codes: Any, pushes: Sequence[int],
                  strides: Sequence[int] | None = None) -> np.ndarray:
    """One stream, codes [K, T] pushed in pieces of the given sizes, a tick after each push.
    With ``strides`` (``Model.info.level_strides``), codes is one 1-D array per level (SNAC's
    coarser levels shorter) and a push of n finest frames takes n // stride of each."""
    strides = [1] * len(codes) if strides is None else list(strides)
    s = ctx.stream()
    out, t = [], 0
    for n in pushes:
        s.push([codes[k][t // st:(t + n) // st] for k, st in enumerate(strides)])
        t += n
        ctx.step([s])
        out.append(s.pull())
    s.finish()
    while not s.done:
        ctx.step([s])
        out.append(s.pull())
    s.close()
    return np.concatenate(out)


def staggered_streams(ctx: Any, codes: Sequence[np.ndarray], starts: Sequence[int]) -> list[np.ndarray]:
    """Streams of codes[i] ([K_i, T_i]), stream i opened at tick starts[i], one frame pushed
    per tick, all live streams stepped together (one batched graph per tick): each one's audio."""
    streams: list[Any] = [None] * len(codes)
    outs: list[list[np.ndarray]] = [[] for _ in codes]
    pos = [0] * len(codes)
    for tick in range(max(starts) + max(c.shape[1] for c in codes) + 8):
        live = []
        for i, c in enumerate(codes):
            if tick == starts[i]:
                streams[i] = ctx.stream()
            s = streams[i]
            if s is None or s.done:
                continue
            if pos[i] < c.shape[1]:
                s.push([c[k, pos[i]:pos[i] + 1] for k in range(c.shape[0])])
                pos[i] += 1
                if pos[i] == c.shape[1]:
                    s.finish()
            live.append(s)
        if not live:
            break
        ctx.step(live)
        for i, s in enumerate(streams):
            if s is not None:
                outs[i].append(s.pull())
    return [np.concatenate(o) for o in outs]


def offline_and_stream(codecrt: Any, gguf: Any, codes: np.ndarray, pushes: Sequence[int],
                       **stream_args: Any) -> tuple[np.ndarray, np.ndarray]:
    """One stream's codes [K, T] through the model at ``gguf``: its offline decode (a default CPU
    context) and its stream pushed in pieces (``stream_decode``, a CPU context of ``stream_args``)."""
    with codecrt.Model(str(gguf)) as m:
        with codecrt.Context(m, device="cpu") as ctx:
            want = ctx.decode([codes[k:k + 1] for k in range(codes.shape[0])])[0]
        with codecrt.Context(m, device="cpu", **stream_args) as ctx:
            got = stream_decode(ctx, codes, pushes)
    return want, got


def staggered_and_offline(codecrt: Any, gguf: Any, codes: Sequence[np.ndarray],
                          starts: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``staggered_streams`` of codes[i] ([K_i, T_i]) and each one's offline decode, in one CPU
    context of the model at ``gguf``: (streamed, offline)."""
    with codecrt.Model(str(gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        wants = [ctx.decode([c[k:k + 1] for k in range(c.shape[0])])[0] for c in codes]
        gots = staggered_streams(ctx, codes, starts)
    return gots, wants


def random_push_streams(ctx: Any, utter: Sequence[Sequence[np.ndarray]], rng: np.random.Generator,
                        most: int = 8) -> list[np.ndarray]:
    """One stream per utterance (a list of per-level code arrays), stepped together, each fed
    1..most frames at random per step until its end: each one's audio."""
    streams = [ctx.stream() for _ in utter]
    fed = [0] * len(utter)
    out: list[list[np.ndarray]] = [[] for _ in utter]
    while not all(s.done for s in streams):
        for i, (s, u) in enumerate(zip(streams, utter)):
            n = len(u[0])
            if fed[i] < n:
                b = min(n, fed[i] + int(rng.integers(1, most + 1)))
                s.push([x[fed[i]:b] for x in u])
                fed[i] = b
                if b == n:
                    s.finish()
        ctx.step([s for s in streams if not s.done])
        for i, s in enumerate(streams):
            out[i].append(s.pull())
    for s in streams:
        s.close()
    return [np.concatenate(o) for o in out]
