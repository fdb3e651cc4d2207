"""Spark Connect (scripts/spark-connect): a stream written through a Connect client's session
lands exactly once, its flusher running in the client process (sinks/driver/connect.py).

The module's server is started through the script's command line in a temp dir on a free port
and stopped with --purge at the end. The client runs in a process of its own
(connect_client_program.py), as a user's script would: its listener, flusher and exit are its
own, and a Connect session does not mix with the suite's classic one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sinkutil import (REPO_ROOT, assert_rows_equal, create_table, log_rows_by_batch,
                      read_table, rows_by_key, stream_wal, write_json_files)
from tests.helpers.node import ServerScript, load_script_module

pytestmark = [pytest.mark.integration]

# The test extra installs pyspark[connect]: a missing client is a broken install, not a skip.
import grpc  # noqa: E402,F401

scs = load_script_module("spark_connect_server")
CONNECT = ServerScript("spark-connect", scs.MAIN_CLASS, by_cwd=True, timeout=180)
CLIENT = Path(__file__).with_name("connect_client_program.py")
BATCHES = 3


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    server_dir = (tmp_path_factory.mktemp("spark-connect") / "server").resolve()
    port = scs.free_port()
    with CONNECT.started(server_dir, "--port", port) as result:
        url = result.stdout.strip().splitlines()[-1]
        assert url == f"sc://127.0.0.1:{port}"
        status = CONNECT.run("status", "--dir", server_dir, "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["state"] == "up"
        yield url, server_dir


def _events(k: int) -> list[dict]:
    return [{"id": k * 10 + i, "tag": k, "name": f"e{k}-{i}"} for i in range(5)]


def test_a_stream_through_spark_connect_lands_exactly_once(connect_url, cassandra_node, cql,
                                                           keyspace, tmp_path):
    url, server_dir = connect_url
    create_table(cql, keyspace, "events (id int PRIMARY KEY, tag int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [_events(k) for k in range(BATCHES)]
    write_json_files(src, files)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, str(CLIENT), url, str(src), str(cp), cassandra_node.host,
         str(cassandra_node.port), keyspace, "events", str(BATCHES)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["session"] == "pyspark.sql.connect.session"
    assert seen["registry"] == "ConnectFlushRegistry"
    assert seen["checkpoint"] == str(cp)
    assert seen["flusher_running"] and seen["flushed_while_running"]
    # A location that is not the query's checkpoint is refused, naming the remedy.
    assert "no Spark checkpoint at file:" in seen["wrong_checkpoint"]
    assert "give the query's checkpointLocation" in seen["wrong_checkpoint"]
    # A relative checkpoint fails the query on the server, before anything is staged.
    assert "OptionError: option 'checkpointLocation' = 'relative-cp'" in \
        seen["relative_checkpoint"]
    assert "must be absolute" in seen["relative_checkpoint"]
    # ... which Spark had made under the server's working directory, not the client's.
    assert (server_dir / "relative-cp" / "metadata").is_file()
    assert not (tmp_path / "relative-cp").exists()
    shutil.rmtree(server_dir / "relative-cp")

    # Every row once, with its values; each batch flushed with exactly its file's rows.
    expected = {r["id"]: r for rows in files for r in rows}
    actual = rows_by_key(read_table(cql, keyspace, "events"), "id")
    assert len(actual) == len(expected) == 5 * BATCHES
    assert_rows_equal(actual, expected, "events")
    by_batch = log_rows_by_batch(stream_wal(cp), ["id", "tag"])
    assert sorted(by_batch) == list(range(BATCHES))
    for batch, rows in by_batch.items():
        assert sorted(rows) == sorted((r["id"], r["tag"]) for r in files[batch]), batch


def test_a_connect_restart_with_another_table_writes_pending_batches_to_their_own_table(
        connect_url, cassandra_node, cql, keyspace, tmp_path):
    """Issue 31, item 1, under Spark Connect (no recovery at start: the restarted run's
    flusher finds the pending batches): run 1 stages into t1 and flushes nothing (wal.flush
    false, as an outage lasting past the restart leaves it), run 2, a new client process,
    writes t2 on the same checkpoint. Run 1's rows belong to t1: before seals carried their
    table, they landed in t2. Run 2 flushes with ``wal.flush.mode=executors``: its client runs
    the flush jobs through the Connect session (issue 34; before, the mode fell back to the
    client's own writes)."""
    url, _ = connect_url
    for name in ("t1", "t2"):
        create_table(cql, keyspace, f"{name} (id int PRIMARY KEY, tag int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    first, second = [_events(k) for k in range(2)], [_events(k) for k in range(2, 4)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    for files, table, flush, index in ((first, "t1", "false", 0), (second, "t2", "executors", 2)):
        write_json_files(src, files, first_index=index)
        run = subprocess.run(
            [sys.executable, str(CLIENT), url, "--once", str(src), str(cp),
             cassandra_node.host, str(cassandra_node.port), keyspace, table, flush],
            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
            stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run.stderr[-4000:]
    # Every batch of both runs written by flush tasks on the server's executors.
    by_tasks = sorted(line.split("batch ", 1)[1].split(":")[0] for line in run.stderr.splitlines()
                      if "written by executor tasks" in line)
    assert by_tasks == ["0", "1", "2", "3"], run.stderr[-4000:]
    in_t1 = rows_by_key(read_table(cql, keyspace, "t1"), "id")
    in_t2 = rows_by_key(read_table(cql, keyspace, "t2"), "id")
    assert_rows_equal(in_t1, {r["id"]: r for rows in first for r in rows}, "t1")
    assert_rows_equal(in_t2, {r["id"]: r for rows in second for r in rows}, "t2")
