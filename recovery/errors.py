"""Errors of flushing and recovery. Each names the batch at fault and what to do next; and
:func:`is_transient`, the one place that decides which failures a retry can cure (the
write's own :class:`~recovery.cql.errors.FlushFailed` is the Cassandra floor's)."""

from __future__ import annotations

import pickle

from recovery.cql.errors import (ConnectionFailed, FlushFailed, SinkError, is_shutdown_error,
                        is_transient_answer)
from wal.errors import StoreUnavailable, WalCorrupted, WalError, WalLocked, WalStorageError


class RecoveryError(Exception):
    def __reduce__(self):
        return (self.__class__, self.args)


class RecoveryBlocked(RecoveryError):
    """A batch cannot be replayed (corrupted, or committed by Spark without a seal); replay
    stops there, since no later batch may be written before it."""

    def __init__(self, batch: int, detail: str, way_forward: str = ""):
        super().__init__(batch, detail, way_forward)
        self.batch, self.detail, self.way_forward = batch, detail, way_forward

    def __str__(self) -> str:
        msg = f"recovery stopped at batch {self.batch}: {self.detail}"
        return f"{msg}. {self.way_forward}" if self.way_forward else msg


class ColumnDroppedAfterSeal(RecoveryBlocked):
    """A sealed batch writes a column dropped at or after the write timestamps of its values:
    Cassandra hides every cell of it written at or before the drop, even once the column is
    added again, so the batch cannot land as sealed. No retry cures it; an operator chooses
    (:mod:`wal.amendments`, ``cassandra-wal amend``). A :class:`RecoveryBlocked`: replay stops
    there, and ``cassandra-wal recover`` says so with its exit code for a batch it cannot
    replay."""

    def __init__(self, batch: int, wal: str, columns: list, user_timestamps: bool,
                 adds: list = ()):
        RecoveryError.__init__(self, batch, wal, columns, user_timestamps, adds)
        self.batch, self.wal, self.user_timestamps = batch, wal, user_timestamps
        self.columns = [tuple(c) for c in columns]     # (column, drop time µs)
        # The CQL giving the table each column again (recovery.output.added_again): a
        # re-stamped batch still writes them, refused while the table has none of that name.
        self.adds = list(adds)
        self.detail, self.way_forward = "", ""

    def __str__(self) -> str:
        names = ", ".join(c for c, _ in self.columns)
        first = ", ".join(f"{c} at {t} µs" for c, t in self.columns)
        ways = (f"write it without them, losing their values in this batch: "
                f"cassandra-wal amend {self.wal} --batch {self.batch} "
                + " ".join(f"--without-column {c}" for c, _ in self.columns))
        if not self.user_timestamps:
            them = "it" if len(self.columns) == 1 else "them"
            ways += (f"; or write it at timestamps above the drop, so that its rows win over "
                     f"what was written to their keys since: cassandra-wal amend {self.wal} "
                     f"--batch {self.batch} --restamp (a re-stamped batch still writes {names}: "
                     f"if the table has {them} no more, add {them} again first, or Cassandra "
                     f"refuses the batch"
                     + (": " + "; ".join(self.adds) if self.adds else "") + ")")
        when = ("the write timestamps its rows carry (their own writetime values)"
                if self.user_timestamps else "the batch was sealed")
        return (f"batch {self.batch} writes {names}, dropped after {when} "
                f"({first}): Cassandra hides every cell of a dropped column written before the "
                f"drop, even once the column is added again, so re-adding it would lose these "
                f"values silently. Choose: {ways} (docs/runbook.md, 'A column dropped while "
                f"batches were pending')")


class WalBlocked(RecoveryError):
    """The flusher cannot go on (``WAL_DIR/blocked.json``): a batch that no retry can write.

    ``reason`` is the blocking error as the flusher recorded it (its type and message, which
    name the batch and the remedy); the block clears by itself once a drain gets past it."""

    def __init__(self, wal_root: str, reason: str):
        super().__init__(wal_root, reason)
        self.wal_root, self.reason = wal_root, reason

    def __str__(self) -> str:
        return (f"the WAL at {self.wal_root} is blocked: {self.reason} (docs/runbook.md; "
                "the block clears once the flusher gets past it)")


class NotFlushedYet(RecoveryError, TimeoutError):
    """Committed batches still not written to Cassandra when a wait for them timed out.

    ``pending`` lists ``(batch, rows not yet acknowledged)`` in batch order."""

    def __init__(self, wal_root: str, through: int, pending: list, waited_s: float):
        super().__init__(wal_root, through, pending, waited_s)
        self.wal_root, self.through, self.waited_s = wal_root, through, waited_s
        self.pending = [tuple(p) for p in pending]

    def __str__(self) -> str:
        shown = ", ".join(f"batch {b} ({rows} rows)" for b, rows in self.pending[:20])
        more = f" and {len(self.pending) - 20} more" if len(self.pending) > 20 else ""
        return (f"{self.wal_root}: batches Spark committed (through {self.through}) are not all "
                f"written to Cassandra after {self.waited_s:.0f}s; pending: {shown}{more}. "
                "They stay in the WAL and are written in order once Cassandra answers "
                "(cassandra-wal inspect shows them)")


class FlushTaskError(RecoveryError):
    """An error raised in a flush task or worker process that could not travel back as itself
    (a cassandra-driver exception that does not survive pickling unchanged): its type's name, its
    text, and whether it is transient, decided where it was raised (:func:`is_transient`)."""

    def __init__(self, type_name: str, text: str, transient: bool):
        super().__init__(type_name, text, transient)
        self.type_name, self.text, self.transient = type_name, text, transient

    def __str__(self) -> str:
        return f"{self.type_name}: {self.text}"


class FlushJobIncomplete(FlushFailed):
    """A flush job that failed part-way (a worker process died): ``results`` are what the
    tasks that did answer returned, so their segments are acknowledged and not written again;
    the rest fail with this error (transient: new workers take over)."""

    def __init__(self, batch: int, detail: str, results: list | None = None):
        super().__init__(batch, detail)
        self.results = list(results or ())

    def __reduce__(self):
        return (self.__class__, (self.batch, self.detail, self.results))


#: Every family of errors the sink raises on purpose; an error of none of them is a bug (the
#: flusher logs its traceback).
SINK_ERRORS = (SinkError, FlushFailed, RecoveryError, WalError)


def is_transient(exc: BaseException) -> bool:
    """Whether waiting and retrying can cure ``exc``: the one place that decides whether a
    failed flush keeps its batch and retries later (transient) or blocks the sink.

    Transient: cassandra-driver's timeouts, unavailable, overloaded, no host, lost connections
    (also when ``session.prepare`` meets them right after connecting), a transient
    :class:`FlushFailed`, :class:`~recovery.cql.errors.ConnectionFailed`, ``OSError`` (a shared
    filesystem away, a full disk an operator frees) and the log's own
    :class:`~wal.errors.WalStorageError`, :class:`~wal.errors.WalLocked`, and a thread pool
    that refuses work because the interpreter exits (:func:`is_shutdown_error`).
    Permanent: corruption (:class:`~wal.errors.WalCorrupted`, :class:`RecoveryBlocked`),
    Cassandra refusing the write (``FlushFailed(permanent=True)``), a configuration error
    (any other :class:`~recovery.cql.errors.SinkError`), and whatever else: an error nobody
    classified is a bug, which no retry cures either."""
    if isinstance(exc, FlushFailed):
        return not exc.permanent
    if isinstance(exc, FlushTaskError):
        return exc.transient
    if isinstance(exc, (RecoveryBlocked, WalCorrupted)):
        return False
    if isinstance(exc, (ConnectionFailed, WalLocked, WalStorageError, StoreUnavailable)):
        return True
    if isinstance(exc, (SinkError, WalError)):
        return False
    return isinstance(exc, OSError) or is_transient_answer(exc)


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling unchanged (type, text, :func:`is_transient`), as the
    sink's own errors do; else a :class:`FlushTaskError` carrying them. What a flush task or
    worker process returns to the driver, so that an unpicklable cassandra-driver exception neither
    fails the whole job nor turns into a plain error that blocks the sink."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc) and \
                is_transient(back) == is_transient(exc):
            return exc
    except Exception:  # noqa: BLE001 - any pickling failure: carried as text below
        pass
    return FlushTaskError(type(exc).__name__, str(exc), is_transient(exc))
