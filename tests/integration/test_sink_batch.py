"""End to end: a batch ``df.write.format("cassandra_wal").save()`` -> Cassandra."""

from __future__ import annotations

import pytest

from sinkutil import (assert_rows_equal, create_table, read_table, register, rows_by_key,
                      sink_options, wal_files, error_text)
from wal.layout import WalDir
from wal.log import WalLog
from wal.seal import COMMIT_POINT_SEAL, read_seal
from wal.states import BatchState

pytestmark = pytest.mark.integration

SCHEMA = "id INT, name STRING, score DOUBLE, tags ARRAY<STRING>"


def _rows(ids, name_prefix):
    return [(i, f"{name_prefix}-{i}", i * 1.25, [name_prefix, str(i)]) for i in ids]


def _expected(rows):
    return {r[0]: {"id": r[0], "name": r[1], "score": r[2], "tags": r[3]} for r in rows}


def test_batch_save_writes_exactly_the_rows_then_upserts(spark, cassandra_node, cql, keyspace,
                                                         tmp_path):
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags list<text>)")
    wal = WalDir(str(tmp_path / "wal"))
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": wal.root})

    first = _rows(range(0, 40), "first")
    spark.createDataFrame(first, SCHEMA).repartition(3).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()
    # save() returns after the job's commit flushed: no waiting.
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "items"), "id"), _expected(first),
                      "after the first save")

    # Overlapping keys 30..59: 30..39 are replaced, 40..59 added, 0..29 untouched.
    second = _rows(range(30, 60), "second")
    spark.createDataFrame(second, SCHEMA).repartition(2).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()
    expected = _expected(first[:30])
    expected.update(_expected(second))
    actual = rows_by_key(read_table(cql, keyspace, "items"), "id")
    assert len(actual) == 60
    assert_rows_equal(actual, expected, "after the second save")

    # Both jobs went through the WAL as one batch each, sealed at their own commit point,
    # and are flushed; their staged segments are gone.
    segments, seals = wal_files(wal)
    assert segments == []
    log = WalLog.open_reader(wal)
    try:
        records = log.records()
        assert [r.state for r in records] == [BatchState.FLUSHED, BatchState.FLUSHED]
        assert [r.seal.rows for r in records] == [40, 30]
        assert all(r.seal.commit_point == COMMIT_POINT_SEAL for r in records)
        # The second job's timestamps are above the first's: it wins the overlapping keys.
        assert records[1].seal.base_ts_us > records[0].seal.last_ts_us
    finally:
        log.close()
    assert read_seal(wal, records[1].batch) is not None   # the newest seal is always kept


def test_batch_overwrite_mode_is_refused(spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags list<text>)")
    cql.execute(f"INSERT INTO {keyspace}.items (id, name) VALUES (1, 'kept')")
    wal = WalDir(str(tmp_path / "wal"))
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": wal.root})
    with pytest.raises(Exception) as info:
        spark.createDataFrame(_rows([2], "x"), SCHEMA).write.format("cassandra_wal") \
            .mode("overwrite").options(**opts).save()
    text = error_text(info.value)
    assert "mode" in text and "overwrite" in text and "append" in text, text
    assert [r["id"] for r in read_table(cql, keyspace, "items")] == [1]
    assert wal_files(wal) == ([], [])
