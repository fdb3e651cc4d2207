"""The ``cassandra_wal`` Python data source: streaming and batch writers.

Who calls what, where (measured: ``../shared/docs/spark-facts.md``):

* ``streamWriter()`` / ``writer()``: a Python worker on the driver host, once per micro-batch
  (or job). Prepares the write (options, WAL, validation) before anything is staged.
* ``write()``: every task, on executors. Stages the task's rows as one WAL segment; nothing
  goes to Cassandra from a task.
* ``commit()``: Spark's commit worker on the driver host. Seals the batch durably before it
  returns; a stream's batch is flushed later, by the driver, once ``commits/N`` exists
  (:mod:`sinks.driver`). A batch ``df.write`` job flushes right after its seal, in the commit.
* ``abort()``: nothing to undo: unsealed segments are never flushed and are removed later.

Nothing here keeps state between calls: Spark re-creates these objects for every batch.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter,
                                    DataSourceStreamArrowWriter)

from wal.seal import COMMIT_POINT_SEAL

from .errors import OptionError
from .plan import WritePlan, commit_batch, prepare_write, stage_partition

log = logging.getLogger(__name__)

from . import FORMAT_NAME


def _task():
    from pyspark import TaskContext

    return TaskContext.get()


class CassandraWalStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: WritePlan):
        self.plan = plan

    def write(self, iterator):
        tc = _task()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId"))
        query_id = tc.getLocalProperty("sql.streaming.queryId") or ""
        return stage_partition(self.plan, iterator, batch_id, tc.partitionId(),
                               tc.attemptNumber(), query_id)

    def commit(self, messages, batchId):
        commit_batch(self.plan, messages, batchId)

    def abort(self, messages, batchId):
        log.warning("batch %s aborted: its staged segments will never be flushed", batchId)


class CassandraWalBatchWriter(DataSourceArrowWriter):
    """``df.write``: the job is one WAL batch, its id a microsecond clock reading."""

    def __init__(self, plan: WritePlan, batch_id: int):
        self.plan, self.batch_id = plan, batch_id

    def write(self, iterator):
        tc = _task()
        return stage_partition(self.plan, iterator, self.batch_id, tc.partitionId(),
                               tc.attemptNumber())

    def commit(self, messages):
        from .driver import flush_now

        commit_batch(self.plan, messages, self.batch_id, commit_point=COMMIT_POINT_SEAL)
        flush_now(self.plan)

    def abort(self, messages):
        log.warning("write job aborted: its staged segments will never be flushed")


class CassandraWalDataSource(DataSource):
    """Registered by :func:`sinks.register`, which bakes the session's ``spark.cassandra.*``
    settings into a subclass (``session_conf``) since a data source sees only its options, and
    the path of the driver's credential channel (``credential_channel``,
    :mod:`sinks.credentials`): how credentials given as options reach the driver's flusher."""

    session_conf: dict = {}
    credential_channel: str | None = None

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def streamWriter(self, schema, overwrite):
        return CassandraWalStreamWriter(prepare_write(
            self.options, self.session_conf, schema, streaming=True,
            credential_channel=self.credential_channel))

    def writer(self, schema, overwrite):
        if overwrite:
            raise OptionError("mode", "overwrite", "overwrite would truncate the table; "
                              "this sink appends (upserts): use mode('append')")
        plan = prepare_write(self.options, self.session_conf, schema, streaming=False)
        return CassandraWalBatchWriter(plan, time.time_ns() // 1000)
