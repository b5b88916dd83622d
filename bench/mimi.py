"""Mimi and Qwen3-TTS 12 Hz tokenizer streams: frame-by-frame cost, and real-time capacity (issue 20).

    python -m bench mimi [--codec mimi|qwen3] [--device cpu|cuda:0] [--threads N] [--codebooks 8]
                         [--streams 1,2,4,8] [--seconds 10] [--frames-seconds S]
                         [--max-batch 100] [--max-row-s 60] [--dtype f32|f16] [--no-moshi]

The full-size Mimi decoder with seeded random weights (``codecd.convert.random_mimi``,
kyutai/mimi's layout through the real converter; no checkpoint, no torch needed),
decoded by codecrt. Prints markdown tables:

  * frame by frame: one stream, one frame (1,920 samples, 80 ms) pushed per tick, wall
    ms per frame (median, p99, mean) and process CPU ms per frame; on the CPU, when
    ``moshi`` is importable, moshi's own streaming decode (``with mimi.streaming(1):
    mimi.decode(codes[:, :, t:t + 1])``) of the same weights and codes, measured the same
    way in the same run, and the difference of the two outputs;
  * capacity: for each N of --streams, N streams on one context, one frame each per tick:
    the tick (push N frames in one ``push_many``, ``ctx.step`` per group of at most --max-batch streams, one graph
    each, pull N frames in one ``pull_many``, as the daemon worker does) and the steps alone, median and p99, against the 80 ms frame period;
    the largest N whose p99 tick stays under it is the real-time capacity; runtime state per
    stream (``ctx.stats.state_bytes / N``; the pool holds N + 1 slots).

On a GPU (``--device cuda:0``) the path is the same apart from the device string, and
neither torch, moshi nor transformers is imported.

``--codec qwen3`` (``python -m bench qwen3``): the same tables for the Qwen3-TTS 12 Hz
tokenizer's decoder at its released size (``codecd.convert.random_qwen3``), 16 codebooks
by default; qwen-tts has no streaming decoder, so there is no reference row.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: samples per Mimi frame at 24 kHz (12.5 Hz) and the frame period
FRAME_SAMPLES = 1920
PERIOD_MS = 80.0
#: per codec: the random full-size model's writer, its codebooks and the default count, and its
#: decoder compute per second of audio (Mimi: moshi's decoder at 8 codebooks, the project's research
#: notes; Qwen3: the multiply-adds of the released sizes counted layer by layer, 2.48 G per frame,
#: 84 % of them in the decoder's residual units)
CODECS: dict[str, dict[str, Any]] = {
    "mimi": {"title": "Mimi", "writer": "codecd.convert.random_mimi:write_random_mimi", "levels": 32,
             "default_k": 8, "gflop_per_s": 5.39},
    "qwen3": {"title": "Qwen3-TTS 12 Hz tokenizer", "writer": "codecd.convert.random_qwen3:write_random_qwen3",
              "levels": 16, "default_k": 16, "gflop_per_s": 62.0},
}
WARMUP_TICKS = 4


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine(device: str) -> str:
    """A short description of the machine: the GPU's name on a GPU, else the CPU's model and cores."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} CPUs"
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        idx = device.split(":", 1)[1] if ":" in device else "0"
        try:
            gpu = subprocess.run(["nvidia-smi", "-i", idx, "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            if gpu.returncode == 0 and gpu.stdout.strip():
                desc = f"{gpu.stdout.strip()}; host {desc}"
        except (OSError, subprocess.SubprocessError):
            pass
    return desc


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def ms(a: list[float], q: float) -> float:
    return 1000.0 * float(np.percentile(a, q))


# --------------------------------------------------------------- frame by frame


def codecrt_frames(codecrt: Any, model: Any, args: argparse.Namespace, codes: np.ndarray) -> dict[str, Any]:
    """One stream, one frame pushed and decoded per tick: wall time per frame and the audio."""
    K, T = codes.shape
    with codecrt.Context(model, device=args.device, n_threads=args.threads, stream_chunk_frames=1,
                         max_streams=1, max_batch=1) as ctx:
        s = ctx.stream()
        out, times = [], []
        c0 = 0.0
        for t in range(T):
            if t == WARMUP_TICKS:
                c0 = cpu_s()
            t0 = time.perf_counter()
            s.push([codes[k, t:t + 1] for k in range(K)])
            ctx.step([s])
            out.append(s.pull())
            times.append(time.perf_counter() - t0)
        cpu = cpu_s() - c0
        backends = ctx.stats.backends
        s.close()
    audio = np.concatenate(out)
    return {"times": times[WARMUP_TICKS:], "cpu": cpu / (T - WARMUP_TICKS), "audio": audio, "backends": backends}


def moshi_frames(args: argparse.Namespace, sd: dict[str, np.ndarray], codes: np.ndarray) -> dict[str, Any] | None:
    """moshi's own streaming decode of the same weights and codes, frame by frame (CPU only)."""
    try:
        import torch
        from moshi.models import loaders
    except ImportError as e:
        print(f"\n(moshi not importable: {e}; no reference row)")
        return None
    sys.path.insert(0, str(ROOT / "tests"))
    # the layout mapping of transformers' conversion script (tests/references/mimi.py)
    ref = importlib.import_module("references.mimi")

    from codecd.convert.random_mimi import CONFIGS

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mimi = loaders.get_mimi(None, device="cpu", num_codebooks=codes.shape[0])
    moshi_sd = ref.hf_to_moshi_state({k: torch.from_numpy(v) for k, v in sd.items()}, CONFIGS["mimi"])
    missing, unexpected = mimi.load_state_dict(moshi_sd, strict=False)
    decoder_side = ("decoder.", "decoder_transformer.", "upsample.", "quantizer.rvq_first.vq.",
                    "quantizer.rvq_rest.vq.", "quantizer.rvq_first.output_proj", "quantizer.rvq_rest.output_proj")
    bad = [k for k in missing if k.startswith(decoder_side)]
    if unexpected or bad:
        raise RuntimeError(f"moshi's Mimi does not take the random weights: missing {bad[:5]}, "
                           f"unexpected {list(unexpected)[:5]}")
    ref._drop_codebook_caches(mimi)
    mimi.eval()
    x = torch.from_numpy(codes.astype(np.int64))[None]
    K, T = codes.shape
    out, times = [], []
    c0 = 0.0
    with torch.inference_mode(), mimi.streaming(1):
        for t in range(T):
            if t == WARMUP_TICKS:
                c0 = cpu_s()
            t0 = time.perf_counter()
            y = mimi.decode(x[:, :, t:t + 1])
            out.append(y[0, 0].float().numpy())
            times.append(time.perf_counter() - t0)
    cpu = cpu_s() - c0
    import moshi

    return {"times": times[WARMUP_TICKS:], "cpu": cpu / (T - WARMUP_TICKS), "audio": np.concatenate(out),
            "version": f"moshi {getattr(moshi, '__version__', '?')}, torch {torch.__version__}"}


# --------------------------------------------------------------------- capacity


def groups_of(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in ceil(len / size) groups of near-equal sizes (at most ``size`` each)."""
    g = -(-len(items) // size)
    q, r = divmod(len(items), g)
    out, i = [], 0
    for j in range(g):
        n = q + (1 if j < r else 0)
        out.append(items[i:i + n])
        i += n
    return out


def capacity_row(codecrt: Any, model: Any, args: argparse.Namespace, n: int, n_ticks: int,
                 rng: np.random.Generator) -> dict[str, Any]:
    """N streams on one context, one frame each per tick: push, one ``ctx.step`` per group of at most
    ``--max-batch`` streams (one graph each), pull. Tick and step times, state."""
    K = args.codebooks
    total = WARMUP_TICKS + n_ticks
    codes = rng.integers(0, 2048, (n, K, total)).astype(np.int32)
    batch = min(n, args.max_batch)
    while True:
        ctx = codecrt.Context(model, device=args.device, n_threads=args.threads, stream_chunk_frames=1,
                              max_streams=n, max_batch=batch)
        try:
            ss = [ctx.stream() for _ in range(n)]
            break
        except codecrt.TooLargeError as e:
            ctx.close()
            if batch == 1:
                raise
            print(f"(runtime: {e}; trying max_batch {batch * 3 // 4})")
            batch = max(1, batch * 3 // 4)
    ticks, steps, host, cpus = [], [], [], []
    n_levels = np.full(n, K, dtype=np.uint32)           # (N,) every stream sends K codebooks
    lengths = np.ones(n * K, dtype=np.uint32)           # (N*K,) one frame per codebook
    pcm = np.empty(n * FRAME_SAMPLES, dtype=np.float32)  # (N*1920,) one frame per stream
    try:
        groups = groups_of(ss, batch)
        t_row = time.perf_counter()
        for t in range(total):
            c0 = cpu_s()
            t0 = time.perf_counter()
            # the daemon's path: one packed push and one pull for all N streams
            errors = codecrt.push_many(ss, n_levels, lengths, np.ascontiguousarray(codes[:, :, t]).ravel())
            if errors:
                raise RuntimeError(f"tick {t}: push failed: {next(iter(errors.values()))}")
            t1 = time.perf_counter()
            advanced = sum(ctx.step(g) for g in groups)
            t2 = time.perf_counter()
            counts, _ = codecrt.pull_many(ss, pcm)
            if (counts != FRAME_SAMPLES).any():
                raise RuntimeError(f"tick {t}: a stream gave other than {FRAME_SAMPLES} samples")
            t3 = time.perf_counter()
            if advanced != n:
                raise RuntimeError(f"tick {t}: {advanced} of {n} streams advanced")
            if t >= WARMUP_TICKS:
                ticks.append(t3 - t0)
                steps.append(t2 - t1)
                host.append((t1 - t0) + (t3 - t2))
                cpus.append(cpu_s() - c0)
                if len(ticks) >= 10 and time.perf_counter() - t_row > args.max_row_s:
                    break
        st = ctx.stats
        for s in ss:
            s.close()
    finally:
        ctx.close()
    return {"n": n, "ticks": ticks, "steps": steps, "host": host, "cpu": cpus, "state": st.state_bytes,
            "weights": st.weight_bytes, "graphs": len(groups), "batch": max(len(g) for g in groups)}


# ------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda:0, ... (codecrt's device string)")
    ap.add_argument("--threads", type=int, default=0, help="codecrt CPU threads, and torch's for moshi "
                    "(0: the runtime's default)")
    ap.add_argument("--codec", choices=tuple(CODECS), default="mimi")
    ap.add_argument("--codebooks", type=int, default=None,
                    help="codebooks per stream (Mimi 1..32, default 8 as Moshi; Qwen3 1..16, default 16)")
    ap.add_argument("--streams", default="1,2,4,8", help="stream counts of the capacity table")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="audio per measurement: frames = seconds x 12.5 (after 4 warm-up ticks)")
    ap.add_argument("--frames-seconds", type=float, default=None,
                    help="audio of the frame-by-frame table (default: --seconds)")
    ap.add_argument("--max-row-s", type=float, default=60.0,
                    help="cut a capacity row after this many wall seconds (at least 10 ticks)")
    ap.add_argument("--max-batch", type=int, default=1024,
                    help="streams per tick graph; N streams run as ceil(N / this) graphs (ctx.step calls) "
                         "per tick (lowered and retried if the runtime refuses it)")
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="the transformer's matrices")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-moshi", action="store_true", help="skip moshi's reference row")
    args = ap.parse_args()
    codec = CODECS[args.codec]
    if args.codebooks is None:
        args.codebooks = codec["default_k"]
    if not 1 <= args.codebooks <= codec["levels"]:
        ap.error(f"--codebooks must be in 1..{codec['levels']}")
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        ap.error("--streams: a comma-separated list of positive counts")

    import codecrt

    mod, fn = codec["writer"].split(":")
    write_random = getattr(importlib.import_module(mod), fn)
    gflop_per_s = codec["gflop_per_s"]

    on_cpu = args.device == "cpu"
    command = " ".join([sys.argv[0], *sys.argv[1:]])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {codec['title']}, full size, random weights (seed {args.seed}), {args.codebooks} codebooks, {args.dtype} · "
          f"{machine(args.device)} · device {args.device}, {args.threads or 'default'} threads · {stamp} · "
          f"`{command}`")
    print(f"codecrt {codecrt.version()}, Python {platform.python_version()}, load average at start {load()}")

    tmp = Path(tempfile.mkdtemp(prefix=f"codecd-{args.codec}-"))
    gguf = write_random(tmp / f"{args.codec}.gguf", seed=args.seed, dtype=args.dtype)
    model = codecrt.Model(str(gguf))
    try:
        info = model.info
        if info.hop_length != FRAME_SAMPLES or info.n_levels < args.codebooks:
            raise RuntimeError(f"unexpected model: hop {info.hop_length}, {info.n_levels} levels")
        rng = np.random.default_rng(args.seed)

        # ------------------------------------------------------- frame by frame
        fsec = args.frames_seconds if args.frames_seconds is not None else args.seconds
        n_frames = WARMUP_TICKS + max(10, round(fsec * 1000 / PERIOD_MS))
        codes = rng.integers(0, 2048, (args.codebooks, n_frames)).astype(np.int32)
        ours = codecrt_frames(codecrt, model, args, codes)
        theirs = None
        if on_cpu and not args.no_moshi and args.codec == "mimi":
            from codecd.convert.random_mimi import random_mimi_state_dict

            theirs = moshi_frames(args, random_mimi_state_dict(seed=args.seed), codes)
        print(f"\n## frame by frame: one stream, one frame (1,920 samples, {PERIOD_MS:.0f} ms) per tick, "
              f"{n_frames - WARMUP_TICKS} frames after {WARMUP_TICKS} warm-up")
        print(f"codecrt backends: {', '.join(ours['backends'])}")
        print("| decoder | ms per frame, median | p99 | mean | CPU ms per frame | x real time (median) |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = [("codecrt", ours)] + ([(f"moshi streaming ({theirs['version']})", theirs)] if theirs else [])
        for name, r in rows:
            med = ms(r["times"], 50)
            print(f"| {name} | {med:.1f} | {ms(r['times'], 99):.1f} | {1000 * float(np.mean(r['times'])):.1f} | "
                  f"{1000 * r['cpu']:.1f} | {PERIOD_MS / med:.1f} |")
        if theirs:
            # moshi's ring KV cache equals the exact window only within the first 250 steps (125 frames)
            m = min(len(ours["audio"]), len(theirs["audio"]), 120 * FRAME_SAMPLES)
            a, b = ours["audio"][:m].astype(np.float64), theirs["audio"][:m].astype(np.float64)
            rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
            print(f"\nsame weights and codes: codecrt against moshi over the first {m // FRAME_SAMPLES} frames: "
                  f"relative L2 {rel:.1e}, max |diff| {float(np.abs(a - b).max()):.1e}; "
                  f"moshi / codecrt per frame (median): "
                  f"{ms(theirs['times'], 50) / ms(ours['times'], 50):.1f}x")
        if not np.all(np.isfinite(ours["audio"])):
            raise RuntimeError("codecrt's audio is not finite")

        # ------------------------------------------------------------- capacity
        n_ticks = max(10, round(args.seconds * 1000 / PERIOD_MS))
        print(f"\n## capacity: N streams stepped together, one frame each per tick ({PERIOD_MS:.0f} ms of audio), "
              f"up to {n_ticks} ticks after {WARMUP_TICKS} warm-up")
        print("tick = push N frames (one push_many) + the ctx.step calls + pull N frames (one pull_many), as the daemon's worker does; step = the ctx.step calls "
              f"(one graph each of at most {args.max_batch} streams)")
        print("| streams | graphs per tick (batch) | ticks | tick median (ms) | tick p99 (ms) | step median (ms) | step p99 (ms) | "
              "push+pull median (ms) | CPU ms per tick (mean) | real time (tick p99 < 80 ms) | x real time (median) | "
              "achieved GFLOP/s | state per stream (MiB) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
        best_tick = best_step = 0
        weights = 0
        for n in counts:
            r = capacity_row(codecrt, model, args, n, n_ticks, rng)
            weights = r["weights"]
            tm, tp = ms(r["ticks"], 50), ms(r["ticks"], 99)
            sm, sp = ms(r["steps"], 50), ms(r["steps"], 99)
            ok = tp < PERIOD_MS
            if ok:
                best_tick = max(best_tick, n)
            if sp < PERIOD_MS:
                best_step = max(best_step, n)
            gflops = n * gflop_per_s * (PERIOD_MS / 1000) / (tm / 1000)
            print(f"| {n} | {r['graphs']} ({r['batch']}) | {len(r['ticks'])} | {tm:.1f} | {tp:.1f} | {sm:.1f} | {sp:.1f} | "
                  f"{ms(r['host'], 50):.1f} | {1000 * float(np.mean(r['cpu'])):.1f} | {'yes' if ok else 'no'} | {n * PERIOD_MS / tm:.1f} | "
                  f"{gflops:.0f} | {r['state'] / n / 2**20:.1f} |", flush=True)
        print(f"\nreal-time capacity (largest N tested with p99 tick < {PERIOD_MS:.0f} ms): {best_tick} streams; "
              f"by the step alone: {best_step}; "
              + (f"device weights {weights / 2**20:.0f} MiB; " if weights else "")
              + f"GFLOP/s counted at {gflop_per_s} GFLOP per audio second")
        print(f"load average at end {load()}")
    finally:
        model.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
