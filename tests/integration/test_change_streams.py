"""A change stream's deletes on the real node (issue 35): a row marked a delete in ``op.column``
is written as a tombstone at its sealed timestamp, as an upsert is, so writing a batch again
(a retry, a replay after a crash) leaves the very same table, and an older batch written again
never brings a deleted row back.

Batches are sealed into a WAL (``WalFactory``) with the target's write record, as the sink's
commit seals them, and written by ``replay_wal`` (the Replayer and the driver's Upserter, as
recovery and ``cassandra-wal recover`` write them); the same sealed rows are then written again
by an Upserter of their own, as a retried or replayed flush would. End to end, a Debezium-style
stream goes through Spark, the data source and the flusher, and the table ends equal to the
source applied in order.
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import replace

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import sinks

from recovery.cql.config import ConnectionConfig, WriteConfig
from recovery.cql.connection import connect
from recovery.cql.table import TableSchema
from recovery.cql.upsert import Upserter
from recovery.config import SinkConfig, WalConfig
from recovery.cql import marker_table
from recovery.recover import replay_wal
from recovery.target import Target
from sinkutil import (
    cassandra_wal,
    create_table,
    running,
    sink_options,
    stream_wal,
    wait_all_flushed,
    write_json_files,
)
from tests.helpers.walfactory import WalFactory
from wal.recovery_policy import RecoveryPolicy
from wal.seal import read_seal

pytestmark = pytest.mark.integration

EVENTS = (("k", "int"), ("c", "int"), ("v", "text"))


def _target(node, keyspace: str, table: str, **write) -> Target:
    config = SinkConfig(keyspace, table, write=WriteConfig(op_column="op", **write),
                        connection=ConnectionConfig(hosts=(node.host,), port=node.port,
                                                    consistency="ONE"))
    schema = TableSchema(keyspace, table, EVENTS, ("k",), ("c",))
    return Target(config, schema, ("k", "c", "v"))


def _rows(*rows, stamps: list[int] | None = None) -> pa.RecordBatch:
    """``(k, c, v, op)`` rows in sealed order (and a ``ts`` column when ``stamps``)."""
    k, c, v, op = zip(*rows)
    columns = {"k": pa.array(k, pa.int32()), "c": pa.array(c, pa.int32()),
               "v": pa.array(v, pa.string()), "op": pa.array(op, pa.string())}
    if stamps is not None:
        columns["ts"] = pa.array(stamps, pa.int64())
    return pa.record_batch(columns)


def _table(cql, keyspace: str, table: str) -> dict[tuple, str]:
    return {(r.k, r.c): r.v for r in cql.execute(f"SELECT k, c, v FROM {keyspace}.{table}")}


def _write_again(target: Target, wal_factory: WalFactory, batch: int, rows: pa.RecordBatch):
    """Batch ``batch``'s rows (its one segment's one chunk) written again at its sealed
    timestamps, as a retried flush writes them (the same chunk, the same first timestamp)."""
    seal = wal_factory.built[batch].seal
    cluster, session = connect(target.config.connection)
    try:
        upserter = Upserter(session, target.table, target.columns, target.config.write)
        upserter.write_chunk(rows, seal.base_ts_us, batch)
    finally:
        cluster.shutdown()


def test_deletes_land_at_their_sealed_timestamps_and_a_replay_changes_nothing(
        cassandra_node, cql, keyspace, tmp_path):
    create_table(cql, keyspace, "changes (k int, c int, v text, PRIMARY KEY (k, c))")
    target = _target(cassandra_node, keyspace, "changes", partition_delete_values=("P",))
    # Batch 0: upserts, then in the same partition (sealed order) an update and a delete of
    # one key, and a delete of a key that never existed (a tombstone all the same).
    batch0 = _rows((1, 1, "a", "c"), (1, 2, "b", "c"), (1, 1, "a2", "u"), (1, 2, None, "d"),
                   (2, 1, "x", "r"), (3, 9, None, "d"))
    # Batch 1: a delete of partition 2 (its clustering column null), then a new row in it; a
    # row of partition 1 deleted and written again in that order.
    batch1 = _rows((2, None, None, "P"), (2, 5, "y", "c"), (1, 1, None, "d"), (1, 1, "a3", "u"))
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=[batch0], write=target.write_record())
        f.sealed(1, rows=[batch1], write=target.write_record())
    report = replay_wal(f.wal, f.checkpoint, target, policy=RecoveryPolicy.OFFLINE)
    assert report.replayed == [0, 1]
    expected = {(1, 1): "a3", (2, 5): "y"}
    assert _table(cql, keyspace, "changes") == expected
    # Written again, each batch leaves the same table: batch 0's upserts of (1, 2) and (2, 1)
    # are older than their tombstones, and batch 1's are the same cells.
    _write_again(target, f, 0, batch0)
    assert _table(cql, keyspace, "changes") == expected
    _write_again(target, f, 1, batch1)
    assert _table(cql, keyspace, "changes") == expected


def test_a_source_order_writetime_decides_within_a_batch_and_a_tie_goes_to_the_delete(
        cassandra_node, cql, keyspace, tmp_path):
    """After a shuffle the sealed order is not the source's: with ``writetime`` naming a
    column in source order, a delete sealed before its key's older upsert still wins; at
    equal timestamps Cassandra keeps the tombstone."""
    create_table(cql, keyspace, "ordered (k int, c int, v text, PRIMARY KEY (k, c))")
    target = _target(cassandra_node, keyspace, "ordered", writetime_column="ts")
    rows = _rows((1, 1, None, "d"), (1, 1, "old", "c"),     # delete at 200 sealed first
                 (2, 1, "new", "u"), (2, 1, "old", "c"),    # newer upsert sealed first
                 (3, 1, "tie", "u"), (3, 1, None, "d"),     # a tie
                 stamps=[200, 100, 300, 250, 400, 400])
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=[rows], write=target.write_record())
    report = replay_wal(f.wal, f.checkpoint, target, policy=RecoveryPolicy.OFFLINE)
    assert report.replayed == [0]
    assert _table(cql, keyspace, "ordered") == {(2, 1): "new"}
    assert [r.w for r in cql.execute(f"SELECT writetime(v) AS w FROM {keyspace}.ordered")] \
        == [300]


# -- end to end, through Spark ---------------------------------------------------------------
CHANGE_SCHEMA = "k INT, c INT, v STRING, op STRING, lsn LONG"


def _source_files() -> list[list[dict]]:
    """Debezium-style changes, one file a micro-batch, in source order (``lsn`` strictly
    increasing): within a file, keys updated then deleted, deleted then created again, and a
    whole partition deleted before a new row of it."""
    lsn = iter(range(1_000, 10**6, 7))
    change = lambda k, c, v, op: {"k": k, "c": c, "v": v, "op": op, "lsn": next(lsn)}  # noqa: E731
    return [
        [change(k, c, f"v{k}.{c}", "c") for k in range(1, 7) for c in (1, 2)],
        [change(1, 1, "u1", "u"), change(1, 1, None, "d"), change(2, 1, None, "d"),
         change(2, 1, "back", "c"), change(3, None, None, "P"), change(3, 7, "new", "c"),
         change(4, 2, "u1", "u"), change(4, 2, "u2", "u"), change(9, 9, None, "d")],
        [change(5, 1, "r", "r"), change(2, 1, None, "d"), change(6, None, None, "P"),
         change(1, 1, "again", "c")],
    ]


def _applied(files: list[list[dict]]) -> dict[tuple, str]:
    """The source's table: every change applied in source order."""
    table: dict[tuple, str] = {}
    for change in (c for rows in files for c in rows):
        k, c = change["k"], change["c"]
        if change["op"] == "d":
            table.pop((k, c), None)
        elif change["op"] == "P":
            for key in [key for key in table if key[0] == k]:
                del table[key]
        else:
            table[(k, c)] = change["v"]
    return table


@pytest.mark.parametrize("order", ["one-partition", "shuffled-reversed-with-writetime"])
def test_a_change_stream_ends_equal_to_its_source(spark, cassandra_node, cql, keyspace,
                                                  tmp_path, order):
    """``one-partition``: each micro-batch is one task, so its sealed order is the source's.
    ``shuffled-reversed-with-writetime``: every batch delivered in reverse source order and
    spread over 3 partitions at random; ``writetime`` names the source's ``lsn``, which
    decides instead of the sealed order (without it, the table differs from the source)."""
    sinks.register(spark)
    table = f"cdc_{order.replace('-', '_')}"
    create_table(cql, keyspace, f"{table} (k int, c int, v text, PRIMARY KEY (k, c))")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = _source_files()
    reversed_order = order != "one-partition"
    write_json_files(src, [list(reversed(rows)) if reversed_order else rows for rows in files])
    stream = spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    options = sink_options(cassandra_node, keyspace, table, cp)
    options.update({"op.column": "op", "op.partitionDeleteValues": "P"})
    if order == "one-partition":
        stream = stream.drop("lsn").coalesce(1)
    else:
        stream = stream.repartition(3, F.rand(seed=35))
        options["writetime"] = "lsn"
    query = (stream.writeStream.format("cassandra_wal").options(**options)
             .trigger(availableNow=True).start())
    with running(query):
        query.awaitTermination(180)
        assert query.exception() is None
    assert wait_all_flushed(cp, at_least=2) == 2
    assert _table(cql, keyspace, table) == _applied(files)
    # The seal says how each batch is written, so a replay deletes what it deleted.
    seal = read_seal(stream_wal(cp), 1)
    assert seal.write.op_column == "op" and seal.write.partition_delete_values == ("P",)


@pytest.mark.parametrize("writer", ["data-source", "foreachBatch"])
def test_a_change_stream_in_sealed_order_with_a_key_in_two_tasks_is_refused_at_its_commit(
        spark, cassandra_node, cql, keyspace, tmp_path, writer):
    """Shuffled over 3 partitions without a source order: the first batch creates distinct
    keys and lands; the second changes keys in several tasks, and its commit refuses it before
    its seal, naming a key, so nothing of it is written (before the check, it landed out of
    the source's order). A ``foreachBatch`` writer's tasks report their keys too."""
    sinks.register(spark)
    table = f"cdc_split_{writer.replace('-', '_').lower()}"
    create_table(cql, keyspace, f"{table} (k int, c int, v text, PRIMARY KEY (k, c))")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = _source_files()
    write_json_files(src, files[:2])
    stream = (spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1)
              .json(str(src)).drop("lsn").repartition(3, F.rand(seed=35)))
    options = sink_options(cassandra_node, keyspace, table, cp)
    options.update({"op.column": "op", "op.partitionDeleteValues": "P"})
    if writer == "data-source":
        started = stream.writeStream.format("cassandra_wal").options(**options)
    else:
        del options["keyspace"], options["table"], options["checkpointLocation"]
        write = sinks.CassandraWalWriter(keyspace, table, str(cp), options=options)
        started = stream.writeStream.foreachBatch(write).option("checkpointLocation", str(cp))
    query = started.trigger(availableNow=True).start()
    with running(query):
        with pytest.raises(Exception) as info:
            query.awaitTermination(180)
    message = str(info.value)
    assert "batch 1:" in message and "Spark partitions" in message, message
    assert ("has changes in two tasks" in message
            or "is deleted in one task and written in another" in message), message
    wal = stream_wal(cp, f"{keyspace}.{table}" if writer == "foreachBatch" else None)
    assert wait_all_flushed(cp, wal, at_least=0) == 0          # batch 0 committed and written
    assert wal.sealed_batch_ids() in ([0], [])                  # batch 1 never sealed
    assert _table(cql, keyspace, table) == _applied(files[:1])


# -- the completeness marker -------------------------------------------------------------------
MARKER_SCHEMA = "id INT, name STRING, at TIMESTAMP"


def _marker_rows(cql, keyspace: str, table: str = "progress") -> list:
    return list(cql.execute(
        f"SELECT query_id, target_table, batch_id, commit_seen_at, acknowledged_at, rows, "
        f"watermark, writetime(batch_id) AS written_at FROM {keyspace}.{table}"))


def test_the_marker_names_the_last_batch_written_as_the_wal_and_status_do(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """``marker.table`` (created by the sink) holds, for the query and its table, the newest
    batch the WAL says is written, with its rows, when its commit was seen and its last write
    acknowledged, and the watermark Spark ran it with; its write timestamp is the batch's last
    sealed one. ``sinks.status`` gives the same figures."""
    sinks.register(spark)
    create_table(cql, keyspace, "marked (id int PRIMARY KEY, name text, at timestamp)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [[{"id": f * 10 + i, "name": f"r{f}.{i}",
                             "at": f"2026-11-29T10:0{f}:0{i}Z"} for i in range(4)]
                           for f in range(3)])
    stream = (spark.readStream.schema(MARKER_SCHEMA).option("maxFilesPerTrigger", 1)
              .json(str(src)).withWatermark("at", "30 seconds"))
    options = sink_options(cassandra_node, keyspace, "marked", cp)
    options.update({"marker.table": "progress", "marker.create": "true"})
    query = (stream.writeStream.format("cassandra_wal").options(**options)
             .trigger(availableNow=True).start())
    with running(query):
        query.awaitTermination(180)
        assert query.exception() is None
    wal = stream_wal(cp)
    assert wait_all_flushed(cp, wal, at_least=2) == 2
    sinks.wait_flushed(query, 60)
    status = sinks.status(query).last_written
    (row,) = _marker_rows(cql, keyspace)
    assert (row.query_id, row.target_table, row.batch_id, row.rows) == \
        (str(query.id), f"{keyspace}.marked", 2, 4)
    assert (status.batch, status.rows, status.target_table) == (2, 4, f"{keyspace}.marked")
    seal = read_seal(wal, 2)
    assert row.written_at == seal.last_ts_us == status.write_ts_us
    assert _ms(row.acknowledged_at) == status.acknowledged_at_us // 1000
    assert _ms(row.commit_seen_at) == status.commit_seen_at_us // 1000
    assert seal.sealed_at_us // 1000 <= _ms(row.commit_seen_at) <= _ms(row.acknowledged_at)
    # Batch 2 ran with the watermark batch 1 left: its newest event (10:01:03) less 30 s.
    assert _ms(row.watermark) == status.watermark_ms == \
        _ms_of("2026-11-29T10:01:03Z") - 30_000


def test_cassandra_wal_recover_writes_the_marker_of_the_newest_batch_it_wrote(
        cassandra_node, cql, keyspace, tmp_path):
    """``cassandra-wal recover`` of a stream's WAL with ``marker.table`` writes the marker of
    the newest batch it wrote, as the query's flusher does after a drain: a reader of
    Cassandra learns of what the recovery wrote before the query runs again (before, the
    marker stayed behind until then)."""
    create_table(cql, keyspace, "recovered (k int, c int, v text, PRIMARY KEY (k, c))")
    cql.execute(marker_table.create_cql(keyspace, "recovered_progress"))
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "metadata").write_text('{"id":"query-r"}\n')
    target = _target(cassandra_node, keyspace, "recovered")
    target = replace(target, config=replace(target.config, checkpoint_location=str(cp),
                                            wal=WalConfig(marker_table="recovered_progress")))
    with WalFactory(tmp_path / "wal", checkpoint=cp,
                    target={"fingerprint": "f", "target": target.to_dict(),
                            "checkpoint_location": str(cp)}) as f:
        f.sealed(0, rows=[_rows((1, 1, "a", "c"))], write=target.write_record())
        last = f.sealed(1, rows=[_rows((2, 1, "b", "c"), (2, 2, "c", "c"))],
                        write=target.write_record())
        f.sealed(2, rows=[_rows((3, 1, "never", "c"))], committed=False,
                 write=target.write_record())
    assert _marker_rows(cql, keyspace, "recovered_progress") == []
    recover = cassandra_wal("recover", f.wal.root, "--checkpoint", str(cp))
    assert recover.returncode == 0, recover.stdout + recover.stderr
    assert _table(cql, keyspace, "recovered") == {(1, 1): "a", (2, 1): "b", (2, 2): "c"}
    (row,) = _marker_rows(cql, keyspace, "recovered_progress")
    assert (row.query_id, row.target_table, row.batch_id, row.rows) == \
        ("query-r", f"{keyspace}.recovered", 1, 2)
    assert row.written_at == last.seal.last_ts_us


def _ms(value) -> int:
    """A timestamp cell as cassandra-driver reads it (a naive UTC datetime), in ms."""
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


def _ms_of(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_a_marker_table_that_is_missing_is_refused_before_anything_is_staged(
        spark, cassandra_node, cql, keyspace, tmp_path):
    sinks.register(spark)
    create_table(cql, keyspace, "unmarked (id int PRIMARY KEY, name text, at timestamp)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [[{"id": 1, "name": "a", "at": "2026-11-29T10:00:00Z"}]])
    options = sink_options(cassandra_node, keyspace, "unmarked", cp)
    options["marker.table"] = "no_such_progress"
    query = (spark.readStream.schema(MARKER_SCHEMA).json(str(src)).writeStream
             .format("cassandra_wal").options(**options).trigger(availableNow=True).start())
    with running(query):
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
    text = str(info.value)
    assert "marker.table" in text and "no_such_progress" in text and "marker.create=true" in text
    assert not stream_wal(cp).sealed_batch_ids()
