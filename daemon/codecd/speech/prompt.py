"""The Orpheus text front: the prompt the language model is given, its voices, sentence
splitting, and the incremental parser of the ``<custom_token_N>`` text it streams back.

The prompt is the Orpheus project's (canopyai/Orpheus-TTS ``engine_class._format_prompt``):
the token ids ``[128259] + tokenize("{voice}: {text}") + [128009, 128260, 128261,
128257]`` decoded to text, i.e.::

    <custom_token_3><|begin_of_text|>tara: Hello there.<|eot_id|>
    <custom_token_4><custom_token_5><custom_token_1>          (one line, no newline)

(128259 is ``<custom_token_3>``, start of human; 128009 ``<|eot_id|>``; 128260/128261
``<custom_token_4>``/``<custom_token_5>`` end of human and start of AI; 128257
``<custom_token_1>`` start of speech). The model then emits audio tokens
``<custom_token_N>`` with N >= 10 (7 per SNAC frame, see :mod:`codecd.families.orpheus`)
and ends with ``<custom_token_2>`` (128258, end of speech). A server that tokenizes
special-token text (llama.cpp's server, vLLM) turns this string into those ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..families.orpheus import ORPHEUS_CUSTOM_TOKEN_OFFSET, ORPHEUS_TOKEN_BASE

__all__ = ["ORPHEUS_VOICES", "DEFAULT_VOICE", "OPENAI_VOICES", "orpheus_prompt", "split_sentences",
           "TokenParser", "END_OF_SPEECH", "STOP"]

#: the voices of the released English fine-tune (canopylabs/orpheus-3b-0.1-ft), in the
#: project's order of preference
ORPHEUS_VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
DEFAULT_VOICE = "tara"
#: OpenAI's voice names -> Orpheus voices, so that clients which only accept OpenAI's names
#: (Pipecat's OpenAITTSService checks them) can pick a voice; genders matched where known
OPENAI_VOICES = {
    "alloy": "tara", "ash": "dan", "ballad": "leo", "cedar": "zac", "coral": "leah",
    "echo": "leo", "fable": "dan", "marin": "mia", "nova": "jess", "onyx": "zac",
    "sage": "zoe", "shimmer": "mia", "verse": "leo",
}
#: N of <custom_token_N> the model emits at the end of its speech
END_OF_SPEECH = 2
#: stop strings sent upstream (end of speech; the eos of the base model)
STOP = ("<custom_token_2>", "<|eot_id|>")

_START = "<custom_token_3><|begin_of_text|>"
_END = "<|eot_id|><custom_token_4><custom_token_5><custom_token_1>"


def orpheus_prompt(text: str, voice: str | None) -> str:
    """The completion prompt for ``text`` spoken by ``voice`` (None: the untagged prompt)."""
    body = f"{voice}: {text}" if voice else text
    return f"{_START}{body}{_END}"


# Sentence ends: . ! ? (and their full-width forms, and ellipses) followed by space, closing
# quotes or brackets allowed between. Abbreviations are not guessed at: a split inside one
# costs a short pause, not an error.
_SENT_END = re.compile(r"(?<=[.!?\u3002\uff01\uff1f\u2026])[\"'\u201d\u2019)\]]*\s+")


def split_sentences(text: str, max_chars: int) -> list[str]:
    """Pieces of ``text`` of at most ``max_chars`` (when the text allows), cut at sentence
    boundaries, consecutive sentences packed together; a sentence longer than ``max_chars``
    is cut at the last space before the limit (or hard, if it has none)."""
    text = " ".join(text.split())
    if not text:
        return []
    sents = [s for s in _SENT_END.split(text) if s.strip()]
    pieces: list[str] = []
    cur = ""
    for s in sents:
        while len(s) > max_chars:
            cut = s.rfind(" ", 0, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            if cur:
                pieces.append(cur)
                cur = ""
            pieces.append(s[:cut].strip())
            s = s[cut:].strip()
        if not s:
            continue
        if cur and len(cur) + 1 + len(s) > max_chars:
            pieces.append(cur)
            cur = s
        else:
            cur = f"{cur} {s}" if cur else s
    if cur:
        pieces.append(cur)
    return pieces


_TOKEN = re.compile(r"<custom_token_(\d+)>")


@dataclass
class TokenParser:
    """Incremental ``<custom_token_N>`` parser over text that arrives in arbitrary pieces.

    :meth:`feed` returns the raw Orpheus token ids (``N + 128256``) of the complete audio
    tokens (N >= 10) in the new text; a tag cut between two pieces is kept until its end
    arrives. Other text (control tokens N < 10, words, whitespace) is skipped and counted
    in :attr:`skipped_chars`; ``<custom_token_2>`` sets :attr:`ended`.
    """

    tail: str = ""
    n_audio: int = 0
    ended: bool = False
    skipped_chars: int = 0
    _ids: list[int] = field(default_factory=list)

    def feed(self, text: str) -> npt.NDArray[np.int64]:
        s = self.tail + text
        ids: list[int] = []
        pos = 0
        for m in _TOKEN.finditer(s):
            self.skipped_chars += len(s[pos:m.start()].strip())
            pos = m.end()
            if self.ended:
                continue
            n = int(m.group(1))
            if n >= ORPHEUS_CUSTOM_TOKEN_OFFSET:
                ids.append(n + ORPHEUS_TOKEN_BASE - ORPHEUS_CUSTOM_TOKEN_OFFSET)
            elif n == END_OF_SPEECH:
                self.ended = True
        rest = s[pos:]
        lt = rest.rfind("<")
        if lt >= 0 and ">" not in rest[lt:] and len(rest) - lt < 32:
            self.skipped_chars += len(rest[:lt].strip())
            self.tail = rest[lt:]  # a tag cut in two
        else:
            self.skipped_chars += len(rest.strip())
            self.tail = ""
        self.n_audio += len(ids)
        return np.asarray(ids, dtype=np.int64)
