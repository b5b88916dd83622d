"""EnginePool: engines on several devices; a stream goes to the least-loaded serving one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy.typing as npt

from .config import EngineConfig
from .events import (
    BusyError,
    Done,
    DuplicateStreamError,
    EngineError,
    EngineEvent,
    StreamError,
    UnknownModelError,
    UnknownStreamError,
)
from .supervisor import Engine

__all__ = ["EnginePool"]


class EnginePool:
    """Engines on several devices; streams are placed on the least-loaded serving one.

    Events go to ``on_event`` (called on the event loop, must not block) or, when it is
    None, to the :attr:`events` queue.
    """

    def __init__(self, config: EngineConfig, devices: Sequence[str] = ("auto",),
                 on_event: Callable[[EngineEvent], object] | None = None) -> None:
        if not devices:
            raise ValueError("EnginePool needs at least one device")
        self.config = config
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._cb = on_event
        self.engines = [Engine(config, d, i, self._deliver) for i, d in enumerate(devices)]
        self._where: dict[Hashable, Engine] = {}
        self._rr = 0

    def _deliver(self, ev: EngineEvent) -> None:
        if isinstance(ev, (Done, StreamError)):
            self._where.pop(ev.key, None)
        if self._cb is not None:
            self._cb(ev)
        else:
            self.events.put_nowait(ev)

    async def start(self) -> None:
        """Start every worker; returns when all are ready (raises if one cannot start)."""
        results = await asyncio.gather(*(e.start() for e in self.engines), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        """Model name -> info (sample rate, levels, strides, chunk, latency) of a serving worker."""
        for e in self.engines:
            if e.info:
                return dict(e.info.get("models", {}))
        return {}

    def open(self, key: Hashable, model: str, *, noise: bool = False,
             seed: int | None = 0, latency: str = "exact", voice: str | None = None,
             options: Mapping[str, Any] | None = None) -> int:
        """Open a stream on the least-loaded serving worker; returns the worker's index."""
        if key in self._where:
            raise DuplicateStreamError(f"stream {key!r} is already open")
        if model not in self.config.models:
            raise UnknownModelError(f"model {model!r} is not loaded")
        n = len(self.engines)
        order = [self.engines[(self._rr + i) % n] for i in range(n)]
        cands = [e for e in order if e.serving and e.streams_of(model) < self.config.max_streams]
        if not cands:
            raise BusyError(f"no decode worker can take a {model!r} stream now (all busy or "
                            "restarting)")
        self._rr = (self._rr + 1) % n
        last: EngineError | None = None
        for e in sorted(cands, key=lambda e: e.n_streams):  # stable: round robin among ties
            try:
                e.open(key, model, noise=noise, seed=seed, latency=latency, voice=voice,
                       options=options)
            except BusyError as err:
                last = err
                continue
            self._where[key] = e
            return e.index
        assert last is not None
        raise last

    def _engine(self, key: Hashable) -> Engine:
        e = self._where.get(key)
        if e is None:
            raise UnknownStreamError(f"no open stream {key!r}")
        return e

    def push(self, key: Hashable, levels: Sequence[npt.ArrayLike]) -> None:
        self._engine(key).push(key, levels)

    def finish(self, key: Hashable) -> None:
        self._engine(key).finish(key)

    def cancel(self, key: Hashable) -> None:
        """Drop the stream now (no event follows); a no-op for a key already gone."""
        e = self._where.pop(key, None)
        if e is not None:
            e.cancel(key)

    def worker_of(self, key: Hashable) -> int | None:
        e = self._where.get(key)
        return e.index if e is not None else None

    async def probe(self, timeout: float = 1.0) -> bool:
        """Watchdog health: every serving worker answered within ``timeout``, and at least
        one is serving. A restarting worker is the supervisor's business, not a failure;
        a wedged one is killed (then restarted) and makes this probe False."""
        serving = [e for e in self.engines if e.serving]
        if not serving:
            return False
        ok = await asyncio.gather(*(e.probe(timeout) for e in serving))
        return all(ok)

    async def fetch_stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """:meth:`stats` after a fresh stats query to every serving worker."""
        await asyncio.gather(*(e.fetch_stats(timeout) for e in self.engines if e.serving),
                             return_exceptions=True)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Parent-side metrics per worker (restarts, streams, queue) and the last worker stats."""
        return {"workers": [e.stats() for e in self.engines],
                "restarts": sum(e.restarts for e in self.engines),
                "streams": len(self._where),
                "serving": sum(1 for e in self.engines if e.serving)}

    async def close(self) -> None:
        """Stop every worker (open streams fail with ``shutting_down``)."""
        await asyncio.gather(*(e.close() for e in self.engines), return_exceptions=True)
        self._where.clear()
