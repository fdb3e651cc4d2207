"""A seal's ``write`` record: how its batch's rows become cells and where they go, fixed when
the batch is sealed, so that a replay, even by a query restarted with other options or another
table, writes the same cells to the same table (``wal/FORMAT.md``, "Seal files").

It is part of the WAL's format, so this floor owns its fields and how they read back from
seals of earlier releases; the WAL only keeps it. :class:`recovery.target.Target` fills it
from a query's options (``write_record``) and writes a batch by it (``as_sealed``). Never a
secret: credentials stay with whoever flushes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class SealedContact:
    """The cluster a batch was sealed for (what tells it from another cluster's)."""

    hosts: tuple[str, ...]
    port: int
    cloud_bundle_path: str | None = None
    cluster_name: str | None = None    # system.local's cluster_name (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "port": self.port,
                "cloud_bundle_path": self.cloud_bundle_path, "cluster_name": self.cluster_name}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SealedContact:
        return cls(tuple(d.get("hosts", ())), d.get("port"), d.get("cloud_bundle_path"),
                   d.get("cluster_name"))


@dataclass(frozen=True)
class SealedWrite:
    """The columns written and the write options that decide cells, by their
    ``recovery.cql.config.WriteConfig`` names (:data:`SEALED_OPTIONS`), and where the batch
    goes.

    A field a seal lacks reads as what its release did: ``lists_at_least_once`` as none (that
    release wrote lists without asking), the change stream's ``op_*`` fields as a batch of
    upserts; ``keyspace``, ``table``, ``table_schema`` and ``contact`` as None (the current
    target's)."""

    columns: tuple[str, ...]
    ttl_seconds: int | None = None
    ttl_column: str | None = None
    writetime_micros: int | None = None
    writetime_column: str | None = None
    ignore_nulls: bool = False
    #: Non-frozen list columns the user accepted at least once for (``wal.lists.atLeastOnce``)
    lists_at_least_once: tuple[str, ...] = ()
    #: A change stream (``op.*``): the column of operations (never a cell) and its values
    op_column: str | None = None
    upsert_values: tuple[str, ...] = ()
    delete_values: tuple[str, ...] = ()
    partition_delete_values: tuple[str, ...] = ()
    keyspace: str | None = None
    table: str | None = None
    table_schema: dict[str, Any] | None = None     # as target.json's "table"
    contact: SealedContact | None = None

    def __post_init__(self) -> None:
        # Tuples however they were given (a JSON list from a seal).
        for name in ("columns", *_TUPLE_OPTIONS):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))

    def options(self) -> dict[str, Any]:
        """The write options, by name: what a replay's ``WriteConfig`` takes from the seal."""
        return {name: getattr(self, name) for name in SEALED_OPTIONS}

    def without_columns(self, left_out: tuple[str, ...]) -> SealedWrite:
        """This record with the DataFrame columns ``left_out`` no longer written (an operator's
        amendment: :mod:`wal.amendments`)."""
        return replace(self, columns=tuple(c for c in self.columns if c not in left_out))

    def to_dict(self) -> dict[str, Any]:
        d = {"columns": list(self.columns),
             **{name: list(v) if isinstance(v, tuple) else v
                for name, v in self.options().items()}}
        # Where it goes, as far as its release recorded it (all of it, since they exist).
        for name in _WHERE:
            value = getattr(self, name)
            if value is not None:
                d[name] = value.to_dict() if isinstance(value, SealedContact) else value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SealedWrite:
        contact = d.get("contact")
        return cls(columns=d["columns"],
                   **{name: d[name] for name in SEALED_OPTIONS if name in d},
                   keyspace=d.get("keyspace"), table=d.get("table"),
                   table_schema=d.get("table_schema") or None,
                   contact=SealedContact.from_dict(contact) if contact else None)


#: Where a batch goes: the fields an earlier release may not have recorded.
_WHERE = ("keyspace", "table", "table_schema", "contact")
#: The write options a seal records: the ones that decide which cells a row becomes.
#: Connection, batching and retry options only decide how they travel, and are not sealed.
SEALED_OPTIONS = tuple(f.name for f in fields(SealedWrite)
                       if f.name != "columns" and f.name not in _WHERE)
_TUPLE_OPTIONS = ("lists_at_least_once", "upsert_values", "delete_values",
                  "partition_delete_values")
