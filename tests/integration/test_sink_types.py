"""Every supported CQL type round-trips: Spark value -> WAL -> Cassandra -> cassandra-driver.

One table with one column per type, written once through a stream (Parquet files keep every
Spark type) and once through a batch ``save()``, read back with cassandra-driver and compared value
by value and type by type. Timestamps are compared at millisecond precision (Cassandra's):
the sub-millisecond part is dropped (rounded down, as Spark's own ``unix_millis`` does, also
before 1970). uuid and timeuuid arrive from Spark as strings.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

from sinkutil import (assert_rows_equal, create_table, read_table, register, rows_by_key,
                      running, sink_options, wait_all_flushed, wait_query_done,
                      write_parquet_files)

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc

TABLE = """types (
    k text, c int,
    big bigint, dbl double, flt float, flag boolean, ts timestamp, day date,
    u uuid, tu timeuuid, dec decimal, data blob,
    ints list<int>, tags set<text>, counts map<text, int>,
    PRIMARY KEY (k, c))"""

SPARK_SCHEMA = ("k STRING, c INT, big BIGINT, dbl DOUBLE, flt FLOAT, flag BOOLEAN, "
                "ts TIMESTAMP, day DATE, u STRING, tu STRING, dec DECIMAL(20,6), data BINARY, "
                "ints ARRAY<INT>, tags ARRAY<STRING>, counts MAP<STRING,INT>")

ARROW_SCHEMA = pa.schema([
    ("k", pa.string()), ("c", pa.int32()), ("big", pa.int64()), ("dbl", pa.float64()),
    ("flt", pa.float32()), ("flag", pa.bool_()), ("ts", pa.timestamp("us", tz="UTC")),
    ("day", pa.date32()), ("u", pa.string()), ("tu", pa.string()),
    ("dec", pa.decimal128(20, 6)), ("data", pa.binary()), ("ints", pa.list_(pa.int32())),
    ("tags", pa.list_(pa.string())), ("counts", pa.map_(pa.string(), pa.int32())),
])
COLUMNS = [f.name for f in ARROW_SCHEMA]
#: ints is a non-frozen list: written only at least once (tests/unit/test_lists.py); an
#: empty one reads as null, as asserted below.
LISTS = {"wal.lists.atLeastOnce": "ints"}

TIMEUUID_1 = "5c3d0a80-9f6e-11ee-8c90-0242ac120002"
TIMEUUID_2 = "00000000-0000-1000-8000-000000000000"


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# (k, c, big, dbl, flt, flag, ts, day, u, tu, dec, data, ints, tags, counts)
INPUT = [
    ("alpha", 1, 2**63 - 1, 0.1, 3.14, True,
     dt.datetime(2024, 2, 29, 12, 34, 56, 789123, tzinfo=UTC), dt.date(1999, 12, 31),
     "3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e", TIMEUUID_1, Decimal("-12345678901234.123456"),
     bytes(range(256)), [3, 1, 2, 1], ["b", "a", "b"], {"x": 1, "y": -2}),
    # Every non-key column null.
    ("alpha", 2) + (None,) * 13,
    ("ключ ☃ \"q\"", -2**31, -2**63, -1.5e-300, 1e38, False,
     dt.datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC), dt.date(1, 1, 1),
     "00000000-0000-0000-0000-000000000000", TIMEUUID_2, Decimal("0.000001"),
     b"", [], [], {}),
    ("omega", 2**31 - 1, 0, float("inf"), -2.5, None,
     dt.datetime(1970, 1, 1, tzinfo=UTC), dt.date(9999, 12, 31),
     None, None, Decimal("99999999999999.999999"), b"\x00", [-7], ["only"], {"": 0}),
]


def _expected() -> dict:
    """What cassandra-driver must return for each INPUT row, keyed by (k, c)."""

    def ms(ts):  # Cassandra keeps milliseconds; cassandra-driver returns naive UTC datetimes
        if ts is None:
            return None
        return ts.replace(microsecond=ts.microsecond // 1000 * 1000, tzinfo=None)

    out = {}
    for (k, c, big, dbl, flt, flag, ts, day, u, tu, dec, data, ints, tags, counts) in INPUT:
        out[(k, c)] = {
            "k": k, "c": c, "big": big, "dbl": dbl,
            "flt": None if flt is None else _f32(flt), "flag": flag, "ts": ms(ts), "day": day,
            "u": None if u is None else uuid.UUID(u), "tu": None if tu is None else uuid.UUID(tu),
            "dec": dec, "data": data,
            # Cassandra stores an empty collection as no collection at all: it reads as null.
            "ints": ints or None, "tags": set(tags) if tags else None,
            "counts": counts or None,
        }
    return out


def check_table(cql, keyspace):
    rows = read_table(cql, keyspace, "types")
    assert all(set(r) == set(COLUMNS) for r in rows)
    assert_rows_equal(rows_by_key(rows, "k", "c"), _expected(), "types")
    # Exact decimal scale survives too (Decimal equality alone ignores it).
    for r in rows:
        if r["dec"] is not None:
            expected = next(i[10] for i in INPUT if (i[0], i[1]) == (r["k"], r["c"]))
            assert r["dec"].as_tuple() == expected.as_tuple()


def test_types_round_trip_through_a_stream(spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, TABLE)
    src, cp = tmp_path / "src", tmp_path / "cp"
    table = pa.Table.from_pylist([dict(zip(COLUMNS, row)) for row in INPUT],
                                 schema=ARROW_SCHEMA)
    write_parquet_files(src, [table.slice(0, 2), table.slice(2)])
    stream = spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "types", cp, **LISTS))
             .trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp) == 1
    check_table(cql, keyspace)


def test_types_round_trip_through_a_batch_save(spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, TABLE)
    df = spark.createDataFrame(INPUT, SPARK_SCHEMA)
    (df.write.format("cassandra_wal").mode("append")
     .options(**sink_options(cassandra_node, keyspace, "types",
                             **{"wal.path": str(tmp_path / "wal")}, **LISTS))
     .save())
    check_table(cql, keyspace)
