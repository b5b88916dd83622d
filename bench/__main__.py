"""``python -m bench SUITE [ARGS]``: run one benchmark suite (see ``python -m bench --help``)."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    module: str
    summary: str


SUITES: dict[str, Suite] = {
    "decode": Suite("bench.decode", "offline SNAC decode throughput, codecrt against PyTorch (CPU)"),
    "stream": Suite("bench.stream", "streaming latency, compute against offline, tick time, capacity"),
    "edges": Suite("bench.edges", "streams that start and end together: edge ticks against steady ones"),
    "threads": Suite("bench.threads", "threads per graph: a tick on one thread, on all, and as codecrt chooses"),
    "serve": Suite("bench.serve", "load test of codecd serve: N concurrent real-time streams"),
    "fronts": Suite("bench.fronts", "codecd serve --fronts F: the serve load through F front "
                    "processes, one worker"),
    "frames": Suite("bench.frames", "the websockets layer under a front: CPU per frame by event "
                    "loop and send pattern"),
    "session": Suite("bench.session", "codecd's own work per message in a front (session, "
                     "layout, s16), without sockets"),
    "worker": Suite("bench.worker", "the engine worker's tick: host work per stream by phase "
                    "against the runtime alone"),
    "speech": Suite("bench.speech", "speech endpoint: time to first audio over a paced LM stand-in"),
    "s3gen": Suite("bench.s3gen", "Chatterbox S3Gen throughput and first-chunk latency"),
    "vocos": Suite("bench.vocos", "WavTokenizer, NeuCodec, XCodec2, DAC offline, codecrt against PyTorch"),
    "windowed": Suite("bench.windowed", "WavTokenizer, NeuCodec, XCodec2 windowed streams: error, cost"),
    "gpu": Suite("bench.gpu.capacity", "GPU capacity: offline throughput and real-time streams"),
    "offline": Suite("bench.gpu.offline", "offline SNAC on a GPU, codecrt per graph layout against PyTorch "
                     "(issue 19)"),
    "sweep": Suite("bench.gpu.sweep", "GPU shape sweep: every graph kind up to 300 s (issue 24)"),
    "profile": Suite("bench.gpu.profile_tick", "CUDA kernel profile of one streaming tick"),
    "check": Suite("bench.gpu.stream_check", "GPU streamed against offline and against the CPU"),
    "mimi": Suite("bench.mimi", "Mimi streams: frame-by-frame cost (against moshi) and real-time capacity"),
    "qwen3": Suite("bench.qwen3", "Qwen3-TTS 12 Hz tokenizer streams: frame-by-frame cost and real-time "
                   "capacity"),
}


def usage() -> str:
    lines = ["usage: python -m bench SUITE [ARGS]   (python -m bench SUITE --help for its options)",
             "", "suites:"]
    lines += [f"  {name:<8} {s.summary}" for name, s in SUITES.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    suite = SUITES.get(name)
    if suite is None:
        print(f"unknown suite {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # The suite parses sys.argv itself; its usage line names the command that ran it.
    sys.argv = [f"python -m bench {name}", *rest]
    rc = importlib.import_module(suite.module).main()
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
