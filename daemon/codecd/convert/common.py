"""Pieces shared by every architecture's converter.

* :class:`ConversionError`: the one exception a user sees from a conversion.
* State-dict loading: ``pytorch_model.bin`` / ``.pt`` / ``.pth`` through torch
  (imported lazily), ``.safetensors`` through the ``safetensors`` package when
  installed, else through :func:`read_safetensors`, a small numpy reader.
* Weight-norm folding for both key layouts (``weight_g``/``weight_v`` and
  ``parametrizations.weight.original0``/``original1``).
* :class:`Progress`: a dependency-free progress bar on stderr.
* :class:`GGUFOut`: collects metadata and tensors and writes one GGUF file
  with the ``gguf`` package, atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import numpy.typing as npt

FORMAT_VERSION = 1
DTYPES = ("f32", "f16")


class ConversionError(Exception):
    """A checkpoint or config that cannot be converted; the message says why."""


# --------------------------------------------------------------------- arrays


def to_numpy(x: Any, name: str = "?") -> np.ndarray:
    """Return ``x`` (numpy array or torch tensor) as a numpy array.

    Floating tensors of any precision (f16, bf16, f64) come back as float32 or
    float64 numpy arrays; bf16 has no numpy dtype and is widened to float32.
    """
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        t = x.detach().cpu()
        if t.is_floating_point() and t.dtype not in _torch_numpy_float_dtypes():
            t = t.float()
        return np.asarray(t.numpy())
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - defensive
        raise ConversionError(f"tensor {name!r}: cannot be read as an array ({e})") from None


def _torch_numpy_float_dtypes():
    import torch

    return (torch.float16, torch.float32, torch.float64)


def as_f32(a: np.ndarray, name: str) -> np.ndarray:
    """float32 copy of a floating array; a clear error for anything else or non-finite values."""
    if a.dtype.kind != "f":
        raise ConversionError(f"tensor {name!r}: expected a floating-point tensor, got {a.dtype}")
    out = np.ascontiguousarray(a, dtype=np.float32)
    if not np.all(np.isfinite(out)):
        raise ConversionError(f"tensor {name!r}: contains NaN or infinite values")
    return out


def fold_weight_norm(g: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``w = g * v / ||v||`` with the norm over every axis but 0 (torch's ``dim=0``).

    Computed in float64 and returned as float32.
    """
    v64 = np.asarray(v, dtype=np.float64)
    g64 = np.asarray(g, dtype=np.float64)
    if v64.ndim < 1 or g64.size != v64.shape[0]:
        raise ValueError(f"weight norm: g of shape {g64.shape} does not match v of shape {v64.shape}")
    norm = np.sqrt(np.sum(v64.reshape(v64.shape[0], -1) ** 2, axis=1))
    scale = g64.reshape(-1) / norm
    w = v64 * scale.reshape((-1,) + (1,) * (v64.ndim - 1))
    return np.asarray(w, dtype=np.float32)


WN_LAYOUTS = (
    ("weight_g", "weight_v"),
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
)


class StateDict:
    """A read-only view of a checkpoint's tensors that remembers which keys were used.

    ``weight(prefix)`` returns the effective (weight-norm folded) weight of a
    module whatever the key layout; ``used`` lets a converter report tensors it
    did not expect.
    """

    def __init__(self, tensors: Mapping[str, Any]):
        self._t = dict(tensors)
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._t

    def keys(self) -> Iterable[str]:
        return self._t.keys()

    def has_module(self, prefix: str) -> bool:
        p = prefix + "."
        return any(k.startswith(p) for k in self._t)

    def get(self, key: str) -> np.ndarray:
        if key not in self._t:
            raise ConversionError(f"checkpoint is missing tensor {key!r}")
        self.used.add(key)
        a = to_numpy(self._t[key], key)
        return as_f32(a, key) if a.dtype.kind == "f" else a

    def weight(self, prefix: str) -> np.ndarray:
        """Effective ``weight`` of module ``prefix``: plain, or folded from either weight-norm layout."""
        plain = f"{prefix}.weight"
        if plain in self._t:
            return self.get(plain)
        for gk, vk in WN_LAYOUTS:
            gname, vname = f"{prefix}.{gk}", f"{prefix}.{vk}"
            if gname in self._t or vname in self._t:
                g, v = self.get(gname), self.get(vname)
                try:
                    return fold_weight_norm(g, v)
                except ValueError as e:
                    raise ConversionError(f"module {prefix!r}: {e}") from None
        raise ConversionError(
            f"checkpoint is missing the weight of {prefix!r} (looked for {plain!r}, "
            f"'{prefix}.weight_g'/'weight_v' and '{prefix}.parametrizations.weight.original0'/'original1')"
        )


# ------------------------------------------------------------------- loading


def _import_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConversionError(
            "reading a PyTorch checkpoint (.bin/.pt/.pth) needs torch: pip install torch "
            "(or convert the checkpoint to .safetensors, which needs only numpy)"
        ) from None
    return torch


def load_state_dict(path: str | os.PathLike) -> dict[str, Any]:
    """Load a flat state dict from ``.safetensors`` or a torch pickle (``weights_only=True``)."""
    return load_checkpoint(path)[0]


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(state dict, embedded config or None) of a checkpoint file.

    The embedded config is the ``metadata["kwargs"]`` mapping that audiotools'
    ``BaseModel.save`` writes beside ``state_dict`` (DAC's released ``.pth``
    files): the model's constructor arguments.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"checkpoint file not found: {path}")
    embedded: dict[str, Any] | None = None
    if path.suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            return read_safetensors(path), None
        try:
            return dict(load_file(str(path))), None
        except Exception as e:
            # bf16 and friends are not numpy types; our reader widens them
            try:
                return read_safetensors(path), None
            except ConversionError:
                raise ConversionError(f"{path}: cannot read safetensors file ({e})") from None
    torch = _import_torch()
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConversionError(f"{path}: cannot load as a PyTorch checkpoint ({type(e).__name__}: {e})") from None
    # unwrap the usual containers
    # ("model_state_dict": OuteTTS' WavTokenizer decoder_model.pt)
    for key in ("state_dict", "model_state_dict", "model", "generator"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict) and not _is_tensor_dict(obj):
            meta = obj.get("metadata") if key == "state_dict" else None
            if isinstance(meta, dict) and isinstance(meta.get("kwargs"), dict):
                embedded = dict(meta["kwargs"])
            obj = obj[key]
    if not isinstance(obj, dict) or not _is_tensor_dict(obj):
        raise ConversionError(f"{path}: does not hold a state dict (a mapping of names to tensors)")
    return dict(obj), embedded


def _is_tensor_dict(d: dict) -> bool:
    return bool(d) and all(isinstance(k, str) for k in d) and all(
        hasattr(v, "shape") and hasattr(v, "dtype") for v in d.values()
    )


_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Minimal safetensors reader: u64 LE header length, JSON header, raw little-endian data.

    BF16 tensors are widened to float32. Tensors are copied out of a read-only
    memory map, so the file is not held open afterwards.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ConversionError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 * 1024 * 1024:
            raise ConversionError(f"{path}: bad safetensors header length {n}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConversionError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=0, shape=(size,))
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"{path}: malformed safetensors entry for {name!r}") from None
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= b <= e <= size - base):
            raise ConversionError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
        raw = data[base + b: base + e]
        if dt == "BF16":
            if e - b != 2 * count:
                raise ConversionError(f"{path}: tensor {name!r} has {e - b} bytes, expected {2 * count}")
            u16 = np.frombuffer(raw.tobytes(), dtype="<u2")
            arr = (u16.astype(np.uint32) << 16).view(np.float32)
        elif dt in _ST_DTYPES:
            npdt = np.dtype(_ST_DTYPES[dt]).newbyteorder("<")
            if e - b != npdt.itemsize * count:
                raise ConversionError(
                    f"{path}: tensor {name!r} has {e - b} bytes, expected {npdt.itemsize * count}")
            arr = np.frombuffer(raw.tobytes(), dtype=npdt).astype(npdt.newbyteorder("="))
        else:
            raise ConversionError(f"{path}: tensor {name!r} has unsupported dtype {dt!r}")
        out[name] = arr.reshape(shape)
    del data
    return out


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Write numpy arrays as a safetensors file (used by tests and for exporting)."""
    rev = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
    header: dict[str, Any] = {}
    blobs = []
    off = 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": rev[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def load_config(config: Any) -> dict | None:
    """A config given as a dict, or a path to a JSON file."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return dict(config)
    p = Path(config)
    if not p.is_file():
        raise ConversionError(f"config file not found: {p}")
    try:
        obj = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ConversionError(f"{p}: the config must be a JSON object")
    return obj


# ------------------------------------------------------------------ progress


class Progress:
    """A progress bar on stderr: ``\\r``-redrawn on a terminal, one summary line otherwise."""

    def __init__(self, total: int, label: str = "", enabled: bool = True, stream=None, width: int = 30):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = width
        self.done = 0
        self.t0 = time.monotonic()
        self._last = 0.0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if not self.tty:
            return
        now = time.monotonic()
        if self.done < self.total and now - self._last < 0.05:
            return
        self._last = now
        frac = self.done / self.total
        fill = int(frac * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        note = (note[:40]).ljust(40)
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}% {note}")
        self.stream.flush()

    def close(self, summary: str = "") -> None:
        if not self.enabled:
            return
        dt = time.monotonic() - self.t0
        msg = summary or f"{self.label}: done"
        if self.tty:
            self.stream.write("\r" + " " * (len(self.label) + self.width + 52) + "\r")
        self.stream.write(f"{msg} ({dt:.1f} s)\n")
        self.stream.flush()


# ---------------------------------------------------------------------- gguf


def _import_gguf():
    try:
        import gguf
    except ImportError:
        raise ConversionError("writing GGUF files needs the gguf package: pip install gguf") from None
    return gguf


class GGUFOut:
    """Metadata and tensors of one GGUF file, written by :meth:`write`.

    Tensors are given as numpy arrays in numpy order; GGUF stores the reversed
    (ggml) shape, exactly as docs/gguf-format.md describes.
    """

    def __init__(self, arch: str):
        self.arch = arch
        self.kv: list[tuple[str, str, Any]] = []
        self.tensors: dict[str, np.ndarray] = {}

    def u32(self, key: str, v: int) -> None:
        v = int(v)
        if not 0 <= v < 2**32:
            raise ConversionError(f"{key} = {v} does not fit in u32")
        self.kv.append((key, "u32", v))

    def f32(self, key: str, v: float) -> None:
        self.kv.append((key, "f32", float(v)))

    def i32_array(self, key: str, v: Iterable[int]) -> None:
        self.kv.append((key, "i32[]", [int(x) for x in v]))

    def boolean(self, key: str, v: bool) -> None:
        self.kv.append((key, "bool", bool(v)))

    def string(self, key: str, v: str) -> None:
        self.kv.append((key, "str", str(v)))

    def tensor(self, name: str, a: np.ndarray, dtype: npt.DTypeLike = np.float32) -> None:
        if name in self.tensors:
            raise ConversionError(f"internal error: tensor {name!r} written twice")
        with np.errstate(over="ignore", invalid="ignore"):
            a = np.ascontiguousarray(a, dtype=dtype)
        if not np.all(np.isfinite(a)):
            raise ConversionError(f"tensor {name!r}: non-finite values after conversion to {a.dtype}"
                                  " (out of the f16 range? use --dtype f32)")
        self.tensors[name] = a

    def write(self, dst: str | os.PathLike, progress: bool = False) -> Path:
        gguf = _import_gguf()
        dst = Path(dst)
        if dst.parent and not dst.parent.exists():
            raise ConversionError(f"output directory does not exist: {dst.parent}")
        tmp = dst.with_name(dst.name + ".part")
        w = gguf.GGUFWriter(str(tmp), self.arch)
        VT = gguf.GGUFValueType
        for key, kind, v in self.kv:
            if kind == "u32":
                w.add_uint32(key, v)
            elif kind == "bool":
                w.add_bool(key, v)
            elif kind == "f32":
                w.add_float32(key, v)
            elif kind == "str":
                w.add_string(key, v)
            elif kind == "i32[]":
                w.add_key_value(key, v, VT.ARRAY, sub_type=VT.INT32)
        for name, a in self.tensors.items():
            w.add_tensor_info(name, a.shape, a.dtype, a.nbytes)
        bar = Progress(sum(a.nbytes for a in self.tensors.values()), "writing", enabled=progress)
        try:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for name, a in self.tensors.items():
                w.write_tensor_data(a)
                bar.update(a.nbytes, name)
            w.close()
            os.replace(tmp, dst)
        except OSError as e:
            w.close()
            tmp.unlink(missing_ok=True)
            raise ConversionError(f"cannot write {dst}: {e}") from None
        except BaseException:
            w.close()
            tmp.unlink(missing_ok=True)
            raise
        n_bytes = dst.stat().st_size
        bar.close(f"wrote {dst} ({len(self.tensors)} tensors, {n_bytes / 1e6:.1f} MB)")
        return dst
