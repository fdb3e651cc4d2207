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
    # No retries inside a flush (the flusher retries every 2 s): an outage costs no waiting.
    return [sys.executable, str(PROGRAM), "--input", str(src), "--checkpoint", str(cp),
            "--keyspace", keyspace, "--table", "events", "--host", node.host,
            "--port", str(node.port), "--option", "spark.cassandra.query.retry.count=0",
            *extra]


def _env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT), **java_home_env())


def test_a_stream_stopped_during_an_outage_restarts_and_drains_once_cassandra_is_back(
        cassandra_node, cql, tmp_path):
    """Issue 31, item 0. A keyspace at RF 2 on the one node: every LOCAL_QUORUM write is
    Unavailable, as with replicas down. Run 1 commits two batches, stops and exits: its last
    drain at exit met the driver's pools shut down by the interpreter's exit and wrote
    blocked.json, so run 2 failed at its first commit and nothing landed even once the
    replicas were back. Now run 2 keeps staging and drains once the keyspace is writable."""
    keyspace = f"rf2_{int(time.time() * 1000) % 10**9}"
    cql.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 2}")
    try:
        cql.execute(f"CREATE TABLE {keyspace}.events (id int PRIMARY KEY, file int, name text)")
        src, cp = tmp_path / "src", tmp_path / "cp"
        write_json_files(src, [_rows(0), _rows(1)])
        run1 = subprocess.run(_program(cassandra_node, src, cp, keyspace), capture_output=True,
                              text=True, timeout=300, cwd=str(REPO_ROOT), env=_env())
        assert run1.returncode == 0, run1.stdout[-3000:] + run1.stderr[-3000:]
        assert committed_batches(cp) == [0, 1]
        wal = stream_wal(cp)
        assert wal.read_blocked() is None, f"run 1 blocked the WAL: {wal.read_blocked()}"
        assert read_table(cql, keyspace, "events") == []

        write_json_files(src, [_rows(2)], first_index=2)
        run2 = subprocess.Popen(_program(cassandra_node, src, cp, keyspace, "--wait-flushed"),
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
