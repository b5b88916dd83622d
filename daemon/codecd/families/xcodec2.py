"""The XCodec2 family (HKUSTAudio/xcodec2, the decoder of Llasa).

* architectures: ``xcodec2`` (50 Hz FSQ codes 0..65535, 16 kHz); converter ``xcodec2``;
* layouts: Llasa's Llama-3 ids (``llasa_ids``: start id dropped, end id ends the
  stream), Llasa's ``<|s_N|>`` codes (``llasa``) and per-level codes;
* streams: windowed (:mod:`codecd.families.windowed`), NeuTTS' scheme by
  default (600 ms of codes before the first audio), "low" a shorter window;
* warm-up: a steady window at the largest batch bucket and at batch 1.
"""

from __future__ import annotations

from typing import ClassVar

from .layout import LEVELS, Layout
from .lmtokens import LLASA, LLASA_IDS
from .windowed import WindowedFamily

__all__ = ["XCodec2Family"]


class XCodec2Family(WindowedFamily):
    name = "xcodec2"
    architectures = ("xcodec2",)
    converter = "xcodec2"
    layouts: ClassVar[tuple[Layout, ...]] = (LLASA_IDS, LLASA, LEVELS)
