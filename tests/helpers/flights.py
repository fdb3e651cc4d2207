"""The flights table (:data:`TABLE`) of the Upserter's unit tests, :func:`chunk` (rows of every
fast and slow path), and :func:`flights_session`: the fake Cassandra's session
(``tests/helpers/fake_cassandra.py``) over that table, on a three-node ring."""

from __future__ import annotations

import datetime as dt
import uuid

import pyarrow as pa

from recovery.cql.table import TableSchema
from tests.helpers.fake_cassandra import FakeSession, Metadata

COLUMNS = (("carrier", "text"), ("flight", "int"), ("year", "int"), ("time_hour", "timestamp"),
           ("origin", "text"), ("delay", "double"), ("seats", "smallint"), ("ok", "boolean"),
           ("trip", "uuid"), ("tags", "set<text>"), ("day", "date"), ("photo", "blob"))
TABLE = TableSchema("ks", "flights", columns=COLUMNS, partition_key=("carrier", "flight", "year"),
                    clustering_key=("time_hour", "origin"))
UTC = dt.timezone.utc


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


def flights_session(metadata: Metadata | None = None, **kwargs) -> FakeSession:
    """The fake Cassandra's session over the flights table (:class:`FakeSession`'s options:
    ``script``, ``hold``, ``settings``, ``settings_error``)."""
    return FakeSession([TABLE], metadata=metadata or Metadata(keyspace="ks"), **kwargs)
