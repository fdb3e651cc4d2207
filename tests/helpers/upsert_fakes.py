"""A Cassandra session without Cassandra, for the Upserter: ``prepare`` returns a real driver
``PreparedStatement`` for the flights table (:data:`TABLE`), over a three-node ring; a scripted
session answers ``execute_async`` at once or when the test releases the answers, from another
thread as the driver's event loop would. :func:`chunk` makes rows of every fast and slow path."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pyarrow as pa
from cassandra import cqltypes
from cassandra.protocol import ColumnMetadata
from cassandra.query import PreparedStatement

from cql.table import TableSchema

M = "org.apache.cassandra.db.marshal."
COLUMNS = (("carrier", "text"), ("flight", "int"), ("year", "int"), ("time_hour", "timestamp"),
           ("origin", "text"), ("delay", "double"), ("seats", "smallint"), ("ok", "boolean"),
           ("trip", "uuid"), ("tags", "set<text>"), ("day", "date"), ("photo", "blob"))
DRIVER = {"text": "UTF8Type", "int": "Int32Type", "timestamp": "TimestampType",
          "double": "DoubleType", "smallint": "ShortType", "boolean": "BooleanType",
          "uuid": "UUIDType", "set<text>": f"SetType({M}UTF8Type)", "date": "SimpleDateType",
          "blob": "BytesType"}
TABLE = TableSchema("ks", "flights", columns=COLUMNS, partition_key=("carrier", "flight", "year"),
                    clustering_key=("time_hour", "origin"))
UTC = dt.timezone.utc


class Ring:
    """The driver's ``cluster.metadata.get_replicas``: three nodes, a partition's replicas
    chosen from its routing key (none at all with ``known=False``: no token map)."""

    def __init__(self, known: bool = True):
        self.known = known
        self.asked: list[bytes] = []

    def get_replicas(self, keyspace: str, routing_key: bytes) -> list[str]:
        assert keyspace == "ks"
        self.asked.append(routing_key)
        return [f"node{sum(routing_key) % 3}"] if self.known else []


class PreparingSession:
    """Just enough of a driver Session for Upserter.__init__: prepare() with real metadata."""

    def __init__(self, ring: Ring | None = None):
        self.cluster = type("Cluster", (), {"metadata": ring or Ring()})()

    def prepare(self, cql: str) -> PreparedStatement:
        if cql.startswith("DELETE"):    # a row whose TTL ran out: DELETE <cols> ... WHERE <key>
            where = cql.split(" WHERE ", 1)[1].replace('"', "").split(" AND ")
            names = [w.split(" = ")[0] for w in where]
            meta = [ColumnMetadata("ks", "flights", "[timestamp]", cqltypes.LongType)]
            offset, query_id = 1, b"delete:" + cql.split(" FROM ")[0].encode()
        else:
            names = cql.split("(", 1)[1].split(")", 1)[0].replace('"', "").split(", ")
            meta, offset, query_id = [], 0, b"qid"
        meta += [ColumnMetadata("ks", "flights", n,
                                cqltypes.lookup_casstype(M + DRIVER[dict(COLUMNS)[n]]))
                 for n in names]
        if offset == 0:
            meta.append(ColumnMetadata("ks", "flights", "[timestamp]", cqltypes.LongType))
            if "TTL" in cql:
                meta.append(ColumnMetadata("ks", "flights", "[ttl]", cqltypes.Int32Type))
        keys = [offset + names.index(k) for k in TABLE.partition_key]
        return PreparedStatement(meta, query_id, keys, cql, "ks", 5, None, None)


def chunk(rows: int = 300) -> pa.RecordBatch:
    """Rows of 7 partitions (carrier, flight, year), some nulls, every fast and slow path."""
    base = dt.datetime(2013, 1, 1, tzinfo=UTC)
    return pa.record_batch({
        "carrier": [["UA", "AA", "B6", "DL"][i % 4] for i in range(rows)],
        "flight": pa.array([1545 + i % 7 % 2 for i in range(rows)], pa.int32()),
        "year": pa.array([2013 + i % 7 // 4 for i in range(rows)], pa.int32()),
        "time_hour": pa.array([base + dt.timedelta(minutes=i, microseconds=i * 7) for i in range(rows)],
                              pa.timestamp("us", tz="UTC")),
        "origin": [["EWR", "JFK", "LGA"][i % 3] for i in range(rows)],
        "delay": [None if i % 5 == 0 else i * 0.25 - 3 for i in range(rows)],
        "seats": pa.array([i % 300 for i in range(rows)], pa.int16()),
        "ok": [None if i % 11 == 0 else i % 2 == 0 for i in range(rows)],
        "trip": [str(uuid.UUID(int=i)) for i in range(rows)],
        "tags": [[f"t{i % 3}", "x"] if i % 4 else None for i in range(rows)],
        "day": pa.array([dt.date(2013, 1, 1) + dt.timedelta(days=i) for i in range(rows)], pa.date32()),
        "photo": [bytes([i % 256]) * (i % 5) for i in range(rows)],
        "ttl": pa.array([None if i % 9 == 0 else 60 + i for i in range(rows)], pa.int32()),
    })


class Answer:
    """The driver's ResponseFuture as the concurrent executor uses it."""

    _col_names = _col_types = None

    def __init__(self, statement, session: "ScriptedSession"):
        self.statement, self.session = statement, session
        self.callbacks = None
        self.outcome = None
        self.answered = False

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


class ScriptedSession(PreparingSession):
    """``execute_async`` answers from ``script(statement, attempt)`` (an exception or None) at
    once, or holds every answer until :meth:`release` when ``hold`` is set."""

    def __init__(self, script=lambda statement, attempt: None, hold: bool = False):
        super().__init__()
        self.script, self.hold = script, hold
        self.sent: list[Answer] = []
        self.attempts: dict[int, int] = {}
        self.lock = threading.Lock()

    def execute_async(self, statement, parameters=None, execution_profile=None, **_):
        assert parameters is None, "requests are bound already"
        with self.lock:
            attempt = self.attempts.get(id(statement), 0) + 1
            self.attempts[id(statement)] = attempt
            future = Answer(statement, self)
            self.sent.append(future)
        if not self.hold:
            future.answer(self.script(statement, attempt))
        return future

    def release(self, count: int | None = None):
        """Answer the held requests (the first ``count`` not answered yet), as the driver's
        event loop would: from another thread."""
        with self.lock:
            waiting = [f for f in self.sent if f.outcome is None][:count]
        for future in waiting:
            future.answer(self.script(future.statement, self.attempts[id(future.statement)]))
