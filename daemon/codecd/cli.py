"""The ``codecd`` command line.

Subcommands (one ``_cmd_<name>`` function and one ``_add_<name>`` parser
builder each; ``serve``, ``stream``, ``play`` and ``voice`` are reserved):

``codecd info MODEL``
    Print a GGUF model's info as the runtime sees it.
``codecd convert SRC -o DST [--dtype f32|f16] [--config CONFIG]``
    Convert a checkpoint (a folder with config.json + pytorch_model.bin, or a
    state-dict file with ``--config``) to GGUF.
``codecd decode --model M.gguf CODES -o out.wav``
    Decode codes to a WAV file. ``--model demo`` is the demo model (random weights,
    noise at about -20 dBFS, built once in the cache), and with it CODES may be left
    out: the built-in demo sequence (``codecd.demo``). CODES is one of:

    * ``.npz``: per-level arrays ``level0``, ``level1``, ... (1-D ``[T_l]``,
      or 2-D ``[B, T_l]`` for a batch), layout "levels";
    * ``.npy``: Orpheus interleaved codes (7 per group), 1-D ``[7k]`` or 2-D
      ``[B, 7k]``; layout "orpheus" (or "orpheus-ids" if they are raw LM token
      ids, which "auto" detects from values >= 128266);
    * anything else: a text file of Orpheus token ids, ``<custom_token_N>``
      strings or codes, separated by whitespace or commas.

    A batch writes one file per sequence: ``out.wav`` becomes ``out.0.wav``,
    ``out.1.wav``, ... WAV is 16-bit PCM (clipped to [-1, 1]) or, with
    ``--format f32``, 32-bit IEEE float.

``codecd stream`` / ``codecd play``
    Stream codes to a server (``--url``), write or play the audio. Without ``--url``,
    ``--model demo`` starts a daemon with the demo model in this process.
``codecd doctor``
    Print what a bug report needs (``codecd.doctor``).

Exit status: 0 on success, 2 for bad input (arguments, files, codes, configs),
1 for any other failure (runtime, I/O). Errors are printed as
``codecd: error: <message>``, never as a traceback (``CODECD_DEBUG=1`` shows one).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import wave
from pathlib import Path
from typing import Sequence

import numpy as np

from . import __version__
from .families import orpheus

PROG = "codecd"
RESERVED = ("stream", "play", "voice")  # serve: implemented (codecd.server)
DEMO = "demo"


class UsageError(Exception):
    """Bad input from the user: exit status 2."""


# ---------------------------------------------------------------- helpers


def _import_codecrt():
    try:
        import codecrt
    except ImportError as e:
        raise RuntimeError(f"the codecrt runtime is not available ({e}); build and install the bindings") from None
    return codecrt


def write_wav(path: str | os.PathLike, pcm: np.ndarray, sample_rate: int, fmt: str = "s16") -> None:
    """Write mono PCM: 16-bit integer (the daemon's rounding rule, ``codecd.audio.f32_to_s16``)
    with ``wave``, or 32-bit IEEE float."""
    from .audio import f32_to_s16

    x = np.asarray(pcm, dtype=np.float32).reshape(-1)
    if fmt == "s16":
        s = f32_to_s16(x).astype("<i2")
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(int(sample_rate))
            w.writeframes(s.tobytes())
        return
    if fmt != "f32":
        raise ValueError(f"unknown WAV format {fmt!r}")
    data = x.astype("<f4").tobytes()
    # WAVE_FORMAT_IEEE_FLOAT (3): fmt chunk with cbSize = 0, and the fact chunk non-PCM files carry
    fmt_chunk = struct.pack("<HHIIHHH", 3, 1, int(sample_rate), int(sample_rate) * 4, 4, 32, 0)
    fact = struct.pack("<I", x.size)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
            + b"fact" + struct.pack("<I", 4) + fact
            + b"data" + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b""))
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", len(body)) + body)


def _info_dict(info) -> dict:
    if isinstance(info, dict):
        return info
    keys = ("arch", "sample_rate", "hop_length", "n_levels", "codebook_sizes", "level_strides",
            "frame_multiple", "weight_type", "n_params", "weight_bytes")
    return {k: getattr(info, k) for k in keys if hasattr(info, k)}


def format_info(info, path: str = "") -> str:
    d = _info_dict(info)
    sr, hop = d["sample_rate"], d["hop_length"]
    lines = []
    if path:
        lines.append(f"model:          {path}")
    lines += [
        f"arch:           {d['arch']}",
        f"sample rate:    {sr} Hz",
        f"hop length:     {hop} samples per frame ({1000.0 * hop / sr:.2f} ms, {sr / hop:.2f} frames/s)",
        f"levels:         {d['n_levels']}",
    ]
    for i, (n, s) in enumerate(zip(d["codebook_sizes"], d["level_strides"])):
        lines.append(f"  level {i}:      codebook {n}, stride {s} frame{'s' if s != 1 else ''} "
                     f"({sr / (hop * s):.2f} codes/s)")
    lines += [
        f"frame multiple: {d['frame_multiple']}",
        f"weights:        {d['weight_type']}",
        f"parameters:     {d['n_params']:,}",
        f"weight bytes:   {d['weight_bytes']:,} ({d['weight_bytes'] / 2**20:.1f} MiB)",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ codes


def _takes_orpheus(info) -> bool:
    d = _info_dict(info)
    return orpheus.ORPHEUS.check(int(d.get("n_levels", 0)), tuple(d.get("codebook_sizes", ())),
                                 tuple(d.get("level_strides", ()))) is None


def load_codes(path: str | os.PathLike, layout: str, info=None, *, drop_incomplete: bool = False) -> list[np.ndarray]:
    """Read CODES into per-level int32 arrays (1-D, or 2-D for a batch). Raises UsageError."""
    L = orpheus
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"codes file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            if layout not in ("auto", "levels"):
                raise UsageError(f"--layout {layout}: .npz files hold per-level arrays (layout 'levels')")
            with np.load(path, allow_pickle=False) as z:
                names = [f"level{i}" for i in range(len(z.files))]
                missing = [n for n in names if n not in z.files]
                if missing or not names:
                    raise UsageError(f"{path}: expected arrays level0, level1, ... ; found "
                                     f"{', '.join(z.files) or 'none'}")
                levels = [np.asarray(z[n]) for n in names]
            for i, a in enumerate(levels):
                if a.dtype.kind not in "iu":
                    raise UsageError(f"{path}: level{i} has dtype {a.dtype}, expected integers")
            return [np.ascontiguousarray(a, dtype=np.int32) if np.all((a >= -2**31) & (a < 2**31))
                    else a for a in levels]
        if suffix == ".npy":
            if layout == "levels":
                raise UsageError("--layout levels needs an .npz file with level0, level1, ...")
            a = np.load(path, allow_pickle=False)
            if a.ndim not in (1, 2) or a.dtype.kind not in "iu":
                raise UsageError(f"{path}: expected a 1-D or 2-D integer array of Orpheus codes, "
                                 f"got shape {a.shape} dtype {a.dtype}")
            rows = [a] if a.ndim == 1 else list(a)
            kind = layout
            if kind == "auto":
                kind = "orpheus-ids" if a.size and int(a.max()) >= L.ORPHEUS_TOKEN_BASE else "orpheus"
            conv = []
            for r in rows:
                codes = (L.orpheus_ids_to_codes(r, drop_incomplete=drop_incomplete) if kind == "orpheus-ids"
                         else r)
                conv.append(L.orpheus_to_levels(codes, drop_incomplete=drop_incomplete))
            levels = conv[0] if a.ndim == 1 else [np.stack([c[i] for c in conv]) for i in range(3)]
        else:
            if layout == "levels":
                raise UsageError("--layout levels needs an .npz file with level0, level1, ...")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"{path}: not a text file (use .npz or .npy for binary codes)") from None
            kind = {"auto": "auto", "orpheus": "codes", "orpheus-ids": "ids"}[layout]
            codes = L.parse_orpheus_text(text, kind=kind, drop_incomplete=drop_incomplete)
            levels = L.orpheus_to_levels(codes)
    except L.LayoutError as e:
        raise UsageError(f"{path}: {e}") from None
    except (ValueError, OSError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"{path}: cannot read codes ({e})") from None
    if levels[0].shape[-1] == 0:
        raise UsageError(f"{path}: no complete group of codes")
    if info is not None and not _takes_orpheus(info):
        d = _info_dict(info)
        raise UsageError(f"the Orpheus layout needs a model with 3 levels of strides 4, 2, 1 "
                         f"(this model: {d.get('n_levels')} levels, strides {list(d.get('level_strides', []))})")
    return levels


# --------------------------------------------------------------- commands


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="print a GGUF model's info")
    p.add_argument("model", metavar="MODEL", help="GGUF file")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args) -> int:
    codecrt = _import_codecrt()
    if not Path(args.model).is_file():
        raise UsageError(f"model not found: {args.model}")
    m = codecrt.Model(args.model)
    try:
        print(format_info(m.info, args.model))
    finally:
        m.close()
    return 0


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert a checkpoint to GGUF")
    p.add_argument("src", metavar="SRC", help="checkpoint folder (config.json + pytorch_model.bin) or state-dict file")
    p.add_argument("-o", "--output", required=True, metavar="DST", help="GGUF file to write")
    p.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="type of the large matrices (default f32)")
    p.add_argument("--config", metavar="CONFIG", help="config.json (for a single state-dict file)")
    p.add_argument("--arch", help="architecture (default: detected)")
    p.add_argument("--source", help="what to record as codecd.source (default: the SRC path)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_convert)


def _cmd_convert(args) -> int:
    from .convert import ConversionError, convert

    try:
        convert(args.src, args.output, dtype=args.dtype, config=args.config, progress=not args.quiet,
                arch=args.arch, source=args.source)
    except ConversionError as e:
        raise UsageError(str(e)) from None
    return 0


def _add_decode(sub) -> None:
    p = sub.add_parser("decode", help="decode codes to a WAV file")
    p.add_argument("codes", metavar="CODES", nargs="?",
                   help=".npz (level0, level1, ...), .npy (Orpheus codes) or text "
                        "(optional with --model demo: the built-in demo sequence)")
    p.add_argument("--model", "-m", required=True,
                   help="GGUF model, or demo (random weights: noise at about -20 dBFS)")
    p.add_argument("-o", "--output", required=True, help="WAV file to write")
    p.add_argument("--layout", choices=("auto", "levels", "orpheus", "orpheus-ids"), default="auto")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, metal, vulkan, auto (default)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("--noise", action=argparse.BooleanOptionalAction, default=False,
                   help="the model's noise injection (default off)")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--format", choices=("s16", "f32"), default="s16", help="WAV sample format (default s16)")
    p.add_argument("--drop-incomplete", action="store_true",
                   help="drop an incomplete trailing Orpheus group instead of failing")
    p.set_defaults(func=_cmd_decode)


def _demo_model_file() -> str:
    from .config import ensure_demo_model

    path = ensure_demo_model()
    print(f"the demo model ({path}): random weights, its audio is noise at about -20 dBFS",
          file=sys.stderr)
    return str(path)


def _no_codes(model: str) -> UsageError:
    return UsageError(f"CODES is required (only --model {DEMO} has a built-in sequence, "
                      f"not {model!r})")


def _cmd_decode(args) -> int:
    codecrt = _import_codecrt()
    model_path = args.model
    if args.model == DEMO and not Path(args.model).is_file():
        model_path = _demo_model_file()
    elif not Path(args.model).is_file():
        raise UsageError(f"model not found: {args.model}")
    if args.codes is None and args.model != DEMO:
        raise _no_codes(args.model)
    if args.seed < 0:
        raise UsageError("--seed must be >= 0")
    m = codecrt.Model(model_path)
    try:
        info = m.info
        if args.codes is None:
            from .demo import demo_levels

            levels = demo_levels()
        else:
            suffix = Path(args.codes).suffix.lower()
            levels = load_codes(args.codes, args.layout, None if suffix == ".npz" else info,
                                drop_incomplete=args.drop_incomplete)
        ctx = codecrt.Context(m, device=args.device, n_threads=args.threads)
        try:
            print(f"decoding on {ctx.device}", file=sys.stderr)
            pcm = ctx.decode(levels, noise=args.noise, seed=args.seed)
        finally:
            ctx.close()
    finally:
        m.close()
    out = Path(args.output)
    sr = _info_dict(info)["sample_rate"]
    if pcm.ndim == 1:
        write_wav(out, pcm, sr, args.format)
        print(f"wrote {out}: {pcm.size} samples, {pcm.size / sr:.3f} s at {sr} Hz", file=sys.stderr)
    else:
        for b in range(pcm.shape[0]):
            p = out.with_name(f"{out.stem}.{b}{out.suffix or '.wav'}")
            write_wav(p, pcm[b], sr, args.format)
        print(f"wrote {pcm.shape[0]} files {out.stem}.N{out.suffix}: {pcm.shape[1]} samples each", file=sys.stderr)
    return 0


# ------------------------------------------------------ stream and play (client side)

#: output samples of one Orpheus 7-token group (one coarsest SNAC code) at 24 kHz
GROUP_SAMPLES_24K = 2048


def _stream_payload(path: str | None, layout: str, model: str = ""):
    """(wire layout, messages' unit arrays): CODES read like ``decode`` reads them, as the
    token sequence (orpheus layouts) or per-level arrays (levels); no CODES with the demo
    model: the demo sequence. Raises UsageError."""
    L = orpheus
    if path is None:
        if model != DEMO:
            raise _no_codes(model)
        from .demo import demo_ids, demo_levels

        if layout == "levels":
            return layout, [np.asarray(a, dtype=np.int64) for a in demo_levels()]
        if layout in ("auto", "orpheus_ids", "orpheus-ids"):
            return "orpheus_ids", demo_ids()
        return layout, np.asarray(L.levels_to_orpheus(demo_levels()), dtype=np.int64)
    suffix = Path(path).suffix.lower()
    if layout == "orpheus-ids":
        layout = "orpheus_ids"
    if layout == "auto":
        layout = "levels" if suffix == ".npz" else "orpheus_ids"
    if suffix == ".npz" and layout != "levels":
        raise UsageError(f"--layout {layout}: .npz files hold per-level arrays (layout 'levels')")
    if suffix != ".npz" and layout == "levels":
        raise UsageError("--layout levels needs an .npz file with level0, level1, ...")
    levels = load_codes(path, "auto", drop_incomplete=False)
    if any(np.asarray(a).ndim != 1 for a in levels):
        raise UsageError(f"{path}: a batch of sequences; stream sends one sequence")
    if layout == "levels":
        return layout, [np.asarray(a, dtype=np.int64) for a in levels]
    codes = L.levels_to_orpheus(levels)
    if layout == "orpheus_ids":
        return layout, np.asarray(L.codes_to_orpheus_ids(codes), dtype=np.int64)
    return layout, np.asarray(codes, dtype=np.int64)


def _parse_rate(v: str) -> float:
    """--rate: realtime (1.0), max (0: no pacing) or a factor of real time (0.5: half speed)."""
    if v == "realtime":
        return 1.0
    if v == "max":
        return 0.0
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("expected realtime, max or a speed factor") from None
    if not (f > 0 and f < 1e6):
        raise argparse.ArgumentTypeError("a speed factor must be > 0")
    return f


def _add_client_args(p) -> None:
    p.add_argument("codes", metavar="CODES", nargs="?",
                   help=".npz (level0, level1, ...), .npy (Orpheus codes) or text "
                        "(optional with --model demo: the built-in demo sequence)")
    p.add_argument("--url", default=None,
                   help="server URL, ws://HOST:PORT (optional with --model demo: a daemon "
                        "with the demo model is started in this process)")
    p.add_argument("--model", "-m", required=True, help="model name on the server")
    p.add_argument("--layout", choices=("auto", "orpheus_ids", "orpheus", "orpheus-ids", "levels"),
                   default="auto", help="wire layout (auto: levels for .npz, else orpheus_ids)")
    p.add_argument("--rate", type=_parse_rate, default=1.0, metavar="realtime|max|FACTOR",
                   help="send tokens at the codec's real rate (default), as fast as possible, "
                        "or at FACTOR times real time")
    p.add_argument("--chunk-tokens", type=int, default=7,
                   help="tokens per message (levels: a multiple of 7, one 4/2/1 group each)")
    p.add_argument("--binary", action="store_true", help="send tokens as binary frames")
    p.add_argument("--token", default=os.environ.get("CODECD_TOKEN"),
                   help="bearer token (default $CODECD_TOKEN)")


def _level_groups(levels: list[np.ndarray]) -> tuple[int, list[int]]:
    """Number of coarsest-level groups and codes per group of each level (from the lengths)."""
    n0 = int(levels[0].size)
    if n0 == 0:
        raise UsageError("no codes")
    per = []
    for a in levels:
        if a.size % n0:
            raise UsageError(f"level lengths {[int(x.size) for x in levels]} are not multiples of "
                             f"the coarsest level's")
        per.append(int(a.size // n0))
    return n0, per


async def _send_paced(s, layout: str, payload, rate: float, chunk_tokens: int, binary: bool,
                      group_s: float) -> float:
    """Send every token paced at ``rate`` times the codec's real rate, then end; returns the
    monotonic time of the first send."""
    import asyncio
    import time

    t0 = time.monotonic()
    if layout == "levels":
        n_groups, per = _level_groups(payload)
        step = max(1, chunk_tokens // max(1, sum(per)))
        msgs: list[tuple[float, float]] = [(g, min(n_groups, g + step)) for g in range(0, n_groups, step)]
    else:
        n_groups = payload.size / 7.0
        msgs = [(i / 7.0, min(payload.size, i + chunk_tokens) / 7.0)
                for i in range(0, payload.size, chunk_tokens)]
    for a, b in msgs:
        if rate > 0:
            # a message is sent once the LM would have produced its last token
            due = t0 + (b * group_s) / rate if a > 0 else t0
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        if layout == "levels":
            await s.send_levels([lv[a * p:b * p] for lv, p in zip(payload, per)], binary=binary)
        else:
            await s.send_tokens(payload[round(a * 7):round(b * 7)], binary=binary)
    await s.end()
    return t0


def _codebooks(hello_model: dict | None, layout: str, payload) -> int | None:
    """``start.codebooks`` for a ``levels`` file holding fewer levels than the model has
    (Moshi's 8 of Mimi's 32); None otherwise (every level: the server's default)."""
    n_model = int((hello_model or {}).get("n_levels") or 0)
    if layout == "levels" and 0 < len(payload) < n_model:
        return len(payload)
    return None


def _window_arg(text: str) -> dict[str, int | str]:
    """``--window``: a preset name, or chunk/lookback/lookahead/overlap in frames
    (``25/50/5/1``), as ``start.window``."""
    parts = text.split("/")
    if len(parts) == 1:
        return {"preset": text}
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a preset name (default, low) or "
                                         "CHUNK/LOOKBACK/LOOKAHEAD/OVERLAP in frames, e.g. 25/50/5/1")
    return dict(zip(("chunk", "lookback", "lookahead", "overlap"), map(int, parts)))


def _group_seconds(hello_model: dict | None, frame_samples: int | None) -> float:
    sr = int((hello_model or {}).get("sample_rate") or 24000)
    n = frame_samples or GROUP_SAMPLES_24K * sr // 24000
    return n / sr


def _add_stream(sub) -> None:
    p = sub.add_parser("stream", help="stream codes to a codecd server, write the audio to a WAV")
    _add_client_args(p)
    p.add_argument("-o", "--output", required=True, help="WAV file to write")
    p.add_argument("--format", choices=("pcm_s16le", "pcm_f32le", "mulaw"), default="pcm_s16le",
                   help="wire format (the WAV is 16-bit for s16/mulaw, float for f32)")
    p.add_argument("--sample-rate", type=int, default=None, help="output rate (server resamples)")
    p.add_argument("--frame-samples", type=int, default=None,
                   help="model samples per Orpheus group / coarsest code, for pacing "
                        "(default 2048 at 24 kHz)")
    p.add_argument("--window", type=_window_arg, default=None,
                   help="windowed models (WavTokenizer, NeuCodec, XCodec2): the stream's window, "
                        "a preset (default, low) or CHUNK/LOOKBACK/LOOKAHEAD/OVERLAP frames")
    p.set_defaults(func=_cmd_stream)


def _cmd_stream(args) -> int:
    import asyncio

    if args.chunk_tokens < 1:
        raise UsageError("--chunk-tokens must be >= 1")
    layout, payload = _stream_payload(args.codes, args.layout, args.model)
    return asyncio.run(_with_server(args, _stream_main(args, layout, payload)))


async def _with_server(args, main) -> int:
    """Run ``main`` (a coroutine reading ``args.url``); without ``--url`` and with the demo
    model, against a daemon started in this process."""
    if args.url is not None:
        return int(await main)
    if args.model != DEMO:
        main.close()
        raise UsageError(f"--url is required (only --model {DEMO} can start a local server)")
    from .config import Config, ModelSource
    from .server import Server

    print("no --url: starting a daemon with the demo model in this process", file=sys.stderr)
    srv = Server(Config(listen="127.0.0.1:0", models=[ModelSource(DEMO, "demo")],
                        devices=["auto"], batch_buckets=[1]))
    await srv.start()
    try:
        args.url = f"ws://127.0.0.1:{srv.port}"
        return int(await main)
    finally:
        await srv.close()


async def _stream_main(args, layout: str, payload) -> int:
    import asyncio
    import time

    from .client import Client, ServerError, to_float32

    t_start = time.monotonic()
    try:
        async with Client(args.url, token=args.token) as c:
            if args.model not in c.models:
                raise UsageError(f"model {args.model!r} not on the server (has: "
                                 f"{', '.join(c.models) or 'none'})")
            s = await c.start(args.model, layout=layout, format=args.format,
                              sample_rate=args.sample_rate,
                              codebooks=_codebooks(c.models.get(args.model), layout, payload),
                              window=args.window)
            sender = asyncio.create_task(_send_paced(
                s, layout, payload, args.rate, args.chunk_tokens, args.binary,
                _group_seconds(c.models.get(args.model), args.frame_samples)))
            parts = []
            try:
                async for chunk in s:
                    parts.append(chunk.pcm)
            finally:
                if not sender.done():
                    sender.cancel()
            t_first_send = await sender
    except ServerError as e:
        raise RuntimeError(f"server: {e}") from None
    except OSError as e:
        raise RuntimeError(f"cannot connect to {args.url}: {e}") from None
    t_end = time.monotonic()
    fmt = s.format
    pcm = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    sr = s.sample_rate
    out = Path(args.output)
    if fmt == "pcm_s16le":
        with wave.open(str(out), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(sr)
            w.writeframes(np.asarray(pcm, dtype="<i2").tobytes())
    else:
        write_wav(out, to_float32(pcm, fmt), sr, "f32" if fmt == "pcm_f32le" else "s16")
    ttfa = (s.first_audio_at - t_first_send) if s.first_audio_at is not None else float("nan")
    print(f"wrote {out}: {pcm.size} samples, {pcm.size / sr:.3f} s at {sr} Hz", file=sys.stderr)
    print(f"time to first audio: {1000 * ttfa:.1f} ms; total: {t_end - t_start:.3f} s "
          f"({s.chunks_received} chunks)")
    return 0


def _add_play(sub) -> None:
    p = sub.add_parser("play", help="stream codes to a codecd server and play the audio live")
    _add_client_args(p)
    p.add_argument("--device", default=None, help="output device (name or index; default: the system's)")
    p.add_argument("--prime-ms", type=float, default=200.0,
                   help="audio buffered before playback starts (default 200 ms)")
    p.add_argument("--blocksize", type=int, default=0, help="device block size in frames (0: PortAudio's choice)")
    p.add_argument("--buffer-s", type=float, default=30.0, help="jitter buffer capacity in seconds")
    p.add_argument("--frame-samples", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_play)


def _cmd_play(args) -> int:
    import asyncio

    if args.chunk_tokens < 1:
        raise UsageError("--chunk-tokens must be >= 1")
    if args.prime_ms < 0 or args.blocksize < 0 or args.buffer_s <= 0:
        raise UsageError("--prime-ms, --blocksize must be >= 0 and --buffer-s > 0")
    layout, payload = _stream_payload(args.codes, args.layout, args.model)
    from .playback import check_output_device

    check_output_device(args.device)  # a missing PortAudio or device, before any streaming
    return asyncio.run(_with_server(args, _play_main(args, layout, payload)))


async def _play_main(args, layout: str, payload) -> int:
    import asyncio

    from .client import Client, ServerError, to_float32
    from .playback import JitterBuffer, Player

    device = args.device
    if device is not None and device.isdigit():
        device = int(device)
    player = None
    try:
        async with Client(args.url, token=args.token) as c:
            if args.model not in c.models:
                raise UsageError(f"model {args.model!r} not on the server (has: "
                                 f"{', '.join(c.models) or 'none'})")
            s = await c.start(args.model, layout=layout, format="pcm_f32le",
                              codebooks=_codebooks(c.models.get(args.model), layout, payload))
            sr = s.sample_rate
            prime = int(round(args.prime_ms * sr / 1000.0))
            buf = JitterBuffer(max(prime + sr, int(args.buffer_s * sr)), prime)
            player = Player(buf, sr, device=device, blocksize=args.blocksize)
            player.start()
            sender = asyncio.create_task(_send_paced(
                s, layout, payload, args.rate, args.chunk_tokens, False,
                _group_seconds(c.models.get(args.model), args.frame_samples)))
            try:
                async for chunk in s:
                    x = to_float32(chunk.pcm, s.format)
                    if player.error is not None:
                        break
                    if buf.capacity - buf.level >= x.size:
                        buf.write(x)
                    else:
                        await asyncio.to_thread(buf.write, x)
            finally:
                if not sender.done():
                    sender.cancel()
            if player.error is None:
                await sender
            buf.end()
            await asyncio.to_thread(player.wait, stall_s=10.0)
    except ServerError as e:
        raise RuntimeError(f"server: {e}") from None
    finally:
        if player is not None:
            player.close(abort=True)
    st = buf.stats()
    ttp = st.time_to_prime_s
    print(f"frames played: {st.frames_played} of {st.frames_written}; underruns: {st.underruns} "
          f"({st.underrun_frames} frames); device underflows: {player.device_underflows}")
    print(f"primed latency: {1000 * prime / sr:.1f} ms buffered"
          f"{'' if ttp is None else f', reached {1000 * ttp:.1f} ms after the first audio'}; "
          f"device output latency {1000 * player.output_latency_s:.1f} ms")
    return 0


def _add_serve(sub) -> None:
    from .config import add_arguments

    p = sub.add_parser("serve", help="run the streaming decode daemon",
                       description="Run the websocket decode daemon. Precedence: defaults < TOML "
                                   "file < CODECD_* environment < flags. See docs/server.md.")
    add_arguments(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args) -> int:
    import asyncio

    from .config import ConfigError, load_config
    from .logs import setup_logging
    from .daemon import run

    try:
        cfg = load_config(args.config, args=args)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    setup_logging(cfg.log_format, cfg.log_level)
    return asyncio.run(run(cfg))


def _add_check_config(sub) -> None:
    from .config import add_arguments

    p = sub.add_parser("check-config", help="validate a config and print the effective settings",
                       description="Validate the config (file, CODECD_* environment and flags, as "
                                   "serve would) and print the effective settings as TOML, "
                                   "secrets redacted. Exit status 2 on errors.")
    p.add_argument("file", metavar="FILE", nargs="?", help="TOML config file")
    add_arguments(p)
    p.set_defaults(func=_cmd_check_config)


def _cmd_check_config(args) -> int:
    from .config import ConfigError, format_config, load_config

    try:
        cfg = load_config(args.file or args.config, args=args)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    sys.stdout.write(format_config(cfg))
    return 0


def _add_voice(sub) -> None:
    p = sub.add_parser("voice", help="manage voices for models that need one (Chatterbox S3Gen)")
    p.add_argument("--dir", metavar="DIR",
                   help="voice directory (default: $CODECD_VOICES_DIR or ~/.local/share/codecd/voices)")
    vs = p.add_subparsers(dest="voice_command", metavar="ACTION")
    vs.required = True
    a = vs.add_parser("add", help="add a voice from a Chatterbox conds.pt or a voice file")
    a.add_argument("name", metavar="NAME")
    a.add_argument("file", metavar="FILE", help="conds.pt (Chatterbox conditionals) or NAME.voice.gguf")
    a.add_argument("--replace", action="store_true", help="overwrite an existing voice of that name")
    a.set_defaults(func=_cmd_voice_add)
    ls = vs.add_parser("list", help="list the voices")
    ls.set_defaults(func=_cmd_voice_list)


def _cmd_voice_add(args) -> int:
    from .families.voices import VoiceError, VoiceStore

    try:
        path = VoiceStore(args.dir).add(args.name, args.file, replace=args.replace)
    except VoiceError as e:
        raise UsageError(str(e)) from None
    print(f"{args.name}: {path}")
    return 0


def _cmd_voice_list(args) -> int:
    from .families.voices import VoiceStore

    store = VoiceStore(args.dir)
    ok, bad = store.load_all()
    for name, v in ok.items():
        print(f"{name}\t{v.model_arch}\t{v.prompt_tokens.size} prompt tokens "
              f"({v.prompt_tokens.size / 25:.2f} s)\t{v.source}")
    for name, err in bad.items():
        print(f"{name}\tunreadable: {err}")
    if not ok and not bad:
        print(f"no voices in {store.root}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="codecd: neural audio codec decode daemon and tools")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from .doctor import add_doctor

    for add in (_add_info, _add_convert, _add_decode, _add_stream, _add_play, _add_serve,
                _add_check_config, _add_voice, add_doctor):
        add(sub)
    return parser


def _is_user_error(e: BaseException) -> bool:
    if isinstance(e, (UsageError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return True
    try:
        import codecrt
    except ImportError:
        return False
    # codes/arguments the runtime rejects, model files that are not valid models, and a
    # --device this build or machine does not have
    return isinstance(e, (codecrt.InputError, codecrt.ModelError, codecrt.BackendError))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: no traceback for the user
        if os.environ.get("CODECD_DEBUG"):
            raise
        msg = str(e) or type(e).__name__
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2 if _is_user_error(e) else 1


if __name__ == "__main__":
    sys.exit(main())
