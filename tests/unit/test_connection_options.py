"""Connection options carried over from the Spark Cassandra Connector (issue #20): per-host
ports in ``connection.host``, ``ssl.protocol``, SCC's old option spellings and the cloud
secure connect bundle; each checked on the parsed config and on the ``Cluster`` arguments
built from it (nothing connects)."""

from __future__ import annotations

import logging
import ssl

import pytest

from recovery.cql.config import TLS_PROTOCOLS, ConnectionConfig
from recovery.cql.connection import _ssl_context, cluster_kwargs, connect
from recovery.cql.errors import REDACTED, ConnectionFailed, OptionError
from recovery.cql.table import TableSchema
from recovery.target import Target
from sinks.worker.options import OPTION_SPECS, parse_options

pytestmark = pytest.mark.unit

BASE = {"keyspace": "ks", "table": "events"}
HOST = "spark.cassandra.connection.host"
PORT = "spark.cassandra.connection.port"
PROTOCOL = "spark.cassandra.connection.ssl.protocol"
CLOUD = "spark.cassandra.connection.config.cloud.path"
BUNDLE = "/secure/secure-connect-db.zip"


def connection(**options: str) -> ConnectionConfig:
    return parse_options({**BASE, **options}).connection


def hosts(value: str, **options: str) -> ConnectionConfig:
    return connection(**{HOST: value}, **options)


# ---------------------------------------------------------------- host:port contact points


@pytest.mark.parametrize("value, stored, points", [
    ("10.0.0.1", ("10.0.0.1",), ["10.0.0.1"]),
    ("10.0.0.1:9043", ("10.0.0.1:9043",), [("10.0.0.1", 9043)]),
    (" a , b:9044 ,", ("a", "b:9044"), ["a", ("b", 9044)]),
    ("node1 : 9045", ("node1:9045",), [("node1", 9045)]),
    ("[::1]:9042", ("[::1]:9042",), [("::1", 9042)]),
    ("[fe80::1]", ("fe80::1",), ["fe80::1"]),
    ("::1", ("::1",), ["::1"]),
    ("2001:db8::7", ("2001:db8::7",), ["2001:db8::7"]),
])
def test_contact_points_with_and_without_ports(value, stored, points):
    conn = hosts(value)
    assert conn.hosts == stored
    assert conn.contact_points == points


def test_cluster_gets_host_port_tuples_and_the_default_port_for_the_rest():
    kwargs = cluster_kwargs(hosts("a,10.0.0.1:9043,[::1]:9044", **{PORT: "9100"}))
    assert kwargs["contact_points"] == ["a", ("10.0.0.1", 9043), ("::1", 9044)]
    assert kwargs["port"] == 9100
    assert "cloud" not in kwargs


def test_cassandra_driver_resolves_per_host_ports():
    # cassandra-driver itself pairs bare hosts with `port` and keeps a tuple's own port (no
    # connection).
    from cassandra.cluster import Cluster

    cluster = Cluster(**cluster_kwargs(hosts("127.0.0.1,127.0.0.2:9043", **{PORT: "9100"})))
    try:
        assert sorted((ep.address, ep.port) for ep in cluster.endpoints_resolved) == [
            ("127.0.0.1", 9100), ("127.0.0.2", 9043)]
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("value, says", [
    ("10.0.0.1:0", "port must be"),
    ("10.0.0.1:65536", "port must be"),
    ("10.0.0.1:ninety", "port must be"),
    ("10.0.0.1:", "port must be"),
    ("10.0.0.1:-1", "port must be"),
    (":9042", "empty host"),
    ("a,:9042", "empty host"),
    ("[::1]:x", "port must be"),
    ("[]:9042", "not one"),
    ("[node1]:9042", "not one"),
    ("[::1:9042", "unbalanced"),
    ("::1]:9042", "unbalanced"),
    ("a:b:c", "neither host:port nor an IPv6"),
    (" , ", "comma-separated"),
])
def test_malformed_contact_points_name_the_option(value, says):
    with pytest.raises(OptionError) as info:
        hosts(value)
    assert info.value.option == HOST
    assert info.value.value == value
    assert says in info.value.reason


def test_host_port_from_a_recorded_target_or_the_cli_reaches_the_cluster():
    # cassandra-wal recover --host passes raw entries: they are read the same way when connecting.
    conn = ConnectionConfig(hosts=("h1:9043", "h2"))
    assert cluster_kwargs(conn)["contact_points"] == [("h1", 9043), "h2"]
    with pytest.raises(OptionError) as info:
        cluster_kwargs(ConnectionConfig(hosts=("h1:99999",)))
    assert info.value.option == HOST


# ---------------------------------------------------------------- ssl.protocol


@pytest.mark.parametrize("value, canonical, lowest, highest", [
    ("TLS", "TLS", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.MAXIMUM_SUPPORTED),
    ("tls", "TLS", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.MAXIMUM_SUPPORTED),
    ("TLSv1.2", "TLSv1.2", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2),
    ("tlsv1.2", "TLSv1.2", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2),
    ("TLSv1.3", "TLSv1.3", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3),
])
def test_ssl_protocol_sets_the_context_versions(value, canonical, lowest, highest):
    conn = connection(**{"spark.cassandra.connection.ssl.enabled": "true", PROTOCOL: value})
    assert conn.ssl_protocol == canonical
    ctx = _ssl_context(conn)
    assert (ctx.minimum_version, ctx.maximum_version) == (lowest, highest)
    assert cluster_kwargs(conn)["ssl_context"].maximum_version == highest


def test_every_accepted_protocol_is_tested():
    assert set(TLS_PROTOCOLS) == {"TLS", "TLSv1.2", "TLSv1.3"}


@pytest.mark.parametrize("value, says", [
    ("TLSv1", "older than TLS 1.2"),
    ("TLSv1.1", "older than TLS 1.2"),
    ("SSLv3", "older than TLS 1.2"),
    ("SSL", "older than TLS 1.2"),
    ("DTLS", "expected one of TLS, TLSv1.2, TLSv1.3"),
    ("TLSv1.4", "expected one of TLS, TLSv1.2, TLSv1.3"),
    ("", "expected one of"),
])
def test_ssl_protocols_we_cannot_honour_are_refused(value, says):
    with pytest.raises(OptionError) as info:
        connection(**{PROTOCOL: value})
    assert info.value.option == PROTOCOL
    assert says in info.value.reason


def test_unknown_protocol_recorded_by_an_older_version_fails_clearly_when_connecting():
    # Older versions stored the protocol unchecked; such a WAL's target must not connect silently.
    conn = ConnectionConfig(ssl_enabled=True, ssl_protocol="TLSv1.1")
    with pytest.raises(OptionError) as info:
        _ssl_context(conn)
    assert info.value.option == PROTOCOL


# ---------------------------------------------------------------- SCC's old spellings

OLD_NAMES = [
    ("spark.cassandra.output.throughput_mb_per_sec",
     "spark.cassandra.output.throughputMBPerSec", "2.5",
     lambda c: c.write.throughput_mb_per_s, 2.5),
    ("spark.cassandra.connection.local_dc", "spark.cassandra.connection.localDC", "dc2",
     lambda c: c.connection.local_dc, "dc2"),
    ("spark.cassandra.connection.timeout_ms", "spark.cassandra.connection.timeoutMS", "7000",
     lambda c: c.connection.connect_timeout_s, 7.0),
    ("spark.cassandra.read.timeout_ms", "spark.cassandra.read.timeoutMS", "9000",
     lambda c: c.connection.request_timeout_s, 9.0),
    ("spark.cassandra.connection.keep_alive_ms", "spark.cassandra.connection.keepAliveMS", "1000",
     lambda c: None, None),
    ("spark.cassandra.connection.reconnection_delay_ms.min",
     "spark.cassandra.connection.reconnectionDelayMS.min", "1000", lambda c: None, None),
    ("spark.cassandra.connection.reconnection_delay_ms.max",
     "spark.cassandra.connection.reconnectionDelayMS.max", "60000", lambda c: None, None),
]


def test_old_spellings_are_exactly_sccs_write_and_connection_list():
    mapped = {old: spec.name for spec in OPTION_SPECS for old in spec.old_names}
    assert mapped == {old: new for old, new, *_ in OLD_NAMES}


@pytest.mark.parametrize("old, new, value, read, expected", OLD_NAMES,
                         ids=[o[0] for o in OLD_NAMES])
def test_old_spelling_is_read_as_the_new_name_with_a_warning(caplog, old, new, value, read,
                                                             expected):
    with caplog.at_level(logging.WARNING, logger="sinks.worker.options"):
        cfg = parse_options({**BASE, old.lower(): value})
    assert read(cfg) == expected
    assert cfg == parse_options({**BASE, new: value})
    assert any(old.lower() in r.getMessage() and new in r.getMessage() for r in caplog.records)


def test_old_spelling_in_session_conf_is_read_too(caplog):
    with caplog.at_level(logging.WARNING, logger="sinks.worker.options"):
        cfg = parse_options(BASE, {"spark.cassandra.connection.local_dc": "dc3"})
    assert cfg.connection.local_dc == "dc3"
    assert any("spark.cassandra.connection.localDC" in r.getMessage() for r in caplog.records)


def test_old_and_new_spelling_with_different_values_is_an_error():
    for source in ("options", "session"):
        both = {"spark.cassandra.output.throughput_mb_per_sec": "2",
                "spark.cassandra.output.throughputMBPerSec": "3"}
        with pytest.raises(OptionError) as info:
            parse_options({**BASE, **both}) if source == "options" else parse_options(BASE, both)
        assert info.value.option == "spark.cassandra.output.throughputMBPerSec"
        assert "throughput_mb_per_sec" in info.value.reason
        assert "throughputMBPerSec" in info.value.reason


def test_old_and_new_spelling_with_the_same_value_is_accepted():
    cfg = parse_options({**BASE, "spark.cassandra.connection.local_dc": "dc1",
                         "spark.cassandra.connection.localDC": "dc1"})
    assert cfg.connection.local_dc == "dc1"


def test_write_option_under_the_new_name_overrides_an_old_name_in_session_conf():
    cfg = parse_options({**BASE, "spark.cassandra.connection.localDC": "dc1"},
                        {"spark.cassandra.connection.local_dc": "dc2"})
    assert cfg.connection.local_dc == "dc1"


def test_malformed_value_under_an_old_spelling_names_the_new_option():
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "spark.cassandra.output.throughput_mb_per_sec": "fast"})
    assert info.value.option == "spark.cassandra.output.throughputMBPerSec"


def test_old_spellings_do_not_clash_with_any_name():
    names = [s.name.lower() for s in OPTION_SPECS]
    names += [old.lower() for s in OPTION_SPECS for old in s.old_names]
    assert len(names) == len(set(names))


# ---------------------------------------------------------------- cloud secure connect bundle


def test_cloud_bundle_is_handed_to_cassandra_driver_instead_of_contact_points_and_tls():
    conn = connection(**{CLOUD: BUNDLE, "spark.cassandra.auth.username": "u",
                         "spark.cassandra.auth.password": "p",
                         "spark.cassandra.connection.timeoutMS": "8000"})
    assert conn.cloud_bundle_path == BUNDLE
    kwargs = cluster_kwargs(conn)
    assert kwargs["cloud"] == {"secure_connect_bundle": BUNDLE, "connect_timeout": 8.0}
    # Cluster refuses contact_points, ssl_context and ssl_options beside cloud.
    assert not {"contact_points", "port", "ssl_context", "ssl_options"} & set(kwargs)
    assert kwargs["auth_provider"].username == "u"


def test_cloud_bundle_without_credentials_leaves_them_to_the_bundle():
    assert "auth_provider" not in cluster_kwargs(connection(**{CLOUD: BUNDLE}))


def test_cloud_bundle_accepts_a_file_url():
    assert connection(**{CLOUD: "file:///b/bundle.zip"}).cloud_bundle_path == "/b/bundle.zip"


@pytest.mark.parametrize("value, says", [
    ("bundle.zip", "absolute path"),
    ("https://example.com/bundle.zip", "URL is not supported"),
    ("hdfs:///bundles/b.zip", "URL is not supported"),
    ("  ", "must not be empty"),
])
def test_cloud_bundle_that_cassandra_driver_cannot_open_is_refused(value, says):
    with pytest.raises(OptionError) as info:
        connection(**{CLOUD: value})
    assert info.value.option == CLOUD
    assert says in info.value.reason


@pytest.mark.parametrize("name, value", [
    (HOST, "10.0.0.1"),
    (PORT, "9042"),
    ("spark.cassandra.connection.ssl.enabled", "true"),
    ("spark.cassandra.connection.ssl.trustStore.path", "/ca.pem"),
    ("spark.cassandra.connection.ssl.keyStore.path", "/client.pem"),
    (PROTOCOL, "TLSv1.2"),
])
def test_options_the_bundle_decides_are_refused_beside_it(name, value):
    with pytest.raises(OptionError) as info:
        connection(**{CLOUD: BUNDLE, name: value})
    assert info.value.option == name
    assert "drop this option" in info.value.reason


def test_keystore_password_beside_the_bundle_is_refused_without_showing_it():
    with pytest.raises(OptionError) as info:
        connection(**{CLOUD: BUNDLE, "spark.cassandra.connection.ssl.keyStore.password": "hunter2"})
    assert info.value.value == REDACTED and "hunter2" not in str(info.value)


@pytest.mark.parametrize("name, value", [
    ("spark.cassandra.connection.ssl.enabled", "false"),
    (PROTOCOL, "tls"),
])
def test_default_tls_settings_beside_the_bundle_are_harmless(name, value):
    assert connection(**{CLOUD: BUNDLE, name: value}).cloud_bundle_path == BUNDLE


def test_bundle_is_recorded_and_a_target_json_from_before_it_still_loads():
    cfg = parse_options({**BASE, CLOUD: BUNDLE})
    assert cfg.connection.public_dict()["cloud_bundle_path"] == BUNDLE
    table = TableSchema("ks", "events", (("id", "int"),), ("id",))
    recorded = Target(parse_options(BASE), table, ("id",)).to_dict()
    del recorded["config"]["connection"]["cloud_bundle_path"]  # as older versions wrote it
    again = Target.from_dict(recorded)
    assert again.config.connection.cloud_bundle_path is None
    assert again.config == parse_options(BASE)


def test_missing_bundle_names_the_option(tmp_path):
    missing = str(tmp_path / "absent.zip")
    with pytest.raises(OptionError) as info:
        connect(ConnectionConfig(cloud_bundle_path=missing))
    assert info.value.option == CLOUD and "no such file" in info.value.reason


def test_bundle_that_is_not_a_zip_names_the_option(tmp_path):
    bundle = tmp_path / "bundle.zip"
    bundle.write_text("not a zip")
    with pytest.raises(OptionError) as info:
        connect(ConnectionConfig(cloud_bundle_path=str(bundle)))
    assert info.value.option == CLOUD and "zip" in info.value.reason


def test_unreadable_bundle_contents_fail_as_a_connection_naming_the_bundle(tmp_path):
    import zipfile

    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        z.writestr("readme.txt", "no config.json here")
    with pytest.raises(ConnectionFailed) as info:
        connect(ConnectionConfig(cloud_bundle_path=str(bundle), password="hunter2"))
    assert f"secure connect bundle {bundle}" in str(info.value)
    assert "hunter2" not in str(info.value)
