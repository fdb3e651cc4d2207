"""What a WAL writes to, recorded in ``WAL_DIR/target.json`` without secrets, so that any flush
(the live flusher, a batch job, ``cassandra-wal recover`` on another host) works from the WAL
alone, given credentials (:func:`recovery.cql.credentials.layered`).

:class:`RecordedTarget` is the file's envelope (layout: ``wal/FORMAT.md``, "target.json"):
the :class:`Target`, the fingerprint of the options and DataFrame schema that produced it
(a write with the same fingerprint skips the table lookup), and the stream's checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from recovery.cql.errors import SinkError
from recovery.cql.table import TableSchema
from wal.errors import WalCorrupted
from wal.layout import WalDir
from wal.sealed_write import SEALED_OPTIONS, SealedContact, SealedWrite

from .config import ConnectionConfig, SinkConfig, WalConfig, WriteConfig


@dataclass(frozen=True)
class Target:
    config: SinkConfig
    table: TableSchema
    columns: tuple[str, ...]        # DataFrame columns written, in order
    #: The name of the cluster the schema was read from (``system.local``): how a flush tells
    #: whether a batch sealed for other contact points is for this cluster (None: unknown).
    cluster_name: str | None = None

    def write_record(self) -> SealedWrite:
        """What a batch's seal records of how and where its rows are written (never a secret):
        its columns and the options that decide its cells; the keyspace, table and the
        table's schema as it was when sealed (``table_schema``: a restart with another table,
        or a column dropped since, must not change where or how a pending batch's rows go);
        and the cluster (``contact``: contact points and cluster name). A replay, even by a
        restarted query whose options changed, writes the batch as sealed
        (:meth:`as_sealed`)."""
        write = self.config.write
        conn = self.config.connection
        return SealedWrite(
            columns=self.columns,
            **{name: getattr(write, name) for name in SEALED_OPTIONS},
            keyspace=self.config.keyspace, table=self.config.table,
            table_schema=self.table.to_dict(),
            contact=SealedContact(conn.hosts, conn.port, conn.cloud_bundle_path,
                                  self.cluster_name))

    def as_sealed(self, record: SealedWrite | None) -> "Target":
        """This target writing the way a seal's :meth:`write_record` says: its columns and
        options, its table as sealed, and its cluster when that is not this target's (this
        target's credentials and TLS settings either way). Itself for seals that recorded
        nothing (they are written with the current options, as upserts: such a release had
        no change streams); seals written before the table and cluster were recorded write to
        the current ones."""
        if record is None:
            # sealed before seals recorded how (a release without change streams): upserts
            return replace(self, config=replace(self.config, write=replace(
                self.config.write, op_column=None))) if self.config.write.op_column else self
        write = replace(self.config.write, **record.options())
        config, table = replace(self.config, write=write), self.table
        if record.table_schema:
            table = TableSchema.from_dict(record.table_schema)
            config = replace(config, keyspace=record.keyspace, table=record.table)
        contact = record.contact
        if contact is not None and not self.is_cluster_of(contact):
            config = replace(config, connection=replace(
                config.connection, hosts=contact.hosts, port=contact.port,
                cloud_bundle_path=contact.cloud_bundle_path))
        return replace(self, config=config, table=table, columns=record.columns,
                       cluster_name=contact.cluster_name if contact else self.cluster_name)

    def is_cluster_of(self, contact: SealedContact) -> bool:
        """Whether a seal's ``contact`` is this target's cluster: the same cluster name when
        both are known (contact points change: a node's address, a new seed), else the same
        contact points. Two clusters of one name are taken for one: name clusters apart."""
        if contact.cluster_name and self.cluster_name:
            return contact.cluster_name == self.cluster_name
        conn = self.config.connection
        return ((contact.hosts, contact.port, contact.cloud_bundle_path)
                == (conn.hosts, conn.port, conn.cloud_bundle_path))

    def unaccepted_lists(self, record: SealedWrite | None) -> tuple[str, ...]:
        """The non-frozen list columns (:attr:`recovery.cql.table.TableSchema.non_frozen_lists`) a batch
        sealed with ``record`` writes without its seal recording that the user accepted them
        at least once (``wal.lists.atLeastOnce``). None for a batch this release sealed: it
        refuses such a column before staging; a batch an earlier release sealed may have
        some, and is written all the same (Spark committed it)."""
        sealed = self.as_sealed(record)
        lists = sealed.table.non_frozen_lists
        accepted = {sealed.table.resolve_column(n)
                    for n in sealed.config.write.lists_at_least_once}
        written = (sealed.table.resolve_column(c) for c in sealed.columns)
        return tuple(c for c in written if c in lists and c not in accepted)

    def to_dict(self) -> dict:
        return {"config": self.config.public_dict(), "table": self.table.to_dict(),
                "columns": list(self.columns), "cluster_name": self.cluster_name}

    @classmethod
    def from_dict(cls, d: dict) -> "Target":
        c = d["config"]
        conn = dict(c["connection"], hosts=tuple(c["connection"]["hosts"]))
        config = SinkConfig(keyspace=c["keyspace"], table=c["table"],
                            checkpoint_location=c.get("checkpoint_location"),
                            connection=ConnectionConfig(**conn), write=WriteConfig(**c["write"]),
                            wal=WalConfig(**c["wal"]))
        return cls(config, TableSchema.from_dict(d["table"]), tuple(d["columns"]),
                   d.get("cluster_name"))

    def with_connection(self, **changes) -> "Target":
        """A copy with connection settings replaced (hosts, port, credentials...); None values
        change nothing."""
        changes = {k: v for k, v in changes.items() if v is not None}
        conn = replace(self.config.connection, **changes)
        return replace(self, config=replace(self.config, connection=conn))

    def has_secrets(self) -> bool:
        """Whether connecting takes a secret (a password, a key store's password)."""
        return bool(self.config.connection.secrets())

    def with_credentials(self, creds: Mapping[str, str]) -> "Target":
        """A copy connecting with ``creds`` (what :func:`recovery.cql.credentials.layered` chose)."""
        return self.with_connection(**creds)


class TargetNotRecorded(SinkError):
    """A WAL without ``target.json``: none of its batches was prepared through to the table's
    lookup yet (a stream's first batch records it once Cassandra answered), or it is not a
    sink's WAL."""


@dataclass(frozen=True)
class RecordedTarget:
    """``WAL_DIR/target.json``: the target of the WAL's last write, and what produced it."""

    target_fields: dict | None          # Target.to_dict(): parsed on demand (:attr:`target`)
    fingerprint: str | None = None
    checkpoint_location: str | None = None
    path: str = "target.json"
    #: Where a change stream's write timestamps came from, once one wrote this WAL (sealed
    #: timestamps, or a ``writetime`` column): kept in every later record, so that no later
    #: write takes them from elsewhere (:func:`sinks.worker.plan.prepare_write`)
    change_stream_timestamps: str | None = None

    @property
    def target(self) -> Target:
        if not self.target_fields:
            raise SinkError(f"{self.path} records no target: nothing says where its rows go")
        return Target.from_dict(self.target_fields)

    @property
    def readable_target(self) -> Target | None:
        """:attr:`target`, or None where none is recorded or this release cannot read it (for
        figures that never fail on a record: :mod:`recovery.health`)."""
        try:
            return self.target
        except (SinkError, KeyError, TypeError, ValueError):
            return None

    @property
    def max_bytes(self) -> int | None:
        """``wal.maxBytes`` as recorded (None: not recorded), read from its own field, so that
        a target this release cannot read whole (a later release's option) still gives it:
        :mod:`recovery.health` says lagging over it."""
        config = (self.target_fields or {}).get("config")
        wal = config.get("wal") if isinstance(config, dict) else None
        value = wal.get("max_bytes") if isinstance(wal, dict) else None
        return value if isinstance(value, int) else None

    @property
    def table_name(self) -> str | None:
        """``<keyspace>.<table>`` of the WAL's last write (None: none recorded)."""
        if not self.target_fields:
            return None
        config = self.target.config
        return f"{config.keyspace}.{config.table}"

    @classmethod
    def of(cls, target: Target, fingerprint: str,
           change_stream_timestamps: str | None = None) -> "RecordedTarget":
        return cls(target.to_dict(), fingerprint, target.config.checkpoint_location,
                   change_stream_timestamps=change_stream_timestamps)

    @classmethod
    def read(cls, wal: WalDir) -> "RecordedTarget | None":
        """The WAL's record (None if no write recorded one yet); ``WalCorrupted`` if unreadable."""
        data = wal.read_target()
        if data is None:
            return None
        if not isinstance(data, dict):
            raise WalCorrupted(wal.target_file, "target.json is not a JSON object")
        return cls(data.get("target"), data.get("fingerprint"), data.get("checkpoint_location"),
                   wal.target_file, data.get("change_stream_timestamps"))

    @classmethod
    def require(cls, wal: WalDir) -> "RecordedTarget":
        """The WAL's record; a :class:`TargetNotRecorded` naming the file if there is none."""
        recorded = cls.read(wal)
        if recorded is None:
            raise TargetNotRecorded(f"{wal.root} has no target.json: nothing says where its "
                                    f"rows go")
        return recorded

    def write(self, wal: WalDir) -> None:
        """Record it in ``wal`` (atomically: a reader sees the old record or this one)."""
        record = {"fingerprint": self.fingerprint, "target": self.target_fields,
                  "checkpoint_location": self.checkpoint_location}
        if self.change_stream_timestamps is not None:
            record["change_stream_timestamps"] = self.change_stream_timestamps
        wal.write_target(record)
