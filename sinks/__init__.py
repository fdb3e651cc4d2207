"""A drop-in Cassandra sink for Spark that lands every micro-batch exactly once in effect.

Use::

    import sinks
    sinks.register(spark)
    (df.writeStream.format("cassandra_wal")
       .option("keyspace", "ks").option("table", "events")
       .option("checkpointLocation", "/data/checkpoints/events")
       .option("spark.cassandra.connection.host", "10.0.0.1,10.0.0.2")
       .start())

Floor 4 of 4, the only one that knows Spark (floors: ``docs/architecture.md``). What Spark
calls, where it runs, and what it hands to the floors below:

1. ``streamWriter`` / ``writer`` (a Python worker on the driver host, once per micro-batch
   or job; :mod:`sinks.source`): the options are parsed (:mod:`sinks.options`), the
   DataFrame validated against the live table (:mod:`sinks.validation`), the WAL resolved and
   bound to the query (:mod:`sinks.plan`). Bad input fails here, before anything is staged.
2. ``write`` (every task, on executors): the task's rows become one WAL segment (:mod:`wal`).
3. ``commit(N)`` (Spark's commit worker): back-pressure against ``wal.maxBytes``, then the
   seal, before Spark may write ``commits/N``. A batch job writes its rows right there
   (:mod:`sinks.batch_jobs`); a stream's are written once Spark has committed N:
4. the listener (:mod:`sinks.listener`, :mod:`sinks.registry`, in the driver process) starts
   a flusher for each run of a query and wakes it after each commit; the flusher, recovery
   and the writing itself are :mod:`recovery`'s.

With Spark Connect (``SparkSession.builder.remote``), steps 1-3 run on the server and the
listener and flusher in the client process, which must be told each query's checkpoint:
``sinks.register(spark).track(query, checkpointLocation)`` (:mod:`sinks.connect`).

``foreachBatch`` users get the same through :class:`CassandraWalWriter`
(:mod:`sinks.foreach_batch`), and ``sinks.wait_flushed(query, timeout)`` returns once every
batch a query committed is in Cassandra (:mod:`sinks.wait`); ``sinks.status(query)`` returns
the figures of its WAL now: backlog, oldest pending age, latency, retries, blocked state
(:mod:`sinks.query_status`); ``sinks.recover(spark, wal, checkpoint)`` writes a stopped
query's backlog through Spark tasks (:mod:`sinks.recover_job`).
"""

from __future__ import annotations

from cql.errors import (
    ConnectionFailed,
    CounterTableError,
    NullPrimaryKeyError,
    OptionError,
    SchemaError,
    SinkError,
    UnknownKeyspaceError,
    UnknownTableError,
)
from recovery.errors import NotFlushedYet, WalBlocked

from .foreach_batch import CassandraWalWriter
from .source import FORMAT_NAME, CassandraWalDataSource

# Why register and wait_flushed import the driver side when called, not above: Spark's
# one-shot Python workers import this package (to unpickle the data source) twice a
# micro-batch and never need the flusher, which brings recovery's writers and the Cassandra
# driver's cluster module: about 90 ms a worker (tests/unit/test_architecture.py keeps the
# workers' imports light, and these two the only imports of the project's own modules that
# wait for a call).


def register(spark):
    """Register the ``cassandra_wal`` data source and the driver-side flusher with ``spark``.

    Call it once per SparkSession, after setting any ``spark.cassandra.*`` session conf you
    want as defaults (and after changing ``fs.defaultFS``, against which Spark resolves a
    checkpoint location without a scheme). Returns the session's
    :class:`sinks.registry.FlushRegistry`.

    With a Spark Connect session (``SparkSession.builder.remote``) the listener and the
    flushers run in this (the client's) process, and each stream must be tracked once started:
    ``sinks.register(spark).track(query, checkpointLocation)`` (:mod:`sinks.connect`).

    Runs: in the driver process (Spark Connect: the client's), on the calling thread. It also
    starts this process's credential channel (:mod:`cql.credentials`; not with Spark Connect),
    through which credentials given as write options reach the driver's flusher, in memory
    only.
    """
    from .registry import register_session

    return register_session(spark)


def wait_flushed(query, timeout: float | None = None) -> None:
    """Return once every batch ``query`` has committed so far is written to Cassandra; works
    while it runs and after ``query.stop()``. Raises ``WalBlocked`` (the WAL is blocked: the
    reason and the remedy), ``NotFlushedYet`` (a ``TimeoutError`` naming the pending batches
    and their rows) after ``timeout`` seconds. See :func:`sinks.wait.wait_flushed`.

    Runs: in the driver process, on the calling thread."""
    from .wait import wait_flushed as wait

    wait(query, timeout)


def status(query, lag_after_s: float = 30.0, table: str | None = None):
    """The figures of ``query``'s WAL now (a :class:`recovery.health.Health`): ``state``
    (healthy, lagging, blocked) and ``blocked_reason``; ``pending_batches``, ``pending_rows``,
    ``pending_bytes`` (committed, not yet in Cassandra) against ``max_bytes``;
    ``oldest_pending_age_s``; ``last_written_batch`` and ``last_write_latency_s`` (commit to
    visible); ``rows_per_s``; ``retries`` and ``replays``; ``wal_bytes``. A foreachBatch
    function writing several tables: over all their WALs, or one (``table="ks.t"``). Never
    waits: see :func:`wait_flushed` to wait for the backlog. See
    :func:`sinks.query_status.status`.

    Runs: in the driver process, on the calling thread."""
    from .query_status import status as read

    return read(query, lag_after_s, table)


def recover(spark, wal_path: str, checkpoint: str | None = None, *, force: bool = False):
    """Write a stopped query's committed backlog (the WAL at ``wal_path``) through Spark tasks
    of ``spark``, as ``cassandra-wal recover`` does from one process; returns the
    :class:`recovery.replay.ReplayReport`. See :func:`sinks.recover_job.recover`.

    Runs: in the driver process, on the calling thread; the rows on the executors."""
    from .recover_job import recover as replay

    return replay(spark, wal_path, checkpoint, force=force)


__all__ = ["register", "wait_flushed", "status", "recover", "WalBlocked", "NotFlushedYet",
           "CassandraWalWriter", "CassandraWalDataSource", "FORMAT_NAME",
           "SinkError", "OptionError", "SchemaError", "NullPrimaryKeyError", "ConnectionFailed",
           "CounterTableError", "UnknownKeyspaceError", "UnknownTableError"]
