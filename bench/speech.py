"""Time to first audio of the speech endpoint over a paced Orpheus-token LM stand-in.

    python -m bench speech                       # demo model (full-size SNAC 24 kHz), CPU
    python -m bench speech --model m=path.gguf --n 1,8 --tokens-per-s 150 --device cuda:0

Starts a daemon in this process (``--http-port``, one worker on ``--device``) and an
OpenAI-compatible completions server that streams random valid Orpheus audio tokens, one
token per event at ``--tokens-per-s`` (82 tokens/s is real time: 7 tokens per 2048
samples at 24 kHz), and has N clients request ``pcm`` at once. Reported per N:

* ``LM first group``: request sent -> the LM stand-in wrote the 7th audio token (the
  first decodable group: the LM's share of the latency);
* ``ttfa``: request sent -> first audio bytes at the client;
* ``LM group need``: request sent -> the LM wrote the group whose samples first pass the
  decoder's look-ahead (``latency_samples``; SNAC 24 kHz exact mode: 4757 samples, the
  3rd group): the earliest any exact decoder can answer;
* ``ttfa - LM group need``: codecd's own share (parsing, the engine's tick and compute).
* real-time factor of the delivered audio (audio seconds / wall seconds per request).

Loopback only. Prints a markdown table; times in ms (p50 / max over the N requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path


import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))

from aiohttp import ClientSession, web  # noqa: E402

from codecd.config import Config, ModelSource  # noqa: E402
from codecd.server import Server  # noqa: E402

SR = 24000
BASE = 128256  # <custom_token_N> -> id N + 128256


class PacedLM:
    """Streams ``n_groups`` random Orpheus groups, one token per event, paced."""

    def __init__(self, tokens_per_s: float, n_groups: int) -> None:
        self.period = 1.0 / tokens_per_s
        self.n_groups = n_groups
        self.group_t: dict[str, list[float]] = {}  # request -> time each group was written
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        rid = request.headers.get("X-Request-Id", "")
        key = rid.split("#")[0]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        rng = np.random.default_rng()
        t_next = time.monotonic()
        for i in range(7 * self.n_groups):
            n = 10 + (i % 7) * 4096 + int(rng.integers(0, 4096))
            ev = {"choices": [{"index": 0, "text": f"<custom_token_{n}>", "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            if i % 7 == 6:
                self.group_t.setdefault(key, []).append(time.monotonic())
            t_next += self.period
            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
        await resp.write(b'data: {"choices":[{"text":"<custom_token_2>","finish_reason":"stop"}]}'
                         b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def one(url: str, i: int) -> tuple[str, float, float, int]:
    rid = f"bench-{i}"
    t0 = time.monotonic()
    first = 0.0
    n = 0
    async with ClientSession() as s:
        async with s.post(url, json={"model": "x", "input": "Hello.", "voice": "tara",
                                     "response_format": "pcm"},
                          headers={"X-Request-Id": rid}) as r:
            assert r.status == 200, await r.text()
            async for chunk in r.content.iter_any():
                if not first:
                    first = time.monotonic()
                n += len(chunk)
    return rid, t0, first, n


async def run(args: argparse.Namespace) -> None:
    name, _, src = args.model.partition("=")
    with tempfile.TemporaryDirectory() as tmp:
        lm = PacedLM(args.tokens_per_s, args.groups)
        await lm.start()
        cfg = Config(listen="127.0.0.1:0", models=[ModelSource(name, src)], devices=[args.device],
                     threads=args.threads, max_ahead_s=0.0, http_port=0,
                     upstream=f"http://127.0.0.1:{lm.port}/v1", cache_dir=args.cache_dir or tmp)
        srv = Server(cfg)
        await srv.start()
        url = f"http://127.0.0.1:{srv.speech.port}/v1/audio/speech"
        spec = srv.specs[name]
        per_group = spec.hop_length * max(spec.level_strides)
        # the group whose samples first pass the decoder's look-ahead
        need = spec.latency_samples // per_group + 1
        print(f"model {args.model}, device {args.device}, LM {args.tokens_per_s:g} tokens/s "
              f"({args.tokens_per_s / (7 * SR / 2048):.2f}x real time), {args.groups} groups "
              f"per request; look-ahead {spec.latency_samples} samples: the first audio needs "
              f"group {need}\n")
        print("| N | LM first group p50/max | LM group `need` p50/max | ttfa p50/max | "
              "ttfa - LM group `need` p50/max | RTF p50 |")
        print("|---|---|---|---|---|---|")
        try:
            await one(url, -1)  # warm
            for n in args.n:
                lm.group_t.clear()
                t_start = time.monotonic()
                res = await asyncio.gather(*(one(url, n * 1000 + i) for i in range(n)))
                lmf = np.array([lm.group_t[r][0] - t0 for r, t0, _, _ in res]) * 1e3
                lmn = np.array([lm.group_t[r][need - 1] - t0 for r, t0, _, _ in res]) * 1e3
                ttfa = np.array([f - t0 for _, t0, f, _ in res]) * 1e3
                over = ttfa - lmn
                wall = time.monotonic() - t_start
                rtf = np.median([b / 2 / SR / wall for *_, b in res])
                print(f"| {n} | {np.median(lmf):.0f} / {lmf.max():.0f} | {np.median(lmn):.0f} / "
                      f"{lmn.max():.0f} | {np.median(ttfa):.0f} / "
                      f"{ttfa.max():.0f} | {np.median(over):.0f} / {over.max():.0f} | "
                      f"{rtf:.2f} |")
        finally:
            await srv.close()
            assert lm.runner is not None
            await lm.runner.cleanup()


def main() -> int:
    p = argparse.ArgumentParser(prog=sys.argv[0], description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo=demo", help="NAME=SOURCE (default demo=demo)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    p.add_argument("--tokens-per-s", type=float, default=120.0)
    p.add_argument("--groups", type=int, default=40, help="groups per request (40: 3.4 s)")
    p.add_argument("--cache-dir", default=None, help="where the demo model is built")
    args = p.parse_args()
    asyncio.run(run(args))
    return 0



