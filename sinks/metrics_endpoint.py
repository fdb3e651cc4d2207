"""The Prometheus endpoint (``wal.metrics.port``): the figures of :mod:`recovery.health` for
every query of this driver process whose flusher is running, at scrape time.

Why a collector and not gauges set by the flusher: the figures have one owner
(:func:`recovery.health.read_health`), which ``sinks.status`` and ``cassandra-wal status``
read too; a scrape asks it, so the endpoint can never say something the other two do not.
A scrape costs one read-only look at each WAL (a RocksDB secondary, a listing of its files),
a few milliseconds, at Prometheus's pace (15 s by default).

One HTTP server per port and process (``prometheus_client.start_http_server`` on a registry
of our own, so the process's default metrics are not mixed in); it serves every query of
every session in the process. Off unless a query names the port; it lives as long as the
process (a daemon thread).

Runs: in the driver process; :func:`serve` on the thread that starts a query's flusher,
:meth:`WalCollector.collect` on the server's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator

from recovery.flusher import QueryFlusher
from recovery.health import BLOCKED, LAGGING

log = logging.getLogger(__name__)

PREFIX = "cassandra_wal"
LABELS = ("query_id", "query_name")

#: name -> (type, help, the Health field it shows, or a function of it). Documented in
#: docs/user-guide.md ("Operating the sink"); a unit test keeps the page and this table equal.
METRICS: dict[str, tuple[str, str, Callable]] = {
    "pending_batches": ("gauge", "Batches Spark committed that are not yet written to Cassandra",
                        lambda h: h.pending_batches),
    "pending_rows": ("gauge", "Rows of the pending batches not yet acknowledged by Cassandra",
                     lambda h: h.pending_rows),
    "pending_bytes": ("gauge", "Sealed bytes of the pending batches (what wal.maxBytes caps)",
                      lambda h: h.pending_bytes),
    "max_bytes": ("gauge", "wal.maxBytes: the cap on pending_bytes before back-pressure",
                  lambda h: h.max_bytes),
    "size_bytes": ("gauge", "Bytes the WAL folder takes (segments, log, seals)",
                   lambda h: h.wal_bytes),
    "oldest_pending_age_seconds": ("gauge", "Age of the oldest pending batch (0: none pending)",
                                   lambda h: h.oldest_pending_age_s or 0.0),
    "flushed_through_batch": ("gauge", "Every batch up to this id is written (-1: none yet)",
                              lambda h: h.flushed_through),
    "last_write_latency_seconds": ("gauge", "The last batch written: from its commit to its "
                                   "last row acknowledged", lambda h: h.last_write_latency_s),
    "rows_written_per_second": ("gauge", "Rows written per second over the last minute",
                                lambda h: h.rows_per_s),
    "blocked": ("gauge", "1 while the sink is blocked (blocked.json: its next commit fails)",
                lambda h: 1 if h.state == BLOCKED else 0),
    "lagging": ("gauge", "1 while a committed batch has waited 30 s or more to be written, or "
                "the backlog is over wal.maxBytes", lambda h: 1 if h.state == LAGGING else 0),
    "retries": ("counter", "Transient failures retried (write requests in wal.flush.mode=driver, "
                "flushes in every mode), since the query's run started", lambda h: h.retries),
    "replays": ("counter", "Batches written by a replay (recovery at query start, or a drain "
                "after a failed one), since the query's run started", lambda h: h.replays),
}


class WalCollector:
    """A ``prometheus_client`` collector over ``flushers()``: ``(query_id, query_name,
    flusher)`` of every running query of this process."""

    def __init__(self, flushers: Callable[[], Iterable[tuple[str, str, QueryFlusher]]]):
        self._flushers = flushers

    def describe(self) -> list:
        return []           # no samples at registration: the queries come and go

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        families = {name: kinds[kind](f"{PREFIX}_{name}", text, labels=LABELS)
                    for name, (kind, text, _) in METRICS.items()}
        for query_id, query_name, flusher in self._flushers():
            try:
                health = flusher.health()
            except Exception as exc:  # noqa: BLE001 - one WAL's failure must not hide the others
                log.warning("cassandra_wal: %s: no metrics this scrape: %s: %s",
                            flusher.wal.root, type(exc).__name__, exc)
                continue
            for name, (_, _, value_of) in METRICS.items():
                value = value_of(health)
                if value is not None:       # e.g. no batch written yet: no latency sample
                    families[name].add_metric([query_id, query_name], float(value))
        yield from families.values()


_servers: dict[int, object] = {}
_lock = threading.Lock()


def serve(port: int, flushers: Callable[[], Iterable[tuple[str, str, QueryFlusher]]]) -> bool:
    """Serve the metrics on ``port`` (all interfaces) unless this process does already.
    Returns whether the endpoint is up; a port that cannot be bound is logged (naming the
    option) and tried again at the next run's flusher, never fails the query."""
    with _lock:
        if port in _servers:
            return True
        try:
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry(auto_describe=False)
            registry.register(WalCollector(flushers))
            _servers[port] = start_http_server(port, registry=registry)
        except (ImportError, OSError) as exc:
            log.error("cassandra_wal: wal.metrics.port=%d: cannot serve the metrics: %s: %s",
                      port, type(exc).__name__, exc)
            return False
        log.info("cassandra_wal: metrics for Prometheus on http://0.0.0.0:%d/metrics", port)
        return True
