"""The Prometheus endpoint (``wal.metrics.port``): the figures of :mod:`recovery.health` for
every query of this driver process that wrote through the sink, at scrape time: the running
ones, and those that ended, whose WAL's figures stay true on disk (a query the sink blocked
fails at its next commit: ``blocked`` must outlive it, or an alert would see it for one
trigger interval at most); ``query_running`` tells them apart.

Why a collector and not gauges set by the flusher: the figures have one owner
(:func:`recovery.health.read_health`), which ``sinks.status`` and ``cassandra-wal status``
read too; a scrape asks it, so the endpoint can never say something the other two do not.
A scrape costs one read-only look at each WAL (a RocksDB secondary, a listing of its files,
every pending batch's seal): about 7 ms, and 0.13-0.18 ms more a pending batch (0.55 s with
3,000 pending, a long outage; ``bench/health_cost.py``), at Prometheus's pace (15 s by
default).

One HTTP server per port and process (``prometheus_client.start_http_server`` on a registry
of our own, so the process's default metrics are not mixed in); it serves every query of
every session in the process, whether or not that query named the port. Off unless a query
names the port; it lives as long as the process (a daemon thread). A port that cannot be bound
is tried again at most every :data:`BIND_RETRY_S`, each failure logged.

Runs: in the driver process; :func:`serve` on the thread that starts a query's flusher,
:meth:`WalCollector.collect` on the server's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from recovery.flusher import QueryFlusher
from recovery.health import HealthState
from wal import clock

log = logging.getLogger(__name__)

PREFIX = "cassandra_wal"
LABELS = ("query_id", "query_name", "table")
BIND_RETRY_S = 60.0


@dataclass(frozen=True)
class ServedQuery:
    """A query the endpoint shows: its newest run's flusher, running or ended."""

    query_id: str
    query_name: str
    flusher: QueryFlusher
    running: bool

    @property
    def table(self) -> str:
        """The table its WAL writes: a ``foreachBatch`` function writing several has a WAL,
        and a series, for each."""
        config = self.flusher.target.config
        return f"{config.keyspace}.{config.table}"


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
                lambda h: 1 if h.state == HealthState.BLOCKED else 0),
    "lagging": ("gauge", "1 while a committed batch has waited 30 s or more to be written, or "
                "the backlog is over wal.maxBytes",
                lambda h: 1 if h.state == HealthState.LAGGING else 0),
    "failing": ("gauge", "1 while the flusher's drains fail and are retried (Cassandra away, "
                "a full or read-only disk): status says why", lambda h: 1 if h.failing else 0),
    "retries": ("counter", "Transient failures retried (write requests in wal.flush.mode=driver, "
                "flushes in every mode), since the query's run started", lambda h: h.retries),
    "replays": ("counter", "Batches written by a replay (recovery at query start, or a drain "
                "after a failed one), since the query's run started", lambda h: h.replays),
    "batches_written": ("counter", "Batches written to Cassandra, since the query's run started",
                        lambda h: h.batches_written),
    "rows_written": ("counter", "Rows of the batches written to Cassandra (a batch resumed "
                     "mid-way counts whole), since the query's run started",
                     lambda h: h.rows_written),
}
#: Not a figure of the WAL, but of the query in this process.
QUERY_RUNNING = ("query_running", "gauge", "1 while the query runs in this driver process; 0 "
                 "once it ended (stopped, or failed: e.g. on a block), its WAL still shown")


class WalCollector:
    """A ``prometheus_client`` collector over ``queries()``: every query of this process that
    wrote through the sink (:class:`ServedQuery`)."""

    def __init__(self, queries: Callable[[], Iterable[ServedQuery]]):
        self._queries = queries

    def describe(self) -> list:
        return []           # no samples at registration: the queries come and go

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        families = {name: kinds[kind](f"{PREFIX}_{name}", text, labels=LABELS)
                    for name, (kind, text, _) in METRICS.items()}
        name, kind, text = QUERY_RUNNING
        running = kinds[kind](f"{PREFIX}_{name}", text, labels=LABELS)
        for query in self._queries():
            labels = [query.query_id, query.query_name, query.table]
            try:
                health = query.flusher.health()
            except Exception as exc:  # noqa: BLE001 - one WAL's failure must not hide the others
                log.warning("cassandra_wal: %s: no metrics this scrape: %s: %s",
                            query.flusher.wal.root, type(exc).__name__, exc)
                continue
            for name, (_, _, value_of) in METRICS.items():
                value = value_of(health)
                if value is not None:       # e.g. no batch written yet: no latency sample
                    families[name].add_metric(labels, float(value))
            running.add_metric(labels, 1.0 if query.running else 0.0)
        yield from families.values()
        yield running


_servers: dict[int, object] = {}
_refused: dict[int, float] = {}     # port -> when binding it last failed (clock.monotonic)
_lock = threading.Lock()


def serve(port: int, queries: Callable[[], Iterable[ServedQuery]],
          monotonic: Callable[[], float] = clock.monotonic) -> bool:
    """Serve the metrics on ``port`` (all interfaces) unless this process does already.
    Returns whether the endpoint is up. A port that cannot be bound is logged (naming the
    option) and never fails the query; it is asked for at every batch, and tried again at most
    every :data:`BIND_RETRY_S` (so logged at most that often)."""
    with _lock:
        if port in _servers:
            return True
        if port in _refused and monotonic() - _refused[port] < BIND_RETRY_S:
            return False
        try:
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry(auto_describe=False)
            registry.register(WalCollector(queries))
            _servers[port] = start_http_server(port, registry=registry)
        except (ImportError, OSError) as exc:
            _refused[port] = monotonic()
            log.error("cassandra_wal: wal.metrics.port=%d: cannot serve the metrics (tried "
                      "again in %.0f s): %s: %s", port, BIND_RETRY_S, type(exc).__name__, exc)
            return False
        _refused.pop(port, None)
        log.info("cassandra_wal: metrics for Prometheus on http://0.0.0.0:%d/metrics", port)
        return True
