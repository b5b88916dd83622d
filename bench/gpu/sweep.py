"""Shape sweep on a GPU: every graph kind of every codec at lengths up to 300 s (issue 24).

    python -m bench sweep [--device cuda:0] [--seconds 1,2.7,10,30,60,300] [--batches 1,16,64]
                          [--codecs snac24,snac32,snac44,s3gen,s3gen_turbo] [--budget-s 420]

For each codec, length and batch: decode offline on the GPU (no abort is the
first result), compare the first sequence with the same decode on the CPU
(relative L2; the documented GPU tolerance is 2e-3 with TF32, ggml's default),
and compare the GPU decode with the same decode in finer pieces on the GPU
(CODECRT_PIECE_ELEMENTS lowered: other piece boundaries, same samples up to
float rounding). Streams (SNAC: the stream and edge graphs; S3Gen: FlowStream)
are run at the shorter lengths and compared with the offline GPU decode. A
request the runtime refuses prints its typed error: that is a result too, as
long as the process lives. Random weights (tests/reference.py,
codecd.convert.random_s3gen). Prints one table row per case as it goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reference  # noqa: E402


def rel_l2(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def snac_gguf(name: str, root: Path) -> Path:
    from codecd.convert import convert

    cfg = reference.CONFIGS[name]
    out = root / f"snac_{name}.gguf"
    if not out.exists():
        model = reference.build_reference_snac(cfg, 11)
        convert(reference.save_released_layout(model, cfg, root / f"snac_{name}"), out, progress=False)
    return out


def s3_gguf(turbo: bool, root: Path) -> Path:
    from codecd.convert.random_s3gen import write_random_s3gen

    out = root / ("s3_turbo.gguf" if turbo else "s3_orig.gguf")
    if not out.exists():
        write_random_s3gen(out, meanflow=turbo, seed=2)
    return out


class Env:
    """Runtime test variables for the contexts created inside the block."""

    def __init__(self, **values: str) -> None:
        self.values = values
        self.old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        self.old = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def sweep_snac(codecrt, gguf: Path, label: str, args, deadline: float) -> None:
    rng = np.random.default_rng(1)
    with codecrt.Model(str(gguf)) as m, codecrt.Context(m, device=args.device) as gpu, \
            codecrt.Context(m, device="cpu") as cpu:
        info = m.info
        for secs in args.seconds:
            n = int(secs * info.sample_rate / info.hop_length)
            n = max(info.frame_multiple, n - n % info.frame_multiple)
            for b in args.batches:
                if time.monotonic() > deadline:
                    row(label, "offline", secs, b, "skipped: time budget", "", "", "")
                    continue
                levels = reference.random_codes(info, n, b, rng)
                t0 = time.perf_counter()
                try:
                    y = gpu.decode(levels, noise=True, seed=3)
                except codecrt.CodecrtError as e:
                    row(label, "offline", secs, b, f"refused: {type(e).__name__}: {e}", "", "", "")
                    continue
                dt = time.perf_counter() - t0
                computes = gpu.stats.computes
                first = [lv[0] for lv in levels]
                e_cpu = ""
                if secs <= 30:
                    e_cpu = f"{rel_l2(y[0], cpu.decode(first, noise=True, seed=3)):.1e}"
                with Env(CODECRT_PIECE_ELEMENTS=str(1 << 24)), codecrt.Context(m, device=args.device) as fine:
                    z = fine.decode(levels, noise=True, seed=3)
                    k = fine.stats.computes
                e_pieces = f"{rel_l2(z, y):.1e} ({k} graphs)"
                row(label, "offline", secs, b, f"ok {dt:.2f} s ({secs * b / dt:.0f}x RT)", e_cpu, e_pieces,
                    f"{np.isfinite(y).all()}")
                del computes
        # the stream and edge graphs: streams of every length to 30 s, and 300 s for one stream
        for secs, b, chunk in [(2.7, 64, 4), (30, 16, 16), (300, 1, 64)]:
            if time.monotonic() > deadline:
                row(label, f"stream (chunk {chunk})", secs, b, "skipped: time budget", "", "", "")
                continue
            n = int(secs * info.sample_rate / info.hop_length)
            n = max(info.frame_multiple, n - n % info.frame_multiple)
            levels = reference.random_codes(info, n, b, rng)
            try:
                with codecrt.Context(m, device=args.device, stream_chunk_frames=max(chunk, info.frame_multiple),
                                     max_streams=b, batch_bucket=True) as sctx:
                    ss = [sctx.stream(noise=True, seed=i) for i in range(b)]
                    for i, s in enumerate(ss):
                        s.push([lv[i] for lv in levels])
                        s.finish()
                    t0 = time.perf_counter()
                    outs: list[list[np.ndarray]] = [[] for _ in ss]
                    while not all(s.done for s in ss):
                        sctx.step(ss)
                        for i, s in enumerate(ss):
                            outs[i].append(s.pull())
                    dt = time.perf_counter() - t0
                    for s in ss:
                        s.close()
                got = np.stack([np.concatenate(o) for o in outs])
                want = gpu.decode(levels, noise=True, seed=0) if b == 1 else None
                if want is not None:
                    e = rel_l2(got[0], want)
                else:
                    e = rel_l2(got[0], gpu.decode([lv[0] for lv in levels], noise=True, seed=0))
                row(label, f"stream (chunk {chunk})", secs, b, f"ok {dt:.2f} s", "", f"vs offline {e:.1e}",
                    f"{np.isfinite(got).all()}")
            except codecrt.CodecrtError as e:
                row(label, f"stream (chunk {chunk})", secs, b, f"refused: {type(e).__name__}: {e}", "", "", "")


def sweep_s3gen(codecrt, gguf: Path, label: str, args, deadline: float) -> None:
    rng = np.random.default_rng(2)
    with codecrt.Model(str(gguf)) as m, codecrt.Context(m, device=args.device) as gpu, \
            codecrt.Context(m, device="cpu") as cpu:
        voice = codecrt.Voice(m, rng.integers(0, 6561, 75), rng.normal(-4, 2, (150, 80)).astype(np.float32),
                              rng.normal(0, 1, 192).astype(np.float32))
        for secs in args.seconds:
            n = max(4, int(secs * 25))
            for b in args.batches:
                if time.monotonic() > deadline:
                    row(label, "offline", secs, b, "skipped: time budget", "", "", "")
                    continue
                tokens = rng.integers(0, 6561, (b, n)).astype(np.int32)
                t0 = time.perf_counter()
                try:
                    y = gpu.decode([tokens], voice=voice, seed=4)
                except codecrt.CodecrtError as e:
                    row(label, "offline", secs, b, f"refused: {type(e).__name__}: {e}", "", "", "")
                    continue
                dt = time.perf_counter() - t0
                e_cpu = ""
                if b == 1 and secs <= 10:
                    e_cpu = f"{rel_l2(y[0], cpu.decode([tokens[:1]], voice=voice, seed=4)[0]):.1e}"
                row(label, "offline", secs, b, f"ok {dt:.2f} s ({secs * b / dt:.0f}x RT)", e_cpu, "",
                    f"{np.isfinite(y).all()}")
        for secs in [s for s in args.seconds if s <= 60]:
            if time.monotonic() > deadline:
                row(label, "FlowStream", secs, 1, "skipped: time budget", "", "", "")
                continue
            tokens = rng.integers(0, 6561, max(4, int(secs * 25))).astype(np.int32)
            try:
                t0 = time.perf_counter()
                fs = codecrt.FlowStream(gpu, voice, seed=8, first_chunk=10, chunk=25)
                fs.push(tokens)
                fs.finish()
                got = fs.decode_all()
                dt = time.perf_counter() - t0
                row(label, "FlowStream", secs, 1, f"ok {dt:.2f} s", "", "", f"{np.isfinite(got).all()}")
            except codecrt.CodecrtError as e:
                row(label, "FlowStream", secs, 1, f"refused: {type(e).__name__}: {e}", "", "", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seconds", default="1,2.7,10,30,60,300")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--codecs", default="snac24,snac32,snac44,s3gen,s3gen_turbo")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this long")
    ap.add_argument("--work", default="/tmp/codecd-sweep")
    args = ap.parse_args()
    args.seconds = [float(s) for s in args.seconds.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    import codecrt

    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    print(f"# shape sweep on {args.device}, codecrt {codecrt.version()}, {time.strftime('%Y-%m-%d %H:%M UTC')}")
    print("| codec | graph | seconds | batch | result | first sequence vs CPU (rel L2) "
          "| vs finer pieces on the GPU (rel L2) | finite |")
    print("|---|---|---|---|---|---|---|---|")
    for c in args.codecs.split(","):
        if c.startswith("snac"):
            name = {"snac24": "24khz", "snac32": "32khz", "snac44": "44khz"}[c]
            sweep_snac(codecrt, snac_gguf(name, root), f"SNAC {name}", args, deadline)
        elif c in ("s3gen", "s3gen_turbo"):
            sweep_s3gen(codecrt, s3_gguf(c == "s3gen_turbo", root), "S3Gen " + ("Turbo" if "turbo" in c else
                                                                               "original"), args, deadline)
        else:
            raise SystemExit(f"unknown codec {c}")
    print("# done: no abort")


if __name__ == "__main__":
    main()
