"""End to end: a checkpoint (or ``wal.path``) that Spark resolves to a filesystem the sink
cannot reach (neither local nor a store: ``viewfs://`` here), or a batch job's WAL on a store,
is refused by the sink before anything is staged (issue 17, item 5; HDFS and S3 streams since
issue 19: ``test_sink_stores.py``).

Spark qualifies a location without a scheme against the session's ``fs.defaultFS``. These
tests set it in the shared session's Hadoop configuration, re-register the sink (which takes
it up), and restore both afterwards.

Why ViewFs for the stream: with ``hdfs://127.0.0.1:1`` (no server) Spark itself fails
``start()`` while creating the checkpoint (connection refused), before the sink is asked for
a writer. ViewFs is a Hadoop filesystem that needs no server (a client-side mount table,
here onto a local folder), so Spark runs the query and the sink sees a ``viewfs://``
checkpoint it cannot read, as it would see ``hdfs://`` on a real cluster. A batch ``df.write``
has no checkpoint, so it shows the ``hdfs://127.0.0.1:1`` default as it is.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import pytest

from sinkutil import (create_table, error_text, read_table, register, running, sink_options,
                      sink_error_line)

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def default_fs(spark, uri: str, **more: str):
    """The session's ``fs.defaultFS`` set to ``uri`` (and ``more`` Hadoop settings), the sink
    re-registered with it; both restored on the way out."""
    conf = spark._jsc.hadoopConfiguration()
    settings = dict(more, **{"fs.defaultFS": uri})
    before = {k: conf.get(k) for k in settings}
    for k, v in settings.items():
        conf.set(k, v)
    register(spark)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)
        register(spark)


def test_a_stream_checkpoint_on_another_filesystem_is_refused_before_staging(
        spark, cassandra_node, cql, keyspace, tmp_path):
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text)")
    checkpoint = str(tmp_path / "cp")          # no scheme: Spark puts it on the default FS
    mount = f"cwal{uuid.uuid4().hex[:8]}"      # a fresh name: Hadoop caches filesystems
    rows = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
            .selectExpr("CAST(value AS INT) AS id", "CAST(value AS STRING) AS name"))
    with default_fs(spark, f"viewfs://{mount}/",
                    **{f"fs.viewfs.mounttable.{mount}.link.{tmp_path}": f"file://{tmp_path}"}):
        query = (rows.writeStream.format("cassandra_wal")
                 .options(**sink_options(cassandra_node, keyspace, "items", checkpoint))
                 .start())
        with running(query):
            resolved = str(query._jsq.streamingQuery().resolvedCheckpointRoot())
            with pytest.raises(Exception) as info:
                query.awaitTermination(180)
    assert resolved == f"viewfs://{mount}{checkpoint}"
    line = sink_error_line(error_text(info.value))
    assert "OptionError" in line and "'checkpointLocation'" in line, line
    assert resolved in line and "cannot reach" in line and "hdfs://" in line, line
    # Spark wrote its checkpoint (through the mount); the sink wrote nothing anywhere.
    assert os.path.isdir(os.path.join(checkpoint, "offsets"))
    assert sorted(os.listdir(tmp_path)) == ["cp"]
    assert not {"cassandra_wal", "cassandra_wal_sink.json"} & set(os.listdir(checkpoint))
    assert read_table(cql, keyspace, "items") == []


def test_a_batch_wal_path_on_hdfs_is_refused_before_staging(spark, cassandra_node, cql,
                                                            keyspace, tmp_path):
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text)")
    wal = str(tmp_path / "wal")
    with default_fs(spark, "hdfs://127.0.0.1:1"):
        with pytest.raises(Exception) as info:
            spark.createDataFrame([(1, "a")], "id INT, name STRING").write \
                .format("cassandra_wal").mode("append") \
                .options(**sink_options(cassandra_node, keyspace, "items", **{"wal.path": wal})) \
                .save()
    line = sink_error_line(error_text(info.value))
    assert "OptionError" in line and "'wal.path'" in line, line
    assert f"hdfs://127.0.0.1:1{wal}" in line and "fs.defaultFS" in line, line
    assert os.listdir(tmp_path) == []
    assert read_table(cql, keyspace, "items") == []
