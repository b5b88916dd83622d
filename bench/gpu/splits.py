"""The backend splits of SNAC stream tick graphs, as ggml's scheduler prints them.

    GGML_SCHED_DEBUG=1 python -m bench.gpu.splits --device cuda:0 --streams 8

A split is a run of graph nodes on one backend. Where ggml's scheduler starts a second split
on the same device (a split takes at most GGML_SCHED_MAX_SPLIT_INPUTS = 30 inputs), it copies
that split's inputs when it reaches it, after waiting for the device: a launch that should
return at once then waits for the first split's kernels. This prints, for the first ticks of N
streams (edge ticks: masked graph) and a steady tick, the scheduler's split lines (ggml's log,
on stderr) and the runtime's own count (codecrt_stats.graph_splits), with the host's parts of
each launch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=6)
    args = ap.parse_args()
    if not os.environ.get("GGML_SCHED_DEBUG"):
        print("GGML_SCHED_DEBUG is not set: ggml prints no split lines")

    import codecrt
    from codecd.config import build_demo_model

    codecrt.set_ggml_logging(True)
    path = build_demo_model(Path(tempfile.mkdtemp()) / "snac24.gguf", seed=1)
    rng = np.random.default_rng(0)
    n = args.streams
    with codecrt.Model(path) as model, codecrt.Context(
            model, device=args.device, max_batch=n, max_streams=n) as ctx:
        ss = [ctx.stream() for _ in range(n)]
        for s in ss:
            s.push([rng.integers(0, 4096, (args.ticks + 2) * 4 // st, dtype=np.int32)
                    for st in (4, 2, 1)])
        for t in range(args.ticks):
            print(f"--- tick {t}", flush=True)
            codecrt.step_begin(ctx, ss)
            codecrt.step_end(ctx)
            st = ctx.stats
            print(f"tick {t}: splits {st.graph_splits}, graphs built {st.graphs_built}, acquire "
                  f"{st.last_acquire_ms:.2f} ms, inputs {st.last_inputs_ms:.2f} ms, enqueue "
                  f"{st.last_enqueue_ms:.2f} ms, compute {st.last_compute_ms:.2f} ms", flush=True)
        for s in ss:
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
