"""Option parsing: names, defaults, malformed values, SCC semantics, secrets, docs in sync."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect

import json
import logging
import pickle
from pathlib import Path

import pytest

from recovery.cql.connection import _redact as redact_connection_error
from recovery.cql.errors import REDACTED, OptionError
from sinks.worker import options as options_module
from sinks.worker.options import (
    OPTION_SPECS,
    ConnectionConfig,
    OptionSpec,
    SinkConfig,
    WalConfig,
    WriteConfig,
    config_default,
    parse_options,
)
from sinks.worker.options_doc import options_markdown
from tests.helpers.planted_tree import parsed_modules
from wal.secrets import is_secret
from wal.stores import StoreAccess

pytestmark = pytest.mark.unit

BASE = {"keyspace": "ks", "table": "events"}
REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "options.md"
SECRET = "s3cr3t-Pa55"


OPTION_BY_NAME = {spec.name: spec for spec in OPTION_SPECS}


def parse(**extra: str) -> SinkConfig:
    return parse_options({**BASE, **extra})


def parse_one(name: str, value: str) -> SinkConfig:
    return parse_options({**BASE, name: value})


# ---------------------------------------------------------------- defaults


def test_defaults_of_every_field():
    cfg = parse_options(BASE)
    assert (cfg.keyspace, cfg.table, cfg.checkpoint_location) == ("ks", "events", None)
    c = cfg.connection
    assert c.hosts == ("localhost",)
    assert c.port == 9042
    assert c.local_dc is None
    assert c.username is None and c.password is None
    assert c.consistency == "LOCAL_QUORUM"
    assert c.connect_timeout_s == 5.0
    assert c.request_timeout_s == 30.0
    assert c.ssl_enabled is False
    assert c.ssl_truststore_path is None and c.ssl_keystore_path is None
    assert c.ssl_keystore_password is None
    assert c.ssl_protocol == "TLS"
    assert c.cloud_bundle_path is None
    w = cfg.write
    assert w.concurrent_writes == 32
    assert w.batch_size_rows is None
    assert w.batch_size_bytes is None
    assert w.batch_grouping_key == "replica_set"
    assert w.ttl_seconds is None and w.ttl_column is None
    assert w.writetime_micros is None and w.writetime_column is None
    assert w.ignore_nulls is False
    assert w.throughput_mb_per_s is None
    assert w.retry_count == 10
    assert w.group_rows == 30000
    wal = cfg.wal
    assert wal.path is None
    assert wal.retention_batches == 10
    assert wal.retention_seconds is None
    assert wal.max_bytes == 10 * 2**30
    assert wal.backpressure == "block"
    assert wal.backpressure_timeout_s == 600.0
    assert wal.flush is True
    assert wal.flush_mode == "auto"
    assert wal.flush_processes == 2


def test_dataclass_defaults_equal_table_defaults():
    cfg = parse_options(BASE)
    assert cfg.connection == ConnectionConfig()
    assert cfg.write == WriteConfig()
    assert cfg.wal == WalConfig()


@pytest.mark.parametrize("spec", [s for s in OPTION_SPECS if s.default is not None], ids=lambda s: s.name)
def test_every_table_default_parses(spec):
    spec.parser(spec.default)


@pytest.mark.parametrize("spec", [s for s in OPTION_SPECS if s.default is not None], ids=lambda s: s.name)
def test_a_shown_default_given_as_the_option_changes_nothing(spec):
    """The table shows each config field's default as a user would type it (its ``shown``,
    the parser's inverse): typed in, it gives the default config again."""
    context = {"op.column": "op"} if spec.name.startswith("op.") else {}   # values need it
    assert parse(**context, **{spec.name: spec.default}) == parse(**context)


def test_an_option_default_is_written_once_in_the_config_dataclasses():
    """The config dataclasses' field defaults are the one place a default is written: the
    option table cannot be given one (a second copy would creep back through it), and every
    option setting a field shows that field's default."""
    assert "default" not in inspect.signature(OptionSpec).parameters
    assert "default" not in inspect.signature(options_module._spec).parameters
    for spec in OPTION_SPECS:
        if spec.target is not None:
            assert spec.default == spec.shown(config_default(spec.target)), spec.name
        else:
            assert spec.default is None, spec.name
    assert OPTION_BY_NAME["wal.maxBytes"].default == "10g"          # shown as a user types it
    assert OPTION_BY_NAME["spark.cassandra.connection.timeoutMS"].default == "5000"
    assert OPTION_BY_NAME["spark.cassandra.output.ttl"].default == "0"
    assert OPTION_BY_NAME["spark.cassandra.output.batch.size.rows"].default == "auto"
    assert OPTION_BY_NAME["op.upsertValues"].default == "c,u,r"
    # What is required is read the same way: a field without a default (SinkConfig's
    # keyspace and table), never said again beside the option.
    assert "required" not in inspect.signature(OptionSpec).parameters
    assert {s.name for s in OPTION_SPECS if s.required} == {"keyspace", "table"}
    with pytest.raises(OptionError, match="required"):
        parse_options({"keyspace": "ks"})


def test_option_names_are_unique_ignoring_case():
    names = [s.name.lower() for s in OPTION_SPECS]
    assert len(names) == len(set(names))


# ---------------------------------------------------------------- values


def test_values_are_parsed():
    cfg = parse_options({
        **BASE,
        "checkpointLocation": "/chk",
        "spark.cassandra.connection.host": " a.example , b.example,,",
        "spark.cassandra.connection.port": "19042",
        "spark.cassandra.connection.localDC": "dc1",
        "spark.cassandra.connection.timeoutMS": "2500",
        "spark.cassandra.read.timeoutMS": "45000",
        "spark.cassandra.auth.username": "app",
        "spark.cassandra.connection.ssl.enabled": "TRUE",
        "spark.cassandra.connection.ssl.trustStore.path": "/ca.pem",
        "spark.cassandra.connection.ssl.keyStore.path": "/client.pem",
        "spark.cassandra.connection.ssl.protocol": "TLSv1.3",
        "spark.cassandra.output.consistency.level": "local_one",
        "spark.cassandra.output.concurrent.writes": "64",
        "spark.cassandra.output.batch.size.rows": "100",
        "spark.cassandra.output.batch.grouping.key": "NONE",
        "spark.cassandra.output.ttl": "3600",
        "spark.cassandra.output.ignoreNulls": "True",
        "spark.cassandra.output.throughputMBPerSec": "2.5",
        "spark.cassandra.query.retry.count": "0",
        "wal.path": "/wal",
        "wal.retention.batches": "0",
        "wal.retention.seconds": "86400",
        "wal.maxBytes": "512m",
        "wal.backpressure": "FAIL",
        "wal.backpressure.timeoutSeconds": "1.5",
        "wal.flush": "false",
    })
    c, w, wal = cfg.connection, cfg.write, cfg.wal
    assert cfg.checkpoint_location == "/chk"
    assert c.hosts == ("a.example", "b.example")
    assert (c.port, c.local_dc, c.connect_timeout_s, c.request_timeout_s) == (19042, "dc1", 2.5, 45.0)
    assert (c.username, c.ssl_enabled, c.ssl_truststore_path, c.ssl_keystore_path) == ("app", True, "/ca.pem", "/client.pem")
    assert c.ssl_protocol == "TLSv1.3"
    assert c.consistency == "LOCAL_ONE" and c.consistency_level == 10
    assert (w.concurrent_writes, w.batch_size_rows, w.batch_grouping_key) == (64, 100, "none")
    assert (w.ttl_seconds, w.ignore_nulls, w.throughput_mb_per_s, w.retry_count) == (3600, True, 2.5, 0)
    assert (wal.path, wal.retention_batches, wal.retention_seconds) == ("/wal", 0, 86400.0)
    assert (wal.max_bytes, wal.backpressure, wal.backpressure_timeout_s, wal.flush) == (512 * 2**20, "fail", 1.5, False)


def test_keys_match_case_insensitively_as_spark_lowercases_them():
    cfg = parse_options({
        "KEYSPACE": "ks", "table": "events", "checkpointlocation": "/chk",
        "spark.cassandra.output.concurrent.writes": "7", "wal.maxbytes": "1k",
        "SPARK.CASSANDRA.CONNECTION.LOCALDC": "dc2",
    })
    assert cfg.checkpoint_location == "/chk"
    assert cfg.write.concurrent_writes == 7
    assert cfg.wal.max_bytes == 1024
    assert cfg.connection.local_dc == "dc2"


def test_values_keep_their_case():
    cfg = parse_options({"keyspace": "MyKs", "table": "MyTable"})
    assert (cfg.keyspace, cfg.table) == ("MyKs", "MyTable")


@pytest.mark.parametrize("raw, expected", [
    ("1048576", 1048576), ("512m", 512 * 2**20), ("2g", 2 * 2**30), ("2G", 2 * 2**30),
    ("1k", 1024), ("1t", 2**40), ("512MB", 512 * 2**20), ("512MiB", 512 * 2**20), ("1.5g", 3 * 2**29),
])
def test_wal_max_bytes_sizes(raw, expected):
    assert parse_one("wal.maxBytes", raw).wal.max_bytes == expected


@pytest.mark.parametrize("raw,expected", [("replica_set", "replica_set"), ("PARTITION", "partition"),
                                          ("none", "none")])
def test_grouping_keys(raw, expected):
    assert parse_one("spark.cassandra.output.batch.grouping.key", raw).write.batch_grouping_key == expected


def test_ttl_zero_means_none():
    assert parse_one("spark.cassandra.output.ttl", "0").write.ttl_seconds is None


def test_per_row_ttl_column_and_constant():
    w = parse(ttl="expires_in").write
    assert (w.ttl_column, w.ttl_seconds) == ("expires_in", None)
    w = parse_options({**BASE, "ttl": "60", "spark.cassandra.output.ttl": "3600"}).write
    assert (w.ttl_column, w.ttl_seconds) == (None, 60)
    w = parse_options({**BASE, "ttl": "ttl_col", "spark.cassandra.output.ttl": "3600"}).write
    assert (w.ttl_column, w.ttl_seconds) == ("ttl_col", None)


def test_per_row_writetime_column_and_constant():
    w = parse(writetime="ts_us").write
    assert (w.writetime_column, w.writetime_micros) == ("ts_us", None)
    w = parse(writetime="1700000000000000").write
    assert (w.writetime_column, w.writetime_micros) == (None, 1700000000000000)


# ---------------------------------------------------------------- malformed values

MALFORMED = [
    ("spark.cassandra.connection.host", " , "),
    ("spark.cassandra.connection.host", "10.0.0.1:70000"),
    ("spark.cassandra.connection.host", ":9042"),
    ("spark.cassandra.connection.port", "abc"),
    ("spark.cassandra.connection.port", "0"),
    ("spark.cassandra.connection.port", "70000"),
    ("spark.cassandra.connection.port", "9042.0"),
    ("spark.cassandra.connection.localDC", " "),
    ("spark.cassandra.connection.timeoutMS", "5s"),
    ("spark.cassandra.connection.timeoutMS", "0"),
    ("spark.cassandra.read.timeoutMS", "-1"),
    ("spark.cassandra.query.retry.count", "-1"),
    ("spark.cassandra.query.retry.count", "ten"),
    ("spark.cassandra.connection.ssl.enabled", "yes"),
    ("spark.cassandra.connection.ssl.trustStore.path", ""),
    ("spark.cassandra.connection.ssl.keyStore.path", " "),
    ("spark.cassandra.connection.ssl.protocol", ""),
    ("spark.cassandra.connection.ssl.protocol", "TLSv1.1"),
    ("spark.cassandra.connection.ssl.protocol", "SSL"),
    ("spark.cassandra.connection.config.cloud.path", ""),
    ("spark.cassandra.connection.config.cloud.path", "bundle.zip"),
    ("spark.cassandra.output.consistency.level", "MOST"),
    ("spark.cassandra.output.consistency.level", "SERIAL"),
    ("spark.cassandra.output.consistency.level", "local_serial"),
    ("spark.cassandra.output.concurrent.writes", "0"),
    ("spark.cassandra.output.concurrent.writes", "1_000"),
    ("spark.cassandra.output.batch.size.rows", "0"),
    ("spark.cassandra.output.batch.size.rows", "many"),
    ("spark.cassandra.output.batch.size.bytes", "0"),
    ("spark.cassandra.output.batch.size.bytes", "5k"),
    ("spark.cassandra.output.batch.grouping.key", "host"),
    ("spark.cassandra.output.ttl", "-1"),
    ("spark.cassandra.output.ttl", "1.5"),
    ("spark.cassandra.output.ttl", "630720001"),
    ("spark.cassandra.output.ignoreNulls", "1"),
    ("spark.cassandra.output.throughputMBPerSec", "0"),
    ("spark.cassandra.output.throughputMBPerSec", "nan"),
    ("spark.cassandra.output.throughputMBPerSec", "inf"),
    ("spark.cassandra.output.throughputMBPerSec", "fast"),
    ("ttl", "-5"),
    ("ttl", "2.5"),
    ("ttl", " "),
    ("writetime", "1700000000000"),  # milliseconds
    ("writetime", "-1"),
    ("writetime", str(2**63)),  # would not fit the protocol's 64-bit timestamp at flush time
    ("writetime", ""),
    ("checkpointLocation", ""),
    ("wal.path", " "),
    ("wal.retention.batches", "-1"),
    ("wal.retention.batches", "x"),
    ("wal.retention.seconds", "0"),
    ("wal.retention.seconds", "1d"),
    ("wal.maxBytes", "0"),
    ("wal.maxBytes", "lots"),
    ("wal.maxBytes", "10x"),
    ("wal.maxBytes", "1.5"),
    ("wal.backpressure", "drop"),
    ("wal.backpressure.timeoutSeconds", "0"),
    ("wal.backpressure.timeoutSeconds", "-3"),
    ("wal.flush", "no"),
    ("wal.flush.mode", "cluster"),
    ("wal.flush.processes", "0"),
    ("wal.flush.processes", "65"),
    ("wal.flush.processes", "two"),
    ("wal.flush.groupRows", "0"),
    ("wal.flush.groupRows", "1000001"),
    ("wal.flush.groupRows", "lots"),
    ("wal.lists.atLeastOnce", " , "),
    ("wal.metrics.port", "0"),
    ("wal.metrics.port", "65536"),
    ("wal.metrics.port", "http"),
    ("op.column", " "),
    # without op.column, which they belong to
    ("op.upsertValues", "c,u"),
    ("op.deleteValues", "d"),
    ("op.partitionDeleteValues", "p"),
    ("marker.table", " "),
    ("marker.create", "yes please"),
]


@pytest.mark.parametrize("name, value", MALFORMED)
def test_malformed_value_names_option_and_value(name, value):
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, name.lower(): value})
    assert info.value.option == name
    assert info.value.value == value
    assert repr(name) in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("value", ["ANY", "any"])
def test_consistency_any_is_refused_with_why_and_what_instead(value):
    # "Flushed means acknowledged": ANY acknowledges a hint, which is no proof the row is stored.
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "spark.cassandra.output.consistency.level": value})
    assert info.value.option == "spark.cassandra.output.consistency.level"
    assert "hint" in info.value.reason and "ONE or stronger" in info.value.reason
    assert "LOCAL_QUORUM" in info.value.reason


def test_metrics_port_is_off_by_default_and_needs_prometheus_client(monkeypatch):
    assert parse_options(BASE).wal.metrics_port is None
    assert parse_one("wal.metrics.port", "9108").wal.metrics_port == 9108
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real(name, *a))
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "wal.metrics.port": "9108"})
    assert info.value.option == "wal.metrics.port"
    assert "cassandra-wal-sink[metrics]" in str(info.value)


def test_largest_writetime_constant_is_accepted():
    assert parse_one("writetime", str(2**63 - 1)).write.writetime_micros == 2**63 - 1


def test_every_parsed_option_has_a_malformed_case():
    no_bad_value = {"keyspace", "table", "path", "spark.cassandra.auth.username",
                    "spark.cassandra.auth.password", "spark.cassandra.connection.ssl.keyStore.password"}
    parsed = {s.name for s in OPTION_SPECS if s.status == "supported"} - no_bad_value
    assert parsed <= {name for name, _ in MALFORMED}


@pytest.mark.parametrize("name", ["keyspace", "table"])
def test_missing_keyspace_or_table_names_the_option(name):
    opts = dict(BASE)
    del opts[name]
    with pytest.raises(OptionError, match="required") as info:
        parse_options(opts)
    assert info.value.option == name


@pytest.mark.parametrize("name", ["keyspace", "table"])
def test_empty_keyspace_or_table_is_refused(name):
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, name: "  "})
    assert info.value.option == name


def test_same_option_twice_with_different_values_is_refused():
    with pytest.raises(OptionError, match="given twice") as info:
        parse_options({**BASE, "wal.maxBytes": "1g", "wal.maxbytes": "2g"})
    assert info.value.option == "wal.maxBytes"


# ---------------------------------------------------------------- unknown, refused, ignored


def test_unknown_option_suggests_closest_name():
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "spark.cassandra.output.concurent.writes": "8"})
    assert info.value.option == "spark.cassandra.output.concurent.writes"
    assert "did you mean 'spark.cassandra.output.concurrent.writes'" in str(info.value)


def test_unknown_lowercased_option_suggests_canonical_spelling():
    with pytest.raises(OptionError, match="did you mean 'wal.maxBytes'"):
        parse_options({**BASE, "wal.maxbyte": "1g"})


def test_unknown_option_without_close_name():
    with pytest.raises(OptionError, match="unknown option") as info:
        parse_options({**BASE, "compression": "zstd"})
    assert "did you mean" not in str(info.value)


def test_unknown_option_value_is_not_echoed():
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "spark.cassandra.auth.passwrd": SECRET})
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert info.value.value is None


@pytest.mark.parametrize("name, harmless, bad, reason", [
    ("spark.cassandra.output.ifNotExists", "false", "true", "not idempotent"),
    ("spark.cassandra.output.timestamp", "0", "1700000000000000", "writetime"),
    ("cluster", "default", "other", "multiple clusters"),
    ("confirm.truncate", "false", "true", "never truncates"),
])
def test_refused_options_give_a_specific_reason(name, harmless, bad, reason):
    parse_one(name.lower(), harmless)
    with pytest.raises(OptionError, match=reason) as info:
        parse_one(name.lower(), bad)
    assert info.value.option == name


@pytest.mark.parametrize("name", [s.name for s in OPTION_SPECS if s.status == "ignored"])
def test_ignored_options_are_accepted(name):
    assert parse_one(name.lower(), "anything") == parse_options(BASE)


# ---------------------------------------------------------------- session conf


def test_session_conf_supplies_defaults():
    session = {"spark.cassandra.connection.host": "10.0.0.1,10.0.0.2", "spark.cassandra.output.concurrent.writes": "8"}
    cfg = parse_options(BASE, session)
    assert cfg.connection.hosts == ("10.0.0.1", "10.0.0.2")
    assert cfg.write.concurrent_writes == 8


def test_options_override_session_conf():
    session = {"spark.cassandra.connection.localDC": "dc1", "spark.cassandra.output.concurrent.writes": "8"}
    cfg = parse_options({**BASE, "spark.cassandra.output.concurrent.writes": "16"}, session)
    assert cfg.write.concurrent_writes == 16
    assert cfg.connection.local_dc == "dc1"


def test_session_conf_keeps_its_case_and_matches_lowercased_options():
    cfg = parse_options({**BASE, "spark.cassandra.connection.localdc": "dc9"}, {"spark.cassandra.connection.localDC": "dc1"})
    assert cfg.connection.local_dc == "dc9"


def test_session_conf_other_keys_are_ignored():
    session = {"spark.sql.shuffle.partitions": "4", "keyspace": "other", "wal.maxBytes": "1k"}
    cfg = parse_options(BASE, session)
    assert cfg.keyspace == "ks" and cfg.wal.max_bytes == 10 * 2**30


def test_unknown_session_cassandra_keys_are_ignored_with_warning_for_typos(caplog):
    session = {"spark.cassandra.input.split.sizeInMB": "64", "spark.cassandra.output.concurent.writes": "8"}
    with caplog.at_level(logging.WARNING, logger="sinks.worker.options"):
        cfg = parse_options(BASE, session)
    assert cfg.write.concurrent_writes == 32
    assert "concurent" in caplog.text and "did you mean" in caplog.text


def test_malformed_session_value_names_option():
    with pytest.raises(OptionError) as info:
        parse_options(BASE, {"spark.cassandra.connection.port": "x"})
    assert info.value.option == "spark.cassandra.connection.port"


# ---------------------------------------------------------------- secrets


def secret_config() -> SinkConfig:
    return parse_options({
        **BASE,
        "spark.cassandra.auth.username": "app",
        "spark.cassandra.auth.password": SECRET,
        "spark.cassandra.connection.ssl.keyStore.password": SECRET + "-ks",
    })


def test_password_is_parsed():
    cfg = secret_config()
    assert cfg.connection.password == SECRET
    assert cfg.connection.ssl_keystore_password == SECRET + "-ks"


def test_password_never_in_repr_str_or_public_dict():
    cfg = secret_config()
    for text in (repr(cfg), str(cfg), repr(cfg.connection), str(cfg.connection),
                 json.dumps(cfg.public_dict()), json.dumps(cfg.connection.public_dict())):
        assert SECRET not in text
    assert "password" not in cfg.connection.public_dict()
    assert "ssl_keystore_password" not in cfg.connection.public_dict()
    assert cfg.connection.public_dict()["username"] == "app"


def test_password_never_in_error_messages():
    err = OptionError("spark.cassandra.auth.password", SECRET, "bad")
    assert SECRET not in str(err) and SECRET not in repr(err) and err.value == REDACTED
    assert SECRET not in str(pickle.loads(pickle.dumps(err)))
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "spark.cassandra.auth.password": SECRET, "spark.cassandra.connection.port": "x"})
    assert SECRET not in str(info.value)


def test_which_values_are_secret_is_said_in_one_place():
    """:func:`is_secret` is the one rule of what is secret: the options it names are those
    ``docs/options.md`` marks and :class:`OptionError` redacts; the config fields it names are
    left out of the repr, of ``public_dict`` (``target.json``) and replaced in a connection's
    errors. No second list may creep back: no field(repr=False), no SECRET_* list in the
    packages, no OptionSpec(secret=...). The WAL's store access follows the same rule."""
    assert {s.name for s in OPTION_SPECS if s.secret} == {
        "spark.cassandra.auth.password", "spark.cassandra.connection.ssl.keyStore.password",
        "spark.cassandra.connection.ssl.trustStore.password"}
    for spec in OPTION_SPECS:
        assert (OptionError(spec.name, SECRET, "bad").value == REDACTED) == spec.secret
        assert spec.secret == ("Secret: never shown" in options_markdown().split(
            f"| `{spec.name}` |")[1].split("\n")[0])
    secret_fields = [f.name for f in dataclasses.fields(ConnectionConfig) if is_secret(f.name)]
    assert secret_fields == ["password", "ssl_keystore_password"]
    for config in (WriteConfig, WalConfig, SinkConfig):
        assert not [f.name for f in dataclasses.fields(config) if is_secret(f.name)]
    conn = ConnectionConfig(**{name: f"{SECRET}-{name}" for name in secret_fields})
    shown = (repr(conn), str(SinkConfig("ks", "t", connection=conn)),
             json.dumps(SinkConfig("ks", "t", connection=conn).public_dict()),
             redact_connection_error(f"refused {conn.password} {conn.ssl_keystore_password}", conn))
    for text in shown:
        assert SECRET not in text, text
    assert set(conn.secrets()) == {f"{SECRET}-{name}" for name in secret_fields}
    # The WAL's store access: its S3 keys by the same rule (the bucket's endpoint is shown).
    access = StoreAccess(s3_endpoint="http://s3.local", s3_access_key=f"{SECRET}-id",
                         s3_secret_key=f"{SECRET}-key")
    assert SECRET not in repr(access) and "http://s3.local" in repr(access)
    assert pickle.loads(pickle.dumps(access)).s3_secret_key == f"{SECRET}-key"

    assert "secret" not in inspect.signature(OptionSpec).parameters
    second = []
    for rel, tree in parsed_modules(REPO):
        for node in ast.walk(tree):
            if (isinstance(node, ast.keyword) and node.arg == "repr"
                    and isinstance(node.value, ast.Constant) and node.value.value is False):
                second.append(f"{rel}: field(repr=False)")
            if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                    and "SECRET" in node.id and Path(rel).name != "secrets.py"):
                second.append(f"{rel}: {node.id}")
            if isinstance(node, ast.keyword) and node.arg == "secret":
                second.append(f"{rel}: secret=")
    assert not second, "a second declaration of what is secret (is_secret is the one)"


def test_config_pickles_with_secrets_for_executors():
    cfg = secret_config()
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and again.connection.password == SECRET


def test_configs_are_frozen():
    cfg = parse_options(BASE)
    with pytest.raises(AttributeError):
        cfg.write.concurrent_writes = 1  # type: ignore[misc]


def test_option_error_pickles():
    err = OptionError("wal.maxBytes", "lots", "expected a size")
    again = pickle.loads(pickle.dumps(err))
    assert (again.option, again.value, again.reason, str(again)) == (err.option, err.value, err.reason, str(err))


# ---------------------------------------------------------------- docs


def test_docs_options_md_is_in_sync():
    assert DOCS.read_text(encoding="utf-8") == options_markdown(), (
        "docs/options.md is stale: regenerate it with the command in its header"
    )


def test_docs_list_every_option():
    page = options_markdown()
    for spec in OPTION_SPECS:
        assert f"| `{spec.name}` |" in page
