"""systemd integration: socket activation, readiness and stop notifications, the watchdog.

All of it is optional: without systemd's environment (``LISTEN_FDS``,
``NOTIFY_SOCKET``, ``WATCHDOG_USEC``) every function here does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

__all__ = ["systemd_listen_socket", "watchdog_interval_s", "sd_notify", "watchdog"]

logger = logging.getLogger(__name__)


def systemd_listen_socket() -> socket.socket | None:
    """The listening socket passed by systemd socket activation (fd 3), if any."""
    try:
        if int(os.environ.get("LISTEN_PID", "0")) != os.getpid():
            return None
        if int(os.environ.get("LISTEN_FDS", "0")) < 1:
            return None
    except ValueError:
        return None
    for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(k, None)  # not inherited by the worker processes
    s = socket.socket(fileno=3)
    s.setblocking(False)
    logger.info("using the socket passed by systemd (fd 3, %s)", s.getsockname())
    return s


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC, for this pid), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 2e6)
    except ValueError:
        return None


def sd_notify(state: str) -> bool:
    """Tell systemd ``state`` (``READY=1``, ``STOPPING=1``...) when NOTIFY_SOCKET is set."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), addr)
        return True
    except OSError as e:
        logger.warning("sd_notify(%s) failed: %s", state, e)
        return False


async def watchdog(interval: float, healthy: Callable[[], Awaitable[bool]],
                   status: Callable[[], str]) -> None:
    """WATCHDOG=1 every ``interval`` (half of WatchdogSec), from the event loop, and only
    while ``healthy()`` (the engine workers answer a probe): a wedged worker or loop stops
    the pings and systemd restarts the service."""
    while True:
        if await healthy():
            sd_notify(f"WATCHDOG=1\nSTATUS={status()}")
        else:
            logger.warning("watchdog: an engine worker did not answer; not pinging")
        await asyncio.sleep(interval)
