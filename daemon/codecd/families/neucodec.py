"""The NeuCodec family (neuphonic/neucodec, the decoder of NeuTTS Air / Nano).

* architectures: ``neucodec`` (50 Hz FSQ codes 0..65535, 24 kHz); converter ``neucodec``;
* layouts: NeuTTS' ``<|speech_N|>`` codes (``neutts``) and per-level codes;
* streams: windowed (:mod:`codecd.families.windowed`), by default NeuTTS' own
  scheme (25-frame chunks, 50 back, 5 ahead: 600 ms of codes before the first
  audio), "low" a shorter window;
* warm-up: a steady window at the largest batch bucket and at batch 1.
"""

from __future__ import annotations

from typing import ClassVar

from .layout import LEVELS, Layout
from .lmtokens import NEUTTS
from .windowed import WindowedFamily

__all__ = ["NeuCodecFamily"]


class NeuCodecFamily(WindowedFamily):
    name = "neucodec"
    architectures = ("neucodec",)
    converter = "neucodec"
    layouts: ClassVar[tuple[Layout, ...]] = (NEUTTS, LEVELS)
