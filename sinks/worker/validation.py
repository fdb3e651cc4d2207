"""Check a DataFrame against the target table before anything is staged or sent.

Why up front: a mismatch found while flushing would leave a batch staged in the WAL that
can never be written, blocking every later batch (flushes are strictly ordered). So the
schema is checked once per query, on the driver, and each error names the column at fault.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from recovery.cql import changes
from recovery.cql.config import MAX_TTL_SECONDS, WriteConfig
from recovery.cql.convert import FieldMismatch, struct_sources
from recovery.cql.errors import (
    CounterTableError,
    InvalidValueError,
    NullPrimaryKeyError,
    OptionError,
    SchemaError,
)
from recovery.cql.table import NATIVE_TYPES, CqlType, TableSchema

from .options import LISTS_AT_LEAST_ONCE, operation_values

_INTS = frozenset({"int", "smallint", "tinyint", "bigint", "varint"})
_SCALARS: dict[type, frozenset[str]] = {
    T.ByteType: _INTS,
    T.ShortType: _INTS,
    T.IntegerType: _INTS,  # narrower CQL ints are range-checked per batch (recovery.cql.convert)
    T.LongType: frozenset({"bigint", "varint"}),
    T.DoubleType: frozenset({"double"}),
    T.FloatType: frozenset({"float", "double"}),
    T.BooleanType: frozenset({"boolean"}),
    T.TimestampType: frozenset({"timestamp"}),
    T.TimestampNTZType: frozenset({"timestamp"}),
    T.DateType: frozenset({"date"}),
    T.TimeType: frozenset({"time"}),
    T.DecimalType: frozenset({"decimal"}),
    T.BinaryType: frozenset({"blob"}),
}
_STRING_TARGETS = frozenset({"text", "varchar", "ascii", "uuid", "timeuuid", "inet"})
_TTL_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_WRITETIME_TYPES = (T.LongType, T.TimestampType)
_OP_TYPES = (T.StringType, T.BooleanType)


def validate_schema(spark_schema: T.StructType, table: TableSchema, write: WriteConfig) -> list[str]:
    """The DataFrame columns to write, in table order; raises if the DataFrame cannot be written.

    Raises CounterTableError for a counter table, SchemaError naming the column for a
    column not in the table, a missing primary-key column, an incompatible type, a bad
    ttl/writetime column, or a non-frozen list column the user did not accept at least once
    for (:func:`_check_lists`); OptionError for ``wal.lists.atLeastOnce`` naming anything
    but a non-frozen list column. The ttl and writetime columns are not written. A struct column
    feeds a user-defined type (fields by name, each field of the type needed) or a tuple
    (fields by position); a mismatch inside names the field's path (``address.zip``).
    """
    if table.is_counter:
        raise CounterTableError(table.keyspace, table.table)
    special = _special_columns(spark_schema, table, write)
    _check_boolean_operations(spark_schema, write)
    chosen: dict[str, str] = {}  # table column -> DataFrame column
    for spark_field in spark_schema.fields:
        if spark_field.name in special:
            continue
        target = table.resolve_column(spark_field.name)
        if target is None:
            close = _close(spark_field.name, table)
            raise SchemaError(spark_field.name, f"not a column of {table.keyspace}.{table.table}{close}")
        if target in chosen:
            raise SchemaError(
                spark_field.name,
                f"DataFrame columns {chosen[target]!r} and {spark_field.name!r} both map to table column {target!r}",
            )
        chosen[target] = spark_field.name
        cql_text = table.column_type(target)
        reason = type_mismatch(spark_field.dataType, table.cql_type(target), spark_field.name)
        if reason is not None:
            spark_type = spark_field.dataType.simpleString()
            raise SchemaError(spark_field.name, f"Spark type {spark_type} cannot be written to CQL type {cql_text}: {reason}")
    missing = [key for key in table.primary_key if key not in chosen]
    if missing:
        kind = "partition key" if missing[0] in table.partition_key else "clustering"
        raise SchemaError(
            missing[0],
            f"{kind} column of {table.keyspace}.{table.table} is missing from the DataFrame "
            f"(missing: {', '.join(missing)})",
        )
    _check_lists(table, chosen, write)
    return [chosen[name] for name in table.column_names if name in chosen]


def _check_lists(table: TableSchema, chosen: dict[str, str], write: WriteConfig) -> None:
    """Refuse a non-frozen list column the DataFrame writes, unless ``wal.lists.atLeastOnce``
    names it: Cassandra appends such a list's elements again at every write of the row
    (:attr:`recovery.cql.table.CqlType.is_non_frozen_list`), and this sink writes rows again on
    purpose, so it could not keep "exactly once in effect" for it. Lists nested in another
    type are frozen, one cell: fine. The option may name only non-frozen list columns of the
    table (written by this DataFrame or not)."""
    lists = table.non_frozen_lists
    accepted = set()
    given = ",".join(write.lists_at_least_once)
    for name in write.lists_at_least_once:
        column = table.resolve_column(name)
        if column is None:
            raise OptionError(LISTS_AT_LEAST_ONCE, given, f"{name!r} is not a column of "
                              f"{table.keyspace}.{table.table}{_close(name, table)}")
        if column not in lists:
            raise OptionError(LISTS_AT_LEAST_ONCE, given, f"{name!r} is {table.column_type(column)}, "
                              "not a non-frozen list: name only the non-frozen list columns "
                              "you accept to be written at least once")
        accepted.add(column)
    refused = [c for c in lists if c in chosen and c not in accepted]
    if not refused:
        return
    column = refused[0]
    cql = table.cql_type(column)
    element = cql.params[0]
    opt_in = ",".join(list(write.lists_at_least_once) + [chosen[c] for c in refused])
    raise SchemaError(
        chosen[column],
        f"CQL type {cql} is a non-frozen list: Cassandra stores each element under a new cell "
        f"id at every write, so each replay or retry of a row (which this sink does on "
        f"purpose) appends its elements again (CASSANDRA-11368). Declare the column "
        f"frozen<list<{element}>> (one cell: exactly once) or set<{element}>, or accept that "
        f"its elements may repeat with {LISTS_AT_LEAST_ONCE}={opt_in} (docs/guarantees.md)")


def _special_columns(spark_schema: T.StructType, table: TableSchema, write: WriteConfig) -> set[str]:
    """Find and type-check the ttl / writetime / op columns; they must not also be table
    columns."""
    found: set[str] = set()
    for role, wanted, allowed, expect in (
        ("ttl", write.ttl_column, _TTL_TYPES, "an integer type (seconds)"),
        ("writetime", write.writetime_column, _WRITETIME_TYPES, "long (microseconds since the epoch) or timestamp"),
        ("op", write.op_column, _OP_TYPES, "string or boolean"),
    ):
        if wanted is None:
            continue
        if wanted not in spark_schema.names:
            # Exact match only: the writer reads this column from each batch by this name.
            near = [n for n in spark_schema.names if n.lower() == wanted.lower()]
            hint = f" (names must match exactly; the DataFrame has {near[0]!r})" if near else ""
            raise SchemaError(wanted, f"the {role} column is not in the DataFrame{hint}")
        spark_field = spark_schema[wanted]
        if not isinstance(spark_field.dataType, allowed):
            actual = spark_field.dataType.simpleString()
            raise SchemaError(spark_field.name, f"the {role} column must be {expect}, not {actual}")
        if table.resolve_column(spark_field.name) is not None:
            raise SchemaError(
                spark_field.name,
                f"is the {role} column and also a column of {table.keyspace}.{table.table}; "
                "rename one so it is clear whether to write it",
            )
        found.add(spark_field.name)
    return found


def _check_boolean_operations(spark_schema: T.StructType, write: WriteConfig) -> None:
    """A boolean op column's values are read as ``true`` and ``false``: refuse any other
    value in the ``op.*Values`` (``True`` would match no row, and every batch would fail)."""
    if write.op_column is None or write.op_column not in spark_schema.names or \
            not isinstance(spark_schema[write.op_column].dataType, T.BooleanType):
        return
    for option, values in operation_values(write):
        odd = [v for v in values if v not in ("true", "false")]
        if odd:
            raise OptionError(option, ",".join(values),
                              f"{write.op_column!r} is a boolean column, whose values read "
                              f"as 'true' and 'false' (lower case), not {odd[0]!r}")


def type_mismatch(spark_type: T.DataType, cql: CqlType, path: str = "") -> str | None:
    """None when values of ``spark_type`` can be written to ``cql``, else the reason why not;
    ``path`` (the column's name) names a struct's field at fault: ``field address.zip: ...``
    (elements, keys and values of collections as Spark names them: ``addrs.element.zip``)."""
    found = _mismatch(spark_type, cql, path)
    if found is None:
        return None
    where, reason = found
    return f"field {where}: {reason}" if where else reason


def _mismatch(spark_type: T.DataType, cql: CqlType, path: str) -> tuple[str, str] | None:
    """None, or ``(where, reason)``: ``where`` is the path of the struct field at fault, or
    "" when ``spark_type`` itself (or a collection's element) does not fit."""
    if isinstance(spark_type, T.StringType):
        if cql.name in _STRING_TARGETS:
            return None
        return "", "strings go to text, varchar, ascii, uuid, timeuuid or inet"
    if isinstance(spark_type, T.ArrayType):
        if cql.name not in ("list", "set", "vector"):
            return "", "an array goes to a list, set or vector"
        return _mismatch(spark_type.elementType, cql.params[0], f"{path}.element")
    if isinstance(spark_type, T.MapType):
        if cql.name != "map":
            return "", "a map goes to a map"
        return (_mismatch(spark_type.keyType, cql.params[0], f"{path}.key")
                or _mismatch(spark_type.valueType, cql.params[1], f"{path}.value"))
    if isinstance(spark_type, T.StructType):
        return _struct_mismatch(spark_type, cql, path)
    allowed = _SCALARS.get(type(spark_type))
    if allowed is None:
        return "", f"Spark type {spark_type.simpleString()} is not supported"
    if cql.name in allowed:
        return None
    hint = f"; cast the column (e.g. to {_cast_hint(cql.name)})" if _cast_hint(cql.name) else ""
    return "", f"expected CQL {' or '.join(sorted(allowed))}{hint}"


def _struct_mismatch(spark_type: T.StructType, cql: CqlType, path: str) -> tuple[str, str] | None:
    """A struct feeds a UDT, field by name, or a tuple, field by position
    (:func:`recovery.cql.convert.struct_sources`, which the conversion uses too); then each field's type."""
    if not (cql.is_udt or cql.name == "tuple"):
        if cql.params or cql.name in NATIVE_TYPES:
            return "", "a struct goes to a user-defined type or a tuple"
        return "", (f"a struct goes to a user-defined type or a tuple, and the fields of {cql} "
                    "are unknown (not a user-defined type of the table's keyspace)")
    try:
        sources = struct_sources(cql, spark_type.names)
    except FieldMismatch as exc:
        return exc.path(path), exc.reason
    for index, field_cql in zip(sources, cql.params, strict=True):
        field = spark_type.fields[index]
        where = f"{path}.{field.name}"
        found = _mismatch(field.dataType, field_cql, where)
        if found is None:
            continue
        if found[0]:   # deeper down
            return found
        spark_text = field.dataType.simpleString()
        return where, f"Spark type {spark_text} cannot be written to CQL type {field_cql}: {found[1]}"
    return None


def _cast_hint(cql_name: str) -> str | None:
    return {"int": "int", "smallint": "short", "tinyint": "byte", "bigint": "long", "double": "double",
            "float": "float", "text": "string", "timestamp": "timestamp", "date": "date"}.get(cql_name)


def _close(name: str, table: TableSchema) -> str:
    by_lower = {c.lower(): c for c in table.column_names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    return f"; close matches: {', '.join(by_lower[c] for c in close)}" if close else ""


def check_primary_key_not_null(record_batch: pa.RecordBatch, key_columns: Sequence[str],
                               among: np.ndarray | None = None) -> None:
    """Raise NullPrimaryKeyError for the first key column holding a null (O(1) when none);
    ``among``: in the rows it selects only."""
    found = _first_null(record_batch, key_columns, among)
    if found is not None:
        raise NullPrimaryKeyError(found[0], f"row {found[1]} of {record_batch.num_rows}")


def _first_null(record_batch: pa.RecordBatch, columns: Sequence[str],
                among: np.ndarray | None = None) -> tuple[str, int] | None:
    """The first of ``columns`` holding a null (in the rows ``among`` selects; all when None)
    and its first such row; None: none (a column without nulls costs nothing)."""
    for name in columns:
        column = record_batch.column(name)
        if not column.null_count:
            continue
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        if among is not None:
            nulls &= among
        if nulls.any():
            return name, int(np.flatnonzero(nulls)[0])
    return None


def check_operations_and_keys(record_batch: pa.RecordBatch, key_columns: Sequence[str],
                              partition_key: Sequence[str], write: WriteConfig) -> None:
    """Refuse a row Cassandra cannot take or a change stream cannot tell: a null in its key
    (:class:`NullPrimaryKeyError`); in a change stream (``op.column``), an operation that is
    none of the ``op.*Values`` (a null too), and a delete without its key: a row delete needs
    every primary key column, a partition delete its partition key (its clustering columns
    are not read)."""
    if write.op_column is None:
        check_primary_key_not_null(record_batch, key_columns)
        return
    rows = record_batch.num_rows
    column = record_batch.column(write.op_column)
    kinds = changes.operations(column, write)
    unknown = np.flatnonzero(kinds == changes.UNKNOWN)
    if len(unknown):
        first = int(unknown[0])
        named = "; ".join(f"{option}: {','.join(values) or '(none)'}"
                          for option, values in operation_values(write))
        raise InvalidValueError(write.op_column, f"row {first} of {rows}",
                                f"operation {column[first].as_py()!r} is none of the change "
                                f"stream's values ({named}): map it to one, or filter such rows")
    found = _first_null(record_batch, key_columns, kinds == changes.ROW_DELETE)
    if found is not None:
        raise InvalidValueError(
            found[0], f"row {found[1]} of {rows}",
            "a row delete needs the whole primary key, and this key column is null; to "
            "delete a whole partition, give the row an operation of "
            f"op.partitionDeleteValues (now: {','.join(write.partition_delete_values) or 'none'})")
    whole_partition = kinds == changes.PARTITION_DELETE
    if not whole_partition.any():
        check_primary_key_not_null(record_batch, key_columns)
        return
    check_primary_key_not_null(record_batch, partition_key)
    check_primary_key_not_null(record_batch, [c for c in key_columns if c not in partition_key],
                               among=~whole_partition)


def check_partition_key_not_empty(record_batch: pa.RecordBatch, column: str) -> None:
    """Refuse an empty string or blob in a single-column partition key.

    Cassandra rejects such a row ("Key may not be empty") only when it is written: found at
    flush time, it would leave a sealed batch that can never be written, blocking every later
    batch of the WAL. (Each part of a composite partition key may be empty.)
    """
    array = record_batch.column(column)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
            or pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
        return
    empty = pc.fill_null(pc.equal(pc.binary_length(array), 0), False)
    if pc.any(empty).as_py():
        first = pc.index(empty, True).as_py()
        raise InvalidValueError(column, f"row {first} of {record_batch.num_rows}",
                                "empty value in the partition key: Cassandra refuses an empty "
                                "single-column partition key")


def check_ttl_and_writetime(record_batch: pa.RecordBatch, write: WriteConfig) -> None:
    """Refuse a row whose TTL or write timestamp Cassandra would refuse when it is written.

    Found at flush time, such a row would leave a sealed batch that can never be written,
    blocking every later batch of the WAL. A TTL must be 0 to ``MAX_TTL_SECONDS`` (this also
    refuses 2**31 and more, which would wrap when sent as the protocol's 32-bit int); a null
    TTL is allowed: it means the table's default. A write timestamp must be present and not
    negative (before 1970: a sign or unit mistake, and Cassandra refuses the smallest long).
    """
    rows = record_batch.num_rows
    if write.ttl_column is not None:
        ttl = record_batch.column(write.ttl_column)
        bad = pc.fill_null(pc.or_(pc.less(ttl, 0), pc.greater(ttl, MAX_TTL_SECONDS)), False)
        if pc.any(bad).as_py():
            first = pc.index(bad, True).as_py()
            raise InvalidValueError(
                write.ttl_column, f"row {first} of {rows}",
                f"TTL {ttl[first].as_py()} is out of range: Cassandra takes 0 to "
                f"{MAX_TTL_SECONDS} seconds (20 years); fix or filter such rows, or set the TTL "
                "to null for the table's default")
    if write.writetime_column is not None:
        stamps = record_batch.column(write.writetime_column)
        if stamps.null_count:
            first = pc.index(pc.is_null(stamps), True).as_py()
            raise InvalidValueError(
                write.writetime_column, f"row {first} of {rows}",
                "write timestamp is null: every row needs one; fill it (e.g. with "
                "current_timestamp()) or filter such rows")
        # Negative in any unit: no need to convert a timestamp to microseconds to know.
        ints = stamps.cast(pa.int64()) if pa.types.is_timestamp(stamps.type) else stamps
        negative = pc.less(ints, 0)
        if pc.any(negative).as_py():
            first = pc.index(negative, True).as_py()
            raise InvalidValueError(
                write.writetime_column, f"row {first} of {rows}",
                f"write timestamp {stamps[first].as_py()} is negative (before 1970); it must "
                "be microseconds since the epoch, or a timestamp after 1970")
