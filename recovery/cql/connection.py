"""Opening a cassandra-driver session from a :class:`~recovery.cql.config.ConnectionConfig`.

One place builds clusters, so the sink's validation, the flusher, recovery and the tools all
connect the same way: token-aware routing (cassandra-driver's default), the configured local DC,
protocol v5 when the node speaks it, credentials that never reach a log line.
"""

from __future__ import annotations

import logging
import os.path

from cassandra import AuthenticationFailed, DriverException

from .config import TLS_PROTOCOLS, ConnectionConfig, tls_protocol
from .credentials import OPTION_OF
from .errors import REDACTED, ConnectionFailed, OptionError

log = logging.getLogger(__name__)


def _redact(text: str, conn: ConnectionConfig) -> str:
    for secret in conn.secrets():
        text = text.replace(secret, REDACTED)
    return text


_CLOUD_OPTION = "spark.cassandra.connection.config.cloud.path"
_AUTH_HINT = (f"authentication failed: check {OPTION_OF['username']} and "
              f"{OPTION_OF['password']}")
_TRUST_HINT = ("TLS: the node's certificate is not trusted: "
               "spark.cassandra.connection.ssl.trustStore.path must be a PEM file holding the "
               "CA that signed it")
_TLS_HINT = "TLS handshake failed: check the spark.cassandra.connection.ssl.* options"
_PLAINTEXT_HINT = ("the node closed the connection: if it accepts TLS only, set "
                   "spark.cassandra.connection.ssl.enabled=true")


def _explain(reason: str, errors, conn: ConnectionConfig) -> str:
    """Put what most likely went wrong, naming the options to check, before cassandra-driver's
    (already redacted) reason: auth and TLS failures otherwise read as generic connection
    errors. The hints are constants: they cannot hold a secret."""
    lowered = reason.lower()
    if any(isinstance(e, AuthenticationFailed) for e in errors) or "authenticat" in lowered:
        hint = _AUTH_HINT
    elif "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        hint = _TRUST_HINT
    elif "ssl" in lowered or "tls" in lowered:
        hint = _TLS_HINT
    elif not conn.ssl_enabled and any(s in lowered for s in (
            "reset by peer", "connection shutdown", "connectionshutdown", "closed",
            "eof", "timed out")):
        hint = _PLAINTEXT_HINT
    else:
        return reason
    return f"{hint} ({reason})"


def build_cluster(conn: ConnectionConfig):
    """A ``cassandra.cluster.Cluster`` for ``conn`` (not connected yet; with a secure connect
    bundle cassandra-driver reads it and asks the cloud's metadata service for the nodes here).

    cassandra-driver's cluster modules are imported here, on first use: they take about 85 ms to
    import, and Spark's one-shot Python workers import this module twice a micro-batch while needing
    it only when a table's schema must be read (``tests/unit/test_architecture.py``)."""
    from cassandra.cluster import Cluster

    return Cluster(**cluster_kwargs(conn))


def cluster_kwargs(conn: ConnectionConfig) -> dict:
    """The keyword arguments :func:`build_cluster` gives ``Cluster`` (tests check them without
    connecting). Contact points with a port of their own are ``(host, port)`` tuples; the others
    take ``port``. A secure connect bundle replaces contact points, port and TLS: cassandra-driver
    refuses them beside ``cloud``."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=conn.local_dc)),
        consistency_level=conn.consistency_level,
        request_timeout=conn.request_timeout_s,
    )
    kwargs = {"execution_profiles": {EXEC_PROFILE_DEFAULT: profile},
              "connect_timeout": conn.connect_timeout_s,
              "control_connection_timeout": conn.connect_timeout_s}
    if conn.username is not None:
        kwargs["auth_provider"] = PlainTextAuthProvider(conn.username, conn.password or "")
    if conn.cloud_bundle_path is not None:
        kwargs["cloud"] = {"secure_connect_bundle": conn.cloud_bundle_path,
                           "connect_timeout": conn.connect_timeout_s}
        return kwargs
    try:
        kwargs["contact_points"] = conn.contact_points
    except ValueError as exc:  # hosts not parsed by the options (cassandra-wal recover --host)
        raise OptionError("spark.cassandra.connection.host", ",".join(conn.hosts),
                          str(exc)) from None
    kwargs["port"] = conn.port
    ssl_context = _ssl_context(conn)
    if ssl_context is not None:
        kwargs["ssl_context"] = ssl_context
    return kwargs


def _ssl_context(conn: ConnectionConfig):
    if not conn.ssl_enabled:
        return None
    import ssl  # on first use, as the cluster module in build_cluster

    try:  # a WAL recorded before the protocol was checked may hold any text
        lowest, highest = TLS_PROTOCOLS[tls_protocol(conn.ssl_protocol)]
    except ValueError as exc:
        raise OptionError("spark.cassandra.connection.ssl.protocol", conn.ssl_protocol,
                          str(exc)) from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion[lowest]
    ctx.maximum_version = ssl.TLSVersion[highest]
    if conn.ssl_truststore_path:
        ctx.load_verify_locations(cafile=conn.ssl_truststore_path)
    else:
        ctx.load_default_certs()
    if conn.ssl_keystore_path:
        ctx.load_cert_chain(conn.ssl_keystore_path, password=conn.ssl_keystore_password)
    ctx.check_hostname = False  # nodes are addressed by IP; the CA check still applies
    return ctx


def connect(conn: ConnectionConfig):
    """Return ``(cluster, session)``; raises ConnectionFailed naming the hosts, never secrets."""
    from cassandra.cluster import NoHostAvailable  # on first use, as in build_cluster

    where = _where(conn)
    if conn.cloud_bundle_path is not None and not os.path.isfile(conn.cloud_bundle_path):
        raise OptionError(_CLOUD_OPTION, conn.cloud_bundle_path, "no such file on this node")
    try:
        cluster = build_cluster(conn)
    except (DriverException, OSError) as exc:
        if conn.cloud_bundle_path is None:
            raise
        # the bundle is read and the cloud's metadata service asked while the Cluster is built
        raise ConnectionFailed(where, _redact(f"{type(exc).__name__}: {exc}", conn)) from None
    except ValueError as exc:
        if conn.cloud_bundle_path is None:
            raise
        raise OptionError(_CLOUD_OPTION, conn.cloud_bundle_path, str(exc)) from None
    try:
        session = cluster.connect()
    except NoHostAvailable as exc:
        cluster.shutdown()
        reasons = "; ".join(f"{h}: {e}" for h, e in exc.errors.items()) or str(exc)
        reasons = _explain(_redact(reasons, conn), list(exc.errors.values()), conn)
        raise ConnectionFailed(where, reasons) from None
    except Exception as exc:  # auth and TLS failures surface as various cassandra-driver types
        cluster.shutdown()
        reason = _explain(_redact(f"{type(exc).__name__}: {exc}", conn), [exc], conn)
        raise ConnectionFailed(where, reason) from None
    return cluster, session


def _where(conn: ConnectionConfig) -> list[str]:
    """What a connection error names: the contact points, or the secure connect bundle."""
    if conn.cloud_bundle_path is not None:
        return [f"secure connect bundle {conn.cloud_bundle_path}"]
    return list(conn.hosts)
