"""A simulated Cassandra node: the shared fake Cassandra (``tests/helpers/fake_cassandra.py``:
its statements, session, cluster and cells) on the sim's clock, with the world's faults.

``SimSession.prepare`` returns a real cassandra-driver ``PreparedStatement``; ``execute_async``
takes the ``BoundStatement`` or UNLOGGED ``BatchStatement`` the sink's ``Upserter`` builds,
deserializes each bound value with its column's cassandra-driver type, and applies it to an
in-memory table with Cassandra's reconciliation (``fake_cassandra.resolve``): per (primary key,
column) the cell with the highest write timestamp wins; on a tie a tombstone or expiring cell beats
a plain live one, a tombstone an expiring one, then the later local deletion time, then the larger
value bytes (Cassandra 4.0+ ``Cells.resolveRegular``, CASSANDRA-14592). A TTL expires on the
simulated clock.

A non-frozen list is not one cell (``fake_cassandra.ListCells``): as Cassandra does, each
write of the whole list deletes the column's older cells (a deletion at its timestamp - 1) and
appends a cell per element, named by a time-based id the node picks, so a row written twice at
one timestamp holds its elements twice (CASSANDRA-11368; measured on 5.0.8). A frozen list is
one cell like any other.

Besides the ``INSERT`` it applies the Upserter's ``DELETE <columns> ... USING TIMESTAMP ? WHERE
<key>`` (a row whose TTL ran out while it was pending): a tombstone per column at that
timestamp (a non-frozen list: a deletion of its cells up to it); and a change stream's
``DELETE FROM ... USING TIMESTAMP ? WHERE <key>`` of a row or a whole partition
(``fake_cassandra.Deletions``): each row and partition keeps its highest deletion timestamp,
and a SELECT shows a cell only above its row's and its partition's (a tie goes to the
tombstone), whatever order the writes came in.

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
import random
from dataclasses import dataclass, field
from typing import Callable

from cassandra import OperationTimedOut, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable
from cassandra.query import UNSET_VALUE, PreparedStatement

from recovery.cql.errors import ConnectionFailed
from recovery.cql.table import TableSchema
from tests.helpers.fake_cassandra import (CQLTYPE_CLASSES, NO_DELETION, NON_FROZEN, PROTOCOL,
                                          NOT_DELETED, Cell, Deletions, FakeCluster,
                                          FakeSession, ListCells, Metadata, Statements, decoded,
                                          plain, resolve, shown)

UP, DOWN, FLAKY = "up", "down", "flaky"
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
    deletion: str = ""          # a change stream's DELETE FROM of its row or partition (``key``):
                                # fake_cassandra.ROW_DELETE or PARTITION_DELETE; no cells
    proc: str = ""              # the process that wrote it (whose measure of the batch's age)
    uncounted_s: float = 0.0    # a flush task elsewhere: how long it waited after its job began


@dataclass
class SimCassandra:
    tables: dict[str, TableSchema]
    rng: random.Random
    clock_us: Callable[[], int]
    step: int = 0
    mode: str = UP
    faults: int = 0                                   # failures injected so far
    rows: dict = field(default_factory=dict)          # (table, key) -> {column: Cell}
    deletions: dict = field(default_factory=dict)     # table -> Deletions (rows, partitions)
    writes: list[Write] = field(default_factory=list)
    sessions_opened: int = 0
    cell_ids: int = 0                                 # the last list element's cell id
    dropped: dict = field(default_factory=dict)       # (qualified table, column) -> drop (µs)
    proc: str = ""                                    # the sink's process writing now
    uncounted_s: float = 0.0                          # a flush task's wait (Write.uncounted_s)
    statements: Statements = field(init=False)       # what was prepared, by query id

    def __post_init__(self):
        self.statements = Statements(self.tables)

    # -- cassandra-driver's entry points -------------------------------------------------------
    def connect(self, connection=None):
        """``recovery.cql.connection.connect``: (cluster, session), or ConnectionFailed when down; the
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
        return self.statements.prepare(cql, cluster)

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
        for prepared, values in self.statements.rows(statement):
            self._apply_row(prepared, values)

    def _apply_row(self, prepared: PreparedStatement, values) -> None:
        if prepared.query_id in self.statements.deletes:
            self._apply_delete(prepared, values)
            return
        if prepared.query_id in self.statements.deletions:
            self._apply_deletion(prepared, values)
            return
        meta = prepared.column_metadata
        schema = self.tables[meta[0].table_name]
        table = qualified(meta[0].table_name, self.statements.clusters[prepared.query_id])
        bound = {name: cell for name, cell in decoded(prepared, values).items()
                 if cell[0] is not UNSET_VALUE}
        ts = bound.pop("[timestamp]")[1]
        ttl = bound.pop("[ttl]", (None, None))[1] or None
        key = tuple(bound.pop(k)[1] for k in schema.primary_key)
        assert None not in key, "a row without its key reached Cassandra"
        # Cassandra's nowInSec: whole seconds; a TTL expires at that second plus the TTL.
        now_s = self.clock_us() // 1_000_000
        row = self.rows.setdefault((table, key), {})
        for name, (raw, value) in bound.items():
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
                                 tuple(sorted((n, v) for n, (_r, v) in bound.items())),
                                 self.step, now_s, proc=self.proc,
                                 uncounted_s=self.uncounted_s))

    def _apply_delete(self, prepared: PreparedStatement, values) -> None:
        table, columns = self.statements.deletes[prepared.query_id]
        schema = self.tables[table]
        table = qualified(table, self.statements.clusters[prepared.query_id])
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

    def _apply_deletion(self, prepared: PreparedStatement, values) -> None:
        """A change stream's delete of a row (its whole primary key) or of a partition (its
        partition key): its deletion timestamp is kept beside the cells, which stay (hidden
        at or below it, :meth:`visible`), as Cassandra keeps a tombstone until compaction."""
        table, kind = self.statements.deletions[prepared.query_id]
        table = qualified(table, self.statements.clusters[prepared.query_id])
        meta = prepared.column_metadata
        ts = meta[0].type.deserialize(values[0], PROTOCOL)
        key = tuple(m.type.deserialize(v, PROTOCOL) for m, v in zip(meta[1:], values[1:]))
        assert None not in key, "a delete without its key reached Cassandra"
        self.deletions.setdefault(table, Deletions()).delete(kind, key, ts)
        self.writes.append(Write(table, key, ts, None, (), self.step,
                                 self.clock_us() // 1_000_000, deletion=kind, proc=self.proc,
                                 uncounted_s=self.uncounted_s))

    def deleted_at(self, table: str, key: tuple) -> int:
        """The deletion timestamp covering row ``key`` of ``table``: its own or its
        partition's, the higher (``fake_cassandra.Deletions.of``)."""
        deletions = self.deletions.get(table)
        return deletions.of(key) if deletions is not None else NOT_DELETED

    def _next_cell_id(self) -> int:
        self.cell_ids += 1
        return self.cell_ids

    # -- reading ----------------------------------------------------------------------------
    def decode(self, table: str, column: str, raw: bytes):
        return plain(CQLTYPE_CLASSES[self.tables[bare(table)].column_type(column)].deserialize(
            raw, PROTOCOL))

    def table_names(self) -> set[str]:
        """Every table that holds rows, qualified (``b:t`` on the other cluster)."""
        return {table for table, _key in self.rows}

    def visible(self, table: str) -> dict:
        """What a SELECT would show now: key -> {column: value} (expired cells hidden, and
        those at or below their row's or partition's deletion; a list as a tuple, its
        elements in cell id order)."""
        now_s = self.clock_us() / 1e6
        out = {}
        for (name, key), cells in self.rows.items():
            if name != table:
                continue
            live = shown(cells, now_s, lambda column, raw: self.decode(table, column, raw),
                         lambda column, ts: self.hidden(table, column, ts),
                         self.deleted_at(table, key))
            if live:
                out[key] = live
        return out


@dataclass(frozen=True)
class SchemaRow:
    column_name: str
    dropped_time: object


class SimSession(FakeSession):
    """The shared fake session over the node: its prepare, its requests and its faults."""

    def __init__(self, node: SimCassandra, cluster: str = ""):
        super().__init__(node.statements,
                         script=lambda statement, _attempt: node.execute(statement),
                         cluster=FakeCluster(Metadata(cluster_name=CLUSTER_NAMES[cluster])))
        self.node, self.name = node, cluster

    def prepare(self, cql: str) -> PreparedStatement:
        return self.node.prepare(cql, self.name)

    def execute(self, cql, parameters=None):
        """The two queries the sink makes other than its writes: the table's dropped columns
        (``recovery.cql.table.dropped_columns``), and the completeness marker's row, a prepared INSERT
        (``recovery/marker.py``), which the node applies as a write, faults and all."""
        if isinstance(cql, PreparedStatement):
            error = self.node.execute(cql.bind(parameters))
            if error is not None:
                raise error
            return []
        assert "system_schema.dropped_columns" in cql, cql
        return self.node.dropped_columns(parameters[1], self.name)
