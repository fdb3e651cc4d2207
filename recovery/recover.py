"""A WAL replayed whole from this process (or its worker processes): what ``cassandra-wal
recover`` runs with the query stopped, and what a batch job's commit runs over its own WAL
(:mod:`recovery.batch_jobs`).

The same :class:`~recovery.replay.Replayer` the flusher runs at query start: it takes the
WAL's writer lock (so it cannot run beside a live sink), discards batches Spark never committed
and replays committed ones in order, at their sealed write timestamps. What blocked the sink is
then written, so the block is cleared.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import Retrying, retry_if_exception_type, wait_fixed

from wal import clock
from wal.errors import WalLocked
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.seal import Seal

from . import events
from .executors import ExecutorsWriter
from .marker import MarkerWriter, marker_query_id, write_marker
from .output import CassandraOutput, sealed_rows
from .replay import Progress, Replayer, ReplayReport, RowWriter
from .target import Target


def open_writer_waiting(wal: WalDir, seconds: float) -> WalLog:
    """Open the log for writing, waiting up to ``seconds`` for a previous owner (a finishing
    job, a stopping flusher) to let go; ``WalLocked`` after that (at once with 0)."""
    for attempt in Retrying(stop=clock.stop_waiting_after(seconds), wait=wait_fixed(0.2),
                            retry=retry_if_exception_type(WalLocked), sleep=clock.sleep,
                            reraise=True):
        with attempt:
            return WalLog.open_writer(wal)


def _before_write(wal: WalDir, wal_log: WalLog, target: Target, output: CassandraOutput,
                  seal: Seal) -> None:
    """What the flusher does before a batch's rows: refuse a batch a dropped column would
    hide; say that a batch an earlier release sealed with a non-frozen list column is written
    at least once (each batch is written once in a replay of the whole WAL)."""
    output.check_not_dropped(seal, wal.location, rows=lambda: sealed_rows(wal, wal_log, seal))
    columns = target.unaccepted_lists(seal.write)
    if columns:
        events.lists_at_least_once(wal.root, seal.batch, columns)


def replay_wal(wal: WalDir, checkpoint: str | None, target: Target, *,
               on_progress: Callable[[Progress], None] | None = None,
               lock_wait_s: float = 0.0, crash_prefix: str = "recover",
               policy: RecoveryPolicy, processes: int = 0,
               writer: RowWriter | None = None) -> ReplayReport:
    """Replay ``wal`` against the checkpoint ``checkpoint`` (a local folder; None for a batch
    job's WAL, whose seals are their own commit point), writing to ``target``.
    ``policy``: who recovers (``OFFLINE``, ``OFFLINE_FORCED``, ``BATCH_JOB``), which decides
    whether what Spark never committed is discarded or waits. ``processes``: the rows are
    written by that many worker processes of this one, a segment at a time, each with its own
    session (as ``wal.flush.mode=processes``: :mod:`recovery.processes`); 0: by this process,
    unless ``writer`` says who (Spark tasks: :func:`sinks.recover`). Then, for a stream's WAL
    whose target has ``marker.table``, the completeness marker of the newest batch written
    (:mod:`recovery.marker`), so that a reader of Cassandra learns of what the recovery wrote
    before the query runs again. Raises
    ``WalLocked`` (another process holds the WAL), ``RecoveryBlocked`` (a batch cannot be
    replayed: named), ``FlushFailed`` / ``ConnectionFailed`` (Cassandra)."""
    output = CassandraOutput(target)
    if writer is None and processes > 0:
        writer = ExecutorsWriter.on_processes(processes, wal.root, lambda: target,
                                              store_uri=wal.remote.uri if wal.remote else None)
    wal_log = open_writer_waiting(wal, lock_wait_s)
    try:
        report = Replayer(wal, wal_log, output.upserter, checkpoint, on_progress=on_progress,
                          before_write=lambda seal: _before_write(wal, wal_log, target, output,
                                                                    seal), writer=writer
                          ).run(policy, crash_prefix=crash_prefix)
        if checkpoint is not None and target.config.wal.marker_table is not None:
            write_marker(MarkerWriter(target, marker_query_id(checkpoint)), wal_log, target,
                         checkpoint, wal_log.flushed_through(), output.session_of)
    finally:
        wal_log.close()
        output.close()
        close = getattr(writer, "close", None)
        if close is not None:
            close()
    wal.write_blocked(None)     # what blocked the sink is written now: its next commit may go
    return report
