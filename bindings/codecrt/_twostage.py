"""Two-stage models (S3Gen): the flow (tokens to mel) and the vocoder (mel to PCM).

``Context.flow`` / ``Context.vocode`` call these; the diagnostics run one
graph of the pipeline each, to verify a port stage by stage against its
reference (unstable API).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._errors import E_INVALID_ARGUMENT, _check, _fail
from ._native import ffi, lib

if TYPE_CHECKING:
    from ._core import Context
    from ._voice import Voice

__all__ = ["flow", "vocode", "noise", "diag_encode", "diag_estimate", "diag_f0", "diag_source", "diag_hift"]

_LOOKAHEAD = 3


def _tokens(a: object) -> npt.NDArray[np.int32]:
    arr = np.asarray(a)
    if arr.size == 0:
        arr = arr.astype(np.int32)
    if arr.dtype.kind not in "iu":
        _fail(E_INVALID_ARGUMENT, f"tokens must be integers, not {arr.dtype}")
    if arr.ndim != 1:
        _fail(E_INVALID_ARGUMENT, f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) >= 2**31):
        from ._errors import CodeRangeError

        raise CodeRangeError(f"token {int(arr.max()) if int(arr.max()) >= 2**31 else int(arr.min())} "
                             "does not fit int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def _floats(name: str, a: object, shape: tuple[int | None, ...]) -> npt.NDArray[np.float32]:
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu":
        _fail(E_INVALID_ARGUMENT, f"{name} must be numbers, not {arr.dtype}")
    if arr.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, arr.shape)):
        want = "x".join("?" if s is None else str(s) for s in shape)
        _fail(E_INVALID_ARGUMENT, f"{name} must have shape [{want}], got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _f(a: npt.NDArray[Any], kind: str = "float[]") -> Any:
    return ffi.from_buffer(kind, a, require_writable=kind == "float[]" and a.flags.writeable)


def flow(ctx: Context, tokens: npt.ArrayLike, voice: Voice, *, seed: int = 0, n_steps: int = 0,
         cfg_rate: float | None = None, finalize: bool = True) -> npt.NDArray[np.float32]:
    from ._core import _float_arg, _int_arg, _voice_arg

    toks = _tokens(tokens)
    v = _voice_arg(voice, ctx)
    n_mels = max(ctx.model_info.n_mels, 1)
    n_out = 2 * (toks.size if finalize else max(toks.size - _LOOKAHEAD, 0))
    p = ffi.new("codecrt_flow_params *")
    p[0] = lib.codecrt_flow_default_params()
    p.voice = v._handle()
    p.seed = _int_arg("seed", seed, 0, 2**64 - 1)
    p.n_steps = _int_arg("n_steps", n_steps, 0, 100)
    if cfg_rate is not None:
        p.cfg_rate = _float_arg("cfg_rate", cfg_rate, 0.0, 10.0)
    p.finalize = 1 if finalize else 0
    mel = np.empty(max(n_out, 1) * n_mels, dtype=np.float32)
    n_frames = ffi.new("int32_t *")
    with ctx._lock:
        status = lib.codecrt_flow_decode(ctx._handle(), p, ffi.from_buffer("int32_t[]", toks), toks.size,
                                         ffi.from_buffer("float[]", mel, require_writable=True), mel.size,
                                         n_frames)
        _check(status, ctx._last_error)
    n = int(n_frames[0])
    return mel[: n * n_mels].reshape(n_mels, n)


def vocode(ctx: Context, mel: npt.ArrayLike, *, seed: int = 0, sample_offset: int = 0,
           cache_source: npt.ArrayLike | None = None, return_source: bool = False) -> Any:
    from ._core import _int_arg

    info = ctx.model_info
    m = _floats("mel", mel, (info.n_mels or None, None))
    n_frames = m.shape[1]
    n = n_frames * max(info.mel_hop, 0)
    pcm = np.empty(max(n, 1), dtype=np.float32)
    src = np.empty(max(n, 1), dtype=np.float32) if return_source else None
    cache = None if cache_source is None else _floats("cache_source", cache_source, (None,))
    with ctx._lock:
        status = lib.codecrt_vocode(
            ctx._handle(), ffi.from_buffer("float[]", m), n_frames, _int_arg("seed", seed, 0, 2**64 - 1),
            _int_arg("sample_offset", sample_offset, 0, 2**63 - 1),
            ffi.NULL if cache is None else ffi.from_buffer("float[]", cache), 0 if cache is None else cache.size,
            ffi.from_buffer("float[]", pcm, require_writable=True), n,
            ffi.NULL if src is None else ffi.from_buffer("float[]", src, require_writable=True))
        _check(status, ctx._last_error)
    if return_source:
        assert src is not None
        return pcm[:n], src[:n]
    return pcm[:n]


def noise(seed: int, site: int, start: int, n: int, *, uniform: bool = False) -> npt.NDArray[np.float32]:
    """The runtime's keyed noise: ``n`` draws for (seed, site, start + i)."""
    out = np.empty(max(int(n), 0), dtype=np.float32)
    lib.codecrt_noise(int(seed), int(site), int(start), out.size, 1 if uniform else 0,
                      ffi.from_buffer("float[]", out, require_writable=True))
    return out


# ------------------------------------------------------------ diagnostics


def diag_encode(ctx: Context, tokens: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """tokens [n] -> mu [80, 2n] (the encoder graph alone)."""
    toks = _tokens(tokens)
    mu = np.empty(max(toks.size, 1) * 2 * 80, dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_encode(ctx._handle(), ffi.from_buffer("int32_t[]", toks), toks.size,
                                          ffi.from_buffer("float[]", mu, require_writable=True)),
               ctx._last_error)
    return mu[: toks.size * 160].reshape(80, 2 * toks.size)


def diag_estimate(ctx: Context, x: npt.ArrayLike, mu: npt.ArrayLike, cond: npt.ArrayLike, spks: npt.ArrayLike,
                  t: npt.ArrayLike, r: npt.ArrayLike | None = None) -> npt.NDArray[np.float32]:
    """One estimator evaluation: x, mu, cond [B, 80, T], spks [B, 80], t [B] (r [B]) -> [B, 80, T]."""
    xa = _floats("x", x, (None, 80, None))
    B, _, T = xa.shape
    mua = _floats("mu", mu, (B, 80, T))
    ca = _floats("cond", cond, (B, 80, T))
    sa = _floats("spks", spks, (B, 80))
    ta = _floats("t", t, (B,))
    ra = None if r is None else _floats("r", r, (B,))
    out = np.empty((B, 80, T), dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_estimate(
            ctx._handle(), T, B, ffi.from_buffer("float[]", xa), ffi.from_buffer("float[]", mua),
            ffi.from_buffer("float[]", ca), ffi.from_buffer("float[]", sa), ffi.from_buffer("float[]", ta),
            ffi.NULL if ra is None else ffi.from_buffer("float[]", ra),
            ffi.from_buffer("float[]", out, require_writable=True)), ctx._last_error)
    return out


def diag_f0(ctx: Context, mel: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """mel [80, T] -> f0 [T] (the F0 predictor graph alone)."""
    m = _floats("mel", mel, (80, None))
    f0 = np.empty(m.shape[1], dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_f0(ctx._handle(), ffi.from_buffer("float[]", m), m.shape[1],
                                      ffi.from_buffer("float[]", f0, require_writable=True)), ctx._last_error)
    return f0


def diag_source(ctx: Context, f0: npt.ArrayLike, phases: npt.ArrayLike,
                noise: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """f0 [T], phases [9], noise [9, T*480] -> harmonic source [T*480] (host code)."""
    fa = _floats("f0", f0, (None,))
    T = fa.shape[0]
    pa = _floats("phases", phases, (9,))
    na = _floats("noise", noise, (9, T * 480))
    out = np.empty(T * 480, dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_source(ctx._handle(), ffi.from_buffer("float[]", fa), T,
                                          ffi.from_buffer("float[]", pa), ffi.from_buffer("float[]", na),
                                          ffi.from_buffer("float[]", out, require_writable=True)),
               ctx._last_error)
    return out


def diag_hift(ctx: Context, mel: npt.ArrayLike, source: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """mel [80, T], source [T*480] -> PCM [T*480] (the vocoder graph alone, no fade)."""
    m = _floats("mel", mel, (80, None))
    T = m.shape[1]
    sa = _floats("source", source, (T * 480,))
    out = np.empty(T * 480, dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_hift(ctx._handle(), ffi.from_buffer("float[]", m), T,
                                        ffi.from_buffer("float[]", sa),
                                        ffi.from_buffer("float[]", out, require_writable=True)), ctx._last_error)
    return out
