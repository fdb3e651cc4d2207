"""``wal.flush.mode=executors``: a batch's sealed segments written by Spark tasks, one per segment.

Why: one Python process upserting every row is the sink's bottleneck (``docs/performance.md``,
"Flush throughput and executors"), while the segments are already where every executor can
read them: on the shared WAL path, or on the store (HDFS, S3) that holds the WAL.

Why it is safe: every row's write timestamp is fixed by the seal (row *i* of the batch, segments
in seal order, at ``base_ts_us + i``), so any task may write any segment, in any order, more
than once, and the cells end the same. What must stay ordered is the *marking*, and that stays
where it was: :class:`recovery.replay.Replayer` records the acknowledged prefix of segments as
progress and each segment acknowledged beyond it on its own (not written again by a retry),
marks the batch FLUSHED after the last one, and writes no later batch before.
This module is only the :class:`~recovery.replay.RowWriter` that gets the rows there.

Who runs what:

* **driver**, the flusher thread (:meth:`ExecutorsWriter.write`): one :class:`SegmentTask` per
  segment not yet acknowledged, run as one Spark job of one task each (``run_job``:
  :class:`sinks.driver.spark_jobs.SparkJobs`, a DataFrame job a Spark Connect client runs too), then
  an acknowledgement per segment in seal order up to the first that failed, one for each
  later segment written whole (:class:`~recovery.replay.SegmentAcknowledged`), then that
  failure (a corrupted segment first: it blocks the sink).
* **executor task** (:func:`write_segments`): takes its worker's session for the flusher's own
  target and credentials (:mod:`recovery.sessions`: connected by the worker's first task, kept
  for its next tasks and batches), reads its segment from the WAL folder (at the driver's
  path) or, for a WAL on a store (HDFS, S3), from the store, as the staging tasks published
  it; verifies the whole segment against the seal (checksum and
  rows) *before* writing a row of it, upserts its chunks with :class:`~recovery.cql.upsert.Upserter` at the sealed
  timestamps, and returns the rows written, or the error (:class:`SegmentResult`). Its rows'
  TTLs count down from the batch's age as the driver measured it when it started the job
  (:class:`~recovery.cql.batch_age.BatchAge`, in the closure), never from the executor's own wall clock.
  Errors are returned, not raised: the Upserter already retries transient failures, and the driver
  retries the batch from its recorded progress, as in driver mode. An error that would not
  survive pickling unchanged travels as a :class:`~recovery.errors.FlushTaskError` that
  keeps its type's name, its text and whether it is transient
  (:func:`~recovery.errors.portable_error`), so the driver's flusher treats it as the task
  would have.

Credentials (Cassandra's, and the store's keys) travel only inside the task's closure
(:class:`SegmentJob`, pickled in memory and shipped with the task by Spark), never in the task list, which PySpark hands to the JVM through
a temporary file. A query's start leaves its committed backlog to the flusher's first drain,
which runs these jobs (:meth:`recovery.flusher.QueryFlusher.recover`); batch writes and
``cassandra-wal recover`` run no Spark job (a batch job's commit worker cannot start one).

Crash points armed in the driver (``wal/crashpoints.py``) are handed to the tasks, so a test can
kill a run at ``flush.task_written``: a task's segment acknowledged, before it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import tempfile
from dataclasses import dataclass
from functools import partial
from typing import Callable, ContextManager, Iterable, Iterator, Protocol

from recovery.cql import batch_age
from recovery.cql.batch_age import BatchAge
from recovery.cql.errors import FlushFailed, SinkError
from wal import clock
from wal.crashpoints import ENV_ONCE, ENV_POINT, ENV_SCOPE, crash_point
from wal.errors import WalCorrupted
from wal.files import make_private_dirs
from wal.layout import WalDir
from wal.log import BatchRecord, WalLog
from wal.remote import RemoteWal, spool_dir
from wal.seal import Seal
from wal.segment import SegmentReader, SegmentRef
from wal.stores import StoreAccess, current_access, use_access

from .errors import FlushJobIncomplete, is_transient, portable_error
from .processes import ProcessPool
from .replay import Acknowledged, SegmentAcknowledged
from .sessions import kept_upserter
from .target import Target

log = logging.getLogger(__name__)

#: PySpark sends a pickled closure larger than ``spark.broadcast.UDFCompressionThreshold``
#: (1 MiB) as a broadcast, through a file on the driver's disk; the closure holds credentials.
CLOSURE_LIMIT = 512 * 1024


@dataclass(frozen=True)
class SegmentTask:
    """One segment to write (what the task list holds: no secret)."""

    index: int              # position in the seal
    segment: SegmentRef     # name, partition, rows, checksum as sealed
    first_row: int          # batch-wide ordinal of the segment's first row
    first_chunk: int = 0    # chunks before it are acknowledged already (driver-mode progress)


@dataclass(frozen=True)
class SegmentResult:
    index: int
    rows: int
    error: BaseException | None = None
    host: str = ""


@dataclass(frozen=True)
class SegmentJob:
    """What every task of one batch's job shares: the closure (credentials inside ``target``)."""

    wal_root: str
    batch: int
    base_ts_us: int
    target: Target
    crash_env: tuple[tuple[str, str], ...] = ()
    open_upserter: Callable[[Target], ContextManager] | None = None
    #: The batch's age when the driver started the job, which its rows' TTLs count from.
    age: BatchAge | None = None
    #: A WAL on a store: its URI and how the driver reaches it (keys inside), where every
    #: task reads its segment (:func:`segment_file`); None for a local or mounted WAL.
    store_uri: str | None = None
    access: StoreAccess | None = None


def segment_tasks(seal: Seal, next_segment: int, next_chunk: int,
                  acknowledged: Iterable[int] = ()) -> list[SegmentTask]:
    """The segments of ``seal`` not acknowledged yet: from (``next_segment``, ``next_chunk``)
    on, but those ``acknowledged`` whole already."""
    offsets, done = seal.row_offsets(), set(acknowledged)
    return [SegmentTask(i, seal.segments[i], offsets[i], next_chunk if i == next_segment else 0)
            for i in range(next_segment, len(seal.segments)) if i not in done]


# -- executor side -------------------------------------------------------------------------------
@contextlib.contextmanager
def segment_file(job: SegmentJob, task: SegmentTask) -> Iterator[str]:
    """A path to read the task's segment at: in the WAL folder (local or mounted at the same
    path on every node), or, for a WAL on a store, a private temporary copy of the store's
    object (every task reads there, on the driver's host too), removed after."""
    if job.store_uri is None:
        path = WalDir(job.wal_root).segment_path(task.segment.name)
        if not os.path.exists(path):
            # The driver read it when it ingested the batch: this host does not see the path.
            raise FlushFailed(job.batch, f"segment {task.segment.name} is not visible on "
                              f"executor host {socket.gethostname()} at {path}: "
                              "wal.flush.mode=executors needs the WAL folder mounted at the "
                              "same path on every node", permanent=True)
        yield path
        return
    use_access(job.access or StoreAccess())
    data = RemoteWal.at(job.store_uri).read_segment(task.segment.name)
    if data is None:
        # Sealed and not acknowledged, so not deleted by this WAL's flusher: lost.
        raise WalCorrupted(f"{job.store_uri.rstrip('/')}/segments/{task.segment.name}",
                           "a sealed segment is missing from the store, and no flusher of "
                           "this WAL marked its batch written",
                           batch=job.batch, partition=task.segment.partition,
                           segment=task.segment.name)
    spool = spool_dir(job.store_uri)
    make_private_dirs(spool)
    with tempfile.NamedTemporaryFile(dir=spool, suffix=".seg") as copy:
        copy.write(data)
        copy.flush()
        yield copy.name


def write_segment(job: SegmentJob, task: SegmentTask, upserter,
                  age: BatchAge | None = None) -> int:
    """Verify one segment against its seal, then write its chunks from ``task.first_chunk``;
    TTLs count down from ``age`` (the job's, as this process received it)."""
    with segment_file(job, task) as path:
        return _write_segment_file(job, task, path, upserter, age)


def _write_segment_file(job: SegmentJob, task: SegmentTask, path: str, upserter,
                        age: BatchAge | None) -> int:
    reader = SegmentReader(path, job.batch, task.segment.partition, task.segment.name)
    reader.verify(expect=task.segment)      # the whole file, before a row of it is written

    def unwritten() -> Iterator[tuple]:
        first_row = task.first_row
        for chunk in reader.chunks():       # each chunk's checksum is checked again as read
            if chunk.index >= task.first_chunk:
                yield chunk.record_batch(), job.base_ts_us + first_row, chunk.rows
            first_row += chunk.rows

    # The next chunk is read and decoded while this one's rows are in flight.
    return sum(upserter.write_chunks(unwritten(), job.batch, age=age or job.age))


def write_segments(job: SegmentJob, tasks: Iterable[SegmentTask]) -> Iterator[SegmentResult]:
    """The function each Spark task runs (:func:`sinks.worker.flush_task.run_partition` calls it):
    every task of this partition, on this worker's kept
    session (:mod:`recovery.sessions`: one per worker and target, reused by its next tasks).
    The driver's measure of the batch's age is counted on from here (on another machine than
    the driver's; on the driver's, from its own reading: :meth:`BatchAge.received`)."""
    age = job.age.received() if job.age is not None else None
    tasks, host = list(tasks), socket.gethostname()
    if not tasks:
        return
    opener = job.open_upserter or kept_upserter
    with contextlib.ExitStack() as stack:
        try:
            upserter = stack.enter_context(opener(job.target))
        except Exception as exc:  # noqa: BLE001 - no session: every task here failed
            yield from (SegmentResult(t.index, 0, portable_error(exc), host) for t in tasks)
            return
        for task in tasks:
            try:
                rows = write_segment(job, task, upserter, age)
            except Exception as exc:  # noqa: BLE001 - returned to the driver, which decides
                yield SegmentResult(task.index, 0, portable_error(exc), host)
                continue
            with _armed(job.crash_env):
                crash_point("flush.task_written")
            yield SegmentResult(task.index, rows, None, host)


@contextlib.contextmanager
def _armed(env: tuple[tuple[str, str], ...]):
    """The driver's crash-point variables in this worker for a moment (tests; empty otherwise)."""
    if not env:
        yield
        return
    saved = {k: os.environ.get(k) for k, _ in env}
    os.environ.update(dict(env))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _crash_env() -> tuple[tuple[str, str], ...]:
    return tuple((k, os.environ[k]) for k in (ENV_POINT, ENV_SCOPE, ENV_ONCE) if os.environ.get(k))


# -- driver side ---------------------------------------------------------------------------------
JobRunner = Callable[[int, list, Callable], list]


class SparkJobs(Protocol):
    """Runs a flush job on Spark (``sinks.driver.spark_jobs``, which is Spark-facing): ``fn`` over
    ``tasks``, one task each; raises :class:`~recovery.cql.errors.FlushFailed` if the job fails."""

    def __call__(self, batch: int, tasks: list, fn: Callable) -> list: ...

    def active(self) -> bool:
        """Whether Spark can still run a job (it stops before the query's last drain may)."""

    def carries_secrets(self) -> bool:
        """Whether a job's closure may hold the target's credentials on its way to the tasks."""

    def on_a_cluster(self) -> bool:
        """Whether Spark runs its executors apart from the driver (``wal.flush.mode=auto``)."""


def may_carry_credentials(target: Target, spark_jobs: SparkJobs) -> bool:
    """Whether ``spark_jobs`` may run a flush job of ``target``: no secret to send, or a
    closure that keeps it (:meth:`SparkJobs.carries_secrets`: through Spark Connect, only
    over TLS). Otherwise the rows are written from this process."""
    return not target.has_secrets() or spark_jobs.carries_secrets()


class ExecutorsWriter:
    """A :class:`~recovery.replay.RowWriter` whose rows are written by Spark tasks.

    ``target`` is called once per batch: the flusher's target with its newest credentials.
    ``run_job`` and ``open_upserter`` are injectable for tests (a job run in this process, a
    fake Upserter)."""

    reads_log = False      # each task reads its segment where the staging task left it

    def __init__(self, run_job: JobRunner, wal_root: str, target: Callable[[], Target],
                 open_upserter: Callable[[Target], ContextManager] | None = None,
                 store_uri: str | None = None):
        self._run_job, self.wal_root, self._target = run_job, wal_root, target
        self._open_upserter, self.store_uri = open_upserter, store_uri

    @classmethod
    def on_spark(cls, spark_jobs: SparkJobs, wal_root: str, target: Callable[[], Target],
                 store_uri: str | None = None):
        """``store_uri``: the WAL's store (HDFS, S3), where every task reads its segment (a
        store that does not answer fails the task's segment as transient: retried)."""
        return cls(spark_jobs, wal_root, target, store_uri=store_uri)

    @classmethod
    def on_processes(cls, processes: int, wal_root: str, target: Callable[[], Target],
                     store_uri: str | None = None):
        """``wal.flush.mode=processes``: the tasks run in worker processes of this one, each
        keeping its session from batch to batch (:mod:`recovery.processes`); ``store_uri``
        as for :meth:`on_spark`."""
        return cls(ProcessPool(processes), wal_root, target, open_upserter=kept_upserter,
                   store_uri=store_uri)

    @property
    def reads_store(self) -> bool:
        return self.store_uri is not None

    def reset(self) -> None:
        """After a failed flush: worker processes (and their sessions) are closed, the next
        batch starts anew; Spark's Python workers keep theirs (:mod:`recovery.sessions`: the
        cassandra-driver reconnects a session whose nodes went away, and other options are another
        target, with a session of its own)."""
        self.close()

    def close(self) -> None:
        close = getattr(self._run_job, "close", None)
        if close is not None:
            close()

    def write(self, wal_log: WalLog, seal: Seal, record: BatchRecord,
              age: BatchAge | None = None) -> Iterator[Acknowledged | SegmentAcknowledged]:
        done = {segment for segment, _ in record.acknowledged}
        tasks = segment_tasks(seal, record.next_segment, record.next_chunk, done)
        if not tasks:
            return
        # The batch's age as this driver measured it, read again as the job starts: what the
        # tasks' TTLs count down from, whatever their hosts' clocks say.
        age = (age or batch_age.measure(seal.sealed_at_us)).rebased(clock.monotonic_ns())
        # The target writing the way the batch was sealed (columns, TTL, write time, nulls).
        job = SegmentJob(self.wal_root, seal.batch, seal.base_ts_us,
                         self._target().as_sealed(seal.write),
                         _crash_env(), self._open_upserter, age, self.store_uri,
                         current_access().for_uri(self.store_uri) if self.store_uri else None)
        if len(pickle.dumps(job)) > CLOSURE_LIMIT:
            raise SinkError(f"batch {seal.batch}: the flush job's closure is over "
                            f"{CLOSURE_LIMIT} bytes and would be written to disk by PySpark; "
                            "use wal.flush.mode=driver")
        started = clock.monotonic()
        try:
            got, lost = self._run_job(seal.batch, tasks, partial(write_segments, job)), None
        except FlushJobIncomplete as exc:      # the tasks that answered keep their segments
            got, lost = exc.results, exc
        returned = {r.index: r for r in got}
        outcomes = [returned.get(t.index) or SegmentResult(t.index, 0, lost or FlushFailed(
            seal.batch, f"segment {t.segment.name}: its task returned no result"))
            for t in tasks]
        rows, by_index = 0, {o.index: o for o in outcomes}
        first_failed = next((o.index for o in outcomes if o.error is not None), None)
        # Seal order: progress is a prefix of the batch, passing segments acknowledged before;
        # after the first failure, each segment written whole is acknowledged on its own.
        for index in range(record.next_segment, len(seal.segments)):
            if index == first_failed:
                break
            outcome = by_index.get(index)
            rows += outcome.rows if outcome is not None else 0
            yield Acknowledged(index + 1, 0, outcome.rows if outcome is not None else 0)
        for outcome in outcomes:
            if first_failed is not None and outcome.index > first_failed \
                    and outcome.error is None:
                rows += outcome.rows
                yield SegmentAcknowledged(outcome.index, outcome.rows)
        failed = [o for o in outcomes if o.error is not None]
        for f in failed:
            log.warning("batch %d: segment %d failed on %s: %s", seal.batch, f.index,
                        f.host or "?", f.error)
        if failed:   # what no retry cures first (corruption before all): it blocks the sink
            corrupted = [f for f in failed if isinstance(f.error, WalCorrupted)]
            permanent = [f for f in failed if not is_transient(f.error)]
            raise (corrupted or permanent or failed)[0].error
        log.info("batch %d: %d segment(s), %d rows written by %s in %.1f s", seal.batch,
                 len(tasks), rows, getattr(self._run_job, "label", "executor tasks"),
                 clock.monotonic() - started)
