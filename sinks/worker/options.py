"""Sink options: one table of every accepted name, parsed into frozen, picklable configs.

Why one table: a user moving from the Spark Cassandra Connector (SCC) changes only the format
name and keeps their options, so we must accept SCC's names, refuse the few that would break
"exactly once in effect" with a reason, and say which are accepted but have no effect.
:data:`OPTION_SPECS` is the single source of truth for names, parsing and docs;
``docs/options.md`` is rendered from it by :mod:`sinks.worker.options_doc` (a unit test keeps them
equal).

Defaults: written once, as the config dataclasses' field defaults (:class:`SinkConfig` and
its parts, in :mod:`recovery`, which cannot read this table: it sits below). An option's
``default`` is that field's default as a user would type it (``OptionSpec.shown``), and an
option not given leaves the field at its default.

Matching: Spark lower-cases the keys of a Python data source's options
(``checkpointLocation`` arrives as ``checkpointlocation``), so names match case-insensitively;
errors name the canonical spelling. Session conf keys starting with ``spark.cassandra.`` are
defaults and the write's options override them (SCC semantics). Session conf is shared with
every reader in the session, so unknown ``spark.cassandra.*`` keys there are ignored (with a
warning when they look like a typo of a known name); unknown *options* are an error.

Old spellings: SCC still accepts the names it deprecated (``throughput_mb_per_sec`` for
``throughputMBPerSec`` ...), rewriting them to the new name with a warning; so do we
(``OptionSpec.old_names``, taken from SCC's ``DeprecatedConfigParameter`` list). One source
giving both spellings different values is an error (SCC would let the old one win silently).

Secrets (passwords): which options and config fields are secret is one rule,
:func:`wal.secrets.is_secret`; their values are redacted in errors, left out of the
configs' repr and of ``public_dict()``, which is what gets recorded in the write-ahead log.
They still pickle: executors need them to connect.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from recovery.config import SinkConfig, WalConfig
from recovery.cql import credentials
from recovery.cql.config import ConnectionConfig, WriteConfig
from recovery.cql.errors import OptionError
from wal.secrets import is_secret

from . import option_values as values

log = logging.getLogger(__name__)

SCC_PREFIX = "spark.cassandra."


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class OptionSpec:
    """One accepted option.

    ``target`` is ``"section.field"`` in :class:`SinkConfig` (None for ignored/refused
    options). ``old_names``: spellings SCC deprecated but still accepts for this option.
    ``default`` is not given but read: the target field's default as the raw string a user
    would type (None: unset), which ``shown`` (the parser's inverse) spells.
    """

    name: str
    parser: Callable[[str], Any]
    doc: str
    section: str = "Write"
    target: str | None = None
    status: str = "supported"  # supported | ignored | refused
    old_names: tuple[str, ...] = ()
    shown: Callable[[Any], str | None] = values.shown
    default: str | None = dataclasses.field(init=False)
    #: Read, not given: the target field has no default (``keyspace``, ``table``).
    required: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        field = None if self.target is None else _config_field(self.target)
        object.__setattr__(self, "required", field is not None and _has_no_default(field))
        default = None if self.target is None else self.shown(config_default(self.target))
        object.__setattr__(self, "default", default)

    @property
    def secret(self) -> bool:
        """Whether the value is never shown or recorded (:func:`is_secret`, the one rule)."""
        return is_secret(self.name)


def _spec(name: str, parser: Callable[[str], Any], doc: str, **kw: Any) -> OptionSpec:
    old = kw.get("old_names", ())
    if old:
        doc += (f" SCC's old spelling {', '.join(f'`{n}`' for n in old)} is accepted too, with a "
                "warning.")
    return OptionSpec(name, parser, doc, **kw)


def _credential(field: str, parser: Callable[[str], Any], doc: str, **kw: Any) -> OptionSpec:
    """The option giving a credential: named by the credential table
    (:data:`recovery.cql.credentials.CREDENTIALS`), which the driver's flusher reads the session
    conf with, so that the name is written once."""
    return _spec(credentials.OPTION_OF[field], parser, doc, section=_A,
                 target=f"connection.{field}", **kw)


#: The config dataclass of each section of an option's ``target``.
CONFIGS: dict[str, type] = {"sink": SinkConfig, "connection": ConnectionConfig,
                            "write": WriteConfig, "wal": WalConfig}
#: The targets of the options of a constant or a column (``ttl``, ``writetime``): each sets
#: two :class:`WriteConfig` fields, the constant's and the column's.
PER_ROW_TARGETS = {"ttl_per_row": ("ttl_seconds", "ttl_column"),
                   "writetime_per_row": ("writetime_micros", "writetime_column")}


def config_default(target: str) -> Any:
    """The default of the config field an option's ``target`` names (None for a required
    field, which has none): the one place a default is written. A per-row option's is its
    constant's."""
    found = _config_field(target)
    if found.default is not dataclasses.MISSING:
        return found.default
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return None


def _config_field(target: str) -> dataclasses.Field:
    section, name = target.split(".")
    name = PER_ROW_TARGETS.get(name, (name,))[0] if section == "write" else name
    return {f.name: f for f in dataclasses.fields(CONFIGS[section])}[name]


def _has_no_default(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


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

#: Our opt-in for non-frozen list columns (named by
#: :func:`sinks.worker.validation.validate_schema`).
LISTS_AT_LEAST_ONCE = "wal.lists.atLeastOnce"
#: A change stream's options of values (``op.column``'s), each with the WriteConfig field it
#: sets, in the order of :mod:`recovery.cql.changes`' operations: upsert, row delete, partition delete.
OPERATION_VALUES = (("op.upsertValues", "upsert_values"), ("op.deleteValues", "delete_values"),
                    ("op.partitionDeleteValues", "partition_delete_values"))


def operation_values(write: WriteConfig) -> list[tuple[str, tuple[str, ...]]]:
    """Each of a change stream's options of values, with the values ``write`` has for it."""
    return [(option, getattr(write, field)) for option, field in OPERATION_VALUES]

_T, _C, _A, _W, _L, _I, _R = (
    "Table and stream", "Connection", "Authentication and TLS", "Write",
    "Write-ahead log (our own options)", "Accepted and ignored", "Refused",
)

OPTION_SPECS: tuple[OptionSpec, ...] = (
    _spec(
        "keyspace", values.nonempty,
        "Keyspace of the target table.",
        section=_T, target="sink.keyspace",
    ),
    _spec(
        "table", values.nonempty,
        "Target table. It must exist; counter tables are refused.",
        section=_T, target="sink.table",
    ),
    _spec(
        "checkpointLocation", values.nonempty,
        "Streaming checkpoint directory; the WAL lives under it unless `wal.path` is set.",
        section=_T, target="sink.checkpoint_location",
    ),
    _spec(
        "path", values.ignored,
        "Set by Spark from `save(path)` / `start(path)`; not used: name the target with "
        "`keyspace` and `table`.",
        section=_T, status="ignored",
    ),
    _spec(
        "queryName", values.ignored,
        "Set by Spark from `writeStream.queryName(name)`; not used.",
        section=_T, status="ignored",
    ),
    _spec(
        "ttl", values.per_row(values.ttl_seconds),
        "Per-write TTL: a whole number of seconds (constant, overrides "
        "`spark.cassandra.output.ttl`) or the name of an integer DataFrame column holding "
        "each row's TTL (that column is not written; a null there means the table's "
        "`default_time_to_live`). A TTL counts from the batch's seal, not from each write "
        "(docs/guarantees.md).",
        section=_T, target="write.ttl_per_row",
    ),
    _spec(
        "writetime", values.per_row(values.writetime_constant),
        "Write timestamp: a constant in microseconds since the epoch, or the name of a "
        "DataFrame column (long microseconds, or timestamp) holding each row's (that column "
        "is not written). Unset: timestamps are derived from the batch, so a replay rewrites "
        "the very same cells.",
        section=_T, target="write.writetime_per_row",
    ),
    _spec(
        "op.column", values.nonempty,
        "A change stream: the name of a string (or boolean) DataFrame column holding each "
        "row's operation, one of the values below (that column is not written). A delete is "
        "written as a tombstone at the row's sealed timestamp, as an upsert is, so a replay "
        "applies it again; within a batch the sealed order is Spark's partitioning, not the "
        "source's: keep a key's changes in one partition (a batch with a key in two tasks is "
        "refused at its commit, naming the key), or give `writetime` a column in source "
        "order (docs/user-guide.md, 'Change streams'). Unset: every row is an upsert.",
        section=_T, target="write.op_column",
    ),
    _spec(
        "op.upsertValues", values.operation_values,
        "With `op.column`: the values that make a row an insert or update, comma-separated "
        "(Debezium's create, update and snapshot read by default).",
        section=_T, target="write.upsert_values",
    ),
    _spec(
        "op.deleteValues", values.operation_values,
        "With `op.column`: the values that make a row a delete of its row; it needs the whole "
        "primary key (its other columns are not written, though checked as an upsert's). A "
        "boolean `op.column` takes `true` and `false`.",
        section=_T, target="write.delete_values",
    ),
    _spec(
        "op.partitionDeleteValues", values.operation_values,
        "With `op.column`: the values that make a row a delete of its whole partition (every "
        "row of its partition key, whatever its clustering columns). None by default: a "
        "partition is only ever deleted by a value named here, never because clustering "
        "columns are null.",
        section=_T, target="write.partition_delete_values",
    ),
    _spec(
        "spark.cassandra.connection.host", values.hosts,
        "Comma-separated contact points, each `host` or `host:port` (a port of its own, as in "
        "SCC; otherwise `spark.cassandra.connection.port`). IPv6: `[::1]:9042`, or `::1` "
        "without a port (a port after an IPv6 address needs the brackets).",
        section=_C, target="connection.hosts",
    ),
    _spec(
        "spark.cassandra.connection.port", values.int_in(1, 65535),
        "Native protocol port of the contact points that do not name their own.",
        section=_C, target="connection.port",
    ),
    _spec(
        "spark.cassandra.connection.localDC", values.nonempty,
        "Local data center for DC-aware load balancing.",
        section=_C, target="connection.local_dc",
        old_names=("spark.cassandra.connection.local_dc",),
    ),
    _spec(
        "spark.cassandra.connection.timeoutMS", values.millis_as_seconds,
        "Connect timeout in milliseconds.",
        section=_C, target="connection.connect_timeout_s", shown=values.shown_millis,
        old_names=("spark.cassandra.connection.timeout_ms",),
    ),
    _spec(
        "spark.cassandra.read.timeoutMS", values.millis_as_seconds,
        "Per-request timeout in milliseconds. SCC's 120000 suits long reads; a write that has"
        " not answered in 30 s is better failed and retried (writes are idempotent here) than"
        " waited on.",
        section=_C, target="connection.request_timeout_s", shown=values.shown_millis,
        old_names=("spark.cassandra.read.timeout_ms",),
    ),
    _spec(
        "spark.cassandra.connection.config.cloud.path", values.cloud_bundle,
        "Secure connect bundle (a zip) of a cloud database, handed to cassandra-driver "
        "(`Cluster(cloud={'secure_connect_bundle': path})`): the bundle names the nodes and "
        "brings its own TLS, so `connection.host`, `connection.port` and the `ssl.*` options "
        "are refused beside it; credentials still come from `spark.cassandra.auth.*` (or the "
        "bundle). An absolute local path that every node reads at the same place: SCC's URLs and"
        " `spark.files` names are refused. Tested on the arguments built only: no cloud service "
        "was reachable to test it end to end.",
        section=_C, target="connection.cloud_bundle_path",
    ),
    _spec(
        "spark.cassandra.query.retry.count", values.int_in(0),
        "Retries of a failed write before the flush fails (it is then retried from the WAL).",
        section=_C, target="write.retry_count",
    ),
    _credential("username", values.text, "User name for password authentication."),
    _credential("password", values.text, "Password for password authentication."),
    _spec(
        "spark.cassandra.connection.ssl.enabled", values.boolean,
        "Use TLS.",
        section=_A, target="connection.ssl_enabled",
    ),
    _spec(
        "spark.cassandra.connection.ssl.trustStore.path", values.nonempty,
        "CA certificates as a PEM file (not a JKS trust store: this is Python's ssl).",
        section=_A, target="connection.ssl_truststore_path",
    ),
    _spec(
        "spark.cassandra.connection.ssl.keyStore.path", values.nonempty,
        "Client certificate and key as a PEM file, for client authentication.",
        section=_A, target="connection.ssl_keystore_path",
    ),
    _credential("ssl_keystore_password", values.text, "Password of the client key."),
    _spec(
        "spark.cassandra.connection.ssl.protocol", values.ssl_protocol,
        "Highest TLS version offered, as in SCC (Java's protocol names): `TLS` (any, at least "
        "1.2), `TLSv1.3` (1.2 or 1.3), `TLSv1.2` (1.2 only). 1.2 is the minimum throughout, as "
        "in current JDKs: `TLSv1`, `TLSv1.1` and `SSL*` are refused (deprecated by RFC 8996), "
        "whether TLS is enabled or not.",
        section=_A, target="connection.ssl_protocol",
    ),
    _spec(
        "spark.cassandra.output.consistency.level", values.consistency,
        "Write consistency level: any `cassandra.ConsistencyLevel` name but SERIAL and "
        "LOCAL_SERIAL (for lightweight transactions only) and ANY (a write acknowledged as a "
        "hint may not be stored, yet its batch would be marked flushed and deleted from the "
        "WAL).",
        target="connection.consistency",
    ),
    _spec(
        "spark.cassandra.output.concurrent.writes", values.int_in(1),
        "Requests in flight per flusher. SCC's 5 suits its JVM thread pool; this sink is a "
        "single-threaded async Python client, which needs more requests in flight to keep the"
        " cluster busy.",
        target="write.concurrent_writes",
    ),
    _spec(
        "spark.cassandra.output.batch.size.rows", values.auto_or_positive,
        "Rows per unlogged batch: `auto` (let the writer decide) or a positive number.",
        target="write.batch_size_rows", shown=values.shown_auto,
    ),
    _spec(
        "spark.cassandra.output.batch.size.bytes", values.auto_or_positive,
        "Largest batch holding several partitions, in bytes as Cassandra counts them against "
        "`batch_size_warn_threshold` (estimated from above: the values, plus 24 bytes a "
        "regular column and 48 a row; a non-frozen collection's bytes count 11 times). `auto`: "
        "the connected node's own `batch_size_warn_threshold` (from `system_views.settings`, "
        "capped by `batch_size_fail_threshold`), or Cassandra's default 5120 where the node "
        "cannot say. Cassandra does not size-check single-partition batches, nor does this "
        "sink.",
        target="write.batch_size_bytes", shown=values.shown_auto,
    ),
    _spec(
        "spark.cassandra.output.batch.grouping.key",
        values.choice("replica_set", "partition", "none"),
        "How rows are grouped into UNLOGGED batches. `replica_set` (the default): rows whose "
        "partitions are owned by the same replicas, up to the node's "
        "`unlogged_batch_across_partitions_warn_threshold` partitions a batch (10 by default); "
        "`partition`: one partition a batch, as the Spark Cassandra Connector's default; "
        "`none`: one statement a row.",
        target="write.batch_grouping_key",
    ),
    _spec(
        "spark.cassandra.output.ttl", values.ttl_seconds,
        "TTL in seconds for every written cell, counted from the batch's seal; 0 means none "
        "(then the table's `default_time_to_live` applies, as Cassandra counts it).",
        target="write.ttl_seconds", shown=values.shown_ttl,
    ),
    _spec(
        "spark.cassandra.output.ignoreNulls", values.boolean,
        "Leave columns unset instead of writing nulls (no tombstones).",
        target="write.ignore_nulls",
    ),
    _spec(
        "spark.cassandra.output.throughputMBPerSec", values.positive_float,
        "Cap on the bytes written per second by the flusher, in MB (unset: no cap).",
        target="write.throughput_mb_per_s",
        old_names=("spark.cassandra.output.throughput_mb_per_sec",),
    ),
    _spec(
        "wal.path", values.nonempty,
        "WAL directory. Unset: `<checkpointLocation>/cassandra_wal` for streams (a `foreachBatch` "
        "writer's: `<checkpointLocation>/cassandra_wal.<keyspace>.<table>`, one WAL a table), "
        "`~/.cassandra_wal/<keyspace>.<table>` for batch writes. In a cluster: a path every node "
        "reaches. Changed between runs of a stream, the WAL moves: refused while the old one holds "
        "committed batches not written yet (docs/runbook.md, 'Moving a query's WAL').",
        section=_L, target="wal.path",
    ),
    _spec(
        "wal.retention.batches", values.int_in(0),
        "Newest flushed batches kept (rows in the log, for `cassandra-wal dump`; in the scale-out flush modes their records and seals only, the rows were never copied) before retention removes them.",
        section=_L, target="wal.retention_batches",
    ),
    _spec(
        "wal.retention.seconds", values.positive_float,
        "Also keep flushed batches younger than this many seconds, even beyond the count (unset: by count only).",
        section=_L, target="wal.retention_seconds",
    ),
    _spec(
        "wal.maxBytes", values.byte_size,
        "Cap on the backlog before a batch's commit: segment bytes of earlier batches sealed but "
        "not yet flushed to Cassandra (the batch being committed is not counted, so a batch "
        "larger than the cap still commits once the backlog has drained). Bytes, or with a "
        "k/m/g/t suffix (powers of 1024), e.g. 512m. Over it, the commit applies `wal.backpressure`.",
        section=_L, target="wal.max_bytes", shown=values.shown_size,
    ),
    _spec(
        "wal.backpressure", values.choice("block", "fail"),
        "When the WAL is full: `block` the batch until flushes make room, or `fail` it.",
        section=_L, target="wal.backpressure",
    ),
    _spec(
        "wal.backpressure.timeoutSeconds", values.positive_float,
        "How long `block` waits before failing the batch.",
        section=_L, target="wal.backpressure_timeout_s",
    ),
    _spec(
        "wal.flush", values.boolean,
        "`false` stages batches without writing them to Cassandra (benchmarks only).",
        section=_L, target="wal.flush",
    ),
    _spec(
        "wal.flush.mode", values.choice("auto", "driver", "processes", "executors"),
        "Who writes a committed batch's rows to Cassandra. `auto` (the default): `executors` "
        "when Spark runs executors apart from the driver (a cluster manager's master or "
        "`local-cluster`; through Spark Connect, the server's) or the WAL is on HDFS or S3, "
        "else `driver` (measured in docs/performance.md, 'Flush modes'). `driver`: the flusher in the driver"
        " process, chunk by chunk (one Python process writes every row). `processes`: "
        "`wal.flush.processes` worker processes on the driver's machine, each writing whole "
        "sealed segments from the WAL folder (or the store, for a WAL on HDFS or S3) with a "
        "session of its own (several GILs, no Spark job). `executors`: the "
        "flusher runs a Spark job with one task per sealed segment; the tasks read their "
        "segments from the WAL folder (which every node must mount at the same path), or "
        "from the store for a WAL on HDFS or S3, and upsert them at the sealed timestamps "
        "(in these two modes no row passes through the driver's log). In every mode the "
        "driver marks the batch "
        "flushed once every segment is acknowledged, and batches stay strictly in order. "
        "A restart's committed backlog is written in the mode too (only the discard of what "
        "Spark never committed runs before its first batch). Batch writes use `processes` in "
        "that mode and `driver` otherwise (their flush runs where no Spark job can start); "
        "`cassandra-wal recover --processes N` writes through worker processes.",
        section=_L, target="wal.flush_mode",
    ),
    _spec(
        "wal.flush.processes", values.int_in(1, 64),
        "With `wal.flush.mode=processes`: how many worker processes write a batch's segments "
        "(a batch has one segment per Spark task, so more processes than tasks add nothing).",
        section=_L, target="wal.flush_processes",
    ),
    _spec(
        "wal.flush.groupRows", values.int_in(1, 1_000_000),
        "Rows the flusher groups together into requests: a batch's consecutive chunks "
        "(Spark's Arrow batches, 10,000 rows by default) are gathered up to this many rows, so "
        "that a partition's rows from several chunks share one request. Higher: fewer, fuller "
        "requests and less work for the nodes; more flusher memory (about 1 KB a row while "
        "grouped, twice over while one group is in flight and the next is built). 1: each "
        "chunk on its own.",
        section=_L, target="write.group_rows",
    ),
    _spec(
        LISTS_AT_LEAST_ONCE, values.column_names,
        "Non-frozen `list<...>` columns you accept to be written **at least once**, "
        "comma-separated (unset: none). Cassandra stores each element of a non-frozen list "
        "under a new cell id it picks at every write, so a row written again (a write request "
        "retried after a timeout, a replay after a crash, a flush task run again: the sink does "
        "these on purpose) holds its elements twice (CASSANDRA-11368). Without this option a "
        "write to such a column is refused before anything is staged: declare it "
        "`frozen<list<...>>` (one cell, exactly once) or `set<...>` instead. For the columns "
        "named here, an element may appear more than once; every element of a committed row "
        "is there, and nothing of an uncommitted batch. The other columns keep exactly once "
        "in effect. Naming a column that is not a non-frozen list is an error. Recorded in "
        "each batch's seal.",
        section=_L, target="write.lists_at_least_once",
    ),
    _spec(
        "wal.metrics.port", values.metrics_port,
        "Serve the sink's figures for Prometheus on this TCP port of the driver "
        "(`http://<driver host>:<port>/metrics`); unset: no endpoint. It starts with the "
        "query's flusher (at its first batch; a restart that adds the option: at its second) "
        "and serves every query of the driver process that wrote through the sink (running "
        "or ended), labelled `query_id` and `query_name`. Needs "
        "`prometheus-client` (`pip install 'cassandra-wal-sink[metrics]'`). Metric names: "
        "docs/user-guide.md, \"Operating the sink\".",
        section=_L, target="wal.metrics_port",
    ),
    _spec(
        "marker.table", values.nonempty,
        "A stream's completeness marker: a table (`table`, in the target's keyspace, or "
        "`keyspace.table`) where the flusher records, per query and target table, the newest "
        "batch whose every row Cassandra acknowledged, once it is marked written, at the "
        "data's consistency level: a reader that sees batch N there sees every row of N and "
        "before (docs/user-guide.md, 'Knowing what is complete, from Cassandra', has its schema). Unset: none. "
        "Streams and foreachBatch writers only.",
        section=_L, target="wal.marker_table",
    ),
    _spec(
        "marker.create", values.boolean,
        "`true`: create the `marker.table` if it does not exist (`CREATE TABLE IF NOT "
        "EXISTS`, at the query's first batch); `false`: it must exist with its schema.",
        section=_L, target="wal.marker_create",
    ),
    _spec(
        "spark.cassandra.output.batch.grouping.buffer.size", values.ignored,
        "Rows are grouped over `wal.flush.groupRows` rows of a batch instead.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.output.metrics", values.ignored,
        "SCC's JVM task metrics do not exist for a Python data source; see `wal.metrics.port` "
        "and `sinks.status(query)` instead.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.keepAliveMS", values.ignored,
        "cassandra-driver's idle heartbeat keeps connections alive.",
        section=_I, status="ignored",
        old_names=("spark.cassandra.connection.keep_alive_ms",),
    ),
    _spec(
        "spark.cassandra.connection.compression", values.ignored,
        "cassandra-driver negotiates compression itself.",
        section=_I, status="ignored",
    ),
    _spec(
        "spark.cassandra.connection.reconnectionDelayMS.min", values.ignored,
        "cassandra-driver's reconnection policy applies.",
        section=_I, status="ignored",
        old_names=("spark.cassandra.connection.reconnection_delay_ms.min",),
    ),
    _spec(
        "spark.cassandra.connection.reconnectionDelayMS.max", values.ignored,
        "cassandra-driver's reconnection policy applies.",
        section=_I, status="ignored",
        old_names=("spark.cassandra.connection.reconnection_delay_ms.max",),
    ),
    _spec(
        "spark.cassandra.output.ifNotExists", values.refused(_LWT_REASON, "false"),
        "`false` only. IF NOT EXISTS is a lightweight transaction: not idempotent under "
        "retry, and incompatible with the fixed write timestamps that make replays safe.",
        section=_R, status="refused",
    ),
    _spec(
        "spark.cassandra.output.timestamp", values.refused(_TIMESTAMP_REASON, "0"),
        "`0` only. Use the `writetime` option.",
        section=_R, status="refused",
    ),
    _spec(
        "cluster", values.refused(_CLUSTER_REASON, "default"),
        "`default` only.",
        section=_R, status="refused",
    ),
    _spec(
        "confirm.truncate", values.refused("this sink never truncates a table; it only appends", "false"),
        "`false` only.",
        section=_R, status="refused",
    ),
) + tuple(
    _spec(
        name, values.refused(values.JKS_REASON, *harmless), f"{detail} Convert Java key stores to PEM "
        "(see the user guide, Security) and use the `.path` options.",
        section=_R, status="refused",
    )
    for name, harmless, detail in (
        ("spark.cassandra.connection.ssl.trustStore.password", (), "Not needed for PEM files."),
        ("spark.cassandra.connection.ssl.trustStore.type", ("pem",), "`PEM` only."),
        ("spark.cassandra.connection.ssl.keyStore.type", ("pem",), "`PEM` only."),
    )
)

_BY_KEY: dict[str, OptionSpec] = {spec.name.lower(): spec for spec in OPTION_SPECS}
_BY_OLD_KEY: dict[str, OptionSpec] = {
    old.lower(): spec for spec in OPTION_SPECS for old in spec.old_names}
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
            continue          # the config field keeps its default (which spec.default shows)
        if spec.target is not None:
            section, name = spec.target.split(".")
            sections[section][name] = value
    _check_cloud(raw, sections["connection"])
    write = sections["write"]
    for per_row, (constant, column) in PER_ROW_TARGETS.items():
        given = write.pop(per_row, None)
        if given is not None:
            write[constant], write[column] = given.constant, given.column
    write_config = WriteConfig(**write)
    _check_operations(write_config, raw)
    return SinkConfig(
        **sections["sink"],
        connection=ConnectionConfig(**sections["connection"]),
        write=write_config,
        wal=WalConfig(**sections["wal"]),
    )


def _check_operations(write: WriteConfig, raw: Mapping[str, str]) -> None:
    """A change stream's options agree: no value of an operation without ``op.column``, each
    value names one operation, an upsert and a row delete can be told, and the write
    timestamps are not one constant (every delete and upsert of a key would tie, and the
    tombstone win)."""
    if write.op_column is None:
        for option, _field in OPERATION_VALUES:
            if option in raw:
                raise OptionError(option, raw[option], "names the values of a change stream's "
                                  "operations, and op.column, which names their column, is not "
                                  "set: set it, or drop this option")
        return
    seen: dict[str, str] = {}
    for option, field in OPERATION_VALUES:
        for value in getattr(write, field):
            if value in seen:
                raise OptionError(option, ",".join(getattr(write, field)),
                                  f"{value!r} is also one of {seen[value]}: each value names "
                                  "one operation")
            seen[value] = option
    for option, field in OPERATION_VALUES[:2]:      # an upsert and a row delete, at least
        if not getattr(write, field):
            raise OptionError(option, "", "a change stream (op.column) needs at least one value")
    if write.writetime_micros is not None:
        raise OptionError("writetime", str(write.writetime_micros),
                          "a constant write timestamp with op.column gives every upsert and "
                          "delete of a key the same timestamp, where the delete always wins: "
                          "leave writetime unset (sealed timestamps, in batch order) or name a "
                          "column in source order")


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
        if spec is None and lowered in _BY_OLD_KEY:
            spec = _BY_OLD_KEY[lowered]
            log.warning("%s is deprecated (Spark Cassandra Connector) and is read as %s; "
                        "rename it", key, spec.name)
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


#: Options a secure connect bundle decides: given beside it, they would be ignored (by the
#: cassandra-driver, which also refuses an SSL context with a bundle), so they are refused instead.
_CLOUD_DECIDES = {
    "spark.cassandra.connection.host": "the bundle names the nodes",
    "spark.cassandra.connection.port": "the bundle names the nodes",
    "spark.cassandra.connection.ssl.enabled": "the bundle brings its own TLS",
    "spark.cassandra.connection.ssl.trustStore.path": "the bundle brings its own CA",
    "spark.cassandra.connection.ssl.keyStore.path": "the bundle brings its own client key",
    credentials.OPTION_OF["ssl_keystore_password"]: "the bundle brings its own client key",
    "spark.cassandra.connection.ssl.protocol": "the bundle brings its own TLS",
}
_HARMLESS_BESIDE_CLOUD = {"spark.cassandra.connection.ssl.enabled": "false",
                          "spark.cassandra.connection.ssl.protocol": "tls"}


def _check_cloud(raw: Mapping[str, str], connection: Mapping[str, Any]) -> None:
    if connection.get("cloud_bundle_path") is None:
        return
    for name, why in _CLOUD_DECIDES.items():
        if name in raw and raw[name].strip().lower() != _HARMLESS_BESIDE_CLOUD.get(name):
            raise OptionError(name, raw[name], f"{why}: drop this option beside "
                              "spark.cassandra.connection.config.cloud.path")


def _warn_unknown_session_key(key: str) -> None:
    suggestion = OptionError.unknown(key, KNOWN_NAMES)
    if "did you mean" in suggestion.reason:
        log.warning("session conf %s is ignored by the Cassandra WAL sink: %s", key, suggestion.reason)


def _parse_one(spec: OptionSpec, raw: str) -> Any:
    try:
        return spec.parser(raw)
    except ValueError as exc:
        raise OptionError(spec.name, raw, str(exc)) from None
