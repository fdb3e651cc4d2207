"""Table schema (from cassandra-driver's metadata, JSON) and DataFrame validation against it."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from recovery.cql.errors import (
    ConnectionFailed,
    CounterTableError,
    InvalidValueError,
    NullPrimaryKeyError,
    SchemaError,
    UnknownKeyspaceError,
    UnknownTableError,
)
from sinks.worker.options import WriteConfig
from recovery.cql.table import TableSchema, fetch_table_schema
from sinks.worker.validation import (
    check_primary_key_not_null,
    check_ttl_and_writetime,
    validate_schema,
)
from tests.helpers.fake_cassandra import FakeCluster, keyspaces

pytestmark = pytest.mark.unit

EVENTS = TableSchema(
    keyspace="ks",
    table="events",
    columns=(("device", "text"), ("day", "date"), ("seq", "int"), ("payload", "blob"),
             ("tags", "set<text>"), ("attrs", "frozen<map<text, list<int>>>"), ("score", "double")),
    partition_key=("device", "day"),
    clustering_key=("seq",),
)
DEFAULT_WRITE = WriteConfig()


def schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, dtype) for name, dtype in fields])


KEYS = (("device", T.StringType()), ("day", T.DateType()), ("seq", T.IntegerType()))


# ---------------------------------------------------------------- TableSchema


def fake_column(name: str, cql_type: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, cql_type=cql_type)


def fake_table_metadata(keyspace: str = "ks", name: str = "events") -> SimpleNamespace:
    cols = {n: fake_column(n, t) for n, t in EVENTS.columns}
    return SimpleNamespace(
        keyspace_name=keyspace, name=name, columns=cols,
        partition_key=[cols["device"], cols["day"]], clustering_key=[cols["seq"]],
    )


def test_from_table_metadata():
    assert TableSchema.from_table_metadata(fake_table_metadata()) == EVENTS


def test_static_columns_come_from_the_cassandra_driver_metadata():
    """A change stream's key check needs them (issue 35: sinks.worker.key_order); the real
    node's metadata sets ``is_static`` the same way."""
    metadata = fake_table_metadata()
    metadata.columns["payload"].is_static = True
    assert TableSchema.from_table_metadata(metadata).static_columns == ("payload",)


def test_to_dict_from_dict_round_trip_through_json():
    data = json.loads(json.dumps(EVENTS.to_dict()))
    assert data["is_counter"] is False
    assert TableSchema.from_dict(data) == EVENTS


def test_table_schema_pickles():
    assert pickle.loads(pickle.dumps(EVENTS)) == EVENTS


def test_is_counter_and_keys():
    counters = TableSchema("ks", "hits", (("page", "text"), ("n", "counter")), ("page",))
    assert counters.is_counter and not EVENTS.is_counter
    assert EVENTS.primary_key == ("device", "day", "seq")


def test_key_column_must_be_a_column():
    with pytest.raises(ValueError, match="nope"):
        TableSchema("ks", "t", (("a", "int"),), ("nope",))


def test_resolve_column_exact_then_case_insensitive():
    table = TableSchema("ks", "t", (("id", "int"), ("Name", "text"), ("name", "text"), ("Value", "int")), ("id",))
    assert table.resolve_column("name") == "name"
    assert table.resolve_column("Name") == "Name"
    assert table.resolve_column("value") == "Value"
    assert table.resolve_column("ID") == "id"
    assert table.resolve_column("missing") is None
    with pytest.raises(SchemaError) as info:
        table.resolve_column("NAME")
    assert info.value.column == "NAME"


def test_fetch_table_schema_refreshes_the_table_first():
    cluster = FakeCluster(keyspaces=keyspaces(events=fake_table_metadata()))
    assert fetch_table_schema(cluster, "ks", "events") == EVENTS
    assert cluster.refreshed == [("ks", "events")]


def test_fetch_table_schema_sees_a_table_created_moments_ago():
    cluster = FakeCluster(keyspaces=keyspaces(),
                          after_refresh=keyspaces(events=fake_table_metadata()))
    session = SimpleNamespace(cluster=cluster)
    assert fetch_table_schema(session, "ks", "events") == EVENTS
    assert cluster.refreshed == [("all",)]


def test_fetch_table_schema_matches_names_ignoring_case():
    cluster = FakeCluster(keyspaces=keyspaces(events=fake_table_metadata()))
    assert fetch_table_schema(cluster, "KS", "Events") == EVENTS


def test_fetch_table_schema_unknown_keyspace():
    with pytest.raises(UnknownKeyspaceError) as info:
        fetch_table_schema(FakeCluster(keyspaces=keyspaces()), "nope", "events")
    assert info.value.keyspace == "nope" and "nope" in str(info.value)


def test_fetch_table_schema_unknown_table():
    with pytest.raises(UnknownTableError) as info:
        fetch_table_schema(FakeCluster(keyspaces=keyspaces()), "ks", "nope")
    assert (info.value.keyspace, info.value.table) == ("ks", "nope")
    assert "ks.nope" in str(info.value)


def test_fetch_table_schema_refresh_failure_is_connection_failed():
    with pytest.raises(ConnectionFailed) as info:
        fetch_table_schema(FakeCluster(keyspaces=keyspaces(), fail=True), "ks", "events")
    assert info.value.hosts == ("10.0.0.1",) and "control connection down" in str(info.value)


# ---------------------------------------------------------------- validate_schema


def test_written_columns_come_in_table_order():
    df = schema(("score", T.DoubleType()), *KEYS, ("payload", T.BinaryType()))
    assert validate_schema(df, EVENTS, DEFAULT_WRITE) == ["device", "day", "seq", "payload", "score"]


def test_columns_match_case_insensitively_and_keep_dataframe_names():
    df = schema(("Device", T.StringType()), ("DAY", T.DateType()), ("seq", T.IntegerType()))
    assert validate_schema(df, EVENTS, DEFAULT_WRITE) == ["Device", "DAY", "seq"]


def test_counter_table_is_refused():
    counters = TableSchema("ks", "hits", (("page", "text"), ("n", "counter")), ("page",))
    with pytest.raises(CounterTableError) as info:
        validate_schema(schema(("page", T.StringType()), ("n", T.LongType())), counters, DEFAULT_WRITE)
    assert "double count" in str(info.value) and "ks.hits" in str(info.value)


def test_unknown_column_is_named_with_close_matches():
    with pytest.raises(SchemaError) as info:
        validate_schema(schema(*KEYS, ("scores", T.DoubleType())), EVENTS, DEFAULT_WRITE)
    assert info.value.column == "scores"
    assert "not a column of ks.events" in str(info.value) and "close matches: score" in str(info.value)


@pytest.mark.parametrize("missing, kind", [("device", "partition key"), ("day", "partition key"), ("seq", "clustering")])
def test_missing_primary_key_column_is_named(missing, kind):
    df = schema(*[f for f in KEYS if f[0] != missing])
    with pytest.raises(SchemaError) as info:
        validate_schema(df, EVENTS, DEFAULT_WRITE)
    assert info.value.column == missing and kind in str(info.value)


def test_two_dataframe_columns_for_one_table_column():
    with pytest.raises(SchemaError, match="both map to table column 'seq'"):
        validate_schema(schema(*KEYS, ("SEQ", T.IntegerType())), EVENTS, DEFAULT_WRITE)


def test_incompatible_type_names_column_spark_type_and_cql_type():
    df = schema(*KEYS, ("score", T.StringType()))
    with pytest.raises(SchemaError) as info:
        validate_schema(df, EVENTS, DEFAULT_WRITE)
    assert info.value.column == "score"
    message = str(info.value)
    assert "Spark type string" in message and "CQL type double" in message


def test_long_into_int_suggests_a_cast():
    with pytest.raises(SchemaError, match="cast the column"):
        validate_schema(schema(("device", T.StringType()), ("day", T.DateType()), ("seq", T.LongType())), EVENTS, DEFAULT_WRITE)


def test_nested_type_mismatch_names_the_column():
    df = schema(*KEYS, ("attrs", T.MapType(T.StringType(), T.ArrayType(T.StringType()))))
    with pytest.raises(SchemaError) as info:
        validate_schema(df, EVENTS, DEFAULT_WRITE)
    assert info.value.column == "attrs" and "frozen<map<text, list<int>>>" in str(info.value)


def test_struct_to_a_type_of_unknown_fields_is_refused_clearly():
    # Structs feed UDTs and tuples (tests/unit/test_udt_tuple.py); a type whose fields the
    # schema does not record cannot be checked, so it is refused.
    table = TableSchema("ks", "t", (("id", "int"), ("addr", "frozen<address>")), ("id",))
    df = schema(("id", T.IntegerType()), ("addr", T.StructType([T.StructField("street", T.StringType())])))
    with pytest.raises(SchemaError, match="the fields of frozen<address> are unknown") as info:
        validate_schema(df, table, DEFAULT_WRITE)
    assert info.value.column == "addr"


COMPATIBLE = [
    (T.StringType(), ["text", "varchar", "ascii", "uuid", "timeuuid", "inet"]),
    (T.IntegerType(), ["int", "smallint", "tinyint", "bigint", "varint"]),
    (T.ShortType(), ["int", "smallint", "tinyint", "bigint", "varint"]),
    (T.ByteType(), ["int", "smallint", "tinyint", "bigint", "varint"]),
    (T.LongType(), ["bigint", "varint"]),
    (T.DoubleType(), ["double"]),
    (T.FloatType(), ["float", "double"]),
    (T.BooleanType(), ["boolean"]),
    (T.TimestampType(), ["timestamp"]),
    (T.TimestampNTZType(), ["timestamp"]),
    (T.DateType(), ["date"]),
    (T.TimeType(), ["time"]),
    (T.DecimalType(10, 2), ["decimal"]),
    (T.BinaryType(), ["blob"]),
    (T.ArrayType(T.IntegerType()), ["list<int>", "set<bigint>", "frozen<list<int>>", "vector<int, 3>"]),
    (T.ArrayType(T.ArrayType(T.StringType())), ["list<frozen<list<text>>>", "set<frozen<set<uuid>>>"]),
    (T.MapType(T.StringType(), T.ArrayType(T.LongType())), ["map<text, frozen<list<bigint>>>", "frozen<map<uuid, set<varint>>>"]),
]
INCOMPATIBLE = [
    (T.StringType(), ["int", "blob", "timestamp"]),
    (T.LongType(), ["int", "smallint", "double", "timestamp"]),
    (T.DoubleType(), ["float", "decimal"]),
    (T.FloatType(), ["int"]),
    (T.BooleanType(), ["int"]),
    (T.TimestampType(), ["date", "bigint"]),
    (T.DateType(), ["timestamp"]),
    (T.DecimalType(10, 2), ["double", "varint"]),
    (T.BinaryType(), ["text"]),
    (T.ArrayType(T.IntegerType()), ["map<int, int>", "list<text>", "int"]),
    (T.MapType(T.StringType(), T.IntegerType()), ["map<int, int>", "list<int>"]),
    (T.NullType(), ["int"]),
    (T.DayTimeIntervalType(), ["duration"]),
]


@pytest.mark.parametrize("spark_type, cql", [(s, c) for s, cs in COMPATIBLE for c in cs])
def test_compatible_types(spark_type, cql):
    table = TableSchema("ks", "t", (("id", "int"), ("v", cql)), ("id",))
    # A non-frozen list is written only with the opt-in (tests/unit/test_lists.py).
    write = WriteConfig(lists_at_least_once=table.non_frozen_lists)
    assert validate_schema(schema(("id", T.IntegerType()), ("v", spark_type)), table, write) == ["id", "v"]


@pytest.mark.parametrize("spark_type, cql", [(s, c) for s, cs in INCOMPATIBLE for c in cs])
def test_incompatible_types(spark_type, cql):
    table = TableSchema("ks", "t", (("id", "int"), ("v", cql)), ("id",))
    with pytest.raises(SchemaError) as info:
        validate_schema(schema(("id", T.IntegerType()), ("v", spark_type)), table, DEFAULT_WRITE)
    assert info.value.column == "v" and cql in str(info.value)


# ---------------------------------------------------------------- ttl / writetime columns


def test_ttl_and_writetime_columns_are_not_written():
    write = WriteConfig(ttl_column="ttl_s", writetime_column="wt")
    df = schema(*KEYS, ("ttl_s", T.IntegerType()), ("wt", T.LongType()))
    assert validate_schema(df, EVENTS, write) == ["device", "day", "seq"]


def test_writetime_column_may_be_a_timestamp():
    write = WriteConfig(writetime_column="wt")
    assert validate_schema(schema(*KEYS, ("wt", T.TimestampType())), EVENTS, write) == ["device", "day", "seq"]


def test_ttl_column_name_must_match_exactly():
    with pytest.raises(SchemaError, match="must match exactly; the DataFrame has 'ttl_s'") as info:
        validate_schema(schema(*KEYS, ("ttl_s", T.IntegerType())), EVENTS, WriteConfig(ttl_column="TTL_S"))
    assert info.value.column == "TTL_S"


@pytest.mark.parametrize("write, name", [
    (WriteConfig(ttl_column="ttl_s"), "ttl_s"),
    (WriteConfig(writetime_column="wt"), "wt"),
])
def test_missing_ttl_or_writetime_column_is_named(write, name):
    with pytest.raises(SchemaError, match="not in the DataFrame") as info:
        validate_schema(schema(*KEYS), EVENTS, write)
    assert info.value.column == name


@pytest.mark.parametrize("write, dtype", [
    (WriteConfig(ttl_column="x"), T.StringType()),
    (WriteConfig(ttl_column="x"), T.DoubleType()),
    (WriteConfig(writetime_column="x"), T.IntegerType()),
    (WriteConfig(writetime_column="x"), T.TimestampNTZType()),
    (WriteConfig(writetime_column="x"), T.StringType()),
])
def test_ttl_or_writetime_column_of_wrong_type(write, dtype):
    with pytest.raises(SchemaError, match="must be") as info:
        validate_schema(schema(*KEYS, ("x", dtype)), EVENTS, write)
    assert info.value.column == "x"


def test_ttl_column_that_is_also_a_table_column_is_refused():
    with pytest.raises(SchemaError, match="also a column") as info:
        validate_schema(schema(*KEYS), EVENTS, WriteConfig(ttl_column="seq"))
    assert info.value.column == "seq"


# ---------------------------------------------------------------- null keys


def test_primary_key_without_nulls_passes():
    batch = pa.record_batch({"device": ["a", "b"], "seq": [1, 2], "score": [None, 1.0]})
    check_primary_key_not_null(batch, ["device", "seq"])


def test_null_primary_key_names_column_and_row():
    batch = pa.record_batch({"device": ["a", "b", "c"], "seq": [1, None, None]})
    with pytest.raises(NullPrimaryKeyError) as info:
        check_primary_key_not_null(batch, ["device", "seq"])
    assert isinstance(info.value, SchemaError)
    assert info.value.column == "seq" and info.value.row_hint == "row 1 of 3"
    assert "'seq'" in str(info.value) and "row 1 of 3" in str(info.value)


# ---------------------------------------------------------------- ttl and writetime values
# Cassandra refuses these only when the row is written: staged, they would block the WAL.
TTL_WRITE = WriteConfig(ttl_column="ttl")
WT_WRITE = WriteConfig(writetime_column="wt")


@pytest.mark.parametrize("arrow_type,largest", [(pa.int8(), 127), (pa.int16(), 32_767),
                                                 (pa.int32(), 630_720_000),
                                                 (pa.int64(), 630_720_000)])
def test_ttls_in_range_and_null_ttls_pass(arrow_type, largest):
    values = [0, 1, None, largest]
    check_ttl_and_writetime(pa.record_batch({"ttl": pa.array(values, arrow_type)}), TTL_WRITE)


@pytest.mark.parametrize("bad", [-1, 630_720_001, 2**31, 2**32 + 5])
def test_ttl_out_of_range_names_column_row_and_value(bad):
    batch = pa.record_batch({"id": [1, 2, 3], "ttl": pa.array([10, None, bad], pa.int64())})
    with pytest.raises(InvalidValueError) as info:
        check_ttl_and_writetime(batch, TTL_WRITE)
    assert info.value.column == "ttl" and info.value.row_hint == "row 2 of 3"
    message = str(info.value)
    assert f"TTL {bad} is out of range" in message and "630720000" in message
    assert "null for the table's default" in message


def test_negative_ttl_in_a_narrow_column():
    batch = pa.record_batch({"ttl": pa.array([5, -3], pa.int8())})
    with pytest.raises(InvalidValueError, match=r"TTL -3 is out of range.*row 1 of 2"):
        check_ttl_and_writetime(batch, TTL_WRITE)


@pytest.mark.parametrize("values,arrow_type", [
    ([1_700_000_000_000_000, 0], pa.int64()),
    ([1_700_000_000_000_000, 0], pa.timestamp("us", tz="UTC")),
    ([1_700_000_000_000_000, 0], pa.timestamp("us")),
])
def test_writetimes_not_negative_pass(values, arrow_type):
    check_ttl_and_writetime(pa.record_batch({"wt": pa.array(values, arrow_type)}), WT_WRITE)


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.timestamp("us", tz="UTC")])
def test_null_writetime_is_refused(arrow_type):
    batch = pa.record_batch({"wt": pa.array([1_700_000_000_000_000, None], arrow_type)})
    with pytest.raises(InvalidValueError) as info:
        check_ttl_and_writetime(batch, WT_WRITE)
    assert info.value.column == "wt" and info.value.row_hint == "row 1 of 2"
    assert "write timestamp is null" in str(info.value)


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.timestamp("us", tz="UTC")])
def test_negative_writetime_is_refused(arrow_type):
    batch = pa.record_batch({"wt": pa.array([1, 2, -1_000_000], arrow_type)})
    with pytest.raises(InvalidValueError) as info:
        check_ttl_and_writetime(batch, WT_WRITE)
    assert info.value.column == "wt" and info.value.row_hint == "row 2 of 3"
    assert "is negative" in str(info.value)


def test_without_ttl_or_writetime_columns_nothing_is_read():
    check_ttl_and_writetime(pa.record_batch({"ttl": [-1], "wt": [None]}), WriteConfig())


def test_schema_errors_pickle():
    for err in (SchemaError("c", "bad"), NullPrimaryKeyError("k", "row 2 of 5"),
                InvalidValueError("ttl", "row 0 of 1", "TTL -1 is out of range"),
                CounterTableError("ks", "t"), UnknownTableError("ks", "t"), UnknownKeyspaceError("ks")):
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
