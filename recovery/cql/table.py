"""The target table's shape, read once from the cluster and recorded in the WAL.

Why a plain frozen dataclass instead of cassandra-driver's ``TableMetadata``: it must be pickled
to executors and written as JSON into the write-ahead log (a replay must write with the
schema the batch was staged against), and cassandra-driver's object is neither small nor stable.
Type strings are kept as cassandra-driver reports them (``frozen<map<text, list<int>>>``);
:func:`parse_cql_type` parses them, and :meth:`TableSchema.cql_type` gives a column's parsed
type with its user-defined types expanded. A column's type string names a UDT only
(``frozen<address>``), so the schema also records the definition of every UDT the columns use,
nested ones included: a replay converts with the fields the batch was staged against.
"""

from __future__ import annotations

import datetime

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from cassandra import DriverException

from recovery.cql.errors import (
    ConnectionFailed,
    SchemaError,
    UnknownKeyspaceError,
    UnknownTableError,
)

# ---------------------------------------------------------------- CQL type strings


@dataclass(frozen=True)
class CqlType:
    """A parsed CQL type: ``frozen<map<text, list<int>>>`` is
    ``CqlType("map", (text, CqlType("list", (int,))), frozen=True)``.

    Unquoted names are lower-cased (CQL folds them); quoted UDT names keep their case;
    a custom type (``'org.apache...'``) keeps its class name. ``size`` is a vector's dimension.
    A user-defined type expanded by :meth:`TableSchema.cql_type` has ``fields``, its field
    names in the type's order, and ``params``, their types; as parsed it is a bare name.
    """

    name: str
    params: tuple[CqlType, ...] = ()
    frozen: bool = False
    size: int | None = None
    fields: tuple[str, ...] | None = None

    @property
    def is_udt(self) -> bool:
        return self.fields is not None

    @property
    def is_non_frozen_list(self) -> bool:
        """A non-frozen list: Cassandra stores each element in a cell of its own, named by a
        time-based id the node picks at each write, so a row written twice holds its
        elements twice (CASSANDRA-11368), whatever the write timestamp. Sets and maps name a
        cell by its element or key, a frozen collection is one cell, and a non-frozen UDT is a
        cell per field (Cassandra refuses a non-frozen collection inside it): those rewrite
        the same cells. Said of a column's own type: a list nested inside another type is
        always frozen."""
        return self.name == "list" and not self.frozen

    def __str__(self) -> str:
        if self.is_udt:   # as CQL spells it: the type's name
            text = self.name if _PLAIN_NAME.fullmatch(self.name) else '"' + self.name.replace('"', '""') + '"'
            return f"frozen<{text}>" if self.frozen else text
        inner = [str(p) for p in self.params] + ([] if self.size is None else [str(self.size)])
        text = f"{self.name}<{', '.join(inner)}>" if inner else self.name
        return f"frozen<{text}>" if self.frozen else text


COLLECTIONS = frozenset({"list", "set", "map", "tuple", "vector"})
_PLAIN_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TOKEN_RE = re.compile(r'\s*(?:("(?:[^"]|"")*")|(\'[^\']*\')|([A-Za-z0-9_.$]+)|([<>,]))')


def quote(name: str) -> str:
    """A CQL identifier, quoted (case and any character kept)."""
    return '"' + name.replace('"', '""') + '"'


@lru_cache(maxsize=1024)
def parse_cql_type(text: str) -> CqlType:
    """Parse a CQL type string as cassandra-driver reports it
    (``TableMetadata.columns[c].cql_type``).

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



def _expand(cql: CqlType, user_types: dict[str, tuple[tuple[str, str], ...]],
            seen: tuple[str, ...] = ()) -> CqlType:
    """``cql`` with every UDT name it holds replaced by the type's fields (``user_types``:
    name -> ``((field, type string), ...)``). A name that is not a UDT stays as it is."""
    if cql.params:
        return replace(cql, params=tuple(_expand(p, user_types, seen) for p in cql.params))
    definition = user_types.get(cql.name)
    if definition is None or cql.name in seen:   # CQL cannot nest a UDT in itself; be safe
        return cql
    return replace(cql, fields=tuple(f for f, _ in definition),
                   params=tuple(_expand(parse_cql_type(t), user_types, seen + (cql.name,))
                                for _, t in definition))


def _udt_names(cql: CqlType) -> list[str]:
    """The names in ``cql`` that may be UDTs (parameterless, not a native type), in order."""
    if cql.params:
        return [n for p in cql.params for n in _udt_names(p)]
    return [] if cql.name in NATIVE_TYPES else [cql.name]


#: CQL's own type names; a keyspace cannot define a UDT of one of these names.
NATIVE_TYPES = frozenset({"ascii", "bigint", "blob", "boolean", "counter", "date", "decimal",
                          "double", "duration", "float", "inet", "int", "smallint", "text",
                          "time", "timestamp", "timeuuid", "tinyint", "uuid", "varchar",
                          "varint", "empty"})


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class TableSchema:
    """Columns in table order as ``(name, cql_type)``, plus the primary key's parts,
    ``user_types``: each UDT the columns use as ``(name, ((field, cql_type), ...))``, and
    ``static_columns``: those that hold one value a partition (``STATIC``)."""

    keyspace: str
    table: str
    columns: tuple[tuple[str, str], ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...] = ()
    user_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    static_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = {name for name, _ in self.columns}
        for key in self.partition_key + self.clustering_key:
            if key not in names:
                raise ValueError(f"key column {key!r} is not among the columns of {self.keyspace}.{self.table}")
        if not self.partition_key:
            raise ValueError(f"{self.keyspace}.{self.table} has no partition key")

    @property
    def is_counter(self) -> bool:
        """True when any column is a counter (the sink refuses such tables)."""
        return any(cql_type.strip().lower() == "counter" for _, cql_type in self.columns)

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self.partition_key + self.clustering_key

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def column_type(self, name: str) -> str:
        """The CQL type string of column ``name`` (exact name); KeyError if absent."""
        for column, cql_type in self.columns:
            if column == name:
                return cql_type
        raise KeyError(name)

    def cql_type(self, name: str) -> CqlType:
        """The parsed CQL type of column ``name`` (exact name), its UDTs expanded
        (:attr:`CqlType.fields`); KeyError if absent."""
        return _expanded(self.column_type(name), self.user_types)

    @property
    def non_frozen_lists(self) -> tuple[str, ...]:
        """The columns a write appends to instead of overwriting (non-frozen lists:
        :attr:`CqlType.is_non_frozen_list`), in table order."""
        return tuple(name for name in self.column_names if self.cql_type(name).is_non_frozen_list)

    def resolve_column(self, name: str) -> str | None:
        """The table's column for a DataFrame column name: exact match first, then
        case-insensitive (Cassandra names are case-sensitive but usually lower case).

        None when there is no match; SchemaError when the case-insensitive match is ambiguous.
        """
        matches = name_matches(name, self.column_names)
        if len(matches) > 1:
            listed = ", ".join(repr(m) for m in matches)
            raise SchemaError(name, f"matches columns {listed} of {self.keyspace}.{self.table} ignoring case; use the exact name")
        return matches[0] if matches else None

    @classmethod
    def from_table_metadata(cls, table_metadata: Any,
                            user_types: Mapping[str, Any] | None = None) -> TableSchema:
        """Build from ``cassandra.metadata.TableMetadata`` (its key lists hold ColumnMetadata)
        and its keyspace's ``user_types`` (name -> ``cassandra.metadata.UserType``), of which
        the schema keeps those its columns use."""
        columns = tuple((name, str(col.cql_type)) for name, col in table_metadata.columns.items())
        return cls(
            keyspace=table_metadata.keyspace_name,
            table=table_metadata.name,
            columns=columns,
            partition_key=tuple(col.name for col in table_metadata.partition_key),
            clustering_key=tuple(col.name for col in table_metadata.clustering_key),
            user_types=_used_types([t for _, t in columns], user_types or {}),
            static_columns=tuple(name for name, col in table_metadata.columns.items()
                                 if getattr(col, "is_static", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``is_counter`` is included for readers, ignored by from_dict."""
        return {
            "keyspace": self.keyspace,
            "table": self.table,
            "columns": [[name, cql_type] for name, cql_type in self.columns],
            "partition_key": list(self.partition_key),
            "clustering_key": list(self.clustering_key),
            "is_counter": self.is_counter,
            "user_types": [[name, [[f, t] for f, t in fields]] for name, fields in self.user_types],
            # Only when there are some: the record of a table without stays as it was.
            **({"static_columns": list(self.static_columns)} if self.static_columns else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableSchema:
        return cls(
            keyspace=data["keyspace"],
            table=data["table"],
            columns=tuple((str(name), str(cql_type)) for name, cql_type in data["columns"]),
            partition_key=tuple(data["partition_key"]),
            clustering_key=tuple(data.get("clustering_key", ())),
            user_types=tuple((str(name), tuple((str(f), str(t)) for f, t in fields))
                             for name, fields in data.get("user_types", ())),
            static_columns=tuple(data.get("static_columns", ())),
        )


@lru_cache(maxsize=1024)
def _expanded(text: str, user_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]) -> CqlType:
    return _expand(parse_cql_type(text), dict(user_types))


def _used_types(type_strings: Iterable[str], defined: Mapping[str, Any]
                ) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """The definitions of the UDTs ``type_strings`` use, nested ones too, in order of first use."""
    found: dict[str, tuple[tuple[str, str], ...]] = {}
    pending = [n for text in type_strings for n in _udt_names(parse_cql_type(text))]
    while pending:
        name = pending.pop(0)
        if name in found or name not in defined:
            continue
        udt = defined[name]
        found[name] = tuple((str(f), str(t)) for f, t in zip(udt.field_names, udt.field_types, strict=True))
        pending.extend(n for _, t in found[name] for n in _udt_names(parse_cql_type(t)))
    return tuple(found.items())


def fetch_table_schema(cluster_or_session: Any, keyspace: str, table: str) -> TableSchema:
    """Read the table's schema from the cluster, refreshing cassandra-driver's metadata first.

    The refresh matters: the table may have been created moments ago by this very job, and
    cassandra-driver's cached metadata may not know it yet. Names match exactly first, then
    case-insensitively. Raises UnknownKeyspaceError / UnknownTableError, or ConnectionFailed
    when the refresh itself fails.
    """
    cluster = getattr(cluster_or_session, "cluster", cluster_or_session)
    try:
        ks_name, tbl_name = _lookup(cluster.metadata.keyspaces, keyspace, table)
        if ks_name is not None and tbl_name is not None:
            cluster.refresh_table_metadata(ks_name, tbl_name)
        else:
            cluster.refresh_schema_metadata()
    except DriverException as exc:
        hosts = getattr(cluster, "contact_points", ()) or ()
        raise ConnectionFailed(hosts, f"schema refresh failed: {exc}") from exc
    keyspaces = cluster.metadata.keyspaces
    ks_name, tbl_name = _lookup(keyspaces, keyspace, table)
    if ks_name is None:
        raise UnknownKeyspaceError(keyspace)
    if tbl_name is None:
        raise UnknownTableError(ks_name, table)
    keyspace_metadata = keyspaces[ks_name]
    return TableSchema.from_table_metadata(keyspace_metadata.tables[tbl_name],
                                            getattr(keyspace_metadata, "user_types", {}))


def _lookup(keyspaces: Mapping[str, Any], keyspace: str, table: str) -> tuple[str | None, str | None]:
    """Resolve both names; an ambiguous case-insensitive match counts as not found."""
    ks_matches = name_matches(keyspace, keyspaces)
    if len(ks_matches) != 1:
        return None, None
    tbl_matches = name_matches(table, keyspaces[ks_matches[0]].tables)
    return ks_matches[0], (tbl_matches[0] if len(tbl_matches) == 1 else None)


def name_matches(name: str, candidates: Iterable[str]) -> list[str]:
    """``[name]`` if it is a candidate, else every candidate equal to it ignoring case."""
    candidates = list(candidates)
    if name in candidates:
        return [name]
    return [c for c in candidates if c.lower() == name.lower()]


#: Cassandra's record of dropped columns: a cell of a dropped column written at or before its
#: drop time stays hidden, even once a column of that name is added again.
_DROPPED = ("SELECT column_name, dropped_time FROM system_schema.dropped_columns "
            "WHERE keyspace_name = %s AND table_name = %s")


def dropped_columns(session: Any, keyspace: str, table: str) -> dict[str, int]:
    """Each column of the table Cassandra records as dropped -> the last write timestamp (µs)
    its drop hides. ``dropped_time`` is kept to the millisecond: the bound is the end of that
    millisecond, so a cell hidden is never taken for a visible one."""
    rows = session.execute(_DROPPED, (keyspace, table))
    out = {}
    for row in rows:
        dropped = row.dropped_time
        if isinstance(dropped, datetime.datetime):
            # cassandra-driver gives a naive datetime in UTC: never the machine's zone.
            if dropped.tzinfo is None:
                dropped = dropped.replace(tzinfo=datetime.timezone.utc)
            ms = (dropped - _EPOCH) // datetime.timedelta(milliseconds=1)
        else:
            ms = int(dropped)
        out[row.column_name] = (ms + 1) * 1000 - 1
    return out


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
