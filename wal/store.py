"""Where a WAL's immutable files can live: a local (or mounted) folder, HDFS, or an S3 bucket,
behind one small interface whose key operation is **publish once**.

Every file a task or a commit writes (a segment, a seal) is published under a name no other
writer may take, complete or not at all:

* ``create(key, data)`` puts ``data`` under ``key`` only if nothing is there yet, atomically:
  ``True`` if this call published it, ``False`` if the key was already taken (what is there is
  left untouched). Readers never see a part of an object.
* ``read``, ``list`` (every key under a prefix, in key order) and ``delete``.

How each store does it:

* :class:`LocalStore` (a path, ``file:``): a temp file, fsynced, then ``link(tmp, key)``,
  which fails if ``key`` exists; the folder fsynced.
* :class:`WebHdfsStore` (HDFS over its REST API): ``CREATE`` of a temp file, then ``RENAME``
  to ``key``, which the namenode does atomically and refuses if ``key`` exists.
* :class:`S3Store` (``s3://``, ``s3a://``): one ``PutObject`` with ``If-None-Match: *`` (HTTP
  412 if the key exists); S3 makes an object visible whole.

No store relies on listing being atomic or consistent with a rename in flight: a key is
trusted once ``create`` returned ``True`` for it or ``read`` found it. Nothing here is
specific to the WAL's layout (``wal/FORMAT.md``): keys are ``/``-separated relative paths.

Credentials never go through this module's arguments as text a log could show: S3 takes
them from boto3's usual chain (environment, profiles, instance roles), HDFS runs as the user
named by ``HADOOP_USER_NAME`` (or the process's), as Hadoop's own clients do.
"""

from __future__ import annotations

import getpass
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Protocol

try:                        # the s3 extra: needed only where a WAL lives on S3
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:
    boto3 = None
    BotoCoreError = ClientError = type("Unavailable", (Exception,), {})

from .errors import StoreUnavailable
from .files import fsync_dir, make_private_dirs


class Store(Protocol):
    """Immutable objects under ``/``-separated keys; see the module docstring."""

    uri: str

    def create(self, key: str, data: bytes) -> bool: ...

    def read(self, key: str) -> bytes | None: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad store key {key!r}: a relative path without '.', '..' or '//'")
    return key


class LocalStore:
    """A folder on this machine (or a mount every node sees at the same path)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.uri = "file:" + self.root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *_check_key(key).split("/"))

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


class WebHdfsStore:
    """A folder on HDFS, through the namenode's REST API (WebHDFS): no JVM and no native
    library in the process, which is what Spark's Python workers and the offline tool have.

    ``base`` is ``http://<namenode>:<http port>``, ``root`` an absolute HDFS path."""

    def __init__(self, base: str, root: str, user: str | None = None, timeout_s: float = 30.0):
        self.base, self.root = base.rstrip("/"), "/" + root.strip("/")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        self.timeout_s = timeout_s
        host = urllib.parse.urlsplit(self.base).netloc
        self.uri = f"webhdfs://{host}{self.root}"

    def _url(self, path: str, op: str, **params: str) -> str:
        query = urllib.parse.urlencode({"op": op, "user.name": self.user, **params})
        return f"{self.base}/webhdfs/v1{urllib.parse.quote(path)}?{query}"

    def _call(self, method: str, path: str, op: str, data: bytes | None = None,
              **params: str) -> tuple[int, bytes]:
        """``(status, body)`` of one WebHDFS call. A network failure is
        :class:`~wal.errors.StoreUnavailable`."""
        return self._send(urllib.request.Request(self._url(path, op, **params), data=data,
                                                 method=method), f"{op} {path}")

    def _send(self, request: urllib.request.Request, what: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise StoreUnavailable(self.uri, f"WebHDFS {what}: {exc}") from None

    def _create_file(self, path: str, data: bytes) -> None:
        """WebHDFS's two steps: the namenode answers 307 with a datanode's URL, which takes
        the bytes."""
        ask = urllib.request.Request(self._url(path, "CREATE", overwrite="false"), method="PUT")
        try:
            _NO_REDIRECT.open(ask, timeout=self.timeout_s)
            raise StoreUnavailable(self.uri, f"WebHDFS CREATE {path}: no redirect to a datanode")
        except urllib.error.HTTPError as exc:
            if exc.code != 307:
                raise StoreUnavailable(self.uri, f"WebHDFS CREATE {path}: HTTP {exc.code} "
                                       f"{exc.read()[:200]!r}") from None
            location = exc.headers["Location"]
        except (urllib.error.URLError, OSError) as exc:
            raise StoreUnavailable(self.uri, f"WebHDFS CREATE {path}: {exc}") from None
        status, body = self._send(urllib.request.Request(location, data=data, method="PUT"),
                                  f"CREATE {path} (datanode)")
        if status != 201:
            raise StoreUnavailable(self.uri, f"WebHDFS CREATE {path}: HTTP {status} "
                                   f"{body[:200]!r}")

    def _path(self, key: str) -> str:
        return f"{self.root}/{_check_key(key)}"

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        folder, name = path.rsplit("/", 1)
        tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        self._create_file(tmp, data)
        status, body = self._call("PUT", tmp, "RENAME", destination=path)
        renamed = status == 200 and json.loads(body).get("boolean") is True
        if not renamed:
            self._call("DELETE", tmp, "DELETE")
            if status != 200:
                raise StoreUnavailable(self.uri, f"WebHDFS RENAME to {path}: HTTP {status} "
                                      f"{body[:200]!r}")
        return renamed

    def read(self, key: str) -> bytes | None:
        status, body = self._call("GET", self._path(key), "OPEN")
        if status == 404:
            return None
        if status != 200:
            raise StoreUnavailable(self.uri, f"WebHDFS OPEN {key}: HTTP {status} {body[:200]!r}")
        return body

    def list(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        self._walk(self._path(prefix) if prefix else self.root, out)
        return sorted(out)

    def _walk(self, path: str, out: list[str]) -> None:
        status, body = self._call("GET", path, "LISTSTATUS")
        if status == 404:
            return
        if status != 200:
            raise StoreUnavailable(self.uri, f"WebHDFS LISTSTATUS {path}: HTTP {status}")
        for entry in json.loads(body)["FileStatuses"]["FileStatus"]:
            child = f"{path}/{entry['pathSuffix']}" if entry["pathSuffix"] else path
            if entry["type"] == "DIRECTORY":
                self._walk(child, out)
            elif not entry["pathSuffix"].endswith(".tmp"):
                out.append(child[len(self.root) + 1:])

    def delete(self, key: str) -> None:
        status, body = self._call("DELETE", self._path(key), "DELETE")
        if status != 200:
            raise StoreUnavailable(self.uri, f"WebHDFS DELETE {key}: HTTP {status}")


class S3Store:
    """A prefix in an S3 bucket (or another S3 API server), through boto3 (the ``s3`` extra).

    ``client``: a boto3 S3 client; by default one from boto3's usual configuration (the
    ``AWS_*`` environment, ``~/.aws``, an instance role; ``AWS_ENDPOINT_URL`` for another
    server)."""

    def __init__(self, bucket: str, prefix: str = "", client=None):
        if boto3 is None:
            raise StoreUnavailable(f"s3://{bucket}", "boto3 is not installed: pip install "
                                   "'cassandra-wal-sink[s3]'")
        self.client = client if client is not None else boto3.client("s3")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{_check_key(key)}" if self.prefix else _check_key(key)

    def _failed(self, what: str, exc: Exception) -> StoreUnavailable:
        if isinstance(exc, ClientError):
            detail = exc.response.get("Error", {}).get("Code") or str(exc)
        else:
            detail = f"{type(exc).__name__}: {exc}"
        return StoreUnavailable(self.uri, f"{what}: {detail}")

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                   IfNoneMatch="*")
            return True
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return False        # PreconditionFailed: the key is taken
            raise self._failed(f"PutObject {key}", exc) from None
        except BotoCoreError as exc:
            raise self._failed(f"PutObject {key}", exc) from None

    def read(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._failed(f"GetObject {key}", exc) from None
        except BotoCoreError as exc:
            raise self._failed(f"GetObject {key}", exc) from None

    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix) if prefix else self.prefix
        start = f"{full}/" if full else ""
        out = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=start)
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(obj["Key"][len(self.prefix) + 1:] if self.prefix else obj["Key"])
        except (ClientError, BotoCoreError) as exc:
            raise self._failed(f"ListObjectsV2 {prefix or '/'}", exc) from None
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._failed(f"DeleteObject {key}", exc) from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None         # the 307 of a CREATE is read, not followed (it would drop the body)


_NO_REDIRECT = urllib.request.build_opener(_NoRedirect)
