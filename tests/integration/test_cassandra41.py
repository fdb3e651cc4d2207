"""Cassandra 4.1: the sink against a node of ``scripts/cassandra start --version 4.1.x`` (issue 20).

The rest of the suite runs against the session's 5.0 node; this module starts a 4.1 node of
its own (a free port, a temp dir, stopped with ``--purge`` at the end) and runs a smoke subset
against it: the script's status, one stream and one batch ``df.write`` through the sink, rows
and WRITETIMEs read back. 4.1 runs on this machine's JDK 17 only with the extra
``--add-opens`` of ``cassandra_node.JAMM_03_OPENS``; the node's log is checked for the
module-access errors a missing one causes.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from sinkutil import (assert_rows_equal, committed_batches, create_table, read_table, register,
                      rows_by_key, running, sink_options, stream_wal, wait_all_flushed,
                      wait_query_done, write_json_files)

from tests.helpers.node import ServerScript, create_keyspace, load_cassandra_node_module
from wal.batch_jobs import TableTimestamps
from wal.seal import read_seal

pytestmark = pytest.mark.integration

cn = load_cassandra_node_module()
CASSANDRA = ServerScript("cassandra", "CassandraDaemon", timeout=300)
VERSION = max((v for v in cn.RELEASES if v.startswith("4.1.")),
              key=lambda v: tuple(map(int, v.split("."))))


@pytest.fixture(scope="module")
def node41(tmp_path_factory):
    """A 4.1 node started by the script (``host``, ``port``, ``node_dir``, ``pid``)."""
    node_dir = tmp_path_factory.mktemp("cassandra41") / "node"
    port = cn.free_port()
    with CASSANDRA.started(node_dir, "--port", port, "--version", VERSION, "--fast",
                           "--heap", "512m", "--json") as result:
        started = json.loads(result.stdout)
        assert (started["port"], started["version"]) == (port, VERSION)
        yield SimpleNamespace(host=cn.HOST, port=port, node_dir=node_dir, pid=started["pid"])


@pytest.fixture(scope="module")
def cql41(node41):
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy

    profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(),
                               request_timeout=30)
    cluster = Cluster(contact_points=[node41.host], port=node41.port, protocol_version=5,
                      connect_timeout=15, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


@pytest.fixture
def keyspace41(cql41):
    """A fresh keyspace on the 4.1 node (dropped with the node at the module's end)."""
    return create_keyspace(cql41, "c41")


def assert_no_module_access_errors(node) -> None:
    """Java 17 refused none of 4.1's reflective accesses (see cassandra_node.JAMM_03_OPENS)."""
    log = (node.node_dir / "logs" / "system.log").read_text(errors="replace")
    assert "InaccessibleObjectException" not in log, cn.tail_logs(node.node_dir)


def test_status_shows_the_41_node(node41, cql41):
    result = CASSANDRA.run("status", "--dir", node41.node_dir, "--json", timeout=30)
    assert result.returncode == 0, result
    st = json.loads(result.stdout)
    assert (st["state"], st["pid"], st["port"]) == ("up", node41.pid, node41.port)
    assert (st["version"], st["release_version"]) == (VERSION, VERSION)
    human = CASSANDRA.run("status", "--dir", node41.node_dir, timeout=30)
    assert human.returncode == 0 and f"(Cassandra {VERSION}," in human.stdout, human
    assert cql41.execute("SELECT release_version FROM system.local").one()[0] == VERSION
    assert CASSANDRA.pids(node41.node_dir) == [node41.pid]


def test_a_start_asking_for_another_version_is_refused_and_the_node_keeps_running(node41):
    result = CASSANDRA.run("start", "--dir", node41.node_dir, "--version", cn.CASSANDRA_VERSION,
                           timeout=60)
    assert result.returncode == 1, result
    assert f"already running Cassandra {VERSION}" in result.stderr, result.stderr
    assert result.stdout == ""
    assert CASSANDRA.pids(node41.node_dir) == [node41.pid]
    # Without --version, a start reuses the running node whatever its version.
    result = CASSANDRA.run("start", "--dir", node41.node_dir, timeout=60)
    assert result.returncode == 0 and result.stdout == f"{cn.HOST}:{node41.port}\n", result


def test_stream_through_the_sink_into_41(spark, node41, cql41, keyspace41, tmp_path):
    register(spark)
    create_table(cql41, keyspace41, "events (id int PRIMARY KEY, tag int, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [[{"id": k * 10 + i, "tag": k, "name": f"e{k}-{i}"} for i in range(5)]
             for k in range(2)]
    files[1].append({"id": 0, "tag": 1, "name": "replaced"})  # batch 1 overwrites batch 0's key
    write_json_files(src, files)
    stream = (spark.readStream.schema("id INT, tag INT, name STRING")
              .option("maxFilesPerTrigger", 1).json(str(src)))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(node41, keyspace41, "events", cp))
             .trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert committed_batches(cp) == [0, 1]
    assert wait_all_flushed(cp) == 1

    expected = {r["id"]: dict(r) for rows in files for r in rows}  # the later batch wins
    rows = list(cql41.execute(f"SELECT id, tag, name, WRITETIME(name) AS wt "
                              f"FROM {keyspace41}.events"))
    assert len(rows) == len(expected) == 10
    assert_rows_equal(rows_by_key(read_table(cql41, keyspace41, "events"), "id"), expected,
                      "events on 4.1")
    # Each row carries a timestamp of its batch's seal: row i of batch k is base_ts_us + i.
    seals = {k: read_seal(stream_wal(cp), k) for k in (0, 1)}
    assert seals[1].base_ts_us > seals[0].base_ts_us + seals[0].rows - 1
    for r in rows:
        seal = seals[r.tag]
        assert seal.base_ts_us <= r.wt < seal.base_ts_us + seal.rows, (r, seal)
    assert len({r.wt for r in rows}) == len(rows)
    assert_no_module_access_errors(node41)


def test_batch_write_through_the_sink_into_41(spark, node41, cql41, keyspace41, tmp_path):
    register(spark)
    create_table(cql41, keyspace41, "items (id int PRIMARY KEY, name text, score double, "
                                    "tags frozen<list<text>>)")
    root = tmp_path / "wal"
    rows = [(i, f"n-{i}", i * 1.25, ["x", str(i)]) for i in range(40)]
    (spark.createDataFrame(rows, "id INT, name STRING, score DOUBLE, tags ARRAY<STRING>")
     .repartition(3).write.format("cassandra_wal").mode("append")
     .options(**sink_options(node41, keyspace41, "items", **{"wal.path": str(root)}))
     .save())

    expected = {r[0]: {"id": r[0], "name": r[1], "score": r[2], "tags": r[3]} for r in rows}
    assert_rows_equal(rows_by_key(read_table(cql41, keyspace41, "items"), "id"), expected,
                      "items on 4.1")
    # One job, one sealed batch of 40 rows: 40 consecutive timestamps ending at the table's
    # last timestamp (the last one the job used).
    stamps = sorted(r.wt for r in cql41.execute(
        f"SELECT WRITETIME(name) AS wt FROM {keyspace41}.items"))
    last_ts = TableTimestamps(str(root)).read()
    assert stamps == list(range(last_ts - len(rows) + 1, last_ts + 1))
    assert_no_module_access_errors(node41)
