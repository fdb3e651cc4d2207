"""End to end (real Spark, the real node): what users write in a ``foreachBatch`` function.

Issue 30, items 2 and 3: a function writing two tables (a table and its denormalized twin,
the usual Cassandra pattern) through two writers given the query's checkpoint shared one WAL,
so the second seal replaced the first and the first table got no row; a function that did not
call the writer for a batch (``if df.isEmpty(): return``) left a committed batch without a
seal, which blocked the sink for good; and a function that caught the writer's error and
returned was not told apart from one that skipped the batch.
"""

from __future__ import annotations

import os
import time

import pytest

import sinks
from sinkutil import (assert_rows_equal, committed_batches, connection_options, create_table,
                      error_text, read_table, register, rows_by_key, running, stream_wal,
                      wait_for, wait_query_done, write_json_files)
from wal import catalog
from wal.catalog import RecoveryAction, ViewState

pytestmark = pytest.mark.integration

SCHEMA = "id INT, customer STRING, total INT"


def _orders(file_index: int, n: int = 5) -> list[dict]:
    return [{"id": file_index * 10 + i, "customer": f"c{i % 2}", "total": file_index * 100 + i}
            for i in range(n)]


def _failure(query, timeout: float = 180) -> str:
    """Wait for ``query`` to end; what its failure says (it must have failed)."""
    try:
        query.awaitTermination(timeout)
    except Exception:  # noqa: BLE001 - awaitTermination raises the query's failure
        pass
    assert not query.isActive, "the query did not end"
    assert query.exception() is not None, "the query did not fail"
    return error_text(query.exception())


def _stream(spark, src):
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src)))


def test_a_function_writing_two_tables_lands_every_row_in_both_and_skips_what_it_skips(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Two tables from one stream, each through a writer of its own; the function skips the
    twin in batch 2 and both tables in batch 3 (an empty file). Before: the first table got
    no row (the second seal replaced the first, and the flush deleted the first writer's
    segments), and the first skipped batch blocked the sink."""
    register(spark)
    create_table(cql, keyspace, "orders (id int PRIMARY KEY, customer text, total int)")
    create_table(cql, keyspace, "orders_by_customer (customer text, id int, total int, "
                                "PRIMARY KEY (customer, id))")
    src, cp = tmp_path / "src", str(tmp_path / "cp")
    files = [_orders(0), _orders(1), _orders(2), [], _orders(4)]
    write_json_files(src, files)
    conn = connection_options(cassandra_node)
    orders = sinks.CassandraWalWriter(keyspace, "orders", cp, options=conn)
    by_customer = sinks.CassandraWalWriter(keyspace, "orders_by_customer", cp, options=conn)
    calls = []

    def write(df, batch_id):
        if df.isEmpty():
            calls.append((batch_id, "empty"))
            return
        df.persist()
        orders(df, batch_id)
        if batch_id != 2:
            by_customer(df, batch_id)
        df.unpersist()
        calls.append((batch_id, "written"))

    query = (_stream(spark, src).writeStream.foreachBatch(write)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert calls == [(0, "written"), (1, "written"), (2, "written"), (3, "empty"),
                     (4, "written")]
    sinks.wait_flushed(query, timeout=60)

    every = {r["id"]: r for rows in files for r in rows}
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "orders"), "id"), every, "orders")
    twin = {(r["customer"], r["id"]): r for b, rows in enumerate(files) if b != 2 for r in rows}
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "orders_by_customer"),
                                  "customer", "id"), twin, "orders_by_customer")

    wals = {t: stream_wal(cp, f"{keyspace}.{t}") for t in ("orders", "orders_by_customer")}
    assert wals["orders"].root != wals["orders_by_customer"].root
    for table, wal in wals.items():
        views = catalog.describe_read_only(wal, cp)
        assert all(v.action == RecoveryAction.NOTHING for v in views), (table, views)
        assert wal.read_flushed_through() == 4 and wal.read_blocked() is None
    skipped = {v.batch for v in catalog.describe_read_only(wals["orders_by_customer"], cp)
               if v.state == ViewState.SKIPPED}
    assert skipped <= {2, 3}            # the ones left above the flushed mark, if any
    health = sinks.status(query)
    assert health.state == "healthy" and health.pending_batches == 0
    assert health.flushed_through == 4
    assert sinks.status(query, table=f"{keyspace}.orders").wal == wals["orders"].root


def test_a_function_that_swallows_the_writers_error_blocks_that_tables_wal(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Batch 1 holds a row the writer refuses (a null primary key); the function catches the
    error and returns, so Spark commits batch 1 without its rows. The table's WAL blocks,
    naming batch 1; the next batch's write fails the query with the reason. Before, nothing
    told this from a batch the function skipped on purpose."""
    register(spark)
    create_table(cql, keyspace, "events (id int PRIMARY KEY, customer text, total int)")
    src, cp = tmp_path / "src", str(tmp_path / "cp")
    bad = _orders(1)
    bad[2]["id"] = None
    files = [_orders(0), bad, _orders(2)]
    write_json_files(src, files)
    writer = sinks.CassandraWalWriter(keyspace, "events", cp,
                                      options=connection_options(cassandra_node))
    caught = []

    def write(df, batch_id):
        if batch_id == 2:       # only once the flusher has judged batch 1
            wal = stream_wal(cp, f"{keyspace}.events")
            wait_for(lambda: wal.read_blocked() is not None, 120, what="the WAL to block")
        try:
            writer(df, batch_id)
        except Exception as exc:  # noqa: BLE001 - the user's mistake this test plays
            if batch_id != 1:
                raise
            caught.append(type(exc).__name__)

    query = (_stream(spark, src).writeStream.foreachBatch(write)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    with running(query):
        failure = _failure(query)
    assert caught, "the writer did not fail on the null key"
    assert 1 in committed_batches(cp)
    assert "blocked" in failure and "batch 1" in failure and "catch" in failure
    assert "A batch a foreachBatch function lost" in failure
    health = sinks.status(query)
    assert health.state == "blocked" and "batch 1" in health.blocked_reason
    assert {r["id"] for r in read_table(cql, keyspace, "events")} == {r["id"] for r in files[0]}


def test_a_table_written_twice_in_one_batch_is_refused_before_anything_lands(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Two calls of one table's writer in one batch: the second seal would replace the first
    (its rows lost). Refused, naming the table; the batch is not committed, nothing lands."""
    register(spark)
    create_table(cql, keyspace, "twice (id int PRIMARY KEY, customer text, total int)")
    src, cp = tmp_path / "src", str(tmp_path / "cp")
    write_json_files(src, [_orders(0)])
    writer = sinks.CassandraWalWriter(keyspace, "twice", cp,
                                      options=connection_options(cassandra_node))

    def write(df, batch_id):
        writer(df.filter("id < 2"), batch_id)
        writer(df.filter("id >= 2"), batch_id)

    query = (_stream(spark, src).writeStream.foreachBatch(write)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    with running(query):
        failure = _failure(query)
    assert f"{keyspace}.twice is written twice in one micro-batch" in failure
    assert committed_batches(cp) == []
    time.sleep(1)
    assert read_table(cql, keyspace, "twice") == []
    assert not os.path.exists(os.path.join(cp, "commits", "0"))
