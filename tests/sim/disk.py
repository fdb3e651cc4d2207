"""Disks: the disk under the sink's own files full (``ENOSPC``) or read-only (``EROFS``) for a
while, at any write, then room again (issue 31, items 0 and 7).

In one world of four (:data:`ENV_DISK`; drawn from an RNG of its own, ``disk:<seed>``, so a
world without disk faults draws what it drew before), at any step the disk may fill up or turn
read-only, for one kind of the sink's files or for all of them, until a later step gives it
room again (the final recovery always has room). The sites, by the file written:

* ``segment``: a task's segment file (``wal/segment.py``, in the WAL or a store task's spool);
* ``seal``, ``target`` (``target.json``), ``pointer`` (the checkpoint's pointer files),
  ``blocked`` (``blocked.json``), ``other`` (markers, entries, ``flushed_through``...): every
  file ``wal/files.atomic_write`` writes;
* ``log``: the RocksDB log, as rocksdict fails: a plain ``Exception`` whose text starts with
  RocksDB's "IO error: ..." on a put or a batch write, after which that handle refuses every
  write until the log is opened again (RocksDB's background error), and opening it fails while
  the disk is full.

The seams (:func:`install`): the ``os`` module that ``wal/files.py`` and ``wal/segment.py`` see
(2 modules; ``os.open`` of a file for writing raises ``EROFS``, ``os.write`` raises
``ENOSPC``), and ``wal.log.Rdict`` (the writer's handle, wrapped only in a world with disk
faults). Every injected fault counts in :attr:`DiskState.faults`, so a drain or recovery that
met one is not held to "a fault-free drain writes every committed batch", and a step of Spark
that failed on one fails as a store failure does (the task retried, the query failing).

What the invariants hold the sink to, beside the others (no committed row lost, nothing of an
uncommitted batch written, at the end everything written): the sink never blocks for it
(invariant 2: a retry cures a full disk); a drain that met it keeps its batch, and the figures
an operator is shown say it is failing while it lasts (``sinks.status(q).failing``,
``recovery/health.py``, as a72e97f promises; older code has no such figure and is not held to
it); the flusher never raises out of a drain.
"""

from __future__ import annotations

import errno
import os
import random

from .invariants import Violation
from .patches import Current

#: Disk-fault worlds: unset or 1 (the default) draws them, holding back what the sink fails on
#: main (README.md, "Disk full"); all: those too; 0: none.
ENV_DISK = "CASSANDRA_WAL_SIM_DISK"
SHARE = 4
SITES = ("segment", "seal", "target", "pointer", "blocked", "other", "log")
KINDS = (errno.ENOSPC, errno.ENOSPC, errno.EROFS)


def disk_setting() -> str:
    return os.environ.get(ENV_DISK, "1")


def site_of(path: str) -> str:
    from wal import format as fmt

    path = os.fsdecode(path)
    name = os.path.basename(path)
    parts = path.split(os.sep)
    if "segments" in parts or "cassandra_wal_spool" in parts or ".seg" in name:
        return "segment"
    if "seals" in parts or name.endswith((".seal", ".seal.tmp")):
        return "seal"
    if name.startswith(fmt.TARGET_FILE):
        return "target"
    if name.startswith(fmt.BLOCKED_FILE):
        return "blocked"
    if name.startswith(fmt.POINTER_FILE) or getattr(fmt, "POINTERS_DIR", "\0") in parts:
        return "pointer"
    return "other"


class DiskState:
    """A world's disk: whether it fails now, at which sites, how."""

    def __init__(self, seed: int, counts):
        self.rng = random.Random(f"disk:{seed}")
        self.counts = counts                   # the world's tally (World.counts)
        setting = disk_setting()
        self.on = setting != "0" and self.rng.randrange(SHARE) == 0
        self.all = setting == "all"
        self.kind: int | None = None          # errno while the disk fails, else None
        self.sites: frozenset[str] = frozenset()
        self.faults = 0
        self.broken_handles: set[int] = set()  # id() of RocksDB handles that met an I/O error
        self.handles: list = []                # and the handles themselves (ids stay unique)
        if self.on:
            self.counts["disk: worlds"] += 1

    def failing(self, site: str) -> int | None:
        if self.kind is None or site not in self.sites:
            return None
        return self.kind

    def fault(self, site: str, path: str = "") -> OSError:
        self.faults += 1
        self.counts[f"disk: faults at {site}"] += 1
        return OSError(self.kind, os.strerror(self.kind), path)

    # -- the world's actions ----------------------------------------------------------------------
    def fill(self) -> str:
        self.kind = self.rng.choice(KINDS)
        self.sites = frozenset(SITES) if self.rng.random() < 0.4 else \
            frozenset((self.rng.choice(SITES),))
        what = "full" if self.kind == errno.ENOSPC else "read-only"
        return f"disk: {what} for {', '.join(sorted(self.sites))}"

    def room(self) -> str:
        self.kind, self.sites = None, frozenset()
        return "disk: room again"


class Disk:
    """The disk actions and checks of :class:`tests.sim.world.World`."""

    def init_disk(self) -> None:
        self.disk = DiskState(self.seed, self.counts)

    def disk_fill(self) -> str:
        return self.say(self.disk.fill())

    def disk_room(self) -> str:
        return self.say(self.disk.room())

    def disk_error(self, exc: BaseException) -> bool:
        """``exc`` is how the sink reports a fault of this world's disk."""
        from wal.errors import WalStorageError

        return self.disk.faults > 0 and (isinstance(exc, (OSError, WalStorageError))
                                         or str(exc).startswith("IO error"))

    def flusher_failed_on_disk(self, q, exc: BaseException) -> None:
        """A run's flusher could not start on a full or read-only disk: the registry
        (``FlushRegistry._make_flusher``) tries again at the next event if the error is
        transient, and blocks the WAL if not: a full disk must be transient."""
        from recovery.errors import is_transient

        if not is_transient(exc):
            raise Violation("the sink never blocks where a retry could proceed",
                            f"{q.owner}: its flusher could not start on a full or read-only "
                            f"disk, and the error is not transient, so the registry blocks "
                            f"the WAL (blocked.json: the flusher cannot start): "
                            f"{type(exc).__name__}: {exc}")
        self.say(f"{q.owner}: listener error, no flusher yet (the disk): "
                 f"{type(exc).__name__}: {exc}")

    def check_disk_drain(self, q, flusher, what: str, faults_before: int) -> None:
        """After a drain or recovery that met a disk fault: it kept its batch for the next try
        (no block: invariant 2), and the figures say the drains are failing, as the code under
        test promises (``Health.failing``; older code has none)."""
        if self.disk.faults == faults_before or getattr(flusher, "last_error", None) is None:
            return
        if not hasattr(flusher, "failing") or self.expects_block(flusher):
            return
        if self.store is not None and self.store.mode != "up":
            return      # the figures are read through the store, away now (as check_health)
        health = flusher.health()
        if health.failing is None and health.state != "blocked":
            raise Violation("the figures shown say what the sink does",
                            f"after {q.owner}'s {what}, which met a {self.disk.describe_last()} "
                            f"and failed ({type(flusher.last_error).__name__}: "
                            f"{flusher.last_error}), the status does not say it is failing")


def _describe_last(self) -> str:
    return "full or read-only disk"


DiskState.describe_last = _describe_last


# -- the seams ------------------------------------------------------------------------------------
class SimOs:
    """The ``os`` module as ``wal/files.py`` and ``wal/segment.py`` see it: opening a file for
    writing on a read-only disk raises ``EROFS``, writing to a full one ``ENOSPC``."""

    def __init__(self, real):
        self._real = real
        self._paths: dict[int, str] = {}       # fd -> path, of files opened for writing

    def open(self, path, flags, *args, **kwargs):
        writing = flags & (self._real.O_WRONLY | self._real.O_RDWR | self._real.O_CREAT)
        disk = _disk()
        if writing and disk is not None:
            site = site_of(path)
            if disk.failing(site) == errno.EROFS:
                raise disk.fault(site, os.fsdecode(path))
        fd = self._real.open(path, flags, *args, **kwargs)
        if writing:
            self._paths[fd] = os.fsdecode(path)
        return fd

    def write(self, fd, data):
        disk = _disk()
        path = self._paths.get(fd)
        if disk is not None and path is not None:
            site = site_of(path)
            if disk.failing(site) is not None:
                raise disk.fault(site, path)
        return self._real.write(fd, data)

    def close(self, fd):
        self._paths.pop(fd, None)
        return self._real.close(fd)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _disk() -> DiskState | None:
    world = Current.world
    disk = getattr(world, "disk", None) if world is not None else None
    return disk if disk is not None and disk.on else None


class SimRdict:
    """A writer's RocksDB handle on a disk that may fail: a put or batch write raises as
    rocksdict does ("IO error: ..."), and the handle refuses every write after that until the
    log is opened again (RocksDB's background error)."""

    _WRITES = ("put", "write", "delete", "delete_range")

    def __init__(self, real, disk: DiskState, path: str):
        self._real, self._disk, self._path = real, disk, path

    def __getattr__(self, name):
        real = getattr(self._real, name)
        if name not in self._WRITES:
            return real
        disk, path = self._disk, self._path

        def write(*args, **kwargs):
            if id(self) in disk.broken_handles or disk.failing("log") is not None:
                kind = disk.kind or errno.ENOSPC
                if id(self) not in disk.broken_handles:
                    disk.broken_handles.add(id(self))
                    disk.handles.append(self)
                raise _rocks_error(disk.fault("log", path), path, kind)
            return real(*args, **kwargs)
        return write

    def __setitem__(self, key, value):
        return self.put(key, value)

    def __delitem__(self, key):
        return self.delete(key)

    def __getitem__(self, key):
        return self._real[key]


def _rocks_error(_fault: OSError, path: str, kind: int) -> Exception:
    return Exception(f"IO error: While appending to file: {path}/000009.log: "
                     f"{os.strerror(kind)}")


def open_rdict(real_cls):
    """``wal.log.Rdict``: a writer's handle (no ``access_type``: readers open secondaries in
    a scratch folder) fails to open while the log's disk fails, and is wrapped in a world with
    disk faults."""
    def Rdict(path, *args, **kwargs):
        disk = _disk()
        if disk is None or "access_type" in kwargs:
            return real_cls(path, *args, **kwargs)
        db = real_cls(path, *args, **kwargs)     # RocksDB takes its lock before it writes
        if disk.failing("log") is not None:
            db.close()
            raise _rocks_error(disk.fault("log", path), path, disk.kind)
        return SimRdict(db, disk, path)
    return Rdict


def install(patches) -> None:
    """The seams, through ``patches._set`` (undone with the others)."""
    import importlib

    for name in ("wal.files", "wal.segment"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        patches._set(module, "os", SimOs(os))
    import wal.log

    patches._set(wal.log, "Rdict", open_rdict(wal.log.Rdict))
