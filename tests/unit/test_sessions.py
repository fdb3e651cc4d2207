"""A process that writes rows keeps its Cassandra session from one task and batch to the next
(``recovery/sessions.py``, issue 34: a flush task opened a session, with the schema and token
metadata from every node, per task per batch)."""

from __future__ import annotations

import pytest

import recovery.cql.connection
from recovery import sessions
from recovery.config import SinkConfig
from recovery.cql.config import WriteConfig
from recovery.executors import SegmentJob, SegmentTask, write_segments
from recovery.target import Target
from tests.helpers.fake_cassandra import FakeCluster
from tests.helpers.flights import COLUMNS, TABLE, flights_session
from wal.segment import SegmentRef

pytestmark = pytest.mark.unit


def target(**write) -> Target:
    config = SinkConfig(keyspace="ks", table="flights", write=WriteConfig(**write))
    return Target(config, TABLE, tuple(name for name, _ in COLUMNS))


class Connections:
    """``recovery.cql.connection.connect`` counting the clusters it made and which were shut down."""

    def __init__(self, fail: bool = False):
        self.made: list[FakeCluster] = []
        self.shut: list[FakeCluster] = []
        self.fail = fail

    def __call__(self, connection):
        if self.fail:
            raise OSError("connection refused")
        cluster = FakeCluster()
        cluster.shutdown = lambda c=cluster: self.shut.append(c)
        self.made.append(cluster)
        return cluster, flights_session()


@pytest.fixture
def connections(monkeypatch):
    sessions.close_kept()
    made = Connections()
    monkeypatch.setattr(recovery.cql.connection, "connect", made)
    yield made
    sessions.close_kept()


def test_tasks_and_batches_of_one_target_share_one_session(connections):
    for _ in range(3):
        with sessions.kept_upserter(target()) as upserter:
            assert upserter.table == TABLE
    assert len(connections.made) == 1 and connections.shut == []


def test_a_process_keeps_its_newest_targets_and_shuts_the_older_down(connections):
    for ttl in (10, 20, 30):
        with sessions.kept_upserter(target(ttl_seconds=ttl)):
            pass
    assert len(connections.made) == 3
    assert connections.shut == connections.made[:3 - sessions.KEPT]
    with sessions.kept_upserter(target(ttl_seconds=30)):    # still kept
        pass
    assert len(connections.made) == 3


def test_a_session_that_cannot_connect_is_not_kept(monkeypatch):
    sessions.close_kept()
    down = Connections(fail=True)
    monkeypatch.setattr(recovery.cql.connection, "connect", down)
    with pytest.raises(OSError):
        with sessions.kept_upserter(target()):
            pass
    up = Connections()
    monkeypatch.setattr(recovery.cql.connection, "connect", up)
    with sessions.kept_upserter(target()):
        pass
    assert len(up.made) == 1
    sessions.close_kept()


def test_flush_tasks_of_two_batches_in_one_worker_connect_once(connections):
    """Before, each ``mapPartitions`` call (a task) opened a session and shut it down."""
    for batch in (4, 5):
        job = SegmentJob("/nowhere", batch, 0, target(), ())
        # No segment file: each task fails after taking the worker's session.
        results = list(write_segments(job, [SegmentTask(0, _segment(batch), 0, 0)]))
        assert results and results[0].error is not None
    assert len(connections.made) == 1 and connections.shut == []


def _segment(batch: int) -> SegmentRef:
    return SegmentRef(name=f"{batch:020d}/00000-000-x.seg", partition=0, attempt=0, rows=1,
                      chunks=1, bytes=1, crc32=0)
