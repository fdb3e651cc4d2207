"""A row's key as Cassandra tells keys apart: a 64-bit hash every host computes alike, and the
value the hash stands for.

Two rows are the same Cassandra row when their key columns hold the same values as Cassandra
stores them, not as Spark holds them: a ``timestamp`` keeps milliseconds (two Spark
timestamps a microsecond apart are one key), a ``uuid`` given as text is one key in any case
of its letters, an ``inet`` one address however it is spelt, a frozen set or map one value in
any order of its elements. So each key column is hashed from the value Cassandra gets:

- integers, booleans, dates and times, from their integer value; a ``timestamp`` from its
  milliseconds, rounded down (as :mod:`recovery.cql.encode` sends it);
- text and blobs, from their bytes and length: a polynomial over the bytes modulo 2**64,
  computed for the whole column at once on Arrow's buffers, a few MB of bytes at a time
  (:func:`_bytes_hashes`; Python's ``hash`` of a string differs from one process to the next,
  and a digest per value costs ten times as much);
- anything else, from the value the row converter makes of it, made canonical
  (:func:`canonical`: an address's packed bytes, a set's or a map's elements sorted and
  without repeats), by the BLAKE2b digest of its ``repr``.

The columns' hashes are folded into one 64-bit value per row (SplitMix64's finaliser mixes
each step). Equal keys always hash equal. Different keys may hash equal, by chance or made so
on purpose (the polynomial is no cryptographic hash): a check built on these hashes
(:mod:`sinks.worker.key_order`) takes an equal hash as a candidate only, and compares the
keys' canonical values (:func:`key_values`) before it acts.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from recovery.cql.convert import RowConverter
from recovery.cql.table import CqlType

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BASE = np.uint64(0x100000001B3)          # odd: every byte's weight is a unit modulo 2**64
_NULL = np.uint64(0x6A09E667F3BCC909)     # a null key column (a partition delete's clustering)
_INTEGER_TYPES = frozenset({"tinyint", "smallint", "int", "bigint", "counter", "varint",
                            "boolean", "date", "time"})
_BYTES_TYPES = frozenset({"text", "varchar", "ascii", "blob"})
_UNIT_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}
#: The bytes of text hashed at once (the work arrays take about 8 times as much).
_BYTES_AT_ONCE = 4 << 20


def _mix(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (uint64 arithmetic wraps, as it should)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _powers(length: int) -> np.ndarray:
    """``_BASE**0 .. _BASE**(length - 1)`` modulo 2**64."""
    powers = np.ones(max(length, 1), dtype=np.uint64)
    if length > 1:
        powers[1:] = np.cumprod(np.full(length - 1, _BASE, dtype=np.uint64))
    return powers


def _bytes_hashes(array: pa.Array) -> np.ndarray:
    """Each value's ``sum(byte[j] * _BASE**(len - 1 - j))`` modulo 2**64, its length folded
    in, for a binary or large binary array (a null hashes as an empty value); a few MB of
    bytes at a time (:data:`_BYTES_AT_ONCE`), a longer value alone."""
    count = len(array)
    offsets_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, offsets_type)[array.offset:array.offset + count + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else None
    parts, start = [], 0
    while start < count:
        end = int(np.searchsorted(offsets, offsets[start] + _BYTES_AT_ONCE, side="right")) - 1
        end = min(max(end, start + 1), count)
        parts.append(_bytes_hashes_of(offsets[start:end + 1], data))
        start = end
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _bytes_hashes_of(offsets: np.ndarray, data: np.ndarray | None) -> np.ndarray:
    lengths = np.diff(offsets)
    sums = np.zeros(len(lengths), dtype=np.uint64)
    first, last = int(offsets[0]), int(offsets[-1])
    if last > first:
        body = data[first:last].astype(np.uint64)
        from_end = np.repeat(offsets[1:], lengths) - 1 - np.arange(first, last)
        weighted = body * _powers(int(lengths.max()))[from_end]
        filled = lengths > 0
        # Each sum runs from a value's first byte to the next non-empty value's: empty values
        # between them have no bytes.
        sums[filled] = np.add.reduceat(weighted, offsets[:-1][filled] - first)
    return _mix(sums ^ (lengths.astype(np.uint64) * _GOLDEN))


def _digests(values) -> np.ndarray:
    blob = b"".join(hashlib.blake2b(v, digest_size=8).digest() for v in values)
    return np.frombuffer(blob, dtype="<u8").copy()


def _integers(array: pa.Array) -> np.ndarray:
    kind = array.type
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        array = array.view(pa.int32())          # Arrow casts neither to int64 directly
    elif pa.types.is_time64(kind):
        array = array.view(pa.int64())
    return array.cast(pa.int64()).fill_null(0).to_numpy().view(np.uint64)


def canonical(value: Any, cql: CqlType) -> Any:
    """A converted key value (what :class:`~recovery.cql.convert.RowConverter` gives
    cassandra-driver) as one Python value per Cassandra value: an ``inet`` as its packed bytes, a
    set's elements and a map's entries sorted and without repeats, a list, tuple or UDT as a tuple,
    each element canonical too; a scalar as it is (text, uuid, Decimal, datetime, ...)."""
    if value is None:
        return None
    name = cql.name
    if name == "inet":
        return ipaddress.ip_address(value).packed
    if cql.is_udt or name == "tuple":
        return tuple(canonical(v, t) for v, t in zip(value, cql.params))
    if name in ("list", "vector"):
        return tuple(canonical(v, cql.params[0]) for v in value)
    if name == "set":
        members = {canonical(v, cql.params[0]) for v in value}
        return tuple(sorted(members, key=repr))
    if name == "map":
        entries = value.items() if hasattr(value, "items") else value
        merged = {canonical(k, cql.params[0]): canonical(v, cql.params[1]) for k, v in entries}
        return tuple(sorted(merged.items(), key=repr))
    return value


def _type_of(converter: RowConverter, name: str) -> CqlType:
    return converter.types[converter.columns.index(name)]


def _column(batch: pa.RecordBatch, name: str, converter: RowConverter) -> np.ndarray:
    cql = _type_of(converter, name)
    array = batch.column(name)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if cql.name in _INTEGER_TYPES and (pa.types.is_integer(kind) or pa.types.is_boolean(kind)
                                       or pa.types.is_date32(kind) or pa.types.is_time(kind)):
        hashed = _integers(array)
    elif cql.name == "timestamp" and pa.types.is_timestamp(kind):
        raw = array.cast(pa.timestamp(kind.unit)).cast(pa.int64()).fill_null(0).to_numpy()
        millis = raw * 1000 if kind.unit == "s" else np.floor_divide(raw, _UNIT_PER_MS[kind.unit])
        hashed = millis.view(np.uint64)
    elif cql.name in _BYTES_TYPES and (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                       or pa.types.is_binary(kind)
                                       or pa.types.is_large_binary(kind)):
        target = pa.large_binary() if kind in (pa.large_string(), pa.large_binary()) else pa.binary()
        hashed = _bytes_hashes(array.cast(target))
    else:
        values = converter.column(batch, name, cql)
        hashed = _digests(repr(canonical(v, cql)).encode() for v in values)
    if array.null_count:
        hashed = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL, hashed)
    return hashed


def key_hashes(batch: pa.RecordBatch, columns: Sequence[str], converter: RowConverter,
               start: np.ndarray | None = None) -> np.ndarray:
    """Each row's hash of its ``columns`` (a key, in the table's order), as uint64.
    ``converter`` converts at least those columns (:func:`recovery.cql.convert.row_converter`).
    ``start``: the rows' hashes of the key's first columns, to go on from (the partition
    key's, for the primary key's): the same as hashing all the columns at once."""
    hashed = np.full(batch.num_rows, _GOLDEN, dtype=np.uint64) if start is None else start
    for name in columns:
        hashed = _mix(hashed * _GOLDEN + _column(batch, name, converter))
    return hashed


def key_values(batch: pa.RecordBatch, columns: Sequence[str], converter: RowConverter,
               rows: Sequence[int]) -> list[tuple]:
    """The canonical key (:func:`canonical`, one value a column of ``columns``) of each of
    ``rows``: what two rows with equal :func:`key_hashes` compare to be the same key."""
    picked = batch.take(pa.array(list(rows), pa.int64()))
    per_column = []
    for name in columns:
        cql = _type_of(converter, name)
        per_column.append([canonical(v, cql) for v in converter.column(picked, name, cql)])
    return list(zip(*per_column)) if per_column else [() for _ in rows]


__all__ = ["key_hashes", "key_values", "canonical"]
