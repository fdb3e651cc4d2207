"""Arrow record batches to driver-ready row tuples, and the CQL type-string parser.

Why column-wise: a micro-batch holds many rows of few columns. Each column is turned into
Python values once (``to_pylist``) and a per-type function runs only for the CQL types whose
Python value differs from what Arrow gives (uuid from Spark strings, sets, maps, ...); then
the columns are zipped into rows. Checks that need the whole column (range of narrowed ints,
nulls inside collections) run on the Arrow arrays, before anything is sent, so one bad value
fails the batch with an :class:`~cql.errors.InvalidValueError` naming the column instead of
leaving it half written.

What the driver binds, per CQL type: text/varchar/ascii/inet as ``str``; uuid/timeuuid as
``uuid.UUID``; timestamp as ``datetime`` (tz-aware UTC is fine, naive means UTC); date as
``datetime.date``; time as ``datetime.time`` (Arrow's nanoseconds are cut to microseconds,
Spark's own precision); decimal as ``Decimal``; blob as ``bytes``; list and vector as ``list``;
set as ``set`` (a ``list`` when its elements are unhashable, e.g. frozen maps: the driver
serialises any sized iterable and Cassandra de-duplicates); map as ``dict`` (keys made
hashable: a frozen list key becomes a tuple).
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cql.errors import InvalidValueError, SchemaError
from cql.table import TableSchema

# ---------------------------------------------------------------- CQL type strings


@dataclass(frozen=True)
class CqlType:
    """A parsed CQL type: ``frozen<map<text, list<int>>>`` is
    ``CqlType("map", (text, CqlType("list", (int,))), frozen=True)``.

    Unquoted names are lower-cased (CQL folds them); quoted UDT names keep their case;
    a custom type (``'org.apache...'``) keeps its class name. ``size`` is a vector's dimension.
    """

    name: str
    params: tuple[CqlType, ...] = ()
    frozen: bool = False
    size: int | None = None

    def __str__(self) -> str:
        inner = [str(p) for p in self.params] + ([] if self.size is None else [str(self.size)])
        text = f"{self.name}<{', '.join(inner)}>" if inner else self.name
        return f"frozen<{text}>" if self.frozen else text


COLLECTIONS = frozenset({"list", "set", "map", "tuple", "vector"})
_TOKEN_RE = re.compile(r'\s*(?:("(?:[^"]|"")*")|(\'[^\']*\')|([A-Za-z0-9_.$]+)|([<>,]))')


@lru_cache(maxsize=1024)
def parse_cql_type(text: str) -> CqlType:
    """Parse a CQL type string as the driver reports it (``TableMetadata.columns[c].cql_type``).

    Raises ValueError with the offending position for a malformed string.
    """
    tokens = _tokenize(text)
    parsed, pos = _parse(tokens, 0, text)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in CQL type {text!r}")
    return parsed


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN_RE.match(text, pos)
        if not match:
            raise ValueError(f"cannot parse CQL type {text!r} at position {pos}")
        tokens.append(next(g for g in match.groups() if g is not None))
        pos = match.end()
    if not tokens:
        raise ValueError("empty CQL type")
    return tokens


def _parse(tokens: list[str], pos: int, text: str) -> tuple[CqlType, int]:
    if pos >= len(tokens) or tokens[pos] in "<>,":
        raise ValueError(f"expected a type name in CQL type {text!r}")
    token = tokens[pos]
    if token.startswith('"'):
        name = token[1:-1].replace('""', '"')
    elif token.startswith("'"):
        name = token[1:-1]
    else:
        name = token.lower()
    pos += 1
    args: list[CqlType] = []
    size = None
    if pos < len(tokens) and tokens[pos] == "<":
        pos += 1
        while True:
            if name == "vector" and args and pos < len(tokens) and tokens[pos].isdigit():
                size, pos = int(tokens[pos]), pos + 1
            else:
                arg, pos = _parse(tokens, pos, text)
                args.append(arg)
            if pos >= len(tokens):
                raise ValueError(f"unclosed '<' in CQL type {text!r}")
            if tokens[pos] == ">":
                pos += 1
                break
            if tokens[pos] != ",":
                raise ValueError(f"expected ',' or '>' in CQL type {text!r}")
            pos += 1
    if name == "frozen":
        if len(args) != 1:
            raise ValueError(f"frozen<> takes one type in CQL type {text!r}")
        return replace(args[0], frozen=True), pos
    arity = {"list": 1, "set": 1, "map": 2, "vector": 1}.get(name)
    if arity is not None and len(args) != arity:
        raise ValueError(f"{name}<> takes {arity} type(s) in CQL type {text!r}")
    if name == "vector" and size is None:
        raise ValueError(f"vector<> needs a dimension in CQL type {text!r}")
    return CqlType(name, tuple(args), size=size), pos


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


def _floor_to_millis(value: Any) -> Any:
    """Cassandra keeps milliseconds. The driver computes them as ``int(seconds * 1e3 +
    micros / 1e3)``, which rounds toward zero: before 1970 a sub-millisecond part would land
    1 ms late. Drop it here (a floor, as Spark's ``unix_millis``), so the driver's sum is exact."""
    micros = getattr(value, "microsecond", 0)
    if micros % 1000:
        return value.replace(microsecond=micros - micros % 1000)
    return value


def _hashable(value: Any) -> Any:
    """Make a converted value usable as a set element or map key (frozen list -> tuple)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, set):
        return frozenset(value)
    return value


def _as_set(items: list[Any]) -> Any:
    try:
        return {_hashable(v) for v in items}
    except TypeError:  # unhashable elements (frozen maps): any sized iterable binds
        return items


_SCALAR_FNS: dict[str, ValueFn] = {
    "timestamp": _floor_to_millis,
    "uuid": _to_uuid,
    "timeuuid": _to_timeuuid,
    "ascii": _check_ascii,
    "inet": _check_inet,
}


def value_fn(cql: CqlType) -> ValueFn | None:
    """The function turning one non-null ``to_pylist`` value into what the driver binds.

    None when Arrow's Python value is already right (the common, fast case).
    """
    if cql.name in ("list", "vector"):
        element = value_fn(cql.params[0])
        if element is None:
            return None
        return lambda v: [element(x) for x in v]  # nulls inside are refused by check_column
    if cql.name == "set":
        member = value_fn(cql.params[0]) or _identity
        return lambda v: _as_set([member(x) for x in v])
    if cql.name == "map":
        key_fn = value_fn(cql.params[0]) or _identity
        val_fn = value_fn(cql.params[1]) or _identity
        return lambda v: {_hashable(key_fn(k)): val_fn(x) for k, x in v}
    return _SCALAR_FNS.get(cql.name)


def _identity(value: Any) -> Any:
    return value


# ---------------------------------------------------------------- whole-column checks

_INT_RANGES = {"tinyint": 8, "smallint": 16, "int": 32}


def check_column(array: pa.Array, cql: CqlType, column: str) -> None:
    """Refuse, before sending, values Cassandra or the driver would reject mid-batch:
    nulls inside collections and integers too wide for a narrower CQL int."""
    if cql.name in _INT_RANGES and pa.types.is_integer(array.type):
        bits = _INT_RANGES[cql.name]
        if array.type.bit_width > bits and array.null_count < len(array):
            low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
            stats = pc.min_max(array).as_py()
            if stats["min"] < low or stats["max"] > high:
                bad = stats["min"] if stats["min"] < low else stats["max"]
                raise InvalidValueError(column, None, f"value {bad} does not fit CQL {cql.name} ({low}..{high})")
        return
    for child, child_type in _children(array, cql):
        if child.null_count:
            raise InvalidValueError(column, None, f"null inside a {cql.name}: Cassandra collections cannot hold nulls")
        check_column(child, child_type, column)


def _children(array: pa.Array, cql: CqlType) -> list[tuple[pa.Array, CqlType]]:
    """The flattened element arrays of a collection (respecting slicing), with their CQL types."""
    if pa.types.is_map(array.type) and cql.name == "map":
        entries = pa.list_(pa.struct([array.type.key_field, array.type.item_field]))
        flat = array.view(entries).flatten()
        return [(flat.field(0), cql.params[0]), (flat.field(1), cql.params[1])]
    if (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) and cql.name in ("list", "set", "vector"):
        return [(array.flatten(), cql.params[0])]
    return []


# ---------------------------------------------------------------- rows


class RowConverter:
    """Callable turning a RecordBatch into row tuples in ``columns`` order.

    A class rather than a closure so that standard pickle can ship it to executors.
    ``columns`` are DataFrame column names (as returned by
    :func:`sinks.validation.validate_schema`); each is looked up in the table exactly, then
    case-insensitively. Extra batch columns (ttl, writetime) are ignored. With
    ``ignore_nulls`` a top-level null becomes the driver's ``UNSET_VALUE`` (no tombstone).
    """

    def __init__(self, table: TableSchema, columns: Sequence[str], *, ignore_nulls: bool = False) -> None:
        self.columns = list(columns)
        self.ignore_nulls = ignore_nulls
        self.types: list[CqlType] = []
        for name in self.columns:
            resolved = table.resolve_column(name)
            if resolved is None:
                raise SchemaError(name, f"not a column of {table.keyspace}.{table.table}")
            self.types.append(parse_cql_type(table.column_type(resolved)))

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
            fn = value_fn(cql)
            values = array.to_pylist()
            try:
                for v in values:
                    if v is not None:
                        fn(v)
            except (ValueError, TypeError) as exc:
                raise _locate(values, fn, name, len(values)) from exc

    def column(self, batch: pa.RecordBatch, name: str, cql: CqlType) -> list[Any]:
        """One column's values as the driver binds them (checked whole first)."""
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        check_column(array, cql, name)
        values = array.to_pylist()
        fn = value_fn(cql)
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
