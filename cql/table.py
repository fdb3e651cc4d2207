"""The target table's shape, read once from the cluster and recorded in the WAL.

Why a plain frozen dataclass instead of the driver's ``TableMetadata``: it must be pickled
to executors and written as JSON into the write-ahead log (a replay must write with the
schema the batch was staged against), and the driver's object is neither small nor stable.
Type strings are kept as the driver reports them (``frozen<map<text, list<int>>>``);
:func:`cql.convert.parse_cql_type` parses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cassandra import DriverException

from cql.errors import (
    ConnectionFailed,
    SchemaError,
    UnknownKeyspaceError,
    UnknownTableError,
)


@dataclass(frozen=True)
class TableSchema:
    """Columns in table order as ``(name, cql_type)``, plus the primary key's parts."""

    keyspace: str
    table: str
    columns: tuple[tuple[str, str], ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...] = ()

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
    def from_driver_metadata(cls, table_metadata: Any) -> TableSchema:
        """Build from ``cassandra.metadata.TableMetadata`` (its key lists hold ColumnMetadata)."""
        return cls(
            keyspace=table_metadata.keyspace_name,
            table=table_metadata.name,
            columns=tuple((name, str(col.cql_type)) for name, col in table_metadata.columns.items()),
            partition_key=tuple(col.name for col in table_metadata.partition_key),
            clustering_key=tuple(col.name for col in table_metadata.clustering_key),
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
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableSchema:
        return cls(
            keyspace=data["keyspace"],
            table=data["table"],
            columns=tuple((str(name), str(cql_type)) for name, cql_type in data["columns"]),
            partition_key=tuple(data["partition_key"]),
            clustering_key=tuple(data.get("clustering_key", ())),
        )


def fetch_table_schema(cluster_or_session: Any, keyspace: str, table: str) -> TableSchema:
    """Read the table's schema from the cluster, refreshing the driver's metadata first.

    The refresh matters: the table may have been created moments ago by this very job, and
    the driver's cached metadata may not know it yet. Names match exactly first, then
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
    return TableSchema.from_driver_metadata(keyspaces[ks_name].tables[tbl_name])


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
