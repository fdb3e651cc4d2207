"""A drop-in Cassandra sink for Spark that lands every micro-batch exactly once in effect.

Use::

    import sinks
    sinks.register(spark)
    (df.writeStream.format("cassandra_wal")
       .option("keyspace", "ks").option("table", "events")
       .option("checkpointLocation", "/data/checkpoints/events")
       .option("spark.cassandra.connection.host", "10.0.0.1,10.0.0.2")
       .start())

Lifecycle of batch N (details: ``docs/architecture.md``, on-disk: ``wal/FORMAT.md``):

1. ``streamWriter`` (driver host): options parsed, DataFrame validated against the live
   table; bad input fails here, before anything is staged (:mod:`sinks.plan`).
2. ``write`` (every task): rows staged as an immutable, checksummed WAL segment.
3. ``commit(N)`` (Spark's commit worker): the winning segments and the write timestamps are
   sealed, durably, before Spark may write ``commits/N``.
4. Spark writes ``commits/N``; the listener wakes the driver's flusher (:mod:`sinks.driver`).
5. The flusher ingests the seal into the RocksDB log, writes every row with idempotent
   upserts at the sealed timestamps, records progress, marks the batch flushed.
6. After a crash, the next query start replays what Spark committed and we did not finish,
   and discards what Spark never committed (:mod:`recovery`).

``sinks.wait_flushed(query, timeout)`` returns once every batch the query committed is in
Cassandra (a stopped query's last drain is finished at exit too).
"""

from __future__ import annotations

from .errors import (ConnectionFailed, CounterTableError, NullPrimaryKeyError, OptionError,
                     SchemaError, SinkError, UnknownKeyspaceError, UnknownTableError)

FORMAT_NAME = "cassandra_wal"


def __getattr__(name):
    # Imported on first use: recovery.target imports sinks.options, and an eager import of the
    # writers here (which import recovery) would make that a circular import.
    if name in ("WalBlocked", "NotFlushedYet"):     # what wait_flushed raises
        import recovery.errors
        return getattr(recovery.errors, name)
    if name == "CassandraWalWriter":
        from .foreach_batch import CassandraWalWriter
        return CassandraWalWriter
    if name == "CassandraWalDataSource":
        from .source import CassandraWalDataSource
        return CassandraWalDataSource
    raise AttributeError(f"module 'sinks' has no attribute {name!r}")

_registries: dict[int, object] = {}


def register(spark):
    """Register the ``cassandra_wal`` data source and the driver-side flusher with ``spark``.

    Call it once per SparkSession, after setting any ``spark.cassandra.*`` session conf you
    want as defaults (and after changing ``fs.defaultFS``, against which Spark resolves a
    checkpoint location without a scheme). Returns the session's
    :class:`sinks.driver.FlushRegistry`.

    It also starts this process's credential channel (:mod:`sinks.credentials`), through which
    credentials given as write options reach the driver's flusher, in memory only.
    """
    from wal.checkpoint import Filesystems

    from . import credentials
    from .driver import FlushRegistry
    from .source import CassandraWalDataSource
    from .listener import CassandraWalListener

    conf = {k: v for k, v in spark.conf.getAll.items() if k.startswith("spark.cassandra.")}
    channel = credentials.ensure_server().path
    source = type("CassandraWalDataSource", (CassandraWalDataSource,),
                  {"session_conf": conf, "credential_channel": channel,
                   "filesystems": Filesystems.of_session(spark), "__module__": __name__,
                   "__qualname__": "CassandraWalDataSource<registered>"})
    spark.dataSource.register(source)
    registry = _registries.get(id(spark))
    if registry is None:
        registry = FlushRegistry(spark, conf)
        spark.streams.addListener(CassandraWalListener(registry))
        _registries[id(spark)] = registry
    else:
        registry.session_conf = conf
    return registry


def wait_flushed(query, timeout: float | None = None) -> None:
    """Return once every batch ``query`` has committed so far is written to Cassandra; works
    while it runs and after ``query.stop()``. Raises ``WalBlocked`` (the WAL is blocked: the
    reason and the remedy), ``NotFlushedYet`` (a ``TimeoutError`` naming the pending batches
    and their rows) after ``timeout`` seconds. See :func:`sinks.driver.wait_flushed`."""
    from .driver import wait_flushed as wait

    wait(query, timeout)


__all__ = ["register", "wait_flushed", "WalBlocked", "NotFlushedYet",
           "CassandraWalWriter", "CassandraWalDataSource", "FORMAT_NAME",
           "SinkError", "OptionError", "SchemaError", "NullPrimaryKeyError", "ConnectionFailed",
           "CounterTableError", "UnknownKeyspaceError", "UnknownTableError"]
