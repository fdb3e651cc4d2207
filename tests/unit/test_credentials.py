"""The credential channel (recovery/cql/credentials.py): option-level credentials reach the driver's
flusher in memory only, from another process, and never show up anywhere else."""

from __future__ import annotations

import ast
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recovery.cql import credentials
from recovery.cql.credentials import (
    ENV_KEYSTORE_PASSWORD,
    ENV_PASSWORD,
    ENV_USERNAME,
    CredentialChannelError,
    CredentialServer,
    CredentialStore,
)
from recovery.cql.table import TableSchema
from recovery.flusher import load_target
from recovery.output import CassandraOutput
from recovery.target import Target
from sinks.worker.options import OPTION_SPECS, parse_options
from tests.helpers.planted_tree import parsed_modules
from wal.layout import WalDir

pytestmark = pytest.mark.unit

SECRET = "Chan-nel-S3cret-9f1d"
KS_SECRET = "Key-Store-S3cret-77a"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store():
    return CredentialStore()


@pytest.fixture
def server(store):
    srv = CredentialServer(store)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def process_server(monkeypatch):
    """This process's channel (what sinks.register starts), fresh and empty for the test."""
    monkeypatch.setattr(credentials, "_server", None)
    monkeypatch.setattr(credentials, "_store", CredentialStore())
    srv = credentials.ensure_server()
    try:
        yield srv
    finally:
        srv.close()


def _send_from_other_process(address: str, wal_root: str, **creds) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import json, sys
        from recovery.cql import credentials
        try:
            credentials.send({address!r}, {wal_root!r}, json.loads(sys.argv[1]))
        except credentials.CredentialChannelError as exc:
            print(exc, file=sys.stderr)
            sys.exit(3)
    """)
    return subprocess.run([sys.executable, "-c", code, json.dumps(creds)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


# ---------------------------------------------------------------- the server


def test_socket_lives_in_a_private_directory(server):
    mode = stat.S_IMODE(os.stat(server.directory).st_mode)
    assert mode == 0o700, oct(mode)
    assert stat.S_ISSOCK(os.stat(server.path).st_mode)
    assert stat.S_IMODE(os.stat(server.path).st_mode) & 0o077 == 0
    assert len(server.path) < 100   # AF_UNIX limit
    assert os.path.basename(server.directory).startswith(f"cassandra-wal-cred-{os.getpid()}-")


def test_directories_of_dead_drivers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"cassandra-wal-cred-{dead_pid}-abc"
    stale.mkdir(mode=0o700)
    (stale / "credentials.sock").touch()
    alive = tmp_path / f"cassandra-wal-cred-{os.getpid()}-def"
    alive.mkdir(mode=0o700)
    foreign = tmp_path / f"cassandra-wal-cred-{dead_pid}-ghi"   # not only a socket: kept
    foreign.mkdir(mode=0o700)
    (foreign / "other").touch()
    old_style = tmp_path / "cassandra-wal-cred-xyz"
    old_style.mkdir()
    assert credentials.remove_stale_directories(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and alive.exists() and foreign.exists() and old_style.exists()


def test_credentials_sent_from_another_process_are_kept_in_memory(server, store, tmp_path):
    wal_root = str(tmp_path / "cp" / "cassandra_wal")
    result = _send_from_other_process(server.path, wal_root, username="etl", password=SECRET,
                                      ssl_keystore_password=KS_SECRET)
    assert result.returncode == 0, result.stderr
    assert store.get(wal_root) == {"username": "etl", "password": SECRET,
                                   "ssl_keystore_password": KS_SECRET}
    # Keyed by the normalized WAL root; unknown roots have nothing.
    assert store.get(str(tmp_path / "cp" / "." / "cassandra_wal")) == store.get(wal_root)
    assert store.get(str(tmp_path / "other")) == {}
    # Nothing was written to disk: the channel's directory holds just the socket.
    assert os.listdir(server.directory) == ["credentials.sock"]
    assert SECRET not in repr(store) and SECRET not in repr(server)


def test_latest_hand_over_wins_and_unset_fields_are_dropped(server, store, tmp_path):
    root = str(tmp_path / "wal")
    credentials.send(server.path, root, {"username": "a", "password": "old"})
    credentials.send(server.path, root, {"username": "b", "password": None})
    assert store.get(root) == {"username": "b"}


def test_malformed_and_oversized_requests_are_refused(server, store):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(server.path)
        body = b"not json"
        s.sendall(struct.pack(">I", len(body)) + body)
        assert credentials._recv_frame(s) == b"error: malformed request"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(server.path)
        s.sendall(struct.pack(">I", credentials.MAX_MESSAGE + 1))   # refused before reading it
        assert credentials._recv_frame(s) == b"error: malformed request"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(server.path)
        body = json.dumps({"wal_root": "/w", "password": 12}).encode()
        s.sendall(struct.pack(">I", len(body)) + body)
        assert credentials._recv_frame(s) == b"error: malformed request"
    assert store.get("/w") == {}
    # Still serving after bad clients.
    credentials.send(server.path, "/w", {"password": SECRET})
    assert store.get("/w") == {"password": SECRET}


def test_close_removes_socket_and_directory_and_errors_hold_no_secret(server, tmp_path):
    directory = server.directory
    server.close()
    server.close()  # idempotent
    assert not os.path.exists(directory)
    with pytest.raises(CredentialChannelError) as err:
        credentials.send(server.path, str(tmp_path), {"username": "etl", "password": SECRET,
                                                      "ssl_keystore_password": KS_SECRET})
    text = str(err.value)
    assert "credentials to the driver's flusher" in text and "sinks.register" in text
    assert SECRET not in text and KS_SECRET not in text
    # Pickles (it crosses from the Python worker to the driver) without gaining a secret.
    import pickle

    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == text


def test_other_process_sees_an_error_when_the_channel_is_gone(tmp_path):
    result = _send_from_other_process(str(tmp_path / "nope.sock"), str(tmp_path), password=SECRET)
    assert result.returncode == 3
    assert "cannot hand the write's credentials" in result.stderr
    assert SECRET not in result.stderr + result.stdout


# ---------------------------------------------------------------- hand-over from prepare_write


def test_given_in_looks_at_option_names_case_insensitively():
    assert credentials.given_in({"spark.cassandra.auth.password": "x"})
    assert credentials.given_in({"SPARK.CASSANDRA.AUTH.USERNAME": "x"})
    assert credentials.given_in({"spark.cassandra.connection.ssl.keyStore.password": "x"})
    assert not credentials.given_in({"spark.cassandra.connection.host": "h", "keyspace": "k"})
    assert not credentials.given_in({})


def test_hand_over_in_the_driver_process_goes_to_the_store_directly(process_server, tmp_path):
    conn = parse_options({"keyspace": "k", "table": "t",
                          "spark.cassandra.auth.username": "etl",
                          "spark.cassandra.auth.password": SECRET}).connection
    root = str(tmp_path / "wal")
    assert credentials.hand_over(None, root, conn) is True           # foreachBatch: no address
    assert credentials.lookup(root) == {"username": "etl", "password": SECRET}
    credentials.forget(root)
    assert credentials.hand_over(process_server.path, root, conn) is True
    assert credentials.lookup(root)["password"] == SECRET


def test_hand_over_without_any_channel_is_a_no_op(monkeypatch, tmp_path):
    monkeypatch.setattr(credentials, "_server", None)
    conn = parse_options({"keyspace": "k", "table": "t",
                          "spark.cassandra.auth.password": SECRET}).connection
    assert credentials.hand_over(None, str(tmp_path), conn) is False
    with pytest.raises(CredentialChannelError):
        credentials.hand_over(str(tmp_path / "gone.sock"), str(tmp_path), conn)


# ---------------------------------------------------------------- the flusher's view


def _wal_with_target(tmp_path) -> WalDir:
    config = parse_options({"keyspace": "ks", "table": "t",
                            "spark.cassandra.auth.username": "recorded-user",
                            "spark.cassandra.auth.password": SECRET,
                            "spark.cassandra.connection.ssl.keyStore.password": KS_SECRET})
    table = TableSchema("ks", "t", (("id", "int"), ("v", "text")), ("id",))
    wal = WalDir(str(tmp_path / "wal")).create()
    wal.write_target({"fingerprint": "x", "target": Target(config, table, ("id", "v")).to_dict()})
    body = Path(wal.target_file).read_text()
    assert SECRET not in body and KS_SECRET not in body   # what is at rest is secret-free
    return wal


def test_load_target_precedence_options_over_session_conf_over_env(process_server, tmp_path,
                                                                    monkeypatch):
    wal = _wal_with_target(tmp_path)
    monkeypatch.setenv(ENV_USERNAME, "env-user")
    monkeypatch.setenv(ENV_PASSWORD, "env-pw")
    monkeypatch.setenv(ENV_KEYSTORE_PASSWORD, "env-ks")
    conn = load_target(wal).config.connection
    assert (conn.username, conn.password, conn.ssl_keystore_password) == \
        ("env-user", "env-pw", "env-ks")

    session = {"spark.cassandra.auth.username": "conf-user",
               "spark.cassandra.auth.password": "conf-pw"}
    conn = load_target(wal, session).config.connection
    assert (conn.username, conn.password, conn.ssl_keystore_password) == \
        ("conf-user", "conf-pw", "env-ks")

    credentials.hand_over(None, wal.root, parse_options(
        {"keyspace": "ks", "table": "t", "spark.cassandra.auth.password": SECRET}).connection)
    conn = load_target(wal, session).config.connection
    assert (conn.username, conn.password, conn.ssl_keystore_password) == \
        ("conf-user", SECRET, "env-ks")


def test_flusher_output_picks_up_credentials_handed_over_after_it_was_made(
        process_server, tmp_path, monkeypatch):
    wal = _wal_with_target(tmp_path)
    for var in (ENV_USERNAME, ENV_PASSWORD, ENV_KEYSTORE_PASSWORD):
        monkeypatch.delenv(var, raising=False)
    seen = []

    def fake_connect(conn):
        seen.append((conn.username, conn.password))
        raise RuntimeError("stop here")

    monkeypatch.setattr("recovery.cql.connection.connect", fake_connect)
    output = CassandraOutput(load_target(wal), wal.root)
    with pytest.raises(RuntimeError):
        output.upserter()
    credentials.hand_over(None, wal.root, parse_options(
        {"keyspace": "ks", "table": "t", "spark.cassandra.auth.username": "etl",
         "spark.cassandra.auth.password": SECRET}).connection)
    with pytest.raises(RuntimeError):
        output.upserter()
    assert seen == [("recorded-user", None), ("etl", SECRET)]   # the user name is recorded


def test_each_credential_option_is_named_in_the_credential_table_only():
    """The credential table (:data:`credentials.CREDENTIALS`) is the one place a credential's
    option is named and tied to its field: the option table takes each name and target from
    it, and no other module of the packages spells one as a literal (a second map from
    option to field, a key of its own, would creep back there)."""
    by_target = {spec.target: spec for spec in OPTION_SPECS if spec.target}
    for credential in credentials.CREDENTIALS:
        assert by_target[f"connection.{credential.field}"].name == credential.option
    assert credentials.CREDENTIAL_OPTIONS == {
        c.option.lower(): c.field for c in credentials.CREDENTIALS}
    names = {c.option.lower() for c in credentials.CREDENTIALS}
    owner = Path(credentials.__file__).resolve().relative_to(REPO).as_posix()
    spelt = []
    for rel, tree in parsed_modules(REPO):
        if rel == owner:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.strip().lower() in names):
                spelt.append(f"{rel}:{node.lineno}: {node.value}")
    assert not spelt, "a credential option named outside recovery/cql/credentials.py"
