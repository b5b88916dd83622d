"""The daemon's Prometheus metrics (``/metrics``): gauges of the server's state, counters of
the sessions, the time to first audio, and the engine workers' stats from their last fetch."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .session import SessionMetrics

__all__ = ["MetricsSource", "ServerMetrics"]


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
        rss.add_metric(["daemon"], _rss(os.getpid()))
        lab = ["worker", "model"]
        pend = GaugeMetricFamily("codecd_pending_frames", "frames pushed, not yet decoded", labels=lab)
        bmax = GaugeMetricFamily("codecd_batch_size_max", "largest batch of one tick", labels=lab)
        bmean = GaugeMetricFamily("codecd_batch_size_recent", "mean batch of recent ticks", labels=lab)
        tmean = GaugeMetricFamily("codecd_tick_seconds_mean", "mean tick time (recent)", labels=lab)
        tmax = GaugeMetricFamily("codecd_tick_seconds_max", "max tick time (recent)", labels=lab)
        ticks = CounterMetricFamily("codecd_ticks", "decode ticks", labels=lab)
        graph = CounterMetricFamily("codecd_graph", "runtime graph counters",
                                    labels=lab + ["counter"])
        cbuf = GaugeMetricFamily("codecd_compute_buffer_bytes", "compute buffer memory",
                                 labels=lab + ["backend"])
        wbytes = GaugeMetricFamily("codecd_weight_bytes", "model weight memory", labels=lab)
        sbytes = GaugeMetricFamily("codecd_state_bytes", "stream state memory", labels=lab)
        for w in st["workers"]:
            wi = str(w["index"])
            restarts.add_metric([wi], w["restarts"])
            queued.add_metric([wi], w["queued_commands"])
            up.add_metric([wi], 1 if w["state"] == "ready" else 0)
            if w.get("pid"):
                rss.add_metric([f"worker{wi}"], _rss(int(w["pid"])))
            for name, m in ((w.get("worker") or {}).get("models") or {}).items():
                lv = [wi, name]
                pend.add_metric(lv, m.get("pending_frames", 0))
                bmax.add_metric(lv, m.get("max_batch_seen", 0))
                rb = m.get("recent_batches") or []
                bmean.add_metric(lv, sum(rb) / len(rb) if rb else 0.0)
                tmean.add_metric(lv, (m.get("tick_ms_mean") or 0.0) / 1e3)
                tmax.add_metric(lv, (m.get("tick_ms_max") or 0.0) / 1e3)
                ticks.add_metric(lv, m.get("ticks", 0))
                c = m.get("codecrt") or {}
                for k in ("graphs_built", "graphs_reused", "sched_resets", "sched_recreations",
                          "reservations", "computes", "graph_splits"):
                    if k in c:
                        graph.add_metric(lv + [k], c[k])
                for be, nb in zip(c.get("backends", ()), c.get("compute_buffer_bytes", ())):
                    cbuf.add_metric(lv + [str(be)], nb)
                wbytes.add_metric(lv, c.get("weight_bytes", 0))
                sbytes.add_metric(lv, c.get("state_bytes", 0))
        yield from (restarts, queued, up, rss, pend, bmax, bmean, tmean, tmax, ticks, graph,
                    cbuf, wbytes, sbytes)


def _rss(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0
