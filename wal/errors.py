"""The WAL's exception family.

Every error carries the location it is about (WAL directory, batch, segment) as attributes,
so callers can report it precisely and tools can map it to an exit code. All of them survive
pickling, because some are raised in Spark's Python workers and re-raised elsewhere.
"""

from __future__ import annotations


class WalError(Exception):
    """Base class of every error raised by the ``wal`` package."""

    def __reduce__(self):
        return (self.__class__, self.args)


class NotAWal(WalError):
    """The directory is not a WAL (no format marker), or cannot be read at all."""

    def __init__(self, path: str, reason: str = "no WAL_FORMAT marker"):
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{self.path} is not a cassandra-wal directory: {self.reason}"


class UnsupportedFormat(WalError):
    """The WAL was written by a newer (or unknown) format version."""

    def __init__(self, path: str, found: object, supported: int):
        super().__init__(path, found, supported)
        self.path, self.found, self.supported = path, found, supported

    def __str__(self) -> str:
        return (f"{self.path}: WAL format version {self.found!r} is not supported "
                f"(this build reads version {self.supported}); upgrade cassandra-wal-sink")


class WalCorrupted(WalError):
    """Bytes on disk do not match their checksum or framing.

    ``segment`` is the segment file (or seal/log key) at fault, ``offset`` the byte offset
    where the damage was detected, when known.
    """

    def __init__(self, path: str, detail: str, batch: int | None = None,
                 partition: int | None = None, segment: str | None = None,
                 offset: int | None = None):
        super().__init__(path, detail, batch, partition, segment, offset)
        self.path, self.detail, self.batch = path, detail, batch
        self.partition, self.segment, self.offset = partition, segment, offset

    def __str__(self) -> str:
        where = []
        if self.batch is not None:
            where.append(f"batch {self.batch}")
        if self.partition is not None:
            where.append(f"partition {self.partition}")
        if self.segment:
            where.append(f"segment {self.segment}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        loc = ", ".join(where)
        return f"WAL corrupted ({loc}): {self.detail} [{self.path}]" if loc else \
            f"WAL corrupted: {self.detail} [{self.path}]"


class SegmentTruncated(WalCorrupted):
    """A segment ends before its footer: a torn write or a truncated copy."""


class SegmentMissing(WalCorrupted):
    """A segment file that was to be read is not there. Corruption when its batch needs it; a
    reader beside a running sink must first ask whether the sink removed it meanwhile."""


class IllegalTransition(WalError):
    """A batch state change that the state machine (wal/FORMAT.md) forbids."""

    def __init__(self, batch: int, current: str | None, wanted: str, why: str = ""):
        super().__init__(batch, current, wanted, why)
        self.batch, self.current, self.wanted, self.why = batch, current, wanted, why

    def __str__(self) -> str:
        msg = f"batch {self.batch}: illegal transition {self.current or 'absent'} -> {self.wanted}"
        return f"{msg} ({self.why})" if self.why else msg


class RowsNotInLog(WalError):
    """The rows of a batch were asked of the log, which keeps its seal alone: a scale-out
    writer's tasks read them from its sealed segments (``WalLog.copy_rows`` copies them in)."""

    def __init__(self, path: str, batch: int):
        super().__init__(path, batch)
        self.path, self.batch = path, batch

    def __str__(self) -> str:
        return (f"batch {self.batch}: its rows are in its sealed segments, not in the log "
                f"[{self.path}]")


class WalLocked(WalError):
    """Another process holds the WAL's writer lock (a running sink, or a recovery)."""

    def __init__(self, path: str, detail: str = ""):
        super().__init__(path, detail)
        self.path, self.detail = path, detail

    def __str__(self) -> str:
        return (f"{self.path}: the WAL is open for writing by another process "
                f"(a running sink or recovery); stop it first or use read-only commands")


class StoreUnavailable(WalError):
    """The store that holds a WAL's files (HDFS, an S3 bucket) did not answer, or answered an
    error a retry may not meet again (:mod:`wal.store`): transient, it never blocks the sink."""

    def __init__(self, store: str, detail: str):
        super().__init__(store, detail)
        self.store, self.detail = store, detail

    def __str__(self) -> str:
        return f"{self.store}: the store holding the WAL's files failed: {self.detail}"


class WalStorageError(WalError):
    """The RocksDB log could not write: its disk is full or failing (RocksDB's "IO error").

    A retry may cure it (an operator frees the disk), so it never blocks the sink; RocksDB
    keeps such an error until the log is opened again, which the flusher does before it
    retries (``WalLog.reopen``)."""

    def __init__(self, path: str, detail: str):
        super().__init__(path, detail)
        self.path, self.detail = path, detail

    def __str__(self) -> str:
        return f"{self.path}: the WAL's log cannot write: {self.detail}"


class WalFull(WalError):
    """The WAL's size cap (``wal.maxBytes``) is reached and back-pressure gave up waiting."""

    def __init__(self, path: str, size: int, cap: int, waited_s: float):
        super().__init__(path, size, cap, waited_s)
        self.path, self.size, self.cap, self.waited_s = path, size, cap, waited_s

    def __str__(self) -> str:
        return (f"{self.path}: the WAL's backlog (batches sealed but not yet flushed to "
                f"Cassandra) is {self.size} bytes, over its cap wal.maxBytes={self.cap}; waited "
                f"{self.waited_s:.0f}s for the flusher to drain it (wal.backpressure, "
                f"wal.backpressure.timeoutSeconds). Is Cassandra reachable? Nothing is lost: the "
                f"batch was not committed and Spark re-runs it when the query restarts")


class WalBoundElsewhere(WalError):
    """A stream's WAL belongs to another query (``wal/binding.py``): two queries share one
    ``wal.path``, or the query's checkpoint was reset while its WAL was kept."""

    def __init__(self, path: str, bound, given):
        super().__init__(path, bound, given)
        self.path, self.bound, self.given = path, bound, given

    def __str__(self) -> str:
        return (f"the WAL at {self.path} belongs to the query checkpointed at "
                f"{self.bound.checkpoint} (query id {self.bound.query_id or 'unknown'}), not to "
                f"this one, checkpointed at {self.given.checkpoint} (query id "
                f"{self.given.query_id or 'unknown'}). Batch ids start again in every checkpoint, "
                f"so sharing a WAL would make this query's batches look already written. Give "
                f"this query a wal.path of its own (or leave wal.path unset: the WAL then lives "
                f"in the checkpoint). If the other query is gone for good, check with "
                f"'cassandra-wal inspect {self.path}' that nothing is pending, then delete "
                f"{self.path}")


class WalMoveRefused(WalError):
    """A stream's WAL moved (``wal.path`` changed) while the old WAL (``which="old"``) still
    holds committed batches not written to Cassandra, or the WAL moved to holds some of its
    own (``"new"``): ``pending`` lists ``(batch, rows not written)`` (``wal/move.py``)."""

    def __init__(self, old: str, new: str, which: str, pending: list):
        super().__init__(old, new, which, pending)
        self.old, self.new, self.which = old, new, which
        self.pending = [tuple(p) for p in pending]

    def __str__(self) -> str:
        shown = ", ".join(f"batch {b} ({rows} rows)" for b, rows in self.pending[:10])
        more = f" and {len(self.pending) - 10} more" if len(self.pending) > 10 else ""
        holder = self.old if self.which == "old" else self.new
        said = (f"the WAL moved from {self.old} to {self.new}, but {holder} still holds "
                f"batches Spark committed that are not written to Cassandra yet: {shown}{more}. "
                f"Moving now would leave them behind. ")
        if self.which == "old":
            return said + (f"Restart with wal.path={holder} (the sink writes them once "
                           f"Cassandra answers; 'cassandra-wal status {holder}' says when "
                           f"nothing is pending, or 'cassandra-wal recover {holder}' writes "
                           f"them with the query stopped), then move; nothing was staged")
        # A move back to a WAL left with batches of its own: no run writes them but recover.
        return said + (f"With the query stopped, 'cassandra-wal recover {holder}' writes them "
                       f"(once Cassandra answers), then restart with wal.path={holder}; or "
                       f"restart with wal.path={self.old} to stay where the query is; "
                       f"nothing was staged")


class BatchTooWide(WalError):
    """A batch with more segments (one per Spark task that wrote rows) or a segment with more
    chunks than the log's keys can order (``wal.format.MAX_SEGMENTS_PER_BATCH``,
    ``MAX_CHUNKS_PER_SEGMENT``): refused before its seal is written, so Spark never commits it
    and nothing of it is lost; the query must write it in fewer tasks."""

    def __init__(self, batch: int, what: str, count: int, limit: int):
        super().__init__(batch, what, count, limit)
        self.batch, self.what, self.count, self.limit = batch, what, count, limit

    def __str__(self) -> str:
        return (f"batch {self.batch}: {self.count:,} {self.what}; the WAL holds at most "
                f"{self.limit:,} (its log orders them by a fixed-width key). Write the batch in "
                f"fewer Spark tasks: fewer partitions before the sink (df.coalesce(n), or a "
                f"lower spark.sql.shuffle.partitions); for chunks, a larger "
                f"spark.sql.execution.arrow.maxRecordsPerBatch (a chunk is one Arrow batch "
                f"Spark hands the sink); nothing of the batch was sealed")


class WalRepairing(WalError):
    """A ``cassandra-wal repair`` of the WAL began and did not finish (``wal/repair.py``): its
    log is fenced (``m/repair``), so no flusher or recovery opens it before the repair is run
    again to its end; half a repair would let the query skip or misplace batches."""

    def __init__(self, path: str, from_batch: int, keep: str):
        super().__init__(path, from_batch, keep)
        self.path, self.from_batch, self.keep = path, from_batch, keep

    def __str__(self) -> str:
        return (f"{self.path}: a repair from batch {self.from_batch} (cassandra-wal repair) "
                f"began and did not finish: run 'cassandra-wal repair {self.path} --from "
                f"{self.from_batch}' again to finish it before the query or a recovery may use "
                f"the WAL (what it removed so far is kept in {self.keep})")


class RepairRefused(WalError):
    """``cassandra-wal repair`` refused to change anything: ``reason`` says why, ``hint`` what
    to do instead; ``usage``: the arguments were wrong (a batch Spark never planned, say)
    rather than the WAL or the checkpoint being in a state the repair cannot handle."""

    def __init__(self, reason: str, hint: str = "", usage: bool = False):
        super().__init__(reason, hint, usage)
        self.reason, self.hint, self.usage = reason, hint, usage

    def __str__(self) -> str:
        return self.reason
