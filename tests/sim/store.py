"""The simulated store (HDFS, S3): ``simstore://<name>/<path>``, a real
:class:`wal.store.LocalStore` over a folder of the world, failing as the seed says.

The sink opens it by URI like any store (``wal.stores.open_store``, patched in
:mod:`tests.sim.patches`), so the real ``RemoteWal``, ``WalDir.at``, ``open_checkpoint``, the
pointer and the binding run against it. What the world injects, on the sink's calls only:

* ``down``: every call (create, read, list, delete) raises ``StoreUnavailable``;
* ``flaky``: a call fails before it does anything, or a create applies and its reply is lost
  (it raises after the object was published);
* while up, at rates drawn once per world: a create whose reply is lost, a delete refused (in
  a ``delete_many``, each key on its own: some go, the others stay).

Every injected failure counts in :attr:`StoreState.faults` (a drain that met one is not held to
"a fault-free drain writes every committed batch"). Spark's own checkpoint writes and the
invariants read the folder through :meth:`StoreState.raw`, which never fails: Spark's commit
log fails only while the store is down (:class:`tests.sim.spark.StoreCheckpoint`).

The store also checks, on every create the sink makes, that no seal version is ever replaced:
a new ``seals/<batch>/<version>.seal`` is above every version of that batch already there.
"""

from __future__ import annotations

import os
import random
import shutil
import urllib.parse

from wal.errors import StoreUnavailable
from wal.store import LocalStore

from .invariants import Violation
from .patches import Current

SCHEME = "simstore"
NAME = "s1"
UP, FLAKY, DOWN = "up", "flaky", "down"
ENV_WORKING_DIR = "CASSANDRA_WAL_WORKING_DIR"   # wal.remote's, named here for older code
HOSTS = ("host-a", "host-b")


def uri(path: str) -> str:
    """The store URI of ``path`` (``cp1``, ``wal-shared``) on the world's store."""
    return f"{SCHEME}://{NAME}/{path}"


def is_sim(location: str | None) -> bool:
    return bool(location) and location.startswith(f"{SCHEME}://")


class StoreState:
    """The world's store: its folder, its mode, its failure rates, its own RNG (so that a world
    without a store draws exactly what it drew before stores were simulated)."""

    def __init__(self, root: str, rng: random.Random, known_failures: bool = False):
        self.root = root
        self.rng = rng
        # The cases the sink fails today (README.md, "Stores: what it finds"), drawn only when
        # asked for: a checkpoint on the store deleted and started over, zombie commits, and
        # the end's check for leftovers on the store and in the tasks' spools.
        self.known_failures = known_failures
        self.mode = UP
        self.faults = 0
        self.lost_reply = rng.choice((0.0, 0.0, 0.05, 0.2))    # a create applied, reply lost
        self.delete_refused = rng.choice((0.0, 0.1, 0.3))
        self.calm = False          # the end: up for good, nothing injected

    def folder(self, location: str) -> str:
        parsed = urllib.parse.urlsplit(location)
        return os.path.join(self.root, parsed.netloc, *[p for p in parsed.path.split("/") if p])

    def raw(self, location: str) -> LocalStore:
        """The folder behind ``location``, without injected failures."""
        return LocalStore(self.folder(location))

    def describe(self) -> str:
        return f"lost replies {self.lost_reply:g}, deletes refused {self.delete_refused:g}"

    # -- what a call of the sink meets ---------------------------------------------------------
    def fails_now(self) -> bool:
        if self.calm or self.mode == UP:
            return False
        return self.mode == DOWN or self.rng.random() < 0.3

    def reply_lost(self) -> bool:
        if self.calm:
            return False
        rate = 0.25 if self.mode == FLAKY else self.lost_reply
        return rate > 0 and self.rng.random() < rate

    def delete_fails(self) -> bool:
        return not self.calm and self.delete_refused > 0 and self.rng.random() < self.delete_refused


class SimStore:
    """A :class:`wal.store.Store` at ``simstore://...`` for the sink: the world's folder behind
    it, the world's failures in front."""

    def __init__(self, location: str):
        self.uri = location.rstrip("/")

    @property
    def _state(self) -> StoreState:
        return Current.world.store

    def _local(self) -> LocalStore:
        return self._state.raw(self.uri)

    def _unavailable(self, what: str) -> StoreUnavailable:
        self._state.faults += 1
        return StoreUnavailable(self.uri, f"simulated: {what}")

    def _enter(self, op: str, key: str) -> None:
        if self._state.fails_now():
            raise self._unavailable(f"{op} {key!r}: the store does not answer")

    def create(self, key: str, data: bytes) -> bool:
        self._enter("create", key)
        local = self._local()
        _check_seal_version(self.uri, local, key)
        created = local.create(key, data)
        if self._state.reply_lost():
            raise self._unavailable(f"create {key!r}: applied, the reply was lost")
        return created

    def read(self, key: str) -> bytes | None:
        self._enter("read", key)
        return self._local().read(key)

    def list(self, prefix: str = "") -> list[str]:
        self._enter("list", prefix)
        return self._local().list(prefix)

    def delete(self, key: str) -> None:
        self._enter("delete", key)
        if self._state.delete_fails():
            raise self._unavailable(f"delete {key!r}: refused")
        self._local().delete(key)

    def delete_many(self, keys: list[str]) -> None:
        """As S3's DeleteObjects: one request; while up, each key refused at the world's
        rate (it stays), the refusal raised once every key was tried."""
        self._enter("delete_many", f"{keys[:1]} (+{max(len(keys) - 1, 0)})")
        refused = [key for key in keys if self._state.delete_fails()]
        self._local().delete_many([key for key in keys if key not in refused])
        if refused:
            raise self._unavailable(f"delete_many: {len(refused)} of {len(keys)} refused, "
                                    f"{refused[0]!r} first")

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        self._enter("delete_folder", prefix)
        if recursive and self._state.delete_fails():
            raise self._unavailable(f"delete_folder {prefix!r} (recursive): refused")
        self._local().delete_folder(prefix, recursive)

    def __getattr__(self, name: str):
        """A call of the Store contract this class does not know yet: the local store's,
        failing as every call does."""
        real = getattr(self._local(), name)
        if not callable(real):
            return real

        def call(*args, **kwargs):
            self._enter(name, str(args[:1]))
            return real(*args, **kwargs)
        return call


def _check_seal_version(location: str, local: LocalStore, key: str) -> None:
    """A seal version is never replaced: a create of ``seals/<batch>/<version>...`` may only
    add a version above every one there (the newest version is the seal)."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "seals":
        return
    if local.read(key) is not None:      # taken: create-only leaves it as it is
        return
    version = _version(key)
    higher = [k for k in local.list(f"seals/{parts[1]}") if _version(k) >= version]
    if higher:
        raise Violation("no seal version is ever replaced",
                        f"{location}: {key} published while {higher[-1]} is there")


def _version(key: str) -> int:
    """``seals/<batch>/<version>[-<token>].seal`` -> version (FORMAT.md, "On a store")."""
    digits = ""
    for ch in key.rsplit("/", 1)[-1]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits or -1)


def open_remote(real):
    """``wal.stores._open_remote``, opening ``simstore://`` as :class:`SimStore`."""
    def _open_remote(location, access, s3_client):
        if urllib.parse.urlsplit(location).scheme.lower() == SCHEME:
            return SimStore(location)
        return real(location, access, s3_client)
    return _open_remote


# -- driver hosts and their working copies ----------------------------------------------------
def working_dir(world, host: str) -> str:
    return os.path.join(world.root, "hosts", host)


def on_host(world, host: str) -> None:
    """What follows runs on ``host``: its working copies are its own."""
    os.environ[ENV_WORKING_DIR] = working_dir(world, host)


def drop_working_copy(world, host: str, location: str) -> bool:
    """``host`` loses its working copy of the WAL at ``location`` (RocksDB log and all)."""
    from wal.remote import working_copy_of

    on_host(world, host)
    root = working_copy_of(location)
    existed = os.path.isdir(root)
    shutil.rmtree(root, ignore_errors=True)
    return existed


def leftovers(world) -> list[str]:
    """The store invariant at the end: every segment of a batch at or below a WAL's highest
    ``flushed/<batch>`` marker is gone from the store (a flushed batch's, a losing attempt's,
    a late zombie's): nothing stays there forever."""
    out = []
    state = world.store
    for location in sorted(world.store_wals):
        local = state.raw(location)
        marks = [k.rsplit("/", 1)[-1] for k in local.list("flushed")]
        through = max((int(m) for m in marks if m.isdigit()), default=-1)
        for key in local.list("segments"):
            batch = key.split("/")[1]
            if batch.isdigit() and int(batch) <= through:
                out.append(f"{location}/{key} (flushed through {through})")
    return out


def spool_leftovers(world) -> list[str]:
    """Segment files left in the tasks' spools (``wal.remote.spool_dir``, under the world's
    temp dir): a task that published removed its file, one that failed must have too."""
    spool = os.path.join(world.root, "tmp", "cassandra_wal_spool")
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(spool)
                  for name in names)
