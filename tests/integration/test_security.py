"""Security end to end: authentication, TLS, WAL permissions, and no secrets at rest or in logs.

Two nodes of this module's own, booted together (module-scoped, stopped and purged at the end):

* an *auth* node (``scripts/cassandra start --auth``): PasswordAuthenticator; the test logs in
  as the default superuser ``cassandra`` and creates the role :data:`ROLE` with the
  recognisable password :data:`PASSWORD`, which the sink gets as write options only;
* a *TLS* node (``--tls-keystore``): a TLS-only native port, with a server certificate signed
  by a CA made here with ``openssl`` (and a second, wrong CA).

Every secret used here contains :data:`MARK`, so the secret search can look for all at once.

Time: both nodes and the secret search's driver program (a Spark application of its own) are
launched as early as pytest allows and run beside the other tests (:func:`_early_start`); on
the shared 2-core test machine a node takes 15-60 s to boot and a one-batch stream 10-60 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from sinkutil import (
    REPO_ROOT,
    cassandra_wal,
    committed_batches,
    count_rows,
    create_table,
    error_text,
    read_table,
    register,
    running,
    sink_options,
    stream_wal,
    wait_all_flushed,
    wait_log_released,
    wait_query_done,
    wal_files,
    write_json_files,
)

from recovery.cql import credentials
from recovery.cql.errors import OptionError
from sinks.worker.plan import open_wal_dir
from wal.layout import WalDir

pytestmark = pytest.mark.integration


MARK = "Quokka7c41"                                  # in every secret below
PASSWORD = f"{MARK}-Right-Pw-zq81"                   # the role's password
WRONG_PASSWORD = f"{MARK}-Wrong-Pw-hh20"
CLIENT_KEY_PASSWORD = f"{MARK}-Client-Key-Pw-m3"     # spark.cassandra.connection.ssl.keyStore.password
NODE_KEYSTORE_PASSWORD = "node-keystore-pw-61"       # the TLS node's own key store (test infra)
ROLE = "wal_writer"
SECRET_TEST = "test_no_secret_in_wal_checkpoint_logs_errors_or_tool_output"
SCHEMA = "id INT, name STRING"


# ------------------------------------------------------------------------------ nodes
from tests.helpers.node import load_cassandra_node_module, start_timeout  # noqa: E402

cn = load_cassandra_node_module()


@dataclass
class Node:
    host: str
    port: int
    node_dir: Path


@dataclass
class Pki:
    ca: Path                 # CA that signed the TLS node's certificate (PEM)
    wrong_ca: Path           # an unrelated CA (PEM)
    node_keystore: Path      # the node's encrypted private key + certificate (PEM)
    client_key: Path         # a client certificate + encrypted key (PEM), for the secret search
    client_key_marker: str   # a line of that key's base64: must never be copied anywhere


def _openssl(cwd: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"openssl {' '.join(args)}: {result.stderr}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    """A CA, a wrong CA, the node's key store and a client key, made with ``openssl``
    (the ``cryptography`` package is not installed here)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    for name in ("ca", "wrong-ca"):
        _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=cassandra-wal test {name}")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                  "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, pw in (("server", NODE_KEYSTORE_PASSWORD), ("client", CLIENT_KEY_PASSWORD)):
        _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN=127.0.0.1 {name}")
        _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
        # PKCS#8 encrypted with a PBE scheme the JDK's SecretKeyFactory knows: Cassandra's
        # PEMReader cannot read OpenSSL 3's default (PBES2: "PBES2 SecretKeyFactory not
        # available" on JDK 17).
        _openssl(d, "pkcs8", "-topk8", "-in", f"{name}.key", "-v1", "PBE-SHA1-3DES",
                 "-passout", f"pass:{pw}", "-out", f"{name}.enc.key")
        pem = d / f"{name}.pem"
        pem.write_text((d / f"{name}.enc.key").read_text() + (d / f"{name}.crt").read_text())
        pem.chmod(0o600)
    key_lines = (d / "client.enc.key").read_text().splitlines()
    return Pki(ca=d / "ca.pem", wrong_ca=d / "wrong-ca.pem", node_keystore=d / "server.pem",
               client_key=d / "client.pem", client_key_marker=key_lines[3])


def _selected_here(request, fixture: str) -> bool:
    """Does any selected test of this module use ``fixture``?"""
    return any(getattr(item, "module", None) is not None and item.module.__name__ == __name__
               and fixture in getattr(item, "fixturenames", ())
               for item in request.session.items)


def _selected_test(request, name: str) -> bool:
    """Is the test ``name`` of this module selected?"""
    return any(getattr(item, "module", None) is not None and item.module.__name__ == __name__
               and item.name == name for item in request.session.items)


def _stop_nodes(dirs) -> None:
    for d in dirs:
        try:
            cn.stop(None, d, purge=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _early_start(request, pki, tmp_path_factory):
    """Start the slow things as early as pytest allows (before the session's Spark, when this
    module runs first), without waiting: the auth and TLS nodes (15-60 s each to boot on a
    loaded 2-core box) and the secret search's driver program (its own Spark). Fixtures
    below wait for them; the nodes are stopped when the module ends."""
    started = {"nodes": None, "secret": None}
    dirs = []
    try:
        if _selected_here(request, "secure_nodes"):
            dirs = [Path(tempfile.mkdtemp(prefix=f"cassandra-wal-node-{kind}-"))
                    for kind in ("auth", "tls")]
            auth = cn.start(cn.free_port(), dirs[0], fast=True, die_with_parent=True,
                            heap="512m", auth=True, wait=False)
            tls = cn.start(cn.free_port(exclude=(auth.port, auth.storage_port)), dirs[1],
                           fast=True, die_with_parent=True, heap="512m",
                           tls_keystore=pki.node_keystore,
                           tls_keystore_password=NODE_KEYSTORE_PASSWORD, wait=False)
            started["nodes"] = {"dirs": dirs, "infos": [auth, tls]}
        if _selected_test(request, SECRET_TEST):
            started["secret"] = _launch_secret_driver(tmp_path_factory.mktemp("secret-run"))
        yield started
    finally:
        _kill_secret_driver(started["secret"])
        _stop_nodes(dirs)   # a no-op when secure_nodes stopped them already


@pytest.fixture(scope="module")
def secure_nodes(_early_start):
    """(auth node, TLS node): up, answering CQL (the auth node: the superuser login works)."""
    boot = _early_start["nodes"]
    assert boot is not None, "_early_start did not see a test using secure_nodes"
    try:
        for info in boot["infos"]:
            cn.wait_started(info, start_timeout())
        auth, tls = boot["infos"]
        yield (Node(cn.HOST, auth.port, boot["dirs"][0]), Node(cn.HOST, tls.port, boot["dirs"][1]))
    finally:
        _stop_nodes(boot["dirs"])


def _session(node: Node, username=None, password=None, ca: Path | None = None):
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile

    kwargs = {}
    if username:
        kwargs["auth_provider"] = PlainTextAuthProvider(username, password)
    if ca:
        kwargs["ssl_context"] = cn.probe_ssl_context(str(ca))
    cluster = Cluster([node.host], port=node.port, connect_timeout=20,
                      execution_profiles={EXEC_PROFILE_DEFAULT: ExecutionProfile(request_timeout=60)},
                      **kwargs)
    return cluster, cluster.connect()


@dataclass
class AuthEnv:
    node: Node
    admin: object         # CQL session as the superuser
    keyspace: str


@pytest.fixture(scope="module")
def auth_env(secure_nodes):
    node = secure_nodes[0]
    cluster, admin = _session(node, *cn.DEFAULT_SUPERUSER)
    keyspace = f"sec_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    admin.execute(f"CREATE ROLE {ROLE} WITH PASSWORD = '{PASSWORD}' AND LOGIN = true")
    admin.execute(f"GRANT MODIFY ON KEYSPACE {keyspace} TO {ROLE}")   # all the sink needs
    try:
        yield AuthEnv(node, admin, keyspace)
    finally:
        cluster.shutdown()


@dataclass
class TlsEnv:
    node: Node
    admin: object
    keyspace: str
    pki: Pki


@pytest.fixture(scope="module")
def tls_env(secure_nodes, pki):
    node = secure_nodes[1]
    cluster, admin = _session(node, ca=pki.ca)
    keyspace = f"sec_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    try:
        yield TlsEnv(node, admin, keyspace, pki)
    finally:
        cluster.shutdown()


@pytest.fixture
def no_env_credentials(monkeypatch):
    """The sink must get credentials from options only (not a developer's environment)."""
    for var in ("CASSANDRA_WAL_USERNAME", "CASSANDRA_WAL_PASSWORD",
                "CASSANDRA_WAL_KEYSTORE_PASSWORD"):
        monkeypatch.delenv(var, raising=False)


def _auth_options(env: AuthEnv, table: str, checkpoint=None, password: str = PASSWORD, **extra):
    return sink_options(env.node, env.keyspace, table, checkpoint,
                        **{"spark.cassandra.auth.username": ROLE,
                           "spark.cassandra.auth.password": password}, **extra)


def _tls_options(env: TlsEnv, table: str, checkpoint=None, ca: Path | None = None, **extra):
    return sink_options(env.node, env.keyspace, table, checkpoint,
                        **{"spark.cassandra.connection.ssl.enabled": "true",
                           "spark.cassandra.connection.ssl.trustStore.path": str(ca or env.pki.ca)},
                        **extra)


def _rows(k: int, n: int = 3) -> list[dict]:
    return [{"id": k * 10 + i, "name": f"r{k}-{i}"} for i in range(n)]


def _stream(spark, src: Path, options: dict):
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
            .writeStream.format("cassandra_wal").options(**options)
            .trigger(availableNow=True).start())


def _ids(session, keyspace: str, table: str) -> list[int]:
    return sorted(r["id"] for r in read_table(session, keyspace, table, "id"))


def _failed_query_text(query, timeout: float = 180) -> str:
    try:
        query.awaitTermination(timeout)     # raises the query's error, if it failed
    except Exception:  # noqa: BLE001 - read below, from query.exception()
        pass
    assert not query.isActive, "the query still runs"
    exc = query.exception()
    assert exc is not None, "the query should have failed"
    return error_text(exc)


def _private_tree_problems(root: Path) -> list[str]:
    """What under a WAL directory is not private: every folder must be 0700 and every file
    0600, except RocksDB's own files in ``log/``, which RocksDB creates 0644 (rocksdict cannot
    change that): they are unreachable to other users because ``log/`` and the WAL are 0700."""
    problems = []
    rocksdb = os.path.join(str(root), "log")
    for dirpath, dirnames, filenames in os.walk(root):
        mode = stat.S_IMODE(os.stat(dirpath).st_mode)
        if mode != 0o700:
            problems.append(f"dir {dirpath} is {oct(mode)}")
        if dirpath == rocksdb:
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                problems.append(f"file {path} is {oct(stat.S_IMODE(st.st_mode))}")
    return problems


# ------------------------------------------------------------------------------ authentication
def test_stream_with_option_credentials_writes_through_the_flusher(
        spark, auth_env, tmp_path, no_env_credentials):
    """User and password only as write options: validation (Python worker) and the driver's
    flusher (which never sees the options) both authenticate; the WAL is private."""
    register(spark)
    create_table(auth_env.admin, auth_env.keyspace, "good (id int PRIMARY KEY, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(0)])
    query = _stream(spark, src, _auth_options(auth_env, "good", cp))
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp, at_least=0) == 0
    assert _ids(auth_env.admin, auth_env.keyspace, "good") == [0, 1, 2]

    wal = stream_wal(cp)
    # The password reached the driver in memory, through the channel, keyed by WAL root ...
    assert credentials.lookup(wal.root).get("password") == PASSWORD
    # ... and nowhere on disk: the checkpoint and the WAL in it are secret-free.
    for path in cp.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    # WAL permissions: every folder 0700, the sink's files 0600.
    assert stat.S_IMODE(os.stat(wal.root).st_mode) == 0o700
    assert _private_tree_problems(Path(wal.root)) == []


def test_wrong_password_fails_clearly_before_anything_is_staged(
        spark, auth_env, tmp_path, no_env_credentials):
    register(spark)
    create_table(auth_env.admin, auth_env.keyspace, "bad_pw (id int PRIMARY KEY, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(0)])
    query = _stream(spark, src, _auth_options(auth_env, "bad_pw", cp, password=WRONG_PASSWORD))
    with running(query):
        text = _failed_query_text(query)
    assert "authentication failed" in text, text
    assert "spark.cassandra.auth.password" in text and "Bad credentials" in text, text
    assert MARK not in text, "the password is in the error"
    segments, seals = wal_files(stream_wal(cp))
    assert segments == [] and seals == [], (segments, seals)
    assert committed_batches(cp) == []
    assert count_rows(auth_env.admin, auth_env.keyspace, "bad_pw") == 0
    # Wrong credentials are not handed to the flusher either.
    assert credentials.lookup(stream_wal(cp).root) == {}


def test_recover_command_authenticates_with_username_and_password_env(
        spark, auth_env, tmp_path, no_env_credentials):
    """Batches committed but not flushed (``wal.flush=false``), replayed by
    ``cassandra-wal recover --username U --password-env VAR``; nothing secret printed."""
    register(spark)
    create_table(auth_env.admin, auth_env.keyspace, "recovered (id int PRIMARY KEY, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(0)])
    query = _stream(spark, src, _auth_options(auth_env, "recovered", cp, **{"wal.flush": "false"}))
    with running(query):
        wait_query_done(spark, query)
    assert committed_batches(cp) == [0]
    assert count_rows(auth_env.admin, auth_env.keyspace, "recovered") == 0
    wal = stream_wal(cp)
    wait_log_released(wal).close()   # the query's flusher let go of the log

    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_WAL_")}
    base = ["recover", wal.root, "--checkpoint", str(cp), "--username", ROLE,
            "--password-env", "SECURITY_TEST_PW", "--json"]
    wrong = cassandra_wal(*base, env=dict(env, SECURITY_TEST_PW=WRONG_PASSWORD), timeout=120)
    assert wrong.returncode == 1, wrong
    assert "authentication failed" in wrong.stderr, wrong.stderr
    assert MARK not in wrong.stdout + wrong.stderr
    assert count_rows(auth_env.admin, auth_env.keyspace, "recovered") == 0

    right = cassandra_wal(*base, env=dict(env, SECURITY_TEST_PW=PASSWORD), timeout=120)
    assert right.returncode == 0, right
    assert json.loads(right.stdout)["replayed"] == [0]
    assert MARK not in right.stdout + right.stderr
    assert _ids(auth_env.admin, auth_env.keyspace, "recovered") == [0, 1, 2]


# ------------------------------------------------------------------------------ TLS
def test_tls_stream_with_the_right_ca_writes(spark, tls_env, tmp_path):
    register(spark)
    create_table(tls_env.admin, tls_env.keyspace, "tls_ok (id int PRIMARY KEY, name text)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_rows(0)])
    query = _stream(spark, src, _tls_options(tls_env, "tls_ok", cp))
    with running(query):
        wait_query_done(spark, query)
    wait_all_flushed(cp, at_least=0)   # the driver's flusher wrote over TLS too
    assert _ids(tls_env.admin, tls_env.keyspace, "tls_ok") == [0, 1, 2]
    recorded = json.loads(Path(stream_wal(cp).target_file).read_text())
    conn = recorded["target"]["config"]["connection"]
    assert conn["ssl_enabled"] is True and conn["ssl_truststore_path"] == str(tls_env.pki.ca)


def _batch_write(spark, options: dict, rows=None) -> None:
    df = spark.createDataFrame(rows or [(1, "a"), (2, "b")], SCHEMA)
    df.write.format("cassandra_wal").mode("append").options(**options).save()


def test_tls_server_certificate_from_the_wrong_ca_is_refused(spark, tls_env, tmp_path):
    register(spark)
    create_table(tls_env.admin, tls_env.keyspace, "tls_wrong_ca (id int PRIMARY KEY, name text)")
    wal_dir = tmp_path / "wal"
    with pytest.raises(Exception) as err:
        _batch_write(spark, _tls_options(tls_env, "tls_wrong_ca", ca=tls_env.pki.wrong_ca,
                                         **{"wal.path": str(wal_dir)}))
    text = error_text(err.value)
    assert "certificate is not trusted" in text, text
    assert "spark.cassandra.connection.ssl.trustStore.path" in text, text
    assert "CERTIFICATE_VERIFY_FAILED" in text, text
    assert wal_files(WalDir(str(wal_dir))) == ([], [])
    assert count_rows(tls_env.admin, tls_env.keyspace, "tls_wrong_ca") == 0


def test_plaintext_client_is_refused_by_the_tls_only_node(spark, tls_env, tmp_path):
    register(spark)
    create_table(tls_env.admin, tls_env.keyspace, "tls_plain (id int PRIMARY KEY, name text)")
    # The raw protocol: no answer in plaintext, an answer over TLS.
    assert cn.cql_release_version(tls_env.node.port, timeout=10) is None
    assert cn.cql_release_version(tls_env.node.port, timeout=10,
                                  ssl_context=cn.probe_ssl_context(str(tls_env.pki.ca)))
    wal_dir = tmp_path / "wal"
    with pytest.raises(Exception) as err:
        _batch_write(spark, {**sink_options(tls_env.node, tls_env.keyspace, "tls_plain"),
                             "wal.path": str(wal_dir)})
    text = error_text(err.value)
    assert "spark.cassandra.connection.ssl.enabled=true" in text, text
    assert wal_files(WalDir(str(wal_dir))) == ([], [])
    assert count_rows(tls_env.admin, tls_env.keyspace, "tls_plain") == 0


# ------------------------------------------------------------------------------ WAL permissions
@pytest.mark.parametrize("mode", [0o770, 0o702])
def test_wal_dir_writable_by_others_is_refused(tmp_path, mode):
    shared = tmp_path / "shared-wal"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(OptionError) as err:
        open_wal_dir(str(shared))
    assert err.value.option == "wal.path"
    assert "writable by group or others" in str(err.value) and "chmod 700" in str(err.value)


def test_sink_refuses_a_group_writable_wal_dir_before_connecting(spark, tmp_path):
    register(spark)
    shared = tmp_path / "shared-wal"
    shared.mkdir()
    shared.chmod(0o775)
    # Port 9 (discard): nothing answers there; the WAL check comes first and fails the write.
    with pytest.raises(Exception) as err:
        _batch_write(spark, {"keyspace": "ks", "table": "t", "wal.path": str(shared),
                             "spark.cassandra.connection.host": "127.0.0.1",
                             "spark.cassandra.connection.port": "9"})
    text = error_text(err.value)
    assert "wal.path" in text and "writable by group or others" in text, text
    assert "cannot connect" not in text


def test_new_wal_dir_is_private_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        wal = open_wal_dir(str(tmp_path / "a" / "b" / "wal"))
    finally:
        os.umask(old)
    assert _private_tree_problems(Path(wal.root)) == []
    for created in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(os.stat(created).st_mode) == 0o700, created


# ------------------------------------------------------------------------------ secret search
DRIVER_PROGRAM = r'''
"""A Spark driver program writing through cassandra_wal with credentials as options only."""
import json, logging, os, sys, time, traceback

logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
# py4j at DEBUG prints every call PySpark makes into the JVM, .option(name, value) included:
# any data source's secrets. Not ours to filter; the user guide warns about it.
logging.getLogger("py4j").setLevel(logging.INFO)
launch = json.loads(sys.argv[1])
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[2]").appName("secret-search")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.local.dir", launch["local_dir"])
         .getOrCreate())
import sinks
from recovery.cql import credentials
from wal.log import WalLog
from wal.layout import WalDir

sinks.register(spark)
print("CHANNEL", credentials.local_server().directory, flush=True)
# Started while the nodes boot: wait for the test to say where to write (the "go" file).
deadline = time.monotonic() + 900
while not os.path.exists(launch["go"]):
    if time.monotonic() > deadline:
        print("NO GO", flush=True)
        sys.exit(4)
    time.sleep(0.2)
with open(launch["go"]) as f:
    args = json.load(f)


def stream(options):
    return (spark.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1)
            .json(args["src"]).writeStream.format("cassandra_wal").options(**options)
            .trigger(availableNow=True).start())


q = stream(args["options"])
q.awaitTermination(300)
if q.exception() is not None:
    print("QUERY FAILED:", q.exception(), flush=True)
    sys.exit(3)
print("PROGRESS", json.dumps(q.recentProgress and q.recentProgress[-1].json), flush=True)
wal = WalDir(args["wal"])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    reader = WalLog.open_reader(wal)
    done = reader is not None and reader.flushed_through() >= args["last_batch"]
    if reader is not None:
        reader.close()
    if done:
        break
    time.sleep(0.3)
print("FLUSHED" if done else "NOT FLUSHED", flush=True)

bad = stream(dict(args["options"], checkpointLocation=args["bad_cp"],
                  **{"spark.cassandra.auth.password": args["wrong"]}))
try:
    bad.awaitTermination(300)
except Exception:
    traceback.print_exc()
print("FAILED STREAM:", bad.exception(), flush=True)
try:
    (spark.createDataFrame([(1, "x")], "id INT, name STRING").write.format("cassandra_wal")
     .mode("append").options(**dict(args["options"], **{"wal.path": args["batch_wal"],
                                                       "spark.cassandra.auth.password": args["wrong"]}))
     .save())
except Exception as exc:
    print("FAILED BATCH WRITE:", exc, flush=True)
    traceback.print_exc()
spark.stop()
print("DONE", flush=True)
'''


# Spark's own (log4j) logs at INFO, into a file. Not a Console appender: for a PySpark driver
# (a "shell" to Spark) Spark filters console output below WARN, whatever the config says.
SPARK_LOG4J_INFO = """\
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


@dataclass
class SecretRun:
    proc: subprocess.Popen
    root: Path              # everything of the run lives under it
    go_file: Path           # the driver program waits for it: JSON of what to write where
    stdout: Path
    stderr: Path
    spark_log: Path         # Spark's log4j output, at INFO
    checkpoint: Path
    bad_checkpoint: Path
    batch_wal: Path
    work: Path              # its cwd: spark-warehouse, derby.log, ...
    local_dir: Path         # spark.local.dir
    env: dict


def _launch_secret_driver(root: Path) -> SecretRun:
    """Start the driver program; it boots Spark, then waits for :attr:`SecretRun.go_file`."""
    run = SecretRun(proc=None, root=root, go_file=root / "go.json",
                    stdout=root / "driver.stdout", stderr=root / "driver.stderr",
                    spark_log=root / "spark-driver.log", checkpoint=root / "cp",
                    bad_checkpoint=root / "cp-bad", batch_wal=root / "batch-wal",
                    work=root / "work", local_dir=root / "spark-local", env={})
    run.work.mkdir()
    conf_dir = root / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "log4j2.properties").write_text(SPARK_LOG4J_INFO.format(path=run.spark_log))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_WAL_")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_CONF_DIR=str(conf_dir),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    if not env.get("JAVA_HOME"):
        env["JAVA_HOME"] = str(cn.find_java_home())
    run.env = env
    program = root / "driver_program.py"
    program.write_text(DRIVER_PROGRAM)
    launch = {"go": str(run.go_file), "local_dir": str(run.local_dir)}
    with open(run.stdout, "wb") as out, open(run.stderr, "wb") as err:
        # Its own session: on failure the test kills its whole group (JVM, Python workers).
        run.proc = subprocess.Popen([sys.executable, str(program), json.dumps(launch)],
                                    cwd=run.work, env=env, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
    return run


def _kill_secret_driver(run: SecretRun | None) -> None:
    if run is not None and run.proc.poll() is None:   # only when a test failed before it ended
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(30)


@pytest.fixture(scope="module")
def secret_run(_early_start, auth_env, pki):
    """Tell the (already booted) driver program of the secret search to write."""
    run = _early_start["secret"]
    assert run is not None, "_early_start did not see the secret search test"
    create_table(auth_env.admin, auth_env.keyspace, "secrets (id int PRIMARY KEY, name text)")
    src = run.root / "src"
    write_json_files(src, [_rows(0)])
    options = _auth_options(auth_env, "secrets", run.checkpoint, **{
        "spark.cassandra.connection.ssl.keyStore.path": str(pki.client_key),
        "spark.cassandra.connection.ssl.keyStore.password": CLIENT_KEY_PASSWORD})
    args = {"options": options, "src": str(src), "wal": stream_wal(run.checkpoint).root,
            "last_batch": 0, "bad_cp": str(run.bad_checkpoint), "wrong": WRONG_PASSWORD,
            "batch_wal": str(run.batch_wal)}
    tmp = run.go_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # it holds the password
    with os.fdopen(fd, "w") as f:
        json.dump(args, f)
    os.rename(tmp, run.go_file)
    try:
        yield run
    finally:
        _kill_secret_driver(run)
        run.go_file.unlink(missing_ok=True)    # test input, not something the sink wrote


@pytest.fixture(scope="module", autouse=True)
def _start_secret_run_early(request):
    """Give the secret search's driver program its go before the module's first test, so
    that its run (its own Spark: minutes on a loaded box) overlaps the other tests."""
    if _selected_test(request, SECRET_TEST):
        request.getfixturevalue("secret_run")


def test_no_secret_in_wal_checkpoint_logs_errors_or_tool_output(secret_run, auth_env, pki):
    """A real driver program (its own process: its stdout/stderr, Spark's INFO logs, the
    sink's DEBUG logs, the JVM's and Python workers' output are all captured) writes with the
    password, a client key password and a client key path given as options, then fails a
    stream and a batch write with a wrong password. Nothing anywhere may contain a secret."""
    run = secret_run
    try:
        run.proc.wait(timeout=420)
    except subprocess.TimeoutExpired:
        pytest.fail("the driver program did not finish in 420 s:\n"
                    + run.stdout.read_text(errors="replace")[-3000:])
    stdout = run.stdout.read_text(errors="replace")
    stderr = run.stderr.read_text(errors="replace")
    assert run.proc.returncode == 0, (stdout + stderr)[-6000:]
    assert "FLUSHED" in stdout and "DONE" in stdout, stdout[-3000:]
    assert _ids(auth_env.admin, auth_env.keyspace, "secrets") == [0, 1, 2]
    assert "authentication failed" in stdout, stdout[-3000:]
    assert "FAILED BATCH WRITE:" in stdout
    spark_log = run.spark_log.read_text(errors="replace")
    assert " INFO MicroBatchExecution:" in spark_log, "Spark's INFO logs were not captured"
    assert " DEBUG cassandra." in stderr and " INFO recovery.replay: flushed batch" in stderr
    # The channel's socket and folder are gone with the driver.
    channel = next(line.split(" ", 1)[1] for line in stdout.splitlines()
                   if line.startswith("CHANNEL "))
    assert not os.path.exists(channel), channel

    # Everything a user or an operator can look at:
    texts = {"driver stdout": stdout, "driver stderr": stderr, "Spark's log": spark_log}
    wal = stream_wal(run.checkpoint)
    for tool in (["inspect", wal.root, "--checkpoint", str(run.checkpoint), "--json"],
                 ["dump", wal.root, "--batch", "0", "--json"],
                 ["verify", wal.root, "--json"],
                 ["recover", wal.root, "--dry-run", "--json"]):
        result = cassandra_wal(*tool, env=run.env, timeout=120)
        assert result.returncode == 0, (tool, result.stderr)
        texts[f"cassandra-wal {tool[0]}"] = result.stdout + result.stderr
    assert '"_writetime_us"' in texts["cassandra-wal dump"]   # it did print the rows
    roots = (run.checkpoint, run.bad_checkpoint, run.batch_wal, run.work, run.local_dir)
    files = [p for root in roots if root.exists()
             for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    names = {p.relative_to(run.root).as_posix() for p in files}
    # The search saw the WAL (manifest, seals, log) and Spark's checkpoint (commits, offsets).
    assert any(n.endswith("target.json") for n in names), names
    assert any("/seals/" in n for n in names) and any("/log/" in n for n in names), names
    assert any("/commits/" in n for n in names) and any("/offsets/" in n for n in names), names
    assert ROLE.encode() in Path(wal.target_file).read_bytes()  # the search would see a name

    needles = {"password": PASSWORD, "wrong password": WRONG_PASSWORD,
               "client key password": CLIENT_KEY_PASSWORD, "secret marker": MARK,
               "client private key": pki.client_key_marker}
    leaks = []
    for what, needle in needles.items():
        for name, text in texts.items():
            if needle in text:
                leaks.append(f"{what} in {name}")
        for path in files:
            if needle.encode() in path.read_bytes():
                leaks.append(f"{what} in {path.relative_to(run.root)}")
    assert leaks == [], leaks
    # The WAL tree the driver wrote is private.
    assert _private_tree_problems(Path(wal.root)) == []
