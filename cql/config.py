"""How a write reaches Cassandra and which cells its rows become: the connection and write
configs, frozen and picklable (they travel to executors and flush worker processes).

Built from the user's options by :func:`sinks.options.parse_options`; recorded in the WAL's
``target.json`` by :meth:`public_dict`, which leaves every secret out (secrets are
``field(repr=False)``: they still pickle, since executors need them to connect).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel

MAX_TTL_SECONDS = 630_720_000  # Cassandra's limit: 20 years.


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach the cluster. Secrets are kept out of repr and :meth:`public_dict`."""

    hosts: tuple[str, ...] = ("localhost",)
    port: int = 9042
    local_dc: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    consistency: str = "LOCAL_QUORUM"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    ssl_enabled: bool = False
    ssl_truststore_path: str | None = None
    ssl_keystore_path: str | None = None
    ssl_keystore_password: str | None = field(default=None, repr=False)
    ssl_protocol: str = "TLS"

    SECRET_FIELDS = ("password", "ssl_keystore_password")

    @property
    def consistency_level(self) -> int:
        """The driver's ``cassandra.ConsistencyLevel`` value for :attr:`consistency`."""
        return ConsistencyLevel.name_to_value[self.consistency]

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data without any secret (safe to record in the WAL)."""
        out = public_fields(self, exclude=self.SECRET_FIELDS)
        out["hosts"] = list(self.hosts)
        return out


@dataclass(frozen=True)
class WriteConfig:
    """How rows are written. Defaults equal :data:`OPTION_SPECS` defaults (tested)."""

    concurrent_writes: int = 32
    batch_size_rows: int | None = None
    batch_size_bytes: int | None = None
    batch_grouping_key: str = "replica_set"
    ttl_seconds: int | None = None
    ttl_column: str | None = None
    writetime_micros: int | None = None
    writetime_column: str | None = None
    ignore_nulls: bool = False
    throughput_mb_per_s: float | None = None
    retry_count: int = 10
    group_rows: int = 30000

    def public_dict(self) -> dict[str, Any]:
        return public_fields(self)


def public_fields(obj: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config dataclass's fields as JSON-ready data, without those in ``exclude``."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in exclude}
