"""The daemon's Prometheus metrics (``/metrics``): gauges of the server's state, counters of
the sessions, the time to first audio, and the engine workers' stats from their last fetch."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .session import SessionMetrics

__all__ = ["MetricsSource", "ServerMetrics", "render_totals"]


class MetricsSource(Protocol):
    """What the metrics read from the server."""

    active_streams: int
    ready: bool
    metrics: SessionMetrics

    @property
    def n_connections(self) -> int: ...

    def engine_stats(self) -> dict[str, Any]:
        """``EnginePool.stats()`` (``{"workers": []}`` before the pool exists)."""


class ServerMetrics:
    """The registry and the metrics the server updates itself."""

    def __init__(self, source: MetricsSource) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        Gauge("codecd_streams_active", "open streams", registry=r).set_function(
            lambda: source.active_streams)
        Gauge("codecd_connections_active", "open websocket connections", registry=r
              ).set_function(lambda: source.n_connections)
        Gauge("codecd_ready", "1 when ready to serve", registry=r).set_function(
            lambda: 1 if source.ready else 0)
        self.ttfa = Histogram("codecd_time_to_first_audio_seconds",
                              "first codes handed to the engine -> first audio",
                              buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
                              registry=r)
        self.held = Gauge("codecd_paced_streams", "streams with codes held back by pacing",
                          registry=r)
        self.conn_refused = Counter("codecd_connections_refused",
                                    "websocket upgrades refused, by reason", ["reason"],
                                    registry=r)
        r.register(_StatsCollector(source))

    def exposition(self) -> str:
        """The text format of every metric."""
        return generate_latest(self.registry).decode()


class _StatsCollector(Collector):
    """Per-worker engine stats (from the last fetch), session error counters, memory."""

    def __init__(self, source: MetricsSource) -> None:
        self.source = source

    def collect(self) -> Iterable[Any]:
        s = self.source
        st = s.engine_stats()
        errs = CounterMetricFamily("codecd_errors", "errors sent to clients, by code",
                                   labels=["code"])
        for code, n in sorted(s.metrics.errors.items()):
            errs.add_metric([code], n)
        yield errs
        busy = CounterMetricFamily("codecd_busy_refusals", "stream starts refused with busy")
        busy.add_metric([], s.metrics.errors.get("busy", 0))
        yield busy
        sm = CounterMetricFamily("codecd_streams", "streams by outcome", labels=["outcome"])
        for k in ("started", "done", "cancelled", "failed", "refused"):
            sm.add_metric([k], getattr(s.metrics, f"streams_{k}"))
        yield sm
        restarts = CounterMetricFamily("codecd_worker_restarts", "worker process restarts",
                                       labels=["worker"])
        queued = GaugeMetricFamily("codecd_queue_depth", "commands queued for a worker",
                                   labels=["worker"])
        up = GaugeMetricFamily("codecd_worker_up", "1 while the worker serves", labels=["worker"])
        rss = GaugeMetricFamily("codecd_resident_memory_bytes", "resident set size",
                                labels=["process"])
        rss.add_metric(["daemon"], _rss(int(getattr(s, "pid", 0) or os.getpid())))
        phase = CounterMetricFamily("codecd_worker_phase_seconds", "worker loop time by phase "
                                    "(ingest, step, collect, flush)", labels=["worker", "phase"])
        period = GaugeMetricFamily("codecd_tick_period_seconds", "the period the worker's ticks "
                                   "keep now (0: unaligned)", labels=["worker"])
        first = GaugeMetricFamily("codecd_first_audio", "1 for how the worker ticks a new "
                                  "stream until its first audio (cadence, now)",
                                  labels=["worker", "mode"])
        lab = ["worker", "model"]
        pend = GaugeMetricFamily("codecd_pending_frames", "frames pushed, not yet decoded", labels=lab)
        bmax = GaugeMetricFamily("codecd_batch_size_max", "largest batch of one tick", labels=lab)
        bmean = GaugeMetricFamily("codecd_batch_size_recent", "mean batch of recent ticks", labels=lab)
        tmean = GaugeMetricFamily("codecd_tick_seconds_mean", "mean tick time (recent)", labels=lab)
        tmax = GaugeMetricFamily("codecd_tick_seconds_max", "max tick time (recent)", labels=lab)
        tp99 = GaugeMetricFamily("codecd_tick_seconds_p99", "p99 tick time (recent)", labels=lab)
        parts = GaugeMetricFamily("codecd_tick_part_seconds", "mean time of a part of a tick over "
                                  "the recent ticks (all) or their slowest tenth (slowest): total, "
                                  "launch (acquire, inputs, enqueue), overlap, wait, collect, gc, late",
                                  labels=lab + ["ticks", "part"])
        counts = GaugeMetricFamily("codecd_tick_part_mean", "mean per tick over the recent ticks "
                                   "(all) or their slowest tenth (slowest): graphs built, buffer "
                                   "growths, batch", labels=lab + ["ticks", "part"])
        ticks = CounterMetricFamily("codecd_ticks", "decode ticks", labels=lab)
        express = CounterMetricFamily("codecd_express_ticks", "ticks of new streams alone "
                                      "(first_audio now)", labels=lab)
        holds = CounterMetricFamily("codecd_express_holds", "express ticks held back until the "
                                    "gap after their first audio fits (first_audio_gap_ms)",
                                    labels=lab)
        catch = CounterMetricFamily("codecd_catch_up_ticks", "ticks of streams whose codes "
                                    "missed their aligned round (tick_catch_up)", labels=lab)
        caught = CounterMetricFamily("codecd_catch_up_stream_steps", "stream-steps in catch-up "
                                     "ticks", labels=lab)
        cost = GaugeMetricFamily("codecd_tick_cost_seconds", "the fitted tick cost express "
                                 "ticks are sized by: per tick (fixed) and per stream",
                                 labels=lab + ["term"])
        graph = CounterMetricFamily("codecd_graph", "runtime graph counters",
                                    labels=lab + ["counter"])
        cbuf = GaugeMetricFamily("codecd_compute_buffer_bytes", "compute buffer memory",
                                 labels=lab + ["backend"])
        wbytes = GaugeMetricFamily("codecd_weight_bytes", "model weight memory", labels=lab)
        sbytes = GaugeMetricFamily("codecd_state_bytes", "stream state memory", labels=lab)
        prec = GaugeMetricFamily("codecd_model_precision", "1 for the precision of a model's "
                                 "products (f32, bf16, bf16x3)", labels=lab + ["precision"])
        for w in st["workers"]:
            wi = str(w["index"])
            restarts.add_metric([wi], w["restarts"])
            queued.add_metric([wi], w["queued_commands"])
            up.add_metric([wi], 1 if w["state"] == "ready" else 0)
            if w.get("pid"):
                rss.add_metric([f"worker{wi}"], _rss(int(w["pid"])))
            ws = w.get("worker") or {}  # the worker's own stats (none while it restarts)
            for ph, sec in (ws.get("phase_s") or {}).items():
                phase.add_metric([wi, ph], sec)
            if cad := ws.get("cadence"):
                period.add_metric([wi], cad["period_ms"] / 1e3)
                first.add_metric([wi, str(cad["first_audio"])], 1)
            for name, m in (ws.get("models") or {}).items():
                lv = [wi, name]
                pend.add_metric(lv, m.get("pending_frames", 0))
                bmax.add_metric(lv, m.get("max_batch_seen", 0))
                rb = m.get("recent_batches") or []
                bmean.add_metric(lv, sum(rb) / len(rb) if rb else 0.0)
                tmean.add_metric(lv, (m.get("tick_ms_mean") or 0.0) / 1e3)
                tmax.add_metric(lv, (m.get("tick_ms_max") or 0.0) / 1e3)
                tp99.add_metric(lv, (m.get("tick_ms_p99") or 0.0) / 1e3)
                ticks.add_metric(lv, m.get("ticks", 0))
                express.add_metric(lv, m.get("express_ticks", 0))
                holds.add_metric(lv, m.get("express_holds", 0))
                catch.add_metric(lv, m.get("catch_up_ticks", 0))
                caught.add_metric(lv, m.get("catch_up_streams", 0))
                if m.get("tick_cost_ms"):
                    fixed_ms, per_ms = m["tick_cost_ms"]
                    cost.add_metric(lv + ["fixed"], fixed_ms / 1e3)
                    cost.add_metric(lv + ["per_stream"], per_ms / 1e3)
                an = m.get("tick_anatomy") or {}
                for which in ("all", "slowest"):
                    for part, v in (an.get(which) or {}).items():
                        if part in ("graphs", "grew", "batch"):
                            counts.add_metric(lv + [which, part], v)
                        else:
                            parts.add_metric(lv + [which, part], v / 1e3)
                c = m.get("codecrt") or {}
                for k in ("graphs_built", "graphs_reused", "sched_resets", "sched_recreations",
                          "reservations", "computes", "graph_splits"):
                    if k in c:
                        graph.add_metric(lv + [k], c[k])
                for be, nb in zip(c.get("backends", ()), c.get("compute_buffer_bytes", ())):
                    cbuf.add_metric(lv + [str(be)], nb)
                wbytes.add_metric(lv, c.get("weight_bytes", 0))
                sbytes.add_metric(lv, c.get("state_bytes", 0))
                if m.get("precision"):
                    prec.add_metric(lv + [str(m["precision"])], 1)
        yield from (restarts, queued, up, rss, phase, period, first, pend, bmax, bmean, tmean,
                    tmax, tp99, parts, counts, ticks, express, holds, catch, caught, cost, graph, cbuf,
                    wbytes, sbytes, prec)


def _rss(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


# ------------------------------------------------------------------ several fronts


class _Totals:
    """The daemon-wide numbers main gathered (``codecd.daemon``), as a :class:`MetricsSource`."""

    def __init__(self, totals: dict[str, Any]) -> None:
        self.totals = totals
        fronts = [f for f in totals.get("fronts", []) if f.get("snapshot")]
        self.active_streams = int(totals.get("streams", 0))
        self.ready = bool(totals.get("ready", False))
        self.pid = int(totals.get("pid", 0))
        self.metrics = SessionMetrics()
        self._conns = 0
        for f in fronts:
            sn = f["snapshot"]
            self._conns += int(sn.get("connections", 0))
            for k, v in sn.get("session", {}).items():
                if k == "errors":
                    for code, n in v.items():
                        self.metrics.errors[code] += n
                elif hasattr(self.metrics, k):
                    setattr(self.metrics, k, getattr(self.metrics, k) + v)

    @property
    def n_connections(self) -> int:
        return self._conns

    def engine_stats(self) -> dict[str, Any]:
        return {"workers": self.totals.get("workers", [])}


class _FrontsCollector(Collector):
    def __init__(self, src: _Totals) -> None:
        self.src = src

    def collect(self) -> Iterable[Any]:
        s, t = self.src, self.src.totals
        fronts = t.get("fronts", [])
        g = GaugeMetricFamily("codecd_streams_active", "open streams (all fronts)")
        g.add_metric([], s.active_streams)
        yield g
        g = GaugeMetricFamily("codecd_connections_active", "open websocket connections "
                              "(all fronts)")
        g.add_metric([], s.n_connections)
        yield g
        g = GaugeMetricFamily("codecd_ready", "1 when ready to serve")
        g.add_metric([], 1 if s.ready else 0)
        yield g
        held = GaugeMetricFamily("codecd_paced_streams", "streams with codes held back by pacing")
        refused = CounterMetricFamily("codecd_connections_refused",
                                      "websocket upgrades refused, by reason", labels=["reason"])
        up = GaugeMetricFamily("codecd_front_up", "1 while the front process runs",
                               labels=["front"])
        fconn = GaugeMetricFamily("codecd_front_connections", "open connections of a front",
                                  labels=["front"])
        fstr = GaugeMetricFamily("codecd_front_streams", "open streams of a front",
                                 labels=["front"])
        frest = CounterMetricFamily("codecd_front_restarts", "front process restarts",
                                    labels=["front"])
        rss = GaugeMetricFamily("codecd_front_resident_memory_bytes", "resident set size of a "
                                "front", labels=["front"])
        stalls = {
            "loop": HistogramMetricFamily(
                "codecd_front_loop_late_seconds", "how late a front's event loop woke for a "
                "timer, 5 ms apart while it has streams (a long callback, a burst of sends, the collector)", labels=["front"]),
            "gc": HistogramMetricFamily("codecd_front_gc_pause_seconds", "a front's garbage "
                                        "collections, by length", labels=["front"]),
        }
        n_held = 0.0
        reasons: dict[str, float] = {}
        buckets: dict[str, float] = {}
        h_sum = 0.0
        for f in fronts:
            fi = str(f.get("index"))
            up.add_metric([fi], 1 if f.get("up") else 0)
            frest.add_metric([fi], f.get("restarts", 0))
            sn = f.get("snapshot")
            if not sn:
                continue
            n_held += sn.get("held", 0)
            fconn.add_metric([fi], sn.get("connections", 0))
            fstr.add_metric([fi], sn.get("streams", 0))
            if sn.get("pid"):
                rss.add_metric([fi], _rss(int(sn["pid"])))
            for r, n in sn.get("refused", {}).items():
                reasons[r] = reasons.get(r, 0.0) + n
            tt = sn.get("ttfa", {})
            for le, n in tt.get("buckets", []):
                buckets[le] = buckets.get(le, 0.0) + n
            h_sum += tt.get("sum", 0.0)
            for k, fam in stalls.items():
                hs = sn.get("stalls", {}).get(k)
                if hs:
                    fam.add_metric([fi], [(le, n) for le, n in hs["buckets"]], hs["sum"])
        held.add_metric([], n_held)
        for r, n in sorted(reasons.items()):
            refused.add_metric([r], n)
        yield from (held, refused, up, fconn, fstr, frest, rss, *stalls.values())
        if buckets:
            order = sorted(buckets, key=lambda le: float(le))
            h = HistogramMetricFamily("codecd_time_to_first_audio_seconds",
                                      "first codes handed to the engine -> first audio")
            h.add_metric([], [(le, buckets[le]) for le in order], h_sum)
            yield h


def render_totals(totals: dict[str, Any]) -> str:
    """``/metrics`` of a daemon with several fronts: the totals main gathered from every front
    and worker, in the same series as one process's (plus per-front ones)."""
    r = CollectorRegistry(auto_describe=False)
    src = _Totals(totals)
    r.register(_FrontsCollector(src))
    r.register(_StatsCollector(src))
    return generate_latest(r).decode()
