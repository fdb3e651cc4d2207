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
* ``onQueryTerminated``: a last drain, then close.

A flush that fails (Cassandra down) leaves the batch in the WAL and is retried with back-off
while the query goes on staging (bounded by ``wal.maxBytes``). A WAL that cannot be replayed
(corruption) blocks the sink: ``blocked.json`` makes the next commit fail with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from recovery.errors import FlushFailed, RecoveryBlocked
from recovery.replay import Replayer
from recovery.target import Target
from recovery.upsert import Upserter
from wal.errors import WalCorrupted, WalLocked
from wal.files import atomic_write
from wal.layout import WalDir
from wal.log import WalLog
from wal.retention import RetentionPolicy

from . import credentials
from .connection import connect
from .distributed_flush import ExecutorsWriter, spark_is_active
from .errors import ConnectionFailed, SinkError
from .plan import BLOCKED_FILE, WritePlan, read_pointer

log = logging.getLogger(__name__)

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
    """A lazily opened session and the Upserter for one target; closed with the flusher.

    With ``wal_root``, every (re)connection picks up the newest credentials the write's
    options handed over (a restarted query hands them over with its first batch, after the
    flusher was made)."""

    def __init__(self, target: Target, wal_root: str | None = None):
        self.target, self._cluster, self.wal_root = target, None, wal_root

    def current_target(self) -> Target:
        """The target with the newest credentials (what the executors' tasks get, too)."""
        if self.wal_root is not None:
            return with_option_credentials(self.target, self.wal_root)
        return self.target

    def upserter(self) -> Upserter:
        cluster, session = connect(self.current_target().config.connection)
        self._cluster = cluster
        return Upserter(session, self.target.table, self.target.columns, self.target.config.write,
                        self.target.config.connection.consistency_level)

    def close(self) -> None:
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


def flush_now(plan: WritePlan) -> None:
    """A batch job's flush, in its commit: everything sealed in this WAL, in order."""
    if not plan.config.wal.flush:
        return
    wal = plan.wal
    conn = plan.config.connection
    output = CassandraOutput(plan.target.with_env_credentials().with_connection(
        username=conn.username, password=conn.password,
        ssl_keystore_password=conn.ssl_keystore_password))
    wal_log = open_writer_waiting(wal, 60)
    try:
        Replayer(wal, wal_log, output.upserter, checkpoint=None,
                 retention=retention_of(plan.target)).run(query_running=False)
    finally:
        wal_log.close()
        output.close()


class QueryFlusher:
    """Owns one query's WAL log in the driver and flushes committed batches in order."""

    def __init__(self, wal_root: str, checkpoint: str, session_conf: dict | None = None,
                 retry_interval_s: float = 2.0, spark=None):
        self.wal = WalDir(wal_root)
        self.checkpoint = checkpoint
        self.session_conf = session_conf
        self._fingerprint = self._recorded_fingerprint()
        self.target = load_target(self.wal, session_conf)
        self.log = open_writer_waiting(self.wal, 30)
        self.output = CassandraOutput(self.target, self.wal.root)
        self.replayer = Replayer(self.wal, self.log, lambda: self.output.upserter(), checkpoint,
                                 retention=retention_of(self.target))
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

    # -- runs ----------------------------------------------------------------------------
    def drain(self, query_running: bool, crash_prefix: str = "flush",
              executors_allowed: bool = True) -> None:
        with self._lock:
            try:
                self._follow_target()
                if not self.target.config.wal.flush:
                    return
                writer = self._executors() if executors_allowed else None
                self.last_report = self.replayer.run(query_running, crash_prefix, writer)
                self.last_error = None
                self._set_blocked(None)
            except RecoveryBlocked as exc:
                self._block(exc)
            except FlushFailed as exc:
                if exc.permanent:   # Cassandra refuses the rows: make the query fail, loudly
                    self._block(exc)
                else:               # transient: keep the batch, retry after a pause
                    self.last_error = exc
                    log.warning("%s", exc)
                self._reset_output()
            except ConnectionFailed as exc:
                self.last_error = exc
                log.warning("%s", exc)
                self._reset_output()
            except Exception as exc:  # noqa: BLE001 - a stalled flusher must never be silent
                log.exception("cassandra_wal: flusher failed")
                self._block(exc)
                self._reset_output()

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
        if reason != self._blocked_reason:   # retried every few seconds: say it once
            log.error("%s", exc)
        self.last_error, self._blocked_reason = exc, reason
        self._set_blocked(reason)

    def _reset_output(self) -> None:
        self.output.close()
        self.replayer.reset_output()
        if self._executors_writer is not None:
            self._executors_writer.reset()

    def _set_blocked(self, reason: str | None) -> None:
        path = os.path.join(self.wal.root, BLOCKED_FILE)
        if reason is None:
            self._blocked_reason = None
            if os.path.exists(path):
                os.unlink(path)
            return
        atomic_write(path, json.dumps({"reason": reason, "at": time.time()}).encode())

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

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.drain(query_running=True)
        self._close_executors()
        self.output.close()
        self.log.close()


class FlushRegistry:
    """The flushers of one Spark session's queries, driven by the listener's events.

    One flusher per *run* (``runId``): a query restarted on the same checkpoint in the same
    session is a new run, and Spark may deliver the new run's ``onQueryStarted``
    (synchronous, on the query's thread) before the old run's ``onQueryTerminated``
    (asynchronous, on the listener bus). The new run therefore stops the old run's flusher
    itself (which hands over the WAL's writer lock), and a late termination of the old run
    leaves the new one alone."""

    def __init__(self, spark, session_conf: dict):
        self.spark, self.session_conf = spark, session_conf
        self.flushers: dict[str, QueryFlusher] = {}       # by run id
        self.runs: dict[str, tuple[str, str]] = {}        # run id -> (query id, checkpoint)

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
        flusher = QueryFlusher(wal_root, checkpoint, self.session_conf, spark=self.spark)
        self.flushers[run_id] = flusher
        return flusher

    def started(self, query_id: str, run_id: str) -> None:
        for previous in [r for r, (q, _) in self.runs.items() if q == query_id and r != run_id]:
            self.terminated(query_id, previous)
        checkpoint = self._checkpoint_of(query_id)
        if checkpoint is None:
            return
        self.runs[run_id] = (query_id, checkpoint)
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
        flusher = self.flushers.pop(run_id, None)
        self.runs.pop(run_id, None)
        if flusher is not None:
            flusher.stop()
