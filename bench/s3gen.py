"""Chatterbox S3Gen throughput and streaming latency: codecrt against the reference, same run.

    python -m bench s3gen [--threads 2] [--seconds 10] [--prompt 3] [--device cpu] [--repeat 1] [--streams K]
                       [--precisions f32,bf16] [--reference-bf16] [--reference-device cpu]
                       [--capacity 1,10,30] [--stagger 4] [--max-row-s 120] [--chunk-growth 2 --max-chunk 100]

Random seeded weights (tests/s3ref.py), the original model (10 Euler steps with
classifier-free guidance) and Turbo (mean flow, 2 steps). Prints, per model,
the wall time of the flow (tokens to mel) and of the vocoder (mel to PCM) and
the seconds of audio per second (x real time), for codecrt (in each precision
of --precisions: F32, and BF16 products where the CPU has AVX512-BF16) and for
the reference (chatterbox-tts, F32, torch with the same thread count; with
--reference-bf16 also its flow under torch.autocast to bfloat16, the vocoder
staying F32; on the torch device of --reference-device, cuda:0 for the GPU's
row, its inputs moved there and its outputs back to the host inside the timed
region, which ends with torch.cuda.synchronize; on a GPU one untimed warm-up
run first, as codecrt has); then the time to
first audio of a FlowStream (first chunk of 10 tokens plus 3 of lookahead),
counting compute only and compute plus the wait for 13 tokens at 25 Hz.
Needs the test extra and the chatterbox-tts reference (see .ci/run).

--capacity N1,N2,...: then, per model and precision, the real-time capacity
table (bench/s3gen_capacity.py): N FlowStreams stepped in ticks by
codecrt.step_flows, starting together and staggered over one chunk period, each
tick's wall time against the audio a chunk adds, and the time to first audio;
--chunk-growth F gives the streams growing chunks (FlowStream's chunk_growth).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import s3ref  # noqa: E402


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def time_streams(ctx, voice, tokens, k: int, batched: bool) -> float:
    """Wall time of k FlowStreams (one voice, seeds 0..k-1) decoding the same tokens in step."""
    import codecrt

    fss = [codecrt.FlowStream(ctx, voice, seed=i, first_chunk=10, chunk=25) for i in range(k)]
    for fs in fss:
        fs.push(tokens)
        fs.finish()
    t0 = time.perf_counter()
    while not all(fs.done for fs in fss):
        if batched:
            codecrt.step_flows(ctx, fss)
        else:
            for fs in fss:
                fs.step()
        for fs in fss:
            fs.pull()
    return time.perf_counter() - t0


def random_gguf(meanflow: bool) -> Path:
    import tempfile

    from codecd.convert.random_s3gen import write_random_s3gen

    path = Path(tempfile.gettempdir()) / f"codecd-bench-s3gen-{'turbo' if meanflow else 'orig'}.gguf"
    if not path.exists():
        write_random_s3gen(path, meanflow=meanflow, seed=1)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="audio to decode (25 tokens per second)")
    ap.add_argument("--prompt", type=float, default=3.0, help="voice prompt length in seconds")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--models", default="orig,turbo")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--reference-bf16", action="store_true",
                    help="also time the reference's flow under torch.autocast(bfloat16) on its device")
    ap.add_argument("--reference-device", default="cpu",
                    help="torch device of the reference and its inputs (e.g. cuda:0); its row reads "
                         "'reference torch DEVICE'")
    ap.add_argument("--precisions", default="f32,bf16",
                    help="codecrt product precisions to time (bf16 is skipped where the CPU lacks it)")
    ap.add_argument("--streams", type=int, default=0,
                    help="also time K FlowStreams in step: one by one, and batched by codecrt.step_flows")
    ap.add_argument("--capacity", default="",
                    help="stream counts of the real-time capacity table (e.g. 1,10,30,100); empty: none")
    ap.add_argument("--stagger", type=int, default=4,
                    help="capacity: also start the streams in G phases over one chunk period (<= 1: off)")
    ap.add_argument("--chunk-growth", type=float, default=1.0,
                    help="capacity: FlowStream's chunk_growth (> 1: later chunks grow by this factor, "
                         "tokens coming ahead of real time)")
    ap.add_argument("--max-chunk", type=int, default=0,
                    help="capacity: FlowStream's max_chunk with --chunk-growth (0: its default, 4 x chunk)")
    ap.add_argument("--max-row-s", type=float, default=120.0,
                    help="capacity: cut a row after this many wall seconds (at least 3 later chunks)")
    ap.add_argument("--random", action="store_true",
                    help="random GGUF from the checked-in layout (no chatterbox-tts; implies --no-reference)")
    args = ap.parse_args()
    if args.random:
        args.no_reference = True
    counts = sorted({int(x) for x in args.capacity.split(",") if x.strip()})
    if counts and counts[0] < 1:
        ap.error("--capacity: a comma-separated list of positive stream counts")

    import torch

    import codecrt

    from .s3gen_capacity import capacity, print_capacity

    torch.set_num_threads(args.threads)
    ref_dev = torch.device(args.reference_device)
    ref_label = f"reference torch {args.reference_device}"

    def ref_sync() -> None:
        if ref_dev.type == "cuda":
            torch.cuda.synchronize(ref_dev)

    def ref_timed(fn, repeat: int) -> tuple[float, object]:
        # the reference's outputs come back to the host (ref_mel, ref_wav), which waits for the
        # device; the synchronize makes the timed region's end explicit whatever ref_* returns
        def run():
            out = fn()
            ref_sync()
            return out
        if ref_dev.type != "cpu":
            run()  # warm-up: CUDA context, kernel loading, cuDNN/cuBLAS handles
        ref_sync()
        return timed(run, repeat)

    n_tok = int(round(args.seconds * 25))
    voice_data = s3ref.random_voice(1, int(round(args.prompt * 25)))
    tokens = np.random.default_rng(2).integers(0, 6561, n_tok).astype(np.int32)
    audio_s = n_tok * 960 / 24000
    rows = []
    ttfa = []
    streams: list[tuple[str, int, float, float]] = []
    errors: list[tuple[str, str, float, float]] = []
    skipped: list[str] = []
    cap_rows: dict[str, list] = {}
    cap_notes: dict[str, list[str]] = {}
    for name in args.models.split(","):
        meanflow = name == "turbo"
        model = codecrt.Model(random_gguf(meanflow) if args.random else s3ref.gguf(meanflow))
        voice = codecrt.Voice(model, **voice_data)
        steps = model.info.default_steps
        outputs = {}
        for prec in args.precisions.split(","):
            try:
                ctx = codecrt.Context(model, device=args.device, n_threads=args.threads, precision=prec)
            except codecrt.UnsupportedError as e:
                skipped.append(f"{name} {prec}: {e}")
                continue
            # warm-up: graph construction and reservation of these shapes
            mel = ctx.flow(tokens, voice, seed=1)
            ctx.vocode(mel, seed=1)
            t_flow, mel = timed(lambda c=ctx, v=voice: c.flow(tokens, v, seed=1), args.repeat)
            t_voc, pcm = timed(lambda c=ctx, x=mel: c.vocode(x, seed=1), args.repeat)
            outputs[prec] = (mel, pcm)
            rows.append((name, f"codecrt {ctx.device} {prec}", steps, t_flow, t_voc))
            # time to first audio of a stream: the first chunk's compute
            for _ in range(2):  # the second run is the warm one
                fs = codecrt.FlowStream(ctx, voice, seed=1, first_chunk=10, chunk=25)
                fs.push(tokens[:13])
                t0 = time.perf_counter()
                fs.step()
                first = fs.pull()
                dt = time.perf_counter() - t0
            ttfa.append((f"{name} {prec}", dt, first.size))
            if args.streams > 0:
                seq, bat = (time_streams(ctx, voice, tokens, args.streams, batched) for batched in (False, True))
                streams.append((f"{name} {prec}", args.streams, seq, bat))
            ctx.close()
            if counts:
                rows_, notes = capacity(codecrt, model, voice, name, prec, args, counts)
                cap_rows.setdefault(prec, []).extend(rows_)
                cap_notes.setdefault(prec, []).append(notes)
        if not args.no_reference:
            # s3ref's cached model (its GGUF was converted above, on the CPU), moved in place
            ref = s3ref.reference(meanflow).to(ref_dev)
            t_rflow, rmel = ref_timed(lambda r=ref, n=steps: s3ref.ref_mel(r, tokens, voice_data, 1, n),
                                      args.repeat)
            t_rvoc, rpcm = ref_timed(lambda r=ref, x=rmel: s3ref.ref_wav(r, x, 1), args.repeat)
            rows.append((name, ref_label, steps, t_rflow, t_rvoc))
            if args.reference_bf16:
                # the flow under autocast; the vocoder stays F32 (its iSTFT's
                # torch.complex does not take bfloat16)
                with torch.autocast(ref_dev.type, dtype=torch.bfloat16):
                    t_bflow, bmel = ref_timed(lambda r=ref, n=steps: s3ref.ref_mel(r, tokens, voice_data, 1, n),
                                              args.repeat)
                t_bvoc, bpcm = ref_timed(lambda r=ref, x=bmel: s3ref.ref_wav(r, x, 1), args.repeat)
                rows.append((name, "reference flow autocast", steps, t_bflow, t_bvoc))
                errors.append((name, "(reference flow autocast)", s3ref.rel_l2(bmel, rmel),
                               s3ref.rel_l2(bpcm[: rpcm.size], rpcm)))
            for prec, (mel, pcm) in outputs.items():
                errors.append((name, prec, s3ref.rel_l2(mel, rmel), s3ref.rel_l2(pcm[: rpcm.size], rpcm)))
        voice.close()
        model.close()

    print(f"# S3Gen, random weights, {audio_s:.1f} s of audio ({n_tok} tokens) after a {args.prompt:.1f} s prompt;"
          f" {args.threads} threads; {platform.machine()} {platform.processor() or ''}".rstrip())
    if not args.no_reference and ref_dev.type == "cuda":
        print(f"# reference: torch {torch.__version__} on {args.reference_device} "
              f"({torch.cuda.get_device_name(ref_dev)}), TF32 matmul {torch.backends.cuda.matmul.allow_tf32},"
              f" cuDNN TF32 {torch.backends.cudnn.allow_tf32}")
    print(f"{'model':<6} {'engine':<22} {'steps':>5} {'flow s':>8} {'hift s':>8} {'total s':>8} {'x RT':>7}")
    for name, eng, steps, tf, tv in rows:
        print(f"{name:<6} {eng:<22} {steps:>5} {tf:>8.2f} {tv:>8.2f} {tf + tv:>8.2f} {audio_s / (tf + tv):>7.2f}")
    if not args.no_reference:
        refs = {r[0]: r for r in rows if r[1] == ref_label}
        for ours in rows:
            theirs = refs.get(ours[0])
            if theirs is not None and ours is not theirs:
                print(f"{ours[0]}: {ours[1]} / reference speed = "
                      f"{(theirs[3] + theirs[4]) / (ours[3] + ours[4]):.2f}x")
        for name, prec, e_mel, e_pcm in errors:
            print(f"{name}: {'codecrt ' if not prec.startswith('(') else ''}{prec} vs reference: mel rel L2 {e_mel:.2e}, PCM rel L2 {e_pcm:.2e}")
    for line in skipped:
        print(f"skipped: {line}")
    print()
    print(f"{'model':<11} {'first chunk compute ms':>24} {'+ 13 tokens at 25 Hz ms':>26} {'first audio samples':>20}")
    for name, dt, n in ttfa:
        print(f"{name:<11} {dt * 1e3:>24.1f} {dt * 1e3 + 13 * 40:>26.1f} {n:>20}")
    if streams:
        print()
        print(f"{'model':<11} {'streams in step':>16} {'one by one s':>13} {'step_flows s':>13} {'speed-up':>9}")
        for name, k, seq, bat in streams:
            print(f"{name:<11} {k:>16} {seq:>13.2f} {bat:>13.2f} {seq / bat:>9.2f}")
    for prec, cap in cap_rows.items():
        print_capacity(cap, cap_notes[prec], codecrt, args, prec)


if __name__ == "__main__":
    main()
