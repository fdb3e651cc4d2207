"""A :class:`~wal.store.Store` by URI: the store a location's scheme names (the schemes and
what each names: :mod:`wal.schemes`), and how this process reaches each store
(:class:`StoreAccess`)."""

from __future__ import annotations

import functools
import os
import urllib.parse
from dataclasses import dataclass, replace

from . import schemes
from .secrets import repr_without_secrets
from .store import LocalStore, Store

#: Where HDFS answers WebHDFS when neither the session's Hadoop configuration
#: (``dfs.namenode.http-address``) nor :class:`StoreAccess` says: ``CASSANDRA_WAL_WEBHDFS``
#: (``http://host:port``), else the namenode's host on Hadoop 3's default HTTP port.
ENV_WEBHDFS = "CASSANDRA_WAL_WEBHDFS"
HADOOP3_NAMENODE_HTTP_PORT = 9870
ANY = "*"       # StoreAccess.webhdfs: the one namenode the configuration names, for any hdfs://


@dataclass(frozen=True)
class StoreAccess:
    """How to reach the stores, as the Spark session's Hadoop configuration says (read in the
    driver, where there is a JVM: :meth:`of_hadoop_conf`), so that Python workers and tasks
    reach HDFS and S3 where Spark does. Empty fields fall back to the environment: boto3's
    usual chain (``AWS_*``, ``~/.aws``, instance roles), :data:`ENV_WEBHDFS`. Picklable; the
    S3 keys are never shown (:func:`wal.secrets.is_secret`: not in the repr) nor written
    anywhere."""

    webhdfs: tuple[tuple[str, str], ...] = ()   # (hdfs://authority, http://host:port)
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool = False
    s3_access_key: str | None = None
    s3_secret_key: str | None = None

    __repr__ = repr_without_secrets

    @classmethod
    def of_hadoop_conf(cls, get, default_fs: str | None = None) -> "StoreAccess":
        """From a Hadoop configuration's ``get(key)``: ``dfs.namenode.http-address`` (the
        namenode of ``default_fs`` when that is HDFS, else of any ``hdfs://`` location) and
        the ``fs.s3a.*`` endpoint, region, path style and keys."""
        webhdfs = ()
        http = get("dfs.namenode.http-address")
        if http:
            hdfs_default = bool(default_fs) and \
                schemes.kind_of(schemes.uri_scheme(default_fs)) == schemes.HDFS
            authority = urllib.parse.urlsplit(default_fs).netloc if hdfs_default else ANY
            webhdfs = ((authority, "http://" + http.replace("0.0.0.0", "127.0.0.1")),)
        endpoint = get("fs.s3a.endpoint")
        if endpoint and "://" not in endpoint:
            ssl = (get("fs.s3a.connection.ssl.enabled") or "true").lower() == "true"
            endpoint = ("https://" if ssl else "http://") + endpoint
        return cls(webhdfs=webhdfs, s3_endpoint=endpoint or None,
                   s3_region=get("fs.s3a.endpoint.region") or None,
                   s3_path_style=(get("fs.s3a.path.style.access") or "").lower() == "true",
                   s3_access_key=get("fs.s3a.access.key") or None,
                   s3_secret_key=get("fs.s3a.secret.key") or None)

    def for_uri(self, uri: str) -> "StoreAccess":
        """Only what reaching ``uri`` takes (an HDFS location carries no S3 keys), for
        handing to another process."""
        kind = schemes.kind_of(urllib.parse.urlsplit(uri).scheme)
        if kind in (schemes.HDFS, schemes.WEBHDFS):
            return StoreAccess(webhdfs=self.webhdfs)
        if kind == schemes.S3:
            return replace(self, webhdfs=())
        return StoreAccess()

    def webhdfs_base(self, authority: str, host: str | None) -> str:
        for known, base in sorted(self.webhdfs, key=lambda kb: kb[0] == ANY):
            if known in (authority, ANY):
                return base
        return os.environ.get(ENV_WEBHDFS) or f"http://{host}:{HADOOP3_NAMENODE_HTTP_PORT}"

    def s3_client(self):
        """A boto3 S3 client as this access says (None: boto3's own default)."""
        if not (self.s3_endpoint or self.s3_region or self.s3_path_style or self.s3_access_key):
            return None
        import boto3  # the s3 extra; only where a location names S3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.s3_endpoint, region_name=self.s3_region,
            aws_access_key_id=self.s3_access_key, aws_secret_access_key=self.s3_secret_key,
            config=Config(s3={"addressing_style": "path"}) if self.s3_path_style else None)


_access = StoreAccess()


def use_access(access: StoreAccess) -> None:
    """Reach stores in this process as ``access`` says (the session's, handed down by the
    sink to its workers and tasks)."""
    global _access
    _access = access


def current_access() -> StoreAccess:
    """How this process reaches stores (:func:`use_access`), to hand on to another process."""
    return _access


def open_store(uri: str, *, s3_client=None) -> Store:
    """The store at ``uri``: a path or ``file:`` (:class:`LocalStore`); ``webhdfs://host:port``
    or ``hdfs://namenode`` (:class:`WebHdfsStore`, see :data:`ENV_WEBHDFS`); ``s3://`` or
    ``s3a://bucket/prefix`` (:class:`S3Store`). A ``ValueError`` names any other scheme.
    Remote stores are made once per process, URI and access (a client costs ~0.1 s)."""
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.lower()
    if schemes.is_local_scheme(scheme):
        return LocalStore(parsed.path if scheme else uri)
    if schemes.is_store_scheme(scheme) and s3_client is None:
        return _remote_store(uri, _access)
    return _open_remote(uri, _access, s3_client)


@functools.lru_cache(maxsize=32)
def _remote_store(uri: str, access: StoreAccess) -> Store:
    return _open_remote(uri, access, None)


def _open_remote(uri: str, access: StoreAccess, s3_client) -> Store:
    parsed = urllib.parse.urlsplit(uri)
    kind = schemes.kind_of(parsed.scheme)
    # Each remote store's module is imported when a location names it: Spark's one-shot workers
    # of a local WAL load neither boto3 nor an HTTP client (tests/unit/test_architecture.py).
    if kind == schemes.WEBHDFS:
        from .webhdfs import WebHdfsStore
        return WebHdfsStore(f"http://{parsed.netloc}", parsed.path or "/")
    if kind == schemes.HDFS:
        from .webhdfs import WebHdfsStore
        return WebHdfsStore(access.webhdfs_base(parsed.netloc, parsed.hostname),
                            parsed.path or "/")
    if kind == schemes.S3:
        from .s3 import S3Store
        return S3Store(parsed.netloc, parsed.path, client=s3_client or access.s3_client())
    supported = ", ".join(f"{scheme}:" for scheme in schemes.SCHEMES)
    raise ValueError(f"{uri}: no store for the scheme {parsed.scheme.lower()!r} (supported: a "
                     f"local path, {supported})")
