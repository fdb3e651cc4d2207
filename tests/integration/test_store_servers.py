"""wal/store.py against real servers, started by the project's own scripts: HDFS
(``scripts/hdfs``, a MiniDFSCluster, through WebHDFS) and S3 (``scripts/s3``, moto). Each runs
the store contract (tests/helpers/store_contract.py), publish-once under a race included; and a
store whose server is gone fails as StoreUnavailable, which the sink treats as transient."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.store_contract import StoreContract, assert_unavailable
from wal.s3 import S3Store
from wal.webhdfs import WebHdfsStore

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def script(name: str, *args, timeout: float = 300) -> str:
    """Run ``scripts/<name> ...``; its last stdout line (a start prints where it listens)."""
    done = subprocess.run([str(REPO / "scripts" / name), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"scripts/{name} {' '.join(map(str, args))}:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


@pytest.fixture(scope="module")
def hdfs(hdfs_server):
    return f"http://{hdfs_server[1]}"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import boto3

    folder = tmp_path_factory.mktemp("s3")
    port = free_port()
    endpoint = script("s3", "start", "--port", port, "--dir", folder, "--bucket", "wal-bucket",
                      timeout=120)
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    yield client
    script("s3", "stop", "--port", port, "--dir", folder, "--purge", timeout=120)


class TestWebHdfsStore(StoreContract):
    @pytest.fixture
    def store(self, hdfs):
        return WebHdfsStore(hdfs, f"/wal-{uuid.uuid4().hex[:8]}", user="tester")


class TestS3Store(StoreContract):
    @pytest.fixture
    def store(self, s3):
        return S3Store("wal-bucket", f"wal-{uuid.uuid4().hex[:8]}", client=s3)


def test_a_store_whose_server_is_gone_fails_as_unavailable():
    import boto3
    from botocore.config import Config

    port = free_port()                  # nothing listens there
    assert_unavailable(WebHdfsStore(f"http://127.0.0.1:{port}", "/wal", timeout_s=5))
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}, connect_timeout=2))
    assert_unavailable(S3Store("wal-bucket", "wal", client=client))


def test_s3_deletes_many_keys_in_a_request_per_thousand_on_the_server(s3):
    """Issue 32: 1,200 keys go in 2 DeleteObjects requests (were 1,200 DeleteObject), and a
    recursive delete_folder is one listing and those requests; what is beside stays."""
    store = S3Store("wal-bucket", f"wal-{uuid.uuid4().hex[:8]}", client=s3)
    keys = [f"segments/00000000000000000005/{i:05d}-0-x.seg" for i in range(1200)]
    for key in keys + ["segments/00000000000000000006/a.seg"]:
        store.create(key, b"x")
    sent = []

    def count(request, **_):
        sent.append((request.method, request.url.split("?", 1)[-1]))

    s3.meta.events.register("before-send.s3", count)
    try:
        store.delete_many(keys[:1100])
        assert [m for m, _ in sent] == ["POST", "POST"] and all("delete" in q for _, q in sent)
        assert store.list("segments/00000000000000000005") == keys[1100:]
        sent.clear()
        store.delete_folder("segments/00000000000000000005", recursive=True)
        assert len(sent) == 2           # the listing, one DeleteObjects
    finally:
        s3.meta.events.unregister("before-send.s3", count)
    assert store.list("segments") == ["segments/00000000000000000006/a.seg"]
