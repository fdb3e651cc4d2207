"""``foreachBatch`` adapter: the same WAL, flush-after-commit rule and guarantee, for every
output mode (Python data sources cannot do Update mode; aggregations need it).

    q = (df.writeStream.outputMode("update")
           .foreachBatch(sinks.CassandraWalWriter("ks", "table", checkpoint))
           .option("checkpointLocation", checkpoint).start())

The adapter stages the micro-batch on the executors (one segment per partition, through
``mapInArrow``), then seals it in the driver before returning. Spark writes ``commits/N``
after ``foreachBatch`` returns; the listener then flushes, exactly as for the data source.
"""

from __future__ import annotations

import json

import pyarrow as pa
from pyspark import TaskContext

from wal.checkpoint import Filesystems
from wal.seal import COMMIT_POINT_CHECKPOINT

from .plan import StageMessage, WritePlan, commit_batch, prepare_write, stage_partition


def _session_conf(spark) -> dict:
    return {k: v for k, v in spark.conf.getAll.items() if k.startswith("spark.cassandra.")}


class _StageTask:
    """Runs in each task; picklable (no closures over the DataFrame)."""

    def __init__(self, plan: WritePlan, batch_id: int):
        self.plan, self.batch_id = plan, batch_id

    def __call__(self, batches):
        """Runs: on executors, one call per task of the ``mapInArrow`` stage."""
        tc = TaskContext.get()
        msg = stage_partition(self.plan, batches, self.batch_id, tc.partitionId(),
                              tc.attemptNumber())
        yield pa.record_batch({"segment": [json.dumps(msg.segment) if msg.segment else None]})


class CassandraWalWriter:
    """Callable for ``foreachBatch(df, batch_id)``. ``checkpoint_location`` must be the query's
    own (it is how the sink knows when Spark committed a batch)."""

    def __init__(self, keyspace: str, table: str, checkpoint_location: str,
                 options: dict | None = None):
        self.options = dict(options or {}, keyspace=keyspace, table=table,
                            checkpointLocation=checkpoint_location)

    def __call__(self, df, batch_id: int) -> None:
        """Stage batch ``batch_id`` on the executors (``mapInArrow``), then seal it before
        returning; Spark writes ``commits/N`` after, and the listener's flusher writes it.

        Runs: in the driver process, on the query's thread, once per micro-batch."""
        # Spark resolves the checkpoint against the session's default filesystem: so must we.
        plan = prepare_write(self.options, _session_conf(df.sparkSession), df.schema,
                             streaming=True, filesystems=Filesystems.of_session(df.sparkSession))
        rows = df.mapInArrow(_StageTask(plan, batch_id), "segment string").collect()
        messages = [StageMessage(json.loads(r.segment) if r.segment else None) for r in rows]
        commit_batch(plan, messages, batch_id, commit_point=COMMIT_POINT_CHECKPOINT)
