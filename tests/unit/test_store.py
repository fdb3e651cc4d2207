"""wal/store.py on the local filesystem: the store contract (tests/helpers/store_contract.py),
and what only a folder has (fsynced, private, no temp file left)."""

from __future__ import annotations

import os
import stat

import pytest

from recovery.errors import is_transient
from tests.helpers.store_contract import StoreContract
from wal.errors import StoreUnavailable
from wal.store import LocalStore

pytestmark = pytest.mark.unit


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalStore(str(tmp_path / "wal"))


def test_local_objects_are_private_and_no_temp_file_stays(tmp_path):
    store = LocalStore(str(tmp_path / "wal"))
    store.create("seals/1.seal", b"s")
    store.create("seals/1.seal", b"t")
    assert os.listdir(tmp_path / "wal" / "seals") == ["1.seal"]
    assert stat.S_IMODE(os.stat(tmp_path / "wal" / "seals").st_mode) == 0o700


def test_a_local_create_fsyncs_the_object_and_its_folder(tmp_path, monkeypatch):
    import wal.store as store_module

    synced_files, synced_dirs = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: (synced_files.append(fd),
                                                              real_fsync(fd)))
    monkeypatch.setattr(store_module, "fsync_dir", synced_dirs.append)
    LocalStore(str(tmp_path / "wal")).create("a/b", b"x")
    assert synced_files and synced_dirs == [str(tmp_path / "wal" / "a")]


def test_a_store_that_cannot_answer_is_transient():
    assert is_transient(StoreUnavailable("s3://b/p", "EndpointConnectionError"))


def test_a_spark_checkpoint_is_read_through_a_store(tmp_path):
    """What a checkpoint Spark wrote looks like on a local filesystem: commits with checksum
    siblings (``.N.crc``), offsets, a metadata file whose first line holds the query id."""
    from wal.checkpoint import SparkCheckpoint

    cp = tmp_path / "cp"
    (cp / "commits").mkdir(parents=True)
    (cp / "offsets").mkdir()
    for n in (0, 1, 2, 10):
        (cp / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        (cp / "commits" / f".{n}.crc").write_bytes(b"crc")
    (cp / "offsets" / "11").write_text("v1\n")
    checkpoint = SparkCheckpoint(LocalStore(str(cp)))
    (cp / "metadata").write_text('{"id":"1c0a7c3e-8e43-4d5e-9a0e-2f1d2c3b4a59"}\n')
    assert checkpoint.committed_batches() == [0, 1, 2, 10]
    assert checkpoint.is_committed(10) and not checkpoint.is_committed(11)
    assert checkpoint.query_id() == "1c0a7c3e-8e43-4d5e-9a0e-2f1d2c3b4a59"
    assert checkpoint.written_by_spark()
    empty = SparkCheckpoint(LocalStore(str(tmp_path / "nothing")))
    assert (empty.committed_batches(), empty.query_id(), empty.written_by_spark()) == \
        ([], None, False)


def test_a_store_is_opened_by_its_uri(tmp_path, monkeypatch):
    from wal.s3 import S3Store
    from wal.stores import ENV_WEBHDFS, open_store
    from wal.webhdfs import WebHdfsStore

    assert open_store(str(tmp_path)).uri == f"file:{tmp_path}"
    assert open_store(f"file:{tmp_path}/wal").uri == f"file:{tmp_path}/wal"
    web = open_store("webhdfs://127.0.0.1:29870/data/wal")
    assert isinstance(web, WebHdfsStore) and (web.base, web.root) == \
        ("http://127.0.0.1:29870", "/data/wal")
    monkeypatch.delenv(ENV_WEBHDFS, raising=False)
    assert open_store("hdfs://nn.example:8020/cp").base == "http://nn.example:9870"
    monkeypatch.setenv(ENV_WEBHDFS, "http://127.0.0.1:29870")
    assert open_store("hdfs://127.0.0.1:29000/cp").base == "http://127.0.0.1:29870"
    s3 = open_store("s3a://wal-bucket/streams/orders", s3_client=object())
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("wal-bucket", "streams/orders")
    with pytest.raises(ValueError, match="no store for the scheme 'gs'"):
        open_store("gs://bucket/cp")


class FakeS3Client:
    """Just enough of boto3's S3 client for ``S3Store.delete_many``: DeleteObjects requests
    recorded; the keys in ``refuse`` come back under ``Errors`` (they stay)."""

    def __init__(self, keys, refuse=()):
        self.keys, self.refuse, self.requests = set(keys), set(refuse), []

    def delete_objects(self, Bucket, Delete):
        names = [o["Key"] for o in Delete["Objects"]]
        assert len(names) <= 1000 and Delete["Quiet"] is True
        self.requests.append(names)
        self.keys -= set(names) - self.refuse
        return {"Errors": [{"Key": k, "Code": "AccessDenied", "Message": "no"}
                           for k in names if k in self.refuse]}


def test_s3_deletes_a_thousand_keys_a_request_and_keeps_those_it_refused():
    """Issue 32: one DeleteObjects per 1,000 keys (was one DeleteObject a key); a key the reply
    lists under Errors stays for the next try, and the call raises StoreUnavailable
    (transient) once every request was made."""
    from wal.s3 import S3Store

    keys = [f"segments/00000000000000000003/{i:05d}-0-x.seg" for i in range(2500)]
    client = FakeS3Client([f"wal/{k}" for k in keys])
    S3Store("bucket", "wal", client=client).delete_many(keys)
    assert [len(r) for r in client.requests] == [1000, 1000, 500]
    assert client.keys == set()

    client = FakeS3Client([f"wal/{k}" for k in keys], refuse={f"wal/{keys[10]}", f"wal/{keys[2100]}"})
    with pytest.raises(StoreUnavailable) as err:
        S3Store("bucket", "wal", client=client).delete_many(keys)
    assert is_transient(err.value)
    assert "2 of 2500 keys not deleted" in str(err.value) and "AccessDenied" in str(err.value)
    assert len(client.requests) == 3                    # every request made
    assert client.keys == {f"wal/{keys[10]}", f"wal/{keys[2100]}"}
