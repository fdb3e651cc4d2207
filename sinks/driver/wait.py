"""``sinks.wait_flushed(query, timeout)``: wait until every batch a query committed is in
Cassandra. Runs in the user's driver process, on the calling thread.
"""

from __future__ import annotations


from recovery.cql.errors import SinkError
from recovery.errors import NotFlushedYet, WalBlocked
from recovery.flusher import QueryFlusher
from wal import catalog
from wal import checkpoint as ckpt
from wal import clock
from wal.catalog import RecoveryAction
from wal.layout import WalDir
from wal.pointer import pointed_wals
from wal.recovery_policy import RecoveryPolicy

from .registry import checkpoint_reported, flushers_of_run, session_conf_of

WAIT_POLL_S = 0.2


def wait_flushed(query, timeout: float | None = None) -> None:
    """Return once every batch ``query`` has committed (the checkpoint's highest
    ``commits/N`` when called) is written to Cassandra: each of its WALs (one a table a
    ``foreachBatch`` function writes) has nothing to replay up to it. Works while the query
    runs (its flushers are woken at once) and after ``query.stop()`` (the stopped run's last
    drains are waited for; a WAL no flusher is left for is drained here).

    Raises :class:`~recovery.errors.WalBlocked` with the reason if a WAL is blocked (after
    its flusher tried once more), :class:`~recovery.errors.NotFlushedYet` (a
    ``TimeoutError``) naming the batches still pending and their rows once ``timeout``
    seconds have passed, and :class:`~recovery.cql.errors.SinkError` for a query that does not write
    through this sink.

    Runs: in the driver process, on the calling thread."""
    started = clock.monotonic()
    checkpoint = checkpoint_root(query)
    committed = ckpt.committed_batches(checkpoint)
    if not committed:
        return
    roots = pointed_wals(checkpoint)
    if not roots:
        raise SinkError(f"query {query.id}: its checkpoint {checkpoint} names no cassandra_wal "
                        "WAL (cassandra_wal_sink.json): it does not write through this sink")
    deadline = None if timeout is None else started + timeout
    for root in roots:
        _wait_wal(query, root, checkpoint, committed[-1], started, deadline)


def _wait_wal(query, root: str, checkpoint: str, through: int, started: float,
              deadline: float | None) -> None:
    """:func:`wait_flushed` for the query's WAL at ``root``."""
    wal, run_id = WalDir.at(root), str(query.runId)
    own: QueryFlusher | None = None
    flusher, drains_before = None, 0
    try:
        while True:
            if own is None and flusher is not None and flusher.stopped.is_set():
                # The stopped run's last drain gave up (Cassandra away longer than it
                # retries) and closed the log: nobody else will write the rest.
                flusher = None
            if own is None and flusher is None:
                flusher = next((f for f in flushers_of_run(run_id)
                                if f.wal.location == wal.location), None)
                if flusher is not None:
                    drains_before = flusher.drains
                    flusher.kick()
                elif not _is_active(query):   # nobody else will: drain it here
                    own = flusher = QueryFlusher(root, checkpoint, session_conf_of(query.id))
            if own is not None:
                own.drain(RecoveryPolicy.QUERY_FLUSHER)
            blocked = wal.read_blocked()
            if blocked is not None and (flusher is None or flusher.drains > drains_before):
                raise WalBlocked(root, blocked)
            if wal.read_flushed_through() >= through and not pending_batches(wal, checkpoint,
                                                                             through):
                return
            now = clock.monotonic()
            if deadline is not None and now >= deadline:
                raise NotFlushedYet(root, through, pending_batches(wal, checkpoint, through),
                                    now - started)
            pause = own.retry_interval_s if own is not None else WAIT_POLL_S
            clock.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
    finally:
        if own is not None:
            own.stop()


def pending_batches(wal: WalDir, checkpoint: str, through: int) -> list[tuple[int, int]]:
    """``(batch, rows not yet acknowledged)`` of every batch up to ``through`` that the WAL's
    catalog does not call done, read beside the live flusher (a read-only log instance)."""
    views = catalog.describe_read_only(wal, checkpoint, RecoveryPolicy.QUERY_FLUSHER)
    return [(v.batch, v.rows - v.flushed_rows) for v in views
            if v.batch <= through and v.action != RecoveryAction.NOTHING]


def checkpoint_root(query) -> str:
    jsq = getattr(query, "_jsq", None)
    if jsq is not None:
        return str(jsq.streamingQuery().resolvedCheckpointRoot())
    reported = checkpoint_reported(str(query.id))   # Spark Connect: what its start reported
    if reported is not None:
        return reported
    raise SinkError(f"query {query.id}: its checkpoint is unknown here (was sinks.register "
                    "called on its session before it started? With Spark Connect, call "
                    "sinks.register(spark).track(query, checkpointLocation) after start())")


def _is_active(query) -> bool:
    try:
        return bool(query.isActive)
    except Exception:  # noqa: BLE001 - Spark itself stopped: the query is not running
        return False
