"""How a write reaches Cassandra and which cells its rows become: the connection and write
configs, frozen and picklable (they travel to executors and flush worker processes).

Built from the user's options by :func:`sinks.worker.options.parse_options`; recorded in the WAL's
``target.json`` by :meth:`public_dict`, which leaves every secret out (a field
:func:`~wal.secrets.is_secret` names, left out of the repr too: secrets still pickle,
since executors need them to connect).

The field defaults here are the options' defaults, written nowhere else: the option table
(:data:`sinks.worker.options.OPTION_SPECS`, a floor above) reads them, and shows them in
``docs/options.md`` as a user would type them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from cassandra import ConsistencyLevel

from wal.secrets import is_secret, repr_without_secrets, shown_fields

MAX_TTL_SECONDS = 630_720_000  # Cassandra's limit: 20 years.

#: ``spark.cassandra.connection.ssl.protocol`` values we can honour, each as the lowest and
#: highest ``ssl.TLSVersion`` member name. As in SCC (Java's ``SSLContext.getInstance``), the
#: name is the *highest* version offered: ``TLSv1.3`` still talks to a node that speaks only
#: 1.2, ``TLSv1.2`` never offers 1.3. 1.2 is the minimum throughout: Java disables 1.0 and 1.1 by
#: default (RFC 8996), and so does Python's ssl. Names are kept as strings so that this module
#: does not import ssl (:mod:`recovery.cql.connection` does, on first use).
TLS_PROTOCOLS: dict[str, tuple[str, str]] = {
    "TLS": ("TLSv1_2", "MAXIMUM_SUPPORTED"),
    "TLSv1.2": ("TLSv1_2", "TLSv1_2"),
    "TLSv1.3": ("TLSv1_2", "TLSv1_3"),
}
_OLD_TLS = ("ssl", "sslv2", "sslv3", "tlsv1", "tlsv1.1")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_BRACKETED_RE = re.compile(r"^\[([^\]]*)\](?::(.*))?$")


def tls_protocol(name: str) -> str:
    """The canonical spelling of an accepted TLS protocol name (matched ignoring case);
    ``ValueError`` naming what is accepted otherwise."""
    stripped = name.strip()
    for known in TLS_PROTOCOLS:
        if known.lower() == stripped.lower():
            return known
    if stripped.lower() in _OLD_TLS:
        raise ValueError(
            f"{stripped} is older than TLS 1.2, which Python's ssl refuses (RFC 8996 deprecates "
            f"it); use one of {', '.join(TLS_PROTOCOLS)}")
    raise ValueError(f"expected one of {', '.join(TLS_PROTOCOLS)}")


def contact_point(entry: str) -> tuple[str, int | None]:
    """One ``spark.cassandra.connection.host`` entry as ``(host, port)``; port None when the
    entry has none (``spark.cassandra.connection.port`` applies). ``ValueError`` if malformed.

    Forms: ``host``, ``host:port``, ``[ipv6]``, ``[ipv6]:port``, and a bare IPv6 address
    (``::1``: more than one colon and no brackets is an address without a port, so a port
    after an IPv6 address needs the brackets)."""
    entry = entry.strip()
    bracketed = _BRACKETED_RE.match(entry)
    if bracketed:
        host, port = bracketed.group(1).strip(), bracketed.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"{entry!r}: brackets hold an IPv6 address, {host!r} is not one") from None
    elif entry.startswith("[") or "]" in entry:
        raise ValueError(f"{entry!r}: unbalanced brackets (IPv6 with a port: [::1]:9042)")
    elif entry.count(":") > 1:
        try:
            ipaddress.IPv6Address(entry)
        except ValueError:
            raise ValueError(f"{entry!r} is neither host:port nor an IPv6 address "
                             "(IPv6 with a port: [::1]:9042)") from None
        return entry, None
    elif ":" in entry:
        host, port = (part.strip() for part in entry.split(":"))
    else:
        host, port = entry, None
    if not host:
        raise ValueError(f"{entry!r}: empty host before the port")
    if port is None:
        return host, None
    if not _PORT_RE.match(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a whole number between 1 and 65535")
    return host, int(port)


def format_contact_point(host: str, port: int | None) -> str:
    """The canonical spelling of a contact point (inverse of :func:`contact_point`)."""
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach the cluster. Secrets are kept out of repr and :meth:`public_dict`. Each
    field's default is its option's (:func:`sinks.worker.options.config_default`)."""

    hosts: tuple[str, ...] = ("localhost",)
    port: int = 9042
    local_dc: str | None = None
    username: str | None = None
    password: str | None = None
    consistency: str = "LOCAL_QUORUM"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    ssl_enabled: bool = False
    ssl_truststore_path: str | None = None
    ssl_keystore_path: str | None = None
    ssl_keystore_password: str | None = None
    ssl_protocol: str = "TLS"
    cloud_bundle_path: str | None = None  # a secure connect bundle; then hosts and TLS come from it

    @property
    def consistency_level(self) -> int:
        """cassandra-driver's ``cassandra.ConsistencyLevel`` value for :attr:`consistency`."""
        return ConsistencyLevel.name_to_value[self.consistency]

    @property
    def contact_points(self) -> list:
        """cassandra-driver's ``Cluster(contact_points=...)``: a host alone (cassandra-driver adds
        :attr:`port`) or ``(host, port)`` for an entry with a port of its own."""
        points = (contact_point(entry) for entry in self.hosts)
        return [host if port is None else (host, port) for host, port in points]

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data without any secret (safe to record in the WAL)."""
        out = public_fields(self)
        out["hosts"] = list(self.hosts)
        return out

    def secrets(self) -> tuple[str, ...]:
        """The secrets set (what connecting takes, and no message may show)."""
        return tuple(value for f in dataclasses.fields(self)
                     if is_secret(f.name) and (value := getattr(self, f.name)))

    __repr__ = repr_without_secrets


@dataclass(frozen=True)
class WriteConfig:
    """How rows are written. Each field's default is its option's (the option table reads it
    from here: :func:`sinks.worker.options.config_default`)."""

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
    #: Non-frozen list columns written at least once (``wal.lists.atLeastOnce``): a replay
    #: of a row appends its elements again (:attr:`recovery.cql.table.CqlType.is_non_frozen_list`).
    lists_at_least_once: tuple[str, ...] = ()
    #: A change stream (``op.*``, :mod:`recovery.cql.changes`): the DataFrame column holding each row's
    #: operation (never written as a cell; None: every row is an upsert) and the values that
    #: make a row an upsert, a row delete or a partition delete.
    op_column: str | None = None
    upsert_values: tuple[str, ...] = ("c", "u", "r")
    delete_values: tuple[str, ...] = ("d",)
    partition_delete_values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A tuple however it was given (a JSON list from target.json or a seal; None: unset).
        for name in _TUPLE_FIELDS:
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))

    def public_dict(self) -> dict[str, Any]:
        """The fields for ``target.json``; a change stream's only when it is one, so that a
        release before change streams still reads the target of a stream that is none."""
        exclude = () if self.op_column else _CHANGE_STREAM_FIELDS
        return public_fields(self, exclude)


_CHANGE_STREAM_FIELDS = ("op_column", "upsert_values", "delete_values",
                         "partition_delete_values")
_TUPLE_FIELDS = ("lists_at_least_once", "upsert_values", "delete_values",
                 "partition_delete_values")


def public_fields(obj: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config dataclass's fields as JSON-ready data, without its secrets
    (:func:`~wal.secrets.is_secret`) or those in ``exclude``."""
    return {name: value for name, value in shown_fields(obj).items() if name not in exclude}
