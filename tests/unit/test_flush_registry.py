"""The flushers of a session's queries (sinks/driver.py: FlushRegistry), one per run.

Spark delivers a restarted run's ``onQueryStarted`` on the query's thread, possibly before the
previous run's ``onQueryTerminated`` arrives from the listener bus: the registry must hand the
WAL over to the new run and ignore the old run's late events.
"""

from __future__ import annotations

import pytest

import sinks.driver as driver

pytestmark = pytest.mark.unit


class FakeFlusher:
    made: list["FakeFlusher"] = []

    def __init__(self, wal_root, checkpoint, session_conf, spark=None):
        self.wal_root, self.checkpoint = wal_root, checkpoint
        self.calls: list[str] = []
        FakeFlusher.made.append(self)

    def recover(self):
        self.calls.append("recover")

    def start(self):
        self.calls.append("start")

    def kick(self):
        self.calls.append("kick")

    def stop(self):
        self.calls.append("stop")


class FakeSpark:
    """``spark.streams.get(id)`` of a query whose checkpoint is ``/cp/<id>``."""

    class _Streams:
        def get(self, query_id):
            root = f"/cp/{query_id}"
            streaming = type("SQ", (), {"resolvedCheckpointRoot": lambda _s: root})()
            jsq = type("JSQ", (), {"streamingQuery": lambda _s: streaming})()
            return type("Q", (), {"_jsq": jsq})()

    streams = _Streams()


@pytest.fixture
def registry(monkeypatch):
    FakeFlusher.made = []
    monkeypatch.setattr(driver, "QueryFlusher", FakeFlusher)
    monkeypatch.setattr(driver, "read_pointer", lambda checkpoint: checkpoint + "/cassandra_wal")
    return driver.FlushRegistry(FakeSpark(), {})


def test_a_run_gets_a_flusher_that_recovers_then_flushes_on_progress(registry):
    registry.started("q", "run-1")
    registry.progressed("q", "run-1")
    (flusher,) = FakeFlusher.made
    assert flusher.calls == ["recover", "start", "kick"]
    assert flusher.wal_root == "/cp/q/cassandra_wal"
    registry.terminated("q", "run-1")
    assert flusher.calls[-1] == "stop" and registry.flushers == {}


def test_a_restart_whose_start_overtakes_the_old_termination_keeps_its_flusher(registry):
    registry.started("q", "run-1")
    old = FakeFlusher.made[0]
    registry.started("q", "run-2")            # the restart, before run-1's termination
    new = FakeFlusher.made[1]
    assert old.calls[-1] == "stop", "the old run's flusher must hand the WAL over first"
    assert new.calls == ["recover", "start"]
    registry.terminated("q", "run-1")         # late, from the listener bus
    registry.progressed("q", "run-1")         # late, too
    assert registry.flushers == {"run-2": new}
    registry.progressed("q", "run-2")
    assert new.calls == ["recover", "start", "kick"]
    assert old.calls.count("stop") == 1


def test_a_run_whose_first_batch_is_not_committed_at_start_gets_its_flusher_later(
        registry, monkeypatch):
    pointers = {}
    monkeypatch.setattr(driver, "read_pointer", lambda checkpoint: pointers.get(checkpoint))
    registry.started("q", "run-1")
    assert FakeFlusher.made == []
    pointers["/cp/q"] = "/wal"                # the first batch wrote the pointer
    registry.progressed("q", "run-1")
    (flusher,) = FakeFlusher.made
    assert flusher.calls == ["start", "kick"]


def test_queries_of_one_session_keep_their_own_flushers(registry):
    registry.started("a", "run-a")
    registry.started("b", "run-b")
    registry.terminated("a", "run-a")
    assert list(registry.flushers) == ["run-b"]
    assert FakeFlusher.made[1].calls == ["recover", "start"]
