"""``sinks.recover``: a stopped query's committed backlog written by Spark tasks.

What ``cassandra-wal recover`` does from one process (:func:`recovery.recover.replay_wal`:
the WAL's writer lock, batches in order at their sealed timestamps, what Spark never
committed left, or discarded with ``force``), with the rows written as ``wal.flush.mode=
executors`` writes them: one Spark task per sealed segment, each reading its segment from the
WAL folder or from the store (:mod:`recovery.executors`, :mod:`sinks.driver.spark_jobs`). For a
backlog too long to replay from one process before the query restarts.

Runs: in the driver process (Spark Connect: the client's), on the calling thread; the rows on
the executors.
"""

from __future__ import annotations

import logging

from recovery.cql.errors import SinkError
from recovery.executors import ExecutorsWriter, may_carry_credentials
from recovery.flusher import load_target
from recovery.recover import replay_wal
from recovery.replay import ReplayReport
from recovery.target import RecordedTarget
from wal import binding
from wal import checkpoint as ckpt
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy

from .registry import register_session
from .spark_jobs import SparkJobs

log = logging.getLogger(__name__)


#: How long :func:`recover` waits for the WAL's writer lock: a query just stopped in this
#: process finishes its flusher's last drain on a thread of its own first.
LOCK_WAIT_S = 60.0


def recover(spark, wal_path: str, checkpoint: str | None = None, *,
            force: bool = False, lock_wait_s: float = LOCK_WAIT_S) -> ReplayReport:
    """Write what Spark committed and the WAL at ``wal_path`` did not finish, through Spark
    tasks of ``spark``, the query stopped. ``checkpoint``: the query's (default: the one its
    ``target.json`` records); ``force``: discard what Spark never committed too (only when no
    run of the query is live anywhere). Credentials and defaults come from ``spark``'s
    ``spark.cassandra.*`` conf, the rest from the WAL's ``target.json``. Raises as
    :func:`recovery.recover.replay_wal` (``WalLocked`` while a query's flusher holds the WAL
    longer than ``lock_wait_s``), ``WalBoundElsewhere`` for another query's checkpoint, and
    :class:`~recovery.cql.errors.SinkError` for a checkpoint Spark never wrote (every batch would look
    uncommitted), before anything is changed. Through Spark Connect without TLS, with
    credentials to send, the rows are written from this process (said in the log), as the
    flusher does."""
    registry = register_session(spark)      # the session's conf, and how it reaches stores
    wal = WalDir.at(wal_path)
    recorded = RecordedTarget.require(wal)
    checkpoint = checkpoint or recorded.checkpoint_location
    if checkpoint:
        checkpoint = ckpt.normal_location(checkpoint)
        if not (ckpt.exists(checkpoint) and ckpt.written_by_spark(checkpoint)):
            raise SinkError(f"{checkpoint} is not a Spark checkpoint (no metadata, offsets/ or "
                            f"commits/): recovering {wal.location} against it would take every "
                            f"batch for one Spark never committed; pass the query's checkpoint "
                            f"(nothing was changed)")
        binding.check(wal, checkpoint)
    target = load_target(wal, registry.session_conf)
    spark_jobs = SparkJobs(spark)
    writer = ExecutorsWriter.on_spark(spark_jobs, wal.root, lambda: target,
                                      store_uri=wal.remote.uri if wal.remote else None)
    if not may_carry_credentials(target, spark_jobs):
        log.warning("cassandra_wal: %s: through Spark Connect without TLS the Cassandra "
                    "credentials would travel to the server in the plan: the backlog is "
                    "written from this process (connect with sc://...;use_ssl=true)", wal.root)
        writer = None
    policy = RecoveryPolicy.OFFLINE_FORCED if force else RecoveryPolicy.OFFLINE
    return replay_wal(wal, checkpoint, target, policy=policy, writer=writer,
                      lock_wait_s=lock_wait_s)
