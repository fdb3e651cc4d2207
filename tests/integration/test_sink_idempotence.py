"""Replaying a sealed batch writes the very same cells, and never undoes a newer write.

Every row is written ``USING TIMESTAMP`` fixed in the batch's seal (row i of the batch gets
``base_ts_us + i``), so writing a batch again, after a crash or by hand, leaves every value and
every WRITETIME as it was, while a write made by someone else after the flush (a newer
timestamp) still wins.
"""

from __future__ import annotations

import shutil

import pytest

from recovery.replay import Replayer
from recovery.flusher import load_target
from recovery.output import CassandraOutput
from sinkutil import (create_table, register, running, sink_options, stream_wal,
                      wait_all_flushed, wait_log_released, wait_query_done, write_json_files)
from wal.batch_jobs import TableJobs
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.segment import decode_chunk
from wal.states import BatchState

pytestmark = pytest.mark.integration

TABLE = "cells (id int PRIMARY KEY, name text, score double, flag boolean)"
CELLS = ("name", "score", "flag")


def _snapshot(cql, keyspace) -> dict[int, dict]:
    """Every cell's value and WRITETIME, per row."""
    select = ", ".join([f"{c}, WRITETIME({c}) AS wt_{c}" for c in CELLS])
    return {r.id: {k: v for k, v in r._asdict().items() if k != "id"}
            for r in cql.execute(f"SELECT id, {select} FROM {keyspace}.cells")}


def _sealed_timestamps(wal_log: WalLog, batch: int, columns=("id",)) -> dict[int, int]:
    """id -> the write timestamp its row gets from the seal: base_ts_us + position in batch."""
    record = wal_log.get(batch)
    out = {}
    for chunk in wal_log.chunks(batch):
        ids = decode_chunk(chunk.payload).column("id").to_pylist()
        for j, row_id in enumerate(ids):
            out[row_id] = record.seal.base_ts_us + chunk.first_row + j
    return out


def _other_writer(cql, keyspace, insert_id: int, update_id: int) -> None:
    """Someone else writes after the flush (client timestamps: now, newer than the seal's)."""
    cql.execute(f"INSERT INTO {keyspace}.cells (id, name) VALUES ({insert_id}, 'theirs')")
    cql.execute(f"UPDATE {keyspace}.cells SET score = 42.0 WHERE id = {update_id}")


def test_replaying_a_flushed_stream_batch_changes_nothing(spark, cassandra_node, cql, keyspace,
                                                          tmp_path):
    register(spark)
    create_table(cql, keyspace, TABLE)
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [[{"id": k * 10 + i, "name": f"n{k}-{i}", "score": k + i / 8, "flag": i % 2 == 0}
              for i in range(6)] for k in range(2)]
    write_json_files(src, files)
    stream = (spark.readStream.schema("id INT, name STRING, score DOUBLE, flag BOOLEAN")
              .option("maxFilesPerTrigger", 1).json(str(src)))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "cells", cp))
             .trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp) == 1

    flushed = _snapshot(cql, keyspace)
    assert sorted(flushed) == sorted(r["id"] for f in files for r in f)
    wal = stream_wal(cp)
    wal_log = wait_log_released(wal)        # the query's flusher has let go of the log
    output = CassandraOutput(load_target(wal))
    try:
        # Every cell carries the timestamp its seal fixed.
        for batch in (0, 1):
            assert wal_log.get(batch).state is BatchState.FLUSHED
            for row_id, ts in _sealed_timestamps(wal_log, batch).items():
                assert [flushed[row_id][f"wt_{c}"] for c in CELLS] == [ts] * 3, row_id
        # Batch 1's timestamps are all above batch 0's.
        assert wal_log.get(1).seal.base_ts_us > wal_log.get(0).seal.last_ts_us

        _other_writer(cql, keyspace, insert_id=11, update_id=3)
        before_replay = _snapshot(cql, keyspace)
        assert before_replay[11]["name"] == "theirs" and before_replay[3]["score"] == 42.0
        assert before_replay[11]["wt_name"] > flushed[11]["wt_name"]

        # Replay both sealed batches, chunk by chunk, exactly as the flusher writes them.
        upserter = output.upserter()
        for batch in (0, 1):
            seal = wal_log.get(batch).seal
            for chunk in wal_log.chunks(batch):
                upserter.write_chunk(decode_chunk(chunk.payload), seal.base_ts_us + chunk.first_row,
                                     batch)
    finally:
        output.close()
        wal_log.close()

    after_replay = _snapshot(cql, keyspace)
    assert after_replay == before_replay
    # Only the other writer's two cells differ from the flushed state.
    changed = {(i, c) for i in flushed for c in flushed[i] if flushed[i][c] != after_replay[i][c]}
    assert changed == {(11, "name"), (11, "wt_name"), (3, "score"), (3, "wt_score")}


def test_replayer_on_a_fresh_copy_of_a_sealed_batch_writes_the_same_cells(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Seal a batch job's rows without flushing them, keep a byte copy of the WAL, flush the
    original with the Replayer, then let the Replayer flush the copy too: a second execution
    of the very same sealed batch (as after a crash before it was marked flushed)."""
    register(spark)
    create_table(cql, keyspace, TABLE)
    rows = [(i, f"r{i}", i * 0.5, i % 3 == 0) for i in range(25)]
    table_root = str(tmp_path / "wal")
    (spark.createDataFrame(rows, "id INT, name STRING, score DOUBLE, flag BOOLEAN").repartition(2)
     .write.format("cassandra_wal").mode("append")
     .options(**sink_options(cassandra_node, keyspace, "cells",
                             **{"wal.path": table_root, "wal.flush": "false"}))
     .save())
    assert _snapshot(cql, keyspace) == {}, "wal.flush=false must stage and seal only"
    [job_root] = TableJobs(table_root).other_jobs("")     # the job's own WAL (wal/batch_jobs.py)
    wal = WalDir(job_root)
    [batch] = wal.sealed_batch_ids()
    copy = WalDir(str(tmp_path / "wal-copy"))
    shutil.copytree(wal.root, copy.root)

    def replay(which: WalDir):
        wal_log = WalLog.open_writer(which)
        output = CassandraOutput(load_target(which))
        try:
            report = Replayer(which, wal_log, output.upserter, checkpoint=None).run(
                RecoveryPolicy.QUERY_START)
            return report, wal_log.get(batch), _sealed_timestamps(wal_log, batch)
        finally:
            output.close()
            wal_log.close()

    report, record, stamps = replay(wal)
    assert report.replayed == [batch] and report.rows_written == 25
    assert record.state is BatchState.FLUSHED
    flushed = _snapshot(cql, keyspace)
    assert {i: (v["name"], v["score"], v["flag"]) for i, v in flushed.items()} == \
        {r[0]: r[1:] for r in rows}
    for row_id, ts in stamps.items():
        assert [flushed[row_id][f"wt_{c}"] for c in CELLS] == [ts] * 3, row_id
    assert sorted(stamps.values()) == list(range(record.seal.base_ts_us,
                                                 record.seal.base_ts_us + 25))

    _other_writer(cql, keyspace, insert_id=7, update_id=20)
    before_replay = _snapshot(cql, keyspace)

    report, record_copy, stamps_copy = replay(copy)
    assert report.replayed == [batch] and report.rows_written == 25
    assert record_copy.seal.seal_id == record.seal.seal_id and stamps_copy == stamps
    after_replay = _snapshot(cql, keyspace)
    assert after_replay == before_replay
    assert after_replay[7]["name"] == "theirs" and after_replay[20]["score"] == 42.0

    # The original, already flushed, has nothing left to write.
    report, _, _ = replay(wal)
    assert report.replayed == [] and report.rows_written == 0
