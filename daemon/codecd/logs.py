"""The daemon's logging: plain text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

__all__ = ["JsonFormatter", "setup_logging"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields."""

    _std = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                             "logger": record.name, "msg": record.getMessage()}
        for k, v in record.__dict__.items():
            if k not in self._std and not k.startswith("_"):
                d[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False)


class _Front(logging.Filter):
    """Tags every record of a front process with its index (``front``)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.front = self.index
        return True


def setup_logging(fmt: str = "text", level: str = "info", front: int | None = None) -> None:
    """Log to stderr; a front process (``front``: its index) tags its records with it."""
    h = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        h.setFormatter(JsonFormatter())
    else:
        tag = "" if front is None else f" [front {front}]"
        h.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s"))
    if front is not None:
        h.addFilter(_Front(front))
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
    logging.getLogger("websockets").setLevel(max(logging.WARNING, root.level))
