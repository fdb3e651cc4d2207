"""Bring Cassandra up to date with the WAL, batch by batch, in order.

This is the one code path that writes sealed batches: the sink's flusher runs it after every
micro-batch (``RecoveryPolicy.QUERY_FLUSHER``: undecided batches wait), a query start runs it
before the first batch (``QUERY_START``: batches Spark never committed are discarded, since
Spark re-runs them with the same id; ``replay=False`` in the scale-out modes: only that, the
backlog left to the flusher's drains), ``cassandra-wal recover`` runs it offline (``OFFLINE``,
``OFFLINE_FORCED``) and a batch job at its commit (``BATCH_JOB``):
:class:`~wal.recovery_policy.RecoveryPolicy` says what each does.

Rules (docs/guarantees.md): batches go in increasing id; a batch that cannot be written stops
the run, and no later batch is written before it; a batch is replayed from its recorded
progress with the timestamps fixed in its seal; corrupted data is never written.

*How* the rows get to Cassandra is a :class:`RowWriter`, and only that: the Replayer alone
ingests, records progress, marks FLUSHED and removes files, whichever writer it is given.
:class:`DriverWriter` (``wal.flush.mode=driver``, and every recovery) writes from the log,
chunk by chunk, in this process; :class:`recovery.executors.ExecutorsWriter`
(``wal.flush.mode=executors``) has Spark tasks write the segments.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from recovery.cql import batch_age
from recovery.cql.batch_age import BatchAge
from wal import catalog
from wal import clock
from wal.amendments import amended
from wal.catalog import BatchView, RecoveryAction, ViewState
from wal.crashpoints import crash_point
from wal.errors import WalCorrupted
from wal.layout import WalDir
from wal.log import BatchRecord, WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.retention import (
    RetentionPolicy,
    apply_retention,
    remove_batch_files,
    remove_unsealed_segments,
)
from wal.seal import Seal, now_us
from wal.segment import decode_chunk
from wal.states import BatchState

from .errors import RecoveryBlocked

log = logging.getLogger(__name__)

RUNBOOK = "See docs/runbook.md ('A corrupted WAL')."
#: A batch a foreachBatch writer was called for and sealed nothing, which Spark committed.
RUNBOOK_LOST = "See docs/runbook.md ('A batch a foreachBatch function lost')."


@dataclass
class Progress:
    batch: int
    rows_done: int
    rows_total: int
    started: float = field(default_factory=clock.monotonic)

    @property
    def rate(self) -> float:
        elapsed = clock.monotonic() - self.started
        return self.rows_done / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        return (self.rows_total - self.rows_done) / rate if rate > 0 else None


@dataclass
class ReplayReport:
    replayed: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    rows_written: int = 0
    waiting_at: int | None = None
    #: The first committed batch a run with ``replay=False`` left to write (and every one after)
    backlog_from: int | None = None
    removed_by_retention: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class WrittenBatch:
    """A batch the Replayer just marked FLUSHED: what the flusher logs and counts.
    ``resumed``: the log held it already (an earlier drain or run began it)."""

    batch: int
    rows: int
    bytes: int
    sealed_at_us: int
    flushed_at_us: int
    resumed: bool

    @property
    def latency_s(self) -> float:
        """From its seal (Spark's commit follows at once) to its rows all in Cassandra."""
        return max(0.0, (self.flushed_at_us - self.sealed_at_us) / 1e6)


@dataclass(frozen=True)
class Acknowledged:
    """Cassandra acknowledged ``rows`` more rows of a batch: every row before chunk
    ``next_chunk`` of segment ``next_segment`` (seal order) is now written."""

    next_segment: int
    next_chunk: int
    rows: int


@dataclass(frozen=True)
class SegmentAcknowledged:
    """Cassandra acknowledged every row (``rows``) of segment ``segment``, beyond the prefix
    acknowledged so far (an earlier segment failed): a retry does not write it again."""

    segment: int
    rows: int


class RowWriter(Protocol):
    """Writes the rows of one batch that are not acknowledged yet; nothing else.

    ``write`` starts at ``(record.next_segment, record.next_chunk)``, skips the segments
    ``record.acknowledged`` names, writes row *i* of the batch at ``seal.base_ts_us + i``, and
    yields acknowledgements: :class:`Acknowledged`, in seal order, each one a longer prefix of
    the batch (a skipped segment adds no rows), then, after a segment failed, a
    :class:`SegmentAcknowledged` for each later segment written whole. It raises :class:`~wal.errors.WalCorrupted` before writing
    any row of a damaged chunk or segment, and :class:`~recovery.cql.errors.FlushFailed` (or a
    connection error) when rows were not acknowledged. It never touches the log's states:
    recording progress and marking the batch are the Replayer's. TTLs count down from
    ``age``, the batch's age as this process measured it (:mod:`recovery.cql.batch_age`; None: measured
    now), whatever process writes the rows and whatever its clock says.
    """

    #: Whether it reads the batch's rows from the log (the Replayer has them copied in when
    #: it ingests the batch, or later: :meth:`WalLog.copy_rows <wal.log.WalLog.copy_rows>`);
    #: False: its tasks read the sealed segments where they are, and the log keeps the seal
    #: alone (the segments verified by the driver when it ingests the batch)
    reads_log: bool
    #: Whether its tasks read the segments from the WAL's store (HDFS, S3), each verifying
    #: its own: the driver's working copy fetches none, and checks none of them first
    reads_store: bool

    def write(self, wal_log: WalLog, seal: Seal, record: BatchRecord,
              age: BatchAge | None = None
              ) -> Iterator[Acknowledged | SegmentAcknowledged]: ...

    def reset(self) -> None:
        """Forget any open session (it was closed after a failure)."""


class DriverWriter:
    """``wal.flush.mode=driver``: the log's chunks, in order, through an
    :class:`~recovery.cql.upsert.Upserter` in this process. ``upserter_factory(seal)`` gives the
    Upserter that writes the way ``seal`` recorded (columns, TTL, write time, nulls); the
    factory keeps the session and its Upserters (``recovery.output.CassandraOutput``)."""

    reads_log, reads_store = True, False

    def __init__(self, upserter_factory: Callable[[Seal], object] | None):
        self._factory = upserter_factory

    def reset(self) -> None:
        """Nothing of its own to forget: the factory's owner closed the session."""

    def write(self, wal_log: WalLog, seal: Seal, record: BatchRecord,
              age: BatchAge | None = None) -> Iterator[Acknowledged]:
        age = age or batch_age.measure(seal.sealed_at_us)
        done = {segment for segment, _ in record.acknowledged}   # by another mode's tasks
        chunks = (c for c in wal_log.chunks(seal.batch, record.next_segment, record.next_chunk)
                  if c.segment_index not in done)
        first = next(chunks, None)
        if first is None:
            return
        upserter = self._factory(seal)   # connect only when there is a row to write
        tagged = ((decode_chunk(chunk.payload), seal.base_ts_us + chunk.first_row,
                   Acknowledged(chunk.segment_index, chunk.chunk_index + 1, chunk.rows))
                  for chunk in itertools.chain([first], chunks))
        # The next chunk is read, checked and decoded while this one's rows are in flight.
        yield from upserter.write_chunks(tagged, seal.batch, age=age)


class Replayer:
    """Executes recovery's plan with one WAL writer; rows go through a :class:`RowWriter`
    (by default a :class:`DriverWriter` over ``upserter_factory``)."""

    def __init__(self, wal: WalDir, wal_log: WalLog,
                 upserter_factory: Callable[[Seal], object] | None,
                 checkpoint: str | None, retention: RetentionPolicy | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 crash_prefix: str = "flush", writer: RowWriter | None = None,
                 on_written: Callable[[WrittenBatch], None] | None = None,
                 before_write: Callable[[Seal], None] | None = None):
        self.wal, self.wal_log, self.checkpoint = wal, wal_log, checkpoint
        self.on_written = on_written
        self.before_write = before_write    # each flush of a batch, ingested, before its rows
        self.writer = writer if writer is not None else DriverWriter(upserter_factory)
        self.retention = retention
        self.on_progress = on_progress
        self._crash_prefix = crash_prefix
        #: (Spark's runId, its first batch) of the run flushed for (catalog.describe)
        self.current_run: tuple[str, int] | None = None
        # The age of each sealed batch still to write, measured when this process first saw
        # it and counted on on its monotonic clock (recovery.cql.batch_age): its rows' TTLs count from it.
        self._ages: dict[tuple[int, str, int], BatchAge] = {}

    def plan(self, policy: RecoveryPolicy,
             committed: tuple[int, list[int] | None] | None = None) -> list[BatchView]:
        return catalog.describe(self.wal, self.wal_log, self.checkpoint, policy,
                                committed=committed, current_run=self.current_run)

    def run(self, policy: RecoveryPolicy, crash_prefix: str | None = None,
            writer: RowWriter | None = None, replay: bool = True) -> ReplayReport:
        """Act on the plan recovery under ``policy`` makes. ``crash_prefix`` names this run's
        crash points (tests only); ``writer`` replaces :attr:`writer` for this run's batches.
        ``replay`` False: write nothing, only discard what Spark never committed (a scale-out
        query's start, whose committed backlog its flusher's thread writes after): from the
        first batch to replay on, only discards are done (``report.backlog_from`` names that
        batch), and a batch no replay may pass still blocks."""
        if crash_prefix:
            self._crash_prefix = crash_prefix
        writer = writer if writer is not None else self.writer
        report, started = ReplayReport(), clock.monotonic()
        committed = catalog.committed_through(self.wal_log, self.checkpoint)
        if self.wal.remote:
            # The store is the WAL: bring what it holds into the working copy, *after* reading
            # Spark's commits. Spark writes commits/N only once N's seal is published, so every
            # seal pulled now of a batch read as committed is the one Spark committed; a seal
            # pulled before commits/N was read could be an aborted run's, replaced since.
            # Segments: only their batches' folders for tasks that read them from the store,
            # or for a run that writes nothing (a scale-out start's discards).
            self.wal.remote.pull(self.wal.root, fetch=replay and not writer.reads_store)
        self.note_committed(committed)
        staged = set(self.wal.staged_batch_ids())
        views = self.plan(policy, committed)
        self._take_in_hand(views)
        for view in views:
            if report.backlog_from is not None and view.action not in (RecoveryAction.DISCARD,
                                                                    RecoveryAction.ERROR):
                continue          # behind a batch left to write: nothing may be marked done
            if view.action == RecoveryAction.REPLAY and not replay:
                report.backlog_from = view.batch
                continue
            if view.action == RecoveryAction.NOTHING:
                if view.state is ViewState.SKIPPED:
                    # Nothing of it to write, and every batch before it done: mark it done
                    # too, so that "flushed through" (wait_flushed, the health) passes it;
                    # what an earlier run left of it is garbage.
                    if view.detail == catalog.LEFT_BY_ANOTHER_RUN:
                        remove_batch_files(self.wal, view.batch)
                    self.wal_log.note_skipped(view.batch)
                    self.wal.write_flushed_through(view.batch)
                    continue
                if view.state is ViewState.FLUSHED:
                    # Its flushed marker first (a crash, or a store that failed, may have
                    # come between marking the batch and writing it): a working copy rebuilt
                    # elsewhere must never replay a batch whose segments are gone.
                    self.wal.write_flushed_through(view.batch)
                if view.batch in staged and (view.state is ViewState.FLUSHED
                                             or view.detail == catalog.LATE_ATTEMPT):
                    # A crash between marking the batch and removing its files (the last
                    # step of flush), or a task attempt that staged after its batch was done:
                    # remove them, or they stay forever and count against wal.maxBytes. Spark
                    # never re-runs a committed batch, so no attempt that matters can be
                    # staging into this folder.
                    remove_batch_files(self.wal, view.batch, keep_seal=True)
                    log.info("removed the staged files of batch %d (%s)", view.batch,
                             view.detail or "flushed before a crash removed them")
                continue
            if view.action == RecoveryAction.WAIT:
                report.waiting_at = view.batch
                break
            if view.action == RecoveryAction.ERROR:
                raise RecoveryBlocked(view.batch, view.detail,
                                      RUNBOOK_LOST if view.detail == catalog.ENTERED_NOT_SEALED
                                      else RUNBOOK)
            if view.action == RecoveryAction.DISCARD:
                self.discard(view)
                report.discarded.append(view.batch)
            elif view.action == RecoveryAction.REPLAY and view.record is not None \
                    and self._written_elsewhere(view.batch):
                self._mark_written_elsewhere(view.record)
            elif view.action == RecoveryAction.REPLAY:
                try:
                    report.rows_written += self.flush(view, writer)
                except _WrittenElsewhere:
                    continue
                report.replayed.append(view.batch)
                if self.on_written is not None:
                    seal = view.seal or view.record.seal
                    self.on_written(WrittenBatch(view.batch, seal.rows, seal.bytes,
                                                 seal.sealed_at_us, now_us(),
                                                 resumed=view.record is not None))
        if self.retention is not None:
            report.removed_by_retention = apply_retention(self.wal, self.wal_log, self.retention)
        report.seconds = clock.monotonic() - started
        return report

    def _take_in_hand(self, views: list[BatchView]) -> None:
        """Measure the age of every sealed batch to write or wait for that this process has not
        measured yet (:func:`recovery.cql.batch_age.measure`): at once, so that a wall clock stepping while
        the batches wait (an outage, the batches before them) does not move their rows'
        expiry; and forget those no longer pending."""
        ages: dict[tuple[int, str, int], BatchAge] = {}
        for view in views:
            seal = view.seal or (view.record.seal if view.record is not None else None)
            if seal is None or view.action not in (RecoveryAction.REPLAY, RecoveryAction.WAIT):
                continue
            key = _age_key(seal)
            ages[key] = self._ages.get(key) or batch_age.measure(seal.sealed_at_us)
        self._ages = ages

    def age_of(self, seal: Seal) -> BatchAge:
        """The age of ``seal``'s batch as this process measured it (now, the first time)."""
        key = _age_key(seal)
        if key not in self._ages:
            self._ages[key] = batch_age.measure(seal.sealed_at_us)
        return self._ages[key]

    def note_committed(self, committed: tuple[int, list[int] | None] | None = None) -> None:
        """Record in the log the highest batch Spark's checkpoint shows committed, before Spark
        purges its ``commits/N`` (``catalog.committed_through``, or ``committed`` as read)."""
        highest, listed = committed or catalog.committed_through(self.wal_log, self.checkpoint)
        if listed:
            self.wal_log.note_committed(highest)

    def discard(self, view: BatchView) -> None:
        self.wal_log.discard(view.batch, "never committed by Spark")
        remove_batch_files(self.wal, view.batch)
        log.info("discarded batch %d (never committed by Spark)", view.batch)

    def reset_output(self) -> None:
        """Forget the Upserter (its session was closed): the next flush makes a new one."""
        self.writer.reset()

    def flush(self, view: BatchView, writer: RowWriter | None = None) -> int:
        """Ingest (if needed), write every not-yet-acknowledged row, mark FLUSHED."""
        writer = writer if writer is not None else self.writer
        batch = view.batch
        crash_point(f"{self._crash_prefix}.before_ingest")
        try:
            record = view.record or self.wal_log.ingest(view.seal, copy_rows=writer.reads_log,
                                                    verify=not writer.reads_store)
            if writer.reads_log and not record.rows_in_log:   # a scale-out writer's before
                record = self.wal_log.copy_rows(batch)
        except WalCorrupted as exc:
            self._unless_written_elsewhere(view)
            raise RecoveryBlocked(batch, str(exc), RUNBOOK) from None
        seal = amended(self.wal, record.seal)     # as an operator decided, if one did
        if self.before_write is not None:
            self.before_write(seal)
        remove_unsealed_segments(self.wal, batch, {s.name for s in seal.segments})
        if record.state == BatchState.SEALED:
            record = self.wal_log.begin_flush(batch)
        progress = Progress(batch, record.flushed_rows, seal.rows)
        # Rows of segments acknowledged beyond the prefix, not yet passed by it: the prefix's
        # own rows are what a progress key records.
        beyond = dict(record.acknowledged)
        written = 0
        try:
            for ack in writer.write(self.wal_log, seal, record, self.age_of(seal)):
                written += ack.rows
                progress.rows_done += ack.rows
                if isinstance(ack, SegmentAcknowledged):
                    beyond[ack.segment] = ack.rows
                    self.wal_log.record_acknowledged(batch, ack.segment, ack.rows)
                else:
                    for segment in [s for s in beyond if s < ack.next_segment]:
                        del beyond[segment]
                    self.wal_log.record_progress(batch, ack.next_segment, ack.next_chunk,
                                             progress.rows_done - sum(beyond.values()))
                if self.on_progress:
                    self.on_progress(progress)
                crash_point(f"{self._crash_prefix}.mid")
        except WalCorrupted as exc:
            self._unless_written_elsewhere(view)
            raise RecoveryBlocked(batch, str(exc), RUNBOOK) from None
        crash_point(f"{self._crash_prefix}.before_mark")
        self.wal_log.mark_flushed(batch)
        self.wal.write_flushed_through(batch)
        # Rows copied into the log stay there for retention; the staged files go, so that the
        # segments folder holds exactly the backlog that wal.maxBytes caps.
        remove_batch_files(self.wal, batch, keep_seal=True)
        self._ages.pop(_age_key(seal), None)
        log.info("flushed batch %d: %d rows", batch, seal.rows)
        return written

    def _written_elsewhere(self, batch: int, store_now: bool = False) -> bool:
        """Whether another flusher of this WAL wrote ``batch`` whole (a ``cassandra-wal
        recover`` on another host, which may then have removed its segments). Known only of a
        WAL on a store, from its shared flushed marker, which moves only after every row was
        acknowledged: as this working copy last pulled it, or (``store_now``) as the store
        holds it now."""
        if self.wal.remote is None:
            return False
        marker = (self.wal.remote.flushed_through() if store_now
                  else self.wal.read_flushed_through())
        return batch <= marker

    def _unless_written_elsewhere(self, view: BatchView) -> None:
        """The batch's segments went while this flush read them: if another flusher wrote the
        batch whole meanwhile (:meth:`_written_elsewhere`), mark it here and say so with
        :class:`_WrittenElsewhere`, rather than block on a loss that is none. Otherwise
        return: the damage is real."""
        if not self._written_elsewhere(view.batch, store_now=True):
            return
        self.wal.remote.pull_state(self.wal.root)
        record = self.wal_log.get(view.batch) or self.wal_log.ingest(view.seal, copy_rows=False,
                                                               verify=False)
        self._mark_written_elsewhere(record)
        raise _WrittenElsewhere(view.batch)

    def _mark_written_elsewhere(self, record: BatchRecord) -> None:
        if record.state == BatchState.SEALED:
            self.wal_log.begin_flush(record.batch)
        self.wal_log.mark_flushed(record.batch)
        remove_batch_files(self.wal, record.batch, keep_seal=True)
        log.warning("batch %d was written whole by another flusher of this WAL on %s (its "
                    "flushed marker is at %d): marked flushed here, not written again",
                    record.batch, self.wal.location, self.wal.read_flushed_through())


class _WrittenElsewhere(Exception):
    """Another flusher of the WAL wrote the batch whole while this one flushed it
    (:meth:`Replayer._unless_written_elsewhere`): marked here, nothing more to do."""


def _age_key(seal: Seal) -> tuple[int, str, int]:
    return (seal.batch, seal.seal_id, seal.sealed_at_us)
