"""One stream protocol: what every kind of stream offers, and how a set of them is stepped.

Three kinds of streams decode an utterance incrementally:

* :class:`codecrt.Stream`: exact streaming in the runtime (SNAC): output equal to
  the offline decode, sample for sample;
* :class:`codecrt.LowLatencyStream`: an exact stream plus provisional samples for a
  shorter lookahead, finalized by a crossfade;
* :class:`codecrt.FlowStream`: chunked streaming of flow-matching models (S3Gen).

They share one interface, :class:`CodecStream`: ``push(levels)`` appends codes
(one integer array per level), ``finish()`` ends the input, ``pull()`` returns the
samples that are final, ``stats`` says where the stream is (``ready``: a step
would advance it; ``done``: every sample is decoded), ``close()`` frees it.

Stepping: each stream names its :data:`Stepper`, a function that advances a
group of streams on one context by one step each, as few graphs as it can
(exact streams share one graph per tick; flow chunks of one shape share a
batch). :func:`step` groups any mix of streams by stepper and steps each group;
an error that only concerns some streams is reported per stream in
:class:`Tick`, and an error of the whole step is raised. A new kind of stream
(a windowed codec with overlapping windows, say) brings its own stepper; the
code that steps streams does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._errors import E_INVALID_ARGUMENT, _fail

if TYPE_CHECKING:
    from ._errors import CodecrtError

__all__ = ["CodecStream", "StreamStats", "Stepper", "Tick", "step"]


class StreamStats(NamedTuple):
    """Where a stream is. Frames are the model's frames (flow models: tokens)."""

    frames_pushed: int
    frames_decoded: int
    total_samples: int  # -1 until the stream is done
    finished: bool      # finish() was called
    ready: bool         # a step would advance it
    done: bool          # every sample is decoded (some may still wait for pull())


class Tick(NamedTuple):
    """What one step of a group of streams did: streams advanced, errors by stream index
    (each ended only its own stream's step), and the largest batch one graph ran."""

    stepped: int
    errors: dict[int, CodecrtError]
    largest_batch: int


#: advances each ready stream of a group (all on ``ctx``) by one step
Stepper = Callable[[Any, Sequence[Any]], Tick]


@runtime_checkable
class CodecStream(Protocol):
    """Push codes, step, pull PCM, finish, stats, close: every kind of stream."""

    #: the function that steps streams of this kind (see :func:`step`)
    stepper: Stepper

    def push(self, levels: Sequence[npt.ArrayLike], /) -> None:
        """Append codes: one 1-D integer array per level, of any lengths."""

    def finish(self) -> None:
        """No more codes: the next steps flush the tail."""

    def pull(self) -> npt.NDArray[np.float32]:
        """The final samples produced since the last pull (may be empty)."""

    @property
    def stats(self) -> StreamStats:
        """Position and state."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None:
        """Release the stream's resources at once. Idempotent."""


def step(ctx: Any, streams: Sequence[CodecStream]) -> Tick:
    """One step of every ready stream of ``streams`` (all on ``ctx``), grouped by stepper.

    A mix of kinds runs one stepper call per kind; ``Tick.errors`` is indexed
    by the position in ``streams`` and ``largest_batch`` is the largest of the
    groups'. An exception (a failed graph) ends the whole step.
    """
    if not streams:
        return Tick(0, {}, 0)
    for i, s in enumerate(streams):
        if not callable(getattr(s, "stepper", None)):
            _fail(E_INVALID_ARGUMENT, f"streams[{i}] is a {type(s).__name__}, not a codecrt stream")
    first = streams[0].stepper
    if all(s.stepper is first for s in streams):
        return first(ctx, streams)
    groups: dict[Stepper, list[int]] = {}
    for i, s in enumerate(streams):
        groups.setdefault(s.stepper, []).append(i)
    stepped, largest, errors = 0, 0, {}
    for stepper, idx in groups.items():
        t = stepper(ctx, [streams[i] for i in idx])
        stepped += t.stepped
        largest = max(largest, t.largest_batch)
        errors.update({idx[j]: e for j, e in t.errors.items()})
    return Tick(stepped, errors, largest)
