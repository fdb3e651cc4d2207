"""scripts/s3: a real S3 API server (moto_server) for the suite, and Spark's s3a on it.

The module's server is started through the command line in a temp dir on a free port and
stopped with --purge at the end; the start/stop/status test runs a second server of its own.
The Spark test runs its own Python process (its session needs the s3a jars, which the
suite's shared session does not have).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.node import ServerScript, java_home_env, load_script_module
from tests.helpers.processes import reap_group
from wal.checkpoint import SparkCheckpoint
from wal.s3 import S3Store

pytestmark = [pytest.mark.integration]

BUCKET = "wal-bucket"

s3s = load_script_module("s3_server")

try:
    s3s.find_moto_server()
except s3s.S3ServerError as e:  # moto[server] is a test dependency
    pytest.skip(str(e), allow_module_level=True)
boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError  # noqa: E402  (comes with boto3)

S3 = ServerScript("s3", "moto_server", by_cwd=True, timeout=120)
run_cli = S3.run
moto_pids = S3.pids  # moto_server processes working in the dir


@dataclass
class Server:
    endpoint: str
    port: int
    server_dir: Path

    def client(self):
        return boto3.client("s3", **s3s.boto3_kwargs(self.endpoint))


def _buckets(*names: str) -> list[str]:
    return [arg for name in names for arg in ("--bucket", name)]


def _start(server_dir: Path, port: int, *buckets: str):
    return run_cli("start", "--port", port, "--dir", server_dir, *_buckets(*buckets))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server_dir = (tmp_path_factory.mktemp("s3") / "server").resolve()
    port = s3s.free_port()
    with S3.started(server_dir, "--port", port, *_buckets(BUCKET)) as result:
        endpoint = result.stdout.strip().splitlines()[-1]
        assert endpoint == f"http://127.0.0.1:{port}"
        yield Server(endpoint, port, server_dir)


def test_put_get_list(s3):
    c = s3.client()
    assert BUCKET in [b["Name"] for b in c.list_buckets()["Buckets"]]
    c.put_object(Bucket=BUCKET, Key="dir/a.bin", Body=b"alpha")
    c.put_object(Bucket=BUCKET, Key="dir/b.bin", Body=b"beta" * 1000)
    assert c.get_object(Bucket=BUCKET, Key="dir/a.bin")["Body"].read() == b"alpha"
    listed = c.list_objects_v2(Bucket=BUCKET, Prefix="dir/")["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {"dir/a.bin": 5, "dir/b.bin": 4000}

    # pyarrow's S3 filesystem sees the same objects (the sink reads files through pyarrow.fs).
    from pyarrow import fs as pafs

    s3fs = pafs.S3FileSystem(**s3s.pyarrow_kwargs(s3.endpoint))
    infos = s3fs.get_file_info(pafs.FileSelector(f"{BUCKET}/dir"))
    assert {i.path: i.size for i in infos} == {f"{BUCKET}/dir/a.bin": 5,
                                               f"{BUCKET}/dir/b.bin": 4000}
    with s3fs.open_input_stream(f"{BUCKET}/dir/a.bin") as fh:
        assert fh.read() == b"alpha"


def test_conditional_create_refuses_an_existing_key(s3):
    """put_object(IfNoneMatch="*") is a create-only publish: the second one gets HTTP 412
    and the first object stays (what a WAL seal relies on)."""
    c = s3.client()
    key = "seal/segment-0"
    c.put_object(Bucket=BUCKET, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as err:
        c.put_object(Bucket=BUCKET, Key=key, Body=b"second", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert c.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"first"
    # A new key is still created under the same condition.
    c.put_object(Bucket=BUCKET, Key="seal/segment-1", Body=b"next", IfNoneMatch="*")
    assert c.get_object(Bucket=BUCKET, Key="seal/segment-1")["Body"].read() == b"next"


def test_start_status_stop(tmp_path):
    server_dir = (tmp_path / "own").resolve()
    port = s3s.free_port()
    try:
        assert run_cli("status", "--dir", server_dir, "--port", port).returncode == 1

        first = _start(server_dir, port, "one-bucket")
        assert first.returncode == 0, first
        assert first.stdout.strip().splitlines()[-1] == f"http://127.0.0.1:{port}"
        state = json.loads((server_dir / "server.json").read_text())
        pids = moto_pids(server_dir)
        assert pids == [state["pid"]] and state["port"] == port
        assert int((server_dir / "moto.pid").read_text()) == state["pid"]

        up = run_cli("status", "--dir", server_dir)  # the port comes from the state file
        assert up.returncode == 0, up
        assert up.stdout.startswith("up:") and "one-bucket" in up.stdout
        st = json.loads(run_cli("status", "--dir", server_dir, "--json").stdout)
        assert st["state"] == "up" and st["pid"] == state["pid"]
        assert st["buckets"] == ["one-bucket"]

        second = _start(server_dir, port, "one-bucket", "two-bucket")
        assert second.returncode == 0, second
        assert "already running" in second.stderr
        assert second.stdout.strip().splitlines()[-1] == f"http://127.0.0.1:{port}"
        assert moto_pids(server_dir) == pids  # no second server
        assert sorted(json.loads(run_cli("status", "--dir", server_dir, "--json").stdout)
                      ["buckets"]) == ["one-bucket", "two-bucket"]

        other_port = _start(server_dir, s3s.free_port())
        assert other_port.returncode == 1 and "already running on port" in other_port.stderr

        bad = run_cli("start", "--dir", tmp_path / "bad", "--port", s3s.free_port(),
                      "--bucket", "Bad_Name")
        assert bad.returncode == 1 and "invalid bucket name" in bad.stderr
        assert moto_pids((tmp_path / "bad").resolve()) == []

        stopped = run_cli("stop", "--dir", server_dir)
        assert stopped.returncode == 0 and f"stopped pid {pids[0]}" in stopped.stderr
        assert moto_pids(server_dir) == []
        down = run_cli("status", "--dir", server_dir)
        assert down.returncode == 1 and down.stdout.startswith("down:")
        assert server_dir.exists()  # without --purge the dir stays
    finally:
        S3.stop_purged(server_dir)


def test_start_refuses_a_port_in_use(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = _start(tmp_path / "busy", port)
    assert result.returncode == 1 and f"port {port} is in use" in result.stderr
    assert moto_pids((tmp_path / "busy").resolve()) == []


# --------------------------------------------------------------------------------------------
# Spark: a checkpoint on s3a://


def test_s3a_jars_do_not_clash_with_pyspark():
    result = run_cli("jars", timeout=600)  # fetched once (~660 MB from Maven Central)
    assert result.returncode == 0, result
    jars = [Path(j) for j in result.stdout.strip().splitlines()[-1].split(",")]
    names = {j.name for j in jars}
    assert "hadoop-aws-3.5.0.jar" in names
    assert any(n.startswith("bundle-2.") for n in names)  # the AWS SDK v2
    assert all(j.is_absolute() and j.is_file() for j in jars)
    shipped = {s3s.artifact_name(p.name) for p in s3s.pyspark_jars_dir().glob("*.jar")}
    assert not {s3s.artifact_name(n) for n in names} & shipped


SPARK_PROGRAM = textwrap.dedent("""\
    import json, sys, time
    from pyspark.sql import SparkSession

    conf, checkpoint, want = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    builder = (SparkSession.builder.master("local[2]").appName("s3a-checkpoint-test")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    t0 = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.monotonic() - t0
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    try:
        deadline = time.monotonic() + 240
        batches = []
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise query.exception()
            batches = sorted({p["batchId"] for p in query.recentProgress})
            if len(batches) >= want:
                break
            time.sleep(0.2)
    finally:
        query.stop()
    spark.stop()
    print(json.dumps({"batches": batches, "session_s": round(session_s, 1),
                      "total_s": round(time.monotonic() - t0, 1)}))
""")


def test_spark_streaming_checkpoint_on_s3a(s3, tmp_path):
    jars = run_cli("jars", timeout=600)
    assert jars.returncode == 0, jars
    conf = s3s.spark_conf(s3.endpoint, jars.stdout.strip().splitlines()[-1].split(","))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if not env.get("JAVA_HOME"):
        env.update(java_home_env())
    program = tmp_path / "s3a_stream.py"
    program.write_text(SPARK_PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, str(program), json.dumps(conf), f"s3a://{BUCKET}/cp", "3"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and its Spark JVM (own session)
        out, err = proc.communicate()
        pytest.fail(f"the Spark program did not finish in 420 s\n{err[-4000:]}")
    finally:
        reap_group(proc.pid)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-6000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["batches"]) >= 3, result

    keys = [o["Key"] for o in s3.client().list_objects_v2(
        Bucket=BUCKET, Prefix="cp/")["Contents"]]
    assert "cp/commits/0" in keys, keys
    assert "cp/offsets/0" in keys and "cp/metadata" in keys, keys
    # What the sink will read there without a JVM (wal/checkpoint.py, wal/s3.py).
    read = SparkCheckpoint(S3Store(BUCKET, "cp", client=s3.client()))
    assert set(result["batches"]) <= set(read.committed_batches()), result
    assert read.query_id() and read.written_by_spark()

