"""Everything one write needs, as the sink parsed it and the WAL records it: the keyspace and
table, the checkpoint, and the connection, write and WAL configs.

Built from the user's options by :func:`sinks.worker.options.parse_options`; recorded without
secrets in ``target.json`` (:class:`recovery.target.Target`), from which every flush and recovery works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recovery.cql.config import ConnectionConfig, WriteConfig, public_fields


@dataclass(frozen=True)
class WalConfig:
    """Our write-ahead-log options (prefix ``wal.``). Each field's default is its option's
    (the option table reads it from here: :func:`sinks.worker.options.config_default`)."""

    path: str | None = None
    retention_batches: int = 10
    retention_seconds: float | None = None
    max_bytes: int = 10 * 2**30
    backpressure: str = "block"
    backpressure_timeout_s: float = 600.0
    flush: bool = True
    flush_mode: str = "auto"
    flush_processes: int = 2
    # the driver's Prometheus endpoint (sinks.driver.metrics_endpoint)
    metrics_port: int | None = None
    # the completeness marker's table (recovery.marker), and whether the sink creates it
    marker_table: str | None = None
    marker_create: bool = False

    def public_dict(self) -> dict[str, Any]:
        """The fields for ``target.json``; the marker's only when set (a release before it
        still reads the target of a stream without one)."""
        return public_fields(self, () if self.marker_table else ("marker_table", "marker_create"))

    def worker_processes(self) -> int:
        """How many worker processes write this WAL's batches where no Spark job can start (a
        batch job's commit, ``cassandra-wal recover``): ``flush_processes`` in ``processes``
        mode; 0, this process, in any other."""
        return self.flush_processes if self.flush_mode == "processes" else 0


@dataclass(frozen=True)
class SinkConfig:
    """Everything one write needs; built by :func:`parse_options`."""

    keyspace: str
    table: str
    checkpoint_location: str | None = None
    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    wal: WalConfig = field(default_factory=WalConfig)

    def public_dict(self) -> dict[str, Any]:
        """JSON-ready, secret-free view of the whole config (recorded in the WAL)."""
        return {
            "keyspace": self.keyspace,
            "table": self.table,
            "checkpoint_location": self.checkpoint_location,
            "connection": self.connection.public_dict(),
            "write": self.write.public_dict(),
            "wal": self.wal.public_dict(),
        }
