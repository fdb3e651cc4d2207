"""A batch ``df.write`` job's commit: seal its own WAL, write it, and finish what others left.

Runs in Spark's commit worker on the driver host, once per job (layout: :mod:`wal.batch_jobs`):

1. take the job's lock (held to the end of the commit);
2. flush a WAL of the earlier, shared layout if the table root holds one, then remove it;
3. seal the job's batch with timestamps above the table's last timestamp;
4. write it to Cassandra and return only once every row is acknowledged, then remove the
   job's WAL;
5. complete job WALs that other jobs sealed and left when they died (their lock is free).

A job whose commit fails after its seal (Cassandra down) keeps its sealed WAL: the next job
to the table, or ``cassandra-wal recover <table root>/jobs/<job id>``, writes it.
"""

from __future__ import annotations

from typing import Iterable

from recovery.batch_jobs import complete_orphans, flush_sealed, flush_shared_wal
from recovery.cql import credentials
from wal.batch_jobs import JOB_BATCH, TableJobs
from wal.seal import COMMIT_POINT_SEAL

from .plan import StageMessage, WritePlan, commit_batch


def commit_job(plan: WritePlan, messages: Iterable[StageMessage | None]) -> None:
    """Seal and write the job planned by ``plan`` (its ``wal_root`` is the job's own WAL)."""
    table_jobs = TableJobs.of_job(plan.wal_root)
    creds = credentials.layered(credentials.of_connection(plan.config.connection))
    with table_jobs.holding(plan.wal_root):
        flush_shared_wal(table_jobs, creds)
        commit_batch(plan, messages, JOB_BATCH, commit_point=COMMIT_POINT_SEAL,
                     shared_timestamps=table_jobs.timestamps)
        if not plan.config.wal.flush:
            return   # sealed only (benchmarks): the next job, or recover, writes it
        flush_sealed(plan.wal, plan.target.with_credentials(creds))
        table_jobs.retire_job(plan.wal_root)
    table_jobs.remove_done()
    complete_orphans(table_jobs, plan.wal_root, creds)


def abort_job(plan: WritePlan) -> None:
    """Remove the job's WAL unless it is sealed (a commit that failed after its seal, whose
    rows must still land: the next job completes it)."""
    table_jobs = TableJobs.of_job(plan.wal_root)
    with table_jobs.holding(plan.wal_root):
        if not plan.wal.sealed_batch_ids():
            table_jobs.retire_job(plan.wal_root)
