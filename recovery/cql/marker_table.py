"""The completeness marker's table (``marker.table``): its schema, the statement that creates
it, the check that a table given is one, and the statement that records a batch.

One row per query and target table: the newest batch whose every row Cassandra acknowledged,
with when the flusher saw Spark's commit of it, when its last write was acknowledged, its row
count and the event-time watermark it ran with. What goes in each column, and when it is
written, is :mod:`recovery.marker`'s.
"""

from __future__ import annotations

from typing import Any

from . import table as tables
from .errors import OptionError, UnknownKeyspaceError, UnknownTableError
from .table import TableSchema, quote

#: The option that names the table, and the one that creates it.
TABLE_OPTION, CREATE_OPTION = "marker.table", "marker.create"
#: Its columns, in order, with their CQL types.
COLUMNS = (("query_id", "text"), ("target_table", "text"), ("batch_id", "bigint"),
           ("commit_seen_at", "timestamp"), ("acknowledged_at", "timestamp"),
           ("rows", "bigint"), ("watermark", "timestamp"))
PARTITION_KEY, CLUSTERING_KEY = ("query_id",), ("target_table",)


def split_name(name: str, keyspace: str) -> tuple[str, str]:
    """``marker.table``'s value as (keyspace, table): ``ks.table``, or a table of the
    target's ``keyspace``."""
    head, dot, tail = name.partition(".")
    return (head, tail) if dot else (keyspace, name)


def create_cql(keyspace: str, table: str) -> str:
    columns = ", ".join(f"{quote(name)} {cql_type}" for name, cql_type in COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS {quote(keyspace)}.{quote(table)} ({columns}, "
            f"PRIMARY KEY (({', '.join(PARTITION_KEY)}), {', '.join(CLUSTERING_KEY)}))")


def insert_cql(keyspace: str, table: str) -> str:
    names = ", ".join(quote(name) for name, _ in COLUMNS)
    marks = ", ".join("?" for _ in COLUMNS)
    return (f"INSERT INTO {quote(keyspace)}.{quote(table)} ({names}) VALUES ({marks}) "
            "USING TIMESTAMP ?")


def check_schema(schema: TableSchema, given: str) -> None:
    """Raise OptionError (naming ``marker.table`` and ``given``) unless ``schema`` has the
    marker's key and every column of its type (other columns are left alone)."""
    if schema.partition_key != PARTITION_KEY or schema.clustering_key != CLUSTERING_KEY:
        raise OptionError(TABLE_OPTION, given,
                          f"its primary key is ({', '.join(schema.partition_key)}), "
                          f"{', '.join(schema.clustering_key) or 'no clustering'}, not "
                          "((query_id), target_table): "
                          f"{create_cql(schema.keyspace, schema.table)}")
    for name, cql_type in COLUMNS:
        have = schema.column_type(name) if name in schema.column_names else None
        if have != cql_type:
            raise OptionError(TABLE_OPTION, given,
                              f"column {name} is {have or 'missing'}, not {cql_type}: the "
                              f"marker's table is {create_cql(schema.keyspace, schema.table)}")


def prepare_table(cluster: Any, session: Any, name: str, keyspace: str, create: bool) -> None:
    """Before anything is staged: the marker's table exists with its schema, created first
    when ``create`` (``marker.create``). Raises OptionError naming the option, or what
    :func:`recovery.cql.table.fetch_table_schema` raises (called through its module: the tests'
    seam)."""
    ks, table = split_name(name, keyspace)
    if create:
        session.execute(create_cql(ks, table))
    try:
        schema = tables.fetch_table_schema(cluster, ks, table)
    except (UnknownKeyspaceError, UnknownTableError) as exc:
        raise OptionError(TABLE_OPTION, name, f"{exc}; create it ({create_cql(ks, table)}) "
                          f"or set {CREATE_OPTION}=true") from None
    check_schema(schema, name)
