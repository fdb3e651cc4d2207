"""Where a WAL's immutable files can live: a local (or mounted) folder, HDFS, or an S3 bucket,
behind one small interface whose key operation is **publish once**.

Every file a task or a commit writes (a segment, a seal) is published under a name no other
writer may take, complete or not at all:

* ``create(key, data)`` puts ``data`` under ``key`` only if nothing is there yet, atomically:
  ``True`` if this call published it, ``False`` if the key was already taken (what is there is
  left untouched). Readers never see a part of an object.
* ``read``, ``list`` (every key under a prefix, in key order) and ``delete``.
* ``delete_many(keys)``: every key named, in as few requests as the store allows (S3: one
  ``DeleteObjects`` per 1,000 keys); ``delete_folder(prefix, recursive=True)``: a folder and
  everything under it (HDFS: one recursive ``DELETE``), for a folder that goes whole. A delete
  is idempotent (an absent key is deleted); one the store refused raises
  :class:`~wal.errors.StoreUnavailable` once every other key was tried, and what it refused
  stays for the next try.

How each store does it:

* :class:`LocalStore` (a path, ``file:``): a temp file, fsynced, then ``link(tmp, key)``,
  which fails if ``key`` exists; the folder fsynced.
* :class:`~wal.webhdfs.WebHdfsStore` (HDFS over its REST API): ``CREATE`` of a temp file,
  then ``RENAME`` to ``key``, which the namenode does atomically and refuses if ``key``
  exists.
* :class:`~wal.s3.S3Store` (``s3://``, ``s3a://``): one ``PutObject`` with
  ``If-None-Match: *`` (HTTP 412 if the key exists); S3 makes an object visible whole.

No store relies on listing being atomic or consistent with a rename in flight: a key is
trusted once ``create`` returned ``True`` for it or ``read`` found it. Nothing here is specific
to the WAL's layout (``wal/FORMAT.md``): keys are ``/``-separated relative paths.
:func:`wal.stores.open_store` opens a store by URI; each store lives in a module of its own, so
that a process loads only the client it uses (Spark's one-shot Python workers import this one).

Credentials never go through this module's arguments as text a log could show: S3 takes
them from boto3's usual chain (environment, profiles, instance roles), HDFS runs as the user
named by ``HADOOP_USER_NAME`` (or the process's), as Hadoop's own clients do.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Protocol

from .errors import StoreUnavailable
from .files import fsync_dir, make_private_dirs
from .schemes import LOCAL_SCHEME


class Store(Protocol):
    """Immutable objects under ``/``-separated keys; see the module docstring."""

    uri: str

    def create(self, key: str, data: bytes) -> bool: ...

    def read(self, key: str) -> bytes | None: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: list[str]) -> None:
        """Every key of ``keys``, in as few requests as the store allows. Raises
        StoreUnavailable, once every key was tried, if some could not be deleted (they stay)."""

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        """Remove the folder ``prefix`` if it holds nothing (a store without folders: no-op).
        Listings walk folders, so empty ones must not pile up. ``recursive``: and every key
        under it, whoever published it (only for a folder whose every key is meant to go)."""


def check_key(key: str) -> str:
    """``key`` if it is a plain relative path of ``/``-separated names; else a ValueError."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad store key {key!r}: a relative path without '.', '..' or '//'")
    return key


class LocalStore:
    """A folder on this machine (or a mount every node sees at the same path)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.uri = f"{LOCAL_SCHEME}:{self.root}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        folder = os.path.dirname(path)
        make_private_dirs(folder)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)          # atomic, and refuses an existing name
            except FileExistsError:
                return False
            fsync_dir(folder)
            return True
        finally:
            os.unlink(tmp)

    def read(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[str]:
        start = self._path(prefix) if prefix else self.root
        out = []
        for folder, dirs, files in os.walk(start):
            dirs.sort()
            rel = os.path.relpath(folder, self.root)
            for name in files:
                if not name.endswith(".tmp"):
                    out.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def delete_many(self, keys: list[str]) -> None:
        delete_each(self, keys)

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        if recursive:
            for folder, _dirs, files in os.walk(self._path(prefix), topdown=False):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(folder)
            return
        try:
            os.rmdir(self._path(prefix))
        except OSError:         # absent, or not empty (a key published meanwhile)
            pass


def delete_each(store: Store, keys: list[str]) -> None:
    """``delete_many`` for a store without a request that deletes several keys: one ``delete``
    a key, every key tried; the first failure raised after the last key."""
    failed: Exception | None = None
    for key in keys:
        try:
            store.delete(key)
        except (StoreUnavailable, OSError) as exc:     # raised once every key was tried
            failed = failed or exc
    if failed is not None:
        raise failed
