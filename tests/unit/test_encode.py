"""recovery.cql.encode: every vectorised column encoder gives cassandra-driver's own bytes.

The reference is what ``PreparedStatement.bind`` sends: the converter's per-value conversion,
then the cassandra-driver CQL type's ``serialize``. A difference would break idempotent replay (a
cell written twice must be the same cell), so each fast path is compared with it on edge values,
nulls and sliced arrays.
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from cassandra import cqltypes
from cassandra.query import UNSET_VALUE

from recovery.cql.convert import row_converter
from recovery.cql.encode import CellEncoder, fast_encoder
from recovery.cql.errors import InvalidValueError
from recovery.cql.table import TableSchema, parse_cql_type

pytestmark = pytest.mark.unit

CQLTYPE_CLASSES = {
    "tinyint": cqltypes.ByteType, "smallint": cqltypes.ShortType, "int": cqltypes.Int32Type,
    "bigint": cqltypes.LongType, "double": cqltypes.DoubleType, "float": cqltypes.FloatType,
    "boolean": cqltypes.BooleanType, "text": cqltypes.UTF8Type, "varchar": cqltypes.VarcharType,
    "ascii": cqltypes.AsciiType, "blob": cqltypes.BytesType, "timestamp": cqltypes.DateType,
    "date": cqltypes.SimpleDateType, "uuid": cqltypes.UUIDType,
}
UTC = dt.timezone.utc

CASES = [
    ("tinyint", pa.array([0, 1, -1, 127, -128, None], pa.int8())),
    ("tinyint", pa.array([5, -7, None], pa.int64())),
    ("smallint", pa.array([0, 32767, -32768, None, 300], pa.int16())),
    ("int", pa.array([0, 1, -1, 2**31 - 1, -2**31, None], pa.int32())),
    ("int", pa.array([7, None, -9], pa.int8())),
    ("bigint", pa.array([0, 2**63 - 1, -2**63, None, 12345678901], pa.int64())),
    ("bigint", pa.array([0, 2**32 - 1, None], pa.uint32())),
    ("double", pa.array([0.0, -0.0, 1.5, -2.25e300, 5e-324, math.inf, -math.inf, None], pa.float64())),
    ("double", pa.array([0.1, 3.4e38, None], pa.float32())),
    ("float", pa.array([0.1, -3.4e38, 1e-45, math.inf, None], pa.float32())),
    ("boolean", pa.array([True, False, None, True], pa.bool_())),
    ("text", pa.array(["", "a", "naïve ☃ 日本", None, "x" * 1000], pa.string())),
    ("varchar", pa.array(["é", None], pa.large_string())),
    ("ascii", pa.array(["plain", "", None], pa.string())),
    ("blob", pa.array([b"", b"\x00\xff", None, bytes(range(256))], pa.binary())),
    ("timestamp", pa.array([dt.datetime(2013, 1, 1, 5, 0, tzinfo=UTC),
                            dt.datetime(2013, 1, 1, 5, 0, 0, 999_999, tzinfo=UTC),
                            dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
                            dt.datetime(1900, 2, 3, 4, 5, 6, 1, tzinfo=UTC),
                            dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
                            dt.datetime(1, 1, 1, tzinfo=UTC), None],
                           pa.timestamp("us", tz="UTC"))),
    ("timestamp", pa.array([dt.datetime(2020, 5, 6, 7, 8, 9, 123_456), None], pa.timestamp("us"))),
    ("timestamp", pa.array([0, -1, 1_999_999, -1_500_001, None], pa.timestamp("ns", tz="UTC"))),
    ("timestamp", pa.array([0, -1, 1_700_000_000, None], pa.timestamp("s", tz="UTC"))),
    ("timestamp", pa.array([0, -1, 1_700_000_000_123, None], pa.timestamp("ms"))),
    ("date", pa.array([dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(2013, 6, 30),
                       dt.date(1, 1, 1), dt.date(9999, 12, 31), None], pa.date32())),
]


def table_of(cql: str) -> TableSchema:
    return TableSchema("ks", "t", columns=(("k", "int"), ("v", cql)), partition_key=("k",))


def reference(cql: str, array: pa.Array, ignore_nulls: bool = False) -> list:
    """What bind() would send: the converter's values through cassandra-driver's serialize."""
    conv = row_converter(table_of(cql), ["v"], ignore_nulls=ignore_nulls)
    values = conv.column(pa.record_batch({"v": array}), "v", conv.types[0])
    ser = CQLTYPE_CLASSES[cql].serialize
    return [v if v is None or v is UNSET_VALUE else ser(v, 5) for v in values]


def encoder(cql: str, ignore_nulls: bool = False) -> CellEncoder:
    conv = row_converter(table_of(cql), ["v"], ignore_nulls=ignore_nulls)
    return CellEncoder(conv, [CQLTYPE_CLASSES[cql]], protocol_version=5)


@pytest.mark.parametrize("cql,array", CASES, ids=[f"{c}-{a.type}-{i}" for i, (c, a) in enumerate(CASES)])
def test_fast_path_gives_cassandra_drivers_bytes(cql, array):
    assert fast_encoder(parse_cql_type(cql), array.type) is not None, "expected a vectorised path"
    [cells] = encoder(cql).columns_of(pa.record_batch({"v": array}))
    assert cells == reference(cql, array)


@pytest.mark.parametrize("cql,array", CASES[::3], ids=[c for c, _ in CASES[::3]])
def test_sliced_arrays_keep_their_offsets(cql, array):
    part = array.slice(1, len(array) - 1)
    [cells] = encoder(cql).columns_of(pa.record_batch({"v": part}))
    assert cells == reference(cql, part)
    assert len(cells) == len(part)


def test_ignore_nulls_sends_unset_not_null():
    array = pa.array([1, None, 3], pa.int32())
    [cells] = encoder("int", ignore_nulls=True).columns_of(pa.record_batch({"v": array}))
    assert cells == [b"\x00\x00\x00\x01", UNSET_VALUE, b"\x00\x00\x00\x03"]
    assert cells == reference("int", array, ignore_nulls=True)


def test_pairings_without_a_fast_path_use_cassandra_driver_per_value():
    """uuid from Spark strings, or a double column fed by integers: converter + serialize."""
    ids = pa.array(["3b241101-e2bb-4255-8caf-4136c566a962", None], pa.string())
    assert fast_encoder(parse_cql_type("uuid"), ids.type) is None
    [cells] = encoder("uuid").columns_of(pa.record_batch({"v": ids}))
    assert cells == reference("uuid", ids)
    assert fast_encoder(parse_cql_type("double"), pa.int64()) is None
    assert fast_encoder(parse_cql_type("float"), pa.float64()) is None


def test_non_ascii_text_in_an_ascii_column_is_refused_by_name():
    with pytest.raises(InvalidValueError, match="'v'.*not ASCII.*row 1 of 2"):
        encoder("ascii").columns_of(pa.record_batch({"v": pa.array(["ok", "é"])}))


def test_an_int_too_wide_for_the_column_is_refused_by_name():
    with pytest.raises(InvalidValueError, match="'v'.*does not fit CQL tinyint"):
        encoder("tinyint").columns_of(pa.record_batch({"v": pa.array([1, 300], pa.int64())}))


def test_a_value_cassandra_driver_cannot_serialize_names_the_column():
    big = pa.array([2**64 - 1], pa.uint64())   # no int64 cast, and too big for a bigint
    with pytest.raises(InvalidValueError, match="'v'.*CQL bigint"):
        encoder("bigint").columns_of(pa.record_batch({"v": big}))
