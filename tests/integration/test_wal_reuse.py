"""A WAL serves one query (issue 17, item 3), on the real node and real Spark.

Batch ids start at 0 in every checkpoint. Before a WAL was bound to its query, a second query
given the same ``wal.path``, or the same query restarted from a reset checkpoint with its
``wal.path`` kept, found its batches 0, 1, ... "already flushed" in the WAL and skipped them
without a word: its rows never reached Cassandra. Now both fail at their first batch with an
error naming the WAL, both checkpoints and the remedy, and write nothing.
"""

from __future__ import annotations

import shutil

import pytest
from pyspark.errors import StreamingQueryException

from sinkutil import (create_table, error_text, read_table, register, rows_by_key, running,
                      sink_options, wait_all_flushed, write_json_files)
from wal.layout import WalDir

pytestmark = pytest.mark.integration

SCHEMA = "id INT, name STRING"


def rows(first: int, n: int = 5) -> list[dict]:
    return [{"id": first + i, "name": f"row {first + i}"} for i in range(n)]


def start(spark, node, keyspace, src, cp, wal_path):
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    return (stream.writeStream.format("cassandra_wal")
            .options(**sink_options(node, keyspace, "events", cp, **{"wal.path": str(wal_path)}))
            .trigger(processingTime="300 milliseconds").start())


def failure(query) -> str:
    """The error the query failed with (awaitTermination raises it)."""
    try:
        query.awaitTermination(120)
    except StreamingQueryException as exc:
        return error_text(exc)
    raise AssertionError("the query should have failed at its first batch")


def test_a_shared_or_kept_wal_path_is_refused_instead_of_skipping_batches(
        spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, "events (id int PRIMARY KEY, name text)")
    wal_path, cp1, cp2 = tmp_path / "wal", tmp_path / "cp1", tmp_path / "cp2"
    write_json_files(tmp_path / "src1", [rows(0), rows(5)])
    with running(start(spark, cassandra_node, keyspace, tmp_path / "src1", cp1, wal_path)):
        wait_all_flushed(cp1, WalDir(str(wal_path)), at_least=1)

    # Another query (its own checkpoint, other rows) given the same wal.path.
    write_json_files(tmp_path / "src2", [rows(100), rows(105)])
    query = start(spark, cassandra_node, keyspace, tmp_path / "src2", cp2, wal_path)
    with running(query):
        text = failure(query)
    assert "wal.path" in text and str(wal_path) in text
    assert str(cp1) in text and str(cp2) in text

    # The first query started again from scratch: its checkpoint deleted, its wal.path kept.
    shutil.rmtree(cp1)
    query = start(spark, cassandra_node, keyspace, tmp_path / "src2", cp1, wal_path)
    with running(query):
        text = failure(query)
    assert "belongs to the query checkpointed at" in text and str(wal_path) in text

    # Nothing of either refused query reached Cassandra; the first query's rows are all there.
    assert sorted(rows_by_key(read_table(cql, keyspace, "events"), "id")) == list(range(10))
