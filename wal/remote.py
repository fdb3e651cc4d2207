"""A WAL whose durable home is a store (HDFS, S3; :mod:`wal.store`), worked on through a local
copy on the driver host.

Every file the guarantee needs is published to the store before the step that needs it returns,
and the local copy (the *working copy*: the layout of ``wal/FORMAT.md`` in a local folder, with
the RocksDB log) is a cache the driver rebuilds from the store whenever it is missing, on any
host. Lifecycle of batch N (the store's keys: ``wal/FORMAT.md``, "On a store"):

1. **Stage** (a task, anywhere): the segment is written to a local spool as always, then
   published with one ``create`` under its unique name ``segments/<batch>/<file>``; the spool
   file is removed. No task needs the driver's disk.
2. **Seal** (the commit, on the driver host): :meth:`RemoteWal.pull_seals` first (the write
   timestamps start above the previous seal, which may have been written on another host),
   then the seal is published as a new *version* ``seals/<batch>/<version>-<tok>.seal`` by a
   create-only write: a re-run of N (before Spark committed it) publishes a higher version and
   never replaces one. The newest version is the seal; Spark never re-runs a committed batch.
3. **Flush** (the driver): :meth:`RemoteWal.pull` brings the seals, the segments of batches not
   yet flushed and the shared markers into the working copy, and the local machinery does the
   rest. For a scale-out writer (``wal.flush.mode=executors`` or ``processes``), whose tasks
   read each its segment from the store, the pull makes each staged batch's folder and
   fetches no segment: no row passes through the driver. Marking N flushed publishes
   ``flushed/<batch>`` (create-only; the highest wins); retention deletes the batch's objects
   on the store as in the working copy.

Files that change (``target.json``, ``blocked.json``) are versioned or deleted and created
again: nothing needs an atomic replace, which object stores do not have for create-only
writes, and nothing relies on a listing being atomic with a write in flight. Only the driver
host reads the working copy; tasks and the offline tool reach the store alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import uuid

from . import format as fmt
from .errors import StoreUnavailable
from .files import atomic_write, make_private_dirs
from .store import Store
from .stores import open_store

#: In a working copy: ``{"uri": <the store's URI>}``, the one thing that makes it one.
REMOTE_FILE = "REMOTE"
#: Where working copies live by default: ``~/.cassandra_wal/working/<sha256 of the URI>``;
#: ``CASSANDRA_WAL_WORKING_DIR`` moves the parent.
ENV_WORKING_DIR = "CASSANDRA_WAL_WORKING_DIR"
#: Keys on the store beside the working copy's layout (FORMAT.md, "On a store").
SEAL_VERSIONS = fmt.SEALS_DIR          # seals/<batch>/<version>-<tok>.seal
ENTRY_VERSIONS = fmt.ENTRIES_DIR       # entered/<batch>/<version>-<tok>.json, entered/since
AMENDMENT_VERSIONS = fmt.AMENDMENTS_DIR  # amended/<batch>/<version>-<tok>.json
TARGET_VERSIONS = "targets"            # targets/<version>-<tok>.json
FLUSHED_MARKERS = "flushed"            # flushed/<batch>
VERSION_DIGITS = 8


def working_copy_of(uri: str) -> str:
    """The local folder where this host keeps its working copy of the WAL at ``uri``."""
    parent = os.environ.get(ENV_WORKING_DIR) or os.path.join(
        os.path.expanduser("~"), ".cassandra_wal", "working")
    return os.path.join(parent, hashlib.sha256(uri.encode()).hexdigest()[:24])


def read_remote_uri(root: str) -> str | None:
    """The store a working copy at ``root`` mirrors (None: ``root`` is a WAL of its own)."""
    try:
        with open(os.path.join(root, REMOTE_FILE), "rb") as f:
            return str(json.loads(f.read())["uri"])
    except FileNotFoundError:
        return None


def make_working_copy(root: str, uri: str) -> None:
    """Make ``root`` the working copy of the WAL at ``uri`` (idempotent)."""
    make_private_dirs(root)
    if read_remote_uri(root) != uri:
        atomic_write(os.path.join(root, REMOTE_FILE), json.dumps({"uri": uri}).encode() + b"\n")


def _version_of(key: str) -> int | None:
    """``<version>-<token>.<suffix>`` -> version."""
    stem = key.rsplit("/", 1)[-1].split(".", 1)[0].split("-", 1)[0]
    return int(stem) if stem.isdigit() else None


class RemoteWal:
    """The store side of one WAL: what to publish where, and how to pull it back."""

    def __init__(self, store: Store, uri: str | None = None):
        self.store = store
        self._immutable: dict[str, bytes] = {}     # versions read: keys are never reused
        # As the sink was given it (s3a://, hdfs://): one URI, one working copy per host.
        self.uri = uri or store.uri

    @classmethod
    def at(cls, uri: str) -> "RemoteWal":
        """The WAL at ``uri``, its store client made once per process (a boto3 client costs
        about 0.1 s, and the commit asks several times)."""
        return cls(open_store(uri), uri)

    # -- publishing --------------------------------------------------------------------------
    def publish_segment(self, name: str, path: str) -> None:
        """The segment file at ``path`` under ``segments/<name>``; its name is unique to the
        task attempt, so the key is never taken unless this very call retried."""
        with open(path, "rb") as f:
            data = f.read()
        key = f"{fmt.SEGMENTS_DIR}/{name}"
        if not self.store.create(key, data) and self.store.read(key) != data:
            raise StoreUnavailable(self.uri, f"segment {name} exists with other bytes")

    def publish_version(self, folder: str, data: bytes, suffix: str) -> str:
        """``data`` as the next version under ``folder`` (create-only); the key published.

        The token makes every key unique for good: a version deleted (a discarded batch's
        seals) and published again under the same number is another key, so an object once
        read never changes (RemoteWal keeps them). Two writers publishing one number at once
        (only two live drivers of one query would) both succeed; readers order them by token,
        all alike (:meth:`latest_version`, :meth:`pull_seals`)."""
        versions = [v for v in map(_version_of, self.store.list(folder)) if v is not None]
        version = max(versions, default=0) + 1
        key = f"{folder}/{version:0{VERSION_DIGITS}d}-{uuid.uuid4().hex[:12]}{suffix}"
        if not self.store.create(key, data):      # a 12-hex-digit token taken: never seen
            raise StoreUnavailable(self.uri, f"{key} exists already")
        return key

    def latest_version(self, folder: str) -> bytes | None:
        """The newest version under ``folder`` (None: none)."""
        keys = sorted((v, k) for k in self.store.list(folder)
                      if (v := _version_of(k)) is not None)
        for _, key in reversed(keys):     # one deleted since the listing: the one before
            data = self.read_version(key)
            if data is not None:
                return data
        return None

    def read_version(self, key: str) -> bytes | None:
        """A version's bytes, read from the store once per process (versions never change)."""
        if key not in self._immutable:
            data = self.store.read(key)
            if data is None:
                return None
            self._immutable[key] = data
        return self._immutable[key]

    def publish_seal(self, batch: int, data: bytes) -> None:
        self.publish_version(f"{SEAL_VERSIONS}/{fmt.batch_name(batch)}", data, fmt.SEAL_SUFFIX)

    def publish_entry(self, batch: int, data: bytes) -> None:
        self.publish_version(f"{ENTRY_VERSIONS}/{fmt.batch_name(batch)}", data, fmt.ENTRY_SUFFIX)

    def publish_run(self, first_batch: int, data: bytes) -> None:
        self.publish_version(f"{ENTRY_VERSIONS}/runs/{fmt.batch_name(first_batch)}", data,
                             ".run")

    def publish_amendment(self, batch: int, data: bytes) -> None:
        self.publish_version(f"{AMENDMENT_VERSIONS}/{fmt.batch_name(batch)}", data,
                             fmt.ENTRY_SUFFIX)

    def publish_target(self, data: bytes) -> None:
        if self.latest_version(TARGET_VERSIONS) != data:
            self.publish_version(TARGET_VERSIONS, data, ".json")

    def publish_once(self, name: str, data: bytes) -> bytes:
        """A file that never changes once written (``WAL_FORMAT``, ``query.json``): ``data``,
        or what another writer published first."""
        if self.store.create(name, data):
            return data
        return self.store.read(name) or data

    def publish_flushed(self, batch: int) -> None:
        """``flushed/<batch>``; older markers go (the highest is the one read)."""
        self.store.create(f"{FLUSHED_MARKERS}/{fmt.batch_name(batch)}", b"")
        older = [key for key in self.store.list(FLUSHED_MARKERS)
                 if (stem := key.rsplit("/", 1)[-1]).isdigit() and int(stem) < batch]
        if older:
            self.store.delete_many(older)

    def replace(self, name: str, data: bytes | None) -> None:
        """A status file that only informs (``blocked.json``): deleted, then created again.
        A reader in between sees none; the driver host reads its working copy."""
        self.store.delete(name)
        if data is not None:
            self.store.create(name, data)

    def read_segment(self, name: str) -> bytes | None:
        """The bytes of segment ``name`` (``<batch>/<file>``) as published; None: not there
        (never published, or deleted once its batch was done with)."""
        return self.store.read(f"{fmt.SEGMENTS_DIR}/{name}")

    # -- deleting ----------------------------------------------------------------------------
    def delete_segments(self, batch: int, keep: set[str] | None = None) -> None:
        """The segments of ``batch`` on the store: every one, its folder with them (one
        request where the store can: HDFS), or (``keep``) all but those named, listed and
        deleted together (S3: one request per 1,000 keys). Only a batch done with (flushed,
        discarded, a late attempt's) goes whole; a batch in flight keeps its winners."""
        folder = f"{fmt.SEGMENTS_DIR}/{fmt.batch_name(batch)}"
        if keep is None:
            self.store.delete_folder(folder, recursive=True)
            return
        prefix = f"{fmt.SEGMENTS_DIR}/"
        losers = [key for key in self.store.list(folder) if key[len(prefix):] not in keep]
        if losers:
            self.store.delete_many(losers)
        self.store.delete_folder(folder)

    def delete_seal(self, batch: int) -> None:
        self._delete_versions(f"{SEAL_VERSIONS}/{fmt.batch_name(batch)}")

    def delete_entry(self, batch: int) -> None:
        self._delete_versions(f"{ENTRY_VERSIONS}/{fmt.batch_name(batch)}")

    def delete_amendment(self, batch: int) -> None:
        self._delete_versions(f"{AMENDMENT_VERSIONS}/{fmt.batch_name(batch)}")

    def _delete_versions(self, folder: str) -> None:
        """Every version listed (a version published meanwhile, a re-run's seal, stays)."""
        keys = self.store.list(folder)
        for key in keys:
            self._immutable.pop(key, None)
        if keys:
            self.store.delete_many(keys)
        self.store.delete_folder(folder)

    # -- pulling -----------------------------------------------------------------------------
    def flushed_through(self) -> int:
        stems = (k.rsplit("/", 1)[-1] for k in self.store.list(FLUSHED_MARKERS))
        return max((int(s) for s in stems if s.isdigit()), default=-1)

    def is_stale(self, root: str) -> bool:
        """The working copy at ``root`` is of a WAL the store no longer holds: the WAL was
        deleted there (with its checkpoint, a reset) and maybe made again by another query.
        Its ``query.json`` and RocksDB log would then speak for the old WAL: a new query
        refused, or its batches taken for flushed."""
        local = _read(os.path.join(root, fmt.BINDING_FILE))
        if local is not None and self.store.read(fmt.BINDING_FILE) != local:
            return True
        return os.path.exists(os.path.join(root, fmt.MARKER_FILE)) and \
            self.store.read(fmt.MARKER_FILE) is None

    def pull_state(self, root: str) -> None:
        """``WAL_FORMAT``, ``query.json``, the newest ``target.json``, ``blocked.json``,
        ``moved.json`` and the highest flushed batch into the working copy at ``root``."""
        for name in (fmt.MARKER_FILE, fmt.BINDING_FILE):
            path = os.path.join(root, name)
            if not os.path.exists(path):
                data = self.store.read(name)
                if data is not None:
                    atomic_write(path, data)
        target = self.latest_version(TARGET_VERSIONS)
        if target is not None:
            _write_if_changed(os.path.join(root, fmt.TARGET_FILE), target)
        for name in (fmt.BLOCKED_FILE, fmt.MOVED_FILE):
            data = self.store.read(name)
            path = os.path.join(root, name)
            if data is not None:
                _write_if_changed(path, data)
            elif os.path.exists(path):
                os.unlink(path)
        flushed = self.flushed_through()
        local = os.path.join(root, fmt.FLUSHED_THROUGH_FILE)
        if flushed > _read_int(local):
            atomic_write(local, b"%d\n" % flushed)

    def pull_seals(self, root: str) -> list[int]:
        """The newest version of every seal on the store into the working copy's ``seals/``
        (a local seal the store no longer has stays: only retention removes seals). Returns
        the batch ids pulled."""
        return self._pull_versions(SEAL_VERSIONS, os.path.join(root, fmt.SEALS_DIR),
                                   fmt.SEAL_SUFFIX)

    def pull_entries(self, root: str) -> list[int]:
        """``entered/since`` and the newest version of every batch's entry
        (:mod:`wal.entries`) into the working copy; an entry the store no longer has goes
        (its batch was flushed or discarded). Returns the batch ids pulled."""
        folder = os.path.join(root, fmt.ENTRIES_DIR)
        keys = self.store.list(ENTRY_VERSIONS)
        since_key = f"{ENTRY_VERSIONS}/{fmt.ENTRIES_SINCE_FILE}"
        if since_key in keys:
            since_path = os.path.join(folder, fmt.ENTRIES_SINCE_FILE)
            data = None if os.path.exists(since_path) else self.store.read(since_key)
            if data is not None:
                make_private_dirs(folder)
                atomic_write(since_path, data)
        pulled = self._pull_versions(ENTRY_VERSIONS, folder, fmt.ENTRY_SUFFIX, keys)
        self._pull_versions(f"{ENTRY_VERSIONS}/runs", os.path.join(folder, "runs"), ".run",
                            [k for k in keys if k.startswith(f"{ENTRY_VERSIONS}/runs/")])
        there = {k.split("/")[1] for k in keys if k.count("/") == 2}
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            stem = name[: -len(fmt.ENTRY_SUFFIX)]
            if name.endswith(fmt.ENTRY_SUFFIX) and stem.isdigit() and stem not in there:
                os.unlink(os.path.join(folder, name))
        return pulled

    def _pull_versions(self, top: str, folder: str, suffix: str,
                       keys: list[str] | None = None) -> list[int]:
        """The newest version under each ``<top>/<batch>/`` into ``folder/<batch><suffix>``."""
        newest: dict[str, tuple[int, str]] = {}
        depth = top.count("/") + 1            # <top>/<batch>/<version>: the batch's place
        for key in self.store.list(top) if keys is None else keys:
            parts = key.split("/")
            version = _version_of(key)
            if (len(parts) == depth + 2 and parts[depth].isdigit() and version is not None
                    and (version, key) > newest.get(parts[depth], (-1, ""))):   # as latest_version
                newest[parts[depth]] = (version, key)
        make_private_dirs(folder)
        pulled = []
        for batch, (_, key) in sorted(newest.items()):
            data = self.read_version(key)
            if data is not None and _write_if_changed(os.path.join(folder, batch + suffix), data):
                pulled.append(int(batch))
        return pulled

    def pull_segments(self, root: str, above: int, fetch: bool = True) -> int:
        """Segments of batches above ``above`` (the highest flushed) that the working copy
        does not have yet; returns how many were fetched. Segments of batches at or below it
        are a late task attempt's (a zombie or speculative task that published after its
        batch was flushed: wal/FORMAT.md, "States"): garbage, deleted from the store.
        ``fetch`` False (a scale-out writer's tasks read the segments from the store): only
        each such batch's folder is made in the working copy, empty, so that it sees what
        the store has staged; the bytes stay on the store (:meth:`fetch_segments` when this
        process needs them)."""
        fetched = 0
        prefix = f"{fmt.SEGMENTS_DIR}/"
        late: dict[str, list[str]] = {}
        for key in self.store.list(fmt.SEGMENTS_DIR):
            name = key[len(prefix):]
            batch = name.split("/", 1)[0]
            if batch.isdigit() and int(batch) <= above:
                late.setdefault(batch, []).append(key)
                continue
            if not batch.isdigit() or not name.endswith(fmt.SEGMENT_SUFFIX):
                continue
            if not fetch:
                make_private_dirs(os.path.join(root, fmt.SEGMENTS_DIR, batch))
                continue
            fetched += self._fetch_segment(root, name)
        if late:        # the keys listed: a re-run cannot stage into a flushed batch anyway
            self.store.delete_many([key for keys in late.values() for key in keys])
            for batch in late:
                self.store.delete_folder(f"{fmt.SEGMENTS_DIR}/{batch}")
        return fetched

    def fetch_segments(self, root: str, names: list[str]) -> None:
        """The segments ``names`` (``<batch>/<file>``) into the working copy at ``root``, those
        it does not hold yet (pulled without them: :meth:`pull_segments`). One the store no
        longer has is left out: reading it then fails as a missing segment."""
        for name in names:
            self._fetch_segment(root, name)

    def _fetch_segment(self, root: str, name: str) -> bool:
        """Segment ``name`` into the working copy at ``root`` unless it is there; whether it
        was fetched (False too when the store no longer has it: deleted since a listing, by a
        discard or retention)."""
        path = os.path.join(root, fmt.SEGMENTS_DIR, *name.split("/"))
        if os.path.exists(path):
            return False
        data = self.read_segment(name)
        if data is None:
            return False
        make_private_dirs(os.path.dirname(path))
        atomic_write(path, data)
        return True

    def pull(self, root: str, segments: bool = True, fetch: bool = True) -> None:
        """Everything the working copy at ``root`` needs to flush (``segments``: and the
        segments' bytes, unless ``fetch`` is False: :meth:`pull_segments`) or to seal."""
        self.pull_state(root)
        self.pull_seals(root)
        self.pull_entries(root)
        self._pull_versions(AMENDMENT_VERSIONS, os.path.join(root, fmt.AMENDMENTS_DIR),
                            fmt.ENTRY_SUFFIX)
        if segments:
            self.pull_segments(root, _read_int(os.path.join(root, fmt.FLUSHED_THROUGH_FILE)),
                               fetch)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _read_int(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read().strip() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def _write_if_changed(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    atomic_write(path, data)
    return True


def spool_dir(uri: str) -> str:
    """Where a task spools segments of the WAL at ``uri`` before publishing them (removed
    after): this host's temp folder."""
    return os.path.join(tempfile.gettempdir(), "cassandra_wal_spool",
                        hashlib.sha256(uri.encode()).hexdigest()[:24])
