"""A :class:`~wal.store.Store` on S3 (or another S3 API server) through boto3, the ``s3`` extra:
``create`` is one ``PutObject`` with ``If-None-Match: *`` (HTTP 412 if the key exists), and S3
makes an object visible whole.
"""

from __future__ import annotations

try:                        # the s3 extra: needed only where a WAL lives on S3
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:
    boto3 = None
    BotoCoreError = ClientError = type("Unavailable", (Exception,), {})

from .errors import StoreUnavailable
from .store import check_key


#: Keys in one ``DeleteObjects`` request: S3's limit.
DELETE_BATCH = 1000


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
        return f"{self.prefix}/{check_key(key)}" if self.prefix else check_key(key)

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

    def delete_folder(self, prefix: str, recursive: bool = False) -> None:
        """S3 has no folders: nothing to remove but, ``recursive``, the keys under it."""
        if recursive:
            self.delete_many(self.list(prefix))

    def delete_many(self, keys: list[str]) -> None:
        """One ``DeleteObjects`` per :data:`DELETE_BATCH` keys. A key the reply lists under
        ``Errors`` stays (the next try deletes it); the first such error is raised once every
        request was made."""
        failed: list[str] = []
        first: StoreUnavailable | None = None
        for start in range(0, len(keys), DELETE_BATCH):
            chunk = keys[start:start + DELETE_BATCH]
            try:
                reply = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in chunk], "Quiet": True})
            except (ClientError, BotoCoreError) as exc:
                failed += chunk
                first = first or self._failed(f"DeleteObjects {chunk[0]} (+{len(chunk) - 1})",
                                              exc)
                continue
            for error in reply.get("Errors", []):
                failed.append(error.get("Key", "?"))
                first = first or StoreUnavailable(
                    self.uri, f"DeleteObjects {error.get('Key')}: {error.get('Code')}")
        if first is not None:
            raise StoreUnavailable(self.uri, f"{len(failed)} of {len(keys)} keys not deleted "
                                             f"(kept for the next try); {first.detail}")

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._failed(f"DeleteObject {key}", exc) from None
