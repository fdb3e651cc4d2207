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
import logging
import os
import shutil
import time
import uuid

import pyarrow as pa
import pytest
import test_sink_types as types
from sinkutil import (
    assert_rows_equal,
    cassandra_wal,
    create_table,
    read_table,
    register,
    rows_by_key,
    running,
    sink_options,
    wait_for,
    wait_query_done,
    write_json_files,
    write_parquet_files,
)

import sinks
from sinks.driver.registry import registries
from tests.helpers.node import RestartableNode
from wal.checkpoint import open_checkpoint
from wal.pointer import read_pointer
from wal import format as fmt
from wal.remote import RemoteWal, working_copy_of
from wal.seal import decode_seal
from wal.stores import open_store

pytestmark = pytest.mark.integration

EVENT_SCHEMA = "id INT, tag INT, name STRING"


@pytest.fixture
def on_hdfs(spark, hdfs_server):
    """The session knows the namenode's HTTP address (as hdfs-site.xml says on a cluster); the
    sink re-registered to take it up; both restored afterwards."""
    uri, http = hdfs_server
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


def _run(spark, src, cp, node, keyspace, batches_through: int, **extra: str):
    stream = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(node, keyspace, "events", cp, **extra))
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        wait_for(lambda: (open_checkpoint(cp).committed_batches() or [-1])[-1] >= batches_through
                 or None, what=f"batch {batches_through} to be committed on HDFS")
        assert query.exception() is None
        sinks.wait_flushed(query, timeout=120)
    _wait_flusher_stopped(query)
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

        # Issue 31, item 4: a run of the query live on this host seals batch 5, which Spark is
        # about to commit; recover runs on another host (another working copy, so the lock
        # is not seen). It used to take batch 5 for uncommitted and delete its seal and
        # segment on the store: Spark then committed a batch the WAL no longer had.
        live = _seal_a_batch(wal_uri, 5)
        elsewhere = dict(env, CASSANDRA_WAL_WORKING_DIR=str(tmp_path / "other-host"))
        left = cassandra_wal("recover", wal_uri, env=elsewhere)
        assert left.returncode == 0, left.stderr
        assert "left batch 5" in left.stderr and "--force" in left.stderr
        keys = open_store(wal_uri).list()
        assert f"segments/{live.segments[0].name}" in keys, keys
        assert any(k.startswith("seals/00000000000000000005/") for k in keys), keys
        forced = cassandra_wal("recover", wal_uri, "--force", env=elsewhere)  # query stopped
        assert forced.returncode == 0, forced.stderr
        assert not [k for k in open_store(wal_uri).list() if "00000000000000000005" in k]
    finally:
        shutil.rmtree(working_copy_of(wal_uri), ignore_errors=True)


def test_a_stream_on_hdfs_flushed_from_the_executors_writes_every_row_at_its_sealed_timestamp(
        spark, on_hdfs, cassandra_node, cql, keyspace, tmp_path, caplog):
    # The default wal.flush.mode (auto) with the WAL on a store is executors: each flush task
    # reads its segment from HDFS (recovery/executors.py), not from the driver's working copy.
    caplog.set_level(logging.INFO, logger="recovery.executors")
    create_table(cql, keyspace, "events (id int PRIMARY KEY, tag int, name text)")
    src = tmp_path / "src"
    cp = f"{on_hdfs[0]}/cp-{uuid.uuid4().hex[:8]}"
    files = [_events(k) for k in range(3)]
    write_json_files(src, files)
    _run(spark, src, cp, cassandra_node, keyspace, batches_through=2)
    got = rows_by_key(read_table(cql, keyspace, "events"), "id")
    assert_rows_equal(got, {r["id"]: r for f in files for r in f}, "events")
    by_tasks = [r.getMessage() for r in caplog.records
                if "written by executor tasks" in r.getMessage()]
    assert [line.split(":")[0] for line in by_tasks] == ["batch 0", "batch 1", "batch 2"], by_tasks
    remote = RemoteWal.at(f"{cp}/cassandra_wal")
    seals = [decode_seal(remote.latest_version(f"seals/{fmt.batch_name(b)}"), f"batch {b}")
             for b in range(3)]
    sealed = {seal.base_ts_us + i for seal in seals for i in range(seal.rows)}
    times = [r["wt"] for r in read_table(cql, keyspace, "events", "writetime(name) AS wt")]
    assert sorted(times) == sorted(sealed), (sorted(times), sorted(sealed))


def test_every_type_round_trips_through_a_stream_checkpointed_on_hdfs(
        spark, on_hdfs, cassandra_node, cql, keyspace, tmp_path):
    """The typed acceptance (tests/integration/test_sink_types.py) with the checkpoint and
    the WAL on HDFS: every supported type, nulls included, through segments on the store."""
    hdfs_uri, _ = on_hdfs
    create_table(cql, keyspace, types.TABLE)
    src, cp = tmp_path / "src", f"{hdfs_uri}/cp-{uuid.uuid4().hex[:8]}"
    table = pa.Table.from_pylist([dict(zip(types.COLUMNS, row)) for row in types.INPUT],
                                 schema=types.ARROW_SCHEMA)
    write_parquet_files(src, [table.slice(0, 2), table.slice(2)])
    stream = spark.readStream.schema(types.SPARK_SCHEMA).option("maxFilesPerTrigger", 1) \
        .parquet(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "types", cp, **types.LISTS))
             .trigger(availableNow=True).start())
    try:
        with running(query):
            wait_query_done(spark, query)
        sinks.wait_flushed(query, timeout=120)
        assert open_checkpoint(cp).committed_batches() == [0, 1]
        types.check_table(cql, keyspace)
    finally:
        _wait_flusher_stopped(query)
        shutil.rmtree(working_copy_of(f"{cp}/cassandra_wal"), ignore_errors=True)


def _wait_flusher_stopped(query) -> None:
    for registry in registries:           # the run's last drain done and its log closed
        for flusher in registry.flushers_of(str(query.runId)):
            assert flusher.stopped.wait(60)


# -- an outage of Cassandra with the WAL on HDFS -------------------------------------------------
OUTAGE_S = 20.0
ROWS = 20


@pytest.fixture(scope="module")
def node():
    """A node of this module's own, stopped and started again on the same port and data."""
    node = RestartableNode("store-outage")
    try:
        yield node.start()
    finally:
        node.purge()


def _file_rows(k: int) -> list[dict]:
    return [{"id": k * 1000 + i, "tag": k, "name": f"row {i} of file {k}"} for i in range(ROWS)]


def _flushed_on_store(wal_uri: str) -> int:
    stems = (k.rsplit("/", 1)[-1] for k in open_store(wal_uri).list("flushed"))
    return max((int(s) for s in stems), default=-1)


def test_a_cassandra_outage_is_absorbed_by_a_wal_on_hdfs_and_drained(spark, on_hdfs, node,
                                                                     tmp_path):
    """The backlog grows on HDFS while the node is down (the query keeps committing), the
    offline tool shows it on the URI, and once the node is back every batch lands with its
    sealed timestamps."""
    hdfs_uri, http = on_hdfs
    src, cp = tmp_path / "src", f"{hdfs_uri}/cp-{uuid.uuid4().hex[:8]}"
    wal_uri = f"{cp}/cassandra_wal"
    write_json_files(src, [_file_rows(0), _file_rows(1)])
    with node.keyspace("store_outage", "events (id int PRIMARY KEY, tag int, name text)") as ks:
        stream = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1) \
            .json(str(src))
        query = (stream.writeStream.format("cassandra_wal")
                 .options(**sink_options(node, ks, "events", cp))
                 .trigger(processingTime="500 milliseconds").start())
        try:
            with running(query):
                wait_for(lambda: _flushed_on_store(wal_uri) >= 1 or None,
                         what="batches 0 and 1 flushed")
                node.stop()
                down_at = time.monotonic()
                write_json_files(src, [_file_rows(k) for k in range(2, 6)], first_index=2)
                wait_for(lambda: (open_checkpoint(cp).committed_batches() or [-1])[-1] >= 5
                         or None, timeout=120, what="batches 2..5 committed during the outage")
                assert query.isActive and query.exception() is None
                assert _flushed_on_store(wal_uri) == 1

                env = dict(os.environ, CASSANDRA_WAL_WEBHDFS=f"http://{http}")
                report = cassandra_wal("inspect", wal_uri, "--json", env=env)
                assert report.returncode == 0, report.stderr
                doc = json.loads(report.stdout)
                backlog = {b["batch"]: b for b in doc["batches"] if b["batch"] >= 2}
                assert sorted(backlog) == [2, 3, 4, 5], doc["batches"]
                assert all(b["committed"] is True and b["action"] == "replay"
                           for b in backlog.values()), backlog
                assert doc["totals"]["rows_pending"] == 4 * ROWS

                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
                assert query.isActive and query.exception() is None, "the outage failed it"
                assert open_store(wal_uri).read("blocked.json") is None
                node.start()
                wait_for(lambda: _flushed_on_store(wal_uri) >= 5 or None, timeout=180,
                         what="the backlog drained")
                assert query.exception() is None
            store = open_store(wal_uri)
            seals = {}
            for key in store.list("seals"):
                seal = decode_seal(store.read(key), key)
                seals[seal.batch] = seal
            with node.session() as cql:
                rows = list(cql.execute(f"SELECT id, tag, name, WRITETIME(name) AS wt "
                                        f"FROM {ks}.events"))
            assert {r.id: (r.tag, r.name) for r in rows} == {
                r["id"]: (r["tag"], r["name"]) for k in range(6) for r in _file_rows(k)}
            for r in rows:
                seal = seals[r.tag]
                assert seal.base_ts_us <= r.wt < seal.base_ts_us + seal.rows, (r, seal.batch)
            assert store.list("segments") == []
        finally:
            shutil.rmtree(working_copy_of(wal_uri), ignore_errors=True)


def _seal_a_batch(wal_uri: str, batch: int):
    """What a run's task and commit do for ``batch`` on the store: a segment published from
    the task's spool, then a seal version."""
    import pyarrow as pa

    from wal.layout import WalDir
    from wal.remote import spool_dir
    from wal.seal import seal_batch
    from wal.segment import SegmentWriter

    task_wal = WalDir(spool_dir(wal_uri), spool_for=wal_uri)
    writer = SegmentWriter(task_wal, batch, 0, 0, {"columns": ["id", "file", "name"]})
    writer.append(pa.record_batch({"id": [batch * 1000], "file": [batch], "name": ["live"]}))
    return seal_batch(WalDir.at(wal_uri), batch, [writer.finish()])
