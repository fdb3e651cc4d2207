"""The sink's side in the driver process: what Spark's Python workers never load.

* :mod:`sinks.driver.registry`: one flush registry per SparkSession; its listener
  (:mod:`sinks.driver.listener`) starts a flusher for each run of a query and wakes it after
  each commit; with Spark Connect, :mod:`sinks.driver.connect`.
* :mod:`sinks.driver.spark_jobs`: the flush jobs the flusher is handed in the scale-out mode
  (their tasks are :mod:`sinks.worker.flush_task`'s).
* What a user calls, below and as ``sinks.<name>``: :func:`register`, :func:`wait_flushed`
  (:mod:`sinks.driver.wait`), :func:`status` (:mod:`sinks.driver.query_status`, and the
  Prometheus endpoint, :mod:`sinks.driver.metrics_endpoint`) and :func:`recover`
  (:mod:`sinks.driver.recover_job`).

It imports :mod:`sinks.worker` (the data source it registers, the foreachBatch runs it
tracks), never the other way round (an import contract in ``pyproject.toml``).
"""

from __future__ import annotations

from .query_status import status as _status
from .recover_job import recover as _recover
from .registry import register_session
from .wait import wait_flushed as _wait_flushed


def register(spark):
    """Register the ``cassandra_wal`` data source and the driver-side flusher with ``spark``.

    Call it once per SparkSession, after setting any ``spark.cassandra.*`` session conf you
    want as defaults (and after changing ``fs.defaultFS``, against which Spark resolves a
    checkpoint location without a scheme). Returns the session's
    :class:`sinks.driver.registry.FlushRegistry`.

    With a Spark Connect session (``SparkSession.builder.remote``) the listener and the
    flushers run in this (the client's) process, and each stream must be tracked once started:
    ``sinks.register(spark).track(query, checkpointLocation)`` (:mod:`sinks.driver.connect`).

    Runs: in the driver process (Spark Connect: the client's), on the calling thread. It also
    starts this process's credential channel (:mod:`recovery.cql.credentials`; not with Spark Connect),
    through which credentials given as write options reach the driver's flusher, in memory
    only.
    """
    return register_session(spark)


def wait_flushed(query, timeout: float | None = None) -> None:
    """Return once every batch ``query`` has committed so far is written to Cassandra; works
    while it runs and after ``query.stop()``. Raises ``WalBlocked`` (the WAL is blocked: the
    reason and the remedy), ``NotFlushedYet`` (a ``TimeoutError`` naming the pending batches
    and their rows) after ``timeout`` seconds. See :func:`sinks.driver.wait.wait_flushed`.

    Runs: in the driver process, on the calling thread."""
    _wait_flushed(query, timeout)


def status(query, lag_after_s: float = 30.0, table: str | None = None):
    """The figures of ``query``'s WAL now (a :class:`recovery.health.Health`): ``state``
    (healthy, lagging, blocked) and ``blocked_reason``; ``pending_batches``, ``pending_rows``,
    ``pending_bytes`` (committed, not yet in Cassandra) against ``max_bytes``;
    ``oldest_pending_age_s``; ``last_written_batch`` and ``last_write_latency_s`` (commit to
    visible); ``rows_per_s``; ``retries`` and ``replays``; ``wal_bytes``. A foreachBatch
    function writing several tables: over all their WALs, or one (``table="ks.t"``). Never
    waits: see :func:`wait_flushed` to wait for the backlog. See
    :func:`sinks.driver.query_status.status`.

    Runs: in the driver process, on the calling thread."""
    return _status(query, lag_after_s, table)


def recover(spark, wal_path: str, checkpoint: str | None = None, *, force: bool = False):
    """Write a stopped query's committed backlog (the WAL at ``wal_path``) through Spark tasks
    of ``spark``, as ``cassandra-wal recover`` does from one process; returns the
    :class:`recovery.replay.ReplayReport`. See :func:`sinks.driver.recover_job.recover`.

    Runs: in the driver process, on the calling thread; the rows on the executors."""
    return _recover(spark, wal_path, checkpoint, force=force)


__all__ = ["register", "wait_flushed", "status", "recover"]
