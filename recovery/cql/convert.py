"""Arrow record batches to row tuples ready for cassandra-driver.

Why column-wise: a micro-batch holds many rows of few columns. Each column is turned into
Python values once (``to_pylist``) and a per-type function runs only for the CQL types whose
Python value differs from what Arrow gives (uuid from Spark strings, sets, maps, ...); then
the columns are zipped into rows. Checks that need the whole column (range of narrowed ints,
nulls inside collections) run on the Arrow arrays, before anything is sent, so one bad value
fails the batch with an :class:`~recovery.cql.errors.InvalidValueError` naming the column instead of
leaving it half written.

What cassandra-driver binds, per CQL type: text/varchar/ascii/inet as ``str``; uuid/timeuuid as
``uuid.UUID``; timestamp as ``datetime`` (tz-aware UTC is fine, naive means UTC); date as
``datetime.date``; time as ``datetime.time`` (Arrow's nanoseconds are cut to microseconds,
Spark's own precision); decimal as ``Decimal``; blob as ``bytes``; list and vector as ``list``;
set as ``set`` (a ``list`` when its elements are unhashable, e.g. frozen maps: cassandra-driver
serialises any sized iterable and Cassandra de-duplicates); map as ``dict`` (keys made
hashable: a frozen list key becomes a tuple); a tuple as ``tuple``; a user-defined type as a
:class:`UdtValue`, its fields' values in the type's order.

Spark structs feed UDTs and tuples (Arrow gives each struct value as a ``dict``). A UDT's fields
are matched by name, as DataFrame columns are matched to table columns (exactly, else ignoring
case: :func:`recovery.cql.table.name_matches`), and every field of the type needs a struct field; a
tuple's components are matched by position, the struct's field names ignored
(:func:`struct_sources`). ``sinks.worker.validation`` checks the same against the DataFrame's schema
before anything is staged; the checks here are the safety net of a replay.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from recovery.cql.errors import InvalidValueError, SchemaError
from recovery.cql.table import CqlType, TableSchema, name_matches

# ---------------------------------------------------------------- per-value functions

ValueFn = Callable[[Any], Any]


def _to_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{value!r} is not a UUID") from None


def _to_timeuuid(value: Any) -> uuid.UUID:
    result = _to_uuid(value)
    if result.version != 1:
        raise ValueError(f"{value!r} is not a time-based (version 1) UUID")
    return result


def _check_ascii(value: str) -> str:
    if not value.isascii():
        raise ValueError(f"{value[:40]!r} is not ASCII")
    return value


def _check_inet(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None
    return value


def _round_down_to_millis(value: Any) -> Any:
    """Cassandra keeps milliseconds. cassandra-driver computes them as ``int(seconds * 1e3 +
    micros / 1e3)``, which rounds toward zero: before 1970 a sub-millisecond part would land
    1 ms late. Drop it here (rounded down, as Spark's ``unix_millis``), so cassandra-driver's sum is
    exact."""
    micros = getattr(value, "microsecond", 0)
    if micros % 1000:
        return value.replace(microsecond=micros - micros % 1000)
    return value


def _hashable(value: Any) -> Any:
    """Make a converted value usable as a set element or map key (frozen list -> tuple, also
    inside a tuple or UDT value)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, set):
        return frozenset(value)
    if isinstance(value, tuple):
        return type(value)(_hashable(v) for v in value)
    return value


def _as_set(items: list[Any]) -> Any:
    try:
        return {_hashable(v) for v in items}
    except TypeError:  # unhashable elements (frozen maps): any sized iterable binds
        return items


_SCALAR_FNS: dict[str, ValueFn] = {
    "timestamp": _round_down_to_millis,
    "uuid": _to_uuid,
    "timeuuid": _to_timeuuid,
    "ascii": _check_ascii,
    "inet": _check_inet,
}


def value_fn(cql: CqlType, arrow_type: pa.DataType | None = None) -> ValueFn | None:
    """The function turning one non-null ``to_pylist`` value of ``arrow_type`` into what the
    cassandra-driver binds.

    None when Arrow's Python value is already right (the common, fast case). A UDT or tuple
    needs the Arrow type (the struct's field names); FieldMismatch if the struct cannot feed it.
    """
    if cql.is_udt or cql.name == "tuple":
        return _struct_fn(cql, arrow_type)
    if cql.name in ("list", "vector"):
        element = value_fn(cql.params[0], _element_type(arrow_type, "value_type"))
        if element is None:
            return None
        return lambda v: [element(x) for x in v]  # nulls inside are refused by check_column
    if cql.name == "set":
        member = value_fn(cql.params[0], _element_type(arrow_type, "value_type")) or _identity
        return lambda v: _as_set([member(x) for x in v])
    if cql.name == "map":
        key_fn = value_fn(cql.params[0], _element_type(arrow_type, "key_type")) or _identity
        val_fn = value_fn(cql.params[1], _element_type(arrow_type, "item_type")) or _identity
        return lambda v: {_hashable(key_fn(k)): val_fn(x) for k, x in v}
    return _SCALAR_FNS.get(cql.name)


def _element_type(arrow_type: pa.DataType | None, attribute: str) -> pa.DataType | None:
    """A list's ``value_type``, a map's ``key_type`` or ``item_type`` (None if it has none)."""
    return getattr(arrow_type, attribute, None)


def _identity(value: Any) -> Any:
    return value


# ---------------------------------------------------------------- structs to UDTs and tuples


class FieldMismatch(ValueError):
    """A struct cannot feed a UDT or tuple: ``field`` (a struct field's name, a UDT field's
    name when it is the missing one, "" when the struct as a whole is at fault) and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field, self.reason = field, reason

    def path(self, parent: str) -> str:
        """Where the fault is, below ``parent`` (the struct's own path)."""
        return f"{parent}.{self.field}" if self.field else parent


def struct_sources(cql: CqlType, names: Sequence[str]) -> list[int]:
    """For each field of UDT ``cql`` (or component of tuple ``cql``), the position in ``names``
    (a struct's field names) of the struct field that feeds it.

    A UDT's fields are matched by name, exactly first, else ignoring case (as DataFrame columns
    are matched to table columns); a struct field the type does not have, a struct field that
    matches two fields ignoring case, two struct fields for one field, and a field of the type
    no struct field feeds (the Spark Cassandra Connector fails such a row too: fill it with a
    null of the field's type) each raise :class:`FieldMismatch`. A tuple takes the struct's
    fields in order, whatever their names; their number must be the tuple's.
    """
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise FieldMismatch(twice, "the struct has two fields of this name; rename one")
    if not cql.is_udt:
        if len(names) != len(cql.params):
            raise FieldMismatch(
                names[len(cql.params)] if len(names) > len(cql.params) else "",
                f"a struct of {len(names)} field(s) cannot feed a {cql} of {len(cql.params)} "
                "component(s): a tuple takes a struct's fields in order, one per component "
                "(their names are ignored)")
        return list(range(len(names)))
    fields = cql.fields or ()
    chosen: dict[str, int] = {}
    for index, name in enumerate(names):
        matches = name_matches(name, fields)
        if not matches:
            raise FieldMismatch(name, f"not a field of the user-defined type {cql.name} "
                                      f"(its fields: {', '.join(fields)})")
        if len(matches) > 1:
            raise FieldMismatch(name, f"matches fields {', '.join(repr(m) for m in matches)} of "
                                      f"the user-defined type {cql.name} ignoring case; use the exact name")
        if matches[0] in chosen:
            raise FieldMismatch(name, f"struct fields {names[chosen[matches[0]]]!r} and {name!r} "
                                      f"both map to field {matches[0]!r} of {cql.name}")
        chosen[matches[0]] = index
    missing = [f for f in fields if f not in chosen]
    if missing:
        raise FieldMismatch(missing[0], f"field of the user-defined type {cql.name} is missing "
                                        f"from the struct (missing: {', '.join(missing)}); add it "
                                        "as a null of its type, e.g. lit(None).cast(...)")
    return [chosen[f] for f in fields]


class UdtValue(tuple):
    """A UDT value as cassandra-driver binds it: its fields' values in the type's order.

    cassandra-driver's ``UserType.serialize`` reads field ``i`` as ``value[i]``, for every field of
    the type as the prepared statement knows it; a field past the end reads as null here. So a
    field added to the type (``ALTER TYPE ... ADD``) after a batch was staged, which a replay's
    statement knows and the staged schema does not, is written as null instead of failing."""

    __slots__ = ()

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int) and index >= len(self):
            return None
        return super().__getitem__(index)


def _struct_fn(cql: CqlType, arrow_type: pa.DataType | None) -> ValueFn:
    if arrow_type is None or not pa.types.is_struct(arrow_type):
        raise FieldMismatch(str(cql), "needs a struct")
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    sources = struct_sources(cql, names)
    parts = [(names[i], value_fn(t, arrow_type.field(i).type)) for i, t in zip(sources, cql.params, strict=True)]
    make = UdtValue if cql.is_udt else tuple

    def convert(value: dict) -> Any:
        return make([_apply(fn, value[name]) for name, fn in parts])
    return convert


def _apply(fn: ValueFn | None, value: Any) -> Any:
    return value if value is None or fn is None else fn(value)

# ---------------------------------------------------------------- whole-column checks

_INT_RANGES = {"tinyint": 8, "smallint": 16, "int": 32}


def check_column(array: pa.Array, cql: CqlType, column: str, path: str | None = None) -> None:
    """Refuse, before sending, values Cassandra or cassandra-driver would reject mid-batch:
    nulls inside collections and integers too wide for a narrower CQL int, also inside UDTs
    and tuples (``path``: where in the column, e.g. ``address.zip``; nulls are fine there);
    a struct that cannot feed its UDT or tuple is a SchemaError."""
    where = "" if path is None else f"{path}: "
    if cql.name in _INT_RANGES and pa.types.is_integer(array.type):
        bits = _INT_RANGES[cql.name]
        if array.type.bit_width > bits and array.null_count < len(array):
            low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
            stats = pc.min_max(array).as_py()
            if stats["min"] < low or stats["max"] > high:
                bad = stats["min"] if stats["min"] < low else stats["max"]
                raise InvalidValueError(column, None, f"{where}value {bad} does not fit CQL {cql.name} ({low}..{high})")
        return
    for child, child_type, child_path, nulls_allowed in _children(array, cql, column, path or column):
        if child.null_count and not nulls_allowed:
            raise InvalidValueError(column, None, f"{where}null inside a {cql.name}: Cassandra collections cannot hold nulls")
        check_column(child, child_type, column, child_path)


def _children(array: pa.Array, cql: CqlType, column: str, path: str
              ) -> list[tuple[pa.Array, CqlType, str, bool]]:
    """The flattened element arrays of a collection, and the field arrays of a struct fed to a
    UDT or tuple (respecting slicing), with their CQL types, paths and whether they may hold
    nulls."""
    if pa.types.is_map(array.type) and cql.name == "map":
        entries = pa.list_(pa.struct([array.type.key_field, array.type.item_field]))
        flat = array.view(entries).flatten()
        return [(flat.field(0), cql.params[0], f"{path}.key", False),
                (flat.field(1), cql.params[1], f"{path}.value", False)]
    if (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) and cql.name in ("list", "set", "vector"):
        return [(array.flatten(), cql.params[0], f"{path}.element", False)]
    if pa.types.is_struct(array.type) and (cql.is_udt or cql.name == "tuple"):
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        try:
            sources = struct_sources(cql, names)
        except FieldMismatch as exc:
            raise SchemaError(column, f"field {exc.path(path)}: {exc.reason}") from None
        fields = array.flatten()   # each field's values, null where the struct is
        return [(fields[i], t, f"{path}.{names[i]}", True) for i, t in zip(sources, cql.params, strict=True)]
    return []


# ---------------------------------------------------------------- rows


class RowConverter:
    """Callable turning a RecordBatch into row tuples in ``columns`` order.

    A class rather than a closure so that standard pickle can ship it to executors.
    ``columns`` are DataFrame column names (as returned by
    :func:`sinks.worker.validation.validate_schema`); each is looked up in the table exactly, then
    case-insensitively. Extra batch columns (ttl, writetime) are ignored. With
    ``ignore_nulls`` a top-level null becomes cassandra-driver's ``UNSET_VALUE`` (no tombstone).
    """

    def __init__(self, table: TableSchema, columns: Sequence[str], *, ignore_nulls: bool = False) -> None:
        self.columns = list(columns)
        self.ignore_nulls = ignore_nulls
        self.types: list[CqlType] = []
        for name in self.columns:
            resolved = table.resolve_column(name)
            if resolved is None:
                raise SchemaError(name, f"not a column of {table.keyspace}.{table.table}")
            self.types.append(table.cql_type(resolved))

    def __call__(self, batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
        converted = [self.column(batch, name, cql) for name, cql in zip(self.columns, self.types, strict=True)]
        return list(zip(*converted, strict=True))

    def validate(self, batch: pa.RecordBatch) -> None:
        """Raise InvalidValueError for the first value :meth:`__call__` would refuse, without
        building rows. Run while staging: a batch sealed with a value that cannot be
        converted could never be flushed, and would block every later batch of its WAL."""
        for name, cql in zip(self.columns, self.types, strict=True):
            array = batch.column(name)
            if isinstance(array, pa.ChunkedArray):
                array = array.combine_chunks()
            check_column(array, cql, name)
            if not _can_refuse(cql):
                continue
            fn = value_fn(cql, array.type)
            values = array.to_pylist()
            try:
                for v in values:
                    if v is not None:
                        fn(v)
            except (ValueError, TypeError) as exc:
                raise _locate(values, fn, name, len(values)) from exc

    def column(self, batch: pa.RecordBatch, name: str, cql: CqlType) -> list[Any]:
        """One column's values as cassandra-driver binds them (checked whole first)."""
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        check_column(array, cql, name)
        values = array.to_pylist()
        fn = value_fn(cql, array.type)
        if fn is not None:
            try:
                values = [None if v is None else fn(v) for v in values]
            except (ValueError, TypeError) as exc:
                raise _locate(values, fn, name, len(values)) from exc
        if self.ignore_nulls and array.null_count:
            # On first use: cassandra.query takes 25 ms to import, and Spark's one-shot
            # workers import this module (tests/unit/test_architecture.py).
            from cassandra.query import UNSET_VALUE

            values = [UNSET_VALUE if v is None else v for v in values]
        return values


def _can_refuse(cql: CqlType) -> bool:
    """Whether a value function of ``cql`` (or of its elements) may refuse a value."""
    return cql.name in _REFUSING or any(_can_refuse(p) for p in cql.params)


_REFUSING = frozenset({"uuid", "timeuuid", "ascii", "inet"})


def _locate(values: list[Any], fn: ValueFn, column: str, total: int) -> InvalidValueError:
    """Find the first row whose value fails, to name it in the error (slow path only)."""
    for index, value in enumerate(values):
        if value is None:
            continue
        try:
            fn(value)
        except (ValueError, TypeError) as exc:
            return InvalidValueError(column, f"row {index} of {total}", str(exc))
    return InvalidValueError(column, None, "value cannot be converted")


def row_converter(table: TableSchema, columns: Sequence[str], *, ignore_nulls: bool = False) -> RowConverter:
    """Build the converter for ``columns`` of ``table``; see :class:`RowConverter`."""
    return RowConverter(table, columns, ignore_nulls=ignore_nulls)
