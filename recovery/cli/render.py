"""Rendering for ``cassandra-wal``: plain-text tables, sizes, ages, and typed Arrow values as
JSON.

JSON rendering of Arrow values (:func:`column_values`), column by column, from the stored
integers rather than through Python objects, so nothing is rounded or shifted:

==========================  ============================================================
Arrow type (Spark type)     JSON
==========================  ============================================================
string, large_string        string, as is (UUIDs too)
int8..int64, uint*          number (exact, any size)
float64 / float32           number (float32 in its shortest round-trip form: 0.1, not
                            0.10000000149011612); NaN, Infinity, -Infinity as strings
bool                        true / false
decimal128/256              string, exact, with the type's scale: "12.3400"
timestamp with a time zone  "2024-02-29T23:59:59.123456+00:00" (microseconds always; nine
                            digits for nanosecond timestamps; offset of the type's zone)
timestamp without one (NTZ) "2024-02-29T23:59:59.123456" (no offset: it has none)
date32 / date64             "2024-02-29"
time32 / time64             "23:59:59.123456"
duration (day-time int.)    "PT93784.000005S" (ISO-8601, seconds)
binary, fixed_size_binary   {"$base64": "AAH+/w=="}
list, large_list, fixed     array (a CQL list or set: Spark's array)
map with string keys        object {"key": value}
map with other keys         array of [key, value] pairs
struct                      object {"field": value}
dictionary                  its decoded values
null                        null
==========================  ============================================================

Dates and timestamps outside 0001..9999 (never produced by Spark) fall back to
``{"$epoch_days": n}`` / ``{"$epoch_<unit>": n}``.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import struct
import zoneinfo
from decimal import Decimal
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.types as pat

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)
_UNIT_DIV = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


# ------------------------------------------------------------------------------- tables
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
          right: Sequence[str] = ()) -> str:
    """A plain-text table: two spaces between columns, ``right``-aligned columns by header."""
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if h in right else c.ljust(w)
                 for c, w, h in zip(r, widths, headers)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def human_bytes(n: int) -> str:
    """1000-based: ``512 B``, ``1.5 kB``, ``12.3 MB``, ``4.0 GB``."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 1000:
            break
    return f"{value:.1f} {unit}"


def human_time(at_us: int) -> str:
    """An instant in µs since the epoch, as UTC to the millisecond:
    ``2026-11-29T09:45:01.123Z``."""
    at = dt.datetime.fromtimestamp(at_us / 1e6, dt.timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def human_age(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: the largest unit that fits."""
    s = int(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def progress(done: int, total: int) -> str:
    """``1200/5000 (24%)``; percentages round down so 100% means all of it."""
    pct = 100 if total == 0 else (done * 100) // total
    return f"{done}/{total} ({pct}%)"


def yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


# --------------------------------------------------------------------------- JSON values
def column_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of an Arrow array as JSON-ready Python objects (see the module docstring)."""
    if isinstance(array, pa.ChunkedArray):
        out: list[Any] = []
        for chunk in array.chunks:
            out.extend(column_values(chunk))
        return out
    return _converter(array.type)(array)


def _with_nulls(array: pa.Array, values: list[Any]) -> list[Any]:
    if array.null_count == 0:
        return values
    valid = array.is_valid().to_pylist()
    return [v if ok else None for v, ok in zip(values, valid)]


def _converter(t: pa.DataType) -> Callable[[pa.Array], list[Any]]:
    if isinstance(t, pa.ExtensionType):
        return lambda a: column_values(a.storage)
    if pat.is_dictionary(t):
        return lambda a: column_values(a.dictionary_decode())
    if pat.is_null(t):
        return lambda a: [None] * len(a)
    if pat.is_boolean(t) or pat.is_integer(t) or pat.is_string(t) or pat.is_large_string(t):
        return lambda a: a.to_pylist()
    if pat.is_floating(t):
        return _floats
    if pat.is_decimal(t):
        return lambda a: [None if v is None else _decimal(v) for v in a.to_pylist()]
    if pat.is_timestamp(t):
        return _timestamps
    if pat.is_date32(t):
        return lambda a: _with_nulls(a, [_date(d) for d in _ints(a, pa.int32())])
    if pat.is_date64(t):
        return lambda a: _with_nulls(a, [_date(ms // 86_400_000) for ms in _ints(a, pa.int64())])
    if pat.is_time(t):
        return _times
    if pat.is_duration(t):
        return _durations
    if pat.is_binary(t) or pat.is_large_binary(t) or pat.is_fixed_size_binary(t):
        return lambda a: [None if v is None else {"$base64": base64.b64encode(v).decode()}
                          for v in a.to_pylist()]
    if pat.is_map(t):
        return _maps
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t) \
            or getattr(pat, "is_list_view", lambda _t: False)(t):
        return _lists
    if pat.is_struct(t):
        return _structs
    return lambda a: [None if v is None else str(v) for v in a.to_pylist()]


def _ints(array: pa.Array, as_type: pa.DataType) -> list[int]:
    """The stored integers (nulls as 0: callers put the nulls back)."""
    return array.view(as_type).fill_null(0).to_pylist()


def _floats(array: pa.Array) -> list[Any]:
    single = array.type == pa.float32()
    out = []
    for v in array.to_pylist():
        if v is None:
            out.append(None)
        elif math.isnan(v):
            out.append("NaN")
        elif math.isinf(v):
            out.append("Infinity" if v > 0 else "-Infinity")
        else:
            out.append(_shortest_float32(v) if single else v)
    return out


def _shortest_float32(v: float) -> float:
    """The shortest decimal that reads back as the same float32 (what Spark/Java print)."""
    exact = struct.pack("<f", v)
    for digits in range(1, 10):
        candidate = float(f"{v:.{digits}g}")
        if struct.pack("<f", candidate) == exact:
            return candidate
    return v


def _decimal(v: Decimal) -> str:
    return format(v, "f")


def _date(days: int) -> Any:
    try:
        return (_EPOCH_DATE + dt.timedelta(days=days)).isoformat()
    except OverflowError:
        return {"$epoch_days": days}


def _zone(tz: str | None) -> dt.tzinfo | None:
    if tz is None:
        return None
    if tz in ("UTC", "Z", "Etc/UTC"):
        return dt.timezone.utc
    if tz[:1] in "+-" and ":" in tz:
        sign = -1 if tz[0] == "-" else 1
        hours, minutes = tz[1:].split(":")
        return dt.timezone(sign * dt.timedelta(hours=int(hours), minutes=int(minutes)))
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return dt.timezone.utc   # the instant is still exact; shown in UTC


def _timestamps(array: pa.Array) -> list[Any]:
    unit, zone = array.type.unit, _zone(array.type.tz)
    per_s = _UNIT_DIV[unit]
    out = []
    for v in _ints(array, pa.int64()):
        seconds, frac = divmod(v, per_s)
        try:
            naive = _EPOCH + dt.timedelta(seconds=seconds)
            local = naive if zone is None else \
                naive.replace(tzinfo=dt.timezone.utc).astimezone(zone)
        except (OverflowError, ValueError):
            out.append({f"$epoch_{unit}": v})
            continue
        digits = 9 if unit == "ns" else 6
        fraction = frac * 10 ** digits // per_s
        offset = "" if zone is None else local.isoformat()[19:]   # "+HH:MM" (no fraction)
        out.append(f"{local.year:04d}-{local:%m-%dT%H:%M:%S}.{fraction:0{digits}d}{offset}")
    return _with_nulls(array, out)


def _times(array: pa.Array) -> list[Any]:
    unit = array.type.unit
    per_s = _UNIT_DIV[unit]
    digits = 9 if unit == "ns" else 6
    as_int = pa.int32() if pa.types.is_time32(array.type) else pa.int64()
    out = []
    for v in _ints(array, as_int):
        seconds, frac = divmod(v, per_s)
        hours, rest = divmod(seconds, 3600)
        out.append(f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}."
                   f"{frac * 10 ** digits // per_s:0{digits}d}")
    return _with_nulls(array, out)


def _durations(array: pa.Array) -> list[Any]:
    per_s = _UNIT_DIV[array.type.unit]
    digits = {1: 0, 1_000: 3, 1_000_000: 6, 1_000_000_000: 9}[per_s]
    out = []
    for v in _ints(array, pa.int64()):
        sign = "-" if v < 0 else ""
        seconds, frac = divmod(abs(v), per_s)
        out.append(f"{sign}PT{seconds}.{frac:0{digits}d}S" if digits else f"{sign}PT{seconds}S")
    return _with_nulls(array, out)


def _offsets(array: pa.Array) -> list[int]:
    if pat.is_fixed_size_list(array.type):
        size = array.type.list_size
        return [(array.offset + i) * size for i in range(len(array) + 1)]
    return array.offsets.to_pylist()


def _lists(array: pa.Array) -> list[Any]:
    offsets = _offsets(array)
    if not offsets:
        return []
    lo, hi = offsets[0], offsets[-1]
    children = column_values(array.values.slice(lo, hi - lo))
    out = [children[a - lo:b - lo] for a, b in zip(offsets, offsets[1:])]
    return _with_nulls(array, out)


def _maps(array: pa.MapArray) -> list[Any]:
    offsets = array.offsets.to_pylist()
    if not offsets:
        return []
    lo, hi = offsets[0], offsets[-1]
    keys = column_values(array.keys.slice(lo, hi - lo))
    items = column_values(array.items.slice(lo, hi - lo))
    string_keys = pat.is_string(array.type.key_type) or pat.is_large_string(array.type.key_type)
    out: list[Any] = []
    for a, b in zip(offsets, offsets[1:]):
        pairs = zip(keys[a - lo:b - lo], items[a - lo:b - lo])
        out.append(dict(pairs) if string_keys else [[k, v] for k, v in pairs])
    return _with_nulls(array, out)


def _structs(array: pa.StructArray) -> list[Any]:
    names = [array.type.field(i).name for i in range(array.type.num_fields)]
    fields = [column_values(child) for child in array.flatten()]
    out = [dict(zip(names, values)) for values in zip(*fields)] if fields \
        else [{} for _ in range(len(array))]
    return _with_nulls(array, out)


# --------------------------------------------------------------------------- JSON Schema
_NUMBER_OR_SPECIAL = {"oneOf": [{"type": "number"},
                                {"enum": ["NaN", "Infinity", "-Infinity"]}]}


def json_schema_of(t: pa.DataType) -> dict:
    """A JSON Schema (draft 2020-12) for how :func:`column_values` renders type ``t``."""
    if isinstance(t, pa.ExtensionType):
        return json_schema_of(t.storage_type)
    if pat.is_dictionary(t):
        return json_schema_of(t.value_type)
    if pat.is_null(t):
        return {"type": "null"}
    if pat.is_boolean(t):
        return {"type": "boolean"}
    if pat.is_integer(t):
        return {"type": "integer"}
    if pat.is_floating(t):
        return dict(_NUMBER_OR_SPECIAL)
    if pat.is_string(t) or pat.is_large_string(t):
        return {"type": "string"}
    if pat.is_decimal(t):
        return {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?$"}
    if pat.is_timestamp(t):
        if t.tz is not None:
            return {"type": "string", "format": "date-time"}
        return {"type": "string", "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+$"}
    if pat.is_date(t):
        return {"type": "string", "format": "date"}
    if pat.is_time(t):
        return {"type": "string", "pattern": r"^[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]+$"}
    if pat.is_duration(t):
        return {"type": "string", "format": "duration"}
    if pat.is_binary(t) or pat.is_large_binary(t) or pat.is_fixed_size_binary(t):
        return {"type": "object", "required": ["$base64"], "additionalProperties": False,
                "properties": {"$base64": {"type": "string", "contentEncoding": "base64"}}}
    if pat.is_map(t):
        value = _nullable(json_schema_of(t.item_type), t.item_field.nullable)
        if pat.is_string(t.key_type) or pat.is_large_string(t.key_type):
            return {"type": "object", "additionalProperties": value}
        return {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                           "prefixItems": [json_schema_of(t.key_type), value]}}
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return {"type": "array",
                "items": _nullable(json_schema_of(t.value_type), t.value_field.nullable)}
    if pat.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        return {"type": "object", "additionalProperties": False,
                "required": [f.name for f in fields],
                "properties": {f.name: field_schema(f) for f in fields}}
    return {"type": "string"}


def _nullable(schema: dict, nullable: bool) -> dict:
    if not nullable:
        return schema
    if isinstance(schema.get("type"), str) and schema["type"] != "null":
        return dict(schema, type=[schema["type"], "null"])
    return {"anyOf": [schema, {"type": "null"}]}


def field_schema(f: pa.Field) -> dict:
    return dict(_nullable(json_schema_of(f.type), f.nullable), **{"x-arrow-type": str(f.type)})
