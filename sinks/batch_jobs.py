"""A batch ``df.write`` job's commit: seal its own WAL, write it, and finish what others left.

Runs in Spark's commit worker on the driver host, once per job (layout: :mod:`wal.jobs`):

1. take the job's lock (held to the end of the commit);
2. flush a WAL of the earlier, shared layout if the table root holds one, then remove it;
3. seal the job's batch with timestamps above the table's floor;
4. write it to Cassandra and return only once every row is acknowledged, then remove the
   job's WAL;
5. complete job WALs that other jobs sealed and left when they died (their lock is free).

A job whose commit fails after its seal (Cassandra down) keeps its sealed WAL: the next job
to the table, or ``cassandra-wal recover <table root>/jobs/<job id>``, writes it.
"""

from __future__ import annotations

import logging
from typing import Iterable

from recovery.errors import FlushFailed, RecoveryBlocked
from recovery.replay import ReplayReport, Replayer
from recovery.target import Target
from wal.errors import WalError
from wal.jobs import JOB_BATCH, TableJobs, last_timestamp
from wal.layout import WalDir
from wal.seal import COMMIT_POINT_SEAL

from .driver import CassandraOutput, open_writer_waiting
from .errors import ConnectionFailed, SinkError
from .plan import StageMessage, WritePlan, commit_batch

log = logging.getLogger(__name__)


def commit_job(plan: WritePlan, messages: Iterable[StageMessage | None]) -> None:
    """Seal and write the job planned by ``plan`` (its ``wal_root`` is the job's own WAL)."""
    jobs = TableJobs.of_job(plan.wal_root)
    with jobs.holding(plan.wal_root):
        flush_shared_wal(jobs, plan)
        commit_batch(plan, messages, JOB_BATCH, commit_point=COMMIT_POINT_SEAL,
                     floor=jobs.floor)
        if not plan.config.wal.flush:
            return   # sealed only (benchmarks): the next job, or recover, writes it
        _flush(plan.wal, _with_credentials(plan.target, plan))
        jobs.retire_job(plan.wal_root)
    jobs.remove_done()
    complete_orphans(jobs, plan)


def abort_job(plan: WritePlan) -> None:
    """Remove the job's WAL unless it is sealed (a commit that failed after its seal, whose
    rows must still land: the next job completes it)."""
    jobs = TableJobs.of_job(plan.wal_root)
    with jobs.holding(plan.wal_root):
        if not plan.wal.sealed_batch_ids():
            jobs.retire_job(plan.wal_root)


def _with_credentials(target: Target, plan: WritePlan) -> Target:
    """``target`` with the credentials this job has (environment, then its options): none are
    recorded in a WAL, and a job left by another has only the current job's to go with."""
    conn = plan.config.connection
    return target.with_env_credentials().with_connection(
        username=conn.username, password=conn.password,
        ssl_keystore_password=conn.ssl_keystore_password)


def _recorded_target(wal: WalDir, plan: WritePlan) -> Target:
    recorded = wal.read_target()
    if recorded is None:
        raise SinkError(f"{wal.root} has no target.json: nothing says where its rows go")
    return _with_credentials(Target.from_dict(recorded["target"]), plan)


def _flush(wal: WalDir, target: Target) -> ReplayReport:
    """Write everything sealed in ``wal`` (its seals are their own commit point), in order."""
    output = CassandraOutput(target)
    wal_log = open_writer_waiting(wal, 60)
    try:
        return Replayer(wal, wal_log, output.upserter, checkpoint=None).run(query_running=False)
    finally:
        wal_log.close()
        output.close()


def flush_shared_wal(jobs: TableJobs, plan: WritePlan) -> None:
    """A WAL of the earlier layout at the table root (every job in one WAL): write what it
    holds, carry its timestamps into the floor, and remove it, before this job seals. Under
    the table's lock, so that one job does it and none seals meanwhile."""
    with jobs.floor.locked():
        wal = jobs.shared_wal()
        if wal is None:
            return
        wal.check()
        report = _flush(wal, _recorded_target(wal, plan))
        if report.waiting_at is not None:
            raise SinkError(
                f"{wal.root} holds a WAL whose batch {report.waiting_at} waits for a Spark "
                f"checkpoint (a stream's WAL?): batch jobs need a wal.path of their own; "
                f"see docs/runbook.md to recover that WAL")
        jobs.floor.raise_to(last_timestamp(wal))
        jobs.retire_shared_wal(wal)
        log.info("cassandra_wal: %s: flushed and removed the WAL of the shared layout "
                 "(%d batches written)", wal.root, len(report.replayed))


def complete_orphans(jobs: TableJobs, plan: WritePlan) -> None:
    """Write the job WALs that other jobs sealed and left (their lock is free: their process
    died after the seal), each with the options it recorded. A failure is logged and leaves
    that WAL for the next job or ``cassandra-wal recover``: it does not fail this job, whose
    own rows are written, and whose timestamps are above the orphan's whatever the order."""
    for job_root in jobs.other_jobs(plan.wal_root):
        with jobs.orphan(job_root) as wal:
            if wal is None:
                continue
            try:
                report = _flush(wal, _recorded_target(wal, plan))
            except (RecoveryBlocked, FlushFailed, ConnectionFailed, SinkError, WalError,
                    OSError) as exc:
                log.error("cassandra_wal: could not complete the sealed WAL %s left by a job "
                          "that died: %s; the next job to this table retries it, or run "
                          "'cassandra-wal recover %s'", job_root, exc, job_root)
                continue
            jobs.retire_job(job_root)
            log.warning("cassandra_wal: completed the WAL %s left by a job that died after "
                        "its seal (%d rows)", job_root, report.rows_written)
