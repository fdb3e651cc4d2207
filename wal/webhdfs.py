"""A :class:`~wal.store.Store` on HDFS through the namenode's REST API (WebHDFS): no JVM and no
native library in the process, which is what Spark's Python workers and the offline tool have.
``create`` writes a temp file, then renames it onto the key, which the namenode does atomically
and refuses if the key exists.
"""

from __future__ import annotations

import getpass
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid

from .errors import StoreUnavailable
from .store import check_key, delete_each


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
        return f"{self.root}/{check_key(key)}"

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
        status, _ = self._call("DELETE", self._path(key), "DELETE")
        if status != 200:
            raise StoreUnavailable(self.uri, f"WebHDFS DELETE {key}: HTTP {status}")

    def delete_many(self, keys: list[str]) -> None:
        """WebHDFS deletes one path a request: one ``DELETE`` a key (a folder that goes whole
        is one request: :meth:`delete_folder`)."""
        delete_each(self, keys)

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        if recursive:       # one request, whatever the folder holds
            status, _ = self._call("DELETE", self._path(prefix), "DELETE", recursive="true")
            if status != 200:
                raise StoreUnavailable(self.uri, f"WebHDFS DELETE {prefix}/ (recursive): "
                                                 f"HTTP {status}")
            return
        # recursive=false: the namenode refuses a folder that is not empty (a key published
        # meanwhile stays); either way nothing to raise.
        status, _ = self._call("DELETE", self._path(prefix), "DELETE", recursive="false")
        if status not in (200, 403, 404):
            raise StoreUnavailable(self.uri, f"WebHDFS DELETE {prefix}/: HTTP {status}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None         # the 307 of a CREATE is read, not followed (it would drop the body)


_NO_REDIRECT = urllib.request.build_opener(_NoRedirect)
