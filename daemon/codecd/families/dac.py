"""The DAC family (descript-audio-codec 44.1/24/16 kHz; IBM DAC.speech, OuteTTS 1.0): exact streaming.

* architectures: ``dac``; converter ``dac`` (the released ``.pth``, config from its
  metadata kwargs);
* layouts: :data:`DAC_FRAMES` (the codes of each frame together, ``[n_codebooks]`` per
  frame, frames in time order: what a language model over DAC codes prints) and
  per-level codes;
* streams: exact (``codecrt.Stream``, equal to the offline decode, lagging by the
  decoder's right receptive field: 3,141 samples at 24 kHz, 131 ms), no voice, no
  low-latency mode;
* warm-up: dummy streams through whole utterances per batch bucket
  (:class:`codecd.families.native.ExactStreamModel`).

OuteTTS 1.0 prints a frame as ``<|c1_N|><|c2_M|>`` (N the code of codebook 0, M of
codebook 1; docs/protocol.md): over the 2-codebook IBM model that is the ``dac_frames``
layout with tokens ``N, M`` per frame. N = 1024 is in OuteTTS' vocabulary but not a
code: it is refused (``token_range``), as any code outside ``[0, 1024)``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Sequence

import numpy as np
import numpy.typing as npt

from .base import Family, LoadedModel
from .layout import LEVELS, Assembler, Layout, LayoutRangeError, LayoutShapeError
from .native import ExactStreamModel

__all__ = ["DacFamily", "DAC_FRAMES", "frames_to_levels", "levels_to_frames", "parse_outetts_text"]

_OUTETTS_C1 = re.compile(r"<\|c1_(\d+)\|>")
_OUTETTS_C2 = re.compile(r"<\|c2_(\d+)\|>")


def frames_to_levels(tokens: npt.ArrayLike, n_codebooks: int) -> list[npt.NDArray[np.int32]]:
    """Frame-major codes (``n_codebooks`` per frame) -> one int32 array per codebook."""
    a = np.asarray(tokens, dtype=np.int64)
    if a.ndim != 1 or a.size % n_codebooks:
        raise LayoutShapeError(f"{a.size} codes is not a whole number of frames of {n_codebooks}")
    f = a.reshape(-1, n_codebooks)
    return [np.ascontiguousarray(f[:, q], dtype=np.int32) for q in range(n_codebooks)]


def levels_to_frames(levels: Sequence[npt.ArrayLike]) -> npt.NDArray[np.int32]:
    """One array per codebook (equal lengths) -> frame-major codes."""
    return np.ascontiguousarray(np.stack([np.asarray(x, dtype=np.int32) for x in levels], axis=1).reshape(-1))


def parse_outetts_text(text: str, codebook_size: int = 1024) -> list[npt.NDArray[np.int32]]:
    """OuteTTS 1.0's audio tokens in LM text (``<|c1_N|>``, ``<|c2_M|>``; everything else
    skipped) -> ``[codebook 0, codebook 1]`` int32 codes, as outetts extracts them: every c1 in
    order, every c2 in order, both cut to the shorter. A value outside ``[0, codebook_size)``
    (OuteTTS' vocabulary has 1024) is a :class:`LayoutRangeError` naming it."""
    levels = []
    for q, rx in enumerate((_OUTETTS_C1, _OUTETTS_C2)):
        vals = np.asarray([int(m) for m in rx.findall(text)], dtype=np.int64)
        bad = np.flatnonzero(vals >= codebook_size)
        if bad.size:
            j = int(bad[0])
            raise LayoutRangeError(f"<|c{q + 1}_{int(vals[j])}|> (the {j}th c{q + 1} token) is not a code "
                                   f"of [0, {codebook_size})", index=j, value=int(vals[j]), level=q)
        levels.append(vals)
    n = min(len(levels[0]), len(levels[1]))
    if n == 0:
        raise LayoutShapeError("no <|c1_N|><|c2_M|> audio tokens found")
    return [np.ascontiguousarray(a[:n], dtype=np.int32) for a in levels]


class _FramesAssembler(Assembler):
    """Codes checked at their positions; whole frames become per-codebook codes."""

    def __init__(self, codebook_sizes: Sequence[int]) -> None:
        self.limit = np.asarray(codebook_sizes, dtype=np.int64)
        self.n = len(self.limit)
        self.n_tokens = 0
        self.partial = np.zeros(0, dtype=np.int64)

    def feed(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        tokens = np.asarray(payload, dtype=np.int64)
        q = (self.n_tokens + np.arange(tokens.size, dtype=np.int64)) % self.n
        bad = np.flatnonzero((tokens < 0) | (tokens >= self.limit[q]))
        if bad.size:
            j = int(bad[0])
            idx = self.n_tokens + j
            raise LayoutRangeError(f"code {int(tokens[j])} at index {idx} (codebook {int(q[j])} of its "
                                   f"frame) is outside [0, {int(self.limit[q[j]])})",
                                   index=idx, value=int(tokens[j]))
        self.n_tokens += int(tokens.size)
        allc = np.concatenate([self.partial, tokens])
        k = allc.size // self.n
        self.partial = allc[k * self.n:].copy()
        if k == 0:
            return None
        return frames_to_levels(allc[: k * self.n], self.n)

    def end(self, level_codes: Sequence[int]) -> None:
        if self.partial.size:
            raise LayoutShapeError(f"end after {self.n_tokens} codes: the last frame has "
                                   f"{self.partial.size} of {self.n} codes",
                                   index=self.n_tokens - int(self.partial.size))


class DacFramesLayout(Layout):
    """Every codebook's code of a frame together, frames in time order (stride-1 models)."""

    name = "dac_frames"

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        if any(s != 1 for s in level_strides):
            return "dac_frames needs every level at the frame rate (strides 1)"
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _FramesAssembler(codebook_sizes)


DAC_FRAMES = DacFramesLayout()


class DacFamily(Family):
    name = "dac"
    architectures = ("dac",)
    converter = "dac"
    layouts: ClassVar[tuple[Layout, ...]] = (DAC_FRAMES, LEVELS)
    precisions: ClassVar[tuple[str, ...]] = ("f32", "bf16", "bf16x3")

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        return ExactStreamModel(name, model, config, device,
                                precision=self.precision_of(name, config))
