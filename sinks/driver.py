"""The driver side: the single owner of a query's WAL log, which flushes committed batches.

``sinks.register(spark)`` adds a StreamingQueryListener. For a query that writes through this
sink (its checkpoint holds ``cassandra_wal_sink.json``):

* ``onQueryStarted`` (synchronous, before the first batch runs): open the WAL log for writing
  and run recovery: replay batches Spark committed but we had not finished flushing, discard
  batches Spark never committed (it re-runs them with the same id).
* ``onQueryProgress`` / ``onQueryIdle``: Spark has written ``commits/N``; wake the flusher
  thread, which writes every committed batch, in order, from the WAL: itself
  (``wal.flush.mode=driver``), or through a Spark job of one task per segment
  (``executors``, :mod:`sinks.distributed_flush`). Either way it alone records progress and
  marks batches flushed. Recovery at query start always writes from the driver.
* ``onQueryTerminated``: a last drain (on a thread of its own, retried while Cassandra is
  away for up to :data:`FINISH_ON_STOP_S`; interpreter exit waits for it), then close.
  ``sinks.wait_flushed`` waits for a query's committed batches to be written.

A flush that fails transiently (Cassandra down, ``recovery.errors.is_transient``) leaves the
batch in the WAL and is retried while the query goes on staging (bounded by ``wal.maxBytes``).
A failure no retry cures (corruption, Cassandra refusing the rows) blocks the sink:
``blocked.json`` makes the next commit fail with the reason, until a drain gets through.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import threading
import time

from tenacity import (Retrying, retry_if_exception_type, retry_if_result, stop_after_delay,
                      stop_when_event_set, wait_fixed)

from recovery.errors import (NotFlushedYet, RecoveryBlocked, RecoveryError, WalBlocked,
                             is_transient)
from recovery.replay import Replayer
from recovery.target import Target
from recovery.upsert import Upserter
from wal import catalog
from wal import checkpoint as ckpt
from wal.binding import bind
from wal.errors import (WalBoundElsewhere, WalCorrupted, WalError, WalLocked,
                        WalStorageError)
from wal.layout import WalDir
from wal.log import WalLog
from wal.retention import RetentionPolicy
from wal.seal import Seal

from . import credentials
from .connection import connect
from .distributed_flush import ExecutorsWriter, spark_is_active
from .errors import SinkError
from .plan import read_pointer

log = logging.getLogger(__name__)

#: How long a stopped query's flusher (and, at interpreter exit, every flusher) keeps retrying
#: a final drain that fails transiently (Cassandra unreachable) before it leaves the rest in
#: the WAL for the next start of the query or ``cassandra-wal recover``.
FINISH_ON_STOP_S = 30.0
BLOCK_REMEDY = ("the flusher tries again every few seconds and the block clears as soon as "
                "it gets past; see docs/runbook.md ('The sink is blocked')")

CREDENTIAL_KEYS = {"spark.cassandra.auth.username": "username",
                   "spark.cassandra.auth.password": "password",
                   "spark.cassandra.connection.ssl.keyStore.password": "ssl_keystore_password"}


def _session_credentials(session_conf: dict | None) -> dict:
    by_lower = {str(k).lower(): v for k, v in (session_conf or {}).items()}
    return {field: by_lower.get(key.lower()) for key, field in CREDENTIAL_KEYS.items()}


def load_target(wal: WalDir, session_conf: dict | None = None) -> Target:
    """The WAL's recorded target (secret-free) with credentials from, in increasing
    precedence: the environment (``CASSANDRA_WAL_*``), the session conf snapshot taken by
    ``sinks.register``, and the write's options (handed over in memory through
    :mod:`sinks.credentials`)."""
    recorded = wal.read_target()
    if recorded is None:
        raise SinkError(f"{wal.root} has no target.json: nothing says where its rows go")
    target = Target.from_dict(recorded["target"]).with_env_credentials()
    target = target.with_connection(**_session_credentials(session_conf))
    return with_option_credentials(target, wal.root)


def with_option_credentials(target: Target, wal_root: str) -> Target:
    """``target`` with the credentials the write's options handed over for ``wal_root``."""
    return target.with_connection(**credentials.lookup(wal_root))


class CassandraOutput:
    """A lazily opened session, and an Upserter for each way a batch was sealed to be written
    (``Seal.write``: columns, TTL, write time, nulls); closed with the flusher.

    With ``wal_root``, every (re)connection picks up the newest credentials the write's
    options handed over (a restarted query hands them over with its first batch, after the
    flusher was made)."""

    def __init__(self, target: Target, wal_root: str | None = None):
        self.target, self._cluster, self._session, self.wal_root = target, None, None, wal_root
        self._upserters: dict[str, Upserter] = {}

    def current_target(self) -> Target:
        """The target with the newest credentials (what the executors' tasks get, too)."""
        if self.wal_root is not None:
            return with_option_credentials(self.target, self.wal_root)
        return self.target

    def upserter(self, seal: Seal | None = None) -> Upserter:
        """The Upserter writing ``seal``'s rows as it recorded (the current options for a seal
        that recorded none, or with no seal)."""
        record = seal.write if seal is not None else None
        key = json.dumps(record, sort_keys=True)
        if key not in self._upserters:
            if self._session is None:
                self._cluster, self._session = connect(self.current_target().config.connection)
            target = self.target.as_sealed(record)
            self._upserters[key] = Upserter(self._session, target.table, target.columns,
                                            target.config.write,
                                            target.config.connection.consistency_level)
        return self._upserters[key]

    def close(self) -> None:
        self._upserters.clear()
        self._session = None
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None


def open_writer_waiting(wal: WalDir, seconds: float) -> WalLog:
    """Open the log for writing, waiting for a previous owner (a finishing job) to let go."""
    for attempt in Retrying(stop=stop_after_delay(seconds), wait=wait_fixed(0.2),
                            retry=retry_if_exception_type(WalLocked), reraise=True):
        with attempt:
            return WalLog.open_writer(wal)


def retention_of(target: Target) -> RetentionPolicy:
    wal = target.config.wal
    return RetentionPolicy(keep_batches=wal.retention_batches, keep_seconds=wal.retention_seconds)


class QueryFlusher:
    """Owns one query's WAL log in the driver and flushes committed batches in order."""

    def __init__(self, wal_root: str, checkpoint: str, session_conf: dict | None = None,
                 retry_interval_s: float = 2.0, spark=None):
        self.wal = WalDir(wal_root)
        self.checkpoint = checkpoint
        self.session_conf = session_conf
        # The WAL is this query's (a pointer copied from another checkpoint must not make this
        # query replay, discard or skip another's batches): see wal/binding.py.
        bind(self.wal, ckpt.local_path(checkpoint))
        self._fingerprint = self._recorded_fingerprint()
        self.target = load_target(self.wal, session_conf)
        self.log = open_writer_waiting(self.wal, 30)
        self.output = CassandraOutput(self.target, self.wal.root)
        self.replayer = Replayer(self.wal, self.log, lambda seal: self.output.upserter(seal),
                                 checkpoint, retention=retention_of(self.target))
        self.spark = spark
        self._executors_writer: ExecutorsWriter | None = None
        self.retry_interval_s = retry_interval_s
        self.last_error: Exception | None = None
        self._blocked_reason: str | None = None
        self.last_report = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.drains = 0                        # drains finished, whatever their outcome
        self.stopped = threading.Event()       # the final drain is done, the log closed
        self._stop_lock = threading.Lock()
        self._hand_over = threading.Event()    # a new run wants the WAL: stop retrying

    # -- runs ----------------------------------------------------------------------------
    def drain(self, query_running: bool, crash_prefix: str = "flush",
              executors_allowed: bool = True) -> None:
        """Write what Spark committed, in order. A failure a retry may cure
        (:func:`~recovery.errors.is_transient`: Cassandra away, a shared filesystem away)
        keeps its batch for the next drain; any other blocks the sink (:meth:`_block`). A
        drain that gets through clears the block."""
        with self._lock:
            try:
                if isinstance(self.last_error, WalStorageError):
                    # RocksDB refuses every write after an I/O error until it is reopened.
                    self.log.reopen()
                self._follow_target()
                if not self.target.config.wal.flush:
                    return
                writer = self._executors() if executors_allowed else None
                self.last_report = self.replayer.run(query_running, crash_prefix, writer)
                self.last_error = None
                self._set_blocked(None)
            except Exception as exc:  # noqa: BLE001 - each failure is sorted, none is silent
                if is_transient(exc):   # the batch stays in the WAL, retried in a moment
                    self.last_error = exc
                    log.warning("cassandra_wal: %s: flush deferred, retried in %.0f s: %s: %s",
                                self.wal.root, self.retry_interval_s, type(exc).__name__, exc)
                else:
                    self._block(exc)
                if not isinstance(exc, RecoveryBlocked):   # the session may be the cause
                    self._reset_output()
            finally:
                self.drains += 1

    def _recorded_fingerprint(self) -> str | None:
        try:
            return (self.wal.read_target() or {}).get("fingerprint")
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
        self.output = CassandraOutput(target, self.wal.root)
        self.replayer.retention = retention_of(target)
        self._close_executors()
        log.info("cassandra_wal: %s: the query's options changed; flushing with the new ones",
                 self.wal.root)

    def _executors(self) -> ExecutorsWriter | None:
        """The segment writer of ``wal.flush.mode=processes`` (worker processes), or of
        ``executors`` when Spark is up; else None (the Replayer's own driver-side writer)."""
        wal = self.target.config.wal
        if wal.flush_mode == "driver":
            return None
        if wal.flush_mode == "executors" and (self.spark is None
                                              or not spark_is_active(self.spark)):
            if self.spark is not None:
                log.warning("cassandra_wal: Spark is stopped: batch flushed from the driver")
            return None
        if self._executors_writer is None:
            if wal.flush_mode == "processes":
                self._executors_writer = ExecutorsWriter.on_processes(
                    wal.flush_processes, self.wal.root, self.output.current_target)
            else:
                self._executors_writer = ExecutorsWriter.on_spark(
                    self.spark.sparkContext, self.wal.root, self.output.current_target)
        return self._executors_writer

    def _close_executors(self) -> None:
        if self._executors_writer is not None:
            self._executors_writer.close()
            self._executors_writer = None

    def _block(self, exc: Exception) -> None:
        """Nothing later may be flushed before this batch: say so where the next commit sees
        it (blocked.json), so the query fails with the reason instead of staging forever."""
        reason = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, RecoveryBlocked):   # its own text names the runbook's remedy
            reason = f"{reason}; {BLOCK_REMEDY}"
        if reason != self._blocked_reason:   # retried every few seconds: say it once
            # An error of no family of ours is a bug: its traceback is what to report.
            typed = isinstance(exc, (RecoveryError, SinkError, WalError))
            log.error("cassandra_wal: %s: blocked: %s", self.wal.root, reason,
                      exc_info=None if typed else exc)
        self.last_error, self._blocked_reason = exc, reason
        self._set_blocked(reason)

    def _reset_output(self) -> None:
        self.output.close()
        self.replayer.reset_output()
        if self._executors_writer is not None:
            self._executors_writer.reset()

    def _set_blocked(self, reason: str | None) -> None:
        if reason is None:
            self._blocked_reason = None
        self.wal.write_blocked(reason)

    def recover(self) -> None:
        """At query start, before any batch: replay committed, discard uncommitted. Always from
        the driver: Spark calls this synchronously, before the query's first batch."""
        self.drain(query_running=False, crash_prefix="recover", executors_allowed=False)

    # -- background thread -----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cassandra-wal-flusher",
                                        daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.retry_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.drain(query_running=True)

    def stop(self, finish_within_s: float = 0.0) -> None:
        """Stop the thread, drain what Spark committed, close. A final drain that fails
        transiently is retried every ``retry_interval_s`` for up to ``finish_within_s``
        (0: one attempt), or until :meth:`hand_over`; what is left stays in the WAL for the
        next start of the query. Idempotent: a second call waits for the first."""
        with self._stop_lock:
            if self.stopped.is_set():
                return
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=60)
            self._finish(finish_within_s)
            self._close_executors()
            self.output.close()
            self.log.close()
            self.stopped.set()

    def hand_over(self, timeout_s: float = 60.0) -> None:
        """A new run of the query needs the WAL: cut a final drain's retries short and wait
        until the log is closed (the new run's recovery writes the rest)."""
        self._hand_over.set()
        self.stopped.wait(timeout_s)

    def _finish(self, within_s: float) -> None:
        def deferred() -> bool:          # a transient failure: worth another drain
            self.drain(query_running=True)
            return self.last_error is not None and self._blocked_reason is None

        left = Retrying(stop=stop_after_delay(within_s) | stop_when_event_set(self._hand_over),
                        wait=wait_fixed(self.retry_interval_s),
                        retry=retry_if_result(bool), sleep=self._hand_over.wait,
                        retry_error_callback=lambda state: state.outcome.result())(deferred)
        if left and not self._hand_over.is_set():
            log.warning("cassandra_wal: %s: stopped with committed batches not yet written to "
                        "Cassandra (%s: %s); they stay in the WAL and the next start of the "
                        "query (or cassandra-wal recover) writes them", self.wal.root,
                        type(self.last_error).__name__, self.last_error)


class FlushRegistry:
    """The flushers of one Spark session's queries, driven by the listener's events.

    One flusher per *run* (``runId``): a query restarted on the same checkpoint in the same
    session is a new run, and Spark may deliver the new run's ``onQueryStarted``
    (synchronous, on the query's thread) before the old run's ``onQueryTerminated``
    (asynchronous, on the listener bus). The new run therefore stops the old run's flusher
    itself (which hands over the WAL's writer lock), and a late termination of the old run
    leaves the new one alone.

    A run that ends finishes its flusher's last drain on a thread of its own (retrying for up
    to :data:`FINISH_ON_STOP_S` if Cassandra is away), which interpreter exit waits for; so
    does :func:`finish_at_exit` for flushers whose run's end Spark has not reported yet. A
    script that stops its query and exits leaves nothing committed unwritten."""

    def __init__(self, spark, session_conf: dict):
        self.spark, self.session_conf = spark, session_conf
        self.flushers: dict[str, QueryFlusher] = {}       # by run id
        self.runs: dict[str, tuple[str, str]] = {}        # run id -> (query id, checkpoint)
        self.stopping: dict[str, tuple[str, QueryFlusher]] = {}   # run id -> (query id, flusher)
        self.checkpoints: dict[str, str] = {}             # query id -> checkpoint, kept
        self._lock = threading.Lock()
        _registries.append(self)
        _register_exit_hook()

    def _checkpoint_of(self, query_id: str) -> str | None:
        query = self.spark.streams.get(query_id)
        if query is None:
            return None
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())

    def _flusher(self, run_id: str) -> QueryFlusher | None:
        if run_id in self.flushers:
            return self.flushers[run_id]
        if run_id not in self.runs:
            return None     # a run that ended (a late event), or not one we saw start
        checkpoint = self.runs[run_id][1]
        wal_root = read_pointer(checkpoint)
        if wal_root is None:
            return None     # not our sink, or its first batch is not committed yet
        try:
            flusher = QueryFlusher(wal_root, checkpoint, self.session_conf, spark=self.spark)
        except Exception as exc:  # noqa: BLE001 - each failure is sorted, none is silent
            # The listener cannot fail the query, but the query's next commit can: a flusher
            # that cannot start for a reason no retry cures (the WAL is another query's, its
            # target.json is unreadable) blocks the WAL; the first flusher that starts (on the
            # next event, or the next run) clears it with its first good drain.
            if is_transient(exc):   # e.g. the WAL's lock still held by `cassandra-wal recover`
                log.warning("cassandra_wal: %s: the flusher cannot start yet, tried again at "
                            "the next batch: %s: %s", wal_root, type(exc).__name__, exc)
                return None
            reason = f"{type(exc).__name__}: {exc}"
            log.error("cassandra_wal: %s: the flusher cannot start: %s", wal_root, reason)
            if not isinstance(exc, WalBoundElsewhere):   # that WAL's own query is not at fault
                WalDir(wal_root).write_blocked(f"the flusher cannot start: {reason}")
            return None
        with self._lock:
            self.flushers[run_id] = flusher
        return flusher

    def flusher_of(self, run_id: str) -> QueryFlusher | None:
        """The run's flusher, running or finishing its last drain; None if it has none."""
        with self._lock:
            if run_id in self.flushers:
                return self.flushers[run_id]
            return self.stopping.get(run_id, (None, None))[1]

    def started(self, query_id: str, run_id: str) -> None:
        with self._lock:
            previous = [r for r, (q, _) in self.runs.items() if q == query_id and r != run_id]
            finishing = [f for q, f in self.stopping.values() if q == query_id]
        for run in previous:      # still running: its flusher lets go of the WAL right now
            with self._lock:
                flusher = self.flushers.pop(run, None)
                self.runs.pop(run, None)
            if flusher is not None:
                flusher.stop()
        for flusher in finishing:   # ended: its last drain stops retrying, recovery goes on
            flusher.hand_over()
        checkpoint = self._checkpoint_of(query_id)
        if checkpoint is None:
            return
        with self._lock:
            self.runs[run_id] = (query_id, checkpoint)
            self.checkpoints[query_id] = checkpoint
        flusher = self._flusher(run_id)
        if flusher is not None:
            flusher.recover()
            flusher.start()

    def progressed(self, query_id: str, run_id: str) -> None:
        flusher = self.flushers.get(run_id)
        if flusher is None:
            flusher = self._flusher(run_id)
            if flusher is None:
                return
            flusher.start()
        flusher.kick()

    def terminated(self, query_id: str, run_id: str) -> None:
        with self._lock:
            flusher = self.flushers.pop(run_id, None)
            self.runs.pop(run_id, None)
            if flusher is None:
                return
            self.stopping[run_id] = (query_id, flusher)
        # Not on the listener bus, which would hold every later event meanwhile; not a
        # daemon, so that interpreter exit waits for the drain.
        threading.Thread(target=self._finish_run, args=(run_id, flusher, FINISH_ON_STOP_S),
                         name=f"cassandra-wal-final-flush-{run_id[:8]}").start()

    def _finish_run(self, run_id: str, flusher: QueryFlusher, within_s: float) -> None:
        try:
            flusher.stop(within_s)
        except Exception:  # noqa: BLE001 - a thread's error would go to stderr only
            log.exception("cassandra_wal: %s: the last drain of run %s failed",
                          flusher.wal.root, run_id)
        finally:
            with self._lock:
                self.stopping.pop(run_id, None)

    def finish(self, within_s: float) -> None:
        """Stop every running flusher (a last drain, retried for up to ``within_s``) and wait
        as long for those finishing theirs."""
        with self._lock:
            running = list(self.flushers.items())
            self.flushers.clear()
            self.runs.clear()
            finishing = [f for _, f in self.stopping.values()]
        for run_id, flusher in running:
            self._finish_run(run_id, flusher, within_s)
        for flusher in finishing:
            if not flusher.stopped.wait(within_s):
                log.warning("cassandra_wal: %s: exiting before the last drain finished; what "
                            "is not written stays in the WAL", flusher.wal.root)


_registries: list[FlushRegistry] = []       # every session's: for wait_flushed and exit


@functools.cache
def _register_exit_hook() -> None:
    # Once, with the first registry: after pyspark has registered its own exit hook (which
    # kills the JVM), so that this one runs first (atexit runs the last registered first).
    atexit.register(finish_at_exit)


def finish_at_exit() -> None:
    """At interpreter exit (``atexit``): every flusher writes what Spark committed before the
    process goes (its thread is a daemon, which exit would otherwise kill mid-way), for up to
    :data:`FINISH_ON_STOP_S`."""
    busy = [r for r in _registries if r.flushers or r.stopping]
    if busy:
        log.info("cassandra_wal: writing what the queries committed before exit (up to %.0f s)",
                 FINISH_ON_STOP_S)
    for registry in busy:
        registry.finish(FINISH_ON_STOP_S)


# -- waiting for a query's rows ------------------------------------------------------------------
WAIT_POLL_S = 0.2


def wait_flushed(query, timeout: float | None = None) -> None:
    """Return once every batch ``query`` has committed (the checkpoint's highest
    ``commits/N`` when called) is written to Cassandra: the WAL has nothing to replay up to
    it. Works while the query runs (its flusher is woken at once) and after ``query.stop()``
    (the stopped run's last drain is waited for; if no flusher is left, this drains the WAL
    itself).

    Raises :class:`~recovery.errors.WalBlocked` with the reason if the WAL is blocked (after
    the flusher tried once more), :class:`~recovery.errors.NotFlushedYet` (a ``TimeoutError``)
    naming the batches still pending and their rows once ``timeout`` seconds have passed, and
    :class:`~sinks.errors.SinkError` for a query that does not write through this sink."""
    started = time.monotonic()
    checkpoint = _checkpoint_root(query)
    committed = ckpt.committed_batches(checkpoint)
    if not committed:
        return
    through = committed[-1]
    root = read_pointer(checkpoint)
    if root is None:
        raise SinkError(f"query {query.id}: its checkpoint {checkpoint} names no cassandra_wal "
                        "WAL (cassandra_wal_sink.json): it does not write through this sink")
    wal, run_id = WalDir(root), str(query.runId)
    own: QueryFlusher | None = None
    flusher, drains_before = None, 0
    try:
        while True:
            if own is None and flusher is not None and flusher.stopped.is_set():
                # The stopped run's last drain gave up (Cassandra away longer than it
                # retries) and closed the log: nobody else will write the rest.
                flusher = None
            if own is None and flusher is None:
                flusher = _flusher_of(run_id)
                if flusher is not None:
                    drains_before = flusher.drains
                    flusher.kick()
                elif not _is_active(query):   # nobody else will: drain it here
                    own = flusher = QueryFlusher(root, checkpoint, _session_conf(query.id))
            if own is not None:
                own.drain(query_running=True)
            blocked = wal.read_blocked()
            if blocked is not None and (flusher is None or flusher.drains > drains_before):
                raise WalBlocked(root, blocked)
            if wal.read_flushed_through() >= through and not pending_batches(wal, checkpoint,
                                                                             through):
                return
            waited = time.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise NotFlushedYet(root, through, pending_batches(wal, checkpoint, through),
                                    waited)
            pause = own.retry_interval_s if own is not None else WAIT_POLL_S
            time.sleep(pause if timeout is None else max(0.0, min(pause, timeout - waited)))
    finally:
        if own is not None:
            own.stop()


def pending_batches(wal: WalDir, checkpoint: str, through: int) -> list[tuple[int, int]]:
    """``(batch, rows not yet acknowledged)`` of every batch up to ``through`` that the WAL's
    catalog does not call done, read beside the live flusher (a read-only log instance)."""
    views = catalog.describe_read_only(wal, checkpoint, query_running=True)
    return [(v.batch, v.rows - v.flushed_rows) for v in views
            if v.batch <= through and v.action != catalog.NOTHING]


def _checkpoint_root(query) -> str:
    jsq = getattr(query, "_jsq", None)
    if jsq is not None:
        return str(jsq.streamingQuery().resolvedCheckpointRoot())
    for registry in _registries:   # Spark Connect: the checkpoint its start reported
        if str(query.id) in registry.checkpoints:
            return registry.checkpoints[str(query.id)]
    raise SinkError(f"query {query.id}: its checkpoint is unknown here (was sinks.register "
                    "called on its session before it started?)")


def _flusher_of(run_id: str) -> QueryFlusher | None:
    for registry in _registries:
        flusher = registry.flusher_of(run_id)
        if flusher is not None:
            return flusher
    return None


def _session_conf(query_id: str) -> dict | None:
    for registry in _registries:
        if query_id in registry.checkpoints:
            return registry.session_conf
    return None


def _is_active(query) -> bool:
    try:
        return bool(query.isActive)
    except Exception:  # noqa: BLE001 - Spark itself stopped: the query is not running
        return False

