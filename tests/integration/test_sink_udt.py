"""Spark structs round-trip to user-defined types and tuples: DataFrame -> WAL -> Cassandra ->
cassandra-driver.

One table holds a non-frozen and a frozen UDT (a UDT nested in it, fields in another order than
the struct's and one matched ignoring case), lists, sets and maps of UDTs, a tuple and a list of
tuples holding a UDT; rows hold nulls inside (a null field, a null nested UDT, a null tuple
component) and null values. Written once by a batch ``save()`` and once by one streaming
micro-batch, read back with cassandra-driver and compared value by value.
"""

from __future__ import annotations

import uuid

import pytest
from sinkutil import plain, register, running, sink_options, wait_all_flushed, wait_query_done

from tests.helpers.node import fresh_keyspace

pytestmark = pytest.mark.integration

TYPES = ['CREATE TYPE {ks}.zipinfo (code text, "Plus4" int)',
         ('CREATE TYPE {ks}."Addr" (street text, zip frozen<zipinfo>, tags frozen<list<text>>, '
          'id uuid, rank tinyint)')]
TABLE = """CREATE TABLE {ks}.places (
    k text, c int,
    home "Addr", work frozen<"Addr">, past list<frozen<"Addr">>, zips set<frozen<zipinfo>>,
    by_name map<text, frozen<zipinfo>>, pos tuple<int, text>,
    legs list<frozen<tuple<double, frozen<zipinfo>>>>,
    PRIMARY KEY (k, c))"""

ZIP = "STRUCT<code: STRING, plus4: INT>"
ADDR = f"STRUCT<zip: {ZIP}, street: STRING, tags: ARRAY<STRING>, id: STRING, rank: INT>"
SPARK_SCHEMA = (f"k STRING, c INT, home {ADDR}, work {ADDR}, past ARRAY<{ADDR}>, zips ARRAY<{ZIP}>, "
                f"by_name MAP<STRING, {ZIP}>, pos STRUCT<n: INT, s: STRING>, "
                f"legs ARRAY<STRUCT<km: DOUBLE, `to`: {ZIP}>>")

U = "3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e"
#: past and legs are non-frozen lists of UDTs and tuples, which the sink writes only at least
#: once (tests/unit/test_lists.py); a null or empty one reads as null, as asserted below.
LISTS = {"wal.lists.atLeastOnce": "past,legs"}


def addr(street="Main St", zip_=("75001", 12), tags=("a", "b"), ident=U, rank=3):
    return {"zip": None if zip_ is None else {"code": zip_[0], "plus4": zip_[1]},
            "street": street, "tags": None if tags is None else list(tags), "id": ident, "rank": rank}


# (c, home, work, past, zips, by_name, pos, legs)
INPUT = [
    (1, addr(), addr(street="Quai", tags=[], rank=-128),
     [addr(street="Old"), addr(None, None, None, None, None)],
     [{"code": "1", "plus4": 1}, {"code": "1", "plus4": 1}, {"code": None, "plus4": 2}],
     {"x": {"code": "9", "plus4": None}}, {"n": 7, "s": "seven"},
     [{"km": 1.5, "to": {"code": "2", "plus4": 3}}, {"km": None, "to": None}]),
    # Nulls inside: a null field and a null nested UDT (non-frozen and frozen), a null component.
    (2, addr(street=None, zip_=None), addr(None, None, None, None, None), [], None, None,
     {"n": None, "s": "only"}, None),
    # Every value null.
    (3, None, None, None, None, None, None, None),
]


def _udt(a: dict | None) -> tuple | None:
    """An input struct as cassandra-driver reads the UDT back: fields in the type's order."""
    if a is None:
        return None
    zip_ = None if a["zip"] is None else (a["zip"]["code"], a["zip"]["plus4"])
    return (a["street"], zip_, a["tags"], None if a["id"] is None else uuid.UUID(a["id"]), a["rank"])


def expected() -> dict:
    out = {}
    for c, home, work, past, zips, by_name, pos, legs in INPUT:
        out[c] = {
            "home": _udt(home), "work": _udt(work),
            # Cassandra stores an empty non-frozen collection as none: it reads as null.
            "past": [_udt(a) for a in past] or None if past is not None else None,
            "zips": None if zips is None else {(z["code"], z["plus4"]) for z in zips},
            "by_name": None if by_name is None else {k: (z["code"], z["plus4"]) for k, z in by_name.items()},
            "pos": None if pos is None else (pos["n"], pos["s"]),
            "legs": None if legs is None else [(g["km"], None if g["to"] is None else
                                                (g["to"]["code"], g["to"]["plus4"])) for g in legs],
        }
    return out


def check(cql, ks: str, key: str) -> None:
    rows = {r.c: r for r in cql.execute(f"SELECT * FROM {ks}.places WHERE k = %s", (key,))}
    want = expected()
    assert sorted(rows) == sorted(want)
    for c, columns in want.items():
        for column, value in columns.items():
            got = plain(getattr(rows[c], column))
            assert got == value, f"row {c} column {column}: got {got!r}, expected {value!r}"
    # Types too, where == would not tell: a uuid field is a UUID, a tinyint an int.
    home = rows[1].home
    assert type(home.id) is uuid.UUID and type(home.rank) is int and type(home.zip.Plus4) is int


@pytest.fixture(scope="module")
def ks(cql):
    with fresh_keyspace(cql, "udt") as name:
        for ddl in TYPES + [TABLE]:
            cql.execute(ddl.format(ks=name))
        yield name


def frame(spark, key: str):
    return spark.createDataFrame([(key,) + row for row in INPUT], SPARK_SCHEMA)


def test_structs_round_trip_through_a_batch_save(spark, cassandra_node, cql, ks, tmp_path):
    register(spark)
    (frame(spark, "batch").write.format("cassandra_wal").mode("append")
     .options(**sink_options(cassandra_node, ks, "places", **{"wal.path": str(tmp_path / "wal")},
                             **LISTS))
     .save())
    check(cql, ks, "batch")


def test_structs_round_trip_through_a_stream(spark, cassandra_node, cql, ks, tmp_path):
    register(spark)
    src, cp = tmp_path / "src", tmp_path / "cp"
    frame(spark, "stream").coalesce(1).write.parquet(str(src))
    stream = spark.readStream.schema(SPARK_SCHEMA).parquet(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, ks, "places", cp, **LISTS))
             .trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp) == 0   # one micro-batch
    check(cql, ks, "stream")


def test_a_struct_missing_a_field_is_refused_before_anything_is_staged(spark, cassandra_node, cql, ks, tmp_path):
    df = spark.createDataFrame([("bad", 1, (5,))], "k STRING, c INT, pos STRUCT<n: INT>")
    with pytest.raises(Exception) as info:
        (df.write.format("cassandra_wal").mode("append")
         .options(**sink_options(cassandra_node, ks, "places", **{"wal.path": str(tmp_path / "wal")}))
         .save())
    assert "column 'pos': " in str(info.value) and "cannot feed a frozen<tuple<int, text>>" in str(info.value)
    assert list(cql.execute(f"SELECT * FROM {ks}.places WHERE k = 'bad'")) == []
