"""LM speech-token layouts of the one-codebook codecs (codecd.families.lmtokens): pure numpy."""

from __future__ import annotations

import numpy as np
import pytest

from codecd.families.layout import LayoutError, LayoutRangeError
from codecd.families.lmtokens import (
    LLASA,
    LLASA_IDS,
    LLASA_SPEECH_END,
    LLASA_SPEECH_START,
    LLASA_TOKEN_OFFSET,
    NEUTTS,
    OUTETTS_WAVTOKENIZER,
    codes_from_text,
)


def _a(*v: int) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


def test_text_forms_as_upstream_extracts_them():
    """Only the layout's own tokens count, in order; word markers, durations, other tokens
    are skipped (OuteTTS' <|t_0.27|> has no digits-only body)."""
    oute = ("<|im_start|>\n<|text_start|>hi<|text_end|>\n<|audio_start|>\n"
            "hi<|t_0.27|><|code_start|><|12|><|4095|><|0|><|code_end|>\n<|audio_end|>")
    assert codes_from_text("outetts_wavtokenizer", oute).tolist() == [12, 4095, 0]
    neu = "assistant:<|SPEECH_GENERATION_START|><|speech_1|><|speech_65535|>x<|speech_007|>"
    assert codes_from_text("neutts", neu).tolist() == [1, 65535, 7]
    llasa = "<|SPEECH_GENERATION_START|><|s_5|><|s_65535|><|SPEECH_GENERATION_END|>"
    assert codes_from_text("llasa", llasa).tolist() == [5, 65535]
    assert codes_from_text("neutts", "<|s_5|><|12|>").size == 0
    with pytest.raises(LayoutError):
        codes_from_text("levels", "<|1|>")


def test_code_ranges():
    """OuteTTS' <|4096|>..<|4099|> are in the vocabulary but not codes; FSQ codes are 0..65535."""
    a = OUTETTS_WAVTOKENIZER.assembler([4096], [1])
    assert a.feed(_a(0, 4095))[0].tolist() == [0, 4095]
    with pytest.raises(LayoutRangeError, match=r"<\|4096\|>") as ei:
        a.feed(_a(7, 4096))
    assert (ei.value.index, ei.value.value, ei.value.code) == (3, 4096, "token_range")
    n = NEUTTS.assembler([65536], [1])
    assert n.feed(_a(65535))[0].dtype == np.int32
    with pytest.raises(LayoutRangeError, match="speech_65536"):
        n.feed(_a(65536))
    with pytest.raises(LayoutRangeError):
        LLASA.assembler([65536], [1]).feed(_a(-1))
    assert LLASA.assembler([65536], [1]).feed(_a()) is None


def test_layouts_fit_only_their_code_shape():
    assert OUTETTS_WAVTOKENIZER.check(1, [4096], [1]) is None
    assert OUTETTS_WAVTOKENIZER.check(1, [65536], [1]) is not None
    assert NEUTTS.check(1, [65536], [1]) is None and NEUTTS.check(2, [65536] * 2, [1, 1])
    assert LLASA_IDS.check(1, [4096], [1]) is not None


def test_llasa_ids_start_end_and_errors():
    """The start id is dropped at the very beginning, the end id ends the stream, the ids of
    <|s_N|> map to N; split anywhere."""
    codes = [0, 5, 65535]
    ids = [LLASA_SPEECH_START, *(c + LLASA_TOKEN_OFFSET for c in codes), LLASA_SPEECH_END]
    a = LLASA_IDS.assembler([65536], [1])
    got = []
    for piece in (ids[:1], ids[1:3], [], ids[3:]):
        out = a.feed(_a(*piece))
        if out is not None:
            got += out[0].tolist()
    assert got == codes and a.ended
    with pytest.raises(LayoutError, match="after"):
        a.feed(_a(LLASA_TOKEN_OFFSET))
    b = LLASA_IDS.assembler([65536], [1])
    with pytest.raises(LayoutRangeError) as ei:  # a start id later on is no speech token
        b.feed(_a(LLASA_TOKEN_OFFSET, LLASA_SPEECH_START))
    assert ei.value.index == 1
    with pytest.raises(LayoutError, match="ids after"):
        LLASA_IDS.assembler([65536], [1]).feed(_a(LLASA_TOKEN_OFFSET, LLASA_SPEECH_END, 5))
    with pytest.raises(LayoutError, match="before any speech"):
        LLASA_IDS.assembler([65536], [1]).feed(_a(LLASA_SPEECH_START, LLASA_SPEECH_END))
    with pytest.raises(LayoutRangeError):
        LLASA_IDS.assembler([65536], [1]).feed(_a(LLASA_TOKEN_OFFSET + 65536))
