"""Cassandra goes away in the middle of a stream (real node, real Spark): the WAL absorbs it.

The node here is the module's own (not the session's), stopped and started again on the same
port and data (``tests/helpers/node.py: RestartableNode``):

* an outage of more than 30 s: the query keeps running and committing, ``cassandra-wal
  inspect`` shows the backlog, and once the node is back every batch drains, in batch order,
  with the timestamps of its seal, nothing lost and nothing twice;
* back-pressure at ``wal.maxBytes``: ``block`` holds the commit (the query waits, nothing is
  sealed) until the flusher has drained the backlog; ``fail`` fails the query with
  ``WalFull`` naming the cap, and a restart loses nothing.

Input: one JSON file per micro-batch (``maxFilesPerTrigger=1``), so batch k is file k.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sinkutil import (cassandra_wal, committed_batches, error_text, flushed_through, register, running,
                      sink_options, stream_wal, wait_all_flushed, wait_for, write_json_files)
from tests.helpers.node import RestartableNode
from wal.log import WalLog
from wal.seal import read_seal
from wal.states import BatchState

pytestmark = pytest.mark.integration

SCHEMA = "id INT, file INT, name STRING"
ROWS_PER_FILE = 20
OUTAGE_S = 35.0


@pytest.fixture(scope="module")
def node():
    node = RestartableNode("outage")
    try:
        yield node.start()
    finally:
        node.purge()


@pytest.fixture
def keyspace(node):
    """A keyspace on the node with an empty ``events`` table."""
    with node.keyspace("outage", "events (id int PRIMARY KEY, file int, name text)") as name:
        yield name


def file_rows(k: int) -> list[dict]:
    return [{"id": k * 1000 + i, "file": k, "name": f"row {i} of file {k}"}
            for i in range(ROWS_PER_FILE)]


def start_stream(spark, node, keyspace: str, src: Path, cp: Path, **extra: str):
    register(spark)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    return (stream.writeStream.format("cassandra_wal")
            .options(**sink_options(node, keyspace, "events", cp, **extra))
            .trigger(processingTime="500 milliseconds").start())


def inspect_json(cp: Path) -> dict:
    """``cassandra-wal inspect --json`` beside the running sink (it never takes the lock)."""
    result = cassandra_wal("inspect", stream_wal(cp).root, "--checkpoint", str(cp), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_table_holds(node, keyspace: str, cp: Path, files: int) -> None:
    """Exactly the rows of files 0..files-1, each written with its batch's sealed timestamps
    (row i of batch k: base_ts_us of seal k + i; one file is one task, one segment)."""
    wal = stream_wal(cp)
    with node.session() as cql:   # a fresh session: the node was restarted
        rows = list(cql.execute(f"SELECT id, file, name, WRITETIME(name) AS wt "
                                f"FROM {keyspace}.events"))
    got = {r.id: (r.file, r.name) for r in rows}
    expected = {r["id"]: (r["file"], r["name"]) for k in range(files) for r in file_rows(k)}
    assert got == expected
    for r in rows:
        seal = read_seal(wal, r.file)      # file k is batch k
        assert seal is not None, f"batch {r.file} has no seal"
        assert seal.base_ts_us <= r.wt < seal.base_ts_us + seal.rows, (
            f"row {r.id} of batch {r.file}: WRITETIME {r.wt} is not one of its seal's "
            f"timestamps [{seal.base_ts_us}, {seal.base_ts_us + seal.rows})")


def flushed_records(cp: Path) -> dict[int, int]:
    """Batch -> when the log marked it FLUSHED (microseconds), for every FLUSHED batch."""
    reader = WalLog.open_reader(stream_wal(cp))
    assert reader is not None
    try:
        return {r.batch: r.updated_at_us for r in reader.records()
                if r.state is BatchState.FLUSHED}
    finally:
        reader.close()


def test_a_cassandra_outage_is_absorbed_and_drained_in_order(spark, node, keyspace, tmp_path):
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0), file_rows(1)])
    query = start_stream(spark, node, keyspace, src, cp)
    with running(query):
        wait_all_flushed(cp, at_least=1)

        node.stop()
        down_at = time.monotonic()
        write_json_files(src, [file_rows(k) for k in range(2, 6)], first_index=2)
        # The query goes on: Spark commits every batch while Cassandra is away.
        wait_for(lambda: committed_batches(cp)[-1] >= 5, timeout=120,
                 what="batches 2..5 to be committed during the outage")
        assert query.isActive and query.exception() is None
        assert flushed_through(stream_wal(cp)) == 1, "nothing can be flushed while the node is down"

        report = inspect_json(cp)
        backlog = {b["batch"]: b for b in report["batches"] if b["batch"] >= 2}
        assert sorted(backlog) == [2, 3, 4, 5]
        assert all(b["committed"] is True and b["action"] == "replay" for b in backlog.values())
        assert report["totals"]["rows_pending"] == 4 * ROWS_PER_FILE

        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert query.isActive and query.exception() is None, "the outage failed the query"
        assert not os.path.exists(os.path.join(stream_wal(cp).root, "blocked.json"))
        node.start()

        wait_all_flushed(cp, at_least=5)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=6)
    flushed_at = flushed_records(cp)
    assert sorted(flushed_at) == [0, 1, 2, 3, 4, 5]
    assert [flushed_at[b] for b in range(6)] == sorted(flushed_at[b] for b in range(6)), (
        f"batches were not marked flushed in batch order: {flushed_at}")
    assert inspect_json(cp)["totals"]["rows_pending"] == 0


def test_block_holds_the_commit_while_the_backlog_is_over_the_cap(spark, node, keyspace,
                                                                  tmp_path):
    """``wal.maxBytes=1``: any unflushed earlier batch fills the WAL. With the node down, batch 1
    commits (nothing before it is pending) and batch 2's commit waits, unsealed, until the
    node is back and batch 1 is flushed."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.maxBytes": "1",
                                                            "wal.backpressure": "block"})
    wal = stream_wal(cp)
    with running(query):
        wait_all_flushed(cp, at_least=0)
        node.stop()
        write_json_files(src, [file_rows(1), file_rows(2)], first_index=1)
        wait_for(lambda: committed_batches(cp)[-1] >= 1, timeout=120, what="batch 1's commit")
        wait_for(lambda: 2 in wal.staged_batch_ids(), timeout=120, what="batch 2 to be staged")
        time.sleep(15)       # batch 2's commit is held all this time
        assert committed_batches(cp)[-1] == 1 and read_seal(wal, 2) is None
        assert query.isActive and query.exception() is None
        held = {b["batch"]: b for b in inspect_json(cp)["batches"]}
        assert held[1]["action"] == "replay" and held[2]["state"] == "staged"
        node.start()
        wait_all_flushed(cp, at_least=2)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=3)


def test_fail_stops_the_query_naming_the_cap_and_a_restart_loses_nothing(
        spark, node, keyspace, tmp_path):
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.maxBytes": "1",
                                                            "wal.backpressure": "fail"})
    with running(query):
        wait_all_flushed(cp, at_least=0)
        node.stop()
        write_json_files(src, [file_rows(1), file_rows(2)], first_index=1)
        wait_for(lambda: not query.isActive, what="batch 2's commit to fail the query")
    text = error_text(query.exception())
    assert "WalFull" in text and "wal.maxBytes=1" in text, text
    assert committed_batches(cp)[-1] == 1
    assert read_seal(stream_wal(cp), 2) is None

    node.start()
    query = start_stream(spark, node, keyspace, src, cp)     # default cap
    with running(query):
        wait_all_flushed(cp, at_least=2)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=3)
