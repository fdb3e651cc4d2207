"""What Spark's checkpoint says: batch N is committed exactly when ``<checkpoint>/commits/N``
exists (see ``../docs/guarantees.md``). Read-only: the WAL never writes into the checkpoint,
but for ``cassandra-wal repair`` (:mod:`wal.repair`), which moves Spark's ``offsets/K..`` and
``commits/K..`` out of a local one.

Where a checkpoint is: Spark qualifies a ``checkpointLocation`` as Hadoop does any path
(``Path.makeQualified``): a location without a scheme is on the session's default filesystem
(``fs.defaultFS`` of its Hadoop configuration, ``file:///`` unless set), a relative one under
that filesystem's working directory. On YARN or EMR the default is HDFS, so ``/data/cp`` means
``hdfs://<namenode>/data/cp`` to Spark. :meth:`Filesystems.resolve` says where Spark will
look, and the WAL reads the checkpoint there: a local folder with file calls, HDFS or an object
store through a :mod:`wal.store` (:func:`open_checkpoint`), never through a JVM, so that
Spark's Python workers and the offline tool read it as the driver does.
"""

from __future__ import annotations

import getpass
import json
import os
from dataclasses import dataclass, field

from .schemes import LOCAL_SCHEME, is_local, is_local_scheme, split
from .store import LocalStore, Store
from .stores import StoreAccess, open_store

COMMITS, OFFSETS, METADATA = "commits", "offsets", "metadata"   # in a checkpoint
LOCAL_DEFAULT_FS = f"{LOCAL_SCHEME}:///"   # Hadoop's fs.defaultFS when nothing sets it


class NotLocal(ValueError):
    """A location resolves to a filesystem other than the local one (HDFS, an object store),
    which the WAL cannot read. ``uri`` is where Spark will use it."""

    def __init__(self, location: str, uri: str):
        super().__init__(location, uri)
        self.location, self.uri = location, uri

    def __str__(self) -> str:
        return f"{self.location!r} is {self.uri}, not on the local filesystem"


@dataclass(frozen=True)
class Location:
    """A location as Spark qualifies it: ``uri`` (``file:/data/cp``, ``hdfs://nn:8020/cp``)
    and, on the local filesystem, the plain path the WAL reads (else None)."""

    uri: str
    local: str | None


@dataclass(frozen=True)
class Filesystems:
    """What Spark resolves a location against: the session's ``fs.defaultFS`` and the driver
    JVM's working directory (relative local paths; None: this process's). Picklable: the
    registered data source carries one to the worker that prepares a write."""

    default_fs: str = LOCAL_DEFAULT_FS
    working_dir: str | None = None
    access: StoreAccess = field(default_factory=StoreAccess)   # HDFS and S3 as the session's

    @classmethod
    def of_session(cls, spark) -> "Filesystems":
        """The filesystems a query of ``spark`` resolves its checkpoint against (in the driver,
        where there is a JVM): the session's Hadoop configuration, as Spark builds it for a
        query (``sessionState.newHadoopConf()``: the context's plus the session's settings)."""
        hadoop_conf = spark._jsparkSession.sessionState().newHadoopConf()
        default_fs = hadoop_conf.get("fs.defaultFS") or LOCAL_DEFAULT_FS
        working_dir = spark._jvm.java.lang.System.getProperty("user.dir")
        return cls(default_fs, working_dir, StoreAccess.of_hadoop_conf(hadoop_conf.get, default_fs))

    def resolve(self, location: str) -> Location:
        """``location`` qualified as Spark qualifies it, and its local path if it has one."""
        scheme, authority, path = split(location.strip())
        if scheme is None or (scheme == split(self.default_fs)[0] and not authority):
            default_scheme, default_authority, _ = split(self.default_fs)
            scheme = scheme or default_scheme or LOCAL_SCHEME
            authority = default_authority
        if is_local_scheme(scheme):
            if not path.startswith("/"):
                path = os.path.join(self.working_dir or os.getcwd(), path)
            path = os.path.normpath(path)
            return Location(f"{LOCAL_SCHEME}:{path}", path)
        if not path.startswith("/"):
            # Hadoop's remote filesystems (HDFS, S3A, ...) start in /user/<user name>.
            user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
            path = f"/user/{user}/{path}"
        return Location(f"{scheme}://{authority}{os.path.normpath(path)}", None)

    def local_path(self, location: str) -> str:
        """The local path of ``location``; :class:`NotLocal` if Spark would not use one."""
        resolved = self.resolve(location)
        if resolved.local is None:
            raise NotLocal(location, resolved.uri)
        return resolved.local


LOCAL = Filesystems()


def local_path(location: str) -> str:
    """``file:/x``, ``file:///x`` and ``/x`` -> ``/x`` (relative: under the working directory);
    :class:`NotLocal` for other schemes. ``location`` is a URI Spark resolved (the listener's
    ``resolvedCheckpointRoot``) or one an operator typed: local unless it names a scheme."""
    return LOCAL.local_path(location)


def normal_location(location: str) -> str:
    """One spelling per checkpoint: a local one as its absolute path, any other as its URI
    without a trailing ``/`` (opening it says whether a store reaches it)."""
    return local_path(location) if is_local(location) else location.rstrip("/")


def open_checkpoint(location: str) -> "SparkCheckpoint":
    """The checkpoint at ``location``: a local path or ``file:`` URI, or a store's URI
    (``hdfs://``, ``s3a://``: :func:`wal.stores.open_store`)."""
    if is_local(location):
        return SparkCheckpoint(LocalStore(local_path(location)))
    return SparkCheckpoint(open_store(location))


def is_committed(checkpoint: str, batch: int) -> bool:
    return open_checkpoint(checkpoint).is_committed(batch)


def exists(checkpoint: str) -> bool:
    """A local checkpoint folder exists, or a remote one holds what Spark writes (a store has
    no folders to find: :meth:`SparkCheckpoint.written_by_spark`)."""
    if is_local(checkpoint):
        return os.path.isdir(local_path(checkpoint))
    return open_checkpoint(checkpoint).written_by_spark()


def written_by_spark(checkpoint: str) -> bool:
    """Spark has run a query on this checkpoint: it writes ``metadata`` when the query starts
    and ``offsets/N`` before batch N runs, so a folder holding neither (nor ``commits/``) has
    never seen a batch, whatever a WAL says was sealed for it."""
    return open_checkpoint(checkpoint).written_by_spark()


def committed_batches(checkpoint: str) -> list[int]:
    return open_checkpoint(checkpoint).committed_batches()


@dataclass(frozen=True)
class SparkCheckpoint:
    """A Spark checkpoint read through a store (:mod:`wal.store`): on HDFS or S3 as well as
    on a local folder, from processes without a JVM (Spark's Python workers, the offline
    tool). Read-only, like the rest of this module."""

    store: Store

    def committed_batches(self) -> list[int]:
        """Every ``commits/N`` Spark wrote (and has not purged yet), in order."""
        names = (key.rsplit("/", 1)[-1] for key in self.store.list(COMMITS))
        return sorted(int(n) for n in names if n.isdigit())

    def is_committed(self, batch: int) -> bool:
        return self.store.read(f"{COMMITS}/{batch}") is not None

    def query_id(self) -> str | None:
        """Spark's id of the query (``metadata``: ``{"id": ...}``), the same in every run."""
        raw = self.store.read(METADATA)
        try:
            found = json.loads(raw.decode().splitlines()[0]).get("id") if raw else None
        except (ValueError, AttributeError, IndexError):    # torn or not Spark's
            return None
        return str(found) if found else None

    def batch_watermark_ms(self, batch: int) -> int | None:
        """The event-time watermark batch ``batch`` ran with (``offsets/<batch>``, its second
        line: ``batchWatermarkMs``), in ms since the epoch; None where it is 0 (a query without
        a watermark, or none advanced yet), or the file is gone (purged) or not Spark's."""
        raw = self.store.read(f"{OFFSETS}/{batch}")
        try:
            found = json.loads(raw.decode().splitlines()[1]).get("batchWatermarkMs") if raw \
                else None
        except (ValueError, AttributeError, IndexError):
            return None
        return int(found) if isinstance(found, int) and found > 0 else None

    def written_by_spark(self) -> bool:
        """See :func:`written_by_spark`: ``metadata``, ``offsets/`` or ``commits/`` exists."""
        return self.store.read(METADATA) is not None or \
            any(self.store.list(folder) for folder in (OFFSETS, COMMITS))
