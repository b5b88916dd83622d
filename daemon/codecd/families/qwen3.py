"""The Qwen3-TTS 12 Hz tokenizer family: 16 RVQ codebooks at 12.5 Hz, 24 kHz, exact streaming.

* architectures: ``qwen3``; converter ``qwen3`` (the released folder
  ``Qwen/Qwen3-TTS-Tokenizer-12Hz``, or ``speech_tokenizer/`` of a Qwen3-TTS-12Hz
  model: ``config.json`` + ``model.safetensors``);
* layouts: per-level codes (``levels``: one array per codebook, all at 12.5 Hz);
  Qwen3-TTS's talker emits 16 codes per frame (its code predictor's output), in
  codebook order 0..15;
* codebooks: fixed per stream at ``start`` (``"codebooks": K``, 1..16; absent:
  16), as Mimi's (:class:`codecd.families.mimi.MimiFamily`, whose stream plan this
  family shares): the split RVQ sums the codebooks it gets;
* streams: exact, latency 0 beyond the frame (every layer is causal: a frame's
  1,920 samples are final when its codes arrive), no voice, no low mode;
* warm-up: :class:`codecd.families.native.ExactStreamModel`.
"""

from __future__ import annotations

from .mimi import MimiFamily

__all__ = ["Qwen3Family"]


class Qwen3Family(MimiFamily):
    name = "qwen3"
    architectures = ("qwen3",)
    converter = "qwen3"
