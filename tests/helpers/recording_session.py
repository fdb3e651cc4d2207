"""A driver Session for a real :class:`~cql.upsert.Upserter`, with no Cassandra: it records
every row of every request in a file, so that a test can read what a writer sent from any
process (the driver, a flush task, a worker process).

``prepare`` gives the driver's real ``PreparedStatement`` for the Upserter's ``INSERT ... USING
TIMESTAMP ? [AND TTL ?]`` and for its ``DELETE <columns> ... USING TIMESTAMP ? WHERE <key>``;
each request is answered at once, and each of its rows appended to ``path`` as one JSON line::

    {"op": "insert", "key": [1], "ts": 17..., "ttl": 3599, "cells": {"name": "a"},
     "at_s": 1800000000.2}
    {"op": "delete", "key": [1], "ts": 17..., "columns": ["name", "value"], "at_s": ...}

``ttl`` is null when none was sent and ``"unset"`` for an unset one; ``at_s`` is when the row
was "applied", on the real clock of this machine as it was when the module was imported (what
a test that skews ``time`` in a process calls Cassandra's clock).

:func:`visible` plays Cassandra's last write wins over such lines; :func:`skewed_clock` moves
this process's wall clock (``time.time``, ``time.time_ns``) and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time

from cassandra import cqltypes
from cassandra.protocol import ColumnMetadata
from cassandra.query import UNSET_VALUE, BatchStatement, PreparedStatement

from cql.table import TableSchema

_REAL_TIME_NS = time.time_ns
_REAL_TIME = time.time
TYPES = {"bigint": cqltypes.LongType, "int": cqltypes.Int32Type, "text": cqltypes.UTF8Type,
         "double": cqltypes.DoubleType}
_INSERT = re.compile(r'INSERT INTO (\S+) \((.*?)\) VALUES')
_DELETE = re.compile(r'DELETE (.*?) FROM (\S+) USING TIMESTAMP \? WHERE (.*)$')


def _names(text: str) -> list[str]:
    return [n.strip().strip('"') for n in text.split(",")]


class _Answer:
    """The driver's ResponseFuture as ``execute_concurrent`` uses it: answered at once."""

    _col_names = _col_types = None

    def add_callbacks(self, callback, errback, callback_args=(), callback_kwargs=None,
                      errback_args=(), errback_kwargs=None):
        callback([], *callback_args)

    def clear_callbacks(self):
        pass


class _Ring:
    def get_replicas(self, keyspace, routing_key):
        return ["node"]


class RecordingSession:
    def __init__(self, table: TableSchema, path: str):
        self.table, self.path = table, path
        self.cluster = type("Cluster", (), {"metadata": _Ring(), "shutdown": lambda self: None})()
        self._kinds: dict[bytes, tuple[str, list[str]]] = {}
        self._prepared: dict[bytes, PreparedStatement] = {}

    def prepare(self, cql: str) -> PreparedStatement:
        insert, delete = _INSERT.search(cql), _DELETE.search(cql)
        if insert:
            names = _names(insert.group(2))
            bound = names + ["[timestamp]"] + (["[ttl]"] if "TTL" in cql else [])
            kind = ("insert", names)
        elif delete:
            columns = _names(delete.group(1))
            where = [part.split("=")[0].strip().strip('"')
                     for part in delete.group(3).split(" AND ")]
            bound = ["[timestamp]"] + where
            kind = ("delete", columns)
        else:
            raise AssertionError(f"the Upserter prepared {cql!r}")
        types = {"[timestamp]": cqltypes.LongType, "[ttl]": cqltypes.Int32Type}
        meta = [ColumnMetadata("ks", self.table.table, n,
                               types.get(n) or TYPES[self.table.column_type(n)]) for n in bound]
        query_id = hashlib.sha1(cql.encode()).digest()
        self._kinds[query_id] = kind
        keys = [bound.index(k) for k in self.table.partition_key]
        prepared = PreparedStatement(meta, query_id, keys, cql, "ks", 5, None, None)
        self._prepared[query_id] = prepared
        return prepared

    def execute(self, *args, **kwargs):
        raise RuntimeError("no system_views here")     # read_batch_limits keeps the defaults

    def execute_async(self, statement, parameters=None, execution_profile=None, **_):
        rows = ([(self._prepared[query_id], v)
                 for _, query_id, v in statement._statements_and_parameters]
                if isinstance(statement, BatchStatement) else
                [(statement.prepared_statement, statement.values)])
        with open(self.path, "a") as fh:
            for prepared, values in rows:
                fh.write(json.dumps(self._row(prepared, values)) + "\n")
        return _Answer()

    def _row(self, prepared, values) -> dict:
        op, columns = self._kinds[prepared.query_id]
        decoded = {}
        for meta, raw in zip(prepared.column_metadata, values):
            decoded[meta.name] = ("unset" if raw is UNSET_VALUE else
                                  None if raw is None else meta.type.deserialize(raw, 5))
        out = {"op": op, "ts": decoded.pop("[timestamp]"), "at_s": _REAL_TIME_NS() / 1e9,
               "key": [decoded.pop(k) for k in self.table.primary_key]}
        if op == "insert":
            out["ttl"] = decoded.pop("[ttl]", None)
            out["cells"] = {c: v for c, v in decoded.items() if v != "unset"}
        else:
            out["columns"] = columns
        return out


def read(path) -> list[dict]:
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def visible(rows: list[dict], now_s: float) -> dict[tuple, dict]:
    """What a SELECT shows at ``now_s`` after these rows (``read``), as Cassandra reconciles
    them: per (key, column) the highest timestamp wins, a tombstone over a live cell at the
    same one; an expiring cell is gone from ``at_s + ttl`` (the node's second, rounded down)."""
    cells: dict[tuple, tuple] = {}
    for row in rows:
        key = tuple(row["key"])
        if row["op"] == "delete":
            written = {c: None for c in row["columns"]}
            ttl = None
        else:
            written = row["cells"]
            ttl = row["ttl"] if isinstance(row["ttl"], int) and row["ttl"] > 0 else None
        for column, value in written.items():
            expires = int(row["at_s"]) + ttl if ttl else float("inf")
            cell = (row["ts"], value is None, value, expires)
            old = cells.get((key, column))
            if old is None or cell[:2] > old[:2]:
                cells[(key, column)] = cell
    out: dict[tuple, dict] = {}
    for (key, column), (_ts, dead, value, expires) in cells.items():
        if not dead and expires > now_s:
            out.setdefault(key, {})[column] = value
    return out


@contextlib.contextmanager
def skewed_clock(seconds: float):
    """This process's wall clock ``seconds`` off (ahead if positive) while inside; its
    monotonic clock is left alone, as a clock step or a host's skew leaves it."""
    offset_ns = int(seconds * 1e9)
    before = time.time_ns, time.time
    time.time_ns = lambda: _REAL_TIME_NS() + offset_ns
    time.time = lambda: _REAL_TIME() + seconds
    try:
        yield
    finally:
        time.time_ns, time.time = before
