"""What a WAL writes to: recorded in ``WAL_DIR/target.json`` by the sink, without secrets, so
that recovery can run anywhere with only credentials supplied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from sinks.options import ConnectionConfig, SinkConfig, WalConfig, WriteConfig
from sinks.table import TableSchema

ENV_USERNAME = "CASSANDRA_WAL_USERNAME"
ENV_PASSWORD = "CASSANDRA_WAL_PASSWORD"
ENV_KEYSTORE_PASSWORD = "CASSANDRA_WAL_KEYSTORE_PASSWORD"


#: The write options a seal records (``Target.write_record``): the ones that decide which
#: cells a row becomes. Connection, batching and retry options only decide how they travel.
SEALED_WRITE_OPTIONS = ("ttl_seconds", "ttl_column", "writetime_micros", "writetime_column",
                        "ignore_nulls")


@dataclass(frozen=True)
class Target:
    config: SinkConfig
    table: TableSchema
    columns: tuple[str, ...]        # DataFrame columns written, in order

    def write_record(self) -> dict:
        """What a batch's seal records of how its rows are written: its columns and the options
        that decide its cells (never a secret). A replay, even by a restarted query whose
        options changed, writes the batch as sealed (:meth:`as_sealed`)."""
        write = self.config.write
        return dict({name: getattr(write, name) for name in SEALED_WRITE_OPTIONS},
                    columns=list(self.columns))

    def as_sealed(self, record: dict | None) -> "Target":
        """This target writing the way a seal's :meth:`write_record` says (itself for seals that
        recorded nothing: they are written with the current options)."""
        if not record:
            return self
        write = replace(self.config.write, **{k: record[k] for k in SEALED_WRITE_OPTIONS})
        return replace(self, config=replace(self.config, write=write),
                       columns=tuple(record["columns"]))

    def to_dict(self) -> dict:
        return {"config": self.config.public_dict(), "table": self.table.to_dict(),
                "columns": list(self.columns)}

    @classmethod
    def from_dict(cls, d: dict) -> "Target":
        c = d["config"]
        conn = dict(c["connection"], hosts=tuple(c["connection"]["hosts"]))
        config = SinkConfig(keyspace=c["keyspace"], table=c["table"],
                            checkpoint_location=c.get("checkpoint_location"),
                            connection=ConnectionConfig(**conn), write=WriteConfig(**c["write"]),
                            wal=WalConfig(**c["wal"]))
        return cls(config, TableSchema.from_dict(d["table"]), tuple(d["columns"]))

    def with_connection(self, **changes) -> "Target":
        """A copy with connection settings replaced (hosts, port, credentials...)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        conn = replace(self.config.connection, **changes)
        return replace(self, config=replace(self.config, connection=conn))

    def with_env_credentials(self) -> "Target":
        """Credentials from ``CASSANDRA_WAL_USERNAME`` / ``CASSANDRA_WAL_PASSWORD`` (and the
        client key's ``CASSANDRA_WAL_KEYSTORE_PASSWORD``) if set."""
        return self.with_connection(username=os.environ.get(ENV_USERNAME),
                                    password=os.environ.get(ENV_PASSWORD),
                                    ssl_keystore_password=os.environ.get(ENV_KEYSTORE_PASSWORD))
