"""scripts/cassandra: start / status / stop behaviours, and the session Cassandra fixture.

The CLI tests use their own node dir and port, so they never touch the session node.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from tests.helpers.node import ServerScript, load_cassandra_node_module

pytestmark = pytest.mark.integration

cn = load_cassandra_node_module()
CASSANDRA = ServerScript("cassandra", "CassandraDaemon", timeout=300)
run_cli = CASSANDRA.run
daemon_pids = CASSANDRA.pids  # CassandraDaemon JVMs whose command line mentions the dir


@pytest.fixture
def node_dir(tmp_path):
    d = tmp_path / "cli-node"
    yield d
    CASSANDRA.stop_purged(d)  # never leave a JVM behind, whatever the test did


def test_status_of_unknown_dir_is_down(node_dir):
    result = run_cli("status", "--dir", node_dir, "--json", timeout=30)
    assert result.returncode == 1, result
    assert json.loads(result.stdout)["state"] == "down"
    assert run_cli("stop", "--dir", node_dir, timeout=30).returncode == 0  # nothing to stop


def test_taken_port_fails_fast_without_launching_java(node_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        t0 = time.monotonic()
        result = run_cli("start", "--port", port, "--dir", node_dir, timeout=60)
        elapsed = time.monotonic() - t0
    assert result.returncode != 0
    assert f"port {port} is in use by another process" in result.stderr
    assert result.stdout == ""
    assert elapsed < 10, elapsed
    assert daemon_pids(node_dir) == []


def test_unknown_version_is_refused_naming_the_supported_ones(node_dir):
    t0 = time.monotonic()
    result = run_cli("start", "--port", cn.free_port(), "--dir", node_dir, "--version", "4.0.1",
                     timeout=60)
    assert result.returncode == 1, result
    assert "Cassandra 4.0.1 is not supported" in result.stderr, result.stderr
    for version in cn.RELEASES:
        assert version in result.stderr, result.stderr
    assert f"{cn.CASSANDRA_VERSION} (default)" in result.stderr
    assert result.stdout == ""
    assert time.monotonic() - t0 < 10
    assert not node_dir.exists()  # refused before anything was created or launched
    assert daemon_pids(node_dir) == []


def test_failed_start_dumps_log_and_leaves_no_process(node_dir):
    # A heap too small for the JVM to boot: the process exits at once.
    result = run_cli("start", "--port", cn.free_port(), "--dir", node_dir, "--heap", "1k",
                     "--timeout", 60)
    assert result.returncode != 0
    assert "exited with code" in result.stderr
    assert "stdout.log" in result.stderr  # the log tail is printed
    assert daemon_pids(node_dir) == []
    assert not (node_dir / "cassandra.pid").exists()


def test_start_status_second_start_stop(node_dir):
    port = cn.free_port()
    address = f"127.0.0.1:{port}"

    result = run_cli("start", "--port", port, "--dir", node_dir, "--fast")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{address}\n"
    pids = daemon_pids(node_dir)
    assert len(pids) == 1, pids
    assert int((node_dir / "cassandra.pid").read_text()) == pids[0]
    # The tests' JVM options (tests/helpers/node.py) reach a node the script starts.
    cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().decode().split("\0")
    assert set(os.environ[cn.ENV_JVM_EXTRA_OPTS].split()) <= set(cmdline), cmdline

    result = run_cli("status", "--dir", node_dir, "--json", timeout=30)
    assert result.returncode == 0, result
    st = json.loads(result.stdout)
    assert (st["state"], st["pid"], st["address"]) == ("up", pids[0], address)
    assert st["release_version"].startswith("5.0")
    assert st["version"] == cn.CASSANDRA_VERSION == "5.0.8"  # the default stays 5.0
    human = run_cli("status", "--dir", node_dir, timeout=30)
    assert human.returncode == 0 and human.stdout.startswith("up:"), human

    # Second start on the same dir: a no-op (same pid, no second JVM), --port not needed.
    t0 = time.monotonic()
    result = run_cli("start", "--dir", node_dir, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{address}\n"
    assert time.monotonic() - t0 < 10
    assert daemon_pids(node_dir) == pids

    result = run_cli("stop", "--dir", node_dir, timeout=60)
    assert result.returncode == 0, result.stderr
    assert daemon_pids(node_dir) == []
    assert not (node_dir / "cassandra.pid").exists()
    assert not cn.port_in_use(port)

    result = run_cli("status", "--dir", node_dir, "--json", timeout=30)
    assert result.returncode == 1
    assert json.loads(result.stdout)["state"] == "down"

    assert run_cli("stop", "--dir", node_dir, "--purge", timeout=60).returncode == 0
    assert not node_dir.exists()


def test_session_node_answers(cql, cassandra_node):
    row = cql.execute("SELECT release_version FROM system.local").one()
    assert row.release_version.startswith("5.0"), row


def test_keyspace_fixture(cql, keyspace):
    cql.execute(f"CREATE TABLE {keyspace}.kv (k int PRIMARY KEY, v text)")
    cql.execute(f"INSERT INTO {keyspace}.kv (k, v) VALUES (1, 'one')")
    assert cql.execute(f"SELECT v FROM {keyspace}.kv WHERE k = 1").one().v == "one"


def test_the_node_reports_the_batch_limits_the_writer_follows(cql):
    """``batch.size.bytes=auto``: the node's own thresholds (default cassandra.yaml here), read
    from system_views.settings rather than assumed."""
    from recovery.cql.batch_limits import BatchLimits, read_batch_limits
    assert read_batch_limits(cql) == BatchLimits(5120, 10, "the node's system_views.settings")
