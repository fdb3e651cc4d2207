"""Sink options: one table of every accepted name, parsed into frozen, picklable configs.

Why one table: a user moving from the Spark Cassandra Connector (SCC) changes only the format
name and keeps their options, so we must accept SCC's names, refuse the few that would break
"exactly once in effect" with a reason, and say which are accepted but have no effect.
:data:`OPTION_SPECS` is the single source of truth for names, defaults, parsing and docs;
``docs/options.md`` is :func:`options_markdown` verbatim (a unit test keeps them equal;
regenerate with
``python -c "from sinks.options import options_markdown as m; print(m(), end='')" > docs/options.md``).

Matching: Spark lower-cases the keys of a Python data source's options
(``checkpointLocation`` arrives as ``checkpointlocation``), so names match case-insensitively;
errors name the canonical spelling. Session conf keys starting with ``spark.cassandra.`` are
defaults and the write's options override them (SCC semantics). Session conf is shared with
every reader in the session, so unknown ``spark.cassandra.*`` keys there are ignored (with a
warning when they look like a typo of a known name); unknown *options* are an error.

Secrets (passwords) are ``field(repr=False)``, redacted in errors and left out of
``public_dict()``, which is what gets recorded in the write-ahead log. They still pickle:
executors need them to connect.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel

from sinks.errors import OptionError

log = logging.getLogger(__name__)

SCC_PREFIX = "spark.cassandra."
MAX_TTL_SECONDS = 630_720_000  # Cassandra's limit: 20 years.
_MIN_PLAUSIBLE_MICROS = 10**14  # 1973-03-03 in microseconds; smaller values are ms or s.
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_NUMBER_RE = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_SIZE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b)?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_WRITE_CONSISTENCIES = tuple(
    n for n in ConsistencyLevel.name_to_value if n not in ("ANY", "SERIAL", "LOCAL_SERIAL")
)
_MAX_BIGINT = 2**63 - 1  # a write timestamp is sent as a signed 64-bit integer


# ---------------------------------------------------------------- configs


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
        out = _public(self, exclude=self.SECRET_FIELDS)
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
        return _public(self)


@dataclass(frozen=True)
class WalConfig:
    """Our write-ahead-log options (prefix ``wal.``)."""

    path: str | None = None
    retention_batches: int = 10
    retention_seconds: float | None = None
    max_bytes: int = 10 * 2**30
    backpressure: str = "block"
    backpressure_timeout_s: float = 600.0
    flush: bool = True
    flush_mode: str = "driver"
    flush_processes: int = 2

    def public_dict(self) -> dict[str, Any]:
        return _public(self)


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


def _public(obj: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in exclude}


# ---------------------------------------------------------------- value parsers
# Each parser takes the raw string and returns the value, or raises ValueError(reason);
# _parse_one wraps that into an OptionError naming the option (value redacted for secrets).


@dataclass(frozen=True)
class PerRow:
    """Value of the DataFrame options ``ttl`` / ``writetime``: a constant or a column name."""

    constant: int | None = None
    column: str | None = None


def _text(raw: str) -> str:
    return raw


def _nonempty(raw: str) -> str:
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError("expected true or false")


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not _INT_RE.match(raw.strip()):
            raise ValueError("expected a whole number")
        value = int(raw.strip())
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ValueError(f"must be {bound}")
        return value

    return parse


def _positive_float(raw: str) -> float:
    if not _NUMBER_RE.match(raw.strip()):
        raise ValueError("expected a number")
    value = float(raw.strip())
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _millis_as_seconds(raw: str) -> float:
    return _int_in(1)(raw) / 1000.0


def _hosts(raw: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in raw.split(",") if h.strip())
    if not hosts:
        raise ValueError("expected a comma-separated list of host names or addresses")
    return hosts


def _consistency(raw: str) -> str:
    name = raw.strip().upper()
    if name in ("SERIAL", "LOCAL_SERIAL"):
        raise ValueError(f"{name} applies only to lightweight transactions, which this sink never sends")
    if name == "ANY":
        raise ValueError(
            "ANY acknowledges a write that may exist only as a hint on the coordinator, so the "
            "WAL would mark the batch flushed and delete rows it cannot know are stored; use "
            "ONE or stronger (LOCAL_QUORUM, the default)")
    if name not in _WRITE_CONSISTENCIES:
        raise ValueError(f"expected one of {', '.join(_WRITE_CONSISTENCIES)}")
    return name


def _choice(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    aliases = dict(aliases or {})

    def parse(raw: str) -> str:
        lowered = raw.strip().lower()
        lowered = aliases.get(lowered, lowered)
        if lowered not in choices:
            raise ValueError(f"expected one of {', '.join(choices + tuple(aliases))}")
        return lowered

    return parse


def _auto_or_positive(raw: str) -> int | None:
    if raw.strip().lower() == "auto":
        return None
    try:
        return _int_in(1)(raw)
    except ValueError:
        raise ValueError("expected 'auto' or a positive whole number") from None


def _ttl_seconds(raw: str) -> int | None:
    return _int_in(0, MAX_TTL_SECONDS)(raw) or None


def _byte_size(raw: str) -> int:
    match = _SIZE_RE.match(raw.strip())
    if not match:
        raise ValueError("expected a size such as 1048576, 512m or 2g")
    number, unit = match.group(1), match.group(2).lower()
    if not unit and "." in number:
        raise ValueError("a size in bytes must be a whole number")
    size = int(float(number) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError("must be positive")
    return size


def _per_row(constant: Callable[[str], int | None]) -> Callable[[str], PerRow]:
    def parse(raw: str) -> PerRow:
        stripped = raw.strip()
        if _NUMBER_RE.match(stripped):
            return PerRow(constant=constant(stripped))
        if not stripped:
            raise ValueError("expected a whole number or a column name")
        return PerRow(column=stripped)

    return parse


def _writetime_constant(raw: str) -> int:
    value = _int_in(0, _MAX_BIGINT)(raw)
    if value < _MIN_PLAUSIBLE_MICROS:
        raise ValueError(
            "looks like seconds or milliseconds; writetime is microseconds since the epoch "
            "(e.g. 1700000000000000)"
        )
    return value


def _ignored(raw: str) -> None:
    return None


_JKS_REASON = ("Java key stores (JKS/PKCS12) are not readable by Python's ssl; give PEM files "
               "through spark.cassandra.connection.ssl.trustStore.path / keyStore.path")


def _refused(reason: str, *harmless: str) -> Callable[[str], None]:
    """Refuse an option unless it is set to a value that changes nothing (SCC's default)."""

    def parse(raw: str) -> None:
        if raw.strip().lower() in harmless:
            return None
        raise ValueError(reason)

    return parse


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class OptionSpec:
    """One accepted option.

    ``default`` is the raw string a user would type (None: unset). ``target`` is
    ``"section.field"`` in :class:`SinkConfig` (None for ignored/refused options).
    """

    name: str
    default: str | None
    parser: Callable[[str], Any]
    doc: str
    section: str = "Write"
    target: str | None = None
    status: str = "supported"  # supported | ignored | refused
    secret: bool = False
    required: bool = False


def _spec(name: str, default: str | None, parser: Callable[[str], Any], doc: str, **kw: Any) -> OptionSpec:
    return OptionSpec(name, default, parser, doc, **kw)


_LWT_REASON = (
    "IF NOT EXISTS makes every write a lightweight transaction: not idempotent under retry "
    "(a timed-out one has an unknown outcome), and Cassandra refuses the fixed write "
    "timestamps that make replays safe; drop this option"
)
_TIMESTAMP_REASON = (
    "the sink fixes write timestamps per batch so that a replay rewrites the same cells; "
    "use the `writetime` column option for your own timestamps"
)
_CLUSTER_REASON = (
    "multiple clusters are not supported; pass spark.cassandra.connection.* options for the "
    "one to write to"
)

_T, _C, _A, _W, _L, _I, _R = (
    "Table and stream", "Connection", "Authentication and TLS", "Write",
    "Write-ahead log (our own options)", "Accepted and ignored", "Refused",
)

OPTION_SPECS: tuple[OptionSpec, ...] = (
    _spec(
        "keyspace", None, _nonempty,
        "Keyspace of the target table.",
        section=_T, target="sink.keyspace", required=True,
    ),
    _spec(
        "table", None, _nonempty,
        "Target table. It must exist; counter tables are refused.",
        section=_T, target="sink.table", required=True,
    ),
    _spec(
        "checkpointLocation", None, _nonempty,
        "Streaming checkpoint directory; the WAL lives under it unless `wal.path` is set.",
        section=_T, target="sink.checkpoint_location",
    ),
    _spec(
        "path", None, _ignored,
        "Set by Spark from `save(path)` / `start(path)`; not used: name the target with "
        "`keyspace` and `table`.",
        section=_T, status="ignored",
    ),
    _spec(
        "queryName", None, _ignored,
        "Set by Spark from `writeStream.queryName(name)`; not used.",
        section=_T, status="ignored",
    ),
    _spec(
        "ttl", None, _per_row(_ttl_seconds),
        "Per-write TTL: a whole number of seconds (constant, overrides "
        "`spark.cassandra.output.ttl`) or the name of an integer DataFrame column holding "
        "each row's TTL (that column is not written; a null there means the table's "
        "`default_time_to_live`). A TTL counts from the batch's seal, not from each write "
        "(docs/guarantees.md).",
        section=_T, target="write.ttl_per_row",
    ),
    _spec(
        "writetime", None, _per_row(_writetime_constant),
        "Write timestamp: a constant in microseconds since the epoch, or the name of a "
        "DataFrame column (long microseconds, or timestamp) holding each row's (that column "
        "is not written). Unset: timestamps are derived from the batch, so a replay rewrites "
        "the very same cells.",
        section=_T, target="write.writetime_per_row",
    ),
    _spec(
        "spark.cassandra.connection.host", "localhost", _hosts,
        "Comma-separated contact points.",
        section=_C, target="connection.hosts",
    ),
    _spec(
        "spark.cassandra.connection.port", "9042", _int_in(1, 65535),
        "Native protocol port.",
        section=_C, target="connection.port",
    ),
    _spec(
        "spark.cassandra.connection.localDC", None, _nonempty,
        "Local data center for DC-aware load balancing.",
        section=_C, target="connection.local_dc",
    ),
    _spec(
        "spark.cassandra.connection.timeoutMS", "5000", _millis_as_seconds,
        "Connect timeout in milliseconds.",
        section=_C, target="connection.connect_timeout_s",
    ),
    _spec(
        "spark.cassandra.read.timeoutMS", "30000", _millis_as_seconds,
        "Per-request timeout in milliseconds. SCC's 120000 suits long reads; a write that has"
        " not answered in 30 s is better failed and retried (writes are idempotent here) than"
        " waited on.",
        section=_C, target="connection.request_timeout_s",
    ),
    _spec(
        "spark.cassandra.query.retry.count", "10", _int_in(0),
        "Retries of a failed write before the flush fails (it is then retried from the WAL).",
        section=_C, target="write.retry_count",
    ),
    _spec(
        "spark.cassandra.auth.username", None, _text,
        "User name for password authentication.",
        section=_A, target="connection.username",
    ),
    _spec(
        "spark.cassandra.auth.password", None, _text,
        "Password for password authentication.",
        section=_A, target="connection.password", secret=True,
    ),
    _spec(
        "spark.cassandra.connection.ssl.enabled", "false", _bool,
        "Use TLS.",
        section=_A, target="connection.ssl_enabled",
    ),
    _spec(
        "spark.cassandra.connection.ssl.trustStore.path", None, _nonempty,
        "CA certificates as a PEM file (not a JKS trust store: this is Python's ssl).",
        section=_A, target="connection.ssl_truststore_path",
    ),
    _spec(
        "spark.cassandra.connection.ssl.keyStore.path", None, _nonempty,
        "Client certificate and key as a PEM file, for client authentication.",
        section=_A, target="connection.ssl_keystore_path",
    ),
    _spec(
        "spark.cassandra.connection.ssl.keyStore.password", None, _text,
        "Password of the client key.",
        section=_A, target="connection.ssl_keystore_password", secret=True,
    ),
    _spec(
        "spark.cassandra.connection.ssl.protocol", "TLS", _nonempty,
        "TLS protocol name.",
        section=_A, target="connection.ssl_protocol",
    ),
    _spec(
        "spark.cassandra.output.consistency.level", "LOCAL_QUORUM", _consistency,
        "Write consistency level: any `cassandra.ConsistencyLevel` name but SERIAL and "
        "LOCAL_SERIAL (for lightweight transactions only) and ANY (a write acknowledged as a "
        "hint may not be stored, yet its batch would be marked flushed and deleted from the "
        "WAL).",
        target="connection.consistency",
    ),
    _spec(
        "spark.cassandra.output.concurrent.writes", "32", _int_in(1),
        "Requests in flight per flusher. SCC's 5 suits its JVM thread pool; this sink is a "
        "single-threaded async Python client, which needs more requests in flight to keep the"
        " cluster busy.",
        target="write.concurrent_writes",
    ),
    _spec(
        "spark.cassandra.output.batch.size.rows", "auto", _auto_or_positive,
        "Rows per unlogged batch: `auto` (let the writer decide) or a positive number.",
        target="write.batch_size_rows",
    ),
    _spec(
        "spark.cassandra.output.batch.size.bytes", "auto", _auto_or_positive,
        "Largest batch holding several partitions, in bytes as Cassandra counts them against "
        "`batch_size_warn_threshold` (estimated from above: the values, plus 24 bytes a "
        "regular column and 48 a row; a non-frozen collection's bytes count 11 times). `auto`: "
        "the connected node's own `batch_size_warn_threshold` (from `system_views.settings`, "
        "capped by `batch_size_fail_threshold`), or Cassandra's default 5120 where the node "
        "cannot say. Cassandra does not size-check single-partition batches, nor does this "
        "sink.",
        target="write.batch_size_bytes",
    ),
    _spec(
        "spark.cassandra.output.batch.grouping.key", "replica_set",
        _choice("replica_set", "partition", "none"),
        "How rows are grouped into UNLOGGED batches. `replica_set` (the default): rows whose "
        "partitions are owned by the same replicas, up to the node's "
        "`unlogged_batch_across_partitions_warn_threshold` partitions a batch (10 by default); "
        "`partition`: one partition a batch, as the Spark Cassandra Connector's default; "
        "`none`: one statement a row.",
        target="write.batch_grouping_key",
    ),
    _spec(
        "spark.cassandra.output.ttl", "0", _ttl_seconds,
        "TTL in seconds for every written cell, counted from the batch's seal; 0 means none "
        "(then the table's `default_time_to_live` applies, as Cassandra counts it).",
        target="write.ttl_seconds",
    ),
    _spec(
        "spark.cassandra.output.ignoreNulls", "false", _bool,
        "Leave columns unset instead of writing nulls (no tombstones).",
        target="write.ignore_nulls",
    ),
    _spec(
        "spark.cassandra.output.throughputMBPerSec", None, _positive_float,
        "Cap on the bytes written per second by the flusher, in MB (unset: no cap).",
        target="write.throughput_mb_per_s",
    ),
    _spec(
        "wal.path", None, _nonempty,
        "WAL directory. Unset: `<checkpointLocation>/cassandra_wal` for streams, "
        "`~/.cassandra_wal/<keyspace>.<table>` for batch writes. In a cluster: a path every node reaches.",
        section=_L, target="wal.path",
    ),
    _spec(
        "wal.retention.batches", "10", _int_in(0),
        "Newest flushed batches kept (rows in the log, for `cassandra-wal dump`) before retention removes them.",
        section=_L, target="wal.retention_batches",
    ),
    _spec(
        "wal.retention.seconds", None, _positive_float,
        "Also keep flushed batches younger than this many seconds, even beyond the count (unset: by count only).",
        section=_L, target="wal.retention_seconds",
    ),
    _spec(
        "wal.maxBytes", "10g", _byte_size,
        "Cap on the backlog before a batch's commit: segment bytes of earlier batches sealed but "
        "not yet flushed to Cassandra (the batch being committed is not counted, so a batch "
        "larger than the cap still commits once the backlog has drained). Bytes, or with a "
        "k/m/g/t suffix (powers of 1024), e.g. 512m. Over it, the commit applies `wal.backpressure`.",
        section=_L, target="wal.max_bytes",
    ),
    _spec(
        "wal.backpressure", "block", _choice("block", "fail"),
        "When the WAL is full: `block` the batch until flushes make room, or `fail` it.",
        section=_L, target="wal.backpressure",
    ),
    _spec(
        "wal.backpressure.timeoutSeconds", "600", _positive_float,
        "How long `block` waits before failing the batch.",
        section=_L, target="wal.backpressure_timeout_s",
    ),
    _spec(
        "wal.flush", "true", _bool,
        "`false` stages batches without writing them to Cassandra (benchmarks only).",
        section=_L, target="wal.flush",
    ),
    _spec(
        "wal.flush.mode", "driver", _choice("driver", "processes", "executors"),
        "Who writes a committed batch's rows to Cassandra. `driver`: the flusher in the driver"
        " process, chunk by chunk (one Python process writes every row). `processes`: "
        "`wal.flush.processes` worker processes on the driver's machine, each writing whole "
        "sealed segments from the WAL folder with a session of its own (several GILs, no Spark "
        "job). `executors`: the "
        "flusher runs a Spark job with one task per sealed segment; the tasks read their "
        "segments from the WAL folder (which every node must mount at the same path) and "
        "upsert them at the sealed timestamps. In every mode the driver marks the batch "
        "flushed once every segment is acknowledged, and batches stay strictly in order. "
        "Recovery at query start, batch writes and `cassandra-wal recover` always use `driver`.",
        section=_L, target="wal.flush_mode",
    ),
    _spec(
        "wal.flush.processes", "2", _int_in(1, 64),
        "With `wal.flush.mode=processes`: how many worker processes write a batch's segments "
        "(a batch has one segment per Spark task, so more processes than tasks add nothing).",
        section=_L, target="wal.flush_processes",
    ),
    _spec(
        "wal.flush.groupRows", "30000", _int_in(1, 1_000_000),
        "Rows the flusher groups together into requests: a batch's consecutive chunks "
        "(Spark's Arrow batches, 10,000 rows by default) are gathered up to this many rows, so "
        "that a partition's rows from several chunks share one request. Higher: fewer, fuller "
        "requests and less work for the nodes; more flusher memory (about 1 KB a row while "
        "grouped, twice over while one group is in flight and the next is built). 1: each "
        "chunk on its own.",
        section=_L, target="write.group_rows",
    ),
    _spec(
        "spark.cassandra.output.batch.grouping.buffer.size", None, _ignored,
        "Rows are grouped over `wal.flush.groupRows` rows of a batch instead.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.output.metrics", None, _ignored,
        "SCC's JVM task metrics do not exist for a Python data source.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.keepAliveMS", None, _ignored,
        "The driver's idle heartbeat keeps connections alive.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.compression", None, _ignored,
        "The Python driver negotiates compression itself.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.reconnectionDelayMS.min", None, _ignored,
        "The driver's reconnection policy applies.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.reconnectionDelayMS.max", None, _ignored,
        "The driver's reconnection policy applies.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.output.ifNotExists", None, _refused(_LWT_REASON, "false"),
        "`false` only. IF NOT EXISTS is a lightweight transaction: not idempotent under "
        "retry, and incompatible with the fixed write timestamps that make replays safe.",
        section=_R, status="refused",
    ),
    _spec(
        "spark.cassandra.output.timestamp", None, _refused(_TIMESTAMP_REASON, "0"),
        "`0` only. Use the `writetime` option.",
        section=_R, status="refused",
    ),
    _spec(
        "cluster", None, _refused(_CLUSTER_REASON, "default"),
        "`default` only.",
        section=_R, status="refused",
    ),
    _spec(
        "confirm.truncate", None, _refused("this sink never truncates a table; it only appends", "false"),
        "`false` only.",
        section=_R, status="refused",
    ),
) + tuple(
    _spec(
        name, None, _refused(_JKS_REASON, *harmless), f"{detail} Convert Java key stores to PEM "
        "(see the user guide, Security) and use the `.path` options.",
        section=_R, status="refused", secret="password" in name,
    )
    for name, harmless, detail in (
        ("spark.cassandra.connection.ssl.trustStore.password", (), "Not needed for PEM files."),
        ("spark.cassandra.connection.ssl.trustStore.type", ("pem",), "`PEM` only."),
        ("spark.cassandra.connection.ssl.keyStore.type", ("pem",), "`PEM` only."),
    )
)

_BY_KEY: dict[str, OptionSpec] = {spec.name.lower(): spec for spec in OPTION_SPECS}
KNOWN_NAMES: tuple[str, ...] = tuple(spec.name for spec in OPTION_SPECS)


# ---------------------------------------------------------------- parsing


def parse_options(options: Mapping[str, str], session_conf: Mapping[str, str] | None = None) -> SinkConfig:
    """Parse a write's options (with session conf defaults) into a :class:`SinkConfig`.

    ``session_conf`` keys starting with ``spark.cassandra.`` are defaults; ``options``
    override them. Raises :class:`OptionError` naming the option for anything unknown,
    malformed, missing or refused.
    """
    raw = _collect(session_conf or {}, from_session=True)
    raw.update(_collect(options, from_session=False))
    sections: dict[str, dict[str, Any]] = {"sink": {}, "connection": {}, "write": {}, "wal": {}}
    for spec in OPTION_SPECS:
        if spec.name in raw:
            value = _parse_one(spec, raw[spec.name])
        elif spec.required:
            raise OptionError(spec.name, None, f"required: {spec.doc}")
        else:
            value = None if spec.default is None else _parse_one(spec, spec.default)
        if spec.target is not None:
            section, name = spec.target.split(".")
            sections[section][name] = value
    write = sections["write"]
    ttl, writetime = write.pop("ttl_per_row"), write.pop("writetime_per_row")
    if ttl is not None:
        write["ttl_seconds"], write["ttl_column"] = ttl.constant, ttl.column
    if writetime is not None:
        write["writetime_micros"], write["writetime_column"] = writetime.constant, writetime.column
    return SinkConfig(
        **sections["sink"],
        connection=ConnectionConfig(**sections["connection"]),
        write=WriteConfig(**write),
        wal=WalConfig(**sections["wal"]),
    )


def _collect(mapping: Mapping[str, Any], *, from_session: bool) -> dict[str, str]:
    """Map one source's keys to canonical names; reject unknown options and case clashes."""
    found: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key, value in mapping.items():
        key = str(key)
        lowered = key.lower()
        if from_session and not lowered.startswith(SCC_PREFIX):
            continue
        spec = _BY_KEY.get(lowered)
        if spec is None:
            if not from_session:
                raise OptionError.unknown(key, KNOWN_NAMES)
            _warn_unknown_session_key(key)
            continue
        text = "" if value is None else str(value)
        if spec.name in found and found[spec.name] != text:
            raise OptionError(spec.name, None, f"given twice with different values (as {given_as[spec.name]!r} and {key!r})")
        found[spec.name], given_as[spec.name] = text, key
    return found


def _warn_unknown_session_key(key: str) -> None:
    suggestion = OptionError.unknown(key, KNOWN_NAMES)
    if "did you mean" in suggestion.reason:
        log.warning("session conf %s is ignored by the Cassandra WAL sink: %s", key, suggestion.reason)


def _parse_one(spec: OptionSpec, raw: str) -> Any:
    try:
        return spec.parser(raw)
    except ValueError as exc:
        raise OptionError(spec.name, raw, str(exc)) from None


# ---------------------------------------------------------------- docs

_INTRO = """\
# Options

<!-- Generated from sinks/options.py (OPTION_SPECS); do not edit by hand.
     Regenerate: python -c "from sinks.options import options_markdown as m; print(m(), end='')" > docs/options.md -->

Pass options with `.option(name, value)` on the writer. Names are matched case-insensitively
(Spark lower-cases them); errors name the spelling shown here. Any `spark.cassandra.*` name
can also be set in the Spark session conf: it is then the default, and a write's option
overrides it, as in the Spark Cassandra Connector (SCC). Unknown options are an error;
unknown `spark.cassandra.*` session conf keys are ignored, since the session conf is shared
with readers. Secret values are never shown in errors, logs or the write-ahead log.
"""


def options_markdown() -> str:
    """Render :data:`OPTION_SPECS` as the Markdown page ``docs/options.md``."""
    lines = [_INTRO.rstrip("\n")]
    sections: list[str] = []
    for spec in OPTION_SPECS:
        if spec.section not in sections:
            sections.append(spec.section)
    for section in sections:
        lines += ["", f"## {section}", "", "| Option | Default | Description |", "|---|---|---|"]
        for spec in (s for s in OPTION_SPECS if s.section == section):
            default = "required" if spec.required else ("—" if spec.default is None else f"`{spec.default}`")
            doc = spec.doc + (" Secret: never shown or recorded." if spec.secret else "")
            lines.append(f"| `{spec.name}` | {default} | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"

