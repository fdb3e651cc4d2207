"""Spark Connect's side of the sink (sinks/driver/connect.py, ConnectFlushRegistry): no JVM, the
checkpoint told by the user and checked, a run's first drain that never discards, and the
locations and credentials the client's flusher could not follow refused on the server."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from recovery.cql.errors import OptionError, SinkError
from sinks.driver import connect, registry
from sinks.worker import connect_source
from tests.helpers.spark_fakes import FakeFlusher
from wal import checkpoint as ckpt

pytestmark = pytest.mark.unit


def _checkpoint(tmp_path, query_id: str):
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return cp


def _query(query_id: str, run_id: str | None = None):
    return SimpleNamespace(id=query_id, runId=run_id or str(uuid.uuid4()), name=None)


def test_a_connect_session_is_told_by_its_class_alone():
    Connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    Classic = type("SparkSession", (), {"__module__": "pyspark.sql.session"})
    assert connect.is_connect_session(Connect())
    assert not connect.is_connect_session(Classic())


def test_filesystems_come_from_the_session_conf():
    assert connect.filesystems_of({}) == ckpt.Filesystems("file:///", None)
    hdfs = connect.filesystems_of({"spark.hadoop.fs.defaultFS": "hdfs://nn:8020",
                                   "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9"})
    assert hdfs.resolve("/cp").uri == "hdfs://nn:8020/cp"
    assert hdfs.access.s3_endpoint == "http://127.0.0.1:9"


@pytest.mark.parametrize("location, relative", [
    ("cp", True), ("./cp", True), ("file:cp", True), ("/data/cp", False),
    ("file:/data/cp", False), ("file:///data/cp", False), ("hdfs://nn/cp", False),
    ("s3a://bucket/cp", False)])
def test_relative_locations(location, relative):
    assert connect_source.is_relative(location) is relative


def test_the_tracked_checkpoint_must_be_the_querys(tmp_path):
    query_id = str(uuid.uuid4())
    cp = _checkpoint(tmp_path, query_id)
    assert connect.tracked_checkpoint(query_id, str(cp), ckpt.LOCAL, wait_s=0) == str(cp)
    assert connect.tracked_checkpoint(query_id, f"file://{cp}", ckpt.LOCAL, wait_s=0) == str(cp)
    with pytest.raises(SinkError, match="is query .*'s: give this query's checkpointLocation"):
        connect.tracked_checkpoint(str(uuid.uuid4()), str(cp), ckpt.LOCAL, wait_s=0)


def test_a_checkpoint_not_seen_here_is_refused_after_waiting(tmp_path):
    sleeps, now = [], [0.0]

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    with pytest.raises(SinkError, match="no Spark checkpoint at file:.* as this process sees"):
        connect.tracked_checkpoint("q", str(tmp_path / "nothing"), ckpt.LOCAL, wait_s=1.0,
                                   sleep=sleep, monotonic=lambda: now[0])
    assert sleeps == [0.2] * 5
    with pytest.raises(OptionError, match="must be absolute"):
        connect.tracked_checkpoint("q", "cp", ckpt.LOCAL, wait_s=0)


@pytest.mark.parametrize("options, option", [
    ({"checkpointlocation": "cp"}, "checkpointLocation"),
    ({"checkpointlocation": "/cp", "wal.path": "wal"}, "wal.path"),
    ({"checkpointlocation": "/cp", "spark.cassandra.auth.password": "s3cret"},
     "spark.cassandra.auth.*")])
def test_the_server_refuses_what_the_client_flusher_cannot_follow(options, option):
    source = connect_source.ConnectCassandraWalDataSource(options)
    with pytest.raises(OptionError) as caught:
        source.streamWriter(None, False)
    assert caught.value.option == option
    assert "Spark Connect" in str(caught.value) and "s3cret" not in str(caught.value)


@pytest.fixture
def connect_registry(monkeypatch):
    monkeypatch.setattr(registry, "QueryFlusher", FakeFlusher)
    monkeypatch.setattr(registry, "pointed_wals", lambda checkpoint: [checkpoint + "/wal"])
    made = registry.ConnectFlushRegistry(object(), {}, ckpt.LOCAL)
    yield made
    registry.registries.remove(made)


def test_track_starts_a_flusher_that_never_discards(connect_registry, tmp_path):
    query = _query(str(uuid.uuid4()))
    cp = _checkpoint(tmp_path, query.id)
    connect_registry.started(query.id, query.runId)        # onQueryStarted: not known yet
    assert connect_registry.flushers_of(query.runId) == []
    assert connect_registry.track(query, str(cp)) == str(cp)
    (flusher,) = connect_registry.flushers_of(query.runId)
    assert flusher.calls == ["start", "kick"]               # no recover(): no discarding
    # wal.flush.mode=executors: DataFrame jobs through the client's session (it has no
    # SparkContext), run by the server's executors (sinks/driver/spark_jobs.py).
    assert flusher.spark_jobs is not None and flusher.spark_jobs.spark is connect_registry.spark
    assert connect_registry.track(query, str(cp)) == str(cp)   # idempotent for a run
    assert flusher.calls == ["start", "kick"]
    assert registry.checkpoint_reported(query.id) == str(cp)   # what wait_flushed reads


def test_a_restart_of_a_tracked_query_is_followed_from_its_start(connect_registry, tmp_path):
    first = _query(str(uuid.uuid4()))
    cp = _checkpoint(tmp_path, first.id)
    connect_registry.track(first, str(cp))
    (old,) = connect_registry.flushers_of(first.runId)
    second = _query(first.id)
    connect_registry.started(second.id, second.runId)
    assert old.calls == ["start", "kick", "stop"]           # lets go of the WAL
    assert [f.calls for f in connect_registry.flushers_of(second.runId)] == [["start", "kick"]]
