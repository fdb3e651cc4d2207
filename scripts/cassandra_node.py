"""Run a local single-node Apache Cassandra 5.0 or 4.1 from Maven Central jars (stdlib only).

Used by the ``scripts/cassandra`` command line and by the pytest fixtures in
``tests/conftest.py``.  Layout:

* jars: ``<cache>/<version>/lib`` where ``<cache>`` is ``$CASSANDRA_WAL_CACHE`` or
  ``<repo>/.cache/cassandra``; fetched once with Maven from ``scripts/cassandra-node/pom.xml``
  with its cassandra-all version set to the one asked for (written to ``<cache>/<version>/pom.xml``),
  a ``.complete`` marker is written after a successful copy.
* node dir (default ``<cache>/node-<port>``)::

      node.json        port, storage port, pid, options of the last start
      cassandra.pid    pid of the running JVM (removed by stop)
      conf/            cassandra.yaml, logback.xml (rewritten on every start)
      data/            -Dcassandra.storagedir: data, commitlog, hints, saved_caches
      logs/            system.log (logback), stdout.log (JVM stdout/stderr)

Versions (``start --version``, :data:`RELEASES`): 5.0.8, the default, and 4.1.10, the newest
4.1 that Maven Central serves. Both run on the JDK 17 found here; 4.1 officially supports only
Java 8 and 11, and runs on 17 with three more ``--add-opens`` (see :data:`JAMM_03_OPENS`).
The ``cassandra.yaml`` written is the same for both: every key in it has the same name and
meaning in 4.1 and 5.0 (4.1 introduced the names with units, e.g. ``commitlog_sync_period:
10000ms``, and the ``ssl_context_factory`` used for PEM key stores). A node dir keeps the
version its data was written by (``node.json``): ``start`` without ``--version`` reuses it,
and a start with another version is refused until ``stop --purge``.

Readiness and ``status`` use a tiny raw CQL (native protocol v4) client: STARTUP then
``SELECT release_version FROM system.local``, so no cassandra-driver is needed.

Security (``start --auth`` / ``--tls-keystore``): ``--auth`` turns on PasswordAuthenticator,
CassandraAuthorizer and CassandraRoleManager; the default superuser is ``cassandra`` /
``cassandra`` (created a moment after the node starts: readiness waits until that login works;
the probe logs in with ``$CASSANDRA_WAL_NODE_USERNAME`` / ``$CASSANDRA_WAL_NODE_PASSWORD`` if
set). ``--tls-keystore`` makes the native port TLS-only (``client_encryption_options``,
``optional: false``: plaintext clients are refused); a PEM keystore (private key + certificate
chain in one file) uses Cassandra's ``PEMBasedSslContextFactory``, anything else is read as a
PKCS12 (``.p12``/``.pfx``) or JKS key store. An encrypted PEM key must use a PBE scheme the
JDK knows (``openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES``): with OpenSSL 3's default, PBES2, the
node fails with "PBES2 SecretKeyFactory not available". The probe speaks TLS without
verifying the certificate (it only asks whether the node is up). The key store password is
written only to ``conf/cassandra.yaml`` (mode 0600), never to ``node.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import ssl
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

SCRIPTS_DIR = Path(__file__).resolve().parent
if str(SCRIPTS_DIR) not in sys.path:  # local_server.py, however this file is loaded
    sys.path.insert(0, str(SCRIPTS_DIR))

import local_server  # noqa: E402
from local_server import HOST, free_port, log, port_in_use  # noqa: E402

CASSANDRA_VERSION = "5.0.8"  # the default of `start`; see RELEASES for the others
DEFAULT_PORT = 9042
DEFAULT_TIMEOUT = 180.0
DEFAULT_HEAP = "1g"
ENV_JVM_EXTRA_OPTS = "CASSANDRA_WAL_JVM_EXTRA_OPTS"
STOP_TIMEOUT = 30.0
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

POM = SCRIPTS_DIR / "cassandra-node" / "pom.xml"
CACHE = local_server.Cache("CASSANDRA_WAL_CACHE", "cassandra")

# JPMS flags from Cassandra 5.0's conf/jvm17-server.options.
JVM17_MODULE_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc",
        "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry",
        "java.rmi/sun.rmi.server",
        "java.sql/java.sql",
        "java.base/java.lang.ref",
        "jdk.unsupported/sun.misc",
        "jdk.compiler/com.sun.tools.javac.file",
        "jdk.attach/sun.tools.attach",
    )),
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module",
        "java.base/jdk.internal.loader",
        "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect",
        "java.base/jdk.internal.math",
        "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar",
        "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch",
        "java.base/java.io",
        "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac",
        "java.base/java.lang",
        "java.base/java.util",
    )),
    "-Dio.netty.tryReflectionSetAccessible=true",
]

# Cassandra 4.1 measures objects with jamm 0.3.2, which walks their fields by reflection, into
# java.base's classes too; Java 11 only warned, Java 17 refuses unless the package is opened.
# Each of these made a 4.1.10 start on JDK 17 fail ("InaccessibleObjectException: ... module
# java.base does not "opens java.util.concurrent" to unnamed module"), one after the other;
# with the three, it starts and serves prepared writes and batches. 5.0 ships jamm 0.4, which
# needs none of them.
JAMM_03_OPENS = tuple(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
    "java.util.concurrent", "java.util.concurrent.atomic", "java.nio"))


@dataclass(frozen=True)
class Release:
    """A Cassandra version this script runs, and what its launch needs beyond the common
    flags (:data:`JVM17_MODULE_FLAGS`)."""

    version: str
    jvm_flags: tuple[str, ...] = ()


RELEASES: dict[str, Release] = {r.version: r for r in (
    Release(CASSANDRA_VERSION),
    Release("4.1.10", JAMM_03_OPENS),  # the newest 4.1 on Maven Central (2026-11-25)
)}


# System properties that shorten startup of a fresh single node.
FAST_START_PROPS = [
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=0",
]

# With --auth: create the default superuser at once instead of 10 s after startup.
AUTH_START_PROPS = ["-Dcassandra.superuser_setup_delay_ms=0"]
DEFAULT_SUPERUSER = ("cassandra", "cassandra")
ENV_PROBE_USERNAME = "CASSANDRA_WAL_NODE_USERNAME"
ENV_PROBE_PASSWORD = "CASSANDRA_WAL_NODE_PASSWORD"

class CassandraNodeError(local_server.ServerError):
    """A start/stop failure with a message meant for humans."""


class PortInUseError(CassandraNodeError):
    pass


# --------------------------------------------------------------------------------------------
# paths, jars, java


def release(version: Optional[str] = None) -> Release:
    """The :class:`Release` of ``version`` (None: the default); CassandraNodeError naming the
    supported versions if it is not one of them."""
    version = version or CASSANDRA_VERSION
    if version not in RELEASES:
        raise CassandraNodeError(
            f"Cassandra {version} is not supported; supported versions: "
            + ", ".join(v + (" (default)" if v == CASSANDRA_VERSION else "") for v in RELEASES))
    return RELEASES[version]


def lib_dir(version: str = CASSANDRA_VERSION) -> Path:
    return CACHE.root() / version / "lib"


def pom_text(version: str) -> str:
    """The repository's pom with cassandra-all at ``version`` (for the default version, the
    file as it is: a cache fetched from it stays valid)."""
    text = POM.read_text()
    pin = f"<version>{CASSANDRA_VERSION}</version>"
    if text.count(pin) != 1:
        raise CassandraNodeError(f"{POM} should pin cassandra-all to {CASSANDRA_VERSION} once")
    return text.replace(pin, f"<version>{release(version).version}</version>")


def _jars(version: str = CASSANDRA_VERSION) -> local_server.MavenJars:
    lib = lib_dir(version)
    return local_server.MavenJars(
        lib=lib, pom=lib.parent / "pom.xml", text=pom_text(version),
        what=f"Cassandra {version} jars", cost="~1 min", name="Cassandra jars",
        cache_env=CACHE.env_var, needed=f"cassandra-all-{version}", about={"version": version})


def jars_complete(version: str = CASSANDRA_VERSION) -> bool:
    return _jars(version).marker() is not None


def ensure_jars(java_home: Optional[Path] = None, version: str = CASSANDRA_VERSION) -> Path:
    """Return the lib dir, fetching the jars with Maven if the cache is missing/incomplete."""
    _jars(version).ensure(CassandraNodeError, java_home=java_home)
    return lib_dir(version)


def find_java_home() -> Path:
    """A JDK 17 (or 11) home. Cassandra 5.0 and 4.1 refuse newer JDKs (security manager)."""
    return local_server.find_java_home(
        "CASSANDRA_WAL_JAVA_HOME", also=lambda major: major == 11, error=CassandraNodeError,
        none_found="no JDK 17 found (Cassandra 5.0 and 4.1 run on Java 17 or 11, not newer); "
                   "set CASSANDRA_WAL_JAVA_HOME")


# --------------------------------------------------------------------------------------------
# processes


def _config_arg(node_dir: Path) -> str:
    return f"-Dcassandra.config={(node_dir / 'conf' / 'cassandra.yaml').as_uri()}"


# --------------------------------------------------------------------------------------------
# a minimal CQL native-protocol (v4) probe


def _cql_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by server")
        buf += chunk
    return buf


def _cql_request(sock: socket.socket, stream: int, opcode: int, body: bytes):
    sock.sendall(struct.pack(">BBhBI", 0x04, 0, stream, opcode, len(body)) + body)
    _ver, _flags, _stream, op, length = struct.unpack(">BBhBI", _recv_exact(sock, 9))
    payload = _recv_exact(sock, length)
    if op == 0x00:  # ERROR
        code = struct.unpack(">i", payload[:4])[0]
        (mlen,) = struct.unpack(">H", payload[4:6])
        raise ConnectionError(f"CQL error 0x{code:04x}: {payload[6:6 + mlen].decode()}")
    return op, payload


def probe_credentials() -> tuple:
    """(user, password) the readiness probe logs in with on a node started with --auth."""
    return (os.environ.get(ENV_PROBE_USERNAME) or DEFAULT_SUPERUSER[0],
            os.environ.get(ENV_PROBE_PASSWORD) or DEFAULT_SUPERUSER[1])


def probe_ssl_context(cafile: Optional[str] = None) -> ssl.SSLContext:
    """TLS for the probe: verify against ``cafile`` if given, else do not verify (the probe
    only asks a local node whether it is up; it sends nothing secret but the probe login)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if cafile:
        ctx.load_verify_locations(cafile=cafile)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


# Why the last probe of this process got no version (see cql_release_version).
LOGIN_REFUSED = "login refused"
last_probe_failure: Optional[str] = None


def _cql_session(host: str, port: int, timeout: float, credentials: Optional[tuple],
                 ssl_context: Optional[ssl.SSLContext]):
    """A connected, READY raw v4 socket (logged in if the node asks), or None if the node
    is not ready or refuses the login (:data:`last_probe_failure`)."""
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return _cql_ready(raw, timeout, credentials, ssl_context)
    except BaseException:
        raw.close()
        raise


def _cql_ready(raw: socket.socket, timeout: float, credentials: Optional[tuple],
               ssl_context: Optional[ssl.SSLContext]):
    global last_probe_failure
    sock = ssl_context.wrap_socket(raw) if ssl_context is not None else raw
    sock.settimeout(timeout)
    op, _ = _cql_request(sock, 0, 0x01, struct.pack(">H", 1)
                         + _cql_string("CQL_VERSION") + _cql_string("3.0.0"))
    if op == 0x03:  # AUTHENTICATE: SASL PLAIN with the probe's credentials
        last_probe_failure = LOGIN_REFUSED
        if not credentials:
            sock.close()
            return None
        user, password = credentials
        token = b"\0" + user.encode() + b"\0" + password.encode()
        op, _ = _cql_request(sock, 1, 0x0F, struct.pack(">i", len(token)) + token)
        if op != 0x10:  # AUTH_SUCCESS
            sock.close()
            return None
        last_probe_failure = None
    elif op != 0x02:  # READY
        sock.close()
        return None
    return sock


def _rows(p: bytes) -> Optional[List[List[Optional[bytes]]]]:
    """The rows of a RESULT/Rows body, each a list of raw cell values (None for null). Only
    columns of types without parameters (text, uuid, inet, bigint, ...) are understood: None
    for a result with a collection, tuple, UDT or custom column."""
    if struct.unpack(">i", p[:4])[0] != 2:  # not Rows
        return None
    pos = 4
    flags, ncols = struct.unpack(">ii", p[pos:pos + 8])
    pos += 8
    if flags & 0x0002:  # paging state
        (n,) = struct.unpack(">i", p[pos:pos + 4])
        pos += 4 + max(n, 0)

    def skip_string(pos: int) -> int:
        return pos + 2 + struct.unpack(">H", p[pos:pos + 2])[0]

    if not flags & 0x0004:  # metadata present
        if flags & 0x0001:  # global table spec
            pos = skip_string(skip_string(pos))
        for _ in range(ncols):
            if not flags & 0x0001:
                pos = skip_string(skip_string(pos))
            pos = skip_string(pos)  # name
            (type_id,) = struct.unpack(">H", p[pos:pos + 2])
            if type_id == 0 or type_id >= 0x20:  # custom, list, map, set, UDT, tuple
                return None
            pos += 2
    (nrows,) = struct.unpack(">i", p[pos:pos + 4])
    pos += 4
    rows = []
    for _ in range(nrows):
        row = []
        for _ in range(ncols):
            (n,) = struct.unpack(">i", p[pos:pos + 4])
            pos += 4
            row.append(p[pos:pos + n] if n >= 0 else None)
            pos += max(n, 0)
        rows.append(row)
    return rows


def cql_rows(port: int, host: str, query: str, timeout: float = 3.0, *,
             credentials: Optional[tuple] = None,
             ssl_context: Optional[ssl.SSLContext] = None) -> Optional[List[list]]:
    """Run ``query`` (a SELECT of columns without type parameters) over a raw v4 connection
    and return its rows of raw cell values; None if the node does not answer CQL (yet) or
    refuses the login (then :data:`last_probe_failure` is :data:`LOGIN_REFUSED`)."""
    global last_probe_failure
    last_probe_failure = None
    try:
        sock = _cql_session(host, port, timeout, credentials, ssl_context)
        if sock is None:
            return None
        with sock:
            q = query.encode()
            op, p = _cql_request(sock, 1, 0x07,
                                 struct.pack(">I", len(q)) + q + struct.pack(">HB", 0x0001, 0))
            return _rows(p) if op == 0x08 else None  # RESULT
    except (OSError, ConnectionError, struct.error, ssl.SSLError):
        return None  # an error answer to the login keeps last_probe_failure = LOGIN_REFUSED


def cql_release_version(port: int, host: str = HOST, timeout: float = 3.0, *,
                        credentials: Optional[tuple] = None,
                        ssl_context: Optional[ssl.SSLContext] = None) -> Optional[str]:
    """``SELECT release_version FROM system.local`` over a raw v4 connection
    (:func:`cql_rows`): the version string, or None if the node does not answer CQL (yet).
    A node that asks for authentication gets ``credentials`` (user, password) over SASL
    PLAIN; without them, or while they are refused (the default superuser is not created
    yet), it is not ready, and :data:`last_probe_failure` is :data:`LOGIN_REFUSED`.
    ``ssl_context``: speak TLS (a TLS-only node drops a plaintext client).
    """
    rows = cql_rows(port, host, "SELECT release_version FROM system.local", timeout,
                    credentials=credentials, ssl_context=ssl_context)
    if rows is None:
        return None
    try:
        return rows[0][0].decode() if rows and rows[0][0] is not None else ""
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------------------------
# node state and configuration


@dataclass
class NodeInfo:
    node_dir: str
    port: int
    storage_port: int = 0
    pid: Optional[int] = None
    fast: bool = False
    heap: str = DEFAULT_HEAP
    java: str = ""
    version: str = CASSANDRA_VERSION
    started_at: Optional[float] = None
    auth: bool = False                  # PasswordAuthenticator (default superuser cassandra)
    tls_keystore: Optional[str] = None  # native port is TLS-only; its password is not kept here
    extra: dict = field(default_factory=dict)
    # One node of a cluster (scripts/cassandra_cluster.py); a single node keeps the defaults.
    host: str = HOST                    # listen and rpc address: a loopback address 127.0.0.x
    membership: Optional[dict] = None   # {"cluster_name", "seeds", "initial_token"}
    # More JVM options, after the script's own (CASSANDRA_WAL_JVM_EXTRA_OPTS, as Cassandra's
    # own scripts take JVM_EXTRA_OPTS); the tests give -XX:TieredStopAtLevel=1.
    jvm_extra_opts: List[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def probe(self, timeout: float = 3.0) -> Optional[str]:
        """release_version over CQL as this node expects it (login, TLS), None if not up."""
        return cql_release_version(
            self.port, self.host, timeout=timeout,
            credentials=probe_credentials() if self.auth else None,
            ssl_context=probe_ssl_context() if self.tls_keystore else None)




def _is_pem(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"-----BEGIN" in fh.read(65536)
    except OSError as e:
        raise CassandraNodeError(f"cannot read TLS key store {path}: {e}")


def _security_yaml(info: NodeInfo, tls_keystore_password: Optional[str]) -> str:
    if info.auth:
        lines = ["authenticator: PasswordAuthenticator", "authorizer: CassandraAuthorizer",
                 "role_manager: CassandraRoleManager"]
    else:
        lines = ["authenticator: AllowAllAuthenticator", "authorizer: AllowAllAuthorizer"]
    if info.tls_keystore:
        lines += ["client_encryption_options:",
                  "  enabled: true",
                  "  optional: false",   # TLS only: plaintext clients are refused
                  "  require_client_auth: false",
                  f"  keystore: {json.dumps(info.tls_keystore)}"]
        if tls_keystore_password is not None:
            lines.append(f"  keystore_password: {json.dumps(tls_keystore_password)}")
        if _is_pem(info.tls_keystore):
            lines += ["  ssl_context_factory:",
                      "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory"]
        elif info.tls_keystore.lower().endswith((".p12", ".pfx")):
            lines.append("  store_type: PKCS12")
    return "\n".join(lines) + "\n"


def _membership_yaml(info: NodeInfo) -> tuple[str, str, str]:
    """(cluster_name, seeds, extra lines): a single node is its own seed; a cluster's node
    gets the cluster's name, seeds and token, and joins without bootstrapping (every node of
    a new cluster starts empty: there is nothing to stream)."""
    if not info.membership:
        return f"cassandra-wal-{info.port}", f"{info.host}:{info.storage_port}", ""
    m = info.membership
    extra = f"initial_token: {m['initial_token']}\nauto_bootstrap: false\n"
    return m["cluster_name"], m["seeds"], extra


def render_cassandra_yaml(info: NodeInfo, tls_keystore_password: Optional[str] = None) -> str:
    cluster_name, seeds, membership = _membership_yaml(info)
    return f"""\
# Written by scripts/cassandra_node.py on every start; edits are overwritten.
cluster_name: '{cluster_name}'
num_tokens: 1
{membership}partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
listen_address: {info.host}
rpc_address: {info.host}
storage_port: {info.storage_port}
native_transport_port: {info.port}
start_native_transport: true
commitlog_sync: periodic
commitlog_sync_period: 10000ms
auto_snapshot: false
{_security_yaml(info, tls_keystore_password)}# data, commitlog, hints, saved_caches and cdc_raw live under -Dcassandra.storagedir
"""


def render_logback_xml(node_dir: Path) -> str:
    logs = node_dir / "logs"
    return f"""\
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>{logs / 'system.log'}</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>{logs / 'system.log.%i'}</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>3</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>50MB</maxFileSize>
    </triggeringPolicy>
    <encoder>
      <pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <logger name="org.apache.cassandra.utils.SigarLibrary" level="ERROR"/>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
"""


def java_command(info: NodeInfo, java_home: Path, lib: Path) -> List[str]:
    node_dir = Path(info.node_dir)
    jamm = sorted(lib.glob("jamm-*.jar"))
    cmd = [str(java_home / "bin" / "java"),
           f"-Xms{info.heap}", f"-Xmx{info.heap}", "-Xss256k",
           "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-XX:+PerfDisableSharedMem"]
    if jamm:
        cmd.append(f"-javaagent:{jamm[-1]}")
    cmd += JVM17_MODULE_FLAGS
    cmd += release(info.version).jvm_flags
    cmd += info.jvm_extra_opts
    cmd += [
        "-Djava.net.preferIPv4Stack=true",
        "-Dcassandra-foreground=yes",
        _config_arg(node_dir),
        f"-Dcassandra.storagedir={node_dir / 'data'}",
        f"-Dcassandra.logdir={node_dir / 'logs'}",
        f"-Dlogback.configurationFile={(node_dir / 'conf' / 'logback.xml').as_uri()}",
        *FAST_START_PROPS,
    ]
    if info.auth:
        cmd += AUTH_START_PROPS
    if info.fast:
        cmd.append("-Dcassandra.unsafesystem=true")
    cmd += ["-cp", str(lib / "*"), MAIN_CLASS]
    return cmd


def tail_logs(node_dir: Path, lines: int = 40) -> str:
    logs = Path(node_dir) / "logs"
    return local_server.tail_logs([logs / "system.log", logs / "stdout.log"], lines,
                                  nothing=f"(no logs in {node_dir}/logs)")


KIND = local_server.ServerKind(
    noun="node", cache=CACHE, default_port=DEFAULT_PORT, state=NodeInfo, dir_key="node_dir",
    state_file="node.json", pid_file="cassandra.pid", files=("data", "logs", "conf"),
    matches=lambda pid, d: local_server.runs_with(pid, MAIN_CLASS, _config_arg(d)),
    tail=tail_logs, error=CassandraNodeError, port_error=PortInUseError)


# --------------------------------------------------------------------------------------------
# start / stop / status


# Nodes launched by this process with wait=False, until wait_started() reaps them.
_launched: dict = {}


def _security_mismatch(info: NodeInfo, auth: bool, tls_keystore: Optional[str]) -> Optional[str]:
    """Why a running node cannot serve a start asking for ``auth`` / ``tls_keystore``; None
    if it can. A start without security options reuses a node whatever it runs with."""
    want = (bool(auth), str(Path(tls_keystore).resolve()) if tls_keystore else None)
    have = (bool(info.auth), info.tls_keystore)
    if (not auth or info.auth) and (not tls_keystore or want[1] == have[1]):
        return None
    def describe(a, t):
        return ", ".join(filter(None, ["auth" if a else "no auth",
                                       f"TLS ({t})" if t else "no TLS"]))
    asked = ", ".join(filter(None, ["auth" if auth else "", f"TLS ({want[1]})" if want[1] else ""]))
    return f"it runs with {describe(*have)}, and this start asks for {asked}"


def start(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None, *,
          timeout: float = DEFAULT_TIMEOUT, fast: bool = False, heap: Optional[str] = None,
          die_with_parent: bool = False, quiet: bool = False, auth: bool = False,
          tls_keystore: Optional[os.PathLike] = None,
          tls_keystore_password: Optional[str] = None, wait: bool = True,
          version: Optional[str] = None, host: Optional[str] = None,
          storage_port: Optional[int] = None, membership: Optional[dict] = None) -> NodeInfo:
    """Start (or reuse) the node of node_dir and wait until CQL answers.

    The JVM runs in its own session (a Ctrl-C in the terminal does not reach it).
    die_with_parent: ask the kernel to SIGTERM the JVM when the calling *thread* exits
    (test fixtures: a SIGKILLed pytest does not leak a node; needs util-linux `setpriv`).
    auth: PasswordAuthenticator etc. (superuser cassandra/cassandra); tls_keystore (+password):
    TLS-only native port (see the module docstring).
    version: one of :data:`RELEASES`; None: the version of the dir's data if it has some (or
    of its running node), else :data:`CASSANDRA_VERSION`. Another version than the one of the
    dir's node or data is refused.
    wait=False: return as soon as the JVM is launched; call :func:`wait_started` with the
    result (lets a caller boot several nodes at once from one thread).
    host, storage_port, membership: a node of a cluster (``cassandra_cluster.py``): its loopback
    address, the storage port every node of the cluster uses, and the cluster's name, seeds
    and this node's token (:class:`NodeInfo`); None: the dir's recorded ones, else a single
    node on 127.0.0.1 with a free storage port.
    Raises PortInUseError / CassandraNodeError on failure.
    """
    if version is not None:
        release(version)  # refuse an unknown version before anything else
    port, node_dir = KIND.resolve(port, node_dir)
    heap = heap or os.environ.get("CASSANDRA_WAL_HEAP") or DEFAULT_HEAP
    node_dir.mkdir(parents=True, exist_ok=True)
    tls_keystore = str(Path(tls_keystore).expanduser().resolve()) if tls_keystore else None
    if tls_keystore and not Path(tls_keystore).is_file():
        raise CassandraNodeError(f"TLS key store {tls_keystore} does not exist")
    say = (lambda m: None) if quiet else log
    with KIND.lock(node_dir):
        info = KIND.running(node_dir, port)
        if info:
            pid = info.pid
            KIND.refuse_other_port(info, port)
            if version and version != info.version:
                raise CassandraNodeError(f"node in {node_dir} is already running Cassandra "
                                         f"{info.version} (pid {pid}); stop it first to run "
                                         f"{version}")
            mismatch = _security_mismatch(info, auth, tls_keystore)
            if mismatch:
                raise CassandraNodeError(f"node in {node_dir} is already running (pid {pid}) but "
                                         f"{mismatch}; stop it first")
            if not wait:
                return info
            try:
                if local_server.wait_until(info.probe, KIND.still_ours(pid, node_dir), timeout,
                                           interval=0.5) is None:
                    raise CassandraNodeError(f"node in {node_dir} (pid {pid}) died while starting\n"
                                             + tail_logs(node_dir))
            except TimeoutError:
                raise CassandraNodeError(f"node in {node_dir} (pid {pid}) runs but does not answer "
                                         f"CQL on {info.address}\n" + tail_logs(node_dir))
            return info
        prev = KIND.load(node_dir)
        host = host or (prev.host if prev else HOST)
        membership = membership or (prev.membership if prev else None)
        alone = membership is None  # a cluster's nodes share their ports on other addresses
        KIND.require_free((port, "port"), host=host, wildcard=alone)
        if storage_port is not None:
            KIND.require_free((storage_port, "storage port"), host=host, wildcard=alone)
        else:
            storage_port = prev.storage_port if prev and prev.storage_port else 0
            if not storage_port or storage_port == port or port_in_use(storage_port, host):
                storage_port = free_port(exclude=(port,))

        java_home = find_java_home()
        version = _version_for(node_dir, prev, version)
        lib = ensure_jars(java_home, version)
        info = NodeInfo(node_dir=str(node_dir), port=port, storage_port=storage_port,
                        fast=fast, heap=heap, java=str(java_home / "bin" / "java"),
                        auth=bool(auth), tls_keystore=tls_keystore, version=version,
                        host=host, membership=membership,
                        jvm_extra_opts=os.environ.get(ENV_JVM_EXTRA_OPTS, "").split())
        for sub in ("conf", "data", "logs"):
            (node_dir / sub).mkdir(exist_ok=True)
        yaml_path = node_dir / "conf" / "cassandra.yaml"
        yaml_path.unlink(missing_ok=True)  # recreated 0600: it may hold the key store password
        fd = os.open(yaml_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(render_cassandra_yaml(info, tls_keystore_password))
        (node_dir / "conf" / "logback.xml").write_text(render_logback_xml(node_dir))

        cmd = java_command(info, java_home, lib)
        setpriv = shutil.which("setpriv") if die_with_parent else None
        if setpriv:
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        extras = ", ".join(filter(None, ["auth" if auth else "", "TLS only" if tls_keystore else ""]))
        say(f"starting Cassandra {version} on {info.address} "
            f"(storage port {storage_port}, dir {node_dir}{', ' + extras if extras else ''}) ...")
        proc = KIND.launch(info, cmd, node_dir / "logs" / "stdout.log",
                           local_server.java_env(java_home))
        # Give setpriv a moment to exec java so the cmdline check sees CassandraDaemon.
        exec_deadline = time.monotonic() + 5
        while (setpriv and proc.poll() is None and time.monotonic() < exec_deadline
               and MAIN_CLASS not in local_server.read_cmdline(proc.pid)):
            time.sleep(0.02)
        _launched[str(node_dir)] = proc
        if not wait:
            return info
        return wait_started(info, timeout, quiet=quiet)


def _version_for(node_dir: Path, prev: Optional[NodeInfo], asked: Optional[str]) -> str:
    """The version to start node_dir with: ``asked``, else the one its data was written by,
    else the default. Refused if the dir holds another version's data: a node does not read
    the data of a newer one, and this script does not run upgrades."""
    data = node_dir / "data"
    has_data = prev is not None and data.is_dir() and any(data.iterdir())
    if asked is None:
        return prev.version if has_data else CASSANDRA_VERSION
    if has_data and prev.version != asked:
        raise CassandraNodeError(
            f"{node_dir} holds the data of Cassandra {prev.version}; this start asks for "
            f"{asked}: `stop --purge` it first, or use another --dir")
    return asked


def wait_started(info: NodeInfo, timeout: float = DEFAULT_TIMEOUT, *,
                 quiet: bool = False) -> NodeInfo:
    """Wait for a node launched by ``start(..., wait=False)`` to answer CQL (and the probe
    login to work); on failure (JVM exited, timeout, interrupt) kill it and raise."""
    say = (lambda m: None) if quiet else log
    node_dir = Path(info.node_dir)
    proc = _launched.pop(str(node_dir), None)
    if proc is None:  # it was already running: same checks as start() on a running node
        return start(info.port, node_dir, timeout=timeout, quiet=True, auth=info.auth,
                     tls_keystore=info.tls_keystore, version=info.version)
    t0 = info.started_at or time.time()
    not_ready = f"did not answer CQL within {timeout:.0f}s" + (
        " (with --auth: or the probe login was refused)" if info.auth else "")
    version = KIND.wait_launched(proc, node_dir, info.probe, timeout=timeout, interval=0.5,
                                 what=f"Cassandra in {node_dir}", not_ready=lambda: not_ready,
                                 kill_timeout=10)
    info.extra = {"release_version": version, "startup_seconds": round(time.time() - t0, 1)}
    KIND.save(info)
    say(f"Cassandra {version} is up on {info.address} after "
        f"{info.extra['startup_seconds']}s (pid {proc.pid})")
    return info


def stop(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None, *,
         purge: bool = False, timeout: float = STOP_TIMEOUT) -> Optional[int]:
    """Stop the node of node_dir; returns the pid that was stopped (None if none ran)."""
    return KIND.stop(port, node_dir, purge=purge, timeout=timeout)


def status(port: Optional[int] = None, node_dir: Optional[os.PathLike] = None) -> dict:
    """{'state': 'up'|'starting'|'down', 'pid', 'address', ...}."""
    port, node_dir, info, pid = KIND.observe(port, node_dir)
    probe_as = (info if info and info.port == port
                else NodeInfo(str(node_dir), port, host=info.host if info else HOST))
    version = probe_as.probe() if pid else None
    refused = pid is not None and version is None and last_probe_failure == LOGIN_REFUSED
    state = "up" if pid and version is not None else ("starting" if pid else "down")
    result = KIND.status(
        state, pid, port, host=probe_as.host, address=probe_as.address, node_dir=str(node_dir),
        storage_port=info.storage_port if info else None,
        version=info.version if info else None, release_version=version,
        log=str(node_dir / "logs" / "system.log"), auth=bool(info and info.auth),
        tls=bool(info and info.tls_keystore))
    if state == "down" and port_in_use(port):
        result["note"] = f"port {port} is in use by another process"
    if refused:
        result["note"] = (f"it answers but refused the probe's login as {probe_credentials()[0]!r} "
                          f"(the default superuser is created a moment after start; if its "
                          f"password was changed, set {ENV_PROBE_USERNAME} / {ENV_PROBE_PASSWORD})")
    return result


# --------------------------------------------------------------------------------------------
# command line


EPILOG = """\
examples:
  scripts/cassandra cluster --help             # a cluster of several nodes: cluster start|stop|...
  scripts/cassandra start                      # node on 127.0.0.1:9042, dir .cache/cassandra/node-9042
  scripts/cassandra start --port 19042 --fast  # another port; unsafe (no fsync) system tables
  export CASSANDRA_PORT=$(scripts/cassandra start --port 19042 | cut -d: -f2)
  scripts/cassandra status --port 19042 --json
  scripts/cassandra stop --port 19042 --purge  # stop and delete its data
  scripts/cassandra start --dir /tmp/n1 --port 9142 --timeout 300
  scripts/cassandra start --port 19142 --dir /tmp/n41 --version 4.1.10
                                               # Cassandra 4.1 (its own jars and dir)
  scripts/cassandra start --port 19042 --auth  # PasswordAuthenticator; superuser cassandra/cassandra
  KS_PW=secret scripts/cassandra start --port 19042 --tls-keystore node.pem --tls-keystore-password-env KS_PW
                                               # TLS-only native port (PEM: key + cert chain)

stdout of `start` is exactly HOST:PORT; progress and errors go to stderr.
exit codes: 0 ok / up; 1 failure / down.
environment:
  CASSANDRA_WAL_CACHE      cache root instead of <repo>/.cache/cassandra (jars in
                           <root>/<version>/lib, e.g. <root>/%s/lib)
  CASSANDRA_WAL_JAVA_HOME  JDK to run Cassandra with (default: the system JDK 17)
  CASSANDRA_WAL_HEAP       heap size (default %s)
  CASSANDRA_WAL_FAST=1     same as --fast
  CASSANDRA_WAL_JVM_EXTRA_OPTS
                           more JVM options, as Cassandra's own JVM_EXTRA_OPTS (the tests
                           give -XX:TieredStopAtLevel=1: a third less CPU a start)
  CASSANDRA_WAL_NODE_USERNAME / CASSANDRA_WAL_NODE_PASSWORD
                           login of the readiness/status probe on an --auth node
                           (default cassandra / cassandra)
""" % (CASSANDRA_VERSION, DEFAULT_HEAP)


def _parser() -> argparse.ArgumentParser:
    cli = local_server.CommandLine(
        "cassandra",
        f"Run a local single-node Apache Cassandra ({', '.join(RELEASES)}; default "
        f"{CASSANDRA_VERSION}; jars from Maven Central, JDK 17) for development and tests.",
        EPILOG,
        port_help=f"CQL native port (default: the dir's recorded port, else {DEFAULT_PORT})",
        dir_dest="node_dir", dir_help="node directory (default: <cache>/node-<port>)")
    s = cli.command("start", "start a node (no-op if already up)")
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for CQL (default {DEFAULT_TIMEOUT:.0f})")
    s.add_argument("--fast", action="store_true",
                   default=os.environ.get("CASSANDRA_WAL_FAST", "") not in ("", "0"),
                   help="tests only: -Dcassandra.unsafesystem=true (system tables not fsynced)")
    s.add_argument("--heap", default=None, help=f"JVM heap, e.g. 512m, 2g (default {DEFAULT_HEAP})")
    s.add_argument("--version", default=None, metavar="VERSION",
                   help=f"Cassandra version: {', '.join(RELEASES)} (default: the version of the "
                        f"dir's data, else {CASSANDRA_VERSION})")
    s.add_argument("--auth", action="store_true",
                   help="password authentication (PasswordAuthenticator, CassandraAuthorizer, "
                        "CassandraRoleManager); the default superuser is cassandra/cassandra")
    s.add_argument("--tls-keystore", metavar="PATH", default=None,
                   help="make the native port TLS-only with this key store: PEM (private key + "
                        "certificate chain in one file), PKCS12 (.p12/.pfx) or JKS")
    pw = s.add_mutually_exclusive_group()
    pw.add_argument("--tls-keystore-password", metavar="PW", default=None,
                    help="password of the key store (PEM: of an encrypted private key); "
                         "visible in `ps`: prefer --tls-keystore-password-env")
    pw.add_argument("--tls-keystore-password-env", metavar="VAR", default=None,
                    help="environment variable holding the key store password")
    cli.stop_command("stop the node (SIGTERM, then SIGKILL)",
                     "also delete the node's data, logs and config", STOP_TIMEOUT)
    cli.command("status", "is the node up? (exit 0 up, 1 not)")
    return cli.parser


def _start_command(args) -> int:
    password = args.tls_keystore_password
    if args.tls_keystore_password_env:
        password = os.environ.get(args.tls_keystore_password_env)
        if password is None:
            raise CassandraNodeError(
                f"--tls-keystore-password-env: ${args.tls_keystore_password_env} is not set")
    if password is not None and not args.tls_keystore:
        raise CassandraNodeError("a key store password needs --tls-keystore")
    info = start(args.port, args.node_dir, timeout=args.timeout, fast=args.fast,
                 heap=args.heap, auth=args.auth, tls_keystore=args.tls_keystore,
                 tls_keystore_password=password, version=args.version)
    return local_server.answer(args, {"address": info.address, **asdict(info)},
                               info.address)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cluster"]:
        import cassandra_cluster
        return cassandra_cluster.main(argv[1:])
    return local_server.main(
        _parser().parse_args(argv), KIND, start=_start_command,
        status=lambda args: status(args.port, args.node_dir),
        up="up: pid {pid} at {address} (Cassandra {release_version}, dir {node_dir})",
        starting="starting: pid {pid}, {address} not answering CQL yet (log {log})")


if __name__ == "__main__":
    sys.exit(main())
