"""End to end (real Spark, the real node): what users change and operators do between runs
(issue 31). Each test failed on the code before its fix.

* A stream stopped during an outage, restarted with the outage still on: the restart keeps
  staging and everything drains once Cassandra is back (item 0).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sinkutil import (REPO_ROOT, committed_batches, read_table, stream_wal, wait_for,
                      write_json_files)
from tests.helpers.node import java_home_env

pytestmark = pytest.mark.integration

PROGRAM = Path(__file__).with_name("stop_and_exit_program.py")


def _rows(k: int, n: int = 20) -> list[dict]:
    return [{"id": k * 1000 + i, "file": k, "name": f"row {i} of file {k}"} for i in range(n)]


def _program(node, src, cp, keyspace: str, *extra: str) -> list[str]:
    return [sys.executable, str(PROGRAM), "--input", str(src), "--checkpoint", str(cp),
            "--keyspace", keyspace, "--table", "events", "--host", node.host,
            "--port", str(node.port), *extra]


#: No retries inside a flush (the flusher retries every 2 s): an outage costs no waiting.
NO_RETRIES = ("--option", "spark.cassandra.query.retry.count=0")


def _env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT), **java_home_env())


def test_a_stream_stopped_during_an_outage_restarts_and_drains_once_cassandra_is_back(
        cassandra_node, cql, tmp_path):
    """Issue 31, item 0. A keyspace at RF 2 on the one node: every LOCAL_QUORUM write is
    Unavailable, as with replicas down. Run 1, availableNow, commits two batches and ends; its
    flusher is in the Upserter's back-off (the default 10 retries) when the script exits,
    and its next attempt met cassandra-driver's pools shut down by the interpreter's exit
    (RuntimeError: cannot schedule new futures after shutdown), which blocked the WAL: run 2
    failed at its first commit and nothing landed even once the replicas were back. Now
    run 2 keeps staging and drains once the keyspace is writable."""
    keyspace = f"rf2_{int(time.time() * 1000) % 10**9}"
    cql.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 2}")
    try:
        cql.execute(f"CREATE TABLE {keyspace}.events (id int PRIMARY KEY, file int, name text)")
        src, cp = tmp_path / "src", tmp_path / "cp"
        write_json_files(src, [_rows(0), _rows(1)])
        run1 = subprocess.run(_program(cassandra_node, src, cp, keyspace, "--available-now"),
                              capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT),
                              env=_env())
        assert run1.returncode == 0, run1.stdout[-3000:] + run1.stderr[-3000:]
        assert committed_batches(cp) == [0, 1]
        wal = stream_wal(cp)
        assert wal.read_blocked() is None, f"run 1 blocked the WAL: {wal.read_blocked()}"
        assert read_table(cql, keyspace, "events") == []

        write_json_files(src, [_rows(2)], first_index=2)
        run2 = subprocess.Popen(_program(cassandra_node, src, cp, keyspace, "--wait-flushed",
                                         *NO_RETRIES),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=str(REPO_ROOT), env=_env())
        try:
            wait_for(lambda: 2 in committed_batches(cp) or run2.poll() is not None, 240,
                     what="run 2 to commit batch 2 during the outage")
            assert run2.poll() is None, f"run 2 ended: {run2.stdout.read()[-3000:]}"
            assert wal.read_blocked() is None
            cql.execute(f"ALTER KEYSPACE {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
            out, _ = run2.communicate(timeout=240)
        finally:
            if run2.poll() is None:
                run2.kill()
        assert run2.returncode == 0, out[-3000:]
        ids = sorted(r["id"] for r in read_table(cql, keyspace, "events", "id"))
        assert ids == sorted(r["id"] for k in range(3) for r in _rows(k))
        assert wal.read_blocked() is None
    finally:
        cql.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


def _file_stream(spark, node, keyspace: str, table: str, src, cp, **options: str):
    """The data source on the JSON files of ``src``, one a batch, until they are all read."""
    import sinks
    from sinkutil import sink_options

    sinks.register(spark)
    return (spark.readStream.schema("id INT, file INT, name STRING")
            .option("maxFilesPerTrigger", 1).json(str(src))
            .writeStream.format("cassandra_wal")
            .options(**sink_options(node, keyspace, table, cp, **options))
            .trigger(availableNow=True).start())


def test_a_restart_with_another_table_writes_pending_batches_to_their_own_table(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Issue 31, item 1. Run 1 stages three batches for t1 that Cassandra has not received
    (wal.flush=false, as an outage lasting past the restart leaves them); run 2 writes to t2.
    Its flusher took run 2's target for every batch: all of run 1's rows landed in t2. Now a
    batch's seal carries its table (and schema, and cluster): t1 gets run 1's rows."""
    import sinks
    from sinkutil import running, wait_query_done

    for table in ("t1", "t2"):
        cql.execute(f"CREATE TABLE {keyspace}.{table} (id int PRIMARY KEY, file int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(k) for k in range(3)])
    query = _file_stream(spark, cassandra_node, keyspace, "t1", src, cp, **{"wal.flush": "false"})
    with running(query):
        wait_query_done(spark, query)
    assert committed_batches(cp) == [0, 1, 2]
    assert read_table(cql, keyspace, "t1") == []

    write_json_files(src, [_rows(k) for k in (3, 4)], first_index=3)
    query = _file_stream(spark, cassandra_node, keyspace, "t2", src, cp)
    with running(query):
        wait_query_done(spark, query)
        sinks.wait_flushed(query, timeout=120)
    ids = {t: sorted(r["id"] for r in read_table(cql, keyspace, t, "id")) for t in ("t1", "t2")}
    assert ids["t1"] == sorted(r["id"] for k in range(3) for r in _rows(k))
    assert ids["t2"] == sorted(r["id"] for k in (3, 4) for r in _rows(k))


def test_a_column_dropped_while_batches_are_pending_blocks_until_an_operator_chooses(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Issue 31, item 3. Run 1 seals two batches Cassandra has not received (wal.flush=false);
    then the column `note` is dropped and added again (the runbook's old remedy, 'ALTER TABLE
    back') and the UDT gets a field and a field renamed; run 2 writes without `note`. Before:
    run 2 re-read the table, so the pending batches failed for good on the UDT (a SchemaError no
    revert cured), and had they gone through, every `note` written before the drop would have
    stayed hidden, silently. Now the pending batches keep their sealed schema, the flusher
    blocks on batch 0 naming `note` and the two choices, and `cassandra-wal amend` with one of
    them lets every row land."""
    import json

    import sinks
    from sinkutil import cassandra_wal, running, sink_options, stream_wal, wait_query_done

    cql.execute(f"CREATE TYPE {keyspace}.addr (street text, zip text)")
    cql.execute(f"CREATE TABLE {keyspace}.people (id int PRIMARY KEY, file int, name text, "
                f"note text, home frozen<addr>)")
    src, cp = tmp_path / "src", tmp_path / "cp"

    def rows(k):
        return [dict(r, note=f"note {r['id']}", home={"street": f"s{r['id']}", "zip": "75001"})
                for r in _rows(k, 5)]

    def run(schema: str, columns: list[str], **options):
        sinks.register(spark)
        frame = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(src))
                 .select(*columns))
        query = (frame.writeStream.format("cassandra_wal")
                 .options(**sink_options(cassandra_node, keyspace, "people", cp, **options))
                 .trigger(availableNow=True).start())
        with running(query):
            wait_query_done(spark, query)

    full = "id INT, file INT, name STRING, note STRING, home STRUCT<street: STRING, zip: STRING>"
    write_json_files(src, [rows(0), rows(1)])
    run(full, ["id", "file", "name", "note", "home"], **{"wal.flush": "false"})
    assert committed_batches(cp) == [0, 1]
    for ddl in ("ALTER TABLE {ks}.people DROP note", "ALTER TYPE {ks}.addr ADD city text",
                "ALTER TYPE {ks}.addr RENAME zip TO postcode",
                "ALTER TABLE {ks}.people ADD note text"):
        cql.execute(ddl.format(ks=keyspace))
    write_json_files(src, [rows(2)], first_index=2)
    run("id INT, file INT, name STRING, "
        "home STRUCT<street: STRING, postcode: STRING, city: STRING>",
        ["id", "file", "name", "home"])
    wal = stream_wal(cp)
    reason = wait_for(wal.read_blocked, 60, what="the flusher to block on batch 0")
    assert "batch 0 writes note, dropped after the batch was sealed" in reason, reason
    assert "--without-column note" in reason and "--restamp" in reason
    assert read_table(cql, keyspace, "people") == []

    amend = cassandra_wal("amend", wal.root, "--pending", "--without-column", "note", "--json")
    assert amend.returncode == 0, amend.stderr
    assert [a["batch"] for a in json.loads(amend.stdout)["amendments"]] == [0, 1]
    recover = cassandra_wal("recover", wal.root, "--checkpoint", str(cp))
    assert recover.returncode == 0, recover.stderr
    got = {r["id"]: r for r in read_table(cql, keyspace, "people")}
    assert sorted(got) == sorted(r["id"] for k in range(3) for r in _rows(k, 5))
    assert all(r["note"] is None for r in got.values())        # dropped: lost, as chosen
    home = got[1]["home"]                                      # sealed before the UDT changed
    assert (home.street, home.postcode, home.city) == ("s1", "75001", None)
    assert wal.read_blocked() is None


def test_moving_wal_path_follows_the_move_refuses_it_while_the_old_wal_has_rows_to_write(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Issue 31, item 2. Run 1 writes through WAL x; run 2 moves to y, and its flusher, made
    from the pointer at the run's start, never read it again: y's batches waited for the next
    run. A move while y holds committed batches not written is refused; a move back to x
    finds the batches y wrote committed and missing from x (blocked) unless x skips them, and
    starts its timestamps above y's."""
    import sinks
    from sinkutil import error_text, running, sink_options, stream_wal, wait_query_done

    cql.execute(f"CREATE TABLE {keyspace}.events (id int PRIMARY KEY, file int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    x, y = str(tmp_path / "wal-x"), str(tmp_path / "wal-y")

    def ids():
        return sorted(r["id"] for r in read_table(cql, keyspace, "events", "id"))

    def expected(files):
        return sorted(r["id"] for k in files for r in _rows(k))

    def run(wal_path, files, **options):
        write_json_files(src, [_rows(k) for k in files], first_index=files[0])
        query = _file_stream(spark, cassandra_node, keyspace, "events", src, cp,
                             **{"wal.path": wal_path, **options})
        with running(query):
            try:
                query.awaitTermination(180)
            except Exception:  # noqa: BLE001 - a refused run: its error is read below
                pass
        if query.exception() is None and options.get("wal.flush") != "false":
            sinks.wait_flushed(query, timeout=60)
        return query

    run(x, [0, 1])
    # Run 2 moves to y and keeps running: y's batch is written while it runs.
    write_json_files(src, [_rows(2)], first_index=2)
    sinks.register(spark)
    query = (spark.readStream.schema("id INT, file INT, name STRING")
             .option("maxFilesPerTrigger", 1).json(str(src)).writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "events", cp, **{"wal.path": y}))
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        wait_for(lambda: 2 in committed_batches(cp), 120, what="batch 2 committed")
        wait_for(lambda: ids() == expected([0, 1, 2]), 30,
                 what="batch 2 written by the run that moved the WAL")
    run(y, [3], **{"wal.flush": "false"})               # y holds batch 3, not written
    refused = run(x, [4])
    failure = error_text(refused.exception())
    assert "the WAL moved from" in failure and f"wal.path={y}" in failure, failure
    assert committed_batches(cp) == [0, 1, 2, 3]
    run(y, [4])                                          # back to y: it drains 3, writes 4
    assert ids() == expected(range(5))
    last_y = max(r["wt"] for r in read_table(cql, keyspace, "events",
                                             "id, writetime(name) AS wt"))
    run(x, [5])                                          # a move back to x
    assert ids() == expected(range(6))
    stamps = {r["id"]: r["wt"] for r in read_table(cql, keyspace, "events",
                                                    "id, writetime(name) AS wt")}
    assert min(stamps[r["id"]] for r in _rows(5)) > last_y
    wal_x = stream_wal(cp)
    assert wal_x.root == x and wal_x.read_blocked() is None


def _committed_not_written(spark, node, cql, keyspace: str, tmp_path, files: int, rows: int):
    """A stopped stream whose ``files`` batches Spark committed and the sink only staged
    (``wal.flush=false``): its WAL, checkpoint and seals."""
    from sinkutil import running, wait_query_done
    from wal.seal import read_seal

    cql.execute(f"CREATE TABLE {keyspace}.events (id int PRIMARY KEY, file int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(k, rows) for k in range(files)])
    query = _file_stream(spark, node, keyspace, "events", src, cp, **{"wal.flush": "false"})
    with running(query):
        wait_query_done(spark, query)
    assert committed_batches(cp) == list(range(files))
    assert read_table(cql, keyspace, "events") == []
    wal = stream_wal(cp)
    return wal, cp, {b: read_seal(wal, b) for b in range(files)}


def _sealed_write_times(wal, seals) -> dict:
    """Row id -> the write time its seal fixed: row i of a batch (flush order: its segments
    in seal order) at ``base_ts_us + i``. Read before the batches are written: the
    scale-out writers leave no row of them behind."""
    from sinkutil import segment_rows_by_batch

    return {i: seals[b].base_ts_us + pos
            for b, ids in segment_rows_by_batch(wal, seals, ["id"]).items()
            for pos, (i,) in enumerate(ids)}


def _write_times(cql, keyspace: str) -> dict:
    return {r["id"]: r["wt"] for r in read_table(cql, keyspace, "events",
                                                 "id, writetime(name) AS wt")}


def test_recover_through_worker_processes_writes_every_row_at_its_sealed_timestamp(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Issue 34: ``cassandra-wal recover --processes 2`` writes a stopped query's committed
    backlog through two worker processes, a segment at a time, at the timestamps its seals
    fixed (row i of a batch at ``base_ts_us + i``, segments in seal order)."""
    import json

    from sinkutil import cassandra_wal

    wal, cp, seals = _committed_not_written(spark, cassandra_node, cql, keyspace, tmp_path, 3, 30)
    sealed = _sealed_write_times(wal, seals)
    recover = cassandra_wal("recover", wal.root, "--checkpoint", str(cp), "--processes", "2",
                            "--json")
    assert recover.returncode == 0, recover.stderr
    summary = json.loads(recover.stdout)
    assert summary["processes"] == 2 and summary["replayed"] == [0, 1, 2], summary
    assert summary["rows_written"] == 90
    got = _write_times(cql, keyspace)
    assert got == sealed
    assert sorted(got) == sorted(r["id"] for k in range(3) for r in _rows(k, 30))
    assert wal.read_flushed_through() == 2 and wal.staged_batch_ids() == []


def test_sinks_recover_writes_a_stopped_querys_backlog_through_spark_tasks(
        spark, cassandra_node, cql, keyspace, tmp_path, caplog):
    """Issue 34: ``sinks.recover(spark, wal, checkpoint)`` writes what a stopped query
    committed through Spark tasks, one per sealed segment, at the sealed timestamps, and
    leaves what Spark never committed (``force`` discards it)."""
    import logging

    import sinks

    caplog.set_level(logging.INFO, logger="recovery.executors")
    wal, cp, seals = _committed_not_written(spark, cassandra_node, cql, keyspace, tmp_path, 2, 25)
    sealed = _sealed_write_times(wal, seals)
    not_spark = tmp_path / "not-a-checkpoint"        # every batch would look uncommitted
    not_spark.mkdir()
    with pytest.raises(sinks.SinkError, match="not a Spark checkpoint"):
        sinks.recover(spark, wal.root, str(not_spark), force=True)
    assert sorted(wal.sealed_batch_ids()) == [0, 1]   # nothing was discarded
    report = sinks.recover(spark, wal.root, str(cp))
    assert report.replayed == [0, 1] and report.rows_written == 50, report
    by_tasks = [r.getMessage() for r in caplog.records
                if "written by executor tasks" in r.getMessage()]
    assert [line.split(":")[0] for line in by_tasks] == ["batch 0", "batch 1"], by_tasks
    got = _write_times(cql, keyspace)
    assert got == sealed and len(got) == 50
    assert wal.read_flushed_through() == 1
