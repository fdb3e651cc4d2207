"""Spark structs to Cassandra user-defined types (fields by name) and tuples (by position).

What the table records (:class:`recovery.cql.table.TableSchema`: the UDTs its columns use, nested ones
too), how a struct's values become what cassandra-driver binds (:mod:`recovery.cql.convert`) and the
cassandra-driver's bytes (:mod:`recovery.cql.encode`), and every refusal of
:func:`sinks.worker.validation.validate_schema` and of the whole-column checks, each naming the column and the field's path.
"""

from __future__ import annotations

import pickle
import uuid
from types import SimpleNamespace

import pyarrow as pa
import pytest
from cassandra import cqltypes
from cassandra.query import UNSET_VALUE
from pyspark.sql import types as T

from recovery.cql.config import WriteConfig
from recovery.cql.convert import FieldMismatch, UdtValue, row_converter, struct_sources
from recovery.cql.encode import CellEncoder
from recovery.cql.errors import InvalidValueError, SchemaError
from recovery.cql.table import CqlType, TableSchema, parse_cql_type
from sinks.worker.validation import validate_schema

pytestmark = pytest.mark.unit

ZIP = ("zipinfo", (("code", "text"), ("Plus4", "int")))
ADDR = ("Addr", (("street", "text"), ("zip", "frozen<zipinfo>"), ("tags", "frozen<list<text>>"),
                 ("id", "uuid"), ("rank", "tinyint")))
COLUMNS = (("k", "int"), ("home", '"Addr"'), ("work", 'frozen<"Addr">'),
           ("past", 'list<frozen<"Addr">>'), ("zips", "set<frozen<zipinfo>>"),
           ("by_name", "map<text, frozen<zipinfo>>"), ("pos", "frozen<tuple<int, text>>"),
           ("legs", "list<frozen<tuple<double, frozen<zipinfo>>>>"))
TABLE = TableSchema("ks", "t", COLUMNS, ("k",), user_types=(ADDR, ZIP))

ZIP_ARROW = pa.struct([("code", pa.string()), ("plus4", pa.int32())])   # Plus4, by case
ADDR_ARROW = pa.struct([("zip", ZIP_ARROW), ("street", pa.string()),  # not the type's order
                        ("tags", pa.list_(pa.string())), ("id", pa.string()), ("rank", pa.int32())])
ARROW = pa.schema([
    ("k", pa.int32()), ("home", ADDR_ARROW), ("work", ADDR_ARROW), ("past", pa.list_(ADDR_ARROW)),
    ("zips", pa.list_(ZIP_ARROW)), ("by_name", pa.map_(pa.string(), ZIP_ARROW)),
    ("pos", pa.struct([("_1", pa.int32()), ("_2", pa.string())])),
    ("legs", pa.list_(pa.struct([("km", pa.float64()), ("to", ZIP_ARROW)]))),
])
U = uuid.UUID("3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e")


def addr(street="Main St", code="75001", plus4=12, tags=("a", "b"), ident=str(U), rank=3):
    return {"zip": None if code is None and plus4 is None else {"code": code, "plus4": plus4},
            "street": street, "tags": None if tags is None else list(tags), "id": ident,
            "rank": rank}


ROWS = [
    {"k": 1, "home": addr(), "work": addr(street="Quai", tags=[]),
     "past": [addr(street="Old"), addr(street=None, code=None, plus4=None, tags=None, ident=None, rank=None)],
     "zips": [{"code": "1", "plus4": 1}, {"code": "1", "plus4": 1}, {"code": None, "plus4": 2}],
     "by_name": [("x", {"code": "9", "plus4": None})], "pos": {"_1": 7, "_2": "seven"},
     "legs": [{"km": 1.5, "to": {"code": "2", "plus4": 3}}, {"km": None, "to": None}]},
    # Nulls inside: a null field, a null nested UDT, a null tuple component.
    {"k": 2, "home": addr(street=None, code=None, plus4=None), "work": None, "past": [],
     "zips": None, "by_name": None, "pos": {"_1": None, "_2": "only"}, "legs": None},
    # Every value null.
    {"k": 3, "home": None, "work": None, "past": None, "zips": None, "by_name": None,
     "pos": None, "legs": None},
]


def batch(rows=ROWS) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=ARROW)


def cqltype_class(cql: CqlType) -> type:
    """cassandra-driver's serializer class of an expanded type (a prepared statement gives the
    same)."""
    if cql.is_udt:
        return cqltypes.UserType.make_udt_class("ks", cql.name, cql.fields,
                                                tuple(cqltype_class(p) for p in cql.params))
    base = cqltypes._cqltypes[cql.name]
    return base.apply_parameters([cqltype_class(p) for p in cql.params]) if cql.params else base


def columns_of(rows) -> dict[str, list]:
    converter = row_converter(TABLE, [c for c, _ in COLUMNS])
    return dict(zip(converter.columns, zip(*converter(batch(rows)), strict=True), strict=True))


# ---------------------------------------------------------------- the table's UDTs


def metadata(columns, user_types):
    table = SimpleNamespace(
        keyspace_name="ks", name="t",
        columns={n: SimpleNamespace(cql_type=t) for n, t in columns},
        partition_key=[SimpleNamespace(name=columns[0][0])], clustering_key=[])
    types = {name: SimpleNamespace(field_names=[f for f, _ in fields], field_types=[t for _, t in fields])
             for name, fields in user_types}
    return table, types


def test_the_schema_records_the_udts_its_columns_use_nested_ones_too():
    unused = ("unused", (("x", "int"),))
    table = TableSchema.from_table_metadata(*metadata(COLUMNS, [unused, ZIP, ADDR]))
    assert table.user_types == (ADDR, ZIP)
    only_nested = TableSchema.from_table_metadata(*metadata(COLUMNS[:2], [unused, ZIP, ADDR]))
    assert only_nested.user_types == (ADDR, ZIP)


def test_user_types_survive_the_wal_record_and_pickling():
    assert TableSchema.from_dict(TABLE.to_dict()) == TABLE
    assert pickle.loads(pickle.dumps(TABLE)) == TABLE
    old = {k: v for k, v in TABLE.to_dict().items() if k != "user_types"}  # recorded before UDTs
    assert TableSchema.from_dict(old).user_types == ()


def test_cql_type_expands_udts_by_name_keeping_frozen_and_case():
    home, work = TABLE.cql_type("home"), TABLE.cql_type("work")
    assert (home.name, home.frozen, home.fields) == ("Addr", False, ("street", "zip", "tags", "id", "rank"))
    assert work.frozen and work.params == home.params
    zip_type = home.params[1]
    assert zip_type == CqlType("zipinfo", (CqlType("text"), CqlType("int")), frozen=True,
                               fields=("code", "Plus4"))
    assert str(work) == 'frozen<"Addr">' and str(zip_type) == "frozen<zipinfo>"
    assert TABLE.cql_type("legs").params[0].params[1].fields == ("code", "Plus4")
    assert parse_cql_type('frozen<"Addr">').fields is None   # the bare parse knows no fields


# ---------------------------------------------------------------- conversion


def test_structs_become_udt_values_in_the_types_field_order_and_tuples_by_position():
    cols = columns_of(ROWS)
    assert cols["home"][0] == ("Main St", ("75001", 12), ["a", "b"], U, 3)
    assert isinstance(cols["home"][0], UdtValue) and isinstance(cols["home"][0][1], UdtValue)
    assert cols["work"][0] == ("Quai", ("75001", 12), [], U, 3)
    assert cols["past"][0] == [("Old", ("75001", 12), ["a", "b"], U, 3), (None,) * 5]
    assert cols["zips"][0] == {("1", 1), (None, 2)}
    assert cols["by_name"][0] == {"x": ("9", None)}
    assert cols["pos"][0] == (7, "seven") and type(cols["pos"][0]) is tuple
    assert cols["legs"][0] == [(1.5, ("2", 3)), (None, None)]


def test_nulls_inside_and_null_values():
    cols = columns_of(ROWS)
    assert cols["home"][1] == (None, None, ["a", "b"], U, 3)
    assert cols["pos"][1] == (None, "only")
    assert all(cols[c][2] is None for c in cols if c != "k")


def test_a_null_udt_is_left_unset_with_ignore_nulls_but_its_null_fields_are_sent():
    converter = row_converter(TABLE, ["k", "home"], ignore_nulls=True)
    rows = converter(batch())
    assert rows[2][1] is UNSET_VALUE
    assert rows[1][1] == (None, None, ["a", "b"], U, 3)


def test_a_sliced_batch_converts_only_its_rows():
    converter = row_converter(TABLE, ["k", "home", "past"])
    rows = converter(batch().slice(1, 2))
    assert [r[0] for r in rows] == [2, 3] and rows[1][1] is None


def test_a_udt_with_a_frozen_list_field_can_be_a_set_element_and_a_map_key():
    table = TableSchema("ks", "t", (("k", "int"), ("s", "set<frozen<w>>"), ("m", "map<frozen<w>, int>")),
                        ("k",), user_types=(("w", (("xs", "frozen<list<int>>"),)),))
    w = pa.struct([("xs", pa.list_(pa.int32()))])
    rb = pa.RecordBatch.from_pylist([{"k": 1, "s": [{"xs": [1, 2]}], "m": [({"xs": [3]}, 4)]}],
                                    schema=pa.schema([("k", pa.int32()), ("s", pa.list_(w)),
                                                      ("m", pa.map_(w, pa.int32()))]))
    (_, s, m), = row_converter(table, ["k", "s", "m"])(rb)
    assert s == {((1, 2),)} and m == {((3,),): 4}


def test_every_value_round_trips_through_cassandra_drivers_types():
    converter = row_converter(TABLE, [c for c, _ in COLUMNS])
    for name, cql in zip(converter.columns, converter.types, strict=True):
        typ = cqltype_class(cql)
        for value in converter.column(batch(), name, cql):
            if value is not None:
                again = typ.from_binary(typ.to_binary(value, 5), 5)
                assert typ.to_binary(again, 5) == typ.to_binary(value, 5), name


def test_cells_are_cassandra_drivers_bytes():
    converter = row_converter(TABLE, [c for c, _ in COLUMNS])
    types = [cqltype_class(t) for t in converter.types]
    cells = CellEncoder(converter, types, protocol_version=5).columns_of(batch())
    for i, name in enumerate(converter.columns):
        values = converter.column(batch(), name, converter.types[i])
        assert cells[i] == [None if v is None else types[i].serialize(v, 5) for v in values], name


def test_a_field_added_to_the_type_after_staging_is_written_null():
    """A replay's prepared statement knows the field (ALTER TYPE ... ADD); the staged schema does not."""
    (_, home), = row_converter(TABLE, ["k", "home"])(batch(ROWS[:1]))
    home_type = TABLE.cql_type("home")
    wider = cqltypes.UserType.make_udt_class(
        "ks", "Addr_wider", home_type.fields + ("added",),
        tuple(cqltype_class(p) for p in home_type.params) + (cqltypes.Int32Type,))
    assert wider.serialize(home, 5) == \
        cqltype_class(home_type).serialize(home, 5) + b"\xff\xff\xff\xff"
    assert wider.deserialize(wider.serialize(home, 5), 5)[-1] is None


def test_the_converter_pickles_with_its_types():
    converter = pickle.loads(pickle.dumps(row_converter(TABLE, ["k", "home", "legs"])))
    assert converter(batch())[0][1] == ("Main St", ("75001", 12), ["a", "b"], U, 3)


# ---------------------------------------------------------------- values refused while staging


def test_a_bad_uuid_in_a_udt_field_names_the_column_and_row():
    rows = [dict(ROWS[0], home=addr(ident="not-a-uuid"))]
    converter = row_converter(TABLE, ["k", "home"])
    with pytest.raises(InvalidValueError, match="not a UUID") as info:
        converter.validate(batch(rows))
    assert info.value.column == "home" and info.value.row_hint == "row 0 of 1"


def test_an_out_of_range_field_names_the_column_and_field_path():
    rows = [dict(ROWS[0], past=[addr(), addr(rank=300)])]
    with pytest.raises(InvalidValueError, match=r"past\.element\.rank: value 300 does not fit CQL tinyint") as info:
        row_converter(TABLE, ["k", "past"]).validate(batch(rows))
    assert info.value.column == "past"


def test_a_null_inside_a_collection_field_of_a_udt_is_refused():
    rows = [dict(ROWS[0], home=addr(tags=["a", None]))]
    with pytest.raises(InvalidValueError, match=r"home\.tags: null inside a list") as info:
        row_converter(TABLE, ["k", "home"]).validate(batch(rows))
    assert info.value.column == "home"


def test_a_null_udt_inside_a_list_is_refused():
    rows = [dict(ROWS[0], past=[addr(), None])]
    with pytest.raises(InvalidValueError, match="null inside a list") as info:
        row_converter(TABLE, ["k", "past"]).validate(batch(rows))
    assert info.value.column == "past"


def test_the_converter_refuses_a_struct_that_does_not_fit_its_udt():
    rb = pa.RecordBatch.from_pylist([{"k": 1, "home": {"street": "x"}}],
                                    schema=pa.schema([("k", pa.int32()), ("home", pa.struct([("street", pa.string())]))]))
    with pytest.raises(SchemaError, match=r"field home\.zip: field of the user-defined type Addr is missing") as info:
        row_converter(TABLE, ["k", "home"])(rb)
    assert info.value.column == "home"


# ---------------------------------------------------------------- matching a struct


def test_struct_sources_match_udt_fields_by_name_then_ignoring_case():
    udt = TABLE.cql_type("home").params[1]   # zipinfo (code, Plus4)
    assert struct_sources(udt, ["Plus4", "code"]) == [1, 0]
    assert struct_sources(udt, ["PLUS4", "Code"]) == [1, 0]
    both = CqlType("u", (CqlType("int"), CqlType("int")), fields=("a", "A"))
    assert struct_sources(both, ["A", "a"]) == [1, 0]                    # exact names first
    with pytest.raises(FieldMismatch, match="matches fields 'Ab', 'aB' of the user-defined type u ignoring case"):
        struct_sources(CqlType("u", (CqlType("int"),) * 2, fields=("Ab", "aB")), ["ab", "AB"])


def test_struct_sources_of_a_tuple_are_positions():
    pair = parse_cql_type("frozen<tuple<int, text>>")
    assert struct_sources(pair, ["b", "a"]) == [0, 1]
    with pytest.raises(FieldMismatch, match="a struct of 3 field"):
        struct_sources(pair, ["a", "b", "c"])


# ---------------------------------------------------------------- validate_schema


def spark_schema(**columns: T.DataType) -> T.StructType:
    return T.StructType([T.StructField("k", T.IntegerType())]
                        + [T.StructField(n, t) for n, t in columns.items()])


def struct(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in fields])


ZIP_SPARK = struct(("code", T.StringType()), ("plus4", T.IntegerType()))
ADDR_SPARK = struct(("street", T.StringType()), ("zip", ZIP_SPARK), ("tags", T.ArrayType(T.StringType())),
                    ("id", T.StringType()), ("rank", T.IntegerType()))
WRITE = WriteConfig(lists_at_least_once=("past", "legs"))   # non-frozen lists: tests/unit/test_lists.py


def test_a_dataframe_of_structs_is_accepted():
    df = spark_schema(
        home=ADDR_SPARK, work=ADDR_SPARK, past=T.ArrayType(ADDR_SPARK), zips=T.ArrayType(ZIP_SPARK),
        by_name=T.MapType(T.StringType(), ZIP_SPARK),
        pos=struct(("first", T.ShortType()), ("second", T.StringType())),
        legs=T.ArrayType(struct(("_1", T.FloatType()), ("_2", ZIP_SPARK))))
    assert validate_schema(df, TABLE, WRITE) == [c for c, _ in COLUMNS]


def replace_field(fields: T.StructType, name: str, new: T.StructField | None) -> T.StructType:
    kept = [new if f.name == name else f for f in fields.fields]
    return T.StructType([f for f in kept if f is not None])


REFUSED = [
    # (column, its Spark type, the path the error names, a fragment of the reason)
    ("home", T.StructType(ADDR_SPARK.fields + [T.StructField("country", T.StringType())]),
     "home.country", "not a field of the user-defined type Addr"),
    ("home", replace_field(ADDR_SPARK, "rank", None), "home.rank",
     "field of the user-defined type Addr is missing from the struct (missing: rank)"),
    ("home", replace_field(ADDR_SPARK, "zip", T.StructField("zip", struct(("code", T.StringType())))),
     "home.zip.Plus4", "is missing"),
    ("home", T.StructType(ADDR_SPARK.fields + [T.StructField("Street", T.StringType())]),
     "home.Street", "struct fields 'street' and 'Street' both map to field 'street'"),
    ("home", replace_field(ADDR_SPARK, "zip", T.StructField("zip", struct(("code", T.IntegerType()), ("plus4", T.IntegerType())))),
     "home.zip.code", "Spark type int cannot be written to CQL type text"),
    ("work", replace_field(ADDR_SPARK, "rank", T.StructField("rank", T.LongType())),
     "work.rank", "Spark type bigint cannot be written to CQL type tinyint"),
    ("past", T.ArrayType(replace_field(ADDR_SPARK, "tags", T.StructField("tags", T.StringType()))),
     "past.element.tags", "CQL type frozen<list<text>>: strings go to"),
    ("by_name", T.MapType(T.StringType(), struct(("code", T.StringType()), ("plus4", T.StringType()))),
     "by_name.value.plus4", "Spark type string cannot be written to CQL type int"),
    ("pos", struct(("a", T.IntegerType())), "pos", "a struct of 1 field(s) cannot feed a frozen<tuple<int, text>> of 2"),
    ("pos", struct(("a", T.IntegerType()), ("b", T.StringType()), ("c", T.StringType())), "pos.c",
     "a struct of 3 field(s) cannot feed"),
    ("pos", struct(("a", T.IntegerType()), ("a", T.StringType())), "pos.a", "two fields of this name"),
    ("pos", struct(("a", T.StringType()), ("b", T.StringType())), "pos.a",
     "Spark type string cannot be written to CQL type int"),
    ("legs", T.ArrayType(struct(("km", T.DoubleType()), ("to", struct(("code", T.StringType()), ("x", T.IntegerType()))))),
     "legs.element.to.x", "not a field of the user-defined type zipinfo"),
]


@pytest.mark.parametrize("column, spark_type, path, fragment", REFUSED,
                         ids=[f"{r[2]}-{r[3][:25]}" for r in REFUSED])
def test_each_refusal_names_the_column_and_the_fields_path(column, spark_type, path, fragment):
    with pytest.raises(SchemaError) as info:
        validate_schema(spark_schema(**{column: spark_type}), TABLE, WRITE)
    assert info.value.column == column
    assert f"field {path}: " in info.value.reason and fragment in info.value.reason, info.value.reason


@pytest.mark.parametrize("column, spark_type, fragment", [
    ("home", T.StringType(), "strings go to"),
    ("pos", T.ArrayType(T.IntegerType()), "an array goes to"),
    ("k", struct(("a", T.IntegerType())), "a struct goes to a user-defined type or a tuple"),
])
def test_a_struct_and_a_udt_or_tuple_only_go_together(column, spark_type, fragment):
    df = spark_schema(**{column: spark_type}) if column != "k" else T.StructType([T.StructField("k", spark_type)])
    with pytest.raises(SchemaError, match=fragment) as info:
        validate_schema(df, TABLE, WRITE)
    assert info.value.column == column


def test_the_errors_pickle():
    with pytest.raises(SchemaError) as info:
        validate_schema(spark_schema(home=replace_field(ADDR_SPARK, "rank", None)), TABLE, WRITE)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.column, str(again)) == ("home", str(info.value))
