"""Windowed streaming of WavTokenizer, NeuCodec and XCodec2: error against the offline decode, cost.

For each codec and window setting (chunk C, lookback L, lookahead A, overlap O; see
``codecd.families.windowed``), decodes the same random codes offline (one
``Context.decode``) and windowed (``windowed_decode``, the stream's output bit for bit)
and reports:

* the relative L2 error of the windowed output against the offline decode, and the
  worst 20 ms block's relative error;
* the latency (C + A frames of codes before the first audio) in ms;
* the cost: frames decoded per frame of output, and the wall / CPU time of the windowed
  decode (one stream, batch 1) against the audio's duration;
* with ``--streams S``: S streams stepped together (``codecrt.step``: windows batched)
  in x real time for all of them; with ``--torch`` too, the PyTorch reference decoder
  (``bench.vocos.torch_decoder``: outetts' WavTokenizer, the neucodec and xcodec2 packages,
  with their own seeded weights) doing the same S streams' pieces, the windows of one piece
  of all S streams as one batched call, in the same run.

Models are full-size random-weight ones (``codecd.convert.random_vocos``; ``--small`` for
the small test configs): the errors are those of random weights and random codes, a
relative comparison of the settings; real checkpoints attend more locally.

    python -m bench windowed [--kinds wavtokenizer-75,neucodec,xcodec2] [--seconds 6]
                             [--threads 2] [--streams 4] [--small] [--gguf MODEL.gguf ...]
                             [--device cpu|cuda:0] [--torch] [--precision f32|bf16]

``--precision bf16`` makes codecrt's contexts with BF16 products (AVX512-BF16 CPUs; what
the daemon's ``--model NAME:bf16=SOURCE`` gives a model); the error column is then against
the BF16 offline decode.

``--gguf`` measures converted checkpoints instead of random models (with random codes;
``--codes FILE.npy`` gives the codes of real speech, one 1-D array, used for every model).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for sub in ("daemon", "bindings"):
    if str(ROOT / sub) not in sys.path:
        sys.path.append(str(ROOT / sub))

#: (chunk, lookback, lookahead, overlap): NeuTTS' default first, then variations
SETTINGS = [(25, 50, 5, 1), (25, 25, 5, 1), (25, 0, 5, 1), (25, 50, 10, 1), (50, 50, 5, 1),
            (10, 50, 2, 1), (10, 25, 2, 1), (5, 25, 2, 1)]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def worst_block(a: np.ndarray, b: np.ndarray, block: int) -> float:
    n = (b.size // block) * block
    da = (a[:n] - b[:n]).reshape(-1, block)
    db = b[:n].reshape(-1, block)
    nb = np.linalg.norm(db, axis=1)
    ok = nb > 1e-3 * nb.max()
    return float((np.linalg.norm(da, axis=1)[ok] / nb[ok]).max())


def main(argv: list[str] | None = None) -> int:
    import codecrt

    from codecd.convert.random_vocos import write_random_vocos
    from codecd.families.windowed import WindowedStream, WindowParams, windowed_decode

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="wavtokenizer-75,neucodec,xcodec2")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--streams", type=int, default=0, help="also step this many streams together")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gguf", nargs="+", default=[], help="converted models to measure instead")
    ap.add_argument("--codes", help="a .npy file of codes to decode instead of random ones")
    ap.add_argument("--precision", default="f32", choices=("f32", "bf16", "bf16x3"),
                    help="codecrt's products (bf16: AVX512-BF16 CPUs only)")
    ap.add_argument("--torch", action="store_true",
                    help="with --streams: the PyTorch reference's windowed streams beside codecrt's")
    args = ap.parse_args(argv)

    what = "converted models" if args.gguf else \
        f"{'small' if args.small else 'full-size'} random-weight models"
    print(f"device {args.device}, {args.threads} threads, {args.precision} products, {args.seconds:g} s of "
          f"{'codes from ' + args.codes if args.codes else 'random codes'}, {what}\n")
    print("| codec | C/L/A/O | latency ms | rel L2 vs offline | worst 20 ms block | "
          "frames decoded per output frame | windowed wall s (CPU s) | x real time |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        models = [(Path(g).stem, Path(g)) for g in args.gguf] or [
            (kind, write_random_vocos(kind, Path(tmp) / f"{kind}.gguf", seed=args.seed,
                                      small=args.small)) for kind in args.kinds.split(",")]
        for kind, path in models:
            with codecrt.Model(str(path)) as m, \
                    codecrt.Context(m, device=args.device, n_threads=args.threads,
                                    precision=args.precision) as ctx:
                info = m.info
                fps = info.sample_rate / info.hop_length
                n = int(round(args.seconds * fps))
                if args.codes:
                    codes = np.load(args.codes).astype(np.int32).reshape(-1)[:n]
                    n = codes.size
                else:
                    codes = np.random.default_rng(args.seed).integers(
                        0, info.codebook_sizes[0], n).astype(np.int32)
                offline = ctx.decode([codes])
                # one window first, as the daemon's warm-up does (WindowedModel.warm): a CPU
                # context packs its weights for products of few rows at their first use, a
                # one-time cost that the first row would carry (a NeuCodec context on a Zen 3:
                # 0.8 to 1.9 s, mostly the first touch of the panels' 600 MB)
                ctx.decode([codes[:WindowParams().steady_frames]])
                block = info.sample_rate // 50
                for c, lb, la, o in SETTINGS:
                    p = WindowParams(c, lb, la, o)
                    frames = [0]

                    def dec(w: np.ndarray, frames: list[int] = frames) -> np.ndarray:
                        frames[0] += w.size
                        return ctx.decode([w])

                    t0, c0 = time.perf_counter(), time.process_time()
                    win = windowed_decode(dec, codes, info.hop_length, p)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    print(f"| {kind} | {c}/{lb}/{la}/{o} | {1000 * p.latency_frames / fps:.0f} | "
                          f"{rel(win, offline):.3g} | {worst_block(win, offline, block):.3g} | "
                          f"{frames[0] / n:.2f} | {wall:.2f} ({cpu:.2f}) | "
                          f"{n / fps / wall:.2f} |", flush=True)
                if args.streams:
                    p = WindowParams()
                    streams = [WindowedStream(ctx, p) for _ in range(args.streams)]
                    t0 = time.perf_counter()
                    for s in streams:
                        s.push([codes])
                        s.finish()
                    while codecrt.step(ctx, streams).stepped:
                        pass
                    wall = time.perf_counter() - t0
                    print(f"| {kind} | {args.streams} streams, 25/50/5/1 batched | | | | | "
                          f"{wall:.2f} | {args.streams * n / fps / wall:.2f} (all streams) |",
                          flush=True)
                    if args.torch:
                        torch_streams(kind, args, codes, info.hop_length, n / fps)
    return 0


def torch_streams(kind: str, args: argparse.Namespace, codes: np.ndarray, hop: int,
                  seconds: float) -> None:
    """The reference decoder doing ``args.streams`` streams' windowed decode (NeuTTS' window),
    each piece's windows of all streams in one batched call; a row of x real time in total."""
    from bench.vocos import torch_decoder
    from codecd.families.windowed import WindowParams, windowed_decode

    try:
        ref = torch_decoder(kind, args.device, args.threads)
    except (ImportError, AttributeError, RuntimeError) as e:  # a package that does not import
        ref, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "torch or the reference package is not installed"
    if ref is None:
        print(f"| {kind} | {args.streams} streams, PyTorch reference | unavailable: {why} |",
              flush=True)
        return
    decode, sync = ref
    S = args.streams

    def dec(w: np.ndarray) -> np.ndarray:
        out = decode(np.repeat(w[None], S, axis=0))  # the same piece of every stream, one call
        sync()
        pcm = out.detach().float().cpu().numpy().reshape(S, -1)[0]
        want = w.size * hop  # the reference's length (equal here) fitted to the definition's
        return np.pad(pcm, (0, max(0, want - pcm.size)))[:want]

    windowed_decode(dec, codes[: min(codes.size, 40)], hop, WindowParams())  # warm
    t0, c0 = time.perf_counter(), time.process_time()
    windowed_decode(dec, codes, hop, WindowParams())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"| {kind} | {S} streams, 25/50/5/1, PyTorch reference, windows batched | | | | | "
          f"{wall:.2f} ({cpu:.2f}) | {S * seconds / wall:.2f} (all streams) |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
