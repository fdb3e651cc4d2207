"""Spark Connect: what differs when ``sinks.register`` is given a Connect client's session.

Measured on PySpark 4.3.0 against ``scripts/spark-connect`` (docs/user-guide.md, 'Spark
Connect'): the data source a client registers runs on the server (``streamWriter``, ``write``
and ``commit`` in the server's Python workers, as in a classic session); the client's
``spark.streams.addListener`` runs the listener in the *client* process (``onQueryStarted``
synchronously at the end of ``start()``, when the server's query is already running;
``onQueryProgress`` after ``commits/N``); and nothing in the client tells where a query's
checkpoint is: no ``_jsq``, no JVM, and neither the events, ``lastProgress``, ``status`` nor
``explain()`` name it. So:

* the flusher runs in the client process, beside the listener, and reads Spark's checkpoint
  and the WAL itself: the client must reach them (the same host, a shared mount, HDFS or S3)
  and Cassandra;
* the client learns a query's checkpoint from the user (:meth:`FlushRegistry.track
  <sinks.driver.registry.FlushRegistry.track>`), checked against the query id Spark wrote in the
  checkpoint's ``metadata`` (:func:`tracked_checkpoint`);
* the first drain of a run is an ordinary one (undecided batches wait), never the classic
  recovery that discards what Spark did not commit: the server's first batch may already be
  staging when the client hears of the query;
* what the server resolves locations against is known here only from the session conf
  (``spark.hadoop.fs.defaultFS``), so the data source refuses relative locations
  (:class:`~sinks.worker.connect_source.ConnectCassandraWalDataSource`, which the server's
  workers load), and credentials given as write options, which reach only the server's
  workers, never the client's flusher.
"""

from __future__ import annotations

from recovery.cql.errors import OptionError, SinkError
from sinks.worker.connect_source import is_relative
from wal import checkpoint as ckpt
from wal import clock
from wal.stores import StoreAccess

#: How long :func:`tracked_checkpoint` waits for Spark's ``metadata`` to be visible (a store's
#: listing may lag the server's write by a moment).
METADATA_WAIT_S = 10.0
HADOOP_PREFIX = "spark.hadoop."


def is_connect_session(spark) -> bool:
    """``spark`` is a Spark Connect client's session (``pyspark.sql.connect.session``), told
    by its class alone: importing the Connect client needs ``grpcio``, which a classic
    installation may lack."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def filesystems_of(conf: dict) -> ckpt.Filesystems:
    """What a Connect server resolves locations against, as far as the session conf (``conf``:
    ``spark.conf.getAll``) tells: ``spark.hadoop.fs.defaultFS`` (else ``file:///``) and the
    ``spark.hadoop.*`` store settings. No working directory: relative locations are refused
    (:class:`~sinks.worker.connect_source.ConnectCassandraWalDataSource`). A default filesystem set only in the server's
    ``core-site.xml`` is not seen here: give locations with a scheme then."""
    default_fs = conf.get(HADOOP_PREFIX + "fs.defaultFS") or ckpt.LOCAL_DEFAULT_FS
    access = StoreAccess.of_hadoop_conf(lambda key: conf.get(HADOOP_PREFIX + key), default_fs)
    return ckpt.Filesystems(default_fs, None, access)


def tracked_checkpoint(query_id: str, location: str, filesystems: ckpt.Filesystems,
                       wait_s: float = METADATA_WAIT_S, sleep=clock.sleep,
                       monotonic=clock.monotonic) -> str:
    """The checkpoint of query ``query_id`` at ``location`` (what the user gave as
    ``checkpointLocation``), resolved as the server resolves it; a :class:`SinkError` unless
    Spark's ``metadata`` there names that query (a wrong location would have the flusher wait
    on another query's commits, or none). Waits up to ``wait_s`` for ``metadata`` to be seen."""
    if is_relative(location):
        raise OptionError("checkpointLocation", location,
                          "Spark Connect: must be absolute (or a URI), as in the query's options")
    resolved = filesystems.resolve(location)
    checkpoint = resolved.local if resolved.local is not None else resolved.uri
    deadline = monotonic() + wait_s
    while True:
        found = ckpt.open_checkpoint(checkpoint).query_id()
        if found is not None or monotonic() >= deadline:
            break
        sleep(0.2)
    if found is None:
        raise SinkError(f"query {query_id}: no Spark checkpoint at {resolved.uri} as this "
                        "process sees it: give the query's checkpointLocation, and run the "
                        "client where it reaches the checkpoint (the server's host, a shared "
                        "mount, HDFS or S3)")
    if found != query_id:
        raise SinkError(f"query {query_id}: the checkpoint at {resolved.uri} is query "
                        f"{found}'s: give this query's checkpointLocation")
    return checkpoint
