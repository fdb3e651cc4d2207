"""``foreachBatch`` adapter: the same WAL, flush-after-commit rule and guarantee, for every
output mode (Python data sources cannot do Update mode; aggregations need it), and for a
function that writes several tables from one micro-batch.

    def write(df, batch_id):
        orders(df, batch_id)                                   # shop.orders
        by_customer(df.select(...), batch_id)                  # shop.orders_by_customer

    orders = sinks.CassandraWalWriter("shop", "orders", checkpoint)
    by_customer = sinks.CassandraWalWriter("shop", "orders_by_customer", checkpoint)
    q = (df.writeStream.outputMode("update").foreachBatch(write)
           .option("checkpointLocation", checkpoint).start())

Each call records that it was called for the batch (an *entry*, :mod:`wal.entries`), stages
the micro-batch on the executors (one segment per partition, through ``mapInArrow``), then
seals it in the driver before returning. Spark writes ``commits/N`` after the function
returns; the listener then flushes, exactly as for the data source. Each table has a WAL of
its own (:func:`sinks.worker.plan.table_wal_location`), with its own batches, seals and timestamps;
a batch for which a writer is not called has nothing to write to its table, while one whose
writer failed, and which Spark committed because the function caught the error, blocks the
table's WAL (it lost rows). One table written twice in one batch is refused: the second
seal would replace the first.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import pyarrow as pa
from pyspark import TaskContext

from recovery.cql.errors import SinkError
from wal.checkpoint import Filesystems, normal_location
from wal.entries import Entry, record_entry, record_run
from wal.layout import WalDir
from wal.seal import COMMIT_POINT_CHECKPOINT, Seal

from .plan import StageMessage, WritePlan, commit_batch, prepare_write, stage_partition

log = logging.getLogger(__name__)


def _session_conf(spark) -> dict:
    return {k: v for k, v in spark.conf.getAll.items() if k.startswith("spark.cassandra.")}


class _RunsByCheckpoint:
    """The run of each query started in this process, by checkpoint (the registry's
    ``onQueryStarted`` notes it): where the job group cannot be read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, str] = {}

    def note(self, checkpoint: str, run_id: str) -> None:
        with self._lock:
            self._runs[normal_location(checkpoint)] = run_id

    def get(self, checkpoint: str) -> str:
        with self._lock:
            return self._runs.get(normal_location(checkpoint), "")

    def forget(self, checkpoint: str, run_id: str) -> None:
        with self._lock:
            if self._runs.get(normal_location(checkpoint)) == run_id:
                del self._runs[normal_location(checkpoint)]


_runs = _RunsByCheckpoint()


def note_run(checkpoint: str, run_id: str) -> None:
    """Run ``run_id`` of the query checkpointed at ``checkpoint`` (Spark's resolved root)
    started in this process.

    Runs: in the driver process, on Spark's listener thread (the registry's
    ``onQueryStarted``), before the run's first batch."""
    _runs.note(checkpoint, run_id)


def forget_run(checkpoint: str, run_id: str) -> None:
    """Run ``run_id`` of the query checkpointed at ``checkpoint`` ended.

    Runs: in the driver process, on Spark's listener thread (the registry's
    ``onQueryTerminated``)."""
    _runs.forget(checkpoint, run_id)


def _run_id(spark, checkpoint: str) -> str:
    """The query run calling the function: the run the registry saw start on ``checkpoint``
    (resolved as Spark does), whatever thread the function calls its writers from (a thread
    pool writing tables side by side); else the job group Spark runs a micro-batch under,
    named after the run's id, a property of the query's thread that the user's function may
    change (``setJobGroup``), so second best. Empty where neither is known: Spark Connect's
    server-side function, whose worker process lives for one run."""
    noted = _runs.get(checkpoint)
    if noted:
        return noted
    try:
        return spark.sparkContext.getLocalProperty("spark.jobGroup.id") or ""
    except Exception:  # noqa: BLE001 - no SparkContext here (Spark Connect)
        return ""


class _StageTask:
    """Runs in each task; picklable (no closures over the DataFrame)."""

    def __init__(self, plan: WritePlan, batch_id: int):
        self.plan, self.batch_id = plan, batch_id

    def __call__(self, batches):
        """Runs: on executors, one call per task of the ``mapInArrow`` stage."""
        tc = TaskContext.get()
        msg = stage_partition(self.plan, batches, self.batch_id, tc.partitionId(),
                              tc.attemptNumber())
        yield pa.record_batch({"segment": [json.dumps(msg.segment) if msg.segment else None],
                               "keys": pa.array([msg.keys], pa.binary())})


class _Claims:
    """Which table each WAL is written for in a run, and for which batch it was last claimed,
    in this process (a run lives in one driver process): a second write of one table in one
    batch, or two tables through one ``wal.path`` in one run (in any batches: a table's lost
    batch would hide behind the other's seal), is refused before it stages anything. A call
    that failed gives its batch back, so the function may try it again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], str] = {}        # (wal, run) -> its table
        self._batches: dict[tuple[str, str], int] = {}       # (wal, run) -> batch claimed
        self.runs_recorded: set[tuple[str, str]] = set()     # (wal, run): wal.entries.record_run

    def claim(self, wal: str, run: str, batch: int, table: str) -> None:
        with self._lock:
            owner = self._tables.get((wal, run))
            if owner is not None and owner != table:
                raise SinkError(
                    f"batch {batch}: {table} and {owner} are written through one WAL "
                    f"({wal}): each table needs a WAL of its own. Leave wal.path unset (each "
                    f"writer then gets its own under the checkpoint) or give each writer "
                    f"another")
            if self._batches.get((wal, run)) == batch:
                raise SinkError(
                    f"batch {batch}: {table} is written twice in one micro-batch (the "
                    f"foreachBatch function called its writer again): the second seal "
                    f"would replace the first one's rows. Union the DataFrames and call "
                    f"the writer once per batch")
            self._tables[(wal, run)] = table
            self._batches[(wal, run)] = batch

    def release(self, wal: str, run: str, batch: int) -> None:
        with self._lock:
            if self._batches.get((wal, run)) == batch:
                del self._batches[(wal, run)]


_claims = _Claims()


class WriterCall:
    """One call of a writer for batch ``batch_id`` of run ``run``: :meth:`claim` (given as
    ``prepare_write``'s ``claim``, before the checkpoint's pointer names the WAL) claims the
    batch's WAL for ``table`` (refused: a :class:`~recovery.cql.errors.SinkError`, nothing staged, no
    pointer), :meth:`enter` (its ``on_wal``, before the table is looked up) records the entry;
    then the caller stages the batch (``__call__`` through ``mapInArrow``; the
    protocol simulation, ``tests/sim``, task by task through ``stage_partition``), then
    :meth:`seal`, or :meth:`failed` if anything failed meanwhile."""

    def __init__(self, batch_id: int, run: str, table: str):
        self.batch_id, self.run, self.table = batch_id, run, table
        self.wal: str | None = None
        self.plan: WritePlan | None = None
        self.seal_id = uuid.uuid4().hex     # named in the entry: a seal left by another call
                                            # of the batch is then not taken for this one's
        self.entered = False

    def claim(self, wal: WalDir) -> None:
        """Claim ``wal`` for this call (``prepare_write``'s ``claim``: before the checkpoint's
        pointer names it for this table)."""
        _claims.claim(wal.location, self.run, self.batch_id, self.table)
        self.wal = wal.location

    def enter(self, wal: WalDir) -> None:
        """Record the call's entry in ``wal`` (``prepare_write``'s ``on_wal``)."""
        if self.wal != wal.location:
            self.claim(wal)
        record_entry(wal, Entry(self.batch_id, self.run, self.table, seal_id=self.seal_id))
        self.entered = True
        if (wal.location, self.run) not in _claims.runs_recorded:
            # The run ran the batches from here on, at the latest (the listener records from
            # where it started, if it could): what an earlier run left of them is garbage.
            record_run(wal, self.batch_id, self.run)
            _claims.runs_recorded.add((wal.location, self.run))

    def seal(self, messages: list[StageMessage]) -> Seal:
        """Seal the staged batch (before the function returns: Spark commits after)."""
        try:
            return commit_batch(self.plan, messages, self.batch_id,
                                commit_point=COMMIT_POINT_CHECKPOINT, seal_id=self.seal_id)
        except BaseException as exc:
            self.failed(exc)
            raise

    def failed(self, exc: BaseException) -> None:
        """The call ends without a seal: its claim is given back (the function may try again)
        and the error logged (a function that catches it and goes on lets Spark commit a batch
        whose rows for this table were never staged, which blocks this table's WAL)."""
        if isinstance(exc, Exception) and self.entered:
            log.error("cassandra_wal: batch %d of %s was not staged (%s: %s): if the "
                      "foreachBatch function goes on, Spark commits the batch without its rows "
                      "for this table and the WAL at %s blocks", self.batch_id, self.table,
                      type(exc).__name__, exc, self.wal)
        elif isinstance(exc, Exception):
            # Nothing recorded the call (refused, or no WAL to record it in): a batch Spark
            # commits without an entry reads as one the writer was never called for.
            log.error("cassandra_wal: batch %d of %s was refused before anything was recorded "
                      "(%s: %s): if the foreachBatch function catches this and goes on, Spark "
                      "commits the batch and its rows for this table may be lost without the "
                      "WAL knowing: let the error fail the batch", self.batch_id, self.table,
                      type(exc).__name__, exc)
        if self.wal is not None:
            _claims.release(self.wal, self.run, self.batch_id)


class CassandraWalWriter:
    """Callable for ``foreachBatch(df, batch_id)``: writes one table. ``checkpoint_location``
    must be the query's own (it is how the sink knows when Spark committed a batch). Several
    writers, one per table, may be called from one function."""

    def __init__(self, keyspace: str, table: str, checkpoint_location: str,
                 options: dict | None = None):
        self.options = dict(options or {}, keyspace=keyspace, table=table,
                            checkpointLocation=checkpoint_location)
        self.table = f"{keyspace}.{table}"

    def __call__(self, df, batch_id: int) -> None:
        """Record the call, stage batch ``batch_id`` on the executors (``mapInArrow``), then
        seal it before returning (:class:`WriterCall`); Spark writes ``commits/N`` after, and
        the listener's flusher writes it. An error is logged here too: a function that catches
        it and goes on lets Spark commit a batch whose rows for this table were never staged,
        which blocks this table's WAL when Spark commits it.

        Runs: in the driver process, on the query's thread, once per micro-batch."""
        spark = df.sparkSession
        # Spark resolves the checkpoint against the session's default filesystem: so must we.
        filesystems = Filesystems.of_session(spark)
        resolved = filesystems.resolve(self.options["checkpointLocation"])
        call = WriterCall(batch_id, _run_id(spark, resolved.local or resolved.uri), self.table)
        try:
            call.plan = prepare_write(self.options, _session_conf(spark), df.schema,
                                      streaming=True, filesystems=filesystems,
                                      wal_per_table=True, on_wal=call.enter,
                                      claim=call.claim)
            rows = df.mapInArrow(_StageTask(call.plan, batch_id),
                                 "segment string, keys binary").collect()
            messages = [StageMessage(json.loads(r.segment) if r.segment else None,
                                     keys=None if r["keys"] is None else bytes(r["keys"]))
                        for r in rows]
        except BaseException as exc:
            call.failed(exc)
            raise
        call.seal(messages)
