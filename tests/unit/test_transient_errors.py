"""Which flush failures block the sink (recovery/errors.py: is_transient) and which only wait.

A failure a retry may cure (Cassandra away, right after connecting too; a shared filesystem
away; a worker's cassandra-driver error that does not pickle) keeps its batch in the WAL and never
writes ``blocked.json``; only a failure no retry cures blocks, and the first drain that gets through
clears the block. The flusher here is the real ``QueryFlusher`` and ``Replayer`` on a real WAL;
Cassandra is a fake session whose ``prepare`` fails while the "outage" lasts.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading

import pytest
from cassandra import OperationTimedOut, Unavailable
from cassandra.cluster import NoHostAvailable

from recovery.errors import (FlushFailed, FlushTaskError, RecoveryBlocked, is_transient,
                             portable_error)
from recovery.executors import ExecutorsWriter
from recovery.flusher import QueryFlusher
from recovery.cql.errors import ConnectionFailed, OptionError
from recovery.processes import ProcessPool
from tests.helpers.flush_fakes import LocalJob
from tests.helpers.outage import FakeUpserter, Outage, driver_side_up, fake_cassandra, flusher_on
from wal.errors import SegmentTruncated, WalCorrupted, WalLocked
from wal.recovery_policy import RecoveryPolicy
from wal.states import BatchState

pytestmark = pytest.mark.unit

BLOCKED = "blocked.json"


def unpicklable_timeout() -> OperationTimedOut:
    """A cassandra-driver error as cassandra-driver raises it: it holds a connection-like object
    (here a lock)."""
    return OperationTimedOut(errors={"127.0.0.1:9042": threading.Lock()}, last_host="127.0.0.1")


# -- the one decision ------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    NoHostAvailable("Unable to complete the operation against any hosts", {}),
    OperationTimedOut(), Unavailable("not enough replicas"),
    FlushFailed(3, "retry budget spent"), ConnectionFailed(["h"], "connection refused"),
    OSError(5, "Input/output error"), ConnectionResetError(), WalLocked("/wal"),
    FlushTaskError("OperationTimedOut", "errors=..., last_host=h", transient=True),
], ids=type)
def test_what_a_retry_may_cure_is_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    FlushFailed(3, "InvalidRequest: unknown column", permanent=True),
    RecoveryBlocked(3, "checksum"), WalCorrupted("/wal/x.seg", "bad crc", batch=3),
    SegmentTruncated("/wal/x.seg", "no footer"), OptionError("wal.flush.mode", "x", "unknown"),
    FlushTaskError("InvalidRequest", "unknown column", transient=False),
    TypeError("a bug"),
], ids=type)
def test_what_no_retry_cures_is_permanent(exc):
    assert not is_transient(exc)


def test_an_unpicklable_cassandra_driver_error_travels_as_a_typed_error_keeping_its_verdict():
    err = portable_error(unpicklable_timeout())
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, FlushTaskError) and back.type_name == "OperationTimedOut"
    assert "last_host=127.0.0.1" in str(back) and is_transient(back)


def test_a_cassandra_driver_error_that_pickles_into_another_text_is_carried_as_text():
    # OperationTimedOut rebuilds its message from its first argument: garbled after pickling.
    err = portable_error(OperationTimedOut(errors="timed out", last_host="h"))
    assert isinstance(err, FlushTaskError) and str(err) == "OperationTimedOut: errors=timed out, last_host=h"
    assert is_transient(err)


def test_errors_that_pickle_unchanged_travel_as_themselves():
    for exc in (OSError(28, "No space left on device"), FlushFailed(1, "x", permanent=True),
                WalCorrupted("/w", "bad", batch=1), ConnectionFailed(["h"], "refused")):
        assert portable_error(exc) is exc


# -- the flusher: a fake Cassandra whose prepare fails during the outage ---------------------------
def blocked(flusher: QueryFlusher) -> bool:
    return os.path.exists(os.path.join(flusher.wal.root, BLOCKED))


def states(flusher: QueryFlusher) -> list:
    return [r.state for r in flusher.wal_log.records()]


@pytest.mark.parametrize("error", [
    NoHostAvailable("Unable to complete the operation against any hosts",
                    {"127.0.0.1:9042": ConnectionRefusedError(111, "refused")}),
    OperationTimedOut(errors="Timed out creating connection (5 seconds)", last_host="127.0.0.1"),
], ids=type)
def test_prepare_failing_right_after_connect_waits_and_the_next_drain_finishes(
        tmp_path, monkeypatch, error):
    with flusher_on(tmp_path) as flusher:
        outage = Outage(error)
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.recover()                              # query start, during the outage
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert not blocked(flusher) and flusher.last_error is error
        assert outage.written == []
        outage.down = False                            # the node is back
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.last_error is None and not blocked(flusher)
        assert states(flusher) == [BatchState.FLUSHED, BatchState.FLUSHED]
        assert sorted(i for _, ids in outage.written for i in ids) == \
            [0, 1, 2, 3, 4, 1000, 1001, 1002, 1003, 1004]


def test_a_block_clears_with_the_first_drain_that_gets_through(tmp_path, monkeypatch):
    with flusher_on(tmp_path) as flusher:
        outage = Outage(FlushFailed(0, "InvalidRequest: Undefined column name x", permanent=True))
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert blocked(flusher)                        # Cassandra refuses: the sink stops
        with open(os.path.join(flusher.wal.root, BLOCKED)) as fh:
            assert "Undefined column name x" in fh.read()
        outage.down = False                            # the operator fixed the table
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert not blocked(flusher) and flusher.last_error is None
        assert states(flusher) == [BatchState.FLUSHED, BatchState.FLUSHED]


def test_a_transient_failure_after_a_block_keeps_it_until_a_drain_gets_through(
        tmp_path, monkeypatch):
    """Whether the refusal is cured is only known once the batch is written."""
    with flusher_on(tmp_path) as flusher:
        outage = Outage(FlushFailed(0, "InvalidRequest", permanent=True))
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        outage.error = OSError(5, "Input/output error")
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert blocked(flusher)
        outage.down = False
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert not blocked(flusher)


# -- flush tasks and worker processes return their errors -------------------------------------------
class FailingOpener:
    """The tasks' ``open_upserter``: fails with ``error`` while ``down`` (pickled with the job)."""

    down = True
    error: Exception = OSError(116, "Stale file handle")

    def __call__(self, target_):
        if FailingOpener.down:
            raise FailingOpener.error
        return contextlib.nullcontext(RecordingWrites())


class RecordingWrites:
    def write_chunks(self, chunks, batch_id, **_):
        for _rb, _ts, tag in chunks:
            yield tag


@pytest.mark.parametrize("error", [OSError(116, "Stale file handle"), unpicklable_timeout()],
                         ids=["OSError", "unpicklable OperationTimedOut"])
def test_a_task_returning_a_transient_error_does_not_block(tmp_path, error, monkeypatch):
    FailingOpener.down, FailingOpener.error = True, error
    with flusher_on(tmp_path, mode="executors") as flusher:
        driver_side_up(monkeypatch, flusher)
        job = LocalJob()
        writer = ExecutorsWriter(job, flusher.wal.root, flusher.output.current_target,
                                 open_upserter=FailingOpener())
        flusher._executors = lambda: writer
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert not blocked(flusher) and is_transient(flusher.last_error)
        assert type(flusher.last_error) in (OSError, FlushTaskError)
        FailingOpener.down = False
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.last_error is None and not blocked(flusher)
        assert states(flusher) == [BatchState.FLUSHED, BatchState.FLUSHED]


def test_a_task_returning_a_refusal_blocks(tmp_path, monkeypatch):
    FailingOpener.down = True
    FailingOpener.error = FlushFailed(0, "InvalidRequest: no such table", permanent=True)
    with flusher_on(tmp_path, mode="executors") as flusher:
        driver_side_up(monkeypatch, flusher)
        writer = ExecutorsWriter(LocalJob(), flusher.wal.root, flusher.output.current_target,
                                 open_upserter=FailingOpener())
        flusher._executors = lambda: writer
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert blocked(flusher)


def where_alive(tasks):
    return list(tasks)


def raise_in_worker(kind, tasks):
    """Run in a flush worker process: fail the whole call, not a task."""
    if kind == "oserror":
        raise OSError(28, "No space left on device")
    raise OperationTimedOut(errors={"h": threading.Lock()}, last_host="h")


@pytest.mark.parametrize("kind", ["oserror", "unpicklable"])
def test_an_error_a_worker_process_raises_comes_back_typed_and_the_worker_lives(kind):
    from functools import partial

    pool = ProcessPool(1)
    try:
        with pytest.raises(Exception) as info:
            pool(0, [1], partial(raise_in_worker, kind))
        assert not isinstance(info.value, FlushFailed), "taken for a dead worker"
        assert is_transient(info.value)
        assert (type(info.value), str(info.value).split(":")[0]) in (
            (OSError, "[Errno 28] No space left on device"),
            (FlushTaskError, "OperationTimedOut"))
        pids = pool.pids
        assert pool(0, [2], where_alive) == [2]
        assert pool.pids == pids
    finally:
        pool.close()


def test_a_worker_process_returning_an_oserror_from_its_task_does_not_block(tmp_path,
                                                                            monkeypatch):
    """``wal.flush.mode=processes``: the task's error crosses the pipe as itself (the worker
    imports this module afresh: ``FailingOpener`` fails there with its class defaults)."""
    FailingOpener.down, FailingOpener.error = True, OSError(116, "Stale file handle")
    with flusher_on(tmp_path, mode="processes") as flusher:
        driver_side_up(monkeypatch, flusher)
        pool = ProcessPool(1)
        writer = ExecutorsWriter(pool, flusher.wal.root, flusher.output.current_target,
                                 open_upserter=FailingOpener())
        flusher._executors = lambda: writer
        try:
            flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        finally:
            pool.close()
        assert not blocked(flusher) and isinstance(flusher.last_error, OSError)
        assert flusher.last_error.errno == 116


class FullDisk:
    """The log's RocksDB while its disk is full: every write fails as rocksdict reports it
    (a plain Exception carrying RocksDB's "IO error" text); reads go through."""

    def __init__(self, db):
        self._db = db

    def __getattr__(self, name):
        return getattr(self._db, name)

    def write(self, *args, **kwargs):
        raise Exception("IO error: No space left on device: While appending to file: "
                        "log/000004.log")


def test_a_full_disk_under_the_log_waits_and_the_log_is_reopened_once_it_has_room(
        tmp_path, monkeypatch):
    from wal.errors import WalStorageError

    with flusher_on(tmp_path) as flusher:
        outage = Outage(OSError(111, "refused"))
        outage.down = False
        fake_cassandra(monkeypatch, flusher, outage)
        full = FullDisk(flusher.wal_log._db)
        flusher.wal_log._db = full
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert isinstance(flusher.last_error, WalStorageError) and not blocked(flusher)
        # The operator frees the disk; RocksDB would still refuse writes until reopened:
        # the next drain reopens the log (dropping the failing handle) and finishes.
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.wal_log._db is not full
        assert flusher.last_error is None and not blocked(flusher)
        assert states(flusher) == [BatchState.FLUSHED, BatchState.FLUSHED]


def test_a_recover_that_gets_through_clears_the_block(tmp_path, monkeypatch, capsys):
    # The runbook's way out of a block: fix the cause, run `cassandra-wal recover`; the
    # query's next commit must then go on (it failed on blocked.json before).
    import recovery.recover as recover
    from recovery.cli.main import main

    class Output:
        def __init__(self, target, wal_root=None):
            pass

        def upserter(self, seal=None):
            return FakeUpserter(type("S", (), {"prepare": lambda s, q: None,
                                               "outage": Outage(None)})(), None, None, None)

        def check_not_dropped(self, seal, wal_location, rows=None):
            pass

        def close(self):
            pass

    with flusher_on(tmp_path) as flusher:
        wal = flusher.wal
    wal.write_blocked("FlushFailed: Cassandra refused the rows")
    monkeypatch.setattr(recover, "CassandraOutput", Output)
    assert main(["recover", wal.root, "--checkpoint", str(tmp_path / "cp")]) == 0, \
        capsys.readouterr().err
    assert wal.read_blocked() is None


# -- issue 31, items 0 and 7: errors a retry cures never block; the flusher never dies -------------
def test_a_thread_pool_shut_down_by_the_interpreters_exit_is_no_verdict():
    """Issue 31, item 0: a stream stopped during an outage, its script exiting: the last
    drain at exit met cassandra-driver's pool refusing work and wrote blocked.json; the restart
    then failed at its first commit, even once Cassandra was back."""
    from recovery.errors import is_shutdown_error

    exc = RuntimeError("cannot schedule new futures after interpreter shutdown")
    assert is_shutdown_error(exc) and is_transient(exc)
    assert not is_shutdown_error(RuntimeError("something else")) and \
        not is_transient(RuntimeError("something else"))


def test_nothing_met_in_the_drain_at_interpreter_exit_blocks_the_wal(tmp_path, monkeypatch):
    with flusher_on(tmp_path) as flusher:
        outage = Outage(RuntimeError("cannot schedule new futures after shutdown"))
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert not blocked(flusher) and flusher.failing.startswith("RuntimeError")
        outage.error = TypeError("whatever the exit breaks")       # no family of ours
        flusher.stop(finish_within_s=0.05, exiting=True)
        assert not blocked(flusher)


@pytest.mark.parametrize("answer", ["server error", "unconfigured table", "no table"])
def test_a_server_error_or_a_table_a_node_does_not_know_yet_is_transient(answer):
    """Issue 31, item 7: a ServerError (a node's own failure) and 'unconfigured table' during a
    schema disagreement were taken for Cassandra refusing the rows, and blocked the sink."""
    from cassandra import InvalidRequest
    from cassandra.protocol import ServerError

    from recovery.cql.errors import is_transient_answer

    error = {"server error": ServerError(0x0000, "java.lang.RuntimeException: oops", {}),
             "unconfigured table": InvalidRequest("unconfigured table events"),
             "no table": InvalidRequest("table ks.events does not exist")}[answer]
    assert is_transient_answer(error) and is_transient(error)
    assert not is_transient_answer(InvalidRequest("Undefined column name nope"))


def test_a_reopen_that_fails_leaves_the_log_closed_and_the_next_drain_opens_it(
        tmp_path, monkeypatch):
    """Issue 31, item 7: after a RocksDB I/O error WalLog.reopen closed the log and, if it
    could not open it again, left it closed: every later drain died of an AttributeError."""
    from wal.errors import WalStorageError
    from wal.log import WalLog

    with flusher_on(tmp_path) as flusher:
        outage = Outage(OSError(111, "refused"))
        outage.down = False
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.wal_log._db = FullDisk(flusher.wal_log._db)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert isinstance(flusher.last_error, WalStorageError)
        real = WalLog.open_writer

        def still_full(wal):
            raise Exception("IO error: No space left on device: While opening a file")

        monkeypatch.setattr(WalLog, "open_writer", classmethod(lambda cls, wal: still_full(wal)))
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.wal_log.closed and isinstance(flusher.last_error, WalStorageError)
        assert flusher._next_commit_to_watch() is None       # the loop's look survives it
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)                    # again: no AttributeError
        assert isinstance(flusher.last_error, WalStorageError) and not blocked(flusher)
        monkeypatch.setattr(WalLog, "open_writer", real)      # the disk has room again
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.last_error is None and flusher.failing is None
        assert states(flusher) == [BatchState.FLUSHED, BatchState.FLUSHED]


def test_a_block_that_cannot_be_written_to_disk_is_still_said_and_retried(tmp_path, monkeypatch,
                                                                          caplog):
    """Issue 31, item 7: writing blocked.json on a full or read-only disk raised out of the
    drain and ended the flusher's thread with nothing said."""
    from wal.layout import WalDir

    with flusher_on(tmp_path) as flusher:
        outage = Outage(OptionError("spark.cassandra.auth.username", "x", "refused"))
        fake_cassandra(monkeypatch, flusher, outage)
        real = WalDir.write_blocked

        def read_only(self, reason):
            if reason is not None:
                raise OSError(30, "Read-only file system")
            return real(self, reason)

        monkeypatch.setattr(WalDir, "write_blocked", read_only)
        flusher.start()
        flusher.kick()
        deadline = __import__("time").monotonic() + 10
        while flusher.drains < 2 and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.01)
        assert flusher._thread.is_alive(), "the flusher's thread died"
        health = flusher.health()
        assert health.state == "blocked" and "refused" in health.blocked_reason
        assert "blocked.json could not be written" in caplog.text
        monkeypatch.setattr(WalDir, "write_blocked", real)   # the disk is writable again
        while not blocked(flusher) and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.01)
        assert blocked(flusher)


def test_drains_that_fail_are_a_state_said_once_and_left_once(tmp_path, monkeypatch, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="cassandra_wal")
    with flusher_on(tmp_path) as flusher:
        outage = Outage(OSError(28, "No space left on device"))
        fake_cassandra(monkeypatch, flusher, outage)
        for _ in range(3):
            flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.health().failing == "OSError: [Errno 28] No space left on device"
        assert caplog.text.count("flush failing") == 1
        outage.down = False
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.health().failing is None
        assert caplog.text.count("flush going again") == 1


def test_the_flushers_loop_outlives_a_bug_in_a_drain(tmp_path, monkeypatch, caplog):
    import time

    with flusher_on(tmp_path) as flusher:
        calls = []

        def broken(policy, **_):
            calls.append(1)
            raise AttributeError("a bug")

        monkeypatch.setattr(flusher, "drain", broken)
        flusher.start()
        for _ in range(2):
            flusher.kick()
            time.sleep(0.2)
        assert len(calls) >= 2 and flusher._thread.is_alive()
        assert "the flusher's loop failed" in caplog.text
        monkeypatch.undo()


def test_a_request_cassandra_drivers_shut_pool_refused_is_retried_not_refused():
    """What the end-to-end test met: the flusher was in the Upserter's back-off when the script
    exited; the next attempt's answer was the RuntimeError of cassandra-driver's shut pool, taken
    for Cassandra refusing the rows (a permanent FlushFailed, then blocked.json)."""
    from recovery.cql.upsert import Upserter, _Transient

    from recovery.errors import is_shutdown_error

    shut = RuntimeError("cannot schedule new futures after interpreter shutdown")
    with pytest.raises(FlushFailed) as info:      # at once: no retry can succeed now
        Upserter._check([("stmt", None)], iter([(False, shut)]), batch_id=4)
    assert not info.value.permanent and is_transient(info.value)
    assert is_shutdown_error(info.value)
    with pytest.raises(_Transient):
        Upserter._check([("stmt", None)], iter([(False, Unavailable("2 of 1"))]), batch_id=4)


def test_recovery_at_query_start_retries_a_request_twice_at_most(tmp_path, monkeypatch):
    """Recovery at query start runs before the query's first batch: during an outage the
    Upserter's whole retry budget (10 retries by default, some 50 s of back-off) held the
    restarted query that long. It gives up sooner now; the running flusher retries."""
    from recovery.flusher import RECOVERY_RETRIES

    with flusher_on(tmp_path) as flusher:
        made = []
        names = type(flusher.output).upserter.__globals__
        session = type("S", (), {"execute": lambda self, cql, parameters=None: []})()
        monkeypatch.setattr("recovery.cql.connection.connect", lambda conn: (
            type("C", (), {"shutdown": lambda self: None})(), session))

        def upserter(session, table, columns, write, consistency_level=None, **_):
            made.append(write.retry_count)
            raise Unavailable("not enough replicas")

        monkeypatch.setitem(names, "Upserter", upserter)
        flusher.recover()
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert made == [RECOVERY_RETRIES, flusher.target.config.write.retry_count]
        assert RECOVERY_RETRIES < flusher.target.config.write.retry_count


def test_a_flusher_that_cannot_open_its_log_on_a_full_disk_does_not_block_the_wal(
        tmp_path, monkeypatch):
    """Issue 31, item 7, found by the simulation (tests/sim/README.md, "Disk full", seed 19):
    a run starting on a full or read-only disk could not open the RocksDB log; rocksdict's
    plain "IO error" Exception was not transient, so the registry wrote blocked.json ("the
    flusher cannot start") and the query's next commit failed, though room on the disk cures
    it. It is a WalStorageError now: the registry tries again at the next event."""
    import sinks.driver.registry as flush_registry
    import wal.log
    from tests.helpers.flush_fakes import target
    from tests.helpers.spark_fakes import FakeSpark
    from tests.helpers.walfactory import WalFactory
    from wal.errors import WalStorageError
    from wal.layout import WalDir
    from wal.log import WalLog

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                    target={"fingerprint": "f", "target": target().to_dict()}) as f:
        f.sealed(0, rows=(3, 2))

    def full(path, *args, **kwargs):
        raise Exception(f"IO error: While open a file for appending: {path}/000009.log: "
                        f"No space left on device")

    monkeypatch.setattr(wal.log, "Rdict", full)
    with pytest.raises(WalStorageError) as raised:
        WalLog.open_writer(WalDir(str(tmp_path / "wal")))
    assert is_transient(raised.value)
    monkeypatch.setattr(flush_registry, "registries", [])
    registry = flush_registry.FlushRegistry(FakeSpark(), {})
    assert registry._make_flusher(str(tmp_path / "wal"), str(tmp_path / "cp"), None) is None
    assert not os.path.exists(tmp_path / "wal" / BLOCKED)
