"""The Orpheus layout: SNAC codes as the Orpheus TTS language model emits them (pure numpy).

Orpheus (canopylabs, SNAC 24 kHz: 3 levels, strides 4/2/1) emits 7 audio tokens
per coarse frame ("group"), in the order::

    [c0, c1a, c2a, c2b, c1b, c2c, c2d]

level 0 has one code per group, level 1 two (c1a, c1b), level 2 four
(c2a, c2b, c2c, c2d). The LM's raw token id of the token at index ``i`` of the
audio token sequence is ``128266 + (i % 7) * 4096 + code``; in text form it is
``<custom_token_N>`` with ``N = 10 + (i % 7) * 4096 + code``.

Two wire layouts (:data:`ORPHEUS_IDS`: raw token ids, :data:`ORPHEUS`: the codes
0..4095) for the daemon's streams, and the whole-sequence conversions and text
parsing the command line uses.

Errors: every function raises :class:`LayoutError` (a ``ValueError``) or one
of its subclasses, :class:`LayoutRangeError` (a value out of range for its
position; attributes ``index`` and ``value``) and :class:`LayoutShapeError`
(incomplete trailing group, levels of inconsistent length). Neither torch nor
the native runtime is imported here (``codecrt.InputError`` is also a
``ValueError``, so ``except ValueError`` catches both).
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from .layout import Assembler, Layout, LayoutError, LayoutRangeError, LayoutShapeError, as_int_1d

__all__ = [
    "ORPHEUS_GROUP", "ORPHEUS_CODEBOOK_SIZE", "ORPHEUS_TOKEN_BASE", "ORPHEUS_CUSTOM_TOKEN_OFFSET",
    "ORPHEUS_LEVEL_STRIDES", "LayoutError", "LayoutRangeError", "LayoutShapeError",
    "orpheus_to_levels", "levels_to_orpheus", "orpheus_ids_to_codes", "codes_to_orpheus_ids",
    "custom_tokens_to_ids", "ids_to_custom_tokens", "parse_tokens", "parse_orpheus_text",
    "ORPHEUS", "ORPHEUS_IDS",
]

ORPHEUS_GROUP = 7
ORPHEUS_CODEBOOK_SIZE = 4096
#: raw token id of <custom_token_10>, the first audio token (code 0 at position 0)
ORPHEUS_TOKEN_BASE = 128266
#: N of <custom_token_N> minus this is the position-offset code
ORPHEUS_CUSTOM_TOKEN_OFFSET = 10
#: SNAC level strides in frames implied by the layout (1, 2, 4 codes per group)
ORPHEUS_LEVEL_STRIDES = (4, 2, 1)

#: level of each position of a group, and the index inside that level's group slice
_POS_LEVEL = (0, 1, 2, 2, 1, 2, 2)
_POS_SLOT = (0, 0, 0, 1, 1, 2, 3)
_CODES_PER_GROUP = (1, 2, 4)


def _complete_groups(n: int, drop_incomplete: bool, what: str) -> int:
    k, rem = divmod(n, ORPHEUS_GROUP)
    if rem and not drop_incomplete:
        raise LayoutShapeError(
            f"{what}: {n} tokens is not a whole number of {ORPHEUS_GROUP}-token groups "
            f"({rem} trailing); pass drop_incomplete=True (--drop-incomplete) to drop them")
    return k


def _check_codes(c: np.ndarray, what: str, codebook_size: int) -> None:
    bad = np.flatnonzero((c < 0) | (c >= codebook_size))
    if bad.size:
        i = int(bad[0])
        raise LayoutRangeError(f"{what}: code {int(c[i])} at index {i} is outside [0, {codebook_size})",
                               index=i, value=int(c[i]))


def orpheus_to_levels(codes_7, *, drop_incomplete: bool = False,
                      codebook_size: int = ORPHEUS_CODEBOOK_SIZE) -> list[np.ndarray]:
    """Interleaved Orpheus codes (length 7k) -> ``[l0 (k), l1 (2k), l2 (4k)]`` int32 arrays.

    Codes must lie in ``[0, codebook_size)``. A length that is not a multiple
    of 7 is an error unless ``drop_incomplete`` drops the trailing tokens.
    """
    c = as_int_1d(codes_7, "Orpheus codes")
    k = _complete_groups(c.size, drop_incomplete, "Orpheus codes")
    c = c[: k * ORPHEUS_GROUP]
    _check_codes(c, "Orpheus codes", codebook_size)
    g = c.reshape(k, ORPHEUS_GROUP)
    l0 = g[:, 0]
    l1 = g[:, [1, 4]].reshape(-1)
    l2 = g[:, [2, 3, 5, 6]].reshape(-1)
    return [np.ascontiguousarray(l, dtype=np.int32) for l in (l0, l1, l2)]


def levels_to_orpheus(levels: Sequence, *, codebook_size: int = ORPHEUS_CODEBOOK_SIZE) -> np.ndarray:
    """``[l0 (k), l1 (2k), l2 (4k)]`` -> interleaved Orpheus codes (7k,) int32; inverse of orpheus_to_levels."""
    if len(levels) != 3:
        raise LayoutShapeError(f"Orpheus layout has 3 levels, got {len(levels)}")
    ls = [as_int_1d(l, f"level {i}") for i, l in enumerate(levels)]
    k = ls[0].size
    for i, l in enumerate(ls):
        if l.size != _CODES_PER_GROUP[i] * k:
            raise LayoutShapeError(f"level {i} has {l.size} codes, expected {_CODES_PER_GROUP[i] * k} "
                                   f"({_CODES_PER_GROUP[i]} per level-0 code; level 0 has {k})")
        _check_codes(l, f"level {i}", codebook_size)
    g = np.empty((k, ORPHEUS_GROUP), dtype=np.int32)
    g[:, 0] = ls[0]
    g[:, [1, 4]] = ls[1].reshape(k, 2)
    g[:, [2, 3, 5, 6]] = ls[2].reshape(k, 4)
    return g.reshape(-1)


def _position_offsets(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) % ORPHEUS_GROUP) * ORPHEUS_CODEBOOK_SIZE


def orpheus_ids_to_codes(ids, *, drop_incomplete: bool = False, start: int = 0) -> np.ndarray:
    """Raw Orpheus LM token ids -> interleaved codes (int32): ``id - 128266 - (i % 7) * 4096``.

    ``i`` counts from ``start`` (the index of ``ids[0]`` in the audio token
    sequence; 0 for a whole sequence). Every id must map into [0, 4096) for
    its position, else :class:`LayoutRangeError` naming the index, id and the
    valid id range. Incomplete trailing groups: see :func:`orpheus_to_levels`.
    """
    a = as_int_1d(ids, "Orpheus token ids")
    n = a.size
    if (start + n) % ORPHEUS_GROUP and not drop_incomplete:
        _complete_groups(start + n, False, "Orpheus token ids")
    if drop_incomplete:
        n = ((start + n) // ORPHEUS_GROUP) * ORPHEUS_GROUP - start
        n = max(n, 0)
        a = a[:n]
    off = ORPHEUS_TOKEN_BASE + (np.arange(start, start + n, dtype=np.int64) % ORPHEUS_GROUP) * ORPHEUS_CODEBOOK_SIZE
    c = a - off
    bad = np.flatnonzero((c < 0) | (c >= ORPHEUS_CODEBOOK_SIZE))
    if bad.size:
        i = int(bad[0])
        lo = int(off[i])
        raise LayoutRangeError(
            f"Orpheus token id {int(a[i])} at index {start + i} (position {(start + i) % ORPHEUS_GROUP} "
            f"of its group) is outside [{lo}, {lo + ORPHEUS_CODEBOOK_SIZE}) for that position",
            index=start + i, value=int(a[i]))
    return c.astype(np.int32)


def codes_to_orpheus_ids(codes, *, start: int = 0) -> np.ndarray:
    """Interleaved codes -> raw Orpheus token ids (int64); inverse of orpheus_ids_to_codes."""
    c = as_int_1d(codes, "Orpheus codes")
    _check_codes(c, "Orpheus codes", ORPHEUS_CODEBOOK_SIZE)
    off = ORPHEUS_TOKEN_BASE + (np.arange(start, start + c.size, dtype=np.int64) % ORPHEUS_GROUP) * ORPHEUS_CODEBOOK_SIZE
    return c + off


_CUSTOM_RE = re.compile(r"<custom_token_(\d+)>")
_TOKEN_RE = re.compile(r"<custom_token_\d+>|[^\s,<>]+|<[^>]*>?")


def custom_tokens_to_ids(ns: Iterable[int]) -> np.ndarray:
    """``N`` of ``<custom_token_N>`` -> raw token ids (``id = N + 128256``)."""
    return np.asarray(list(ns), dtype=np.int64) + (ORPHEUS_TOKEN_BASE - ORPHEUS_CUSTOM_TOKEN_OFFSET)


def ids_to_custom_tokens(ids) -> list[str]:
    """Raw token ids -> ``<custom_token_N>`` strings."""
    a = as_int_1d(ids, "token ids")
    return [f"<custom_token_{int(i) - (ORPHEUS_TOKEN_BASE - ORPHEUS_CUSTOM_TOKEN_OFFSET)}>" for i in a]


def parse_tokens(text: str) -> tuple[np.ndarray, bool]:
    """Parse whitespace/comma separated integers and/or ``<custom_token_N>`` strings.

    Returns ``(values, any_custom)``: ``<custom_token_N>`` becomes its raw token
    id (``N + 128256``) and plain integers are returned as written; the flag
    says whether any custom-token string was present. Anything else (another
    word, a malformed tag) is a :class:`LayoutError` naming the token.
    """
    vals: list[int] = []
    custom = False
    for j, tok in enumerate(_TOKEN_RE.findall(text)):
        m = _CUSTOM_RE.fullmatch(tok)
        if m:
            vals.append(int(m.group(1)) + ORPHEUS_TOKEN_BASE - ORPHEUS_CUSTOM_TOKEN_OFFSET)
            custom = True
            continue
        try:
            vals.append(int(tok, 10))
        except ValueError:
            shown = tok if len(tok) <= 40 else tok[:37] + "..."
            raise LayoutError(f"token {j}: {shown!r} is neither an integer nor <custom_token_N>") from None
    return np.asarray(vals, dtype=np.int64), custom


def parse_orpheus_text(text: str, *, kind: str = "auto", drop_incomplete: bool = False) -> np.ndarray:
    """Text of Orpheus tokens -> interleaved codes (int32).

    ``kind``: "ids" (integers are raw token ids), "codes" (integers are codes
    0..4095 already), or "auto": custom-token strings or any integer >=
    128266 mean ids, otherwise codes. ``<custom_token_N>`` strings are always
    read as ids. Mixing codes and ids in one text is an error.
    """
    if kind not in ("auto", "ids", "codes"):
        raise ValueError(f"kind must be 'auto', 'ids' or 'codes', got {kind!r}")
    vals, custom = parse_tokens(text)
    if vals.size == 0:
        raise LayoutShapeError("no tokens found")
    if kind == "auto":
        kind = "ids" if custom or int(vals.max()) >= ORPHEUS_TOKEN_BASE else "codes"
    if kind == "codes" and custom:
        raise LayoutError("<custom_token_N> strings are token ids, but the text was read as codes")
    if kind == "ids":
        return orpheus_ids_to_codes(vals, drop_incomplete=drop_incomplete)
    k = _complete_groups(vals.size, drop_incomplete, "Orpheus codes")
    c = vals[: k * ORPHEUS_GROUP]
    _check_codes(c, "Orpheus codes", ORPHEUS_CODEBOOK_SIZE)
    return c.astype(np.int32)


# ------------------------------------------------------------ streams


_POS_LEVEL_ARR = np.asarray(_POS_LEVEL, dtype=np.int64)
_ID_OFFSET = ORPHEUS_TOKEN_BASE + np.arange(ORPHEUS_GROUP, dtype=np.int64) * ORPHEUS_CODEBOOK_SIZE
_L1 = [1, 4]
_L2 = [2, 3, 5, 6]
#: groups the precomputed tables below cover (a message of more tokens takes the slow path)
_FAST_GROUPS = 64


def _level_gather(k: int) -> npt.NDArray[np.intp]:
    """Indices that gather k whole groups (k*7 codes, group order) into level order: the k
    level-0 codes, then the 2k level-1 codes, then the 4k level-2 codes, each level in time
    order, so that each level is a contiguous slice of one gathered array."""
    g = np.arange(k * ORPHEUS_GROUP, dtype=np.intp).reshape(k, ORPHEUS_GROUP)
    return np.concatenate([g[:, 0], g[:, _L1].reshape(-1), g[:, _L2].reshape(-1)])


_GATHER = [_level_gather(k) for k in range(_FAST_GROUPS + 1)]


@functools.lru_cache(maxsize=16)
def _tables(ids: bool, limit: tuple[int, ...]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Each group position's id offset and code limit repeated over ``_FAST_GROUPS`` + 1
    groups, shared (read-only) by every stream of a model and layout: 7 KB a stream, 14 MB
    for 2,000 streams, were they each a stream's own. The limit is unsigned: a negative code
    compares as huge, so one comparison checks both ends."""
    reps = _FAST_GROUPS + 1
    off = np.tile(_ID_OFFSET if ids else np.zeros(ORPHEUS_GROUP, np.int64), reps)
    lim = np.tile(np.asarray(limit, dtype=np.int64), reps).astype(np.uint64)
    off.flags.writeable = lim.flags.writeable = False
    return off, lim


class _OrpheusAssembler(Assembler):
    """Tokens validated at their stream positions; whole groups become per-level codes.

    A stream sends a group (7 tokens) a message, about 12 a second, and a front assembles
    thousands of streams' messages a second (issue 17): the common message takes a few
    array operations on slices of tables shared by the streams of a model and layout (each
    position's offset and limit repeated over ``_FAST_GROUPS`` groups, ``_tables``), the rest
    the general path."""

    def __init__(self, ids: bool, codebook_sizes: Sequence[int]) -> None:
        self.ids = ids
        self.n_tokens = 0  # tokens accepted so far (including the partial group)
        self.partial = np.zeros(0, dtype=np.int32)
        # the largest valid code + 1 at each position of a group
        self.limit = np.minimum(np.asarray(codebook_sizes, dtype=np.int64)[_POS_LEVEL_ARR],
                                ORPHEUS_CODEBOOK_SIZE)
        self._off_t, self._lim_t = _tables(ids, tuple(self.limit.tolist()))

    def feed(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        payload = np.asarray(payload, dtype=np.int64)
        n = int(payload.size)
        p0 = self.n_tokens % ORPHEUS_GROUP
        if p0 + n > _FAST_GROUPS * ORPHEUS_GROUP:
            return self._feed_general(payload)
        codes = payload - self._off_t[p0:p0 + n] if self.ids else payload
        if (codes.view(np.uint64) >= self._lim_t[p0:p0 + n]).any():
            return self._feed_general(payload)  # raises with the first bad token
        self.n_tokens += n
        allc = codes.astype(np.int32)
        if self.partial.size:
            allc = np.concatenate([self.partial, allc])
        k = allc.size // ORPHEUS_GROUP
        if k * ORPHEUS_GROUP != allc.size:
            self.partial = allc[k * ORPHEUS_GROUP:].copy()
        elif self.partial.size:
            self.partial = self.partial[:0]
        if k == 0:
            return None
        lv = allc[_GATHER[k]]
        return [lv[:k], lv[k:3 * k], lv[3 * k:]]

    def _feed_general(self, payload: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int32]] | None:
        tokens = payload
        pos = (self.n_tokens + np.arange(tokens.size, dtype=np.int64)) % ORPHEUS_GROUP
        codes = tokens - _ID_OFFSET[pos] if self.ids else tokens
        bad = np.flatnonzero((codes < 0) | (codes >= self.limit[pos]))
        if bad.size:
            j = int(bad[0])
            idx = self.n_tokens + j
            p = int(pos[j])
            if self.ids:
                lo = int(_ID_OFFSET[p])
                rng = f"[{lo}, {lo + ORPHEUS_CODEBOOK_SIZE})"
                what = "token id"
            else:
                rng = f"[0, {ORPHEUS_CODEBOOK_SIZE})"
                what = "code"
            raise LayoutRangeError(f"{what} {int(tokens[j])} at index {idx} (position {p} of its "
                                   f"group) is outside {rng}", index=idx, value=int(tokens[j]))
        self.n_tokens += int(tokens.size)
        allc = np.concatenate([self.partial, codes.astype(np.int32)])
        k = allc.size // ORPHEUS_GROUP
        self.partial = allc[k * ORPHEUS_GROUP:].copy()
        if k == 0:
            return None
        g = allc[: k * ORPHEUS_GROUP].reshape(k, ORPHEUS_GROUP)
        return [np.ascontiguousarray(g[:, 0]), np.ascontiguousarray(g[:, _L1].reshape(-1)),
                np.ascontiguousarray(g[:, _L2].reshape(-1))]

    def end(self, level_codes: Sequence[int]) -> None:
        if self.partial.size:
            raise LayoutShapeError(f"end after {self.n_tokens} tokens: the last group has "
                                   f"{self.partial.size} of {ORPHEUS_GROUP} tokens",
                                   index=self.n_tokens - int(self.partial.size))


class OrpheusLayout(Layout):
    """Orpheus audio tokens over a SNAC 24 kHz model: raw LM ids, or the codes themselves."""

    def __init__(self, name: str, ids: bool) -> None:
        self.name = name
        self.ids = ids

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        if n_levels != 3 or tuple(level_strides) != ORPHEUS_LEVEL_STRIDES \
                or any(c < ORPHEUS_CODEBOOK_SIZE for c in codebook_sizes):
            return (f"orpheus layouts need 3 levels, strides 4/2/1 and codebooks of "
                    f"{ORPHEUS_CODEBOOK_SIZE}")
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _OrpheusAssembler(self.ids, codebook_sizes)


#: raw Orpheus LM token ids (``128266 + position * 4096 + code``)
ORPHEUS_IDS = OrpheusLayout("orpheus_ids", ids=True)
#: Orpheus codes 0..4095 in the group order
ORPHEUS = OrpheusLayout("orpheus", ids=False)
