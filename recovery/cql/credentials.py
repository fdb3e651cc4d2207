"""A secret-safe channel that brings a write's option-level credentials to the driver's flusher.

Why: a stream's batches are written to Cassandra by the flusher in the *driver* process
(:mod:`recovery.flusher`), but a Python data source's options reach only the Python worker that
runs ``streamWriter()`` (on the driver host, in a separate process). Without this channel the
flusher sees credentials only from the session conf snapshot taken by :func:`sinks.register`
or from ``CASSANDRA_WAL_USERNAME`` / ``CASSANDRA_WAL_PASSWORD``; SCC users pass them as write
options. Nothing may be written to disk for it: ``target.json`` and the rest of the WAL are
secret-free on purpose.

How:

* :func:`sinks.register` calls :func:`ensure_server`: once per driver process, a Unix-domain
  socket server in a fresh temporary directory of mode 0700 (``tempfile.mkdtemp``). Its path is
  baked into the registered data source subclass (``credential_channel``), like
  ``session_conf``.
* ``prepare_write`` (in the worker, once per micro-batch) calls :func:`hand_over` when the
  write's *options* carry a credential (user name, password, key store password): it sends
  ``{wal_root, username, password, ssl_keystore_password}`` over the socket and waits for
  the answer, so the flusher has them before the batch can commit. In the driver process
  itself (the ``foreachBatch`` adapter) they go to the store directly.
* The driver keeps them in memory only (:class:`CredentialStore`, keyed by WAL root) for the
  life of the process; the flusher asks :func:`lookup` every time it (re)connects.
  Precedence where the flusher builds its connection: write options (this channel) > session
  conf > environment.

Security: only the driver's own user can reach the socket: its directory is 0700 and the
server checks the peer's uid (``SO_PEERCRED``). Messages are size-capped, never logged, and
errors never echo them. The socket and its directory are removed at exit
(:func:`atexit.register`) or by :meth:`CredentialServer.close`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SinkError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Credential:
    """One credential: the :class:`~recovery.cql.config.ConnectionConfig` field it sets, the
    option (and session conf key) that gives it, in its canonical spelling, and the
    environment variable that gives it at the lowest precedence (:func:`layered`; with its
    arguments, the one source ``cassandra-wal recover`` has)."""

    field: str
    option: str
    env: str


#: Every credential, and the one place its option is named: the option table
#: (:data:`sinks.worker.options.OPTION_SPECS`, a floor above) takes these names from here, and
#: the flusher, which never parses options, reads the session conf by them (:func:`in_conf`).
CREDENTIALS = (
    Credential("username", "spark.cassandra.auth.username", "CASSANDRA_WAL_USERNAME"),
    Credential("password", "spark.cassandra.auth.password", "CASSANDRA_WAL_PASSWORD"),
    Credential("ssl_keystore_password", "spark.cassandra.connection.ssl.keyStore.password",
               "CASSANDRA_WAL_KEYSTORE_PASSWORD"),
)
#: Each credential field's option, as the option table spells it.
OPTION_OF = {c.field: c.option for c in CREDENTIALS}
#: Option names (lower-cased, as Spark hands them over) whose presence in a write's options
#: triggers a hand-over, and the ConnectionConfig field each one sets.
CREDENTIAL_OPTIONS = {c.option.lower(): c.field for c in CREDENTIALS}
FIELDS = tuple(c.field for c in CREDENTIALS)
ENV_VARIABLES = {c.field: c.env for c in CREDENTIALS}
ENV_USERNAME, ENV_PASSWORD, ENV_KEYSTORE_PASSWORD = ENV_VARIABLES.values()
MAX_MESSAGE = 64 * 1024
TIMEOUT_S = 10.0
_SOCKET_NAME = "credentials.sock"
_DIR_PREFIX = "cassandra-wal-cred-"     # + "<pid>-<random>"


class CredentialChannelError(SinkError):
    """The write's credentials could not be handed to the driver's flusher."""

    _fields = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"cannot hand the write's credentials to the driver's flusher: {reason}; call "
            "sinks.register(spark) in the driver that runs this query, or pass the credentials "
            "in the session conf or CASSANDRA_WAL_USERNAME / CASSANDRA_WAL_PASSWORD instead")


def in_conf(conf: Mapping[str, object] | None) -> dict[str, str | None]:
    """The credential fields that option or session conf keys set (matched case-insensitively,
    as Spark lower-cases option keys)."""
    by_lower = {str(k).lower(): v for k, v in (conf or {}).items()}
    return {field: by_lower.get(key) for key, field in CREDENTIAL_OPTIONS.items()}


def of_connection(connection) -> dict[str, str | None]:
    """The credential fields of a :class:`~recovery.cql.config.ConnectionConfig`."""
    return {f: getattr(connection, f) for f in FIELDS}


def layered(*sources: Mapping[str, str | None]) -> dict[str, str]:
    """The credentials to connect with: the environment (:data:`ENV_VARIABLES`), overridden by
    each of ``sources`` in turn (field -> value; a None value overrides nothing).

    The one place precedence is decided; callers pass their sources lowest first: the
    flusher the session conf, then the write's options handed over through this channel
    (:func:`lookup`); a batch job its options; ``cassandra-wal recover`` its arguments."""
    creds = {f: os.environ.get(var) for f, var in ENV_VARIABLES.items()}
    for source in sources:
        creds.update({f: v for f, v in source.items() if f in FIELDS and v is not None})
    return {f: str(v) for f, v in creds.items() if v is not None}


def of_stream(wal_root: str, session_conf: Mapping[str, object] | None) -> dict[str, str]:
    """What a stream's flusher connects with: :func:`layered` over the session conf snapshot
    taken by ``sinks.register`` and the write's options handed over for ``wal_root`` (asked
    anew at every connection: a restarted query hands them over with its first batch)."""
    return layered(in_conf(session_conf), lookup(wal_root))


def _key(wal_root: str) -> str:
    return os.path.normpath(os.path.abspath(wal_root))


class CredentialStore:
    """In-memory credentials per WAL root; thread-safe; never persisted, never logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_root: dict[str, dict[str, str]] = {}

    def put(self, wal_root: str, creds: Mapping[str, str | None]) -> None:
        clean = {f: str(creds[f]) for f in FIELDS if creds.get(f) is not None}
        with self._lock:
            self._by_root[_key(wal_root)] = clean

    def get(self, wal_root: str) -> dict[str, str]:
        with self._lock:
            return dict(self._by_root.get(_key(wal_root), {}))

    def forget(self, wal_root: str) -> None:
        with self._lock:
            self._by_root.pop(_key(wal_root), None)

    def clear(self) -> None:
        with self._lock:
            self._by_root.clear()

    def __repr__(self) -> str:  # never the values
        with self._lock:
            return f"CredentialStore({len(self._by_root)} WAL roots)"


_store = CredentialStore()
_server: CredentialServer | None = None
_server_lock = threading.Lock()


def lookup(wal_root: str) -> dict[str, str]:
    """Credentials handed over for ``wal_root`` in this process (only fields that were set)."""
    return _store.get(wal_root)


def forget(wal_root: str) -> None:
    _store.forget(wal_root)


# ------------------------------------------------------------------------------ wire format
def _send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed early")
        buf += chunk
    return buf


def _recv_frame(sock: socket.socket) -> bytes:
    (length,) = struct.unpack(">I", _recv_exact(sock, 4))
    if length > MAX_MESSAGE:
        raise ValueError(f"message of {length} bytes is over the {MAX_MESSAGE} byte cap")
    return _recv_exact(sock, length)


# ------------------------------------------------------------------------------ server
class CredentialServer:
    """The driver side: a Unix socket in a private temp dir, answered by a daemon thread."""

    def __init__(self, store: CredentialStore | None = None) -> None:
        self.store = store if store is not None else _store
        base = tempfile.gettempdir()
        if len(base) > 60:           # AF_UNIX paths are limited to ~107 bytes
            base = "/tmp"
        remove_stale_directories(base)
        self.directory = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=base)  # 0700
        self.path = os.path.join(self.directory, _SOCKET_NAME)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self._sock.bind(self.path)
        finally:
            os.umask(old_umask)
        self._sock.listen(16)
        self.pid = os.getpid()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cassandra-wal-credentials",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            with conn:
                try:
                    self._handle(conn)
                except Exception as exc:  # noqa: BLE001 - never let one client stop the server
                    # The type only: a message could quote what was received.
                    log.warning("credential channel: a request failed (%s)", type(exc).__name__)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT_S)
        if hasattr(socket, "SO_PEERCRED"):
            _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():
                _send_frame(conn, b"error: refused: another user")
                return
        try:
            message = json.loads(_recv_frame(conn))
            wal_root = message["wal_root"]
            if not isinstance(wal_root, str) or not wal_root:
                raise ValueError("no wal_root")
            creds = {f: message.get(f) for f in FIELDS}
            if any(v is not None and not isinstance(v, str) for v in creds.values()):
                raise ValueError("credentials must be strings")
        except (ValueError, KeyError, TypeError):
            _send_frame(conn, b"error: malformed request")
            return
        self.store.put(wal_root, creds)
        _send_frame(conn, b"ok")

    def close(self) -> None:
        """Stop answering and remove the socket and its directory (idempotent). A no-op in a
        forked child: the socket belongs to the process that made it."""
        if self._closed.is_set() or os.getpid() != self.pid:
            return
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    def __repr__(self) -> str:
        return f"CredentialServer({self.path!r}{', closed' if self.closed else ''})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_directories(base: str) -> list[str]:
    """Remove channel directories of this user left by drivers that died without running
    their exit handlers (``kill -9``). They hold only a socket, never a secret; this keeps
    the temp folder tidy. Returns the removed paths."""
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_DIR_PREFIX):
            continue
        pid_text = name[len(_DIR_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
            entries = os.listdir(path)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not set(entries) <= {_SOCKET_NAME}:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def ensure_server() -> CredentialServer:
    """This process's credential server, started on first use (``sinks.register``)."""
    global _server
    with _server_lock:
        if local_server() is None:
            _server = CredentialServer(_store)
        return _server


def local_server() -> CredentialServer | None:
    """The server of *this* process (not one inherited through a fork), if running."""
    server = _server
    if server is None or server.closed or server.pid != os.getpid():
        return None
    return server


# ------------------------------------------------------------------------------ client
def given_in(options: Mapping[str, object]) -> bool:
    """True when a write's options (not the session conf) carry any credential."""
    return any(str(k).lower() in CREDENTIAL_OPTIONS and v is not None for k, v in options.items())


def send(address: str, wal_root: str, creds: Mapping[str, str | None],
         timeout: float = TIMEOUT_S) -> None:
    """Hand ``creds`` for ``wal_root`` to the server at ``address``; raise
    :class:`CredentialChannelError` (without any secret) if it did not take them."""
    body = json.dumps({"wal_root": wal_root, **{f: creds.get(f) for f in FIELDS}}).encode()
    if len(body) > MAX_MESSAGE:
        raise CredentialChannelError("the credentials are too long")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            _send_frame(sock, body)
            answer = _recv_frame(sock)
    except (OSError, ConnectionError, ValueError, struct.error) as exc:
        raise CredentialChannelError(
            f"the channel at {address} does not answer ({type(exc).__name__}: "
            f"{getattr(exc, 'strerror', None) or 'no answer'})") from None
    if answer != b"ok":
        raise CredentialChannelError(f"the channel at {address} said "
                                     f"{answer.decode(errors='replace')[:200]!r}")


def hand_over(address: str | None, wal_root: str, connection) -> bool:
    """Make ``connection``'s credentials (a :class:`~recovery.cql.config.ConnectionConfig`) known to
    the flusher of ``wal_root``. In the process that runs the server (``foreachBatch``), they
    go to the store directly; elsewhere over the socket at ``address``. Returns False when
    there is no channel at all (no ``sinks.register`` anywhere we can see)."""
    creds = of_connection(connection)
    server = local_server()
    if server is not None and (address is None or address == server.path):
        server.store.put(wal_root, creds)
        return True
    if not address:
        return False
    send(address, wal_root, creds)
    return True


__all__ = ["CredentialServer", "CredentialStore", "CredentialChannelError", "ensure_server",
           "hand_over", "lookup", "forget", "given_in", "send", "layered", "in_conf",
           "of_connection", "of_stream", "Credential", "CREDENTIALS", "CREDENTIAL_OPTIONS",
           "OPTION_OF", "ENV_VARIABLES"]
