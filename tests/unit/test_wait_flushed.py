"""``sinks.wait_flushed(query, timeout)`` (sinks/driver/wait.py) on real WALs, with a fake query.

It returns once every batch up to the checkpoint's highest ``commits/N`` is flushed, wakes the
live flusher rather than waiting for its poll, raises the reason of a block and, on timeout,
names the batches still pending; after ``query.stop()`` with no flusher left it drains the WAL
itself.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest

import sinks
import sinks.driver.registry as registry_module
import sinks.driver.wait as wait
from recovery.errors import NotFlushedYet, WalBlocked
from recovery.cql.errors import SinkError
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import target_flushed_by
from tests.helpers.outage import Outage, fake_cassandra
from wal.files import atomic_write
from wal.retention import remove_batch_files

pytestmark = pytest.mark.unit


class FakeQuery:
    """What wait_flushed reads of a StreamingQuery: ids, whether it runs, its checkpoint."""

    def __init__(self, checkpoint: str, active: bool = True):
        self.id, self.runId, self.isActive = "query-1", "run-1", active
        streaming = type("SQ", (), {"resolvedCheckpointRoot": lambda _s: f"file:{checkpoint}"})()
        self._jsq = type("JSQ", (), {"streamingQuery": lambda _s: streaming})()


class KickedFlusher:
    """A live flusher whose drain, when kicked, runs ``on_drain`` (on its own thread)."""

    def __init__(self, on_drain):
        self.on_drain, self.drains, self.kicks = on_drain, 0, 0
        self.stopped = threading.Event()      # a live flusher: not stopped

    def kick(self):
        self.kicks += 1

        def drain():
            self.on_drain()
            self.drains += 1

        threading.Thread(target=drain).start()


@pytest.fixture
def registry(monkeypatch):
    """A registry (no Spark) holding ``flushers[run-1]`` as a test sets it."""
    monkeypatch.setattr(registry_module, "registries", [])
    reg = registry_module.FlushRegistry.__new__(registry_module.FlushRegistry)
    reg.flushers, reg.runs, reg.stopping, reg.checkpoints = {}, {}, {}, {}
    reg.newest, reg._pointers = {}, {}
    reg.session_conf, reg._lock = {}, threading.Lock()
    reg._making, reg._looking, reg._told_no_target = threading.Lock(), {}, set()
    registry_module.registries.append(reg)
    return reg


def live(registry, f: WalFactory, flusher) -> None:
    """``flusher`` is run-1's flusher of ``f``'s WAL."""
    flusher.wal = SimpleNamespace(location=f.root)
    registry.flushers["run-1"] = {f.root: flusher}


def pointed(f: WalFactory) -> None:
    """The checkpoint's pointer to the WAL, as a stream's first batch writes it."""
    from wal.pointer import POINTER_FILE

    atomic_write(os.path.join(f.checkpoint, POINTER_FILE),
                 ('{"wal_path": "%s"}' % f.root).encode())


def mark_flushed(f: WalFactory, batch: int) -> None:
    """What the flusher does to a committed batch (as WalFactory.flushed)."""
    if f.wal_log.get(batch) is None:
        f.wal_log.ingest(f.built[batch].seal)
    f.wal_log.begin_flush(batch)
    f.wal_log.mark_flushed(batch)
    f.wal.write_flushed_through(batch)
    remove_batch_files(f.wal, batch, keep_seal=True)


def test_returns_at_once_when_every_committed_batch_is_flushed(tmp_path, registry):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.flushed(1)
        f.sealed(2, committed=False)          # staged, not committed: not waited for
        pointed(f)
        sinks.wait_flushed(FakeQuery(f.checkpoint), timeout=0)


def test_returns_at_once_when_nothing_is_committed(tmp_path, registry):
    os.makedirs(tmp_path / "cp")
    sinks.wait_flushed(FakeQuery(str(tmp_path / "cp")), timeout=0)


def test_kicks_the_live_flusher_and_returns_once_it_flushed(tmp_path, registry):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.sealed(1)
        f.sealed(2)
        pointed(f)
        flusher = KickedFlusher(lambda: (mark_flushed(f, 1), mark_flushed(f, 2)))
        live(registry, f, flusher)
        started = time.monotonic()
        sinks.wait_flushed(FakeQuery(f.checkpoint), timeout=30)
        assert flusher.kicks == 1 and time.monotonic() - started < 1.5


def test_times_out_naming_the_pending_batches_and_their_rows(tmp_path, registry):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.flushing(1, rows=(30, 20), chunk_rows=10, progress_rows=20)
        f.sealed(2, rows=(7,))
        pointed(f)
        live(registry, f, KickedFlusher(lambda: None))   # Cassandra is away
        with pytest.raises(NotFlushedYet) as info:
            sinks.wait_flushed(FakeQuery(f.checkpoint), timeout=0.5)
        assert isinstance(info.value, TimeoutError)
        assert info.value.pending == [(1, 30), (2, 7)] and info.value.through == 2
        assert "batch 1 (30 rows), batch 2 (7 rows)" in str(info.value)


def test_raises_the_reason_of_a_block_that_the_next_drain_did_not_clear(tmp_path, registry):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0)
        pointed(f)
        reason = "RecoveryBlocked: recovery stopped at batch 0: checksum mismatch"
        atomic_write(os.path.join(f.root, "blocked.json"),
                     ('{"reason": "%s", "at": 0}' % reason).encode())
        flusher = KickedFlusher(lambda: None)
        live(registry, f, flusher)
        with pytest.raises(WalBlocked) as info:
            sinks.wait_flushed(FakeQuery(f.checkpoint), timeout=30)
        assert info.value.reason == reason and f.root in str(info.value)
        assert flusher.drains == 1, "raised before the flusher tried once more"


def test_a_block_the_next_drain_clears_is_waited_through(tmp_path, registry):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0)
        pointed(f)
        blocked = os.path.join(f.root, "blocked.json")
        atomic_write(blocked, b'{"reason": "FlushFailed: refused", "at": 0}')

        def fixed():                       # the operator fixed the table meanwhile
            mark_flushed(f, 0)
            os.unlink(blocked)

        live(registry, f, KickedFlusher(fixed))
        sinks.wait_flushed(FakeQuery(f.checkpoint), timeout=30)


def test_a_query_not_writing_through_the_sink_is_refused(tmp_path, registry):
    os.makedirs(tmp_path / "cp" / "commits")
    (tmp_path / "cp" / "commits" / "0").write_text("v1\n{}\n")
    with pytest.raises(SinkError, match="does not write through this sink"):
        sinks.wait_flushed(FakeQuery(str(tmp_path / "cp")), timeout=0)


def test_after_stop_with_no_flusher_left_it_drains_the_wal_itself(tmp_path, registry,
                                                                   monkeypatch):
    """The stopped run's last drain gave up (Cassandra was away); now it is back."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                    target={"fingerprint": "f",
                            "target": target_flushed_by("driver").to_dict()}) as f:
        f.sealed(0)
        f.sealed(1)
        pointed(f)
    outage = Outage(OSError("unused"))
    outage.down = False
    made = []
    real = wait.QueryFlusher

    def flusher(*args, **kwargs):
        made.append(real(*args, **kwargs))
        fake_cassandra(monkeypatch, made[-1], outage)
        return made[-1]

    monkeypatch.setattr(wait, "QueryFlusher", flusher)
    sinks.wait_flushed(FakeQuery(str(tmp_path / "cp"), active=False), timeout=30)
    assert len(made) == 1 and made[0].stopped.is_set()        # the WAL's lock is let go
    assert sorted(i for _, ids in outage.written for i in ids) == \
        [0, 1, 2, 3, 4, 1000, 1001, 1002, 1003, 1004]


def test_a_stop_retries_its_last_drain_while_cassandra_is_away_then_finishes(tmp_path,
                                                                              monkeypatch):
    from tests.helpers.outage import flusher_on
    from wal.log import WalLog
    from wal.states import BatchState

    with flusher_on(tmp_path) as flusher:
        outage = Outage(OSError(111, "Connection refused"))
        fake_cassandra(monkeypatch, flusher, outage)
        threading.Timer(0.3, lambda: setattr(outage, "down", False)).start()
        flusher.stop(finish_within_s=30)      # Cassandra comes back meanwhile
        assert flusher.stopped.is_set() and flusher.drains > 1
    reader = WalLog.open_reader(flusher.wal)
    try:
        assert [r.state for r in reader.records()] == [BatchState.FLUSHED, BatchState.FLUSHED]
    finally:
        reader.close()


def test_a_stop_gives_up_after_its_bound_leaving_the_batches_in_the_wal(tmp_path, monkeypatch,
                                                                       caplog):
    from tests.helpers.outage import flusher_on

    with flusher_on(tmp_path) as flusher:
        fake_cassandra(monkeypatch, flusher, Outage(OSError(111, "Connection refused")))
        started = time.monotonic()
        flusher.stop(finish_within_s=0.3)
        assert 0.3 <= time.monotonic() - started < 5
        assert flusher.drains > 1 and flusher.stopped.is_set()
        assert not os.path.exists(os.path.join(flusher.wal.root, "blocked.json"))
        assert "stay in the WAL" in caplog.text


def test_after_a_stop_whose_last_drain_gave_up_it_drains_the_wal_itself(
        tmp_path, registry, monkeypatch):
    # query.stop() during an outage longer than the last drain retries; Cassandra comes back
    # while wait_flushed waits: it must write the rest itself, not poll the closed flusher.
    from tests.helpers.outage import flusher_on

    monkeypatch.setattr(registry_module, "FINISH_ON_STOP_S", 0.3)
    with flusher_on(tmp_path) as flusher:
        outage = Outage(OSError(111, "Connection refused"))
        fake_cassandra(monkeypatch, flusher, outage)
        atomic_write(os.path.join(str(tmp_path / "cp"), "cassandra_wal_sink.json"),
                     ('{"wal_path": "%s"}' % flusher.wal.root).encode())
        registry.flushers["run-1"] = {flusher.wal.location: flusher}
        registry.runs["run-1"] = ("query-1", str(tmp_path / "cp"))
        query = FakeQuery(str(tmp_path / "cp"), active=False)
        registry.terminated("query-1", "run-1")          # its last drain: 0.3 s of retries
        threading.Timer(1.0, lambda: setattr(outage, "down", False)).start()
        made = wait.QueryFlusher

        def meeting_the_same_cassandra(*args, **kwargs):
            own = made(*args, **kwargs)
            fake_cassandra(monkeypatch, own, outage)
            return own

        monkeypatch.setattr(wait, "QueryFlusher", meeting_the_same_cassandra)
        sinks.wait_flushed(query, timeout=10)
        assert not wait.pending_batches(flusher.wal, str(tmp_path / "cp"), 1)
