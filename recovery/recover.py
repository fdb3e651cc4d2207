"""Recovery by hand: what ``cassandra-wal recover`` runs, with the query stopped.

The same :class:`~recovery.replay.Replayer` the flusher runs at query start: it takes the
WAL's writer lock (so it cannot run beside a live sink), discards batches Spark never committed
and replays committed ones in order, at their sealed write timestamps, from this process.
What blocked the sink is then written, so the block is cleared.
"""

from __future__ import annotations

from collections.abc import Callable

from wal.layout import WalDir
from wal.log import WalLog

from .output import CassandraOutput
from .replay import Progress, Replayer, ReplayReport
from .target import Target


def recover(wal: WalDir, checkpoint: str | None, target: Target,
            on_progress: Callable[[Progress], None] | None = None) -> ReplayReport:
    """Replay ``wal`` against the checkpoint ``checkpoint`` (a local folder; None for a batch
    job's WAL, whose seals are their own commit point), writing to ``target``. Raises
    ``WalLocked`` (a running sink holds the WAL), ``RecoveryBlocked`` (a batch cannot be
    replayed: named), ``FlushFailed`` / ``ConnectionFailed`` (Cassandra)."""
    output = CassandraOutput(target)
    wal_log = WalLog.open_writer(wal)
    try:
        report = Replayer(wal, wal_log, output.upserter, checkpoint,
                          on_progress=on_progress).run(query_running=False,
                                                       crash_prefix="recover")
    finally:
        wal_log.close()
        output.close()
    wal.write_blocked(None)     # what blocked the sink is written now: its next commit may go
    return report
