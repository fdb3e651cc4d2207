"""The ``cassandra_wal`` Python data source: streaming and batch writers.

Who calls what, where (measured: ``../shared/docs/spark-facts.md``):

* ``streamWriter()`` / ``writer()``: a Python worker on the driver host, once per micro-batch
  (or job). Prepares the write (options, WAL, validation) before anything is staged.
* ``write()``: every task, on executors. Stages the task's rows as one WAL segment; nothing
  goes to Cassandra from a task.
* ``commit()``: Spark's commit worker on the driver host. Seals the batch durably before it
  returns; a stream's batch is flushed later, by the driver, once ``commits/N`` exists
  (:mod:`recovery.flusher`). A batch ``df.write`` job has a WAL of its own, and flushes right
  after its seal, in the commit (:mod:`sinks.worker.batch_jobs`).
* ``abort()``: nothing to undo: unsealed segments are never flushed and are removed later (a
  batch job removes its unsealed WAL at once).

Nothing here keeps state between calls: Spark re-creates these objects for every batch.
"""

from __future__ import annotations

import logging
import uuid

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
)

from recovery.cql.errors import OptionError
from wal import checkpoint as ckpt
from wal.batch_jobs import JOB_BATCH

from .plan import WritePlan, commit_batch, prepare_write, stage_partition

log = logging.getLogger(__name__)

FORMAT_NAME = "cassandra_wal"


def _task():
    return TaskContext.get()


class CassandraWalStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch's writer: made by ``streamWriter`` once per batch, pickled to the tasks."""

    def __init__(self, plan: WritePlan):
        self.plan = plan

    def write(self, iterator):
        """Stage the task's rows as one WAL segment; nothing goes to Cassandra from here.

        Runs: on executors, one call per task (and per task attempt)."""
        tc = _task()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId"))
        query_id = tc.getLocalProperty("sql.streaming.queryId") or ""
        return stage_partition(self.plan, iterator, batch_id, tc.partitionId(),
                               tc.attemptNumber(), query_id)

    def commit(self, messages, batchId):
        """Seal batch ``batchId`` (its winning segments and write timestamps), durably, before
        Spark may write ``commits/N``; the flusher writes it to Cassandra after that.

        Runs: in a one-shot Python worker of the driver, once per batch."""
        commit_batch(self.plan, messages, batchId)

    def abort(self, messages, batchId):
        """Nothing to undo: unsealed segments are never flushed, and removed later.

        Runs: in a one-shot Python worker of the driver, once per failed batch."""
        log.warning("batch %s aborted: its staged segments will never be flushed", batchId)


class CassandraWalBatchWriter(DataSourceArrowWriter):
    """``df.write``: the job is the one batch (:data:`wal.batch_jobs.JOB_BATCH`) of a WAL of its own
    (``plan.wal_root``), so that jobs writing to one table at once never touch each other's
    rows (:mod:`wal.batch_jobs`)."""

    def __init__(self, plan: WritePlan):
        self.plan = plan

    def write(self, iterator):
        """Stage the task's rows as one segment of the job's WAL.

        Runs: on executors, one call per task (and per task attempt)."""
        tc = _task()
        return stage_partition(self.plan, iterator, JOB_BATCH, tc.partitionId(),
                               tc.attemptNumber())

    def commit(self, messages):
        """Seal the job, write it to Cassandra and return once every row is acknowledged
        (:mod:`sinks.worker.batch_jobs`).

        Runs: in a one-shot Python worker of the driver, once per job."""
        # Imported here: a stream's one-shot workers import this module too and never need
        # recovery's writers (see sinks/__init__.py).
        from .batch_jobs import commit_job

        commit_job(self.plan, messages)

    def abort(self, messages):
        """Remove the job's WAL unless it is sealed.

        Runs: in a one-shot Python worker of the driver, once per failed job."""
        from .batch_jobs import abort_job  # as in commit

        log.warning("write job aborted: its staged segments will never be flushed")
        abort_job(self.plan)


class CassandraWalDataSource(DataSource):
    """Registered by :func:`sinks.register`, which bakes the session's ``spark.cassandra.*``
    settings into a subclass (``session_conf``) since a data source sees only its options, and
    the path of the driver's credential channel (``credential_channel``,
    :mod:`recovery.cql.credentials`): how credentials given as options reach the driver's flusher,
    and what the session's queries resolve a checkpoint against (``filesystems``: the default
    filesystem, :mod:`wal.checkpoint`), which only the driver's JVM knows."""

    session_conf: dict = {}
    credential_channel: str | None = None
    filesystems: ckpt.Filesystems = ckpt.LOCAL    # what Spark resolves checkpoints against

    @classmethod
    def name(cls) -> str:
        """The format name, ``cassandra_wal``.

        Runs: in the driver process, when the data source is registered."""
        return FORMAT_NAME

    def streamWriter(self, schema, overwrite):
        """Prepare the micro-batch's write (options, WAL, validation against the table): bad
        input fails here, before anything is staged.

        Runs: in a one-shot Python worker of the driver, once per micro-batch."""
        return CassandraWalStreamWriter(prepare_write(
            self.options, self.session_conf, schema, streaming=True,
            credential_channel=self.credential_channel, filesystems=self.filesystems))

    def writer(self, schema, overwrite):
        """Prepare a ``df.write`` job: its own WAL, named here, options and validation.

        Runs: in a one-shot Python worker of the driver, once per job."""
        if overwrite:
            raise OptionError("mode", "overwrite", "overwrite would truncate the table; "
                              "this sink appends (upserts): use mode('append')")
        # The job's tasks and commit get the WAL named here through the plan.
        plan = prepare_write(self.options, self.session_conf, schema, streaming=False,
                             filesystems=self.filesystems, job_id=uuid.uuid4().hex)
        return CassandraWalBatchWriter(plan)
