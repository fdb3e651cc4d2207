"""A damaged WAL against a real node and a real stream: detected, named, never written.

A stream stages three committed batches without flushing them (``wal.flush=false``), so the
segment files are the batches' only copy. Then bytes are flipped in batch 1's segment and
batch 2's segment is truncated, as a failing disk or a cut copy would leave them:

* ``cassandra-wal verify`` exits 3 and names both files;
* ``cassandra-wal recover`` writes batch 0, stops at batch 1 (strict order: nothing of batch
  2 either), names the batch and the segment, and exits 3;
* the runbook's way forward (docs/runbook.md, "A corrupted WAL": put back a good copy of
  each file) makes ``verify`` clean and ``recover`` write exactly the rest;
* with no good copy, ``cassandra-wal repair --from 1`` and a restart: Spark runs batch 1 again
  from the source (one batch of files 1..3: the file source hands back every file of the
  batches removed) and every row lands once; the old manual step (remove ``commits/1..`` by
  hand) loses file 1's rows without a word.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import sinks
from sinkutil import (EVENTS_TABLE, cassandra_wal, committed_batches, connection_options,
                      create_table, event_rows, flushed_through, free_port, read_table,
                      register, running, scrape, sink_error_line,
                      start_events_stream, stream_wal, wait_all_flushed, wait_for,
                      write_json_files)
from wal.seal import read_seal

pytestmark = pytest.mark.integration

EXIT_CORRUPT = 3


def file_rows(k: int) -> list[dict]:
    return event_rows(k, 30, stride=100)


def ids_in(cql, keyspace: str) -> set[int]:
    return {r["id"] for r in read_table(cql, keyspace, "events", "id")}


def ids_of(*files: int) -> set[int]:
    return {r["id"] for k in files for r in file_rows(k)}


start_stream = start_events_stream


def stage_three_committed_batches(spark, node, cql, keyspace: str, src: Path, cp: Path):
    """Batches 0..2 committed by Spark and sealed, none flushed; returns the WAL."""
    register(spark)
    create_table(cql, keyspace, EVENTS_TABLE)
    write_json_files(src, [file_rows(k) for k in range(3)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.flush": "false"})
    with running(query):
        wait_for(lambda: committed_batches(cp)[-1] >= 2, what="batches 0..2 to be committed")
    assert ids_in(cql, keyspace) == set(), "wal.flush=false wrote rows"
    return stream_wal(cp)


def flip_a_byte(path: str) -> None:
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def test_flipped_and_truncated_segments_are_named_and_never_written(
        spark, cassandra_node, cql, keyspace, tmp_path):
    src, cp = tmp_path / "src", tmp_path / "cp"
    wal = stage_three_committed_batches(spark, cassandra_node, cql, keyspace, src, cp)

    flipped, truncated = (wal.segment_path(read_seal(wal, b).segments[0].name) for b in (1, 2))
    backup = tmp_path / "backup"
    backup.mkdir()
    for path in (flipped, truncated):
        shutil.copy2(path, backup / Path(path).name)
    flip_a_byte(flipped)
    with open(truncated, "r+b") as f:
        f.truncate(Path(truncated).stat().st_size - 7)

    verify = cassandra_wal("verify", wal.root, "--json")
    assert verify.returncode == EXIT_CORRUPT, verify.stdout + verify.stderr
    report = verify.stdout
    for path in (flipped, truncated):
        assert Path(path).name in report, f"verify does not name {path}:\n{report}"

    connection = connection_options(cassandra_node)
    where = ["--checkpoint", str(cp), "--host", connection["spark.cassandra.connection.host"],
             "--port", connection["spark.cassandra.connection.port"]]
    recover = cassandra_wal("recover", wal.root, *where)
    assert recover.returncode == EXIT_CORRUPT, recover.stdout + recover.stderr
    said = recover.stdout + recover.stderr
    assert "batch 1" in said and Path(flipped).name in said, said
    assert "docs/runbook.md" in said, said
    assert ids_in(cql, keyspace) == ids_of(0), "recovery wrote rows of a damaged or later batch"

    # The runbook: put back a good copy of each damaged file, verify, recover.
    for path in (flipped, truncated):
        shutil.copy2(backup / Path(path).name, path)
    verify = cassandra_wal("verify", wal.root, "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    recover = cassandra_wal("recover", wal.root, *where, "--json")
    assert recover.returncode == 0, recover.stdout + recover.stderr
    summary = json.loads(recover.stdout)
    assert summary["replayed"] == [1, 2], summary
    got = {r["id"]: (r["file"], r["name"]) for r in read_table(cql, keyspace, "events")}
    assert got == {r["id"]: (r["file"], r["name"]) for k in range(3) for r in file_rows(k)}


def test_a_query_restarted_on_a_damaged_wal_fails_naming_the_batch_and_segment(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """The restarted query flushes (the flusher takes up the new options from its first
    batch), writes batch 0, refuses batch 1, and its next commit fails with the reason."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    wal = stage_three_committed_batches(spark, cassandra_node, cql, keyspace, src, cp)
    damaged = wal.segment_path(read_seal(wal, 1).segments[0].name)
    flip_a_byte(damaged)

    write_json_files(src, [file_rows(3)], first_index=3)
    port = free_port()
    query = start_stream(spark, cassandra_node, keyspace, src, cp,      # wal.flush=true
                         **{"wal.metrics.port": str(port)})
    query_id = str(query.id)
    with running(query):
        # Batch 3 commits; its flush writes batch 0 and stops at batch 1: the WAL is blocked.
        wait_for(lambda: os.path.exists(os.path.join(wal.root, "blocked.json")),
                 what="the flusher to refuse batch 1")
        health = sinks.status(query)
        assert health.state == "blocked" and "batch 1" in health.blocked_reason, health
        assert health.flushed_through == 0 and health.pending_batches >= 2, health
        status = cassandra_wal("status", wal.root, "--checkpoint", str(cp))
        assert status.returncode == 2, status.stdout + status.stderr
        assert status.stdout.startswith("blocked: ") and "batch 1" in status.stdout
        metrics = wait_for(lambda: scrape(port, query_id), what="the query on the endpoint")
        assert metrics["cassandra_wal_blocked"] == 1, metrics
        assert metrics["cassandra_wal_query_running"] == 1, metrics
        write_json_files(src, [file_rows(4)], first_index=4)
        wait_for(lambda: not query.isActive, what="batch 4's commit to fail the query")
    line = sink_error_line(query.exception())
    assert "batch 1" in line and Path(damaged).name in line, line
    # The block failed the query; the endpoint still shows it blocked (an alert on it must not
    # depend on catching the one trigger interval before the failure).
    metrics = wait_for(lambda: scrape(port, query_id).get("cassandra_wal_query_running") == 0
                       and scrape(port, query_id), what="the ended query on the endpoint")
    assert metrics["cassandra_wal_blocked"] == 1, metrics
    assert ids_in(cql, keyspace) == ids_of(0), "rows of a damaged or later batch were written"


def old_runbook_step_4(wal, cp: Path, batch: int) -> None:
    """docs/runbook.md, "A corrupted WAL", step 4 before ``cassandra-wal repair``: remove
    ``commits/<batch>`` and later commit files, and the damaged batch's seal and segments."""
    for name in os.listdir(cp / "commits"):
        stem = name.lstrip(".").split(".")[0]
        if stem.isdigit() and int(stem) >= batch:
            os.unlink(cp / "commits" / name)
    os.unlink(wal.seal_path(batch))
    shutil.rmtree(wal.batch_segments(batch))


def batch_1_lost_for_good(spark, node, cql, keyspace: str, src: Path, cp: Path):
    """Batches 0..2 committed, batch 1's segment damaged with no good copy: ``recover`` writes
    batch 0 and blocks at 1 (the log has seen batches up to 2 committed). Returns the WAL."""
    wal = stage_three_committed_batches(spark, node, cql, keyspace, src, cp)
    flip_a_byte(wal.segment_path(read_seal(wal, 1).segments[0].name))
    connection = connection_options(node)
    recover = cassandra_wal("recover", wal.root, "--checkpoint", str(cp),
                            "--host", connection["spark.cassandra.connection.host"],
                            "--port", connection["spark.cassandra.connection.port"])
    assert recover.returncode == EXIT_CORRUPT, recover.stdout + recover.stderr
    assert ids_in(cql, keyspace) == ids_of(0)
    return wal


def restart_until_settled(spark, node, cql, keyspace: str, src: Path, cp: Path, wal) -> int:
    """File 3 added, the query restarted with flushes on, until files 1..3 are in Cassandra or
    batch 3 is flushed; returns the last batch Spark committed, every one flushed."""
    write_json_files(src, [file_rows(3)], first_index=3)
    query = start_stream(spark, node, keyspace, src, cp)
    with running(query):
        def settled() -> bool:
            if ids_in(cql, keyspace) >= ids_of(0, 1, 2, 3):
                return True
            done = committed_batches(cp)        # file 3's batch, if file 1's never comes
            return bool(done) and done[-1] >= 3 and flushed_through(wal) >= 3

        wait_for(settled, what="the rows of files 1..3 (or batch 3) in Cassandra")
        return wait_all_flushed(cp, wal)


def test_a_committed_batch_lost_for_good_is_run_again_from_the_source_after_repair(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """docs/runbook.md, "A corrupted WAL", step 3: ``cassandra-wal repair --from 1``, a new
    input file, a restart. Spark plans batch 1 again from where batch 0 ended, and every row of
    every file is in Cassandra, staged once; nothing is left pending."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    wal = batch_1_lost_for_good(spark, cassandra_node, cql, keyspace, src, cp)
    repaired = cassandra_wal("repair", wal.root, "--checkpoint", str(cp), "--from", "1",
                             "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    report = json.loads(repaired.stdout)
    [wal_plan] = report["plan"]["wals"]
    assert wal_plan["markers"]["m/committed_through"] == [2, 0], report
    assert [b["batch"] for b in wal_plan["batches"]] == [1, 2], report
    assert sorted(os.listdir(cp / "offsets")) == [".0.crc", "0"]
    assert sorted(os.listdir(Path(report["keep"]) / "checkpoint" / "offsets")) == \
        [".1.crc", ".2.crc", "1", "2"]

    last = restart_until_settled(spark, cassandra_node, cql, keyspace, src, cp, wal)
    got = {r["id"]: (r["file"], r["name"]) for r in read_table(cql, keyspace, "events")}
    assert got == {r["id"]: (r["file"], r["name"]) for k in range(4) for r in file_rows(k)}
    # Each row staged once: the batches Spark ran after the repair carry files 1..3, 90 rows.
    rerun = {b: read_seal(wal, b) for b in range(1, last + 1)}
    assert all(rerun.values()) and sum(s.rows for s in rerun.values()) == 3 * 30, rerun
    status = cassandra_wal("status", wal.root, "--checkpoint", str(cp))
    assert status.returncode == 0 and status.stdout.startswith("healthy"), status.stdout
    print(f"after the repair Spark ran batches {sorted(rerun)} with "
          f"{[s.rows for s in rerun.values()]} rows")


def test_the_old_manual_step_loses_the_batch_without_a_word(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Why step 4 became a verb: after removing ``commits/1..`` and batch 1's files by hand,
    Spark re-runs only its newest planned batch (2: it logs that the commit log is not
    trailing the offsets by one and carries on), never batch 1; the sink writes batch 2 from
    its old seal, then file 3, and reports nothing missing. File 1's rows are gone."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    wal = batch_1_lost_for_good(spark, cassandra_node, cql, keyspace, src, cp)
    old_runbook_step_4(wal, cp, 1)
    restart_until_settled(spark, cassandra_node, cql, keyspace, src, cp, wal)
    assert committed_batches(cp) == [0, 2, 3]
    assert ids_in(cql, keyspace) == ids_of(0, 2, 3), "file 1's rows came back"
    status = cassandra_wal("status", wal.root, "--checkpoint", str(cp))
    assert status.returncode == 0 and status.stdout.startswith("healthy"), status.stdout
