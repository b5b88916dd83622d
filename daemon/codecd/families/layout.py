"""Code layouts: how the tokens a language model emits become a codec's per-level codes.

A *layout* is named on the wire (the ``layout`` of a ``start`` message) and
turns the payload of ``tokens`` messages into per-level int32 code arrays:

* ``levels`` (this module, every family): the codes themselves, one array per
  level (``levels`` in a tokens message, or binary frames with a level index);
* Orpheus token ids or codes over SNAC (:mod:`codecd.families.orpheus`);
* Chatterbox T3 speech-token ids over S3Gen (:mod:`codecd.families.chatterbox`).

A :class:`Layout` says whether a model's code shape can take it
(:meth:`Layout.check`) and makes one :class:`Assembler` per stream, which keeps
what a stream needs between messages (a partial group, a stop id seen) and
raises a :class:`LayoutError` whose ``code`` is the protocol's error code.
Families list the layouts they offer; ``codecd.families`` registers them.

Pure numpy: neither torch nor the native runtime is imported here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "LayoutError", "LayoutRangeError", "LayoutShapeError", "Layout", "Assembler", "LEVELS",
    "as_int_1d", "register_layouts", "get_layout", "layout_names",
]

Codes = list[npt.NDArray[np.int32]]
_EMPTY = np.zeros(0, dtype=np.int32)


class LayoutError(ValueError):
    """Codes or tokens that do not fit the layout. ``code``: the protocol error code;
    ``details``: what the error message's ``details`` carries (index, value, level)."""

    code = "bad_message"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = details


class LayoutRangeError(LayoutError):
    """A code or token id outside the range of its position (``index``, ``value`` say which)."""

    code = "token_range"

    def __init__(self, message: str, index: int = -1, value: int = 0,
                 level: int | None = None) -> None:
        if level is None:
            super().__init__(message, index=index, value=value)
        else:
            super().__init__(message, level=level, index=index, value=value)
        self.index = index
        self.value = value


class LayoutShapeError(LayoutError):
    """A length that does not fit the layout (incomplete group, inconsistent levels)."""

    code = "broken_group"


def as_int_1d(x: Any, what: str) -> npt.NDArray[np.int64]:
    """``x`` as a 1-D int64 array; LayoutError for anything that is not whole numbers."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise LayoutShapeError(f"{what}: expected a 1-D sequence, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise LayoutError(f"{what}: values must be integers")
        a = a.astype(np.int64)
    elif a.dtype.kind not in "iu":
        raise LayoutError(f"{what}: values must be integers, got dtype {a.dtype}")
    return a.astype(np.int64)


# ------------------------------------------------------------------ interfaces


class Assembler(ABC):
    """One stream's state between its token messages."""

    #: the payload itself ended the stream (a stop id): the stream finishes without ``end``
    ended: bool = False

    @abstractmethod
    def feed(self, payload: Any) -> Codes | None:
        """Validate one message's payload; the per-level codes it completes (None: none yet).
        Raises LayoutError; the stream fails then."""

    def end(self, level_codes: Sequence[int]) -> None:  # noqa: B027 (most layouts can end anywhere)
        """The client ended the stream after ``level_codes`` codes per level were pushed:
        LayoutShapeError if it cannot end here (a partial group)."""
        return None


class Layout(ABC):
    """A way to send a model's codes: its wire name and the message field it reads."""

    name: str
    #: True: tokens messages carry ``levels`` (per-level arrays); False: ``tokens``
    takes_levels: bool = False

    @abstractmethod
    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        """Why a model of this code shape cannot take the layout (None: it can)."""

    @abstractmethod
    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        """A new stream's assembler for a model of this code shape."""


# ------------------------------------------------------------------ levels


class _LevelsAssembler(Assembler):
    def __init__(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> None:
        self.sizes = tuple(codebook_sizes)
        self.strides = tuple(level_strides)
        self.codes = [0] * len(self.sizes)  # codes accepted per level

    def feed(self, payload: Mapping[int, npt.NDArray[np.int64]]) -> Codes | None:
        nl = len(self.sizes)
        if any(l >= nl for l in payload):
            raise LayoutError(f"level {max(payload)} out of range: model has {nl} levels")
        out: Codes = []
        for l in range(nl):
            a = payload.get(l)
            if a is None or not a.size:
                out.append(_EMPTY)
                continue
            cb = self.sizes[l]
            bad = np.flatnonzero((a < 0) | (a >= cb))
            if bad.size:
                j = int(bad[0])
                idx = self.codes[l] + j
                raise LayoutRangeError(f"level {l} code {int(a[j])} at index {idx} is outside "
                                       f"[0, {cb})", index=idx, value=int(a[j]), level=l)
            out.append(a.astype(np.int32))
        for l, codes in enumerate(out):
            self.codes[l] += int(codes.size)
        return out if any(codes.size for codes in out) else None

    def end(self, level_codes: Sequence[int]) -> None:
        frames = [c * s for c, s in zip(level_codes, self.strides)]
        if len(set(frames)) > 1:
            desc = ", ".join(f"level {l}: {c} codes = {f} frames" for l, (c, f) in
                             enumerate(zip(level_codes, frames)))
            raise LayoutShapeError(f"levels cover different numbers of frames at end ({desc})")


class Levels(Layout):
    """Per-level codes as they are: every model takes them."""

    name = "levels"
    takes_levels = True

    def check(self, n_levels: int, codebook_sizes: Sequence[int],
              level_strides: Sequence[int]) -> str | None:
        return None

    def assembler(self, codebook_sizes: Sequence[int], level_strides: Sequence[int]) -> Assembler:
        return _LevelsAssembler(codebook_sizes, level_strides)


LEVELS = Levels()

# ------------------------------------------------------------------ registry

_LAYOUTS: dict[str, Layout] = {LEVELS.name: LEVELS}


def register_layouts(layouts: Iterable[Layout]) -> None:
    """Make layouts known by name (``codecd.families`` registers every family's)."""
    for lay in layouts:
        known = _LAYOUTS.setdefault(lay.name, lay)
        if known is not lay:
            raise ValueError(f"two layouts are named {lay.name!r}")


def get_layout(name: str) -> Layout:
    """The registered layout of that name; KeyError if none."""
    return _LAYOUTS[name]


def layout_names() -> tuple[str, ...]:
    return tuple(_LAYOUTS)
