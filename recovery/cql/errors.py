"""Typed exceptions of the Cassandra sink.

Every error about what the user gave (options, schema, values, the connection) is a
:class:`SinkError`; a write that Cassandra did not acknowledge is a :class:`FlushFailed`
(recovery's and the WAL's own errors complete the families: ``recovery.errors.SINK_ERRORS``).
Each keeps the thing at fault as attributes (``option``, ``column``, ``keyspace`` ...) so
callers and tests can react to it without parsing text, and renders a one-line message that
names it.

Why here, at the bottom of :mod:`recovery` though :mod:`recovery` and :mod:`sinks` raise them
too: the Cassandra floor raises them first (a value it cannot convert, a connection refused),
it may import nothing above itself, and one family needs one owner. So the floors above import
them from here, and users catch them as :mod:`sinks` exports them (``sinks.OptionError``): the
public names, which stay wherever this module lives. The WAL below has its own family
(:mod:`wal.errors`), as it knows nothing of Cassandra.

Why the pickling care: these exceptions are raised inside Spark's Python workers and travel
back to the driver pickled. ``Exception`` pickles as ``cls(*self.args)``; because our
constructors take the context fields rather than the message, each class lists its fields in
``_fields`` and :meth:`SinkError.__reduce__` rebuilds it from them.

Secrets: no message ever contains a password. :func:`wal.secrets.is_secret` is the one rule of
what is secret, for option names and config fields alike: :class:`OptionError` redacts the value of
such an option, the configs leave such fields out of their repr and of ``target.json``
(:mod:`recovery.cql.config`), a connection's errors have their values replaced
(:mod:`recovery.cql.connection`) and ``docs/options.md`` marks such options.
:class:`ConnectionFailed` carries hosts and a reason only (callers pass cassandra-driver's reason,
which never holds the password).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from typing import Any, ClassVar

from cassandra import (
    CoordinationFailure,
    InvalidRequest,
    OperationTimedOut,
    Unavailable,
    WriteFailure,
    WriteTimeout,
)

from wal.secrets import is_secret

REDACTED = "<redacted>"

class SinkError(Exception):
    """Base of every error the sink raises on purpose."""

    _fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str) -> None:
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), tuple(getattr(self, f) for f in self._fields))


class OptionError(SinkError):
    """An option is unknown, malformed, missing or refused.

    ``option`` is the user's canonical spelling (Spark lower-cases option keys; we report
    ``spark.cassandra.output.concurrent.writes``, not the lower-cased key). ``value`` is None
    when there is nothing worth echoing (a missing option), and is redacted for secrets.
    """

    _fields = ("option", "value", "reason")

    def __init__(self, option: str, value: str | None, reason: str) -> None:
        if value is not None and is_secret(option):
            value = REDACTED
        self.option = option
        self.value = value
        self.reason = reason
        shown = "" if value is None else f" = {value!r}"
        super().__init__(f"option {option!r}{shown}: {reason}")

    @classmethod
    def unknown(cls, option: str, known: Iterable[str]) -> OptionError:
        """Error for an option we do not know, suggesting the closest known name.

        The value is deliberately not echoed: a misspelt password option would otherwise
        print the password.
        """
        known = list(known)
        by_lower = {name.lower(): name for name in known}
        close = difflib.get_close_matches(option.lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
        return cls(option, None, f"unknown option{hint} (see docs/options.md)")


class SchemaError(SinkError):
    """The DataFrame does not fit the Cassandra table (missing, extra or mistyped column)."""

    _fields: ClassVar[tuple[str, ...]] = ("column", "reason")

    def __init__(self, column: str, reason: str) -> None:
        self.column = column
        self.reason = reason
        super().__init__(f"column {column!r}: {reason}")


class NullPrimaryKeyError(SchemaError):
    """A row has a null in a partition-key or clustering column; Cassandra rejects it."""

    _fields: ClassVar[tuple[str, ...]] = ("column", "row_hint")

    def __init__(self, column: str, row_hint: Any = None) -> None:
        where = "" if row_hint is None else f" (first at {row_hint})"
        reason = f"primary key column is null{where}; Cassandra cannot store a row without its key"
        SchemaError.__init__(self, column, reason)
        self.row_hint = row_hint


class InvalidValueError(SchemaError):
    """A value cannot be converted to its column's CQL type (bad uuid, out-of-range tinyint).

    The schema matched, but this row's data does not: it is reported before anything is
    sent, so a batch is never half-written because of one bad value.
    """

    _fields: ClassVar[tuple[str, ...]] = ("column", "row_hint", "reason")

    def __init__(self, column: str, row_hint: Any, reason: str) -> None:
        where = "" if row_hint is None else f" (at {row_hint})"
        SchemaError.__init__(self, column, f"{reason}{where}")
        self.reason = reason
        self.row_hint = row_hint


class UnknownKeyspaceError(SinkError):
    """The keyspace does not exist in the cluster's schema."""

    _fields = ("keyspace",)

    def __init__(self, keyspace: str) -> None:
        self.keyspace = keyspace
        super().__init__(f"keyspace {keyspace!r} does not exist; create it before writing")


class UnknownTableError(SinkError):
    """The table does not exist in the keyspace."""

    _fields = ("keyspace", "table")

    def __init__(self, keyspace: str, table: str) -> None:
        self.keyspace = keyspace
        self.table = table
        super().__init__(f"table {keyspace}.{table} does not exist; create it before writing")


class CounterTableError(SinkError):
    """The target is a counter table, which this sink refuses.

    A replayed write-ahead-log flush must write the very same cells again. Counter updates
    are increments, so a replay would add twice.
    """

    _fields = ("keyspace", "table")

    def __init__(self, keyspace: str, table: str) -> None:
        self.keyspace = keyspace
        self.table = table
        super().__init__(
            f"table {keyspace}.{table} is a counter table: counter updates are increments, not "
            "idempotent, so a replay after a failure would double count; write to a regular table"
        )


class ConnectionFailed(SinkError):
    """The cluster could not be reached, or refused us (auth, TLS, schema refresh)."""

    _fields = ("hosts", "reason")

    def __init__(self, hosts: Iterable[str], reason: str) -> None:
        self.hosts = tuple(str(h) for h in hosts)
        self.reason = reason
        super().__init__(f"cannot connect to Cassandra at {', '.join(self.hosts)}: {reason}")


class FlushFailed(Exception):
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

    def __reduce__(self):
        return (self.__class__, self.args)

    def __str__(self) -> str:
        return (f"flush of batch {self.batch} failed after {self.rows_acknowledged} acknowledged "
                f"rows: {self.detail}; the batch stays in the WAL and is retried in order")


@functools.cache
def transient_cassandra_driver_errors() -> tuple[type[BaseException], ...]:
    """Errors of cassandra-driver that a later attempt may not meet: timeouts, a replica or
    the coordinator unavailable or overloaded, no connection. The Upserter retries statements
    that fail with them; anything else Cassandra answers is a refusal of the write.

    Three of them are imported on first use: cassandra-driver's cluster, connection and protocol
    modules take about 75 ms to import, and Spark's one-shot Python workers, which import this
    module twice a micro-batch, never need them (``tests/unit/test_architecture.py``)."""
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException
    from cassandra.protocol import OverloadedErrorMessage

    return (OperationTimedOut, WriteTimeout, Unavailable, OverloadedErrorMessage,
            NoHostAvailable, ConnectionException, CoordinationFailure, WriteFailure)


#: What Cassandra answers, in its own words, while its nodes disagree on the schema for a
#: moment (a table or keyspace just made, the coordinator not told yet), or when the table was
#: dropped (made again, the write goes through): a retry or a revert cures both.
_SCHEMA_NOT_YET = ("unconfigured table", "does not exist")


def is_shutdown_error(exc: BaseException | None) -> bool:
    """``exc`` is, or was caused by, a thread pool refusing work because the interpreter is
    exiting (cassandra-driver's, once ``concurrent.futures`` shut its pools down at exit):
    no verdict on a batch, and no later attempt in this process can succeed."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if "cannot schedule new futures after" in str(exc):   # raised, or carried in a text
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def is_transient_answer(error: BaseException) -> bool:
    """Whether an error Cassandra (or cassandra-driver) answered a write with may not come back on
    a later attempt: :func:`transient_cassandra_driver_errors`, a ``ServerError`` (a node's own
    failure, not a verdict on the row), and a table or keyspace the coordinator does not know yet (a
    schema disagreement) or any more (a dropped table: made again, the write goes through).
    A pool shut down by the interpreter's exit (:func:`is_shutdown_error`) is no answer at
    all. Anything else is Cassandra refusing the row."""
    from cassandra.protocol import ServerError

    if isinstance(error, (*transient_cassandra_driver_errors(), ServerError)) or \
            is_shutdown_error(error):
        return True
    text = str(error).lower()
    return isinstance(error, InvalidRequest) and any(s in text for s in _SCHEMA_NOT_YET)
