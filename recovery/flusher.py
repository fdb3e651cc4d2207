"""The per-query flusher: the single owner of a stream's WAL log in the driver process, which
writes every batch Spark committed, in order, and blocks the sink on what no retry cures.

Driven by the listener of :mod:`sinks.driver.registry` (which is Spark-facing); everything here runs
in the driver process:

* at query start (``recover``, synchronous, before the first batch): discard what Spark never
  committed (it re-runs those batches with the same ids) and, in ``driver`` mode, replay what
  it committed and the WAL did not finish; the scale-out modes leave that backlog to the
  thread's first drain, through their Spark tasks or worker processes;
* from its start, in its thread: the session is connected (``warm_up``), before the first
  batch to write;
* after each commit (seen in a local checkpoint's ``commits/``, or a ``kick`` from the
  listener's progress event): the flusher's thread drains the WAL through the
  :class:`~recovery.replay.Replayer`, with the row writer of ``wal.flush.mode`` (the driver
  itself, Spark tasks, or worker processes: :mod:`recovery.executors`); it alone records
  progress and marks batches flushed;
* at query end (``stop``): a last drain, retried for a while if Cassandra is away.

A flush that fails transiently (:func:`~recovery.errors.is_transient`: Cassandra down) leaves
its batch in the WAL and is retried while the query goes on staging (bounded by
``wal.maxBytes``). A failure no retry cures (corruption, Cassandra refusing the rows) blocks
the sink: ``blocked.json`` makes the next commit fail with the reason, until a drain gets
through.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from tenacity import (
    Retrying,
    retry_if_result,
    stop_when_event_set,
    wait_fixed,
)

from recovery.cql import credentials
from wal import catalog
from wal import checkpoint as ckpt
from wal import clock
from wal.binding import bind
from wal.catalog import RecoveryAction
from wal.entries import entries_since, record_run
from wal.errors import StoreUnavailable, WalCorrupted, WalStorageError
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.retention import RetentionPolicy
from wal.schemes import is_local
from wal.seal import Seal

from . import events
from .errors import (SINK_ERRORS, ColumnDroppedAfterSeal, RecoveryBlocked, is_shutdown_error,
                     is_transient)
from .executors import ExecutorsWriter, SparkJobs, may_carry_credentials
from .health import LAG_AFTER_S, FlushCounters, Health, HealthState, read_health
from .marker import MarkerWriter, marker_query_id, write_marker
from .output import CassandraOutput, sealed_rows
from .recover import open_writer_waiting
from .replay import RUNBOOK_LOST, Replayer, WrittenBatch
from .target import RecordedTarget, Target

log = logging.getLogger(__name__)

#: How often the flusher looks for Spark's ``commits/N`` of the next batch to write, when the
#: checkpoint is a local folder (one ``stat``): the batch is written as soon as Spark commits
#: it, not when the listener bus delivers the progress event (0.3-0.9 s later on 2 vCPUs,
#: ``bench/batch_timeline.py``). On a store the progress event wakes it (each look would be a
#: request).
COMMIT_POLL_S = 0.025

#: ``wal.flush.mode``'s default: the mode is chosen by where Spark runs and where the WAL is
#: (:meth:`QueryFlusher.flush_mode`).
AUTO = "auto"

#: Retries of a request in recovery at query start (see :meth:`QueryFlusher.recover`).
RECOVERY_RETRIES = 2

BLOCK_REMEDY = ("the flusher tries again every few seconds and the block clears as soon as "
                "it gets past; see docs/runbook.md ('The sink is blocked')")


@dataclass
class Replay:
    """A replay under way: why (recovery at query start, or after which failure), since when
    its first batch was written, and how much it wrote. Started and finished once each in the
    log, however many drains it takes."""

    why: str
    since: float = 0.0
    batches: int = 0
    rows: int = 0


def block_if_lost(wal_root: str, checkpoint: str, run: tuple[str, int] | None = None) -> bool:
    """A WAL no flusher can be made for yet (no batch recorded its target: the first one's
    table lookup failed): block it if Spark committed a batch its foreachBatch writer entered
    and never sealed (the function caught that failure): a loss, said where the query's next
    commit sees it. ``run`` as for :class:`QueryFlusher`. Whether it blocked."""
    wal = WalDir.at(wal_root)
    if wal.remote:          # its entries and seals as the store holds them (this host's copy
        wal.remote.pull(wal.root, segments=False)    # may be another host's, or stale)
    if run is not None and entries_since(wal) is not None:
        record_run(wal, run[1], run[0])
    reader = WalLog.open_reader(wal)
    try:
        views = catalog.describe(wal, reader, checkpoint, RecoveryPolicy.QUERY_FLUSHER,
                                 current_run=run)
    finally:
        if reader is not None:
            reader.close()
    lost = next((v for v in views if v.action == RecoveryAction.ERROR), None)
    if lost is None:
        return False
    reason = (f"RecoveryBlocked: "
              f"{RecoveryBlocked(lost.batch, lost.detail, RUNBOOK_LOST)}")   # as a drain says
    events.blocked(wal.root, reason)
    wal.write_blocked(reason)
    return True


def load_target(wal: WalDir, session_conf: dict | None = None) -> Target:
    """The WAL's recorded target (secret-free) with a stream's credentials
    (:func:`recovery.cql.credentials.of_stream`)."""
    target = RecordedTarget.require(wal).target
    return target.with_credentials(credentials.of_stream(wal.root, session_conf))


def retention_of(target: Target) -> RetentionPolicy:
    wal = target.config.wal
    return RetentionPolicy(keep_batches=wal.retention_batches, keep_seconds=wal.retention_seconds)


class QueryFlusher:
    """Owns one query's WAL log in the driver and flushes committed batches in order."""

    def __init__(self, wal_root: str, checkpoint: str, session_conf: dict | None = None,
                 retry_interval_s: float = 2.0,
                 spark_jobs: SparkJobs | None = None, run: tuple[str, int] | None = None,
                 on_options: Callable[["QueryFlusher"], None] | None = None):
        """``run``: (Spark's runId, the first batch it runs) of the query run this flusher
        belongs to: what a foreachBatch writer's entries are judged by (a batch the run
        committed without entering this WAL's writer has nothing to write here).
        ``on_options``: told each time the flusher takes up the options a restarted query's
        batch recorded (the registry starts the metrics endpoint a new port names)."""
        self.wal = WalDir.at(wal_root)     # a store's WAL: this host's working copy
        self.checkpoint = checkpoint
        self.session_conf = session_conf
        self._on_options = on_options
        # The WAL is this query's (a pointer copied from another checkpoint must not make this
        # query replay, discard or skip another's batches): see wal/binding.py.
        bind(self.wal, checkpoint)
        if run is not None and entries_since(self.wal) is not None:
            record_run(self.wal, run[1], run[0])    # which run ran its batches from there on
        self._fingerprint = self._recorded_fingerprint()
        self.target = load_target(self.wal, session_conf)
        self.wal_log = open_writer_waiting(self.wal, 30)
        self.counters = FlushCounters()        # retries, replays, written: status, metrics
        self.output = self._output(self.target)
        self.replayer = Replayer(self.wal, self.wal_log, lambda seal: self.output.upserter(seal),
                                 checkpoint, retention=retention_of(self.target),
                                 on_written=self._written, before_write=self._before_write)
        self.replayer.current_run = run
        self._lists_said: set[int] = set()     # batches whose unaccepted lists were logged
        self._marker: MarkerWriter | None = None   # marker.table's writer, made on first use
        self._marker_due: int | None = None    # the newest batch written, its marker not yet
        self._replay: Replay | None = None     # the replay under way (recovery.events)
        #: The first committed batch :meth:`recover` left to the thread's drains (scale-out
        #: modes), until a drain gets through; None: nothing left.
        self.backlog_from: int | None = None
        self.spark_jobs = spark_jobs          # executors mode: Spark, as the registry hands it
        self._executors_writer: ExecutorsWriter | None = None
        self._warned_secrets = False
        self._auto_said: str | None = None     # what wal.flush.mode=auto resolved to, said
        self.retry_interval_s = retry_interval_s
        self.last_error: Exception | None = None
        self.failing: str | None = None        # the transient failure drains are retrying
        self._failing_since = 0.0
        self._exiting = False                  # the interpreter exits: no verdicts
        self._blocked_reason: str | None = None
        # Blocked by an earlier run (blocked.json): its first good drain says "unblocked" too.
        self._blocked_before = self.wal.read_blocked() is not None
        self.last_report = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.drains = 0                        # drains finished, whatever their outcome
        self.stopped = threading.Event()       # the final drain is done, the log closed
        self._stop_lock = threading.Lock()
        self._hand_over = threading.Event()    # a new run wants the WAL: stop retrying
        # Where Spark's commits of this query are, when one stat tells (a local checkpoint).
        self._commits_dir = (os.path.join(ckpt.local_path(checkpoint), "commits")
                             if checkpoint and is_local(checkpoint) else None)
        self._seen_committed: int | None = None   # the last commits/N the watch woke for

    # -- runs ----------------------------------------------------------------------------
    def drain(self, policy: RecoveryPolicy, crash_prefix: str = "flush",
              replay: bool = True) -> None:
        """Write what Spark committed, in order, as ``policy`` allows (``QUERY_FLUSHER``, or
        ``QUERY_START`` from :meth:`recover`). A failure a retry may cure
        (:func:`~recovery.errors.is_transient`: Cassandra away, a shared filesystem away)
        keeps its batch for the next drain; any other blocks the sink (:meth:`_block`). A
        drain that gets through clears the block. ``replay`` False: only discard what Spark
        never committed (:meth:`recover` of a scale-out mode)."""
        with self._lock:
            try:
                if self.wal_log.closed or isinstance(self.last_error, WalStorageError):
                    # RocksDB refuses every write after an I/O error until it is reopened
                    # (and a reopen that failed left it closed: tried again now).
                    self.wal_log.reopen()
                self._follow_target()
                if not self.target.config.wal.flush:
                    return
                writer = self._executors() if policy.writes_through_flush_mode else None
                self._replay_due(policy)
                self.last_report = self.replayer.run(policy, crash_prefix, writer,
                                                     replay=replay)
                self._write_marker()
                self.last_error = None
                if replay:
                    self.backlog_from = None
                self._replay_done()
                self._set_blocked(None)
                self._set_failing(None)
            except Exception as exc:  # noqa: BLE001 - each failure is sorted, none is silent
                # Nothing met while the interpreter exits is a verdict on a batch
                # (cassandra-driver's thread pools refuse new work then): the next start of the
                # query writes it.
                if is_transient(exc) or self._exiting:
                    self.last_error = exc   # the batch stays in the WAL, retried in a moment
                    self.counters.count(retries=1)
                    log.warning("cassandra_wal: %s: flush deferred, retried in %.0f s: %s: %s",
                                self.wal.root, self.retry_interval_s, type(exc).__name__, exc)
                    self._set_failing(exc)
                else:
                    self._block(exc)
                if not isinstance(exc, RecoveryBlocked):   # the session may be the cause
                    self._reset_output()
            finally:
                self.drains += 1

    # -- what the operator sees ---------------------------------------------------------
    def health(self, lag_after_s: float = LAG_AFTER_S) -> Health:
        """The WAL's figures (:func:`~recovery.health.read_health`) with this run's retries,
        replays, the failure its drains are retrying, and a block it could not write to
        ``blocked.json`` yet. Any thread: it reads the WAL through a read-only log
        instance."""
        health = read_health(self.wal, self.checkpoint, self.counters, lag_after_s,
                             failing=self.failing)
        reason = self._blocked_reason
        if reason is not None and health.blocked_reason is None:
            health = replace(health, state=HealthState.BLOCKED, blocked_reason=reason)
        return health

    def _replay_due(self, policy: RecoveryPolicy) -> None:
        """A drain that writes what an earlier run (recovery at query start) or an earlier
        drain (a transient failure) left unfinished is a replay: its first batch written
        starts it, its end finishes it (:mod:`recovery.events`)."""
        if self._replay is not None:
            return                       # the last one failed again: still the same replay
        if policy is RecoveryPolicy.QUERY_START:
            self._replay = Replay("recovery at query start")
        elif self.last_error is not None:
            self._replay = Replay(f"after {type(self.last_error).__name__}")

    def _written(self, done: WrittenBatch) -> None:
        """The Replayer marked a batch FLUSHED (flusher's thread, inside a drain)."""
        self._marker_due = done.batch
        replay = self._replay
        if replay is not None and replay.batches == 0:      # said before its first batch's line
            events.replay_started(self.wal.root, done.batch, replay.why)
            replay.since = clock.monotonic()
        events.batch_written(self.wal.root, done.batch, done.rows, done.bytes, done.latency_s)
        self.counters.count(batches_written=1, rows_written=done.rows)
        if replay is None:
            return
        replay.batches += 1
        replay.rows += done.rows
        self.counters.count(replays=1)

    def _before_write(self, seal: Seal) -> None:
        """Before a batch's rows are written: refuse a batch a dropped column would hide
        (:func:`check_not_dropped`), and say once that a batch an earlier release sealed with
        a non-frozen list column is written at least once."""
        self.output.check_not_dropped(seal, self.wal.location,
                                      rows=lambda: sealed_rows(self.wal, self.wal_log, seal))
        if seal.batch in self._lists_said:
            return
        columns = self.target.unaccepted_lists(seal.write)
        if columns:
            self._lists_said.add(seal.batch)
            events.lists_at_least_once(self.wal.root, seal.batch, columns)

    def _replay_done(self) -> None:
        replay, self._replay = self._replay, None
        if replay is not None and replay.batches > 0:
            events.replay_finished(self.wal.root, replay.batches, replay.rows,
                                   clock.monotonic() - replay.since)

    def _write_marker(self) -> None:
        """After a drain that got through: the completeness marker (``marker.table``,
        :mod:`recovery.marker`) of the newest batch written, this drain's, or at a run's first
        drain the newest the log holds written (a run that died before writing it). A failure
        is the drain's: retried (the marker stays due) or blocking, as a batch's would be."""
        if self.target.config.wal.marker_table is None:
            return
        if self._marker is None:
            self._marker = MarkerWriter(self.target, marker_query_id(self.checkpoint))
            if self._marker_due is None:
                self._marker_due = self.wal_log.flushed_through()
        if self._marker_due is not None:
            write_marker(self._marker, self.wal_log, self.target, self.checkpoint,
                         self._marker_due, self.output.session_of)
        self._marker_due = None     # written, or not held written: the next batch's will come

    def _recorded_fingerprint(self) -> str | None:
        try:
            return (RecordedTarget.read(self.wal) or RecordedTarget(None)).fingerprint
        except WalCorrupted:
            return None

    def _follow_target(self) -> None:
        """Take up the options of the query as it runs now. The flusher is made at query start,
        before the restarted query's first batch records its options in ``target.json``: a
        restart may have turned ``wal.flush`` on, moved the contact points, changed the
        consistency level or ``wal.flush.mode``. Rows already sealed keep their timestamps;
        only where and how they are written follows."""
        fingerprint = self._recorded_fingerprint()
        if fingerprint is None or fingerprint == self._fingerprint:
            return
        target = load_target(self.wal, self.session_conf)
        self._reset_output()
        self.target, self._fingerprint = target, fingerprint
        self.output = self._output(target)
        self.replayer.retention = retention_of(target)
        self._marker = None        # the marker's table, or the consistency, may have changed
        self._close_executors()
        log.info("cassandra_wal: %s: the query's options changed; flushing with the new ones",
                 self.wal.root)
        if self._on_options is not None:
            self._on_options(self)

    def _output(self, target: Target) -> CassandraOutput:
        """The session and Upserters of the driver's writes; each retry of requests that
        failed transiently counts as a retry."""
        return CassandraOutput(target, self.wal.root, self.session_conf,
                               on_retry=lambda: self.counters.count(retries=1))

    def flush_mode(self) -> str:
        """The mode this flusher writes in now: ``wal.flush.mode``, ``auto`` resolved
        (:data:`AUTO`): ``executors`` when Spark runs executors apart from the driver or the
        WAL is on a store, and Spark can run a job; else ``driver``."""
        mode = self.target.config.wal.flush_mode
        if mode != AUTO:
            return mode
        scale_out = (self.spark_jobs is not None and self.spark_jobs.active()
                     and (self.wal.remote is not None or self.spark_jobs.on_a_cluster()))
        mode = "executors" if scale_out else "driver"
        if mode != self._auto_said:
            self._auto_said = mode
            log.info("cassandra_wal: %s: wal.flush.mode=auto: batches written by %s", self.wal.root,
                     "Spark tasks on the executors" if scale_out else "the driver")
        return mode

    def _executors(self) -> ExecutorsWriter | None:
        """The segment writer of ``wal.flush.mode=processes`` (worker processes), or of
        ``executors`` when Spark is up; else None (the Replayer's own driver-side writer)."""
        wal = self.target.config.wal
        mode = self.flush_mode()
        if mode == "driver":
            return None
        if mode == "executors" and (self.spark_jobs is None or not self.spark_jobs.active()):
            if self.spark_jobs is not None:
                log.warning("cassandra_wal: Spark is stopped: batch flushed from the driver")
            return None
        if mode == "executors" and not may_carry_credentials(self.output.current_target(),
                                                              self.spark_jobs):
            if not self._warned_secrets:
                self._warned_secrets = True
                log.warning("cassandra_wal: %s: flushing from the executors (wal.flush.mode=%s) "
                            "through Spark Connect without TLS would send the Cassandra "
                            "credentials to the server in the plan: batches are flushed from "
                            "this process (connect with sc://...;use_ssl=true)", self.wal.root,
                            self.target.config.wal.flush_mode)
            return None
        if self._executors_writer is None:
            if mode == "processes":
                self._executors_writer = ExecutorsWriter.on_processes(
                    wal.flush_processes, self.wal.root, self.output.current_target,
                    store_uri=self.wal.remote.uri if self.wal.remote else None)
            else:
                self._executors_writer = ExecutorsWriter.on_spark(
                    self.spark_jobs, self.wal.root, self.output.current_target,
                    store_uri=self.wal.remote.uri if self.wal.remote else None)
        return self._executors_writer

    def _close_executors(self) -> None:
        if self._executors_writer is not None:
            self._executors_writer.close()
            self._executors_writer = None

    def _block(self, exc: Exception) -> None:
        """Nothing later may be flushed before this batch: say so where the next commit sees
        it (blocked.json), so the query fails with the reason instead of staging forever."""
        reason = f"{type(exc).__name__}: {exc}"
        # A RecoveryBlocked's own text names the runbook's remedy; a drop's block clears too
        # once the operator's amendment lets the flusher get past.
        if not isinstance(exc, RecoveryBlocked) or isinstance(exc, ColumnDroppedAfterSeal):
            reason = f"{reason}; {BLOCK_REMEDY}"
        if reason != self._blocked_reason:   # retried every few seconds: say it once
            # An error of no family of ours is a bug: its traceback is what to report.
            typed = isinstance(exc, SINK_ERRORS)
            events.blocked(self.wal.root, reason, None if typed else exc)
        self.last_error, self._blocked_reason = exc, reason
        self._set_blocked(reason)

    def _reset_output(self) -> None:
        self.output.close()
        self.replayer.reset_output()
        if self._executors_writer is not None:
            self._executors_writer.reset()

    def _set_blocked(self, reason: str | None) -> None:
        if reason is None:
            if self._blocked_reason is not None or self._blocked_before:
                events.unblocked(self.wal.root)
            self._blocked_reason, self._blocked_before = None, False
        try:
            self.wal.write_blocked(reason)
        except (StoreUnavailable, OSError) as exc:
            if reason is None:      # inside the drain: a transient failure like any other
                raise
            # While blocking (outside the drain's own handling), on a full or read-only disk
            # or a store away: the block stands in this flusher (its health says so) and
            # blocked.json is written at the next drain, which blocks again.
            log.error("cassandra_wal: %s: blocked, but blocked.json could not be written "
                      "(written at the next try): %s: %s", self.wal.root,
                      type(exc).__name__, exc)

    def _set_failing(self, exc: Exception | None) -> None:
        """Say once when drains start failing transiently (Cassandra away, a full disk...)
        and once when one gets through again; the health shows the failure meanwhile."""
        if exc is None:
            if self.failing is not None:
                events.flush_recovered(self.wal.root, clock.monotonic() - self._failing_since)
            self.failing = None
            return
        text = f"{type(exc).__name__}: {exc}"
        if self.failing is None or self.failing.split(":", 1)[0] != type(exc).__name__:
            if self.failing is None:
                self._failing_since = clock.monotonic()
            events.flush_failing(self.wal.root, text, self.retry_interval_s)
        self.failing = text

    def recover(self) -> None:
        """At query start, before any batch (Spark calls this synchronously, before the query's
        first batch): discard what Spark never committed, and write what it committed and the
        WAL did not finish.

        In ``driver`` mode both happen here, from the driver: a Cassandra away does not hold
        the query for the whole retry budget (``spark.cassandra.query.retry.count``, some 50 s
        by default): each request is retried at most :data:`RECOVERY_RETRIES` times, and the
        running flusher takes over. In the scale-out modes (``executors`` with Spark up,
        ``processes``) only the discard happens here, which must finish before Spark re-runs
        those batches; the committed backlog is written by the flusher's thread as soon as it
        starts, through the mode's Spark jobs or worker processes, while the new batches stage
        (they are written after it, in order)."""
        scale_out = self._scales_out()
        self.output.retries_at_most = RECOVERY_RETRIES
        try:
            self.drain(RecoveryPolicy.QUERY_START, crash_prefix="recover",
                       replay=not scale_out)
        finally:
            self.output.retries_at_most = None
        report = self.last_report
        if (scale_out and self.last_error is None and report is not None
                and report.backlog_from is not None):
            self.backlog_from = report.backlog_from
            log.info("cassandra_wal: %s: recovery at query start left batches %d and after to "
                     "the flusher (wal.flush.mode=%s)", self.wal.root, report.backlog_from,
                     self.flush_mode())
            self._replay = Replay("recovery at query start")
            self._wake.set()        # the thread's first drain writes them, at once

    def _scales_out(self) -> bool:
        """Whether this flusher's drains write through Spark tasks or worker processes now."""
        with self._lock:
            try:
                return self.target.config.wal.flush and self._executors() is not None
            except Exception as exc:  # noqa: BLE001 - no writer now: the driver's recovery
                log.debug("cassandra_wal: %s: no scale-out writer at query start: %s",
                          self.wal.root, exc)
                return False

    # -- background thread -----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cassandra-wal-flusher",
                                        daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        self.warm_up()
        while not self._stop.is_set():
            try:
                kicked = self._wait_for_work()
                self._wake.clear()
                if self._stop.is_set():
                    break
                if not kicked and self._idle_on_a_store():
                    continue
                self.drain(RecoveryPolicy.QUERY_FLUSHER)
            except Exception:  # noqa: BLE001 - the thread must outlive anything: a bug here
                # would otherwise end it with a line on stderr, and no batch would be written
                log.exception("cassandra_wal: %s: the flusher's loop failed; it goes on in "
                              "%.0f s", self.wal.root, self.retry_interval_s)
                self._stop.wait(self.retry_interval_s)

    def warm_up(self) -> None:
        """Connect the session and prepare the statement of the query's current options (and
        start ``processes`` mode's workers) before the first batch to write: a query's first
        batch then costs what a later one does. A failure is the first drain's to report."""
        with self._lock:
            try:
                if self.target.config.wal.flush:
                    self.output.upserter_for(self.target.write_record())
                    if self.target.config.wal.flush_mode == "processes":
                        self._executors()
            except Exception as exc:  # noqa: BLE001 - the drain sorts and reports it
                log.debug("cassandra_wal: %s: warm-up failed (the first drain retries): %s",
                          self.wal.root, exc)

    def _wait_for_work(self) -> bool:
        """Wait until a kick (True), Spark's ``commits/N`` of the next batch to write (True:
        looked for every :data:`COMMIT_POLL_S` on a local checkpoint), or the retry timer
        (False)."""
        batch = self._next_commit_to_watch()
        if batch is None:
            return self._wake.wait(self.retry_interval_s)
        commit_file = os.path.join(self._commits_dir, str(batch))
        deadline = clock.monotonic() + self.retry_interval_s
        while (left := deadline - clock.monotonic()) > 0:
            if self._wake.wait(min(COMMIT_POLL_S, left)):
                return True
            if os.path.exists(commit_file):
                self._seen_committed = batch
                return True
        return False

    def _next_commit_to_watch(self) -> int | None:
        """The batch after the last one written, unless there is nothing to watch for: a
        store's checkpoint, a failure to retry on the timer, flushing off, or a commit the
        watch already woke for (the drain did not get past it: never a busy loop)."""
        if (self._commits_dir is None or self.last_error is not None
                or self._blocked_reason is not None or not self.target.config.wal.flush):
            return None
        try:
            batch = self.wal_log.flushed_through() + 1
        except WalStorageError:      # closed after an I/O error: the timer's drain reopens it
            return None
        return None if batch == self._seen_committed else batch

    def _idle_on_a_store(self) -> bool:
        """A timer wake with nothing to retry, on a WAL on a store: skip it. Each drain there
        costs some 7 requests (LISTs mostly, bench/store_cost.py), and nothing can be new
        without a kick: Spark reports every commit (onQueryProgress) and, while idle, every
        ``spark.sql.streaming.noDataProgressEventInterval`` (onQueryIdle). A local WAL's
        drain costs nothing; a failure or a block is retried on the timer as before."""
        return (self.wal.remote is not None and self.last_error is None
                and self._blocked_reason is None)

    def stop(self, finish_within_s: float = 0.0, exiting: bool = False,
             final_drain: bool = True) -> None:
        """Stop the thread, drain what Spark committed, close. A final drain that fails
        transiently is retried every ``retry_interval_s`` for up to ``finish_within_s``
        (0: one attempt), or until :meth:`hand_over`; what is left stays in the WAL for the
        next start of the query. ``exiting``: the interpreter exits (``atexit``): a failure
        then is no verdict on a batch and never blocks the WAL. ``final_drain`` False: the
        query's WAL moved away from this one, which has nothing left to write
        (:mod:`wal.move`), while Spark commits batches it will never hold. Idempotent: a
        second call waits for the first."""
        with self._stop_lock:
            if self.stopped.is_set():
                return
            self._exiting = self._exiting or exiting
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=60)
            if final_drain:
                self._finish(finish_within_s)
            self._close_executors()
            self.output.close()
            self.wal_log.close()
            self.stopped.set()

    def mark_exiting(self) -> None:
        """The interpreter exits while this flusher finishes its last drain: what fails from
        now on is no verdict on a batch (:meth:`stop`)."""
        self._exiting = True

    def hand_over(self, timeout_s: float = 60.0) -> None:
        """A new run of the query needs the WAL: cut a final drain's retries short and wait
        until the log is closed (the new run's recovery writes the rest)."""
        self._hand_over.set()
        self.stopped.wait(timeout_s)

    def _finish(self, within_s: float) -> None:
        def deferred() -> bool:          # a transient failure: worth another drain
            self.drain(RecoveryPolicy.QUERY_FLUSHER)
            if is_shutdown_error(self.last_error):
                return False            # the process's pools are gone: no drain can succeed
            return self.last_error is not None and self._blocked_reason is None

        left = Retrying(stop=clock.stop_waiting_after(within_s) | stop_when_event_set(self._hand_over),
                        wait=wait_fixed(self.retry_interval_s),
                        retry=retry_if_result(bool), sleep=self._hand_over.wait,
                        retry_error_callback=lambda state: state.outcome.result())(deferred)
        if left and not self._hand_over.is_set():
            log.warning("cassandra_wal: %s: stopped with committed batches not yet written to "
                        "Cassandra (%s: %s); they stay in the WAL and the next start of the "
                        "query (or cassandra-wal recover) writes them", self.wal.root,
                        type(self.last_error).__name__, self.last_error)
