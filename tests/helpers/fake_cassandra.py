"""The one fake Cassandra of the tests: cassandra-driver's side of the wire, in process. The unit
tests use it as it is; the simulation (``tests/sim/cassandra.py``) adds its node's modes, seeded
faults, dropped columns and its record of writes over it.

* **Statements.** :func:`prepare_statement` gives cassandra-driver's real ``PreparedStatement`` for
  the ``Upserter``'s ``INSERT ... USING TIMESTAMP ? [AND TTL ?]``, its ``DELETE <columns>
  ... USING TIMESTAMP ? WHERE <key>`` (a row whose TTL ran out while pending) and a change
  stream's ``DELETE FROM ... USING TIMESTAMP ? WHERE <key>`` of a row (the whole primary key)
  or a partition (the partition key alone), with each column's cassandra-driver type
  (:data:`CQLTYPE_CLASSES`); :class:`Statements` keeps what a node prepared and reads a request (a
  ``BoundStatement`` or a ``BatchStatement``) back into its rows.
* **The session.** :class:`FakeSession`: ``prepare``, ``execute_async`` answered
  (:class:`Answer`) at once or held until :meth:`FakeSession.release`, each from
  ``script(statement, attempt)``: an exception, or None; ``execute`` answers the batch limits
  query (``system_views.settings``) from ``settings``. :class:`RecordingSession` records every
  row it is sent in a file, for a test to read from any process (:func:`read`,
  :func:`visible`).
* **The cluster.** :class:`FakeCluster` and its :class:`Metadata`, what the sink reads of
  them: the token ring (``get_replicas``), the cluster's name, the keyspaces'
  schema and their refresh.
* **Cells.** :class:`Cell`, :func:`resolve` (Cassandra's last write wins), :class:`ListCells`
  (a non-frozen list: a cell per element), :class:`Deletions` (rows and partitions deleted, the
  highest timestamp of each) and :func:`shown` (what a SELECT shows of a row).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Mapping

from cassandra import DriverException, cqltypes
from cassandra.protocol import ColumnMetadata
from cassandra.query import UNSET_VALUE, BatchStatement, BoundStatement, PreparedStatement

from recovery.cql.table import TableSchema

PROTOCOL = 5
M = "org.apache.cassandra.db.marshal."
_MARSHAL = {"text": "UTF8Type", "int": "Int32Type", "bigint": "LongType",
            "timestamp": "TimestampType", "double": "DoubleType", "smallint": "ShortType",
            "boolean": "BooleanType", "uuid": "UUIDType", "date": "SimpleDateType",
            "blob": "BytesType", "set<text>": f"SetType({M}UTF8Type)",
            "list<text>": f"ListType({M}UTF8Type)", "frozen<list<text>>": f"ListType({M}UTF8Type)"}
CQLTYPE_CLASSES = {cql: cqltypes.lookup_casstype(M + name) for cql, name in _MARSHAL.items()}
NON_FROZEN = frozenset({"list<text>"})     # a cell per element (ListCells)
NO_DELETION = float("inf")                 # a live, non-expiring cell
NOT_DELETED = -(2**63)                     # below every write timestamp: nothing hidden
#: The two kinds of a change stream's ``DELETE FROM`` (:attr:`Statements.deletions`), as the
#: records of :class:`RecordingSession` name them.
ROW_DELETE, PARTITION_DELETE = "row_delete", "partition_delete"
_REAL_TIME_NS = time.time_ns


# -- statements ------------------------------------------------------------------------------
def parse_insert(cql: str) -> tuple[str, list[str], bool]:
    """``INSERT INTO "ks"."t" ("k", "v") VALUES (?, ?) USING TIMESTAMP ? [AND TTL ?]`` ->
    (table, columns, has ttl)."""
    head, _, rest = cql.partition("(")
    table = head.split(".")[-1].strip().strip('"')
    names = [n.strip().strip('"') for n in rest.split(")", 1)[0].split(",")]
    return table, names, "TTL" in cql


def parse_delete(cql: str) -> tuple[str, list[str], list[str]]:
    """``DELETE "v", "w" FROM "ks"."t" USING TIMESTAMP ? WHERE "k" = ? AND "c" = ?`` ->
    (table, columns deleted, key columns bound); ``DELETE FROM ...`` (a change stream's delete
    of its row or partition) deletes no column by name: ``[]``."""
    head, _, where = cql.partition(" WHERE ")
    columns, _, rest = (" " + head[len("DELETE"):]).partition(" FROM ")
    table = rest.split(" ")[0].split(".")[-1].strip('"')
    return (table, [c.strip().strip('"') for c in columns.split(",") if c.strip()],
            [part.split("=")[0].strip().strip('"') for part in where.split(" AND ")])


def query_id(cql: str, cluster: str = "") -> bytes:
    """A prepared statement's id: ``delete:`` or ``insert:``, then a hash of its CQL (and of
    its cluster's name: two clusters keep their statements apart)."""
    kind = b"delete:" if cql.startswith("DELETE") else b"insert:"
    return kind + hashlib.sha1((cluster + cql).encode()).digest()


def prepare_statement(cql: str, schema: TableSchema, qid: bytes) -> PreparedStatement:
    """cassandra-driver's ``PreparedStatement`` of an INSERT or DELETE of the ``Upserter`` on the
    table ``schema``: its bound columns, with the write timestamp (``[timestamp]``) and TTL
    (``[ttl]``) where cassandra-driver puts them, and its routing key's positions."""
    def column(name, cqltype_class=None):
        return ColumnMetadata(schema.keyspace, schema.table, name,
                              cqltype_class or CQLTYPE_CLASSES[schema.column_type(name)])

    if cql.startswith("DELETE"):
        _table, _deleted, names = parse_delete(cql)
        meta = [column("[timestamp]", cqltypes.LongType)] + [column(n) for n in names]
        keys = [1 + names.index(k) for k in schema.partition_key]
    else:
        _table, names, ttl = parse_insert(cql)
        meta = [column(n) for n in names] + [column("[timestamp]", cqltypes.LongType)]
        if ttl:
            meta.append(column("[ttl]", cqltypes.Int32Type))
        keys = [names.index(k) for k in schema.partition_key]
    return PreparedStatement(meta, qid, keys, cql, schema.keyspace, PROTOCOL, None, None)


class Statements:
    """What a node prepared, by query id: the statement, its cluster, for a DELETE of columns
    its table and the columns it deletes (``deletes``), and for a change stream's ``DELETE
    FROM`` its table and whether it deletes a row or a partition (``deletions``:
    :data:`ROW_DELETE` by the whole primary key, :data:`PARTITION_DELETE` by the partition key
    alone; without clustering columns the two are one statement, taken for a row's)."""

    def __init__(self, tables: Mapping[str, TableSchema]):
        self.tables = tables
        self.prepared: dict[bytes, PreparedStatement] = {}
        self.clusters: dict[bytes, str] = {}
        self.deletes: dict[bytes, tuple[str, list[str]]] = {}
        self.deletions: dict[bytes, tuple[str, str]] = {}

    def prepare(self, cql: str, cluster: str = "") -> PreparedStatement:
        qid = query_id(cql, cluster)
        self.clusters[qid] = cluster
        if cql.startswith("DELETE"):
            table, deleted, names = parse_delete(cql)
            if deleted:
                self.deletes[qid] = (table, deleted)
            else:
                self.deletions[qid] = (table, deletion_kind(self.tables[table], names))
        else:
            table = parse_insert(cql)[0]
        statement = prepare_statement(cql, self.tables[table], qid)
        self.prepared[qid] = statement
        return statement

    def rows(self, statement) -> list[tuple[PreparedStatement, list]]:
        """A request's rows: (prepared statement, bound values) each."""
        if isinstance(statement, BatchStatement):
            return [(self.prepared[qid], values)
                    for _prepared, qid, values in statement._statements_and_parameters]
        if isinstance(statement, BoundStatement):
            return [(statement.prepared_statement, statement.values)]
        raise AssertionError(f"the sink sent a {type(statement).__name__}")


def deletion_kind(schema: TableSchema, names: list[str]) -> str:
    """What a ``DELETE FROM`` whose WHERE binds ``names`` deletes: a row (the whole primary
    key) or a partition (the partition key alone); Cassandra refuses any other key."""
    if names == list(schema.primary_key):
        return ROW_DELETE
    if names == list(schema.partition_key):
        return PARTITION_DELETE
    raise AssertionError(f"a DELETE FROM {schema.table} by {names}: neither its primary key "
                         f"{list(schema.primary_key)} nor its partition key")


def plain(value):
    """A cassandra-driver value as the tests hold it: a list as a tuple (rows are hashed)."""
    return tuple(value) if isinstance(value, list) else value


def decoded(prepared: PreparedStatement, values) -> dict[str, tuple]:
    """A bound row: column -> (raw bytes, value), each value deserialized with its column's
    cassandra-driver type (:func:`plain`); an unset one is ``(UNSET_VALUE, UNSET_VALUE)``."""
    out = {}
    for column, raw in zip(prepared.column_metadata, values):
        out[column.name] = ((raw, raw) if raw is UNSET_VALUE else
                            (raw, None if raw is None else
                             plain(column.type.deserialize(raw, PROTOCOL))))
    return out


# -- the session and the cluster -------------------------------------------------------------
class Answer:
    """cassandra-driver's ResponseFuture as the concurrent executor uses it: answered at once
    (:meth:`now`), or when :meth:`answer` is called, from any thread."""

    _col_names = _col_types = None

    def __init__(self, statement=None):
        self.statement = statement
        self.callbacks = None
        self.outcome = None
        self.answered = False

    @classmethod
    def now(cls, error: Exception | None = None, statement=None) -> "Answer":
        answer = cls(statement)
        answer.answer(error)
        return answer

    def add_callbacks(self, callback, errback, callback_args=(), callback_kwargs=None,
                      errback_args=(), errback_kwargs=None):
        self.callbacks = (callback, callback_args, errback, errback_args)
        if self.outcome is not None:
            self._fire()

    def clear_callbacks(self):
        pass

    def answer(self, error: Exception | None = None):
        self.outcome = ("error", error) if error is not None else ("ok", None)
        if self.callbacks is not None:
            self._fire()

    def _fire(self):
        callback, callback_args, errback, errback_args = self.callbacks
        self.answered = True
        kind, error = self.outcome
        if kind == "ok":
            callback([], *callback_args)
        else:
            errback(error, *errback_args)


class Metadata:
    """cassandra-driver's ``cluster.metadata`` as the sink reads it: ``get_replicas`` (of ``nodes``
    nodes, a partition's replica chosen from its routing key; none at all with
    ``known=False``: no token map; every key asked kept in ``asked``), ``cluster_name``, and
    the ``keyspaces`` (name -> namespace of ``tables``) that ``fetch_table_schema`` reads."""

    def __init__(self, known: bool = True, nodes: int = 3, cluster_name: str = "fake cluster",
                 keyspaces: dict | None = None, keyspace: str | None = None):
        self.known, self.nodes, self.keyspace = known, nodes, keyspace
        self.cluster_name = cluster_name
        self.keyspaces = keyspaces if keyspaces is not None else {}
        self.asked: list[bytes] = []

    def get_replicas(self, keyspace: str, routing_key: bytes) -> list[str]:
        assert self.keyspace is None or keyspace == self.keyspace, keyspace
        self.asked.append(routing_key)
        return [f"node{sum(routing_key) % self.nodes}"] if self.known else []


def keyspaces(keyspace: str = "ks", **tables) -> dict:
    """``Metadata.keyspaces`` of one keyspace holding these tables (cassandra-driver's table
    metadata)."""
    return {keyspace: SimpleNamespace(tables=dict(tables))}


class FakeCluster:
    """Enough of ``cassandra.cluster.Cluster``: its metadata, ``shutdown``, and the schema
    refreshes of ``fetch_table_schema`` (recorded in ``refreshed``; ``after_refresh``: the
    keyspaces a refresh finds; ``fail``: a refresh fails as a control connection down).
    ``keyspaces``: those of a new :class:`Metadata`."""

    def __init__(self, metadata: Metadata | None = None, after_refresh: dict | None = None,
                 fail: bool = False, keyspaces: dict | None = None):
        self.metadata = metadata if metadata is not None else Metadata(keyspaces=keyspaces)
        self.after_refresh, self.fail = after_refresh, fail
        self.contact_points = ["10.0.0.1"]
        self.refreshed: list[tuple] = []

    def _refresh(self, *what):
        if self.fail:
            raise DriverException("control connection down")
        self.refreshed.append(what)
        if self.after_refresh is not None:
            self.metadata.keyspaces = self.after_refresh

    def refresh_schema_metadata(self):
        self._refresh("all")

    def refresh_table_metadata(self, keyspace, table):
        self._refresh(keyspace, table)

    def shutdown(self):
        pass


class FakeSession:
    """A cassandra-driver Session for a real ``Upserter`` over ``tables`` (TableSchemas, or a node's
    :class:`Statements`). ``execute_async`` answers from ``script(statement, attempt)`` (an
    exception or None) at once, or holds every answer until :meth:`release` when ``hold`` is
    set; every request is kept in ``sent`` (its :class:`Answer`) and counted in ``attempts``
    (by statement). ``execute`` answers the settings query with ``settings`` (name -> value),
    or raises ``settings_error``; every query asked is kept in ``queries``."""

    def __init__(self, tables=(), *, metadata: Metadata | None = None,
                 script=lambda statement, attempt: None, hold: bool = False,
                 settings: Mapping | None = None, settings_error: Exception | None = None,
                 cluster: FakeCluster | None = None):
        self.statements = (tables if isinstance(tables, Statements)
                           else Statements({t.table: t for t in tables}))
        self.cluster = cluster if cluster is not None else FakeCluster(metadata)
        self.script, self.hold = script, hold
        self.settings, self.settings_error = settings, settings_error
        self.sent: list[Answer] = []
        self.attempts: dict[int, int] = {}
        self.queries: list = []
        self.lock = threading.Lock()

    @property
    def prepared(self) -> dict[bytes, PreparedStatement]:
        return self.statements.prepared

    def prepare(self, cql: str) -> PreparedStatement:
        return self.statements.prepare(cql)

    def execute(self, query, parameters=None, timeout=None):
        self.queries.append(query)
        if self.settings_error is not None:
            raise self.settings_error
        if self.settings is None:
            raise RuntimeError("no system_views here")     # read_batch_limits: the defaults
        return [tuple(item) for item in self.settings.items()]

    def execute_async(self, statement, parameters=None, execution_profile=None, **_):
        assert parameters is None, "requests are bound already"
        with self.lock:
            attempt = self.attempts.get(id(statement), 0) + 1
            self.attempts[id(statement)] = attempt
            future = Answer(statement)
            self.sent.append(future)
        if not self.hold:
            future.answer(self.script(statement, attempt))
        return future

    def release(self, count: int | None = None):
        """Answer the held requests (the first ``count`` not answered yet), as cassandra-driver's
        event loop would: from another thread."""
        with self.lock:
            waiting = [f for f in self.sent if f.outcome is None][:count]
        for future in waiting:
            future.answer(self.script(future.statement, self.attempts[id(future.statement)]))

    def shutdown(self):
        pass


class RecordingSession(FakeSession):
    """A session that records every row of every request in the file ``path``, so that a test
    can read what a writer sent from any process (the driver, a flush task, a worker), one
    JSON line a row (:func:`read`)::

        {"op": "insert", "key": [1], "ts": 17..., "ttl": 3599, "cells": {"name": "a"},
         "at_s": 1800000000.2}
        {"op": "delete", "key": [1], "ts": 17..., "columns": ["name", "value"], "at_s": ...}
        {"op": "row_delete", "key": [1, 2], "ts": 17..., "at_s": ...}
        {"op": "partition_delete", "key": [1], "ts": 17..., "at_s": ...}

    ``delete``: the tombstones of these columns; ``row_delete`` and ``partition_delete``: a
    change stream's delete of the row, or of the partition, whose key it names. ``ttl`` is null
    when none was sent and ``"unset"`` for an unset one; ``at_s`` is when the row was
    "applied", on the real clock of this machine as it was when the module was imported (what
    a test that skews ``time`` in a process calls Cassandra's clock)."""

    def __init__(self, table: TableSchema, path: str):
        super().__init__([table], metadata=Metadata(nodes=1))
        self.table, self.path = table, path

    def execute_async(self, statement, parameters=None, execution_profile=None, **_):
        with open(self.path, "a") as fh:
            for prepared, values in self.statements.rows(statement):
                fh.write(json.dumps(self._row(prepared, values)) + "\n")
        return super().execute_async(statement, parameters, execution_profile)

    def _row(self, prepared, values) -> dict:
        cells = {name: ("unset" if value is UNSET_VALUE else value)
                 for name, (_raw, value) in decoded(prepared, values).items()}
        deletion = self.statements.deletions.get(prepared.query_id)
        if deletion is not None:
            return {"op": deletion[1], "ts": cells.pop("[timestamp]"),
                    "at_s": _REAL_TIME_NS() / 1e9, "key": list(cells.values())}
        out = {"op": "delete" if prepared.query_id in self.statements.deletes else "insert",
               "ts": cells.pop("[timestamp]"), "at_s": _REAL_TIME_NS() / 1e9,
               "key": [cells.pop(k) for k in self.table.primary_key]}
        if out["op"] == "insert":
            out["ttl"] = cells.pop("[ttl]", None)
            out["cells"] = {c: v for c, v in cells.items() if v != "unset"}
        else:
            out["columns"] = self.statements.deletes[prepared.query_id][1]
        return out


def read(path) -> list[dict]:
    """The rows a :class:`RecordingSession` recorded in ``path``, in order."""
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def visible(rows: list[dict], now_s: float) -> dict[tuple, dict]:
    """What a SELECT shows at ``now_s`` after these rows (:func:`read`), as Cassandra
    reconciles them (:func:`resolve`); an expiring cell is gone from ``at_s + ttl`` (the
    node's second, rounded down); a row or partition deleted hides its cells at or below the
    deletion's timestamp (:class:`Deletions`). The lines hold decoded values: of two live cells
    at one timestamp, the larger JSON of the value stands for Cassandra's larger bytes."""
    cells: dict[tuple, dict] = {}
    deletions = Deletions()
    for row in rows:
        if row["op"] in (ROW_DELETE, PARTITION_DELETE):
            deletions.delete(row["op"], tuple(row["key"]), row["ts"])
            continue
        at_s = int(row["at_s"])
        if row["op"] == "delete":
            written, ttl = {c: None for c in row["columns"]}, None
        else:
            written = row["cells"]
            ttl = row["ttl"] if isinstance(row["ttl"], int) and row["ttl"] > 0 else None
        held = cells.setdefault(tuple(row["key"]), {})
        for column, value in written.items():
            cell = (Cell(row["ts"], None, None, at_s) if value is None else
                    Cell(row["ts"], json.dumps(value).encode(), ttl,
                         at_s + ttl if ttl else NO_DELETION))
            held[column] = resolve(held.get(column), cell)
    out = {key: shown(held, now_s, lambda _column, raw: json.loads(raw),
                      deleted_at=deletions.of(key))
           for key, held in cells.items()}
    return {key: row for key, row in out.items() if row}


# -- cells -----------------------------------------------------------------------------------
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
    """The cell Cassandra keeps of two writes to one (row, column): the highest write
    timestamp wins; on a tie a tombstone or expiring cell beats a plain live one, a tombstone
    an expiring one, then the later local deletion time, then the larger value bytes
    (Cassandra 4.0+ ``Cells.resolveRegular``, CASSANDRA-14592)."""
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

    def shown(self, now_s: float, deleted_at: int = NOT_DELETED) -> tuple:
        """The list a SELECT shows: the live elements in cell id order (``deleted_at``: its
        row's deletion, :meth:`Deletions.of`: elements at or below it are gone too)."""
        above = max(self.deleted_at, deleted_at)
        return tuple(value for _id, ts, value, local_deletion in self.elements
                     if ts > above and local_deletion > now_s)

    def live(self, now_s: float) -> dict[int, list]:
        """The live elements by write timestamp, each in cell id order."""
        out: dict[int, list] = {}
        for _id, ts, value, local_deletion in self.elements:
            if ts > self.deleted_at and local_deletion > now_s:
                out.setdefault(ts, []).append(value)
        return out


@dataclass
class Deletions:
    """A table's rows and partitions deleted (a change stream's ``DELETE FROM ... WHERE
    <key>``): each key's highest deletion timestamp, the one that counts. A cell of a row is
    shown only above its row's and its partition's deletions (:meth:`of`): at equal
    timestamps the tombstone wins, and a write at a higher timestamp shows again, in whatever
    order the writes and the deletions arrived (Cassandra keeps both and reconciles on read).
    """

    rows: dict[tuple, int] = field(default_factory=dict)          # primary key -> ts
    partitions: dict[tuple, int] = field(default_factory=dict)    # partition key -> ts

    def delete(self, kind: str, key: tuple, ts: int) -> None:
        """A deletion of the row (:data:`ROW_DELETE`) or partition (:data:`PARTITION_DELETE`)
        ``key`` at ``ts``."""
        held = self.rows if kind == ROW_DELETE else self.partitions
        held[key] = max(held.get(key, NOT_DELETED), ts)

    def of(self, key: tuple) -> int:
        """The deletion timestamp covering the row ``key`` (its primary key): its own or its
        partition's (a partition key is a prefix of its rows' keys), the higher;
        :data:`NOT_DELETED` if neither."""
        return max([self.rows.get(key, NOT_DELETED)]
                   + [ts for partition, ts in self.partitions.items()
                      if key[:len(partition)] == partition])


def shown(cells: Mapping[str, Cell | ListCells], now_s: float,
          decode: Callable[[str, bytes], object],
          hidden: Callable[[str, int], bool] = lambda column, ts: False,
          deleted_at: int = NOT_DELETED) -> dict:
    """What a SELECT shows at ``now_s`` of a row's ``cells``: column -> value (``decode``:
    of a cell's bytes) of the live cells, expired and ``hidden`` ones (a dropped column's)
    left out, and those at or below ``deleted_at`` (the row's or its partition's deletion,
    :meth:`Deletions.of`); a list as a tuple, its elements in cell id order."""
    live = {}
    for column, cell in cells.items():
        if isinstance(cell, ListCells):
            elements = cell.shown(now_s, deleted_at)
            if elements:
                live[column] = elements
        elif not cell.tombstone and cell.local_deletion > now_s and cell.ts > deleted_at \
                and not hidden(column, cell.ts):
            live[column] = decode(column, cell.raw)
    return live
