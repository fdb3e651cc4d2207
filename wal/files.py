"""Durable file primitives: atomic replace, fsync of files and folders, private permissions.

A file that matters to the guarantee is written under a temporary name, fsynced, renamed into
place and its folder fsynced: after a crash it is either absent or whole, never torn.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading

DIR_MODE = 0o700
FILE_MODE = 0o600


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dirs(path: str) -> None:
    """Create ``path`` (and parents) with mode 0700 where they are created here, each new
    entry made durable by an fsync of its parent folder."""
    # Not os.makedirs(mode=...): since Python 3.7 it creates intermediate folders with the
    # default mode (0777 & ~umask), so a task creating WAL_DIR/segments/<batch> would leave
    # WAL_DIR and segments/ readable by others.
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.normpath(path))
    if parent and parent != path:
        make_private_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:   # created meanwhile by a concurrent task
        if not os.path.isdir(path):
            raise
    # Why: a segment's rename and its folder's fsync make the file durable inside
    # segments/<batch>, but not <batch> itself inside segments/: without this, a crash after
    # the seal could lose the whole batch folder. Also after a concurrent mkdir: its creator
    # may not have synced the entry yet when our segment is sealed.
    fsync_dir(parent or ".")


_calls = itertools.count()


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, whole."""
    # Unique per call: two threads of one process writing one file (a foreachBatch run
    # record) must not rename each other's temporary away.
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}-{next(_calls)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def tree_size(path: str) -> int:
    """Bytes held by regular files under ``path`` (0 if it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue  # removed by retention while we walk
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def others_can_write(path: str) -> bool:
    """True when group or others may write into ``path``."""
    return bool(os.stat(path).st_mode & (stat.S_IWGRP | stat.S_IWOTH))
