"""Two-stage models (S3Gen): the flow (tokens to mel) and the vocoder (mel to PCM).

``Context.flow`` / ``Context.vocode`` call these; the diagnostics run one
graph of the pipeline each, to verify a port stage by stage against its
reference (unstable API).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._args import INT32_MAX, UINT32_MAX, UINT64_MAX, float_arg, int_arg
from ._contextlike import ContextLike
from ._errors import E_INVALID_ARGUMENT, CodeRangeError, _check, _fail
from ._native import ffi, lib
from ._voice import Voice, as_voice

__all__ = ["flow", "flow_batch", "vocode", "vocode_batch", "noise", "diag_encode", "diag_estimate", "diag_f0", "diag_source", "diag_hift"]

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


def flow(ctx: ContextLike, tokens: npt.ArrayLike, voice: Voice, *, seed: int = 0, n_steps: int = 0,
         cfg_rate: float | None = None, finalize: bool = True) -> npt.NDArray[np.float32]:
    toks = _tokens(tokens)
    mels = flow_batch(ctx, toks[None, :], [voice], seeds=[seed], n_steps=n_steps, cfg_rate=cfg_rate,
                      finalize=finalize)
    return np.asarray(mels[0], dtype=np.float32)


def flow_batch(ctx: ContextLike, tokens: npt.ArrayLike, voices: Sequence[Voice], *, seeds: Sequence[int],
               n_steps: int = 0, cfg_rate: float | None = None,
               finalize: bool = True) -> npt.NDArray[np.float32]:
    """n flows of the same shape at once: tokens ``[n, n_tokens]``, one voice and seed each
    (the voices' prompts of one length) -> mel ``[n, n_mels, frames]``."""
    toks = np.asarray(tokens)
    if toks.ndim != 2:
        _fail(E_INVALID_ARGUMENT, f"tokens must be [n, n_tokens], got shape {toks.shape}")
    toks = np.stack([_tokens(row) for row in toks]) if toks.shape[0] else toks.astype(np.int32)
    n = toks.shape[0]
    if not (1 <= n <= int(lib.CODECRT_MAX_FLOW_BATCH)) or len(voices) != n or len(seeds) != n:
        _fail(E_INVALID_ARGUMENT, f"a batch of 1..{int(lib.CODECRT_MAX_FLOW_BATCH)} flows needs one voice "
              f"and one seed each: {n} token rows, {len(voices)} voices, {len(seeds)} seeds")
    n_mels = max(ctx.model_info.n_mels, 1)
    per = 2 * (toks.shape[1] if finalize else max(toks.shape[1] - _LOOKAHEAD, 0))
    p = ffi.new("codecrt_flow_params[]", n)
    for k in range(n):
        p[k] = lib.codecrt_flow_default_params()
        p[k].voice = as_voice(voices[k])._handle()
        p[k].seed = int_arg("seed", seeds[k], 0, 2**64 - 1)
        p[k].n_steps = int_arg("n_steps", n_steps, 0, 100)
        if cfg_rate is not None:
            p[k].cfg_rate = float_arg("cfg_rate", cfg_rate, 0.0, 10.0)
        p[k].finalize = 1 if finalize else 0
    mel = np.empty(max(per, 1) * n_mels * n, dtype=np.float32)
    n_frames = ffi.new("int32_t *")
    with ctx._lock:
        status = lib.codecrt_flow_decode_batch(ctx._handle(), p, n, ffi.from_buffer("int32_t[]", toks),
                                               toks.shape[1], _f(mel), mel.size, n_frames)
        _check(status, ctx._last_error)
    f = int(n_frames[0])
    return mel[: n * n_mels * f].reshape(n, n_mels, f)


def vocode(ctx: ContextLike, mel: npt.ArrayLike, *, seed: int = 0, sample_offset: int = 0,
           cache_source: npt.ArrayLike | None = None, return_source: bool = False) -> Any:
    info = ctx.model_info
    m = _floats("mel", mel, (info.n_mels or None, None))
    out = vocode_batch(ctx, m[None], seeds=[seed], sample_offsets=[sample_offset], cache_sources=[cache_source],
                       return_source=return_source)
    return (out[0][0], out[1][0]) if return_source else out[0]


def vocode_batch(ctx: ContextLike, mels: npt.ArrayLike, *, seeds: Sequence[int], sample_offsets: Sequence[int],
                 cache_sources: Sequence[npt.ArrayLike | None] | None = None, return_source: bool = False) -> Any:
    """n vocoder calls of the same length at once: mels ``[n, n_mels, frames]``, one seed,
    sample offset and optional cache source each -> PCM ``[n, frames * mel_hop]`` (and the
    sources used, same shape, with ``return_source``)."""
    info = ctx.model_info
    m = _floats("mels", mels, (None, info.n_mels or None, None))
    n, n_frames = m.shape[0], m.shape[2]
    caches = list(cache_sources) if cache_sources is not None else [None] * n
    if not (1 <= n <= int(lib.CODECRT_MAX_FLOW_BATCH)) or len(seeds) != n or len(sample_offsets) != n \
            or len(caches) != n:
        _fail(E_INVALID_ARGUMENT, f"a batch of 1..{int(lib.CODECRT_MAX_FLOW_BATCH)} vocoder calls needs one "
              f"seed, offset and cache each: {n} mels, {len(seeds)} seeds, {len(sample_offsets)} offsets, "
              f"{len(caches)} caches")
    per = n_frames * max(info.mel_hop, 0)
    pcm = np.empty(max(per, 1) * n, dtype=np.float32)
    src = np.empty((n, max(per, 1)), dtype=np.float32) if return_source else None
    items = ffi.new("codecrt_vocode_item[]", n)
    keep = []  # the cache arrays must outlive the call
    for k in range(n):
        items[k].seed = int_arg("seed", seeds[k], 0, 2**64 - 1)
        items[k].sample_offset = int_arg("sample_offset", sample_offsets[k], 0, 2**63 - 1)
        if caches[k] is not None:
            c = _floats("cache_source", caches[k], (None,))
            keep.append(c)
            items[k].cache_source = ffi.from_buffer("float[]", c)
            items[k].n_cache = c.size
        if src is not None:
            items[k].source_out = ffi.from_buffer("float[]", src[k], require_writable=True)
    with ctx._lock:
        status = lib.codecrt_vocode_batch(ctx._handle(), ffi.from_buffer("float[]", m), n_frames, n, items,
                                          _f(pcm), pcm.size)
        _check(status, ctx._last_error)
    del keep
    out = pcm[: n * per].reshape(n, per)
    if src is not None:
        return out, src[:, :per]
    return out


def noise(seed: int, site: int, start: int, n: int, *, uniform: bool = False) -> npt.NDArray[np.float32]:
    """The runtime's keyed noise: ``n`` draws for (seed, site, start + i). Each argument
    must fit its C field (InputError otherwise); at most 2**31 - 1 draws a call."""
    seed = int_arg("seed", seed, 0, UINT64_MAX)
    site = int_arg("site", site, 0, UINT32_MAX)
    start = int_arg("start", start, 0, UINT64_MAX)
    n = int_arg("n", n, 0, INT32_MAX)
    out = np.empty(n, dtype=np.float32)
    lib.codecrt_noise(seed, site, start, out.size, 1 if uniform else 0,
                      ffi.from_buffer("float[]", out, require_writable=True))
    return out


# ------------------------------------------------------------ diagnostics


def diag_encode(ctx: ContextLike, tokens: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """tokens [n] -> mu [80, 2n] (the encoder graph alone)."""
    toks = _tokens(tokens)
    mu = np.empty(max(toks.size, 1) * 2 * 80, dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_encode(ctx._handle(), ffi.from_buffer("int32_t[]", toks), toks.size,
                                          ffi.from_buffer("float[]", mu, require_writable=True)),
               ctx._last_error)
    return mu[: toks.size * 160].reshape(80, 2 * toks.size)


def diag_estimate(ctx: ContextLike, x: npt.ArrayLike, mu: npt.ArrayLike, cond: npt.ArrayLike, spks: npt.ArrayLike,
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


def diag_f0(ctx: ContextLike, mel: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """mel [80, T] -> f0 [T] (the F0 predictor graph alone)."""
    m = _floats("mel", mel, (80, None))
    f0 = np.empty(m.shape[1], dtype=np.float32)
    with ctx._lock:
        _check(lib.codecrt_diag_s3_f0(ctx._handle(), ffi.from_buffer("float[]", m), m.shape[1],
                                      ffi.from_buffer("float[]", f0, require_writable=True)), ctx._last_error)
    return f0


def diag_source(ctx: ContextLike, f0: npt.ArrayLike, phases: npt.ArrayLike,
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


def diag_hift(ctx: ContextLike, mel: npt.ArrayLike, source: npt.ArrayLike) -> npt.NDArray[np.float32]:
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
