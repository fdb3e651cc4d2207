"""Batch ``df.write`` jobs: one WAL per job under the table's root, and what the jobs share.

Jobs writing to one table run at once (threads of one application, several applications)
and with clocks that may step back. Each job therefore stages, seals and flushes a WAL of
its own, ``<table root>/jobs/<job id>/`` (its one batch is :data:`JOB_BATCH`), so no job
reads, discards or deletes another's batch. What the jobs share (``wal/FORMAT.md``,
"Batch jobs"):

* the **table's last timestamp** (``last_ts``): the last write timestamp any job of the
  table used, read and raised under an exclusive ``flock`` of ``lock`` when a job seals. A
  job's timestamps start above it, so a later job's rows win over an earlier job's even when
  its clock is behind (the property the chain of seals gave when the jobs shared one WAL).
* the **job lock** (``jobs/<id>/job.lock``): a job holds it, exclusively, from the start of
  its commit to its end. A job WAL that is sealed and whose lock is free was left by a job
  that died after its seal: the next job completes it. An unsealed job WAL belongs to a job
  that may be staging right now, and is never touched by another job.

Cross-process locks are ``fcntl.flock``: the kernel releases them when their holder dies,
which is what tells a dead job from a live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from typing import Iterator

from .files import atomic_write, fsync_dir, make_private_dirs
from .format import (
    BLOCKED_FILE,
    DONE_DIR,
    LAST_TS_FILE,
    FLUSHED_THROUGH_FILE,
    JOB_LOCK_FILE,
    JOBS_DIR,
    MARKER_FILE,
    TABLE_LOCK_FILE,
)
from .layout import WalDir
from .seal import last_written_ts_us, read_seal

JOB_BATCH = 0                 # a job's WAL holds one batch; its id needs no clock


def _lock_fd(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


class TableTimestamps:
    """The table's last write timestamp (microseconds), shared by all its jobs."""

    def __init__(self, root: str):
        self.path = os.path.join(root, LAST_TS_FILE)
        self.lock_path = os.path.join(root, TABLE_LOCK_FILE)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The table's exclusive lock (blocking). Not reentrant: flock conflicts between two
        open files even in one process."""
        make_private_dirs(os.path.dirname(self.path))
        fd = _lock_fd(self.lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)   # releases the lock

    def read(self) -> int:
        """The table's last timestamp (0: no job has sealed yet)."""
        try:
            with open(self.path, "rb") as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0

    def _write(self, last_ts_us: int) -> None:
        atomic_write(self.path, b"%d\n" % last_ts_us)

    def claim(self, base_ts_us: int, rows: int) -> int:
        """Fix a job's base timestamp: ``base_ts_us`` (its own choice, from the clock) or above
        every timestamp any job used; raise the table's last timestamp over its ``rows`` rows
        before returning, so that it is durable before the seal naming these timestamps is."""
        with self.locked():
            base = max(base_ts_us, self.read() + 1)
            self._write(base + max(rows - 1, 0))
        return base

    def raise_to(self, last_ts_us: int) -> None:
        """Make every later job's timestamps start above ``last_ts_us`` (used for the batches
        of a WAL of the earlier, shared layout). The caller holds :meth:`locked`."""
        if last_ts_us > self.read():
            self._write(last_ts_us)


class TableJobs:
    """The batch jobs' layout under one table's WAL root (``wal.path``, or
    ``~/.cassandra_wal/<keyspace>.<table>``). Creating the object touches nothing on disk."""

    def __init__(self, root: str):
        self.root = root
        self.jobs = os.path.join(root, JOBS_DIR)
        self.timestamps = TableTimestamps(root)

    def job_root(self, job_id: str) -> str:
        return os.path.join(self.jobs, job_id)

    @classmethod
    def of_job(cls, job_root: str) -> "TableJobs":
        return cls(os.path.dirname(os.path.dirname(os.path.normpath(job_root))))

    # -- the earlier, shared layout -------------------------------------------------------
    def shared_wal(self) -> WalDir | None:
        """The WAL an earlier release kept at the table root for all its jobs, if any: what it
        holds must be flushed before a job of this layout seals."""
        wal = WalDir(self.root)
        return wal if os.path.exists(wal.marker) else None

    def retire_shared_wal(self, wal: WalDir) -> None:
        """Remove a shared-layout WAL whose batches are all flushed (the caller checked).
        The marker goes last: a crash in between leaves a WAL with nothing to do."""
        for folder in (wal.log, wal.segments, wal.seals):
            shutil.rmtree(folder, ignore_errors=True)   # ignore: already absent
        for name in (FLUSHED_THROUGH_FILE, BLOCKED_FILE, os.path.basename(wal.target_file),
                     MARKER_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(wal.root, name))
        fsync_dir(wal.root)

    # -- job WALs -------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding(self, job_root: str) -> Iterator[None]:
        """This job's lock, for the whole of its commit (it is never contended: only a job
        completing orphans tries it, without waiting)."""
        fd = _lock_fd(os.path.join(job_root, JOB_LOCK_FILE))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def orphan(self, job_root: str) -> Iterator[WalDir | None]:
        """The WAL of another job if that job is gone and left it sealed, holding its lock
        meanwhile; else None (its job is committing, or may still be staging)."""
        try:
            fd = os.open(os.path.join(job_root, JOB_LOCK_FILE), os.O_RDWR)
        except FileNotFoundError:   # no commit started there (staging), or retired meanwhile
            yield None
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:   # its job is committing right now
                yield None
                return
            wal = WalDir(job_root)
            yield wal if os.path.isdir(job_root) and wal.sealed_batch_ids() else None
        finally:
            os.close(fd)

    def other_jobs(self, own_job_root: str) -> list[str]:
        try:
            names = sorted(os.listdir(self.jobs))
        except FileNotFoundError:
            return []
        own = os.path.normpath(own_job_root)
        return [p for p in (os.path.join(self.jobs, n) for n in names) if p != own]

    def retire_job(self, job_root: str) -> None:
        """Remove a flushed job's WAL (its job lock held): first out of ``jobs/`` in one
        rename, so that no crash leaves a half-removed WAL that looks sealed, then deleted."""
        done = os.path.join(self.root, DONE_DIR)
        make_private_dirs(done)
        moved = os.path.join(done, os.path.basename(os.path.normpath(job_root)))
        os.rename(job_root, moved)
        fsync_dir(self.jobs)
        # The rename was the step that counts; another job's remove_done may be deleting the
        # same folder right now, and whoever is first wins.
        shutil.rmtree(moved, ignore_errors=True)

    def remove_done(self) -> None:
        """Delete what a crash left in ``done/``: job WALs already flushed and moved there."""
        done = os.path.join(self.root, DONE_DIR)
        try:
            names = os.listdir(done)
        except FileNotFoundError:
            return
        for name in names:
            # Another job may be removing the same leftover: whoever is first wins.
            shutil.rmtree(os.path.join(done, name), ignore_errors=True)


def last_timestamp(wal: WalDir) -> int:
    """The largest write timestamp any seal of ``wal`` holds, as amended (0: none)."""
    seals = (read_seal(wal, b) for b in wal.sealed_batch_ids())
    return max((last_written_ts_us(wal, s) for s in seals if s is not None), default=0)
