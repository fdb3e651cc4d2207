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

``foreachBatch`` users get the same through :class:`CassandraWalWriter`
(:mod:`sinks.foreach_batch`), and ``sinks.wait_flushed(query, timeout)`` returns once every
batch a query committed is in Cassandra (:mod:`sinks.wait`).
"""

from __future__ import annotations

from cql import credentials
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
from wal.checkpoint import Filesystems

from .foreach_batch import CassandraWalWriter
from .listener import CassandraWalListener
from .registry import FlushRegistry
from .source import FORMAT_NAME, CassandraWalDataSource
from .wait import wait_flushed

_registries: dict[int, FlushRegistry] = {}     # by id(spark): one per session


def register(spark):
    """Register the ``cassandra_wal`` data source and the driver-side flusher with ``spark``.

    Call it once per SparkSession, after setting any ``spark.cassandra.*`` session conf you
    want as defaults (and after changing ``fs.defaultFS``, against which Spark resolves a
    checkpoint location without a scheme). Returns the session's
    :class:`sinks.registry.FlushRegistry`.

    Runs: in the driver process, on the calling thread. It also starts this process's
    credential channel (:mod:`cql.credentials`), through which credentials given as write
    options reach the driver's flusher, in memory only.
    """
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


__all__ = ["register", "wait_flushed", "WalBlocked", "NotFlushedYet",
           "CassandraWalWriter", "CassandraWalDataSource", "FORMAT_NAME",
           "SinkError", "OptionError", "SchemaError", "NullPrimaryKeyError", "ConnectionFailed",
           "CounterTableError", "UnknownKeyspaceError", "UnknownTableError"]
