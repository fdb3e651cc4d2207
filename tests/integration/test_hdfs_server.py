"""scripts/hdfs: a real HDFS (Hadoop MiniDFSCluster) started through the script, used over
WebHDFS and by a Spark stream whose checkpoint is on it.

One server for the module, on free ports in a temp dir, stopped with ``--purge`` at the end.
The tests run in file order: the last one stops the server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.helpers.node import HDFS, hdfs_started, load_script_module
from wal.checkpoint import SparkCheckpoint
from wal.stores import open_store

pytestmark = [pytest.mark.integration]

hn = load_script_module("hdfs_node")
run_cli = HDFS.run
server_pids = HDFS.pids  # MiniDFSClusterManager JVMs whose command line mentions the dir


class Hdfs:
    def __init__(self, node_dir: Path, port: int, http_port: int,
                 start: subprocess.CompletedProcess):
        self.node_dir, self.port, self.http_port, self.start = node_dir, port, http_port, start
        self.uri = f"hdfs://127.0.0.1:{port}"
        self.webhdfs = f"http://127.0.0.1:{http_port}/webhdfs/v1"

    def url(self, path: str, op: str, **params) -> str:
        query = urllib.parse.urlencode({"op": op, "user.name": "tester", **params})
        return f"{self.webhdfs}{urllib.parse.quote(path)}?{query}"

    def call(self, method: str, path: str, op: str, **params) -> dict:
        req = urllib.request.Request(self.url(path, op, **params), method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else {}

    def create(self, path: str, data: bytes) -> str:
        """CREATE in two steps, as WebHDFS asks: the namenode answers 307 with the datanode's
        address (urllib does not follow a 307 for a PUT), the data goes there. Returns the
        datanode URL."""
        req = urllib.request.Request(self.url(path, "CREATE", overwrite="false"), method="PUT")
        with pytest.raises(urllib.error.HTTPError) as redirect:
            urllib.request.urlopen(req, timeout=30)
        assert redirect.value.code == 307, redirect.value
        location = redirect.value.headers["Location"]
        req = urllib.request.Request(location, data=data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 201
        return location

    def read(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url(path, "OPEN"), timeout=30) as resp:  # follows 307
            return resp.read()

    def exists(self, path: str) -> bool:
        try:
            self.call("GET", path, "GETFILESTATUS")
            return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def list(self, path: str) -> list[str]:
        statuses = self.call("GET", path, "LISTSTATUS")["FileStatuses"]["FileStatus"]
        return sorted(s["pathSuffix"] for s in statuses)


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("hdfs") / "server"
    with hdfs_started(node_dir) as (port, http_port, start):
        yield Hdfs(node_dir, port, http_port, start)


def test_start_prints_the_uris_and_binds_loopback_only(hdfs):
    assert hdfs.start.stdout == f"{hdfs.uri} {hdfs.webhdfs}\n"
    pids = server_pids(hdfs.node_dir)
    assert len(pids) == 1, pids
    state = json.loads((hdfs.node_dir / "hdfs.json").read_text())
    assert (state["pid"], state["port"], state["http_port"]) == (pids[0], hdfs.port,
                                                                 hdfs.http_port)
    assert int((hdfs.node_dir / "hdfs.pid").read_text()) == pids[0]
    listening = hn.listening_addresses(pids[0])
    assert f"127.0.0.1:{hdfs.port}" in listening and f"127.0.0.1:{hdfs.http_port}" in listening
    assert all(a.startswith("127.0.0.1:") for a in listening), listening
    assert sorted(state["listening"]) == sorted(listening)
    if shutil.which("ss"):  # the same, as `ss` sees it
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
        mine = [line.split()[3] for line in out.splitlines() if f"pid={pids[0]}," in line]
        assert mine and all(a.startswith("127.0.0.1:") for a in mine), mine


def test_webhdfs_create_read_rename_list(hdfs):
    base = f"/t-{uuid.uuid4().hex[:8]}"
    data = b"hello from test_hdfs_server\n" * 100

    datanode_url = hdfs.create(f"{base}/a.txt", data)
    assert urllib.parse.urlsplit(datanode_url).hostname == "127.0.0.1", datanode_url
    assert hdfs.read(f"{base}/a.txt") == data
    assert hdfs.list(base) == ["a.txt"]

    assert hdfs.call("PUT", f"{base}/a.txt", "RENAME", destination=f"{base}/b.txt") == {
        "boolean": True}
    assert hdfs.list(base) == ["b.txt"]
    assert not hdfs.exists(f"{base}/a.txt")
    assert hdfs.read(f"{base}/b.txt") == data
    assert hdfs.call("GET", f"{base}/b.txt", "GETFILESTATUS")["FileStatus"]["length"] == len(data)
    assert base.lstrip("/") in hdfs.list("/")


def test_second_start_reports_the_running_server_and_starts_nothing(hdfs):
    pids = server_pids(hdfs.node_dir)
    t0 = time.monotonic()
    again = run_cli("start", "--dir", hdfs.node_dir)  # ports come from the dir's state file
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{hdfs.uri} {hdfs.webhdfs}\n"
    assert "already running" in again.stderr and f"pid {pids[0]}" in again.stderr
    assert time.monotonic() - t0 < 15
    assert server_pids(hdfs.node_dir) == pids


def test_spark_stream_checkpoints_on_hdfs(hdfs, spark):
    cp = f"/cp-{uuid.uuid4().hex[:8]}"
    stream = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    query = (stream.writeStream.format("noop")
             .option("checkpointLocation", f"{hdfs.uri}{cp}")
             .trigger(processingTime="500 milliseconds").start())
    try:
        deadline = time.monotonic() + 120
        while True:
            progress = query.lastProgress
            if progress and progress["batchId"] >= 2:
                break
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"no batch 2 within 120 s: {query.status}"
            time.sleep(0.2)
    finally:
        query.stop()
    assert query.exception() is None
    assert hdfs.exists(f"{cp}/commits/0")
    assert {"0", "1", "2"} <= set(hdfs.list(f"{cp}/commits"))
    assert "metadata" in hdfs.list(cp)
    # What the sink will read there without a JVM (wal/checkpoint.py, wal/webhdfs.py).
    read = SparkCheckpoint(open_store(f"webhdfs://127.0.0.1:{hdfs.http_port}{cp}"))
    assert {0, 1, 2} <= set(read.committed_batches())
    assert read.query_id() == str(query.id) and read.written_by_spark()


def test_status_is_up_then_down_after_stop(hdfs):
    """Last in the file: it stops the module's server (the fixture then purges its dir)."""
    up = run_cli("status", "--dir", hdfs.node_dir)
    assert up.returncode == 0, up
    assert up.stdout.startswith("up:") and hdfs.uri in up.stdout
    as_json = json.loads(run_cli("status", "--dir", hdfs.node_dir, "--json").stdout)
    assert (as_json["state"], as_json["live_datanodes"]) == ("up", 1)

    pids = server_pids(hdfs.node_dir)
    stop = run_cli("stop", "--dir", hdfs.node_dir)
    assert stop.returncode == 0, stop.stderr
    assert f"stopped pid {pids[0]}" in stop.stderr
    assert server_pids(hdfs.node_dir) == []
    assert not (hdfs.node_dir / "hdfs.pid").exists()
    assert not hn.port_in_use(hdfs.port) and not hn.port_in_use(hdfs.http_port)

    down = run_cli("status", "--dir", hdfs.node_dir)
    assert down.returncode == 1, down
    assert down.stdout.startswith("down:")
    assert (hdfs.node_dir / "data").is_dir()  # a stop without --purge keeps the file system
