"""The decode engine: supervised worker processes that own the native runtime.

::

    pool = EnginePool(EngineConfig(models={"snac": "snac_24khz.gguf"}),
                      devices=["cuda:0", "cuda:1"], on_event=handle)
    await pool.start()                  # every worker loaded and warmed up
    pool.open(key, "snac")              # least-loaded worker
    pool.push(key, [l0, l1, l2])        # -> Audio events as chunks complete
    pool.finish(key)                    # -> Audio..., then Done
    await pool.probe(1.0)               # watchdog: every running worker answered
    await pool.close()

Each device gets one :class:`Engine` (``supervisor.py``): a child process
(:mod:`codecd.worker`) that loads the models, creates their contexts, and runs
the tick loop. A ggml abort, a segfault or an allocator failure kills the
child, never the daemon: the engine sees the pipe close, fails every stream
that was on the worker with ``engine_restarted``, and starts a new worker (with
backoff). The process, its pipe and threads are ``process.py``; the streams an
engine has on its worker, ``streams.py``; placement over devices, ``pool.py``;
the configuration, ``config.py``; events and refusals, ``events.py``.

Events (delivered on the event loop, in order per stream, to ``on_event`` or
to :attr:`EnginePool.events`): :class:`Opened`, :class:`Audio`, :class:`Done`,
:class:`StreamError`. After ``Done`` or ``StreamError`` the key is gone; after
:meth:`EnginePool.cancel` no event comes for the key. Error codes are the
protocol's where one fits (``token_range``, ``broken_group``, ``busy``,
``backlog_exceeded``, ``unknown_model``, ``shutting_down``), else engine codes
(``engine_restarted``, ``engine_error``, ``out_of_memory``, ``bad_codes``,
``bad_state``).
"""

from __future__ import annotations

from .config import EngineConfig
from .events import (
    ENGINE_RESTARTED,
    SHUTTING_DOWN,
    Audio,
    BackpressureError,
    BusyError,
    Done,
    DuplicateStreamError,
    EngineError,
    EngineEvent,
    EngineStartError,
    Opened,
    StreamError,
    UnknownModelError,
    UnknownStreamError,
)
from .pool import EnginePool
from .process import child_env, child_pythonpath
from .supervisor import Engine

__all__ = [
    "EngineConfig", "Engine", "EnginePool", "Opened", "Audio", "Done", "StreamError",
    "EngineEvent", "EngineError", "EngineStartError", "BackpressureError", "BusyError",
    "UnknownModelError", "DuplicateStreamError", "UnknownStreamError",
    "ENGINE_RESTARTED", "SHUTTING_DOWN", "child_env", "child_pythonpath",
]
