"""The flushers of a session's queries (sinks/driver/registry.py: FlushRegistry), one per run.

Spark delivers a restarted run's ``onQueryStarted`` on the query's thread, possibly before the
previous run's ``onQueryTerminated`` arrives from the listener bus: the registry must hand the
WAL over to the new run and ignore the old run's late events.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import sinks.driver.registry as flush_registry
from recovery.config import SinkConfig, WalConfig
from tests.helpers.spark_fakes import FakeFlusher, FakeSpark, pointing

pytestmark = pytest.mark.unit


@pytest.fixture
def registry(monkeypatch):
    FakeFlusher.made = []
    monkeypatch.setattr(flush_registry, "registries", [])     # no exit hook for these fakes
    monkeypatch.setattr(flush_registry, "QueryFlusher", FakeFlusher)
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: checkpoint + "/cassandra_wal"))
    return flush_registry.FlushRegistry(FakeSpark(), {})


def test_a_run_gets_a_flusher_that_recovers_then_flushes_on_progress(registry):
    registry.started("q", "run-1")
    registry.progressed("q", "run-1")
    (flusher,) = FakeFlusher.made
    assert flusher.calls == ["recover", "start", "kick"]
    assert flusher.wal_root == "/cp/q/cassandra_wal"
    registry.terminated("q", "run-1")
    assert registry.flushers == {}
    assert flusher.stopped.wait(5)
    assert flusher.calls[-1] == "stop"


def test_the_metrics_endpoint_starts_once_a_run_names_a_port_even_after_its_start(
        registry, monkeypatch):
    """A restarted query's flusher is made before the run's first batch records its options:
    a port given only now is seen at a later batch (the flusher took the options up)."""
    served = []
    monkeypatch.setattr(flush_registry.metrics_endpoint, "serve", lambda port, _: served.append(port))
    registry.started("q", "run-1")
    (flusher,) = FakeFlusher.made
    registry.progressed("q", "run-1")
    assert served == []                                   # no port: no endpoint
    flusher.target = SimpleNamespace(config=SinkConfig("ks", "t",
                                                       wal=WalConfig(metrics_port=9108)))
    registry.progressed("q", "run-1")
    assert served == [9108]
    assert registry.served() == [flush_registry.ServedQuery("q", "", flusher, running=True)]


def test_the_endpoint_starts_when_the_flusher_takes_up_a_port_before_any_progress(
        registry, monkeypatch):
    """A restarted query whose first batch fails (its WAL blocked) has no progress event:
    the port its options newly name was never served, though its flusher took the options up
    at its first drain (seen under load in test_corruption.py's restart on a damaged WAL)."""
    served = []
    monkeypatch.setattr(flush_registry.metrics_endpoint, "serve", lambda port, _: served.append(port))
    registry.started("q", "run-1")
    (flusher,) = FakeFlusher.made
    flusher.target = SimpleNamespace(config=SinkConfig("ks", "t",
                                                       wal=WalConfig(metrics_port=9108)))
    assert flusher.on_options is not None
    flusher.on_options(flusher)                 # its drain took up the run's options
    assert served == [9108]


def test_a_flusher_tells_when_it_takes_up_the_options_a_restarted_run_recorded(
        tmp_path, monkeypatch):
    """The real flusher's side of the test above: its drain takes up the options the run's
    batch recorded in target.json (here a metrics port) and tells ``on_options``."""
    from dataclasses import replace

    from recovery.flusher import QueryFlusher
    from tests.helpers.flush_fakes import target
    from tests.helpers.outage import driver_side_up
    from tests.helpers.walfactory import WalFactory
    from wal.recovery_policy import RecoveryPolicy

    before = target()
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                    target={"fingerprint": "f", "target": before.to_dict()}) as f:
        f.sealed(0, rows=(3,))
    told = []
    flusher = QueryFlusher(str(tmp_path / "wal"), str(tmp_path / "cp"), retry_interval_s=0.01,
                           on_options=told.append)
    try:
        driver_side_up(monkeypatch, flusher)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert told == []                                  # the same options: nothing to tell
        after = replace(before, config=replace(before.config, wal=replace(
            before.config.wal, metrics_port=9108)))
        flusher.wal.write_target({"fingerprint": "g", "target": after.to_dict(),
                                  "checkpoint_location": None})
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert told == [flusher] and flusher.target.config.wal.metrics_port == 9108
    finally:
        flusher.stop()


def test_the_endpoint_keeps_showing_a_query_that_ended_until_its_next_run(registry, tmp_path,
                                                                           monkeypatch):
    """A query the sink blocked fails at its next commit: its WAL (blocked.json) must stay on
    the endpoint, or `cassandra_wal_blocked == 1` lasts one trigger interval. Before, only
    running flushers were served."""
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: str(tmp_path / "wal")))
    (tmp_path / "wal").mkdir()
    registry.started("q", "run-1")
    (first,) = FakeFlusher.made
    registry.terminated("q", "run-1")
    assert first.stopped.wait(5)
    assert registry.served() == [flush_registry.ServedQuery("q", "", first, running=False)]
    registry.started("q", "run-2")                  # the restart: its own flusher, running
    second = FakeFlusher.made[1]
    assert registry.served() == [flush_registry.ServedQuery("q", "", second, running=True)]
    registry.terminated("q", "run-2")
    assert second.stopped.wait(5)
    (tmp_path / "wal").rmdir()                      # the WAL removed: nothing left to show
    assert registry.served() == []


def test_a_restart_whose_start_overtakes_the_old_termination_keeps_its_flusher(registry):
    registry.started("q", "run-1")
    old = FakeFlusher.made[0]
    registry.started("q", "run-2")            # the restart, before run-1's termination
    new = FakeFlusher.made[1]
    assert old.calls[-1] == "stop", "the old run's flusher must hand the WAL over first"
    assert new.calls == ["recover", "start"]
    registry.terminated("q", "run-1")         # late, from the listener bus
    registry.progressed("q", "run-1")         # late, too
    assert registry.flushers == {"run-2": {"/cp/q/cassandra_wal": new}}
    registry.progressed("q", "run-2")
    assert new.calls == ["recover", "start", "kick"]
    assert old.calls.count("stop") == 1


def test_a_new_query_gets_its_flusher_at_its_first_progress_at_the_latest(
        registry, monkeypatch):
    pointers = {}
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: pointers.get(checkpoint)))
    monkeypatch.setattr(flush_registry, "POINTER_POLL_S", {True: 60.0, False: 60.0})  # no watcher
    registry.started("q", "run-1")
    assert FakeFlusher.made == []
    pointers["/cp/q"] = "/wal"                # the first batch wrote the pointer
    registry.progressed("q", "run-1")
    (flusher,) = FakeFlusher.made
    assert flusher.calls == ["start", "kick"]


def test_a_new_query_gets_its_flusher_as_soon_as_its_first_batch_names_the_wal(
        registry, monkeypatch):
    """Issue 22: the flusher (and its session) was made at the first progress event, after
    Spark committed the first batch, so that batch paid for it. Now it is made once the
    batch's planning writes the pointer, while its tasks stage; progress events then only
    kick it, and a run that ends before its pointer appears gets none."""
    import time as time_

    pointers = {}
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: pointers.get(checkpoint)))
    monkeypatch.setattr(flush_registry, "POINTER_POLL_S", {True: 0.02, False: 0.02})
    registry.started("q", "run-1")
    time_.sleep(0.1)
    assert FakeFlusher.made == []
    pointers["/cp/q"] = "/wal"                # the first batch's planning wrote the pointer
    deadline = time_.monotonic() + 5
    while not FakeFlusher.made and time_.monotonic() < deadline:
        time_.sleep(0.01)
    (flusher,) = FakeFlusher.made             # no progress event yet
    assert flusher.calls[:2] == ["start", "kick"]
    registry.progressed("q", "run-1")
    assert flusher.calls.count("start") == 1 and len(FakeFlusher.made) == 1

    registry.started("p", "run-2")            # another new query, ended before its first batch
    registry.terminated("p", "run-2")
    pointers["/cp/p"] = "/wal-p"
    time_.sleep(0.2)
    assert len(FakeFlusher.made) == 1


def test_a_query_of_another_sink_is_looked_at_only_until_its_first_event(registry, monkeypatch):
    """Its pointer never comes: the looking stops at its first progress (or idle) event, from
    which on each event looks once, as before (on S3 each look is a request)."""
    import time as time_

    looks = []
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: looks.append(1)))
    monkeypatch.setattr(flush_registry, "POINTER_POLL_S", {True: 0.02, False: 0.02})
    registry.started("kafka", "run-k")
    time_.sleep(0.2)
    assert len(looks) >= 3
    registry.progressed("kafka", "run-k")
    time_.sleep(0.1)
    settled = len(looks)
    time_.sleep(0.2)
    assert len(looks) == settled and FakeFlusher.made == []


def test_a_function_writing_two_tables_gets_a_flusher_for_each_wal(registry, monkeypatch):
    """Issue 30, item 2: a foreachBatch function with a writer per table has a WAL per table;
    each gets a flusher, recovered at the run's start, and a table written for the first time
    in a later batch gets its flusher at that batch's progress event. All stop with the run."""
    pointers = {"cassandra_wal_sinks/ks.a.json": "/cp/q/cassandra_wal.ks.a",
                "cassandra_wal_sinks/ks.b.json": "/cp/q/cassandra_wal.ks.b"}
    monkeypatch.setattr(flush_registry, "pointed_wals", lambda checkpoint: list(pointers.values()))
    registry.started("q", "run-1")
    a, b = FakeFlusher.made
    assert (a.wal_root, b.wal_root) == ("/cp/q/cassandra_wal.ks.a", "/cp/q/cassandra_wal.ks.b")
    assert a.calls == b.calls == ["recover", "start"]
    pointers["cassandra_wal_sinks/ks.c.json"] = "/cp/q/cassandra_wal.ks.c"   # batch 5 writes c
    registry.progressed("q", "run-1")
    c = FakeFlusher.made[2]
    assert c.wal_root == "/cp/q/cassandra_wal.ks.c" and c.calls == ["start", "kick"]
    assert a.calls == b.calls == ["recover", "start", "kick"]
    registry.progressed("q", "run-1")
    assert len(FakeFlusher.made) == 3
    assert sorted(registry.flushers_of("run-1"), key=id) == sorted([a, b, c], key=id)
    assert {q.flusher for q in registry.served()} == {a, b, c}
    registry.terminated("q", "run-1")
    assert all(f.stopped.wait(5) for f in (a, b, c))


def test_a_wal_the_run_moved_away_from_gets_its_flusher_stopped(registry, monkeypatch):
    """Issue 31, item 2: the flusher was made from the pointer at the run's start and the
    pointer was not read again within the run: after the run's first batch moved the WAL
    (wal.path changed), the new WAL's batches waited for the next run."""
    where = {"wal": "/old"}
    monkeypatch.setattr(flush_registry, "pointed_wals", lambda checkpoint: [where["wal"]])
    registry.started("q", "run-1")
    (old,) = FakeFlusher.made
    where["wal"] = "/new"                      # the run's first batch moved the WAL
    registry.progressed("q", "run-1")
    new = FakeFlusher.made[1]
    assert new.wal_root == "/new" and new.calls == ["start", "kick"]
    assert old.calls[-1] == "stop" and registry.flushers_of("run-1") == [new]
    assert [q.flusher for q in registry.served()] == [new]


def test_a_restart_stops_every_flusher_of_the_old_run(registry, monkeypatch):
    monkeypatch.setattr(flush_registry, "pointed_wals", lambda checkpoint: [
        checkpoint + "/w1", checkpoint + "/w2"])
    registry.started("q", "run-1")
    old = list(FakeFlusher.made)
    registry.started("q", "run-2")
    assert all(f.calls[-1] == "stop" for f in old)
    assert [f.calls for f in FakeFlusher.made[2:]] == [["recover", "start"]] * 2
    assert {q.flusher for q in registry.served()} == set(FakeFlusher.made[2:])


def test_queries_of_one_session_keep_their_own_flushers(registry):
    registry.started("a", "run-a")
    registry.started("b", "run-b")
    registry.terminated("a", "run-a")
    assert list(registry.flushers) == ["run-b"]
    assert FakeFlusher.made[1].calls == ["recover", "start"]


def test_an_ended_run_finishes_its_drain_on_a_thread_that_exit_waits_for(registry):
    """The listener bus is not held by the last drain, and a script that exits right after
    ``query.stop()`` does not cut it short (the thread is not a daemon)."""
    registry.started("q", "run-1")
    (flusher,) = FakeFlusher.made
    flusher.release.clear()                    # the last drain takes a while
    registry.terminated("q", "run-1")          # returns at once
    assert registry.flushers_of("run-1") == [flusher] and not flusher.stopped.is_set()
    (thread,) = [t for t in threading.enumerate() if t.name.startswith("cassandra-wal-final")]
    assert not thread.daemon
    assert flusher.finish_within == [flush_registry.FINISH_ON_STOP_S]
    flusher.release.set()
    thread.join(5)
    assert flusher.stopped.is_set() and registry.flushers_of("run-1") == []


def test_a_restart_cuts_the_old_runs_last_drain_short_to_take_the_wal(registry):
    registry.started("q", "run-1")
    old = FakeFlusher.made[0]
    old.release.clear()                        # retrying its last drain (Cassandra away)
    registry.terminated("q", "run-1")
    registry.started("q", "run-2")             # waits for the old flusher to let go
    assert "hand_over" in old.calls and old.stopped.wait(5)
    assert FakeFlusher.made[1].calls == ["recover", "start"]


def test_exit_stops_running_flushers_and_waits_for_finishing_ones(registry):
    registry.started("a", "run-a")
    registry.started("b", "run-b")
    a, b = FakeFlusher.made
    b.release.clear()
    registry.terminated("b", "run-b")          # finishing; run-a's end never reported
    threading.Timer(0.3, b.release.set).start()
    registry.finish(5)
    assert a.calls[-1] == "stop" and a.finish_within == [5]
    assert b.stopped.is_set() and registry.flushers == {}


# -- a flusher that cannot start is never silent (issue 17, item 5) -------------------------

def failing_flusher(error):
    def make(wal_root, checkpoint, session_conf, spark_jobs=None, run=None, on_options=None):
        raise error
    return make


def test_a_flusher_that_cannot_start_blocks_the_wal_so_the_next_commit_fails(
        registry, monkeypatch, tmp_path):
    from recovery.cql.errors import SinkError
    from sinks.worker.plan import check_not_blocked
    from wal.layout import WalDir

    wal = WalDir(str(tmp_path / "wal")).create()
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: wal.root))
    monkeypatch.setattr(flush_registry, "QueryFlusher",
                        failing_flusher(SinkError(f"{wal.root} has no target.json")))
    registry.started("q", "run-1")          # the listener swallows nothing silently
    with pytest.raises(SinkError) as info:
        check_not_blocked(wal)
    assert "the flusher cannot start" in str(info.value) and "no target.json" in str(info.value)
    # Once the cause is gone, the next event's flusher starts (and its first drain clears it).
    monkeypatch.setattr(flush_registry, "QueryFlusher", FakeFlusher)
    registry.progressed("q", "run-1")
    assert FakeFlusher.made[-1].calls == ["start", "kick"]


def test_a_flusher_that_cannot_start_yet_is_tried_again_without_blocking(
        registry, monkeypatch, tmp_path):
    from wal.errors import WalLocked
    from wal.layout import WalDir

    wal = WalDir(str(tmp_path / "wal")).create()
    monkeypatch.setattr(flush_registry, "pointed_wals",
                        pointing(lambda checkpoint: wal.root))
    monkeypatch.setattr(flush_registry, "QueryFlusher", failing_flusher(WalLocked(wal.log, "held")))
    registry.started("q", "run-1")
    assert not (tmp_path / "wal" / "blocked.json").exists()
    monkeypatch.setattr(flush_registry, "QueryFlusher", FakeFlusher)
    registry.progressed("q", "run-1")
    assert FakeFlusher.made[-1].calls == ["start", "kick"]


def test_a_new_querys_flusher_is_made_once_its_target_is_recorded_before_any_event(
        registry, monkeypatch):
    """A new query's first batch writes its pointer, then records its target once it has
    looked the table up. The pointer watch made no flusher while the target was missing and
    stopped looking: the flusher came at the first progress event, after Spark's commit, so
    the first batch paid for the session (test_sink_streaming's
    test_a_new_querys_flusher_connects_while_its_first_batch_stages)."""
    import time

    from recovery.target import TargetNotRecorded

    there = {"pointer": False, "target": False}
    monkeypatch.setattr(flush_registry, "pointed_wals", lambda checkpoint: (
        [checkpoint + "/cassandra_wal"] if there["pointer"] else []))
    monkeypatch.setattr(flush_registry, "block_if_lost", lambda *a: False)

    def flusher(*args, **kwargs):
        if not there["target"]:
            raise TargetNotRecorded("no batch recorded its target yet")
        return FakeFlusher(*args, **kwargs)

    monkeypatch.setattr(flush_registry, "QueryFlusher", flusher)
    registry.started("q", "run-1")               # a new query: no pointer yet
    there["pointer"] = True                      # the first batch's planning names the WAL
    time.sleep(0.5)
    assert FakeFlusher.made == []                # its target is not recorded yet
    there["target"] = True                       # the first batch looked the table up
    deadline = time.monotonic() + 5
    while not FakeFlusher.made and time.monotonic() < deadline:
        time.sleep(0.05)
    (made,) = FakeFlusher.made                   # no progress event yet
    assert made.calls[:1] == ["start"] and "kick" in made.calls
    registry.terminated("q", "run-1")
