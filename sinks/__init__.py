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
   or job; :mod:`sinks.worker.source`): the options are parsed (:mod:`sinks.worker.options`),
   the DataFrame validated against the live table (:mod:`sinks.worker.validation`), the WAL
   resolved and bound to the query (:mod:`sinks.worker.plan`). Bad input fails here, before
   anything is staged.
2. ``write`` (every task, on executors): the task's rows become one WAL segment (:mod:`wal`).
3. ``commit(N)`` (Spark's commit worker): back-pressure against ``wal.maxBytes``, then the
   seal, before Spark may write ``commits/N``. A batch job writes its rows right there
   (:mod:`sinks.worker.batch_jobs`); a stream's are written once Spark has committed N:
4. the listener (:mod:`sinks.driver.listener`, :mod:`sinks.driver.registry`, in the driver
   process) starts a flusher for each run of a query and wakes it after each commit; the
   flusher, recovery and the writing itself are :mod:`recovery`'s.

With Spark Connect (``SparkSession.builder.remote``), steps 1-3 run on the server and the
listener and flusher in the client process, which must be told each query's checkpoint:
``sinks.register(spark).track(query, checkpointLocation)`` (:mod:`sinks.driver.connect`).

The package has two halves: :mod:`sinks.worker` (what Spark's Python workers load, steps 1-3
and the flush job's tasks) and :mod:`sinks.driver` (the driver process's: step 4, and the
functions below but the writer). Only the first is imported with ``sinks``.

``foreachBatch`` users get the same through :class:`CassandraWalWriter`
(:mod:`sinks.worker.foreach_batch`), and ``sinks.wait_flushed(query, timeout)`` returns once
every batch a query committed is in Cassandra (:mod:`sinks.driver.wait`);
``sinks.status(query)`` returns the figures of its WAL now: backlog, oldest pending age,
latency, retries, blocked state (:mod:`sinks.driver.query_status`);
``sinks.recover(spark, wal, checkpoint)`` writes a stopped query's backlog through Spark tasks
(:mod:`sinks.driver.recover_job`).
"""

from __future__ import annotations

import importlib

from recovery.cql.errors import (
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

from .worker.foreach_batch import CassandraWalWriter
from .worker.source import FORMAT_NAME, CassandraWalDataSource

#: The public functions of the driver's side (:mod:`sinks.driver`), loaded on their first use
#: (PEP 562): Spark's one-shot Python workers import this package twice a micro-batch, to
#: unpickle the data source, and never need the flusher, which brings recovery's writers and
#: cassandra-driver's cluster module (about 90 ms a worker; tests/unit/test_architecture.py
#: keeps the workers' imports light).
DRIVER_SIDE = ("register", "wait_flushed", "status", "recover")


def __getattr__(name: str):
    if name not in DRIVER_SIDE:
        raise AttributeError(f"module 'sinks' has no attribute {name!r}")
    value = getattr(importlib.import_module("sinks.driver"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(DRIVER_SIDE))


__all__ = ["register", "wait_flushed", "status", "recover", "WalBlocked", "NotFlushedYet",
           "CassandraWalWriter", "CassandraWalDataSource", "FORMAT_NAME",
           "SinkError", "OptionError", "SchemaError", "NullPrimaryKeyError", "ConnectionFailed",
           "CounterTableError", "UnknownKeyspaceError", "UnknownTableError"]
