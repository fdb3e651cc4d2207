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


@dataclass(frozen=True)
class Target:
    config: SinkConfig
    table: TableSchema
    columns: tuple[str, ...]        # DataFrame columns written, in order

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
