"""The WavTokenizer family (jishengpeng/WavTokenizer as OuteTTS 0.2 / 0.3 use it).

* architectures: ``wavtokenizer`` (75 and 40 tokens/s, 24 kHz, one codebook of
  4096); converter ``wavtokenizer``;
* layouts: OuteTTS' ``<|N|>`` codes (``outetts_wavtokenizer``) and per-level codes;
* streams: windowed (:mod:`codecd.families.windowed`; the decoder's attention
  and GroupNorm span the utterance), NeuTTS' window counted in frames (at 75
  frames/s: 333 ms chunks, 400 ms before the first audio), "low" a shorter one;
* warm-up: a steady window at the largest batch bucket and at batch 1.
"""

from __future__ import annotations

from typing import ClassVar

from .layout import LEVELS, Layout
from .lmtokens import OUTETTS_WAVTOKENIZER
from .windowed import WindowedFamily

__all__ = ["WavTokenizerFamily"]


class WavTokenizerFamily(WindowedFamily):
    name = "wavtokenizer"
    architectures = ("wavtokenizer",)
    converter = "wavtokenizer"
    layouts: ClassVar[tuple[Layout, ...]] = (OUTETTS_WAVTOKENIZER, LEVELS)
