"""Arrow columns to the bytes cassandra-driver puts on the wire, a whole column at a time.

Binding a row through ``PreparedStatement.bind`` calls the column's CQL type ``serialize`` once
per value: 19 Python calls for a flights row, about 48 µs of the flusher's 56 µs of client CPU
per row (``docs/performance.md``). For the scalar types that make up most tables the same
bytes come from a handful of vectorised Arrow and numpy operations per column:

==========================  =================  =========================================
CQL type                    Arrow type         bytes (what cassandra-driver's ``serialize`` gives)
==========================  =================  =========================================
tinyint/smallint/int/bigint any integer        big-endian two's complement, 1/2/4/8 bytes
double                      float32/float64    big-endian IEEE 754, 8 bytes
float                       float32            big-endian IEEE 754, 4 bytes
boolean                     bool               one byte, 0 or 1
text/varchar                string             the UTF-8 bytes as Arrow holds them
ascii                       string, all ASCII  the same bytes
blob                        binary             as is
timestamp                   timestamp (any)    milliseconds since the epoch, rounded down, 8 bytes
date                        date32             days since the epoch + 2**31, unsigned, 4 bytes
==========================  =================  =========================================

Every other pairing (uuid from strings, decimals, collections, UDTs and tuples, a text column
fed by a non-string, ...) goes through :class:`~recovery.cql.convert.RowConverter`'s per-value conversion and
then cassandra-driver's own ``serialize``, value by value, exactly as ``bind`` does. Either way the
bytes are cassandra-driver's: ``tests/unit/test_encode.py`` checks each fast path against
cassandra-driver for edge values and nulls. A null is ``None`` (a null cell, a tombstone), or
``UNSET_VALUE`` with ``spark.cassandra.output.ignoreNulls``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cassandra.query import UNSET_VALUE

from recovery.cql.convert import RowConverter, check_column
from recovery.cql.errors import InvalidValueError
from recovery.cql.table import CqlType

Cells = list  # one column's serialized values: bytes, None (null) or UNSET_VALUE

_INT_WIDTHS = {"tinyint": 1, "smallint": 2, "int": 4, "bigint": 8, "counter": 8}
_DATE_OFFSET = 2 ** 31
_UNIT_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}


def fixed_width(values: np.ndarray, dtype: str, nulls_of: pa.Array | None = None) -> Cells:
    """Pack ``values`` as big-endian ``dtype`` (e.g. ``'>i8'``), one bytes object per value;
    ``None`` where ``nulls_of`` (the Arrow array they came from) holds a null."""
    packed = np.ascontiguousarray(values, dtype=dtype)
    data, width = packed.tobytes(), packed.dtype.itemsize
    cells = [data[i:i + width] for i in range(0, len(data), width)]
    if nulls_of is not None and nulls_of.null_count:
        for i in np.flatnonzero(nulls_of.is_null().to_numpy(zero_copy_only=False)).tolist():
            cells[i] = None
    return cells


def _ints(array: pa.Array, width: int) -> Cells:
    ints = array.cast(pa.int64()).fill_null(0).to_numpy()
    return fixed_width(ints, f">i{width}", array)


def _floats(array: pa.Array, width: int) -> Cells:
    floats = array.fill_null(0).to_numpy()
    return fixed_width(floats, f">f{width}", array)


def _booleans(array: pa.Array) -> Cells:
    return fixed_width(array.cast(pa.int8()).fill_null(0).to_numpy(), ">i1", array)


def _utf8(array: pa.Array) -> Cells:
    target = pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary()
    return array.cast(target).to_pylist()


def _blobs(array: pa.Array) -> Cells:
    return array.to_pylist()


def _timestamps(array: pa.Array) -> Cells:
    unit = array.type.unit
    raw = array.cast(pa.int64()).fill_null(0).to_numpy()
    millis = raw * 1000 if unit == "s" else np.floor_divide(raw, _UNIT_PER_MS[unit])
    return fixed_width(millis, ">i8", array)


def _dates(array: pa.Array) -> Cells:
    days = array.cast(pa.int32()).fill_null(0).to_numpy().astype(np.int64) + _DATE_OFFSET
    return fixed_width(days, ">u4", array)


ColumnFn = Callable[[pa.Array], Cells]


def fast_encoder(cql: CqlType, arrow_type: pa.DataType) -> ColumnFn | None:
    """The vectorised encoder of one column, or None when the pairing takes the per-value path."""
    name = cql.name
    if name in _INT_WIDTHS and pa.types.is_integer(arrow_type):
        width = _INT_WIDTHS[name]
        return lambda a: _ints(a, width)
    if name == "double" and (pa.types.is_float64(arrow_type) or pa.types.is_float32(arrow_type)):
        return lambda a: _floats(a.cast(pa.float64()), 8)
    if name == "float" and pa.types.is_float32(arrow_type):
        return lambda a: _floats(a, 4)
    if name == "boolean" and pa.types.is_boolean(arrow_type):
        return _booleans
    if name in ("text", "varchar") and (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)):
        return _utf8
    if name == "ascii" and (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)):
        return _ascii
    if name == "blob" and (pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)):
        return _blobs
    if name == "timestamp" and pa.types.is_timestamp(arrow_type):
        return _timestamps
    if name == "date" and pa.types.is_date32(arrow_type):
        return _dates
    return None


def _ascii(array: pa.Array) -> Cells:
    if not pc.all(pc.or_kleene(pc.string_is_ascii(array), array.is_null())).as_py():
        raise _NotFast()
    return _utf8(array)


def _lengths(cells: Cells) -> np.ndarray:
    """Each cell's byte length (0 for a null or unset cell)."""
    return np.fromiter((len(c) if type(c) is bytes else 0 for c in cells), np.int64, len(cells))


class _NotFast(Exception):
    """This column's values need the per-value path (which names the bad value)."""


class CellEncoder:
    """Callable turning a RecordBatch into rows of serialized cells, in ``columns`` order.

    ``cqltype_classes`` are cassandra-driver's CQL type classes of the same columns (a prepared
    statement's ``column_metadata[i].type``); they serialize what the fast paths do not cover.
    """

    def __init__(self, converter: RowConverter, cqltype_classes: Sequence[Any],
                 protocol_version: int) -> None:
        if len(cqltype_classes) < len(converter.columns):
            raise ValueError("one cassandra-driver type class per column is needed")
        self.converter = converter
        self.cqltype_classes = list(cqltype_classes)
        self.protocol_version = protocol_version

    @property
    def columns(self) -> list[str]:
        return self.converter.columns

    def columns_of(self, batch: pa.RecordBatch) -> list[Cells]:
        """Each column's cells (a list per column, same length as the batch)."""
        return self.encode(batch)[0]

    def encode(self, batch: pa.RecordBatch, weights: Sequence[int] | None = None
               ) -> tuple[list[Cells], np.ndarray | None]:
        """Each column's cells; with ``weights``, also each row's bytes of values, column ``i``
        counted ``weights[i]`` times (for sizing batches), else None."""
        columns = [self._column(batch, i) for i in range(len(self.columns))]
        if weights is None:
            return columns, None
        sizes = np.zeros(batch.num_rows, dtype=np.int64)
        for cells, weight in zip(columns, weights):
            sizes += _lengths(cells) * int(weight)
        return columns, sizes

    def _column(self, batch: pa.RecordBatch, index: int) -> Cells:
        name, cql = self.converter.columns[index], self.converter.types[index]
        array = batch.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        fn = fast_encoder(cql, array.type)
        if fn is not None:
            check_column(array, cql, name)
            try:
                cells = fn(array)
            except (_NotFast, pa.ArrowInvalid):
                cells = None
            if cells is not None:
                return self._unset_nulls(cells) if array.null_count else cells
        return self._serialize_each(batch, index)

    def _unset_nulls(self, cells: Cells) -> Cells:
        if not self.converter.ignore_nulls:
            return cells
        return [UNSET_VALUE if c is None else c for c in cells]

    def _serialize_each(self, batch: pa.RecordBatch, index: int) -> Cells:
        """cassandra-driver's ``serialize`` per value, after the converter's per-value
        conversion."""
        name, cql = self.converter.columns[index], self.converter.types[index]
        values = self.converter.column(batch, name, cql)
        serialize, version = self.cqltype_classes[index].serialize, self.protocol_version
        try:
            return [v if v is None or v is UNSET_VALUE else serialize(v, version) for v in values]
        except (TypeError, ValueError, OverflowError, struct.error) as exc:
            raise InvalidValueError(name, None, f"cannot be serialized as CQL {cql}: {exc}") from exc
