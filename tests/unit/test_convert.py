"""CQL type parsing and Arrow -> cassandra-driver value conversion.

Each converted value is also serialised and read back with cassandra-driver's own type classes,
so "ready for cassandra-driver" is checked against the real binder, not just against our
expectations.
"""

from __future__ import annotations

import datetime as dt
import pickle
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
from cassandra import cqltypes
from cassandra.query import UNSET_VALUE
from cassandra.util import Date, OrderedMapSerializedKey, SortedSet, Time

from recovery.cql.convert import row_converter
from recovery.cql.errors import InvalidValueError, SchemaError
from recovery.cql.table import CqlType, TableSchema, parse_cql_type

pytestmark = pytest.mark.unit

UTC = dt.timezone.utc
U4 = uuid.UUID("12345678-1234-4678-9234-567812345678")
U1 = uuid.UUID("d2177dd0-eaa2-11de-a572-001b779c76e3")


# ---------------------------------------------------------------- parse_cql_type


@pytest.mark.parametrize("text, expected", [
    ("int", CqlType("int")),
    ("TEXT", CqlType("text")),
    (" list<int> ", CqlType("list", (CqlType("int"),))),
    ("frozen<map<text, list<int>>>", CqlType("map", (CqlType("text"), CqlType("list", (CqlType("int"),))), frozen=True)),
    ("map<frozen<list<int>>, set<uuid>>", CqlType("map", (CqlType("list", (CqlType("int"),), frozen=True), CqlType("set", (CqlType("uuid"),))))),
    ("tuple<int, text, frozen<set<date>>>", CqlType("tuple", (CqlType("int"), CqlType("text"), CqlType("set", (CqlType("date"),), frozen=True)))),
    ("vector<float, 3>", CqlType("vector", (CqlType("float"),), size=3)),
    ('frozen<"MyAddress">', CqlType("MyAddress", frozen=True)),
    ('"we""ird"', CqlType('we"ird')),
    ("'org.apache.cassandra.db.marshal.BytesType'", CqlType("org.apache.cassandra.db.marshal.BytesType")),
])
def test_parse_cql_type(text, expected):
    assert parse_cql_type(text) == expected


def test_a_parsed_type_is_parsed_once():
    """``parse_cql_type`` is cached (it runs per column at every Upserter and conversion):
    the same text gives the same object. (A helper inserted between the decorator and the
    function once took its cache.)"""
    assert parse_cql_type("map<text, frozen<list<int>>>") is \
        parse_cql_type("map<text, frozen<list<int>>>")


@pytest.mark.parametrize("text", ["frozen<map<text, list<int>>>", "map<text, int>", "vector<float, 3>", "set<frozen<list<int>>>"])
def test_cql_type_renders_back(text):
    assert str(parse_cql_type(text)) == text


@pytest.mark.parametrize("text", [
    "", "  ", "list<int", "list<>", "map<text>", "list<int, int>", "frozen<int, text>", "int>", "list<int>>",
    "map<text,, int>", "vector<float>", "list<int> text", "<int>", "in$t?",
])
def test_malformed_cql_type(text):
    with pytest.raises(ValueError):
        parse_cql_type(text)


# ---------------------------------------------------------------- helpers


def cqltype_class(cql: CqlType) -> type:
    """cassandra-driver's serializer class for a parsed type."""
    if cql.name == "vector":
        return cqltypes.VectorType.apply_parameters([cqltype_class(cql.params[0]), cql.size], None)
    base = cqltypes._cqltypes[cql.name]
    return base.apply_parameters([cqltype_class(p) for p in cql.params]) if cql.params else base


def normalize(value):
    """Any value as a hashable, order-free form; aware datetimes as naive UTC (as cassandra-driver
    reads them)."""
    if isinstance(value, (SortedSet, set, frozenset)):
        return frozenset(normalize(v) for v in value)
    if isinstance(value, (OrderedMapSerializedKey, dict)):
        return frozenset((normalize(k), normalize(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(normalize(v) for v in value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if isinstance(value, Date):
        return value.date()
    if isinstance(value, Time):
        return value.time()
    return value


def convert(cql: str, array: pa.Array, **kw) -> list:
    table = TableSchema("ks", "t", (("id", "int"), ("v", cql)), ("id",))
    batch = pa.record_batch({"id": pa.array(range(len(array)), pa.int32()), "v": array})
    rows = row_converter(table, ["id", "v"], **kw)(batch)
    assert [r[0] for r in rows] == list(range(len(array)))
    return [r[1] for r in rows]


def assert_cassandra_driver_round_trip(cql: str, values: list) -> None:
    typ = cqltype_class(parse_cql_type(cql))
    for value in values:
        if value is None:
            continue
        back = typ.from_binary(typ.to_binary(value, 4), 4)
        expected = normalize(value)
        if isinstance(back, SortedSet) and isinstance(value, list):  # a set of unhashables is bound as a list
            expected = frozenset(expected)
        assert normalize(back) == expected, (cql, value, back)


# ---------------------------------------------------------------- every type

CASES = [
    ("text", pa.array(["a", "é", None]), ["a", "é", None]),
    ("varchar", pa.array(["x", None], pa.large_string()), ["x", None]),
    ("ascii", pa.array(["abc", None]), ["abc", None]),
    ("uuid", pa.array([str(U4), U4.hex.upper(), None]), [U4, U4, None]),
    ("timeuuid", pa.array([str(U1), None]), [U1, None]),
    ("inet", pa.array(["10.0.0.1", "::1", None]), ["10.0.0.1", "::1", None]),
    ("int", pa.array([1, -(2**31), 2**31 - 1, None], pa.int32()), [1, -(2**31), 2**31 - 1, None]),
    ("smallint", pa.array([7, -32768, None], pa.int16()), [7, -32768, None]),
    ("smallint", pa.array([7, 32767, None], pa.int32()), [7, 32767, None]),
    ("tinyint", pa.array([-128, 127, None], pa.int8()), [-128, 127, None]),
    ("tinyint", pa.array([-128, 127, None], pa.int32()), [-128, 127, None]),
    ("bigint", pa.array([2**62, None], pa.int64()), [2**62, None]),
    ("bigint", pa.array([5, None], pa.int16()), [5, None]),
    ("varint", pa.array([2**63 - 1, None], pa.int64()), [2**63 - 1, None]),
    ("float", pa.array([1.5, None], pa.float32()), [1.5, None]),
    ("double", pa.array([0.1, None], pa.float64()), [0.1, None]),
    ("double", pa.array([0.5, None], pa.float32()), [0.5, None]),
    ("boolean", pa.array([True, False, None]), [True, False, None]),
    ("timestamp", pa.array([dt.datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
     [dt.datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC), None]),
    ("timestamp", pa.array([dt.datetime(2024, 5, 1, 12, 30, 15, 123000), None], pa.timestamp("us")),
     [dt.datetime(2024, 5, 1, 12, 30, 15, 123000), None]),
    ("date", pa.array([dt.date(2024, 2, 29), dt.date(1, 1, 1), None], pa.date32()), [dt.date(2024, 2, 29), dt.date(1, 1, 1), None]),
    ("time", pa.array([3_723_000_004_000, None], pa.time64("ns")), [dt.time(1, 2, 3, 4), None]),
    ("decimal", pa.array([Decimal("12.34"), Decimal("-0.01"), None], pa.decimal128(10, 2)), [Decimal("12.34"), Decimal("-0.01"), None]),
    ("blob", pa.array([b"\x00\xff", b"", None], pa.binary()), [b"\x00\xff", b"", None]),
    ("blob", pa.array([b"\x01", None], pa.large_binary()), [b"\x01", None]),
    ("list<int>", pa.array([[1, 2], [], None], pa.list_(pa.int32())), [[1, 2], [], None]),
    ("frozen<list<text>>", pa.array([["a"], None], pa.large_list(pa.string())), [["a"], None]),
    ("set<text>", pa.array([["a", "b", "a"], [], None], pa.list_(pa.string())), [{"a", "b"}, set(), None]),
    ("set<uuid>", pa.array([[str(U4)], None], pa.list_(pa.string())), [{U4}, None]),
    ("list<timeuuid>", pa.array([[str(U1), str(U1)], None], pa.list_(pa.string())), [[U1, U1], None]),
    ("map<text, int>", pa.array([[("a", 1), ("b", 2)], [], None], pa.map_(pa.string(), pa.int32())), [{"a": 1, "b": 2}, {}, None]),
    ("map<uuid, frozen<list<date>>>", pa.array([[(str(U4), [dt.date(2020, 1, 1)])], None], pa.map_(pa.string(), pa.list_(pa.date32()))),
     [{U4: [dt.date(2020, 1, 1)]}, None]),
    ("frozen<map<text, list<int>>>", pa.array([[("k", [1, 2])], None], pa.map_(pa.string(), pa.list_(pa.int32()))), [{"k": [1, 2]}, None]),
    ("map<frozen<list<int>>, text>", pa.array([[([1, 2], "x")], None], pa.map_(pa.list_(pa.int32()), pa.string())), [{(1, 2): "x"}, None]),
    ("set<frozen<list<int>>>", pa.array([[[1], [2, 3]], None], pa.list_(pa.list_(pa.int32()))), [{(1,), (2, 3)}, None]),
    ("list<frozen<set<uuid>>>", pa.array([[[str(U4)]], None], pa.list_(pa.list_(pa.string()))), [[{U4}], None]),
    ("list<frozen<map<text, int>>>", pa.array([[[("a", 1)]], None], pa.list_(pa.map_(pa.string(), pa.int32()))), [[{"a": 1}], None]),
    ("set<frozen<map<text, int>>>", pa.array([[[("a", 1)]], None], pa.list_(pa.map_(pa.string(), pa.int32()))), [[{"a": 1}], None]),
    ("vector<float, 3>", pa.array([[1.0, 2.0, 3.0], None], pa.list_(pa.float32())), [[1.0, 2.0, 3.0], None]),
]


@pytest.mark.parametrize("cql, array, expected", CASES, ids=[f"{c[0]}-{c[1].type}" for c in CASES])
def test_type_round_trips(cql, array, expected):
    got = convert(cql, array)
    assert got == expected
    for value, want in zip(got, expected):
        assert type(value) is type(want)
    assert_cassandra_driver_round_trip(cql, got)


def test_uuid_values_are_uuid_objects():
    assert all(isinstance(v, uuid.UUID) for v in convert("uuid", pa.array([str(U4)])))


def test_timestamp_with_other_zone_is_the_same_instant():
    instant = dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
    (value,) = convert("timestamp", pa.array([instant], pa.timestamp("us", tz="America/New_York")))
    assert value == instant
    assert_cassandra_driver_round_trip("timestamp", [value])


def test_rows_are_tuples_in_requested_order_and_extra_columns_ignored():
    table = TableSchema("ks", "t", (("id", "int"), ("name", "text"), ("tags", "set<text>")), ("id",))
    batch = pa.record_batch({"tags": pa.array([["x"], None]), "ttl_s": [5, 6], "ID": pa.array([1, 2], pa.int32()), "name": ["a", None]})
    rows = row_converter(table, ["ID", "name", "tags"])(batch)
    assert rows == [(1, "a", {"x"}), (2, None, None)]
    assert all(isinstance(r, tuple) for r in rows)


def test_empty_batch_gives_no_rows():
    table = TableSchema("ks", "t", (("id", "int"),), ("id",))
    assert row_converter(table, ["id"])(pa.record_batch({"id": pa.array([], pa.int32())})) == []


def test_sliced_batch_converts_only_its_rows():
    table = TableSchema("ks", "t", (("id", "int"), ("m", "map<text, int>"), ("l", "list<int>")), ("id",))
    batch = pa.record_batch({
        "id": pa.array([1, 2, 3], pa.int32()),
        "m": pa.array([[("a", None)], [("b", 2)], [("c", 3)]], pa.map_(pa.string(), pa.int32())),
        "l": pa.array([[None], [300], [4]], pa.list_(pa.int32())),
    }).slice(1)
    assert row_converter(table, ["id", "m", "l"])(batch) == [(2, {"b": 2}, [300]), (3, {"c": 3}, [4])]


def test_ignore_nulls_leaves_columns_unset():
    got = convert("text", pa.array(["a", None]), ignore_nulls=True)
    assert got == ["a", UNSET_VALUE]


def test_converter_pickles():
    table = TableSchema("ks", "t", (("id", "int"), ("u", "set<uuid>")), ("id",))
    conv = pickle.loads(pickle.dumps(row_converter(table, ["id", "u"])))
    batch = pa.record_batch({"id": pa.array([1], pa.int32()), "u": pa.array([[str(U4)]])})
    assert conv(batch) == [(1, {U4})]


# ---------------------------------------------------------------- bad values


def test_unknown_column_is_refused_when_building():
    table = TableSchema("ks", "t", (("id", "int"),), ("id",))
    with pytest.raises(SchemaError) as info:
        row_converter(table, ["id", "nope"])
    assert info.value.column == "nope"


@pytest.mark.parametrize("cql, array, fragment, row", [
    ("uuid", pa.array([str(U4), "not-a-uuid"]), "not a UUID", "row 1 of 2"),
    ("timeuuid", pa.array([str(U4)]), "version 1", "row 0 of 1"),
    ("ascii", pa.array(["ok", None, "café"]), "not ASCII", "row 2 of 3"),
    ("inet", pa.array(["10.0.0.300"]), "not an IP address", "row 0 of 1"),
    ("set<uuid>", pa.array([["zz"]], pa.list_(pa.string())), "not a UUID", "row 0 of 1"),
])
def test_bad_value_names_column_and_row(cql, array, fragment, row):
    with pytest.raises(InvalidValueError) as info:
        convert(cql, array)
    assert info.value.column == "v" and info.value.row_hint == row
    assert fragment in str(info.value) and "'v'" in str(info.value)


@pytest.mark.parametrize("cql, array", [
    ("tinyint", pa.array([1, 128], pa.int32())),
    ("tinyint", pa.array([-129, None], pa.int16())),
    ("smallint", pa.array([40000], pa.int32())),
    ("int", pa.array([2**31], pa.int64())),
    ("list<tinyint>", pa.array([[1, 200]], pa.list_(pa.int32()))),
    ("map<text, smallint>", pa.array([[("a", 70000)]], pa.map_(pa.string(), pa.int32()))),
])
def test_integer_out_of_range_names_column(cql, array):
    with pytest.raises(InvalidValueError, match="does not fit") as info:
        convert(cql, array)
    assert info.value.column == "v"


def test_narrow_int_column_of_only_nulls_is_fine():
    assert convert("tinyint", pa.array([None, None], pa.int32())) == [None, None]


@pytest.mark.parametrize("cql, array", [
    ("list<int>", pa.array([[1, None]], pa.list_(pa.int32()))),
    ("set<text>", pa.array([["a", None]], pa.list_(pa.string()))),
    ("map<text, int>", pa.array([[("a", None)]], pa.map_(pa.string(), pa.int32()))),
    ("list<frozen<list<int>>>", pa.array([[[1, None]]], pa.list_(pa.list_(pa.int32())))),
])
def test_null_inside_collection_names_column(cql, array):
    with pytest.raises(InvalidValueError, match="null inside") as info:
        convert(cql, array)
    assert info.value.column == "v"


def test_invalid_value_error_pickles():
    err = InvalidValueError("v", "row 3 of 9", "bad uuid")
    again = pickle.loads(pickle.dumps(err))
    assert (again.column, again.row_hint, again.reason, str(again)) == ("v", "row 3 of 9", "bad uuid", str(err))
