"""Who is recovering a WAL, and so what recovery may do: one :class:`RecoveryPolicy` per real
situation, in the manner of RocksDB's ``WALRecoveryMode``.

Recovery (:func:`wal.catalog.describe`, then ``recovery.replay.Replayer.run``) always writes a
batch Spark committed and the WAL did not finish, in id order, with the timestamps of its seal.
What differs from one situation to the next is what it may do with a batch Spark has *not*
committed (its segments, entry or seal exist, ``commits/N`` does not), and who writes the rows:

* a batch Spark never committed may be *discarded* only when no run of the query can still
  commit it: Spark then re-runs the batch with the same id, and the re-run's files must not
  meet the old ones. Where a run may be live, the batch *waits* (``RecoveryAction.WAIT``);
* the rows are written by the driver, by Spark tasks or by worker processes
  (``wal.flush.mode``), which only the query's own flusher chooses from its options.

A batch the catalog cannot decide on (``RecoveryAction.ERROR``) stops recovery in every policy,
and a batch whose seal is its own commit point is committed in every policy.
"""

from __future__ import annotations

from enum import Enum


class RecoveryPolicy(Enum):
    #: The query's own flusher, in its driver: after each micro-batch, on its timer, at the
    #: query's stop, and ``sinks.wait_flushed`` draining a stopped run's WAL that no flusher
    #: drains any more.
    #:
    #: Committed, unwritten batches: written in order, through the flush mode's writer
    #: (``wal.flush.mode``: the driver, Spark tasks or worker processes).
    #: Batches Spark has not committed: wait (Spark is about to commit the batch, or re-runs
    #: it; the next drain decides).
    #: Writes: the query's flusher alone, holding the WAL's lock.
    #: Use case: every flush of a running query; what ``inspect``'s health, ``amend``,
    #: ``wait_flushed`` and a WAL move plan from, beside it.
    QUERY_FLUSHER = "the query's flusher"

    #: The query's start (Spark calls it synchronously, before the first batch of the run).
    #:
    #: Committed, unwritten batches: written in order from the driver itself, each request
    #: retried a few times only; in a scale-out mode (``executors`` with Spark up,
    #: ``processes``) none is written here: from the first of them on, the backlog is left to
    #: the flusher's first drain (:attr:`QUERY_FLUSHER`).
    #: Batches Spark has not committed: discarded (no run can commit them any more, and Spark
    #: re-runs them with the same ids right after).
    #: Writes: the driver only, never a Spark task or worker process.
    #: Use case: the recovery of a query restarted after a crash, a kill or a stop.
    QUERY_START = "the query's start"

    #: ``cassandra-wal recover`` (and ``sinks.recover``) without ``--force``
    #: (``force=True``), beside a query it cannot see.
    #:
    #: Committed, unwritten batches: written in order, by this process, its worker processes
    #: (``--processes``) or Spark tasks (``sinks.recover``): the writer its caller hands.
    #: Batches Spark has not committed: wait. A live run it does not see (its flusher not
    #: started yet, or on another host when the WAL is on a store) may be about to commit
    #: them; the query's next start discards what Spark never committed.
    #: Writes: this process's writer, holding the WAL's lock (so no flusher writes meanwhile).
    #: Use case: writing a stopped query's backlog by hand (Cassandra was away too long).
    OFFLINE = "offline, beside a query it cannot see"

    #: ``cassandra-wal recover --force`` (``sinks.recover(force=True)``): the operator says no
    #: run of the query is live anywhere.
    #:
    #: Committed, unwritten batches: written as by :attr:`OFFLINE`.
    #: Batches Spark has not committed: discarded, as at :attr:`QUERY_START`.
    #: Writes: as :attr:`OFFLINE`.
    #: Use case: leaving a WAL with nothing pending, for a query that will not start again.
    OFFLINE_FORCED = "offline, the query stopped everywhere"

    #: A batch job's WAL (``df.write``, :mod:`wal.batch_jobs`), written at the job's commit, or left
    #: by a job that died and written by the next one: there is no checkpoint, each seal is
    #: its own commit point.
    #:
    #: Committed, unwritten batches (every sealed one): written in order by the process that
    #: commits the job (Spark's commit worker: it cannot start a Spark job), or by
    #: ``wal.flush.mode=processes`` worker processes of it.
    #: Batches not committed (segments without a seal: a failed job's, or a lost task
    #: attempt's): discarded; nothing will seal them.
    #: Writes: the job's commit (or the job that found the WAL left), holding the job's lock.
    #: Use case: every batch job.
    BATCH_JOB = "a batch job"

    @property
    def discards_uncommitted(self) -> bool:
        """Whether a batch Spark never committed is discarded (else it waits)."""
        return self in _DISCARDING

    @property
    def writes_through_flush_mode(self) -> bool:
        """Whether the query's ``wal.flush.mode`` picks the writer (Spark tasks, worker
        processes): only the running query's flusher; every other writes from the driver or
        with the writer its caller hands."""
        return self is RecoveryPolicy.QUERY_FLUSHER


_DISCARDING = frozenset({RecoveryPolicy.QUERY_START, RecoveryPolicy.OFFLINE_FORCED,
                         RecoveryPolicy.BATCH_JOB})
