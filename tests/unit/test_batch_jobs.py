"""Batch jobs' WALs (wal/batch_jobs.py, recovery/batch_jobs.py, sinks/worker/batch_jobs.py):
the table's last timestamp under a clock that steps back, and which job WALs a job completes,
leaves alone, or removes.

The flush itself (Cassandra) is replaced by a recorder here; the end-to-end tests in
tests/integration/test_sink_batch.py write through the real node and real Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from recovery import batch_jobs as batch_job_flush
from recovery.replay import ReplayReport
from sinks.worker import batch_jobs
from recovery.cql.errors import SinkError
from tests.helpers.walfactory import WalFactory
from wal import batch_jobs as wal_batch_jobs
from wal import seal as seal_mod
from wal.batch_jobs import JOB_BATCH, TableJobs, TableTimestamps
from wal.layout import WalDir
from wal.seal import COMMIT_POINT_SEAL, read_seal, seal_batch
from wal.segment import SegmentRef

pytestmark = pytest.mark.unit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ref(rows: int) -> SegmentRef:
    return SegmentRef("00000000000000000000/00000-000-000000000000.seg", 0, 0, rows, chunks=1,
                      bytes=100, crc32=1)


# -- the table's last timestamp ------------------------------------------------------------

def test_a_later_job_with_a_clock_stepped_back_seals_above_the_earlier_job(tmp_path,
                                                                           monkeypatch):
    table_jobs = TableJobs(str(tmp_path / "table"))
    clock = iter([5_000_000, 1_000_000])      # the second job's clock is 4 s behind
    monkeypatch.setattr(seal_mod, "now_us", lambda: next(clock))
    first_wal = WalDir(table_jobs.job_root("a")).create()
    second_wal = WalDir(table_jobs.job_root("b")).create()

    first = seal_batch(first_wal, JOB_BATCH, [_ref(10)], commit_point=COMMIT_POINT_SEAL,
                       shared_timestamps=table_jobs.timestamps)
    second = seal_batch(second_wal, JOB_BATCH, [_ref(3)], commit_point=COMMIT_POINT_SEAL,
                        shared_timestamps=table_jobs.timestamps)

    assert first.base_ts_us == 5_000_000 and first.last_ts_us == 5_000_009
    assert second.base_ts_us == 5_000_010          # not 1_000_000: above every earlier row
    assert table_jobs.timestamps.read() == second.last_ts_us == 5_000_012
    assert read_seal(second_wal, JOB_BATCH).base_ts_us == 5_000_010


def test_the_clock_wins_when_it_is_ahead_of_the_tables_last_timestamp(tmp_path):
    timestamps = TableTimestamps(str(tmp_path))
    assert timestamps.claim(1_000, rows=5) == 1_000
    assert timestamps.claim(9_000, rows=1) == 9_000
    assert timestamps.read() == 9_000


def test_a_job_of_no_rows_still_moves_the_tables_last_timestamp_past_its_own(tmp_path):
    timestamps = TableTimestamps(str(tmp_path))
    assert timestamps.claim(100, rows=0) == 100
    assert timestamps.claim(50, rows=0) == 101


def test_concurrent_claims_get_disjoint_timestamp_ranges(tmp_path):
    timestamps = TableTimestamps(str(tmp_path))
    ranges, lock = [], threading.Lock()

    def claim():
        base = timestamps.claim(1_000, rows=7)
        with lock:
            ranges.append((base, base + 6))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ranges.sort()
    assert all(prev[1] < nxt[0] for prev, nxt in zip(ranges, ranges[1:])), ranges
    assert timestamps.read() == ranges[-1][1]


# -- orphans -------------------------------------------------------------------------------

@pytest.fixture
def recorder(monkeypatch):
    """``recovery.batch_jobs.flush_sealed`` replaced: records which WALs were written, with
    which target."""
    flushed: list[str] = []

    def fake_flush(wal, target):
        flushed.append(wal.root)
        return ReplayReport(replayed=[JOB_BATCH], rows_written=5)

    monkeypatch.setattr(batch_job_flush, "flush_sealed", fake_flush)
    monkeypatch.setattr(batch_job_flush, "_recorded_target", lambda wal, creds: wal.read_target())
    return flushed


def _job(table_jobs: TableJobs, name: str, sealed: bool, locked_file: bool = True) -> str:
    root = table_jobs.job_root(name)
    factory = WalFactory(root, target={"keyspace": "ks", "table": "t", "job": name})
    if sealed:
        factory.sealed(JOB_BATCH, committed=None, commit_point=COMMIT_POINT_SEAL)
        with table_jobs.holding(root):   # its commit ran (and ended: the lock file stays, free)
            pass
    else:
        factory.staged(JOB_BATCH)
    return root


def test_a_sealed_job_wal_whose_lock_is_free_is_completed_and_removed(tmp_path, recorder):
    table_jobs = TableJobs(str(tmp_path / "table"))
    orphan = _job(table_jobs, "dead", sealed=True)
    own = _job(table_jobs, "own", sealed=False)
    batch_job_flush.complete_orphans(table_jobs, own, {})
    assert recorder == [orphan]
    assert not os.path.exists(orphan)
    assert os.listdir(table_jobs.jobs) == ["own"]


def test_an_unsealed_job_wal_is_never_touched(tmp_path, recorder):
    """It may be staging right now: its tasks write into it until its commit starts."""
    table_jobs = TableJobs(str(tmp_path / "table"))
    staging = _job(table_jobs, "staging", sealed=False)
    before = sorted(os.listdir(WalDir(staging).batch_segments(JOB_BATCH)))
    batch_job_flush.complete_orphans(table_jobs, _job(table_jobs, "own", sealed=False), {})
    assert recorder == []
    assert sorted(os.listdir(WalDir(staging).batch_segments(JOB_BATCH))) == before


def test_a_job_wal_whose_job_is_committing_is_never_touched(tmp_path, recorder):
    """A live job holds its lock from its commit's start to its end (here another process,
    as a concurrent job's commit worker is)."""
    table_jobs = TableJobs(str(tmp_path / "table"))
    live = _job(table_jobs, "live", sealed=True)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); from wal.batch_jobs import TableJobs\n"
         "with TableJobs.of_job(sys.argv[2]).holding(sys.argv[2]):\n"
         "    print('held', flush=True); sys.stdin.read()",
         REPO, live], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        batch_job_flush.complete_orphans(table_jobs, _job(table_jobs, "own", sealed=False), {})
        assert recorder == [] and os.path.isdir(live)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # Its process gone (as if it died after its seal), the next job completes it.
    batch_job_flush.complete_orphans(table_jobs, table_jobs.job_root("own"), {})
    assert recorder == [live] and not os.path.exists(live)


def test_an_orphan_that_cannot_be_written_is_logged_and_kept_for_the_next_job(
        tmp_path, monkeypatch, caplog):
    table_jobs = TableJobs(str(tmp_path / "table"))
    orphan = _job(table_jobs, "dead", sealed=True)
    monkeypatch.setattr(batch_job_flush, "_recorded_target", lambda wal, creds: None)

    def failing(wal, target):
        raise SinkError("Cassandra refused it")

    monkeypatch.setattr(batch_job_flush, "flush_sealed", failing)
    batch_job_flush.complete_orphans(table_jobs, _job(table_jobs, "own", sealed=False), {})
    assert os.path.isdir(orphan) and WalDir(orphan).sealed_batch_ids() == [JOB_BATCH]
    assert any(r.levelname == "ERROR" and orphan in r.getMessage()
               and "cassandra-wal recover" in r.getMessage() for r in caplog.records)


def test_abort_removes_an_unsealed_job_wal_and_keeps_a_sealed_one(tmp_path):
    table_jobs = TableJobs(str(tmp_path / "table"))
    unsealed, sealed = _job(table_jobs, "u", sealed=False), _job(table_jobs, "s", sealed=True)
    batch_jobs.abort_job(SimpleNamespace(wal_root=unsealed, wal=WalDir(unsealed)))
    batch_jobs.abort_job(SimpleNamespace(wal_root=sealed, wal=WalDir(sealed)))
    assert not os.path.exists(unsealed)
    assert WalDir(sealed).sealed_batch_ids() == [JOB_BATCH]


def test_leftovers_of_a_crash_while_removing_a_flushed_job_wal_are_deleted(tmp_path):
    table_jobs = TableJobs(str(tmp_path / "table"))
    done = os.path.join(table_jobs.root, "done", "x")
    os.makedirs(os.path.join(done, "log"))
    table_jobs.remove_done()
    assert os.listdir(os.path.join(table_jobs.root, "done")) == []


def test_retiring_a_job_wal_that_another_job_is_sweeping_does_not_fail_the_job(
        tmp_path, monkeypatch):
    # Job B's rows are written and its WAL moved to done/; job C's remove_done deletes the
    # same folder first. B's commit must not fail (a retried job rewrites its rows).
    table_jobs = TableJobs(str(tmp_path / "table"))
    job_root = table_jobs.job_root("b")
    os.makedirs(os.path.join(job_root, "segments", "00000000000000000000"))
    real_fsync = wal_batch_jobs.fsync_dir

    def swept_meanwhile(path):
        real_fsync(path)
        TableJobs(table_jobs.root).remove_done()    # the other job, between B's rename and rmtree

    monkeypatch.setattr(wal_batch_jobs, "fsync_dir", swept_meanwhile)
    table_jobs.retire_job(job_root)
    assert not os.path.exists(job_root)
    assert os.listdir(os.path.join(table_jobs.root, "done")) == []


# -- the earlier, shared layout ------------------------------------------------------------

def test_a_shared_layout_wal_is_flushed_its_timestamps_carried_and_removed(tmp_path, recorder):
    root = str(tmp_path / "table")
    legacy = WalFactory(root, target={"keyspace": "ks", "table": "t"})
    built = legacy.sealed(7, committed=None, commit_point=COMMIT_POINT_SEAL)
    table_jobs = TableJobs(root)
    batch_job_flush.flush_shared_wal(table_jobs, {})
    assert recorder == [root]
    assert table_jobs.shared_wal() is None
    assert sorted(os.listdir(root)) == ["last_ts", "lock"]
    assert table_jobs.timestamps.read() == built.seal.last_ts_us     # the next job seals above it


def test_a_shared_layout_wal_that_waits_for_a_checkpoint_is_kept_and_the_job_fails(
        tmp_path, monkeypatch):
    root = str(tmp_path / "table")
    WalFactory(root, target={"keyspace": "ks", "table": "t"}).sealed(3, committed=None)
    monkeypatch.setattr(batch_job_flush, "_recorded_target", lambda wal, creds: None)
    monkeypatch.setattr(batch_job_flush, "flush_sealed",
                        lambda wal, target: ReplayReport(waiting_at=3))
    table_jobs = TableJobs(root)
    with pytest.raises(SinkError, match="batch 3 waits for a Spark checkpoint"):
        batch_job_flush.flush_shared_wal(table_jobs, {})
    assert table_jobs.shared_wal() is not None and WalDir(root).sealed_batch_ids() == [3]
