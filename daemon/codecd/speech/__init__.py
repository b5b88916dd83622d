"""Text in, speech out: an OpenAI-compatible speech endpoint over an upstream language model.

``codecd serve --http-port 8766 --upstream http://127.0.0.1:8080`` adds, beside the
websocket port, ``POST /v1/audio/speech``, ``GET /v1/models`` and ``GET /v1/audio/voices``
(:mod:`.app`). The Orpheus prompt and token parsing are :mod:`.prompt`, the upstream
client :mod:`.upstream`, the output encoders :mod:`.encode`. See docs/speech.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["start_speech"]


async def start_speech(server: Any, sock: Any = None) -> Any:
    """Start the speech front of a started :class:`codecd.server.Server`; returns it.

    The one hook the server calls (its ``close`` calls the front's ``close``)."""
    from .app import SpeechFront, SpeechSettings

    cfg = server.config
    assert server.pool is not None
    front = SpeechFront(
        SpeechSettings(host=cfg.host, port=cfg.http_port, upstream=cfg.upstream,
                       upstream_key=cfg.upstream_key or None, upstream_model=cfg.upstream_model,
                       upstream_timeout_s=cfg.upstream_timeout_s, auth_token=cfg.auth_token,
                       send_timeout_s=cfg.send_timeout_s, output_budget_s=cfg.output_budget_s,
                       max_duration_s=cfg.max_stream_duration_s),
        server.pool, server.specs, admit=server._admit_speech, release=server._release_speech,
        sock=sock)
    await front.start()
    return front
