"""The ``codecd`` command line.

Subcommands (one ``_cmd_<name>`` function and one ``_add_<name>`` parser
builder each; ``serve``, ``stream``, ``play`` and ``voice`` are reserved):

``codecd info MODEL``
    Print a GGUF model's info as the runtime sees it.
``codecd convert SRC -o DST [--dtype f32|f16] [--config CONFIG]``
    Convert a checkpoint (a folder with config.json + pytorch_model.bin, or a
    state-dict file with ``--config``) to GGUF.
``codecd decode --model M.gguf CODES -o out.wav``
    Decode codes to a WAV file. CODES is one of:

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

PROG = "codecd"
RESERVED = ("serve", "stream", "play", "voice")


class UsageError(Exception):
    """Bad input from the user: exit status 2."""


# ---------------------------------------------------------------- helpers


def _import_codecrt():
    try:
        import codecrt
    except ImportError as e:
        raise RuntimeError(f"the codecrt runtime is not available ({e}); build and install the bindings") from None
    return codecrt


def _layouts():
    """codecrt.layouts; loaded from its file when the native codecrt module is not importable."""
    try:
        from codecrt import layouts
        return layouts
    except ImportError:
        pass
    import importlib.util

    for base in sys.path:
        p = Path(base or ".") / "codecrt" / "layouts.py"
        if p.is_file():
            spec = importlib.util.spec_from_file_location("codecrt_layouts", p)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    raise RuntimeError("codecrt.layouts is not available")


def write_wav(path: str | os.PathLike, pcm: np.ndarray, sample_rate: int, fmt: str = "s16") -> None:
    """Write mono PCM: 16-bit integer (clipped) with ``wave``, or 32-bit IEEE float."""
    x = np.asarray(pcm, dtype=np.float32).reshape(-1)
    if fmt == "s16":
        s = np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2")
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


def _is_orpheus_model(info) -> bool:
    d = _info_dict(info)
    return d.get("n_levels") == 3 and tuple(d.get("level_strides", ())) == (4, 2, 1)


def load_codes(path: str | os.PathLike, layout: str, info=None, *, drop_incomplete: bool = False) -> list[np.ndarray]:
    """Read CODES into per-level int32 arrays (1-D, or 2-D for a batch). Raises UsageError."""
    L = _layouts()
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
    if info is not None and not _is_orpheus_model(info):
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
    p.add_argument("codes", metavar="CODES", help=".npz (level0, level1, ...), .npy (Orpheus codes) or text")
    p.add_argument("--model", "-m", required=True, help="GGUF model")
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


def _cmd_decode(args) -> int:
    codecrt = _import_codecrt()
    if not Path(args.model).is_file():
        raise UsageError(f"model not found: {args.model}")
    if args.seed < 0:
        raise UsageError("--seed must be >= 0")
    m = codecrt.Model(args.model)
    try:
        info = m.info
        suffix = Path(args.codes).suffix.lower()
        levels = load_codes(args.codes, args.layout, None if suffix == ".npz" else info,
                            drop_incomplete=args.drop_incomplete)
        ctx = codecrt.Context(m, device=args.device, n_threads=args.threads)
        try:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="codecd: neural audio codec decode daemon and tools")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in (_add_info, _add_convert, _add_decode):
        add(sub)
    # reserved: serve, stream, play, voice (add an _add_<name> here)
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
