"""tickcost.py: what a tick of n streams costs on one model of a worker, learnt from its ticks.

Sans-I/O: the worker reports each tick (its batch and its wall time) and asks how many
streams a tick may hold to end within a budget.

``first_audio = "now"`` runs small ticks of new streams between the aligned ones. One that
is still computing when the aligned tick is due delays every stream's audio: on the H200 at
1,000 streams (docs/gpu/h200-2026-12-05-cadence.md) express ticks run whenever new streams
had codes, back to back through the start of a row, gave 632 late frames with the 200 ms
buffer where the shipped cadence gave none. So the worker runs one only when it ends before
the aligned tick is due, with as many of the new streams as fit. The estimate is a line,
``a + b * n`` ms, fitted by least squares over the model's recent ticks with exponential
forgetting: the large aligned ticks and the small express ones both inform it (on the H200,
about 4.5 ms plus 0.06 ms a stream). How far ticks stray from the line (:meth:`TickCost.spread`)
bounds the slow ones, which ``first_audio_gap_ms`` has to allow for.
"""

from __future__ import annotations


class TickCost:
    """A tick's wall time (ms) as a line in its batch, from recent ticks."""

    def __init__(self, half_life: float = 64.0) -> None:
        #: each tick's weight halves after ``half_life`` more ticks
        self.decay = 0.5 ** (1.0 / half_life)
        self._w = self._n = self._nn = self._y = self._ny = 0.0
        self._rw = self._rr = 0.0  # residuals against the line before each tick, squared

    def add(self, n: int, ms: float, steady: bool = True) -> None:
        """A tick of ``n`` streams took ``ms`` milliseconds. ``steady`` False (a tick that built
        a graph, grew a buffer or paused for the garbage collector) leaves :meth:`spread` alone:
        one such tick of 300 ms would widen every hold for a few hundred ticks."""
        d = self.decay
        ab = self.line() if steady else None
        if ab is not None:  # a residual against a line (not against the one-size fallback)
            r = ms - (ab[0] + ab[1] * n)
            self._rw = self._rw * d + 1.0
            self._rr = self._rr * d + r * r
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._nn = self._nn * d + n * n
        self._y = self._y * d + ms
        self._ny = self._ny * d + n * ms

    @property
    def known(self) -> bool:
        return self._w > 0.0

    def line(self) -> tuple[float, float] | None:
        """The fit as (ms a tick, ms a stream), or None while the ticks do not make one (none
        yet, all of one size, or a slope that noise made negative). A negative intercept
        (noise) is taken as 0: it would promise small ticks for nothing."""
        if not self._w:
            return None
        mn, my = self._n / self._w, self._y / self._w
        var = self._nn / self._w - mn * mn
        if var <= 1e-6 * max(1.0, mn * mn):
            return None
        b = (self._ny / self._w - mn * my) / var
        return (max(0.0, my - b * mn), b) if b >= 0.0 else None

    def predict(self, n: int) -> float:
        """The expected wall time (ms) of a tick of ``n`` streams; 0 before any tick."""
        if not self._w:
            return 0.0
        ab = self.line()
        if ab is not None:
            return ab[0] + ab[1] * n
        # ticks of one size so far (or a negative slope): no cheaper than their mean,
        # proportionally dearer above their size
        mn, my = self._n / self._w, self._y / self._w
        return my * max(1.0, n / max(mn, 1.0))

    def spread(self) -> float:
        """The root mean square (ms) of recent ticks' distance from the line as it stood before
        each: how much slower than :meth:`predict` a slow tick runs (on an H100 at 1,300 SNAC
        streams, ticks of 48 to 53 ms on average and 65 to 73 ms at their 99th percentile);
        0 until ticks of two sizes have made a line."""
        return (self._rr / self._rw) ** 0.5 if self._rw else 0.0

    def most_within(self, budget_ms: float, limit: int) -> int:
        """The largest batch of at most ``limit`` streams whose tick is expected to end within
        ``budget_ms``; 0 when not even one is."""
        if budget_ms <= 0.0 or limit <= 0:
            return 0
        if self.predict(limit) <= budget_ms:
            return limit
        lo, hi = 0, limit  # predict(lo) fits (or lo == 0), predict(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.predict(mid) <= budget_ms:
                lo = mid
            else:
                hi = mid
        return lo
