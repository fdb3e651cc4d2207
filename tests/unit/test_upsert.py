"""recovery.upsert.Upserter builds, from an Arrow chunk, exactly the requests ``bind`` would.

No Cassandra: a session whose ``prepare`` returns a real driver ``PreparedStatement`` for the
``INSERT ... USING TIMESTAMP ? [AND TTL ?]`` with the driver's CQL types. Each row the Upserter
builds must carry the same serialized values and the same routing key as
``PreparedStatement.bind(row + (timestamp,))``, every row must appear once, and each UNLOGGED
batch must hold one partition only.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
import uuid

import pyarrow as pa
import pytest
from cassandra import cqltypes
from cassandra.protocol import ColumnMetadata
from cassandra.query import BatchStatement, BoundStatement, PreparedStatement

from recovery.upsert import Upserter
from sinks.convert import row_converter
from sinks.options import WriteConfig
from sinks.table import TableSchema

pytestmark = pytest.mark.unit

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


class PreparingSession:
    """Just enough of a driver Session for Upserter.__init__: prepare() with real metadata."""

    def prepare(self, cql: str) -> PreparedStatement:
        names = cql.split("(", 1)[1].split(")", 1)[0].replace('"', "").split(", ")
        meta = [ColumnMetadata("ks", "flights", n, cqltypes.lookup_casstype(M + DRIVER[dict(COLUMNS)[n]]))
                for n in names]
        meta.append(ColumnMetadata("ks", "flights", "[timestamp]", cqltypes.LongType))
        if "TTL" in cql:
            meta.append(ColumnMetadata("ks", "flights", "[ttl]", cqltypes.Int32Type))
        keys = [names.index(k) for k in TABLE.partition_key]
        return PreparedStatement(meta, b"qid", keys, cql, "ks", 5, None, None)


def chunk(rows: int = 300) -> pa.RecordBatch:
    """Rows of 7 partitions (carrier, flight, year), some nulls, every fast and slow path."""
    base = dt.datetime(2013, 1, 1, tzinfo=UTC)
    return pa.record_batch({
        "carrier": [["UA", "AA", "B6", "DL"][i % 4] for i in range(rows)],
        "flight": pa.array([1545 + i % 7 % 2 for i in range(rows)], pa.int32()),
        "year": pa.array([2013 + i % 7 // 4 for i in range(rows)], pa.int32()),
        "time_hour": pa.array([base + dt.timedelta(minutes=i, microseconds=i * 7) for i in range(rows)],
                              pa.timestamp("us", tz="UTC")),
        "origin": ["EWR", "JFK", "LGA"] * (rows // 3),
        "delay": [None if i % 5 == 0 else i * 0.25 - 3 for i in range(rows)],
        "seats": pa.array([i % 300 for i in range(rows)], pa.int16()),
        "ok": [None if i % 11 == 0 else i % 2 == 0 for i in range(rows)],
        "trip": [str(uuid.UUID(int=i)) for i in range(rows)],
        "tags": [[f"t{i % 3}", "x"] if i % 4 else None for i in range(rows)],
        "day": pa.array([dt.date(2013, 1, 1) + dt.timedelta(days=i) for i in range(rows)], pa.date32()),
        "photo": [bytes([i % 256]) * (i % 5) for i in range(rows)],
        "ttl": pa.array([None if i % 9 == 0 else 60 + i for i in range(rows)], pa.int32()),
    })


def flattened(statements) -> list[BoundStatement]:
    out = []
    for statement, _ in statements:
        if isinstance(statement, BatchStatement):
            rows = statement._statements_and_parameters
            assert all(prepared for prepared, _, _ in rows)
            keys = {tuple(values[i] for i in (0, 1, 2)) for _, _, values in rows}
            assert len(keys) == 1, "an UNLOGGED batch must hold one partition"
            first = BoundStatement(statement_prepared)
            first.values = rows[0][2]
            assert statement.routing_key == first.routing_key
            out.extend(values for _, _, values in rows)
        else:
            out.append(statement.values)
    return out


statement_prepared: PreparedStatement


@pytest.mark.parametrize("write", [WriteConfig(), WriteConfig(batch_grouping_key="none"),
                                   WriteConfig(batch_size_rows=5, ttl_seconds=3600),
                                   WriteConfig(ttl_column="ttl", ignore_nulls=True)],
                         ids=["grouped", "ungrouped", "batch5-ttl", "ttlcolumn-ignorenulls"])
def test_requests_carry_exactly_what_bind_gives(write):
    global statement_prepared
    columns = [name for name, _ in COLUMNS]
    upserter = Upserter(PreparingSession(), TABLE, columns, write)
    statement_prepared = upserter.statement
    rb = chunk()
    built = flattened(upserter.statements(upserter.parameters(rb, first_ts=1_000_000)))

    rows = row_converter(TABLE, columns, ignore_nulls=write.ignore_nulls)(rb.select(columns))
    ttls = rb.column("ttl").to_pylist()
    expected = []
    for i, row in enumerate(rows):
        extra = (1_000_000 + i,)
        if write.ttl_seconds:
            extra += (write.ttl_seconds,)
        elif write.ttl_column:
            extra += (ttls[i] or 0,)
        bound = upserter.statement.bind(row + extra)
        expected.append(tuple(bound.values))
    assert sorted(map(tuple, built), key=repr) == sorted(expected, key=repr)
    assert len(built) == rb.num_rows


def test_rows_are_grouped_into_single_partition_batches_with_their_routing_key():
    global statement_prepared
    upserter = Upserter(PreparingSession(), TABLE, [n for n, _ in COLUMNS], WriteConfig())
    statement_prepared = upserter.statement
    rb = chunk()
    statements = upserter.statements(upserter.parameters(rb, first_ts=7))
    batches = [s for s, _ in statements if isinstance(s, BatchStatement)]
    sizes = Counter(zip(*(rb.column(k).to_pylist() for k in TABLE.partition_key))).values()
    assert len(sizes) == 16 and min(sizes) > 1
    assert len(batches) == sum(-(-n // 32) for n in sizes)    # at most 32 rows a batch
    assert all(b.is_idempotent and b.routing_key for b in batches)
    flattened(statements)        # one partition per batch, routing key of its rows


def test_a_constant_writetime_is_the_same_cell_for_every_row():
    write = WriteConfig(writetime_micros=1_700_000_000_000_000)
    upserter = Upserter(PreparingSession(), TABLE, [n for n, _ in COLUMNS], write)
    params = upserter.parameters(chunk(6), first_ts=1)
    assert {p[len(COLUMNS)] for p in params} == {(1_700_000_000_000_000).to_bytes(8, "big")}
