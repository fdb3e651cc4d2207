"""Errors of flushing and recovery. Each names the batch at fault and what to do next."""

from __future__ import annotations


class RecoveryError(Exception):
    def __reduce__(self):
        return (self.__class__, self.args)


class FlushFailed(RecoveryError):
    """Cassandra did not acknowledge a batch's rows within the retry budget.

    The batch stays SEALED/FLUSHING in the WAL, and no later batch is flushed before it: the
    next drain (the next micro-batch, the next query start, or ``cassandra-wal recover``)
    resumes it where it stopped.
    """

    def __init__(self, batch: int, detail: str, rows_acknowledged: int = 0,
                 permanent: bool = False):
        super().__init__(batch, detail, rows_acknowledged, permanent)
        self.batch, self.detail, self.rows_acknowledged = batch, detail, rows_acknowledged
        self.permanent = permanent   # Cassandra refused the write: retrying alone won't help

    def __str__(self) -> str:
        return (f"flush of batch {self.batch} failed after {self.rows_acknowledged} acknowledged "
                f"rows: {self.detail}; the batch stays in the WAL and is retried in order")


class RecoveryBlocked(RecoveryError):
    """A batch cannot be replayed (corrupted, or committed by Spark without a seal); replay
    stops there, since no later batch may be written before it."""

    def __init__(self, batch: int, detail: str, way_forward: str = ""):
        super().__init__(batch, detail, way_forward)
        self.batch, self.detail, self.way_forward = batch, detail, way_forward

    def __str__(self) -> str:
        msg = f"recovery stopped at batch {self.batch}: {self.detail}"
        return f"{msg}. {self.way_forward}" if self.way_forward else msg
