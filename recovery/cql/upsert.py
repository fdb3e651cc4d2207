"""Idempotent upserts of sealed rows: the only code that writes rows to Cassandra.

Every row is bound to one prepared ``INSERT ... USING TIMESTAMP ?`` (and ``TTL ?`` when asked)
with the timestamp fixed in the batch's seal, so writing a chunk twice leaves the very same
cells: Cassandra keeps one cell per column and timestamp, and a newer write by anyone else
still wins. A TTL counts from the seal, on the driver's measure of the batch's age
(:mod:`recovery.cql.batch_age`); a row whose TTL ran out while it was pending is written as what its
expired cells would have left, a tombstone per written column at its sealed timestamp
(``DELETE <columns> ... USING TIMESTAMP ?``). In a change stream (:mod:`recovery.cql.changes`) a row
marked a delete is a ``DELETE`` of its row or partition at its sealed timestamp.

Building requests: values are serialized a whole column at a time (:mod:`recovery.cql.encode`, the
cassandra-driver's own bytes); rows go into UNLOGGED batches whose rows all live on the same
replicas: the rows of up to 10 partitions owned by the same replica set (``replica_set``, the
default), or one partition's rows (``partition``). A replica-set batch is still applied by its
replicas only, and rows of few per partition need several times fewer requests, which is where a
Python client spends its CPU (``docs/performance.md``).

Executing: a chunk's requests run through cassandra-driver's ``execute_concurrent`` with a
bounded number in flight, while the next chunk is read and its requests built
(:meth:`Upserter.write_chunks`); statements that failed with a transient error (timeouts,
unavailable, overloaded, lost connections) are retried with exponential back-off and jitter
(tenacity); anything else fails at once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa
from cassandra import InvalidRequest
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, BoundStatement
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from wal import clock

from . import batch_age
from .batch_age import BatchAge
from .batch_limits import BatchLimits, read_batch_limits
from .changes import PARTITION_DELETE, ROW_DELETE, UPSERT, operations
from .config import WriteConfig
from .convert import row_converter
from .encode import CellEncoder, fixed_width
from .errors import FlushFailed, is_shutdown_error, is_transient_answer
from .table import TableSchema, parse_cql_type, quote

T = TypeVar("T")
AUTO_BATCH_ROWS = 32
_BIGINT, _INT = struct.Struct(">q"), struct.Struct(">i")
#: Terms of :meth:`Upserter.batch_size`, rounded up from what Cassandra 5.0.8 counted for
#: multi-partition batches (``docs/performance.md``): per row, per regular (non-key) column,
#: and the weight of a non-frozen collection's bytes (each element is a cell of its own).
ROW_OVERHEAD, CELL_OVERHEAD, MULTI_CELL_WEIGHT = 48, 24, 11
#: The TTL of a row whose TTL ran out while it was pending: it is written as tombstones
#: (:meth:`Upserter._tombstone`), not as cells.
EXPIRED = type("Expired", (), {"__repr__": lambda self: "EXPIRED"})()
#: What ends the bound values of a change stream's row that is a delete (:mod:`recovery.cql.changes`):
#: it is written as a DELETE of its row, or of its partition (:meth:`Upserter._key_delete`).
ROW_DELETED = type("RowDeleted", (), {"__repr__": lambda self: "ROW_DELETED"})()
PARTITION_DELETED = type("PartitionDeleted", (), {"__repr__": lambda self: "PARTITION_DELETED"})()
_DELETE_MARKS = {ROW_DELETE: ROW_DELETED, PARTITION_DELETE: PARTITION_DELETED}
_SCALAR_TYPES = frozenset({"ascii", "bigint", "blob", "boolean", "counter", "date", "decimal",
                           "double", "duration", "float", "inet", "int", "smallint", "text",
                           "time", "timestamp", "timeuuid", "tinyint", "uuid", "varchar",
                           "varint"})


def size_model(table: TableSchema, table_columns: Sequence[str]) -> tuple[np.ndarray, int]:
    """How :meth:`Upserter.batch_size` counts a row: a weight per column for its bytes (1, or
    :data:`MULTI_CELL_WEIGHT` for a non-frozen collection or UDT) and a fixed overhead."""
    weights = []
    for name in table_columns:
        cql = parse_cql_type(table.column_type(name))
        multi_cell = not cql.frozen and (bool(cql.params) or cql.name not in _SCALAR_TYPES)
        weights.append(MULTI_CELL_WEIGHT if multi_cell else 1)
    regular = sum(1 for name in table_columns if name not in table.primary_key)
    return np.array(weights, dtype=np.int64), ROW_OVERHEAD + CELL_OVERHEAD * regular


class _Transient(Exception):
    """Some statements failed with a transient error; tenacity retries just those."""

    def __init__(self, pending, last_error):
        super().__init__(str(last_error))
        self.pending, self.last_error = pending, last_error


@dataclass
class RateLimiter:
    """At most ``mb_per_s`` megabytes a second (``spark.cassandra.output.throughputMBPerSec``)."""

    mb_per_s: float | None
    monotonic: Callable[[], float] = clock.monotonic
    sleep: Callable[[float], None] = clock.sleep
    _start: float | None = None
    _sent: float = 0.0

    def account(self, nbytes: int) -> None:
        if not self.mb_per_s:
            return
        now = self.monotonic()
        if self._start is None:
            self._start = now
        self._sent += nbytes
        due = self._start + self._sent / (self.mb_per_s * 1_000_000)
        if due > now:
            self.sleep(due - now)


class Upserter:
    """Writes Arrow chunks of one table's rows with fixed write timestamps."""

    def __init__(self, session, table: TableSchema, columns: Sequence[str], write: WriteConfig,
                 consistency_level: int | None = None,
                 sleep: Callable[[float], None] = clock.sleep,
                 clock_us: Callable[[], int] = clock.now_us,
                 on_retry: Callable[[], None] | None = None,
                 monotonic_ns: Callable[[], int] = clock.monotonic_ns):
        self.session, self.table, self.columns, self.write = session, table, list(columns), write
        self._on_retry = on_retry    # told before each retry of failed requests (the metrics)
        self.table_columns = [table.resolve_column(c) or c for c in self.columns]
        cols = ", ".join(quote(c) for c in self.table_columns)
        marks = ", ".join("?" for _ in self.columns)
        using = "USING TIMESTAMP ?"
        # A TTL counts from the seal, not from each write (:meth:`_expiring`).
        self._ttl = bool(write.ttl_column or write.ttl_seconds)
        if self._ttl:
            using += " AND TTL ?"
        cql = (f"INSERT INTO {quote(table.keyspace)}.{quote(table.table)} ({cols}) "
               f"VALUES ({marks}) {using}")
        self.statement = session.prepare(cql)
        self.statement.is_idempotent = True
        if consistency_level is not None:
            self.statement.consistency_level = consistency_level
        self.consistency_level = consistency_level
        meta = self.statement.column_metadata
        self._encode = CellEncoder(row_converter(table, self.columns, ignore_nulls=write.ignore_nulls),
                                   [meta[i].type for i in range(len(self.columns))],
                                   self.statement.protocol_version)
        self._key_positions = [self.table_columns.index(c) for c in table.partition_key]
        self._batch_rows = write.batch_size_rows or AUTO_BATCH_ROWS
        self._weights, self._row_overhead = size_model(table, self.table_columns)
        self._group = write.batch_grouping_key != "none"
        self._by_replicas = write.batch_grouping_key == "replica_set"
        # Only replica-set batches span partitions, the batches the node's limits apply to.
        self.limits = read_batch_limits(session) if self._by_replicas else BatchLimits()
        self._batch_bytes = write.batch_size_bytes or self.limits.warn_bytes
        self._max_partitions = self.limits.partitions
        self._metadata = session.cluster.metadata if self._by_replicas else None
        # clock_us: the wall clock of group_requests called without the second to build in
        # (tests); write_chunks counts on the driver's measure (recovery.cql.batch_age), never on it.
        self._sleep, self._clock_us, self._monotonic_ns = sleep, clock_us, monotonic_ns
        self._limiter = RateLimiter(write.throughput_mb_per_s, sleep=sleep)
        # Rows whose TTL ran out while pending: a DELETE of the columns they write (the
        # regular ones; with ignoreNulls, those set), prepared on first use.
        self._regular = [i for i, c in enumerate(self.table_columns) if c not in table.primary_key]
        self._deletes: dict[tuple[int, ...], tuple] = {}      # columns -> (prepared, key cells)
        # A change stream's deletes (:mod:`recovery.cql.changes`): mark -> (prepared, key cells).
        self._key_deletes: dict[object, tuple] = {}
        self._prepared = {self.statement.query_id: self.statement}
        self._bind = self._bind_marked if self._ttl or write.op_column else self.bound

    # -- building statements -------------------------------------------------------------
    def parameters(self, batch: pa.RecordBatch, first_ts: int) -> list[tuple]:
        """Every row of ``batch`` as serialized bind values: the data columns (column-wise,
        :class:`~recovery.cql.encode.CellEncoder`), the write timestamp, the TTL."""
        return self._encoded(batch, first_ts)[0]

    def requests(self, batch: pa.RecordBatch, first_ts: int) -> list[tuple]:
        """The requests writing every row of ``batch`` (:meth:`parameters` then
        :meth:`statements`, with the rows' sizes counted while encoding)."""
        return self.group_requests([(batch, first_ts)])

    def group_requests(self, chunks: Sequence[tuple[pa.RecordBatch, int]],
                       sealed_at_us: int | None = None, now_s: int | None = None) -> list[tuple]:
        """The requests writing every row of these ``(chunk, first write timestamp)`` pairs
        together: a partition's rows from several chunks share requests. ``sealed_at_us``:
        when the batch was sealed, which TTLs count from (None: from now); ``now_s``: the
        second they are built in (default: the clock's)."""
        rows: list[tuple] = []
        sizes: list[int] | None = [] if self._by_replicas else None
        marked = False
        for batch, first_ts in chunks:
            chunk_rows, weighted_bytes, some = self._encoded(batch, first_ts, sealed_at_us, now_s)
            rows.extend(chunk_rows)
            marked = marked or some
            if sizes is not None:   # only replica-set batches are sized
                sizes.extend((weighted_bytes + self._row_overhead).tolist())
        # Rows are bound as they always were unless some ran out (then as tombstones) or are
        # a change stream's deletes.
        return self.statements(rows, sizes, self._bind_marked if marked else self.bound)

    def _encoded(self, batch: pa.RecordBatch, first_ts: int, sealed_at_us: int | None = None,
                 now_s: int | None = None) -> tuple[list[tuple], np.ndarray | None, bool]:
        """The rows' bind values, their weighted bytes (replica-set grouping) and whether any
        of them is marked: a tombstone row (:meth:`_expired`) or a delete (:meth:`_deleting`)."""
        n = batch.num_rows
        weights = self._weights if self._by_replicas else None
        columns, value_bytes = self._encode.encode(batch.select(self.columns), weights)
        if self.write.writetime_column:
            stamps = micros(batch.column(self.write.writetime_column))
            columns.append(fixed_width(stamps.fill_null(0).to_numpy(), ">i8", stamps))
        elif self.write.writetime_micros is not None:
            columns.append([_BIGINT.pack(self.write.writetime_micros)] * n)
        else:
            columns.append(fixed_width(np.arange(first_ts, first_ts + n, dtype=np.int64), ">i8"))
        if not self._ttl:
            rows = list(zip(*columns))
            return rows, value_bytes, self._deleting(batch, rows) is not None
        ttls, alive = self._expiring(batch, sealed_at_us, now_s)
        # A null TTL is sent unset, so that Cassandra applies the table's default.
        nulls_of = batch.column(self.write.ttl_column) if self.write.ttl_column else None
        columns.append([UNSET_VALUE if cell is None else cell
                        for cell in fixed_width(ttls, ">i4", nulls_of)])
        rows = list(zip(*columns))
        deletes = self._deleting(batch, rows)
        if alive is None:
            return rows, value_bytes, deletes is not None
        if deletes is not None:      # a delete has no TTL to run out
            alive = alive | deletes
        rows, value_bytes, expired = self._expired(rows, alive, value_bytes)
        return rows, value_bytes, expired or deletes is not None

    def _deleting(self, batch: pa.RecordBatch, rows: list[tuple]) -> np.ndarray | None:
        """A change stream's deletes among ``rows`` (``batch``'s bound values) marked, in
        place, with :data:`ROW_DELETED` or :data:`PARTITION_DELETED` after their values; which
        rows are deletes (None: none, or not a change stream)."""
        if not self.write.op_column:
            return None
        kinds = operations(batch.column(self.write.op_column), self.write)
        deletes = kinds != UPSERT
        if not deletes.any():
            return None
        for i in np.flatnonzero(deletes).tolist():
            rows[i] = tuple(rows[i]) + (_DELETE_MARKS[int(kinds[i])],)
        return deletes

    def _expired(self, rows: list[tuple], alive: np.ndarray, value_bytes: np.ndarray | None
                 ) -> tuple[list[tuple], np.ndarray | None, bool]:
        """``rows`` with those not ``alive`` (their TTL ran out while they were pending) made
        tombstone rows (:func:`_tombstone_row`); one with no regular cell to delete (only its
        key, or only nulls left out with ignoreNulls) is left out: an expired row marker is all
        it would have left."""
        gone = []
        for i in np.flatnonzero(~alive).tolist():
            row = _tombstone_row(rows[i], self._regular)
            if row is None:
                gone.append(i)
            else:
                rows[i] = row
        tombstones = len(gone) < len(alive) - int(alive.sum())
        if not gone:
            return rows, value_bytes, tombstones
        keep = np.ones(len(rows), dtype=bool)
        keep[gone] = False
        return ([row for row, k in zip(rows, keep) if k],
                value_bytes[keep] if value_bytes is not None else None, tombstones)

    def _expiring(self, batch: pa.RecordBatch, sealed_at_us: int | None,
                  now_s: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Each row's TTL to send, and which rows are still alive (None: all of them).

        A row's TTL (its ``ttl`` column, else the ``ttl`` option) counts from when its batch was
        sealed: Cassandra expires a cell at the second it applies the write plus the TTL sent,
        so every write sends the TTL less the whole seconds between the seal's second and
        ``now_s`` (the second it is on the driver's measure, :mod:`recovery.cql.batch_age`), and every write
        of a row, the first and any replay, expires it at the same second (up to the one a
        write may take to arrive): a replay after a long outage neither extends its life nor
        revives it. A row whose TTL has run out by now is written as the tombstones its expired
        cells would be (:meth:`_expired`). ``0`` means no expiry, as in CQL. (A null in the
        column is sent unset: the table's ``default_time_to_live``, which Cassandra counts from
        each write.)
        """
        if self.write.ttl_column:
            ttls = batch.column(self.write.ttl_column).cast(pa.int64()).fill_null(0).to_numpy()
        else:
            ttls = np.full(batch.num_rows, self.write.ttl_seconds, dtype=np.int64)
        if sealed_at_us is None:
            return ttls, None
        now_s = self._clock_us() // 1_000_000 if now_s is None else now_s
        elapsed = max(0, now_s - sealed_at_us // 1_000_000)
        expiring = ttls > 0
        ttls = np.where(expiring, ttls - elapsed, 0)
        alive = ~expiring | (ttls > 0)
        return ttls, (None if alive.all() else alive)

    def bound(self, values: tuple) -> BoundStatement:
        """A bound statement of already serialized values (what ``bind`` would produce)."""
        statement = BoundStatement(self.statement)
        statement.values = values
        return statement

    def _bind_marked(self, values: tuple) -> BoundStatement:
        """:meth:`bound`, or, for a row whose TTL ran out while pending, its tombstones; for a
        change stream's delete, the DELETE of its row or partition."""
        mark = values[-1]
        if mark is EXPIRED:
            return self._tombstone(values)
        if mark is ROW_DELETED or mark is PARTITION_DELETED:
            return self._key_delete(values, mark)
        return self.bound(values)

    def _key_delete(self, values: tuple, mark: object) -> BoundStatement:
        """A change stream's delete (:mod:`recovery.cql.changes`): ``DELETE FROM ... USING TIMESTAMP ?
        WHERE <primary key>`` (:data:`ROW_DELETED`) or ``WHERE <partition key>``
        (:data:`PARTITION_DELETED`), at the row's sealed timestamp: the same tombstone at
        every write."""
        prepared, keys = self._key_deletes.get(mark) or self._prepare_key_delete(mark)
        statement = BoundStatement(prepared)
        statement.values = [values[len(self.columns)]] + [values[i] for i in keys]
        return statement

    def _prepare_key_delete(self, mark: object) -> tuple:
        key = self.table.primary_key if mark is ROW_DELETED else self.table.partition_key
        prepared = self._prepare(
            f"DELETE FROM {quote(self.table.keyspace)}.{quote(self.table.table)} "
            f"USING TIMESTAMP ? WHERE " + " AND ".join(f"{quote(c)} = ?" for c in key))
        self._key_deletes[mark] = (prepared, [self.table_columns.index(c) for c in key])
        return self._key_deletes[mark]

    def _prepare(self, cql: str):
        """A DELETE prepared as the INSERT is (idempotent, at its consistency level) and kept
        by query id, for a retry to bind again (:meth:`_rebound`)."""
        prepared = self.session.prepare(cql)
        prepared.is_idempotent = True
        if self.consistency_level is not None:
            prepared.consistency_level = self.consistency_level
        self._prepared[prepared.query_id] = prepared
        return prepared

    def _tombstone(self, values: tuple) -> BoundStatement:
        """What a row that expired while pending leaves, as Cassandra would have it once its
        cells expired: a tombstone per column it writes (an expired cell is a tombstone at its
        write timestamp), at its sealed timestamp; so an older cell of another writer in those
        columns stays hidden, and its other columns are untouched (a row deletion would hide
        them too). ``DELETE <columns> FROM ... USING TIMESTAMP ? WHERE <primary key>``: the
        same request at every write, as idempotent as the INSERT it stands for."""
        columns = tuple(i for i in self._regular if values[i] is not UNSET_VALUE)
        delete = self._deletes.get(columns) or self._prepare_delete(columns)
        prepared, keys = delete
        statement = BoundStatement(prepared)
        statement.values = [values[len(self.columns)]] + [values[i] for i in keys]
        return statement

    def _prepare_delete(self, columns: tuple[int, ...]) -> tuple:
        """The DELETE of these columns (positions) and the key cells it is bound with. Static
        columns alone are deleted by partition (Cassandra refuses a clustering key then: the
        schema this sink records does not tell static columns, the node does)."""
        names = ", ".join(quote(self.table_columns[i]) for i in columns)
        head = (f"DELETE {names} FROM {quote(self.table.keyspace)}.{quote(self.table.table)} "
                f"USING TIMESTAMP ? WHERE ")
        key = self.table.primary_key
        try:
            prepared = self._prepare(head + " AND ".join(f"{quote(c)} = ?" for c in key))
        except InvalidRequest:
            if not self.table.clustering_key:
                raise
            key = self.table.partition_key
            prepared = self._prepare(head + " AND ".join(f"{quote(c)} = ?" for c in key))
        self._deletes[columns] = (prepared, [self.table_columns.index(c) for c in key])
        return self._deletes[columns]

    def statements(self, params: list[tuple], sizes: list[int] | None = None,
                   bind: Callable[[tuple], BoundStatement] | None = None) -> list[tuple]:
        """(statement, None) pairs: one bound row, or an UNLOGGED batch whose rows all live on
        the same replicas (one partition with ``partition`` grouping; up to the node's limit of
        partitions of one replica set with ``replica_set``, :attr:`limits`).
        ``sizes``: each row's :meth:`batch_size` (computed here when not given); ``bind``: how
        a row is bound (default: :meth:`bound`, or tombstones for an expired one)."""
        bind = bind or self._bind
        if not self._group:
            return [(bind(p), None) for p in params]
        if sizes is None:
            sizes = [self.batch_size([p]) for p in params] if self._by_replicas else [0] * len(params)
        partitions: dict[tuple, list] = {}   # key cells -> [rows, their size]
        keys = self._key_positions
        for p, size in zip(params, sizes):   # serialized key cells: equal bytes, same partition
            entry = partitions.setdefault(tuple([p[i] for i in keys]), [[], 0])
            entry[0].append(p)
            entry[1] += size
        if not self._by_replicas:
            units = [[entry] for entry in partitions.values()]
        else:
            by_replicas: dict[object, list[list]] = {}
            for key, entry in partitions.items():
                by_replicas.setdefault(self._replica_set(key), []).append(entry)
            units = list(by_replicas.values())
        return [statement for unit in units for statement in self._pack(unit, bind)]

    def _replica_set(self, key_cells: tuple) -> object:
        """The nodes owning this partition (the partition itself when cassandra-driver has no
        token map: then it is grouped alone, as with ``partition``)."""
        if len(key_cells) == 1:
            routing_key = key_cells[0]
        else:
            routing_key = b"".join(len(c).to_bytes(2, "big") + c + b"\x00" for c in key_cells)
        replicas = self._metadata.get_replicas(self.table.keyspace, routing_key)
        return frozenset(replicas) if replicas else key_cells

    def _pack(self, partitions: list[list], bind=None) -> list[tuple]:
        """Cut the partitions (``[rows, size]``) of one replica set into requests of at most
        ``batch.size.rows`` rows. A partition too large to share a batch goes alone (Cassandra
        does not size-check single-partition batches); smaller ones share batches of at most
        the node's partition limit and ``batch.size.bytes`` (``auto``: the node's warning size,
        :attr:`limits`) as Cassandra counts them (:meth:`batch_size`)."""
        out: list[tuple] = []
        current: list[tuple] = []
        parts = size = 0
        for rows, part_size in partitions:
            if len(rows) >= self._batch_rows or (self._by_replicas and part_size > self._batch_bytes):
                out.extend(self.request(rows[i:i + self._batch_rows], bind)
                           for i in range(0, len(rows), self._batch_rows))
                continue
            if current and (parts == self._max_partitions or len(current) + len(rows) > self._batch_rows
                            or size + part_size > self._batch_bytes):
                out.append(self.request(current, bind))
                current, parts, size = [], 0, 0
            current.extend(rows)
            parts += 1
            size += part_size
        if current:
            out.append(self.request(current, bind))
        return out

    def batch_size(self, rows: list[tuple]) -> int:
        """The size Cassandra gives these rows when it checks a multi-partition batch against
        ``batch_size_warn_threshold``, estimated from above (:func:`size_model`): the values'
        bytes (weighted) plus :data:`CELL_OVERHEAD` a regular column and :data:`ROW_OVERHEAD`
        a row."""
        n = len(self.columns)
        return sum(sum(int(w) * len(c) for w, c in zip(self._weights, row[:n]) if type(c) is bytes)
                   for row in rows) + len(rows) * self._row_overhead

    def request(self, rows: list[tuple], bind=None) -> tuple:
        """One request for ``rows``: a bound statement, or an UNLOGGED batch of them
        (``bind``: as in :meth:`statements`)."""
        bind = bind or self._bind
        if len(rows) == 1:
            return (bind(rows[0]), None)
        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self.consistency_level)
        batch.is_idempotent = True
        for row in rows:
            batch.add(bind(row))
        return (batch, None)

    def _request_of(self, statements: list[BoundStatement]) -> tuple:
        """One request for these bound statements: the statement, or an UNLOGGED batch."""
        if len(statements) == 1:
            return (statements[0], None)
        batch = BatchStatement(batch_type=BatchType.UNLOGGED,
                               consistency_level=self.consistency_level)
        batch.is_idempotent = True
        for statement in statements:
            batch.add(statement)
        return (batch, None)

    # -- executing -----------------------------------------------------------------------
    def write_chunk(self, batch: pa.RecordBatch, first_ts: int, batch_id: int) -> int:
        """Write every row of one chunk; returns the rows acknowledged (all of them)."""
        for _ in self.write_chunks([(batch, first_ts, None)], batch_id):
            pass
        return batch.num_rows

    def write_chunks(self, chunks: Iterable[tuple[pa.RecordBatch, int, T]],
                     batch_id: int, age: BatchAge | None = None) -> Iterator[T]:
        """Write ``(chunk, first write timestamp, tag)`` in order and yield each ``tag`` once
        Cassandra acknowledged every row of its chunk.

        ``age``: how old the batch is, as the driver measured it (:mod:`recovery.cql.batch_age`), which its
        rows' TTLs count from; counted on on this process's monotonic clock, never on its wall
        clock (None: TTLs count from the first time a row is built, and on from there).

        Consecutive chunks are grouped up to ``wal.flush.groupRows`` rows (:meth:`_groups`) and
        each group's rows are grouped into requests together. Pipelined: the next group is
        read from ``chunks`` and its requests built while the previous group's are in flight,
        so the node is not left idle while the client works. Only one group's requests are
        ever in flight (at most ``concurrent.writes``), and a tag is yielded only after its
        chunk, and every chunk before it, is acknowledged. Nothing is left in flight when this
        returns or raises."""
        flying: _InFlight | None = None
        mono = self._monotonic_ns
        if age is not None:
            sealed_at_us = age.sealed_at_us
            now_s = lambda: age.now_s(mono())      # noqa: E731 - the driver's measure, counted on
        else:
            sealed_at_us = None
            now_s = lambda: mono() // 1_000_000_000   # noqa: E731
        try:
            for group in self._groups(chunks):
                built_s = now_s()
                pending = self.group_requests([(batch, ts) for batch, ts, _ in group],
                                              sealed_at_us, built_s)
                done = self._settle(flying, batch_id) if flying is not None else None
                # Built while the group before was settled, maybe through back-offs: as of now.
                pending, built_s = self._aged(pending, built_s, now_s())
                flying = _InFlight(pending, self._launch(pending), [tag for _, _, tag in group],
                                   sum(batch.nbytes for batch, _, _ in group), built_s, now_s)
                if done is not None:
                    yield from done.tags
            if flying is not None:
                done, flying = self._settle(flying, batch_id), None
                yield from done.tags
        finally:
            if flying is not None:   # stopped early: let the group's requests finish first
                for _ in flying.results:
                    pass

    def _groups(self, chunks: Iterable[tuple[pa.RecordBatch, int, T]]) -> Iterator[list]:
        """Consecutive chunks, gathered until they hold ``group_rows`` rows (the last group
        may hold fewer; a chunk larger than that is a group of its own)."""
        group, rows = [], 0
        for item in chunks:
            group.append(item)
            rows += item[0].num_rows
            if rows >= self.write.group_rows:
                yield group
                group, rows = [], 0
        if group:
            yield group

    def _launch(self, pending: list[tuple]) -> Iterator:
        """Send the first ``concurrent.writes`` requests and return at once; cassandra-driver's
        event loop sends each next one as an answer comes. The results come in order from
        the generator. (``execute_concurrent_async`` would not do: in cassandra-driver 3.30 it waits
        for every answer before it returns its future.)

        cassandra-driver's concurrent module is imported on first use: it brings its
        cluster module, which ``cassandra-wal inspect``, ``dump`` and ``verify`` never need."""
        from cassandra.concurrent import execute_concurrent

        return iter(execute_concurrent(self.session, pending,
                                       concurrency=self.write.concurrent_writes,
                                       raise_on_first_error=False, results_generator=True))

    def _settle(self, flight: _InFlight, batch_id: int) -> _InFlight:
        """Wait for ``flight``'s first attempt, retry what failed transiently (with
        exponential back-off and jitter) and account its bytes to the rate limit."""
        retrying = Retrying(
            stop=stop_after_attempt(self.write.retry_count + 1),
            wait=wait_exponential_jitter(multiplier=0.2, max=10.0),
            retry=retry_if_exception_type(_Transient), sleep=self._sleep, reraise=True,
            before_sleep=(lambda _state: self._on_retry()) if self._on_retry else None)
        pending, launched, built_s = flight.pending, flight.results, flight.built_s
        try:
            for attempt in retrying:
                with attempt:
                    if launched is None:   # a retry, seconds later: TTLs still count from the seal
                        pending, built_s = self._aged(pending, built_s, flight.now_s())
                    results = launched if launched is not None else self._launch(pending)
                    launched = None
                    try:
                        self._check(pending, results, batch_id)
                    except _Transient as exc:
                        pending = exc.pending   # the next attempt retries only these
                        raise
        except _Transient as exc:
            raise FlushFailed(batch_id, f"retry budget spent ({self.write.retry_count} retries): "
                                        f"{type(exc.last_error).__name__}: {exc.last_error}") from None
        self._limiter.account(flight.nbytes)
        return flight

    def _aged(self, pending: list[tuple], built_s: int, now_s: int) -> tuple[list[tuple], int]:
        """``pending`` built at second ``built_s``, as built at ``now_s`` (the same clock,
        counted on the monotonic clock): each row's TTL less the seconds gone by since (so
        that a retried write, too, expires its row at the seal's second plus its TTL), rows
        whose TTL has run out made tombstones; and ``now_s``."""
        if not self._ttl or now_s <= built_s:
            return pending, built_s
        shift, out, insert = now_s - built_s, [], self.statement.query_id
        for statement, _ in pending:
            if isinstance(statement, BatchStatement):
                rows = [(query_id, values)
                        for _, query_id, values in statement._statements_and_parameters]
            else:
                rows = [(statement.prepared_statement.query_id, statement.values)]
            kept = []
            for query_id, values in rows:
                if query_id != insert:          # tombstones: the same at any time
                    kept.append(self._rebound(query_id, values))
                    continue
                row = _aged_row(values, shift, self._regular)
                if row is not None:
                    kept.append(self._bind_marked(row))
            if kept:
                out.append(self._request_of(kept))
        return out, now_s

    def _rebound(self, query_id: bytes, values) -> BoundStatement:
        statement = BoundStatement(self._prepared[query_id])
        statement.values = values
        return statement

    @staticmethod
    def _check(pending: list[tuple], results: Iterator, batch_id: int) -> None:
        """Raise for what failed, once every request of the attempt was answered."""
        failed, last = [], None
        for stmt, (ok, result) in zip(pending, list(results)):
            if ok:
                continue
            if is_shutdown_error(result):     # the process exits: no attempt can succeed
                raise FlushFailed(batch_id, f"{type(result).__name__}: {result}")
            if not is_transient_answer(result):
                raise FlushFailed(batch_id, f"{type(result).__name__}: {result}", permanent=True)
            failed.append(stmt)
            last = result
        if failed:
            raise _Transient(failed, last)


@dataclass
class _InFlight:
    """One group's requests, their first attempt's results (as they come) and its chunks'
    tags."""

    pending: list[tuple]
    results: Iterator
    tags: list
    nbytes: int
    built_s: int = 0        # the second its requests were built in (their TTLs' reference)
    now_s: Callable[[], int] = lambda: 0    # the second it is now, on the same clock


def _tombstone_row(values: Sequence, regular: Sequence[int]) -> tuple | None:
    """The row whose bound values (the TTL last) are ``values``, its TTL run out: the same
    values with :data:`EXPIRED` for a TTL (written as tombstones, :meth:`Upserter._tombstone`);
    None if it sets no regular column (``regular``: their positions), so leaves nothing."""
    if all(values[i] is UNSET_VALUE for i in regular):
        return None
    return tuple(values[:-1]) + (EXPIRED,)


def _aged_row(values: Sequence, shift: int, regular: Sequence[int]) -> tuple | None:
    """A row's bound values (the TTL last) ``shift`` seconds later: its TTL less ``shift``;
    once it has run out, its tombstone row (:func:`_tombstone_row`). An unset TTL (the
    table's default) and 0 (none) stay."""
    ttl = values[-1]
    if ttl is UNSET_VALUE or ttl is None:
        return tuple(values)
    left = _INT.unpack(ttl)[0]
    if left == 0:
        return tuple(values)
    if left <= shift:
        return _tombstone_row(values, regular)
    return tuple(values[:-1]) + (_INT.pack(left - shift),)


def micros(column: pa.Array) -> pa.Array:
    """A ``writetime`` column's values as µs since the epoch (int64)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    return column.cast(pa.int64())
