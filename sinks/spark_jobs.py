"""The flush jobs of ``wal.flush.mode=executors`` on Spark: what the flusher
(:mod:`recovery.flusher`, which imports no Spark) is handed to run them.

Runs: in the driver process, on the flusher's thread; the job's tasks on executors
(:func:`recovery.executors.write_segments`).
"""

from __future__ import annotations

from collections.abc import Callable

from py4j.protocol import Py4JError

from cql.errors import FlushFailed


class SparkJobs:
    """A :class:`recovery.executors.SparkJobs` over one SparkSession."""

    def __init__(self, spark):
        self.spark = spark

    def __call__(self, batch: int, tasks: list, fn: Callable) -> list:
        """Run ``fn`` over ``tasks`` as one Spark job, one task (partition) per segment."""
        context = self.spark.sparkContext
        context.setJobDescription(f"cassandra_wal: flush batch {batch} ({len(tasks)} segments)")
        try:
            return context.parallelize(tasks, len(tasks)).mapPartitions(fn).collect()
        except Py4JError as exc:   # tasks lost beyond spark.task.maxFailures, Spark stopping
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FlushFailed(batch, f"the Spark job of the flush failed: {first}") from None

    def active(self) -> bool:
        try:
            jsc = self.spark.sparkContext._jsc
            return jsc is not None and not jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 - a gateway that is gone: not active
            return False
