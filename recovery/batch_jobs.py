"""Writing a batch job's WALs (layout: :mod:`wal.batch_jobs`): a job's own, just sealed; a WAL
of the earlier shared layout; and job WALs that other jobs sealed and left when they died.

A batch job's seal is its own commit point (there is no Spark checkpoint), so each is written
in full by the :class:`~recovery.replay.Replayer` in this process, from the driver, or with
``wal.flush.mode=processes`` by that many worker processes of it (Spark's commit worker, where
this runs, cannot start a Spark job: ``executors`` mode's jobs flush from the driver). Called by
the sink's job commit (:mod:`sinks.worker.batch_jobs`) under the job's lock; ``cassandra-wal recover
<table root>/jobs/<job id>`` writes a job WAL by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from recovery.cql.errors import ConnectionFailed, FlushFailed, SinkError
from wal.batch_jobs import TableJobs, last_timestamp
from wal.errors import WalError
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy

from .errors import RecoveryBlocked
from .recover import replay_wal
from .replay import ReplayReport
from .target import RecordedTarget, Target

log = logging.getLogger(__name__)


def flush_sealed(wal: WalDir, target: Target) -> ReplayReport:
    """Write everything sealed in a job's ``wal`` (its seals are their own commit point), in
    order, waiting a minute for a job that still holds it; through ``wal.flush.processes``
    worker processes with ``wal.flush.mode=processes``."""
    return replay_wal(wal, None, target, policy=RecoveryPolicy.BATCH_JOB, lock_wait_s=60,
                      crash_prefix="flush", processes=target.config.wal.worker_processes())


def _recorded_target(wal: WalDir, creds: Mapping[str, str]) -> Target:
    """The target ``wal`` recorded, with this job's credentials: none are recorded in a WAL, and
    a job left by another has only the current job's to go with."""
    return RecordedTarget.require(wal).target.with_credentials(creds)


def flush_shared_wal(table_jobs: TableJobs, creds: Mapping[str, str]) -> None:
    """A WAL of the earlier layout at the table root (every job in one WAL): write what it
    holds, raise the table's last timestamp to its own, and remove it, before this job seals. Under
    the table's lock, so that one job does it and none seals meanwhile."""
    with table_jobs.timestamps.locked():
        wal = table_jobs.shared_wal()
        if wal is None:
            return
        wal.check()
        report = flush_sealed(wal, _recorded_target(wal, creds))
        if report.waiting_at is not None:
            raise SinkError(
                f"{wal.root} holds a WAL whose batch {report.waiting_at} waits for a Spark "
                f"checkpoint (a stream's WAL?): batch jobs need a wal.path of their own; "
                f"see docs/runbook.md to recover that WAL")
        table_jobs.timestamps.raise_to(last_timestamp(wal))
        table_jobs.retire_shared_wal(wal)
        log.info("cassandra_wal: %s: flushed and removed the WAL of the shared layout "
                 "(%d batches written)", wal.root, len(report.replayed))


def complete_orphans(table_jobs: TableJobs, own_root: str, creds: Mapping[str, str]) -> None:
    """Write the job WALs that other jobs sealed and left (their lock is free: their process
    died after the seal), each with the options it recorded. A failure is logged and leaves
    that WAL for the next job or ``cassandra-wal recover``: it does not fail this job, whose
    own rows are written, and whose timestamps are above the orphan's whatever the order."""
    for job_root in table_jobs.other_jobs(own_root):
        with table_jobs.orphan(job_root) as wal:
            if wal is None:
                continue
            try:
                report = flush_sealed(wal, _recorded_target(wal, creds))
            except (RecoveryBlocked, FlushFailed, ConnectionFailed, SinkError, WalError,
                    OSError) as exc:
                log.error("cassandra_wal: could not complete the sealed WAL %s left by a job "
                          "that died: %s; the next job to this table retries it, or run "
                          "'cassandra-wal recover %s'", job_root, exc, job_root)
                continue
            table_jobs.retire_job(job_root)
            log.warning("cassandra_wal: completed the WAL %s left by a job that died after "
                        "its seal (%d rows)", job_root, report.rows_written)
