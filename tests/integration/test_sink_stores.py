"""End to end on HDFS (issue 19): a stream whose checkpoint, and so its WAL, is on HDFS, against
a real MiniDFSCluster started by ``scripts/hdfs``, real Spark and the real Cassandra node.

The session reaches HDFS as any Spark application does (``hdfs://`` locations); the sink reads
and writes it through WebHDFS, at the address the session's Hadoop configuration gives
(``dfs.namenode.http-address``, set here as a cluster's ``hdfs-site.xml`` would). The driver's
working copy of the WAL is deleted between two runs of the query: the second run ("a driver on
another host") rebuilds it from HDFS and writes no flushed row again. S3 runs in its own
process (its session needs the s3a jars): ``test_sink_s3.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest

import sinks
from sinkutil import (assert_rows_equal, cassandra_wal, create_table, read_table, register,
                      rows_by_key, running, sink_options, wait_for, write_json_files)
from sinks.registry import registries
from tests.helpers.node import ServerScript, load_script_module
from wal.checkpoint import open_checkpoint
from wal.pointer import read_pointer
from wal.remote import working_copy_of
from wal.stores import open_store

pytestmark = pytest.mark.integration

HDFS = ServerScript("hdfs", "MiniDFSClusterManager", timeout=60)
hn = load_script_module("hdfs_node")
START_TIMEOUT = float(os.environ.get("HDFS_WAL_START_TIMEOUT", "180"))
EVENT_SCHEMA = "id INT, tag INT, name STRING"


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("hdfs") / "server"
    port = hn.free_port()
    http_port = hn.free_port(exclude=(port,))
    with HDFS.started(node_dir, "--port", port, "--http-port", http_port,
                      "--timeout", START_TIMEOUT, timeout=START_TIMEOUT + 600):
        yield f"hdfs://127.0.0.1:{port}", f"127.0.0.1:{http_port}"


@pytest.fixture
def on_hdfs(spark, hdfs):
    """The session knows the namenode's HTTP address (as hdfs-site.xml says on a cluster); the
    sink re-registered to take it up; both restored afterwards."""
    uri, http = hdfs
    conf = spark._jsc.hadoopConfiguration()
    before = conf.get("dfs.namenode.http-address")
    conf.set("dfs.namenode.http-address", http)
    register(spark)
    try:
        yield uri, http
    finally:
        if before is None:
            conf.unset("dfs.namenode.http-address")
        else:
            conf.set("dfs.namenode.http-address", before)
        register(spark)


def _events(k: int, n: int = 5) -> list[dict]:
    return [{"id": k * 10 + i, "tag": k, "name": f"e{k}-{i}"} for i in range(n)]


def _run(spark, src, cp, node, keyspace, batches_through: int):
    stream = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(node, keyspace, "events", cp))
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        wait_for(lambda: (open_checkpoint(cp).committed_batches() or [-1])[-1] >= batches_through
                 or None, what=f"batch {batches_through} to be committed on HDFS")
        assert query.exception() is None
        sinks.wait_flushed(query, timeout=120)
    for registry in registries:           # the run's last drain done and its log closed
        flusher = registry.flusher_of(str(query.runId))
        if flusher is not None:
            assert flusher.stopped.wait(60)
    return query


def test_a_stream_checkpointed_on_hdfs_lands_exactly_once_and_survives_a_lost_working_copy(
        spark, on_hdfs, cassandra_node, cql, keyspace, tmp_path):
    create_table(cql, keyspace, "events (id int PRIMARY KEY, tag int, name text)")
    src = tmp_path / "src"
    hdfs_uri, http = on_hdfs
    cp = f"{hdfs_uri}/cp-{uuid.uuid4().hex[:8]}"
    wal_uri = f"{cp}/cassandra_wal"
    files = [_events(k) for k in range(5)]
    write_json_files(src, files[:3])
    try:
        _run(spark, src, cp, cassandra_node, keyspace, batches_through=2)
        got = rows_by_key(read_table(cql, keyspace, "events"), "id")
        assert_rows_equal(got, {r["id"]: r for f in files[:3] for r in f}, "events")
        # Everything the WAL needs is on HDFS: the store, not the driver's disk, is the WAL.
        store = open_store(wal_uri)
        keys = store.list()
        assert "WAL_FORMAT" in keys and "query.json" in keys, keys
        assert any(k.startswith("seals/00000000000000000002/") for k in keys), keys
        assert "flushed/00000000000000000002" in keys, keys
        assert not [k for k in keys if k.startswith("segments/")], keys     # flushed: removed
        assert open_checkpoint(cp).store.read("cassandra_wal_sink.json") is not None
        written = {r["id"]: r["wt"] for r in read_table(cql, keyspace, "events",
                                                          "id, writetime(name) AS wt")}

        # A driver on another host: no working copy, no RocksDB log. (The pointer names the
        # WAL as given, so the flusher's working copy is this one, log and all.)
        assert read_pointer(cp) == wal_uri
        assert os.path.isdir(os.path.join(working_copy_of(wal_uri), "log"))
        shutil.rmtree(working_copy_of(wal_uri))
        write_json_files(src, files[3:], first_index=3)
        _run(spark, src, cp, cassandra_node, keyspace, batches_through=4)
        got = rows_by_key(read_table(cql, keyspace, "events"), "id")
        assert_rows_equal(got, {r["id"]: r for f in files for r in f}, "events")
        again = {r["id"]: r["wt"] for r in read_table(cql, keyspace, "events",
                                                        "id, writetime(name) AS wt")}
        assert {i: again[i] for i in written} == written      # no flushed row written again
        newest_first = min(again[r["id"]] for r in files[3])
        assert newest_first > max(written.values())           # timestamps go on rising

        # The offline tool on the URI, without Spark, reaching HDFS as the environment says.
        env = dict(os.environ, CASSANDRA_WAL_WEBHDFS=f"http://{http}")
        inspect = cassandra_wal("inspect", wal_uri, "--json", env=env)
        assert inspect.returncode == 0, inspect.stderr
        doc = json.loads(inspect.stdout)
        assert doc["wal"]["path"] == wal_uri and doc["wal"]["checkpoint_source"] == "target.json"
        assert [b["action"] for b in doc["batches"]] == ["nothing"] * len(doc["batches"])
        assert max(b["batch"] for b in doc["batches"]) == 4
        verify = cassandra_wal("verify", wal_uri, env=env)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        dry = cassandra_wal("recover", wal_uri, "--dry-run", "--json", env=env)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["plan"] == []
        assert open_store(wal_uri).list("segments") == []     # read, changed nothing
    finally:
        shutil.rmtree(working_copy_of(wal_uri), ignore_errors=True)
