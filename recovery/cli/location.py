"""A command's ``WAL_DIR``: a local folder, or the URI of a WAL on a store (``hdfs://``,
``s3a://``, ``s3://``, ``webhdfs://``).

A WAL on a store is read through a private copy: ``inspect``, ``dump`` and ``verify`` pull
its files (seals, markers and, for ``dump`` and ``verify``, the segments of batches not yet
flushed) into a temporary folder removed at exit, and never write to the store, so they can
run beside a live sink. ``recover`` works on this host's working copy of the WAL
(:meth:`wal.layout.WalDir.at`), as a driver here would. Credentials come from the usual
places (``AWS_*`` and ``~/.aws`` for S3, ``CASSANDRA_WAL_WEBHDFS`` and ``HADOOP_USER_NAME``
for HDFS), never from the command line.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from wal.layout import WalDir
from wal.remote import make_working_copy
from wal.schemes import is_remote, store_schemes_text

WAL_DIR_HELP = f"the WAL directory, or the WAL's URI on a store ({store_schemes_text()})"


def shown(wal: WalDir) -> str:
    """How a command names the WAL it read: the store's URI, or the folder's absolute path
    (never the private copy)."""
    return wal.location if wal.remote else os.path.abspath(wal.root)


def read_only_wal(location: str, segments: bool = False) -> WalDir:
    """The WAL at ``location`` to read: a local folder as is, a store's through a private copy
    (with the segments of unflushed batches if ``segments``). Raises NotAWal and the like."""
    if not is_remote(location):
        return WalDir(location).check()
    root = tempfile.mkdtemp(prefix="cassandra-wal-read-")
    atexit.register(shutil.rmtree, root, True)
    make_working_copy(root, location)
    wal = WalDir(root)
    wal.remote.pull(root, segments=segments)
    return wal.check()


def segment_to_read(wal: WalDir, name: str) -> str:
    """Where to read segment ``name`` (``<batch>/<file>``) of ``wal``: its file in the folder,
    or, for a working copy a scale-out flusher keeps (which holds no segment: its tasks read
    them from the store), a private copy of the store's object, removed at exit. A segment
    neither has: the folder's path, which the reader reports missing."""
    path = wal.segment_path(name)
    if os.path.exists(path) or wal.remote is None:
        return path
    folder = tempfile.mkdtemp(prefix="cassandra-wal-segment-")
    atexit.register(shutil.rmtree, folder, True)
    wal.remote.fetch_segments(folder, [name])
    copy = WalDir(folder).segment_path(name)
    return copy if os.path.exists(copy) else path


def removed_while_reading(wal: WalDir, batch: int, flushed_through_before: int,
                          seal_file_read: bool) -> bool:
    """Whether ``batch``'s files, missing now though the command had seen them (or the seal
    naming them), went as a running sink removes them: the batch was flushed since (the
    ``flushed_through`` marker, read again now, moved past what the command read before and
    reaches it), or discarded or retired since (its seal file, read before, is gone). Never
    true of a WAL nothing writes to: what is missing there was missing from the start."""
    now = wal.read_flushed_through()
    if flushed_through_before < batch <= now:
        return True
    return seal_file_read and not os.path.exists(wal.seal_path(batch))


def working_wal(location: str) -> WalDir:
    """The WAL at ``location`` to change (``recover``): a local folder, or this host's working
    copy of a store's WAL, with its small files pulled."""
    return WalDir.at(location).check()
