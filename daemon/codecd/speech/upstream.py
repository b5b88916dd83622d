"""The upstream language model: a streamed OpenAI-compatible ``/v1/completions`` request.

:class:`Upstream` posts ``{"model", "prompt", "stream": true, ...}`` with its own bearer
key and timeout and yields the text of each ``data:`` event as it arrives (llama.cpp's
server, vLLM, SGLang, LM Studio all answer this). Failures raise :class:`UpstreamError`
with the code and the HTTP status the speech endpoint answers with (docs/speech.md):

================== ====== ============================================================
code               status when
================== ====== ============================================================
upstream_unreachable 502  connection refused, DNS failure, reset before an answer
upstream_timeout     504  no answer, or no data for ``timeout_s`` within the stream
upstream_status      502  the upstream answered with a non-2xx status
upstream_broken      502  the stream ended without ``[DONE]``/finish_reason, or held
                          malformed events
================== ====== ============================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["Upstream", "UpstreamError"]

logger = logging.getLogger(__name__)


class UpstreamError(Exception):
    """A failure of the upstream LM; ``code`` and ``status`` are what the client gets."""

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass
class Upstream:
    """Streams completions from ``url`` (the server's base URL, with or without ``/v1``)."""

    url: str
    model: str = "orpheus"
    api_key: str | None = None
    timeout_s: float = 30.0
    params: dict[str, Any] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/completions"):
            return base
        return base + ("/completions" if base.endswith("/v1") else "/v1/completions")

    async def open(self) -> None:
        if self._session is None:
            # no total limit: a long generation is fine while data keeps coming
            t = aiohttp.ClientTimeout(total=None, connect=self.timeout_s,
                                      sock_connect=self.timeout_s, sock_read=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=t, connector=aiohttp.TCPConnector(
                limit=0, enable_cleanup_closed=True))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(self, prompt: str, *, max_tokens: int, stop: tuple[str, ...],
                       request_id: str) -> AsyncIterator[str]:
        """Text pieces of the streamed completion of ``prompt``, in order."""
        await self.open()
        assert self._session is not None
        body = dict(self.params, model=self.model, prompt=prompt, stream=True,
                    max_tokens=max_tokens, stop=list(stop))
        headers = {"Accept": "text/event-stream", "X-Request-Id": request_id}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            async with self._session.post(self.endpoint, json=body, headers=headers) as r:
                if r.status // 100 != 2:
                    # an error body is read up to 4 KiB, whatever the upstream sends
                    text = (await r.content.read(4096)).decode("utf-8", errors="replace")[:300]
                    raise UpstreamError("upstream_status", 502,
                                        f"upstream answered HTTP {r.status}: {text.strip()}")
                finished = False
                async for line in _lines(r):
                    if not line.startswith("data:"):
                        continue  # comments, event:, id:, retry:
                    data = line[5:].strip()
                    if data == "[DONE]":
                        finished = True
                        break
                    try:
                        ev = json.loads(data)
                        choice = ev["choices"][0] if ev.get("choices") else {}
                        text = choice.get("text") or ""
                    except (ValueError, TypeError, KeyError, AttributeError) as e:
                        raise UpstreamError("upstream_broken", 502,
                                            f"malformed event from upstream: {data[:120]!r} "
                                            f"({e.__class__.__name__})") from None
                    if not isinstance(text, str):
                        raise UpstreamError("upstream_broken", 502,
                                            "malformed event from upstream: text is not a string")
                    if text:
                        yield text
                    if choice.get("finish_reason"):
                        finished = True
                if not finished:
                    raise UpstreamError("upstream_broken", 502,
                                        "the upstream stream ended before its last event")
        except UpstreamError:
            raise
        except asyncio.TimeoutError:
            raise UpstreamError("upstream_timeout", 504,
                                f"upstream sent nothing for {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as e:
            raise UpstreamError("upstream_unreachable", 502,
                                f"cannot connect to the upstream {self.endpoint}: {e.os_error}"
                                ) from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as e:
            raise UpstreamError("upstream_broken", 502,
                                f"the upstream connection broke: {e}") from None
        except aiohttp.ClientError as e:
            raise UpstreamError("upstream_unreachable", 502, f"upstream request failed: {e}"
                                ) from None


#: longest event-stream line taken from the upstream (a completion event is ~200 bytes)
MAX_LINE = 64 * 1024


async def _lines(r: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Lines of an event stream (CRLF, LF or CR ends), decoded as UTF-8; a line longer
    than :data:`MAX_LINE` is ``upstream_broken`` (the buffer never grows past it)."""
    buf = b""
    async for chunk in r.content.iter_any():
        buf += chunk
        if len(buf) > MAX_LINE and buf.find(b"\n", 0, MAX_LINE + 1) < 0:
            raise UpstreamError("upstream_broken", 502,
                                f"an upstream event line exceeds {MAX_LINE} bytes")
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line, buf = buf[:i], buf[i + 1:]
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", errors="replace")
