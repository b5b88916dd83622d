"""The iSTFT head's constant tensors, shared by the Vocos-style converters (WavTokenizer, NeuCodec, XCodec2).

Their heads end in ``ISTFT(padding="same")``: ``irfft(S, n_fft) * window``,
overlap-add at ``hop``, crop ``(n_fft - hop) / 2`` at both ends, divide by
the overlap-added squared window. The runtime computes the inverse real DFT
as one matrix product with the window folded in (``head.basis``) and the
envelope from ``head.window`` on the host; docs/gguf-format.md has the layout.
"""

from __future__ import annotations

import numpy as np

from .common import ConversionError


def istft_basis(window: np.ndarray) -> np.ndarray:
    """The synthesis matrix, numpy shape ``(n_fft, n_fft + 2)`` (ggml ne ``[n_fft + 2, n_fft]``).

    Column ``j < F = n_fft/2 + 1`` takes ``Re S_j``, column ``F + j`` takes
    ``Im S_j``; row ``n`` is output sample ``n`` of the frame:
    ``x[n] = w[n] / N * sum_k c_k (Re S_k cos(2 pi k n / N) - Im S_k sin(2 pi k n / N))``
    with ``c_0 = c_{N/2} = 1``, else 2: ``torch.fft.irfft(S, N, norm="backward")``,
    which ignores the imaginary parts of the DC and Nyquist bins (their sine
    columns are exactly 0). Computed in float64 (angles reduced mod N exactly),
    returned as float32.
    """
    w = np.asarray(window, dtype=np.float64).reshape(-1)
    n_fft = w.shape[0]
    if n_fft < 4 or n_fft % 2:
        raise ConversionError(f"iSTFT window of length {n_fft}: the runtime needs an even n_fft >= 4")
    F = n_fft // 2 + 1
    k = np.arange(F, dtype=np.int64)[:, None]
    n = np.arange(n_fft, dtype=np.int64)[None, :]
    ang = 2.0 * np.pi * ((k * n) % n_fft) / n_fft                      # [F, N]
    c = np.full((F, 1), 2.0)
    c[0] = c[-1] = 1.0
    re = c * np.cos(ang) / n_fft * w[None, :]
    im = -c * np.sin(ang) / n_fft * w[None, :]
    im[0] = 0.0
    im[-1] = 0.0
    return np.ascontiguousarray(np.concatenate([re, im], axis=0).T, dtype=np.float32)


def check_window(window: np.ndarray, hop: int, what: str) -> np.ndarray:
    """The window as float32 [n_fft], checked so that the envelope the runtime divides by is never ~0.

    Upstream asserts ``envelope > 1e-11`` (WavTokenizer) or divides blindly
    (NeuCodec); a window that makes some envelope sample vanish would give
    infinities, so it is refused here, checking the envelopes of 1 to 5 frames
    (longer ones repeat the interior of the 5-frame one).
    """
    w = np.asarray(window, dtype=np.float32).reshape(-1)
    n_fft = w.shape[0]
    if hop < 1 or 2 * hop > n_fft or (n_fft - hop) % 2:
        raise ConversionError(f"{what}: hop {hop} does not fit n_fft {n_fft} (need hop <= n_fft/2, "
                              "n_fft - hop even)")
    if not np.all(np.isfinite(w)):
        raise ConversionError(f"{what}: the window has non-finite values")
    pad = (n_fft - hop) // 2
    sq = w.astype(np.float64) ** 2
    for t in range(1, 6):
        env = np.zeros((t - 1) * hop + n_fft)
        for i in range(t):
            env[i * hop: i * hop + n_fft] += sq
        env = env[pad: pad + t * hop]
        if env.min() <= 1e-11:
            raise ConversionError(f"{what}: the window's overlap-added envelope vanishes "
                                  f"({env.min():.3g} at {t} frames); upstream would divide by ~0 there")
    return w
