"""The flush jobs of ``wal.flush.mode=executors`` on Spark: what the flusher
(:mod:`recovery.flusher`, which imports no Spark) is handed to run them.

Runs: in the driver process (Spark Connect: the client's), on the flusher's thread; the job's
tasks on executors (:func:`recovery.executors.write_segments`, through
:mod:`sinks.worker.flush_task`).

One Spark job per batch, through the DataFrame API, so that a Spark Connect client runs it as
a classic driver does: ``spark.range(n, numPartitions=n)`` (one row, so one task, per
segment), then ``mapInArrow`` of the job's closure (``fn``, credentials inside, pickled in
memory with the plan, and the pickled tasks: each task takes those of its rows' ids), whose
tasks hand back their pickled :class:`~recovery.executors.SegmentResult`. No shuffle, no
exchange: each task writes the segment of its own row. A closure that the task list would make
larger than :data:`~recovery.executors.CLOSURE_LIMIT` (thousands of segments; PySpark would
write it to the driver's disk) leaves the tasks out: the range is joined with a broadcast
table of them instead (no secret and no row in them: PySpark may hand that table to the JVM
through a file), which costs the driver's JVM some 0.6 CPU-s more a job
(``docs/performance.md``, "Driver CPU of the flush"). In a classic session the job runs in the scheduler pool :data:`POOL`
(used where ``spark.scheduler.mode=FAIR``) with a description naming the batch. Through Spark
Connect the closure travels to the server in the plan: a flush whose target has credentials
runs there only over TLS (:meth:`SparkJobs.carries_secrets`).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable
from functools import partial

from py4j.protocol import Py4JError
from pyspark.errors import (
    AnalysisException,
    PySparkAttributeError,
    PySparkException,
    PySparkPicklingError,
    PySparkTypeError,
    PySparkValueError,
)

from recovery.cql.errors import FlushFailed
from recovery.executors import CLOSURE_LIMIT
from sinks.worker.flush_task import RESULTS, run_listed_partition, run_partition

from .connect import is_connect_session

#: The scheduler pool of the flush jobs (classic sessions).
POOL = "cassandra_wal_flush"
TASKS = "id long, task binary"
#: Errors of the job's own making (its plan, its closure), which no retry cures: they block
#: the sink, naming the remedy. Any other failure (a task lost beyond
#: ``spark.task.maxFailures``, Spark stopping, the Connect server gone) is retried.
PERMANENT = (AnalysisException, PySparkAttributeError, PySparkPicklingError, PySparkTypeError,
             PySparkValueError)


class SparkJobs:
    """A :class:`recovery.executors.SparkJobs` over one SparkSession, classic or Connect."""

    def __init__(self, spark):
        self.spark = spark
        self.connect = is_connect_session(spark)
        self._on_a_cluster: bool | None = None

    def __call__(self, batch: int, tasks: list, fn: Callable) -> list:
        """Run ``fn`` over ``tasks`` as one Spark job, one task per segment."""
        if not self.connect:
            with contextlib.suppress(Exception):    # a SparkContext stopping: the job says so
                context = self.spark.sparkContext
                context.setJobDescription(f"cassandra_wal: flush batch {batch} "
                                          f"({len(tasks)} segments)")
                context.setLocalProperty("spark.scheduler.pool", POOL)
        try:
            listed = [pickle.dumps(task) for task in tasks]
            ids = self.spark.range(0, len(tasks), 1, len(tasks))
            carried = partial(run_listed_partition, fn, listed)
            if len(pickle.dumps(carried)) <= CLOSURE_LIMIT:
                rows = ids.mapInArrow(carried, RESULTS).collect()
            else:
                table = self.spark.createDataFrame(list(enumerate(listed)), TASKS)
                # The hint, not functions.broadcast: that one picks Connect or classic from
                # the process's environment, not from this session.
                rows = (ids.join(table.hint("broadcast"), "id").select("task")
                        .mapInArrow(partial(run_partition, fn), RESULTS).collect())
        except (Py4JError, PySparkException) as exc:
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            if isinstance(exc, PERMANENT):
                raise FlushFailed(batch, f"the Spark job of the flush cannot run: {first}; "
                                  "use wal.flush.mode=driver", permanent=True) from None
            raise FlushFailed(batch, f"the Spark job of the flush failed: {first}") from None
        return [pickle.loads(row.result) for row in rows]

    def carries_secrets(self) -> bool:
        """Whether a job's closure may hold credentials: always in a classic session (it stays
        within the cluster's own transport, ``spark.network.crypto.enabled``); through Spark
        Connect only over TLS (``sc://...;use_ssl=true``), the closure travelling in the plan."""
        if not self.connect:
            return True
        try:
            return bool(self.spark.client._builder.secure)
        except Exception:  # noqa: BLE001 - a client of another shape: not known to be secure
            return False

    def on_a_cluster(self) -> bool:
        """Whether Spark runs its executors apart from the driver: any master but ``local``
        and ``local[...]`` (``local-cluster[...]`` is a cluster); through Spark Connect, the
        server's. Read once; a master that cannot be read counts as local."""
        if self._on_a_cluster is None:
            try:
                master = (self.spark.conf.get("spark.master", "local") if self.connect
                          else self.spark.sparkContext.master)
            except Exception:  # noqa: BLE001 - a session that cannot say: the driver writes
                master = "local"
            self._on_a_cluster = not (master == "local" or master.startswith("local["))
        return self._on_a_cluster

    def active(self) -> bool:
        """Whether Spark can still run a job (it stops before the query's last drain may)."""
        try:
            if self.connect:
                return not self.spark.is_stopped
            jsc = self.spark.sparkContext._jsc
            return jsc is not None and not jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 - a gateway or server that is gone: not active
            return False
