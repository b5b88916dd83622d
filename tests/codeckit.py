"""Helpers of the codec parity tests (tests/codecs/, and the runtime tests that move its test
variables): the relative L2 error, runtime variables set for a block, a module's cache of
converted reference models, an offline decode in a fresh CPU context (or, for the AMX checks,
in a process of its own without AMX)."""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

Case = TypeVar("Case")


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b||, in float64."""
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@contextlib.contextmanager
def runtime_env(**values: str) -> Iterator[None]:
    """Set runtime variables (read when a context is created) inside the block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ops_env(ops: str) -> dict[str, str]:
    """The runtime variables of an ``ops`` parametrisation: "portable" runs the graphs that GPUs
    run (CODECRT_PORTABLE_OPS) composed from ggml's ops, "device-ops" the same graphs on
    codecrt's device ops with the full convs on the columns op (their C functions:
    CODECRT_FUSED_UNIT=1 CODECRT_CONV=cols, what a CUDA context runs with CODECRT_CONV=cols),
    anything else the fused CPU kernels."""
    if ops == "device-ops":
        return {"CODECRT_PORTABLE_OPS": "1", "CODECRT_FUSED_UNIT": "1", "CODECRT_CONV": "cols"}
    return {"CODECRT_PORTABLE_OPS": "1"} if ops == "portable" else {}


@contextlib.contextmanager
def case_cache(tmp_path_factory: pytest.TempPathFactory, folder: str,
               build: Callable[..., Case]) -> Iterator[Callable[..., Case]]:
    """``get(*args)``: ``build(root, *args)`` on first use, then the same object for the same
    arguments, defaults filled in (a module's reference models and their conversions, built
    once, under one temporary folder ``root``). The folder goes when the block ends: a
    module's released-size checkpoints and GGUFs are up to 3 GB, and they would otherwise stay
    on disk until the session ends, every module's at once."""
    root: Path = tmp_path_factory.mktemp(folder)
    signature = inspect.signature(build)
    cache: dict[tuple[Any, ...], Case] = {}

    def get(*args: Any) -> Case:
        bound = signature.bind(root, *args)
        bound.apply_defaults()
        key = tuple(bound.arguments.values())
        if key not in cache:
            cache[key] = build(*bound.args, **bound.kwargs)
        return cache[key]

    try:
        yield get
    finally:
        cache.clear()
        shutil.rmtree(root, ignore_errors=True)


def decode(codecrt: Any, gguf: Path, code_levels: list[np.ndarray], **ctx_args: Any) -> np.ndarray:
    """An offline decode of ``code_levels`` in a fresh CPU context of the model at ``gguf``."""
    with codecrt.Model(str(gguf)) as m, codecrt.Context(m, device="cpu", **ctx_args) as ctx:
        return ctx.decode(code_levels)


def amx_host() -> bool:
    """Whether this CPU has AMX's BF16 tiles (Linux' cpuinfo flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags and " amx_tile" in flags


_TILE_DECODE = """
import sys, numpy as np, codecrt
gguf, codes, out, precision = sys.argv[1:]
with codecrt.Model(gguf) as m, codecrt.Context(m, device="cpu", precision=precision) as ctx:
    np.save(out, ctx.decode([np.load(codes)]))
"""


def decode_without_amx(gguf: Path, codes: np.ndarray, precision: str, tmp_path: Path) -> np.ndarray:
    """A one-level offline decode in a process of its own with CODECRT_NO_AMX=1 (the AMX probe
    runs once a process): the BF16 products on the AVX512-BF16 register tile."""
    np.save(tmp_path / "codes.npy", codes)
    env = {**os.environ, "CODECRT_NO_AMX": "1"}
    subprocess.run([sys.executable, "-c", _TILE_DECODE, str(gguf), str(tmp_path / "codes.npy"),
                    str(tmp_path / "tile.npy"), precision], env=env, check=True, timeout=300)
    return np.load(tmp_path / "tile.npy")
