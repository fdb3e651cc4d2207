"""``wal.flush.mode=processes`` (recovery/processes.py): real worker processes, no Cassandra.

The pool's workers are real ``python -m recovery.processes`` children. Where rows are
written, a file-recording Upserter stands in for Cassandra in the workers (each appends what it
wrote, with its pid, to the file named by ``CWAL_TEST_WRITES``), driven by the real Replayer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial

import pytest

from recovery.errors import FlushFailed
from recovery.replay import Replayer
from recovery.executors import ExecutorsWriter
from recovery.processes import ProcessPool
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import PASSWORD, flusher_for, target
from wal.recovery_policy import RecoveryPolicy
from wal.states import BatchState

pytestmark = pytest.mark.unit

WRITES_ENV = "CWAL_TEST_WRITES"


# -- functions the workers run (imported there by name) ------------------------------------------
def where_run(tasks):
    return [(t, os.getpid()) for t in tasks]


def die_on(victim, tasks):
    if victim in tasks:
        os.kill(os.getpid(), signal.SIGKILL)
    return list(tasks)


class FileRecordingUpserter:
    def write_chunks(self, chunks, batch_id: int, age=None):
        for rb, first_ts, tag in chunks:
            with open(os.environ[WRITES_ENV], "a") as fh:
                fh.write(json.dumps([batch_id, first_ts, rb.column("id").to_pylist(),
                                     os.getpid()]) + "\n")
            yield tag


@contextlib.contextmanager
def file_recording_upserter(target):
    assert target.config.connection.password == PASSWORD   # the closure came through the pipe
    yield FileRecordingUpserter()


def writes(path) -> list[list]:
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:      # a zombie is not alive
        return fh.read().split(") ")[1][0] != "Z"


def wait_gone(pids, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


# -- the pool ----------------------------------------------------------------------------------------
def test_segments_are_dealt_over_the_workers_which_stay_from_batch_to_batch():
    pool = ProcessPool(2)
    try:
        first = pool(0, [10, 11, 12, 13], where_run)
        assert sorted(t for t, _ in first) == [10, 11, 12, 13]
        pids = {pid for _, pid in first}
        assert pids == set(pool.pids) and len(pids) == 2 and os.getpid() not in pids
        assert {pid for t, pid in first if t in (10, 12)} != {pid for t, pid in first
                                                              if t in (11, 13)}
        second = pool(1, [20], where_run)
        assert second[0][0] == 20 and second[0][1] in pids       # the same workers
    finally:
        pool.close()


def test_a_worker_that_dies_fails_the_batch_as_transient_and_the_next_batch_gets_new_workers():
    pool = ProcessPool(2)
    try:
        old = pool(0, [1, 2], where_run) and list(pool.pids)
        with pytest.raises(FlushFailed) as info:
            pool(7, [1, 2, 3], partial(die_on, 2))
        assert info.value.batch == 7 and not info.value.permanent
        assert "killed by signal 9" in str(info.value)
        assert "new workers take over" in str(info.value)
        assert sorted(info.value.results) == [1, 3]     # the live worker's answers are kept
        assert pool.pids == [] and wait_gone(old) == []          # every worker closed
        assert sorted(t for t, _ in pool(8, [1, 2, 3], where_run)) == [1, 2, 3]
        assert not set(pool.pids) & set(old)
    finally:
        pool.close()


def test_close_ends_every_worker():
    pool = ProcessPool(3)
    pool(0, [1], where_run)
    pids = list(pool.pids)
    assert len(pids) == 3 and all(alive(p) for p in pids)
    pool.close()
    assert wait_gone(pids, 1.0) == [] and pool.pids == []


def test_workers_exit_when_the_driver_is_killed():
    """kill -9 of the driver must not leave writers behind."""
    program = textwrap.dedent("""
        import sys, time
        from recovery.processes import ProcessPool
        from tests.unit.test_flush_processes import where_run
        pool = ProcessPool(2)
        pool(0, [1, 2], where_run)
        print(" ".join(map(str, pool.pids)), flush=True)
        time.sleep(120)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", program], cwd=root, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=root))
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        parent.kill()
        parent.wait()
        assert wait_gone(pids) == []
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_pool_needs_a_process():
    with pytest.raises(ValueError, match="at least 1"):
        ProcessPool(0)


# -- the pool behind the real Replayer ---------------------------------------------------------------
def test_the_replayer_through_worker_processes_writes_each_row_once_at_its_sealed_timestamp(
        tmp_path, monkeypatch):
    monkeypatch.setenv(WRITES_ENV, str(tmp_path / "writes.jsonl"))
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 5, 2), chunk_rows=2)
        f.sealed(1, rows=(4, 4))
        pool = ProcessPool(2)
        try:
            w = ExecutorsWriter(pool, f.root, target, open_upserter=file_recording_upserter)
            report = Replayer(f.wal, f.wal_log, None, f.checkpoint, writer=w).run(True)
            pids = set(pool.pids)
        finally:
            pool.close()
        assert report.replayed == [0, 1] and report.rows_written == 18
        done = writes(tmp_path / "writes.jsonl")
        for batch, rows in ((0, 10), (1, 8)):
            mine = [w for w in done if w[0] == batch]
            ids = sorted(i for w in mine for i in w[2])
            assert ids == [batch * 1000 + i for i in range(rows)]          # each row once
            base = f.built[batch].seal.base_ts_us
            for _, first_ts, chunk_ids, _ in mine:                           # sealed timestamps
                assert first_ts == base + chunk_ids[0] - batch * 1000
        assert {w[3] for w in done} == pids and len(pids) == 2             # both workers wrote
        assert f.wal_log.get(0).state is BatchState.FLUSHED
        assert f.wal_log.get(1).state is BatchState.FLUSHED
        assert f.wal.read_flushed_through() == 1


# -- the flusher picks it ----------------------------------------------------------------------------
def test_the_flusher_writes_through_worker_processes_when_asked_and_closes_them_on_stop(tmp_path):
    flusher, runs = flusher_for(tmp_path, "processes", spark=None)
    flusher.recover()
    flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
    assert runs[0] is None and flusher.replays[0] is False  # query start: discards only
    assert isinstance(runs[1], ExecutorsWriter) and isinstance(runs[1]._run_job, ProcessPool)
    pool = runs[1]._run_job
    assert pool.processes == 2
    pool(0, [1], where_run)
    pids = list(pool.pids)
    flusher.stop()
    assert wait_gone(pids, 1.0) == [] and pool.pids == []


# -- batch jobs and cassandra-wal recover ------------------------------------------------------------
@pytest.mark.parametrize("mode,processes", [("processes", 2), ("executors", 0), ("driver", 0)])
def test_a_batch_job_flushes_through_worker_processes_in_processes_mode(tmp_path, monkeypatch,
                                                                        mode, processes):
    # Spark's commit worker, where a batch job's flush runs, cannot start a Spark job: the
    # processes mode is what scales there; executors mode's jobs flush from the driver.
    import recovery.batch_jobs as batch_jobs
    from tests.helpers.flush_fakes import target_flushed_by

    asked = []
    monkeypatch.setattr(batch_jobs, "replay_wal", lambda *a, **kw: asked.append(kw["processes"]))
    batch_jobs.flush_sealed(None, target_flushed_by(mode))
    assert asked == [processes]


def test_replay_wal_hands_its_batches_to_worker_processes_and_closes_them(tmp_path, monkeypatch):
    import recovery.recover as recover

    used = []
    real_run = recover.Replayer.run

    def run(self, *args, **kwargs):
        used.append(self.writer)
        assert isinstance(self.writer, ExecutorsWriter)
        assert isinstance(self.writer._run_job, ProcessPool) and self.writer._run_job.processes == 3
        self.writer._run_job(0, [1], where_run)           # the pool's workers start
        used.append(list(self.writer._run_job.pids))
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(recover.Replayer, "run", run)
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        root, cp = f.root, f.checkpoint
    from wal.layout import WalDir

    report = recover.replay_wal(WalDir(root), cp, target(), policy=RecoveryPolicy.OFFLINE,
                                processes=3)
    assert report.replayed == [] and len(used[1]) >= 1
    assert wait_gone(used[1], 5.0) == [] and used[0]._run_job.pids == []


def test_recover_command_takes_its_worker_processes_from_the_option_or_the_recorded_mode():
    from types import SimpleNamespace

    from recovery.cli import UsageError
    from recovery.cli.recover_cmd import _processes
    from tests.helpers.flush_fakes import target_flushed_by

    assert _processes(target_flushed_by("processes"), SimpleNamespace(processes=None)) == 2
    assert _processes(target_flushed_by("executors"), SimpleNamespace(processes=None)) == 0
    assert _processes(target_flushed_by("processes"), SimpleNamespace(processes=0)) == 0
    assert _processes(target_flushed_by("driver"), SimpleNamespace(processes=4)) == 4
    with pytest.raises(UsageError, match="--processes -1"):
        _processes(target_flushed_by("driver"), SimpleNamespace(processes=-1))


def test_when_a_worker_dies_the_segments_the_other_wrote_are_not_written_again(
        tmp_path, monkeypatch):
    # Three segments dealt to two workers: 0 and 2 to the first, 1 to the second, which dies
    # on it. The first worker's segments are acknowledged (2 beyond the prefix), and the retry
    # writes segment 1 only.
    monkeypatch.setenv(WRITES_ENV, str(tmp_path / "writes.jsonl"))
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 4, 2))
        pool = ProcessPool(2)
        dying = {"on": True}

        def run_job(batch, tasks, fn):
            if dying["on"]:
                dying["on"] = False
                return pool(batch, tasks, partial(_die_on_segment, 1, fn))
            return pool(batch, tasks, fn)

        run_job.close = pool.close
        writer = ExecutorsWriter(run_job, f.root, target, open_upserter=file_recording_upserter)
        replayer = Replayer(f.wal, f.wal_log, None, f.checkpoint, writer=writer)
        try:
            with pytest.raises(FlushFailed, match="a flush worker process died"):
                replayer.run(RecoveryPolicy.QUERY_FLUSHER)
            kept = f.wal_log.get(0)
            assert (kept.next_segment, kept.acknowledged, kept.flushed_rows) == (1, ((2, 2),), 5)
            before = len((tmp_path / "writes.jsonl").read_text().splitlines())
            replayer.run(RecoveryPolicy.QUERY_FLUSHER)
            again = [json.loads(line)[2] for line in
                     (tmp_path / "writes.jsonl").read_text().splitlines()[before:]]
            assert sorted(i for ids in again for i in ids) == [3, 4, 5, 6]   # segment 1 only
            assert f.wal_log.get(0).state is BatchState.FLUSHED
        finally:
            pool.close()


def _die_on_segment(index, fn, tasks):
    """A worker's share: killed before writing if it holds segment ``index``."""
    if any(t.index == index for t in tasks):
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(tasks)
