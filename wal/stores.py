"""A :class:`~wal.store.Store` by URI: the one place that maps a location's scheme to a store."""

from __future__ import annotations

import os
import urllib.parse

from .s3 import S3Store
from .store import LocalStore, Store
from .webhdfs import WebHdfsStore

#: Where HDFS answers WebHDFS when a location names only the namenode's RPC address
#: (``hdfs://nn:8020/...``): ``CASSANDRA_WAL_WEBHDFS`` (``http://host:port``), else the
#: namenode's host on Hadoop 3's default HTTP port.
ENV_WEBHDFS = "CASSANDRA_WAL_WEBHDFS"
HADOOP3_NAMENODE_HTTP_PORT = 9870


def open_store(uri: str, *, s3_client=None) -> Store:
    """The store at ``uri``: a path or ``file:`` (:class:`LocalStore`); ``webhdfs://host:port``
    or ``hdfs://namenode`` (:class:`WebHdfsStore`, see :data:`ENV_WEBHDFS`); ``s3://`` or
    ``s3a://bucket/prefix`` (:class:`S3Store`). A ``ValueError`` names any other scheme."""
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return LocalStore(parsed.path if scheme else uri)
    if scheme == "webhdfs":
        return WebHdfsStore(f"http://{parsed.netloc}", parsed.path or "/")
    if scheme == "hdfs":
        base = os.environ.get(ENV_WEBHDFS) or \
            f"http://{parsed.hostname}:{HADOOP3_NAMENODE_HTTP_PORT}"
        return WebHdfsStore(base, parsed.path or "/")
    if scheme in ("s3", "s3a"):
        return S3Store(parsed.netloc, parsed.path, client=s3_client)
    raise ValueError(f"{uri}: no store for the scheme {scheme!r} (supported: a local path, "
                     f"file:, hdfs:, webhdfs:, s3:, s3a:)")
