"""Layouts of single-codebook speech tokens as TTS language models print them (pure numpy).

Each of these LMs prints one speech token per codec frame, as a text token with
the code in it; upstream reads the code back with a regular expression and
skips every other token (word markers, durations, punctuation):

======================== ============= ================== ===================================
layout                   codec         LM text form       code
======================== ============= ================== ===================================
``outetts_wavtokenizer`` WavTokenizer  ``<|N|>``          N in 0..4095 (OuteTTS 0.2 / 0.3; the
                                                          vocabulary has ``<|4096|>`` ..
                                                          ``<|4099|>``, not valid codes)
``neutts``               NeuCodec      ``<|speech_N|>``   N in 0..65535 (NeuTTS Air / Nano)
``llasa``                XCodec2       ``<|s_N|>``        N in 0..65535 (Llasa 1B / 3B / 8B)
``llasa_ids``            XCodec2       Llama-3 token ids  id - 128264; 128260
                                                          (``<|SPEECH_GENERATION_START|>``)
                                                          dropped first, 128261 (``_END``) ends
======================== ============= ================== ===================================

On the wire a ``tokens`` message carries the numbers N (the LM's ids for
``llasa_ids``, whose ids are fixed by the Llama-3 vocabulary every Llasa model
shares). :func:`codes_from_text` extracts them from an LM's text output exactly as
upstream does (OuteTTS' ``<\\|(\\d+)\\|>``, NeuTTS' ``<\\|speech_(\\d+)\\|>``,
Llasa's ``<|s_`` ... ``|>``), for clients that hold text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
import numpy as np
import numpy.typing as npt

from .layout import Assembler, Layout, LayoutError, LayoutRangeError

__all__ = ["LmTokenLayout", "LlasaIdsLayout", "OUTETTS_WAVTOKENIZER", "NEUTTS", "LLASA", "LLASA_IDS",
           "LLASA_TOKEN_OFFSET", "LLASA_SPEECH_START", "LLASA_SPEECH_END", "codes_from_text"]

#: Llasa: ``<|s_N|>`` is Llama-3 id 128264 + N (8 added control tokens after 128256)
LLASA_TOKEN_OFFSET = 128264
LLASA_SPEECH_START = 128260
LLASA_SPEECH_END = 128261

_REGEX = {
    "outetts_wavtokenizer": re.compile(r"<\|(\d+)\|>"),
    "neutts": re.compile(r"<\|speech_(\d+)\|>"),
    "llasa": re.compile(r"<\|s_(\d+)\|>"),
}


class _CodesAssembler(Assembler):
    def __init__(self, layout: LmTokenLayout, codebook_size: int) -> None:
        self.layout = layout
        self.limit = min(codebook_size, layout.n_codes)
        self.n = 0

    def feed(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        a = payload
        bad = np.flatnonzero((a < 0) | (a >= self.limit))
        if bad.size:
            j = int(bad[0])
            raise LayoutRangeError(f"{self.layout.name}: token {self.layout.form(int(a[j]))} at "
                                   f"index {self.n + j} is not a code (0..{self.limit - 1})",
                                   index=self.n + j, value=int(a[j]))
        self.n += int(a.size)
        return [a.astype(np.int32)] if a.size else None


class LmTokenLayout(Layout):
    """The number N of an LM's speech token (one per frame) over a one-codebook model."""

    def __init__(self, name: str, form: str, n_codes: int) -> None:
        self.name = name
        self._form = form
        self.n_codes = n_codes

    def form(self, n: int) -> str:
        return self._form.format(n)

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        if n_levels != 1 or codebook_sizes[0] != self.n_codes:
            return f"the {self.name} layout needs one level of {self.n_codes} codes"
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _CodesAssembler(self, int(codebook_sizes[0]))


class _LlasaIdsAssembler(Assembler):
    def __init__(self) -> None:
        self.position = 0
        self.speech = 0

    def feed(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        a = payload
        if self.ended and a.size:
            raise LayoutError("llasa_ids: tokens after <|SPEECH_GENERATION_END|>")
        first = 1 if self.position == 0 and a.size and int(a[0]) == LLASA_SPEECH_START else 0
        stop = np.flatnonzero(a == LLASA_SPEECH_END)
        end = int(stop[0]) if stop.size else a.size
        if stop.size and end + 1 < a.size:
            raise LayoutError(f"llasa_ids: {a.size - end - 1} ids after <|SPEECH_GENERATION_END|> "
                              f"at index {self.position + end}")
        codes = a[first:end] - LLASA_TOKEN_OFFSET
        bad = np.flatnonzero((codes < 0) | (codes >= 65536))
        if bad.size:
            j = int(bad[0])
            idx = self.position + first + j
            raise LayoutRangeError(f"llasa_ids: id {int(a[first + j])} at index {idx} is not a speech "
                                   f"token <|s_N|> ({LLASA_TOKEN_OFFSET}..{LLASA_TOKEN_OFFSET + 65535}; "
                                   f"{LLASA_SPEECH_START} starts, {LLASA_SPEECH_END} ends)",
                                   index=idx, value=int(a[first + j]))
        self.position += int(a.size)
        self.speech += int(codes.size)
        self.ended = bool(stop.size)
        if self.ended and self.speech == 0:
            raise LayoutError("llasa_ids: <|SPEECH_GENERATION_END|> before any speech token")
        return [codes.astype(np.int32)] if codes.size or self.ended else None


class LlasaIdsLayout(Layout):
    """``llasa_ids``: Llasa's Llama-3 token ids as generated, control ids included."""

    name = "llasa_ids"

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        if n_levels != 1 or codebook_sizes[0] != 65536:
            return "the llasa_ids layout needs one level of 65536 codes"
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _LlasaIdsAssembler()


OUTETTS_WAVTOKENIZER = LmTokenLayout("outetts_wavtokenizer", "<|{}|>", 4096)
NEUTTS = LmTokenLayout("neutts", "<|speech_{}|>", 65536)
LLASA = LmTokenLayout("llasa", "<|s_{}|>", 65536)
LLASA_IDS = LlasaIdsLayout()


def codes_from_text(layout: str, text: str) -> npt.NDArray[np.int64]:
    """The numbers N of every speech token of ``layout`` in an LM's text output, in order (as
    upstream extracts them); other text is skipped. The values are not range-checked here
    (a stream's layout does that: OuteTTS' ``<|4096|>`` .. ``<|4099|>`` are rejected)."""
    try:
        rx = _REGEX[layout]
    except KeyError:
        raise LayoutError(f"no text form for layout {layout!r} (known: {', '.join(_REGEX)})") \
            from None
    return np.asarray([int(m) for m in rx.findall(text)], dtype=np.int64)
