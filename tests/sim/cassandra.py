"""A simulated Cassandra node: the driver's side of the wire, in process, on the sim's clock.

``SimSession.prepare`` returns a real driver ``PreparedStatement``; ``execute_async`` takes the
``BoundStatement`` or UNLOGGED ``BatchStatement`` the sink's ``Upserter`` builds, deserializes
each bound value with its column's driver type, and applies it to an in-memory table with
Cassandra's reconciliation: per (primary key, column) the cell with the highest write timestamp
wins; on a tie a tombstone or expiring cell beats a plain live one, a tombstone an expiring
one, then the later local deletion time, then the larger value bytes (Cassandra 4.0+
``Cells.resolveRegular``, CASSANDRA-14592). A TTL expires on the simulated clock.

A non-frozen list is not one cell (:class:`ListCells`): as Cassandra does, each write of the
whole list deletes the column's older cells (a deletion at its timestamp - 1) and appends a
cell per element, named by a time-based id the node picks, so a row written twice at one
timestamp holds its elements twice (CASSANDRA-11368; measured on 5.0.8). A frozen list is one
cell like any other.

Besides the ``INSERT`` it applies the Upserter's ``DELETE <columns> ... USING TIMESTAMP ? WHERE
<key>`` (a row whose TTL ran out while it was pending): a tombstone per column at that
timestamp (a non-frozen list: a deletion of its cells up to it).

One node stands for two clusters (``changes.py``): contact points naming
:data:`OTHER_HOST` reach the other one, whose cluster name differs and whose tables are kept
apart (their writes name the table ``b:t``: :func:`qualified`); both fail together. A column
dropped and added back (``dropped``, by qualified table) hides every cell of it written at or
before the drop, as Cassandra does, in what a SELECT shows.

Faults come from the world's seeded RNG, so a seed replays them exactly: ``down`` (every
request, ``prepare`` and new connections fail: ``Unavailable``, ``NoHostAvailable``,
``ConnectionFailed``; nothing is applied) and ``flaky`` (each request may time out, with the
write applied or not: the client cannot tell which).
"""

from __future__ import annotations

import datetime
import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable

from cassandra import OperationTimedOut, Unavailable, WriteTimeout, cqltypes
from cassandra.cluster import NoHostAvailable
from cassandra.protocol import ColumnMetadata
from cassandra.query import UNSET_VALUE, BatchStatement, BoundStatement, PreparedStatement

from cql.errors import ConnectionFailed
from cql.table import TableSchema

PROTOCOL = 5
_TEXTS = cqltypes.ListType.apply_parameters([cqltypes.UTF8Type])
DRIVER_TYPES = {"int": cqltypes.Int32Type, "text": cqltypes.UTF8Type, "bigint": cqltypes.LongType,
                "list<text>": _TEXTS, "frozen<list<text>>": _TEXTS}
NON_FROZEN = frozenset({"list<text>"})     # a cell per element (ListCells)
UP, DOWN, FLAKY = "up", "down", "flaky"
NO_DELETION = float("inf")   # a live, non-expiring cell
OTHER_HOST = "cluster-b"     # contact points of the other cluster (changes.py)
OTHER = "b"                  # its tables' prefix in writes and rows: "b:t"
CLUSTER_NAMES = {"": "sim cluster", OTHER: "sim cluster b"}


def qualified(table: str, cluster: str = "") -> str:
    """A table as the node keeps it: ``t`` on the first cluster, ``b:t`` on the other."""
    return f"{cluster}:{table}" if cluster else table


def bare(table: str) -> str:
    """The table's own name (its schema's), without its cluster."""
    return table.rsplit(":", 1)[-1]


def cluster_of(connection) -> str:
    hosts = getattr(connection, "hosts", None) or ()
    return OTHER if any(OTHER_HOST in str(h) for h in hosts) else ""


@dataclass(frozen=True)
class Cell:
    ts: int
    raw: bytes | None          # None: a tombstone
    ttl: int | None
    local_deletion: float      # seconds: expiry (TTL), deletion time (tombstone), or NO_DELETION

    @property
    def tombstone(self) -> bool:
        return self.raw is None


def resolve(old: Cell | None, new: Cell) -> Cell:
    """The cell Cassandra keeps of two writes to one (row, column)."""
    if old is None or new.ts != old.ts:
        return new if old is None or new.ts > old.ts else old
    old_marked, new_marked = old.local_deletion != NO_DELETION, new.local_deletion != NO_DELETION
    if old_marked or new_marked:
        if old_marked != new_marked:
            return old if old_marked else new
        if old.tombstone != new.tombstone:
            return old if old.tombstone else new
        if old.local_deletion != new.local_deletion:
            return old if old.local_deletion > new.local_deletion else new
    return old if (old.raw or b"") >= (new.raw or b"") else new


@dataclass
class ListCells:
    """A non-frozen list of one row: ``deleted_at``, the column's deletion (cells at or below it
    are gone), and its elements as ``(cell id, ts, value, local deletion)`` in id order. Cell ids
    are the node's, increasing with each write (time-based UUIDs), whatever the timestamp."""

    deleted_at: int = -(2**63)
    elements: list = field(default_factory=list)

    def delete(self, ts: int) -> None:
        """A ``DELETE`` of the column at ``ts``: every cell at or below it is gone."""
        self.deleted_at = max(self.deleted_at, ts)

    def write(self, ts: int, values, local_deletion: float, next_id: Callable[[], int]) -> None:
        """An INSERT of the whole list at ``ts`` (None: a null): what is older goes, and each
        element is appended under a new cell id (Cassandra's ``Lists.Setter``)."""
        self.deleted_at = max(self.deleted_at, ts - 1)
        for value in values or ():
            self.elements.append((next_id(), ts, value, local_deletion))

    def shown(self, now_s: float) -> tuple:
        """The list a SELECT shows: the live elements in cell id order."""
        return tuple(value for _id, ts, value, local_deletion in self.elements
                     if ts > self.deleted_at and local_deletion > now_s)

    def live(self, now_s: float) -> dict[int, list]:
        """The live elements by write timestamp, each in cell id order."""
        out: dict[int, list] = {}
        for _id, ts, value, local_deletion in self.elements:
            if ts > self.deleted_at and local_deletion > now_s:
                out.setdefault(ts, []).append(value)
        return out


@dataclass(frozen=True)
class Write:
    """One row of one request, as applied: what the invariants compare with the oracle."""

    table: str
    key: tuple
    ts: int
    ttl: int | None
    cells: tuple                # ((column, decoded value or None for a tombstone), ...)
    step: int
    at_s: float                 # when it was applied (the simulated clock, seconds)
    deleted: bool = False       # a DELETE of these columns (its cells: (column, None))
    proc: str = ""              # the process that wrote it (whose measure of the batch's age)
    uncounted_s: float = 0.0    # a flush task elsewhere: how long it waited after its job began


class Answer:
    """The driver's ResponseFuture as ``execute_concurrent`` uses it: answered at once."""

    _col_names = _col_types = None

    def __init__(self, error: Exception | None):
        self.error = error

    def add_callbacks(self, callback, errback, callback_args=(), callback_kwargs=None,
                      errback_args=(), errback_kwargs=None):
        if self.error is None:
            callback([], *callback_args)
        else:
            errback(self.error, *errback_args)

    def clear_callbacks(self):
        pass


@dataclass
class SimCassandra:
    tables: dict[str, TableSchema]
    rng: random.Random
    clock_us: Callable[[], int]
    step: int = 0
    mode: str = UP
    faults: int = 0                                   # failures injected so far
    rows: dict = field(default_factory=dict)          # (table, key) -> {column: Cell}
    writes: list[Write] = field(default_factory=list)
    prepared: dict = field(default_factory=dict)      # query id -> PreparedStatement
    sessions_opened: int = 0
    cell_ids: int = 0                                 # the last list element's cell id
    dropped: dict = field(default_factory=dict)       # (qualified table, column) -> drop (µs)
    clusters: dict = field(default_factory=dict)      # query id -> its session's cluster
    proc: str = ""                                    # the sink's process writing now
    uncounted_s: float = 0.0                          # a flush task's wait (Write.uncounted_s)
    deletes: dict = field(default_factory=dict)       # query id -> (table, columns deleted)

    # -- the driver's entry points ----------------------------------------------------------
    def connect(self, connection=None):
        """``cql.connection.connect``: (cluster, session), or ConnectionFailed when down; the
        other cluster when the contact points name it."""
        if self.mode == DOWN:
            self.faults += 1
            raise ConnectionFailed(["sim-node"], "NoHostAvailable: the simulated node is down")
        self.sessions_opened += 1
        session = SimSession(self, cluster_of(connection))
        return session.cluster, session

    def prepare(self, cql: str, cluster: str = "") -> PreparedStatement:
        if self.mode == DOWN or (self.mode == FLAKY and self.rng.random() < 0.2):
            self.faults += 1
            raise (NoHostAvailable("simulated node down", {"sim-node": "down"})
                   if self.mode == DOWN else OperationTimedOut(last_host="sim-node"))
        query_id = hashlib.sha1((cluster + cql).encode()).digest()
        self.clusters[query_id] = cluster
        if cql.startswith("DELETE"):
            table, deleted, names = parse_delete(cql)
            self.deletes[query_id] = (table, deleted)
            schema = self.tables[table]
            meta = [ColumnMetadata(schema.keyspace, table, "[timestamp]", cqltypes.LongType)]
            meta += [ColumnMetadata(schema.keyspace, table, n, DRIVER_TYPES[schema.column_type(n)])
                     for n in names]
            keys = [1 + names.index(k) for k in schema.partition_key]
        else:
            table, names, ttl = parse_insert(cql)
            schema = self.tables[table]
            meta = [ColumnMetadata(schema.keyspace, table, n, DRIVER_TYPES[schema.column_type(n)])
                    for n in names]
            meta.append(ColumnMetadata(schema.keyspace, table, "[timestamp]", cqltypes.LongType))
            if ttl:
                meta.append(ColumnMetadata(schema.keyspace, table, "[ttl]", cqltypes.Int32Type))
            keys = [names.index(k) for k in schema.partition_key]
        statement = PreparedStatement(meta, query_id, keys, cql, schema.keyspace, PROTOCOL,
                                      None, None)
        self.prepared[query_id] = statement
        return statement

    def dropped_columns(self, table: str, cluster: str = "") -> list:
        """``system_schema.dropped_columns`` of ``table`` (what ``session.execute`` of that
        query answers): rows of ``column_name`` and ``dropped_time`` (a datetime to the ms).
        Down: the request fails, as any does. Draws nothing from the seed."""
        if self.mode == DOWN:
            self.faults += 1
            raise NoHostAvailable("simulated node down", {"sim-node": "down"})
        return self.dropped_rows(table, cluster)

    def dropped_rows(self, table: str, cluster: str = "") -> list:
        """The rows of ``system_schema.dropped_columns`` of ``table``, whatever the node does."""
        return [SchemaRow(column, datetime.datetime.fromtimestamp(us // 1000 / 1000,
                                                                  datetime.timezone.utc))
                for (t, column), us in sorted(self.dropped.items())
                if t == qualified(table, cluster)]

    def hidden(self, table: str, column: str, ts: int) -> bool:
        """A cell of ``column`` at ``ts`` is hidden by a drop of the column at or after it."""
        return self.dropped.get((table, column), -(2**63)) >= ts

    def execute(self, statement) -> Exception | None:
        """Run one request; the error the client sees, or None."""
        outcome = "ok"
        if self.mode == DOWN:
            outcome = "refused"
        elif self.mode == FLAKY:
            r = self.rng.random()
            outcome = "lost" if r < 0.25 else "applied-timeout" if r < 0.45 else "ok"
        if outcome != "refused" and outcome != "lost":
            self.apply(statement)
        if outcome == "ok":
            return None
        self.faults += 1
        if outcome == "refused":
            return (Unavailable("simulated node down", consistency=1, required_replicas=1,
                                alive_replicas=0)
                    if self.rng.random() < 0.5 else
                    NoHostAvailable("simulated node down", {"sim-node": "down"}))
        if self.rng.random() < 0.5:
            return WriteTimeout("simulated timeout", consistency=1, required_responses=1,
                                received_responses=0, write_type=0)
        return OperationTimedOut(last_host="sim-node")

    # -- applying ---------------------------------------------------------------------------
    def apply(self, statement) -> None:
        if isinstance(statement, BatchStatement):
            for _prepared, query_id, values in statement._statements_and_parameters:
                self._apply_row(self.prepared[query_id], values)
        elif isinstance(statement, BoundStatement):
            self._apply_row(statement.prepared_statement, statement.values)
        else:
            raise AssertionError(f"the sink sent a {type(statement).__name__}")

    def _apply_row(self, prepared: PreparedStatement, values) -> None:
        if prepared.query_id in self.deletes:
            self._apply_delete(prepared, values)
            return
        meta = prepared.column_metadata
        schema = self.tables[meta[0].table_name]
        table = qualified(meta[0].table_name, self.clusters[prepared.query_id])
        decoded = {}
        for column, raw in zip(meta, values):
            if raw is UNSET_VALUE:
                continue
            decoded[column.name] = (raw, None if raw is None else
                                    _plain(column.type.deserialize(raw, PROTOCOL)))
        ts = decoded.pop("[timestamp]")[1]
        ttl = decoded.pop("[ttl]", (None, None))[1] or None
        key = tuple(decoded.pop(k)[1] for k in schema.primary_key)
        assert None not in key, "a row without its key reached Cassandra"
        # Cassandra's nowInSec: whole seconds; a TTL expires at that second plus the TTL.
        now_s = self.clock_us() // 1_000_000
        row = self.rows.setdefault((table, key), {})
        for name, (raw, value) in decoded.items():
            if schema.column_type(name) in NON_FROZEN:
                cells = row.setdefault(name, ListCells())
                cells.write(ts, value, now_s + ttl if ttl else NO_DELETION, self._next_cell_id)
                continue
            if raw is None:
                cell = Cell(ts, None, None, now_s)
            else:
                cell = Cell(ts, bytes(raw), ttl, now_s + ttl if ttl else NO_DELETION)
            row[name] = resolve(row.get(name), cell)
        self.writes.append(Write(table, key, ts, ttl,
                                 tuple(sorted((n, v) for n, (_r, v) in decoded.items())),
                                 self.step, now_s, proc=self.proc,
                                 uncounted_s=self.uncounted_s))

    def _apply_delete(self, prepared: PreparedStatement, values) -> None:
        table, columns = self.deletes[prepared.query_id]
        schema = self.tables[table]
        table = qualified(table, self.clusters[prepared.query_id])
        meta = prepared.column_metadata
        ts = meta[0].type.deserialize(values[0], PROTOCOL)
        key = tuple(m.type.deserialize(v, PROTOCOL) for m, v in zip(meta[1:], values[1:]))
        assert len(key) == len(schema.primary_key), "a DELETE by partition: no static column here"
        now_s = self.clock_us() // 1_000_000
        row = self.rows.setdefault((table, key), {})
        for name in columns:
            if schema.column_type(name) in NON_FROZEN:
                row.setdefault(name, ListCells()).delete(ts)
            else:
                row[name] = resolve(row.get(name), Cell(ts, None, None, now_s))
        self.writes.append(Write(table, key, ts, None, tuple(sorted((c, None) for c in columns)),
                                 self.step, now_s, deleted=True, proc=self.proc,
                                 uncounted_s=self.uncounted_s))

    def _next_cell_id(self) -> int:
        self.cell_ids += 1
        return self.cell_ids

    # -- reading ----------------------------------------------------------------------------
    def decode(self, table: str, column: str, raw: bytes):
        return _plain(DRIVER_TYPES[self.tables[bare(table)].column_type(column)].deserialize(
            raw, PROTOCOL))

    def table_names(self) -> set[str]:
        """Every table that holds rows, qualified (``b:t`` on the other cluster)."""
        return {table for table, _key in self.rows}

    def visible(self, table: str) -> dict:
        """What a SELECT would show now: key -> {column: value} (expired cells hidden; a list
        as a tuple, its elements in cell id order)."""
        now_s = self.clock_us() / 1e6
        out = {}
        for (name, key), cells in self.rows.items():
            if name != table:
                continue
            live = {}
            for c, cell in cells.items():
                if isinstance(cell, ListCells):
                    if cell.shown(now_s):
                        live[c] = cell.shown(now_s)
                elif not cell.tombstone and cell.local_deletion > now_s and \
                        not self.hidden(table, c, cell.ts):
                    live[c] = self.decode(table, c, cell.raw)
            if live:
                out[key] = live
        return out


def _plain(value):
    """A driver value as the oracle holds it: a list as a tuple (rows are hashed)."""
    return tuple(value) if isinstance(value, list) else value


def parse_insert(cql: str) -> tuple[str, list[str], bool]:
    """``INSERT INTO "ks"."t" ("k", "v") VALUES (?, ?) USING TIMESTAMP ? [AND TTL ?]`` ->
    (table, columns, has ttl)."""
    head, _, rest = cql.partition("(")
    table = head.split(".")[-1].strip().strip('"')
    names = [n.strip().strip('"') for n in rest.split(")", 1)[0].split(",")]
    return table, names, "TTL" in cql


@dataclass(frozen=True)
class SchemaRow:
    column_name: str
    dropped_time: object


class SimMetadata:
    """What the sink reads of the driver's cluster metadata: the cluster's name."""

    def __init__(self, cluster: str = ""):
        self.cluster_name = CLUSTER_NAMES[cluster]


def parse_delete(cql: str) -> tuple[str, list[str], list[str]]:
    """``DELETE "v", "w" FROM "ks"."t" USING TIMESTAMP ? WHERE "k" = ? AND "c" = ?`` ->
    (table, columns deleted, key columns bound)."""
    head, _, where = cql.partition(" WHERE ")
    columns, _, rest = head[len("DELETE "):].partition(" FROM ")
    table = rest.split(" ")[0].split(".")[-1].strip('"')
    return (table, [c.strip().strip('"') for c in columns.split(",")],
            [part.split("=")[0].strip().strip('"') for part in where.split(" AND ")])


class SimCluster:
    def __init__(self, cluster: str = ""):
        self.metadata = SimMetadata(cluster)

    def shutdown(self):
        pass


class SimSession:
    """Enough of a driver Session for the Upserter and ``execute_concurrent``."""

    def __init__(self, node: SimCassandra, cluster: str = ""):
        self.node, self.name = node, cluster
        self.cluster = SimCluster(cluster)

    def prepare(self, cql: str) -> PreparedStatement:
        return self.node.prepare(cql, self.name)

    def execute(self, cql: str, parameters=None):
        """The one query the sink makes other than its writes: the table's dropped columns
        (``cql.table.dropped_columns``)."""
        assert "system_schema.dropped_columns" in cql, cql
        return self.node.dropped_columns(parameters[1], self.name)

    def execute_async(self, statement, parameters=None, execution_profile=None, **_):
        assert parameters is None, "requests are bound already"
        return Answer(self.node.execute(statement))

    def shutdown(self):
        pass
