"""The Chatterbox layout: S3 speech tokens as Chatterbox's T3 language model emits them (pure numpy).

T3 emits S3 speech tokens 0..6560 plus two control ids (t3_config.py:
``start_speech_token``, ``stop_speech_token``). On the wire (layout
``chatterbox_ids``) a stream takes the LM's ids as they come: a leading
start-of-speech id is dropped, the stop-of-speech id ends the stream (no
``end`` needed). :class:`ChatterboxIds` is the incremental parser, for the
daemon's streams and for callers of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .layout import Assembler, Layout, LayoutError, LayoutRangeError, as_int_1d

__all__ = ["CHATTERBOX_VOCAB", "CHATTERBOX_SOS", "CHATTERBOX_EOS", "ChatterboxIds",
           "chatterbox_ids_to_tokens", "CHATTERBOX_IDS"]

#: speech tokens are 0..6560; the two control ids follow
CHATTERBOX_VOCAB = 6561
CHATTERBOX_SOS = 6561
CHATTERBOX_EOS = 6562


class ChatterboxIds:
    """Incremental parser of Chatterbox LM ids into S3Gen payload tokens.

    The start-of-speech id is dropped when it is the stream's first id; the
    stop-of-speech id ends the stream (``ended``). Anything else outside
    0..6560 (:class:`LayoutRangeError` with the absolute index), a
    start-of-speech id later on, and ids after the stop (:class:`LayoutError`)
    are errors, and a failing ``push`` consumes nothing.
    """

    def __init__(self) -> None:
        self.position = 0  # ids consumed so far
        self.ended = False

    def push(self, ids: Any) -> npt.NDArray[np.int32]:
        a = as_int_1d(ids, "Chatterbox LM ids")
        if self.ended and a.size:
            raise LayoutError("tokens after the stop-of-speech id")
        start = 1 if self.position == 0 and a.size and int(a[0]) == CHATTERBOX_SOS else 0
        stop = np.flatnonzero(a == CHATTERBOX_EOS)
        end = int(stop[0]) if stop.size else a.size
        if stop.size and end + 1 < a.size:
            raise LayoutError(f"{a.size - end - 1} ids after the stop-of-speech id at index "
                              f"{self.position + end}")
        body = a[start:end]
        bad = np.flatnonzero((body < 0) | (body >= CHATTERBOX_VOCAB))
        if bad.size:
            j = int(bad[0])
            idx = self.position + start + j
            raise LayoutRangeError(f"Chatterbox LM id {int(body[j])} at index {idx} is not a speech "
                                   f"token (0..{CHATTERBOX_VOCAB - 1}; {CHATTERBOX_SOS} starts, "
                                   f"{CHATTERBOX_EOS} stops)", index=idx, value=int(body[j]))
        self.position += int(a.size)
        self.ended = bool(stop.size)
        return body.astype(np.int32)


def chatterbox_ids_to_tokens(ids: Any) -> tuple[npt.NDArray[np.int32], bool]:
    """A whole sequence of Chatterbox LM ids: (payload tokens, whether the stop id ended it)."""
    p = ChatterboxIds()
    toks = p.push(ids)
    return toks, p.ended


class _ChatterboxAssembler(Assembler):
    def __init__(self) -> None:
        self.parser = ChatterboxIds()
        self.tokens = 0  # speech tokens passed on

    def feed(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        body = self.parser.push(payload)
        self.ended = self.parser.ended
        self.tokens += int(body.size)
        if self.ended and self.tokens == 0:
            raise LayoutError("stop-of-speech before any speech token")
        return [body] if body.size or self.ended else None


class ChatterboxLayout(Layout):
    """``chatterbox_ids``: the T3 LM's ids, control ids included, over an S3Gen model."""

    name = "chatterbox_ids"

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        if n_levels != 1 or codebook_sizes[0] != CHATTERBOX_VOCAB:
            return f"the chatterbox_ids layout needs one level of {CHATTERBOX_VOCAB} codes"
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _ChatterboxAssembler()


CHATTERBOX_IDS = ChatterboxLayout()
