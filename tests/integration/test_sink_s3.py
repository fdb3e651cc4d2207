"""End to end on S3 (issue 19): a stream whose checkpoint, and so its WAL, is on ``s3a://``,
against a real S3 API server (moto, started by ``scripts/s3``), real Spark (its own process:
the session needs the s3a jars) and the real Cassandra node.

The sink reaches S3 where Spark does, from the session's ``fs.s3a.*`` settings (endpoint,
region, path-style access, keys), never from the command line. Between two runs of the query
the driver's working copy of the WAL is deleted ("a driver on another host"): the second run
rebuilds it from S3. Then the typed acceptance (``test_sink_types.py``: every supported type,
nulls included) through a second stream checkpointed on S3. Under ``--full-matrix``, an
outage: Cassandra stopped mid-stream (a node of the module's own), the backlog on S3 shown by
``cassandra-wal inspect`` on the URI, drained once the node is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pyarrow as pa
import pytest
import test_sink_types as types
from sinkutil import (assert_rows_equal, cassandra_wal, create_table, read_table, rows_by_key,
                      write_parquet_files)

from tests.helpers.node import RestartableNode, ServerScript, java_home_env, load_script_module
from tests.helpers.processes import reap_group
from wal.s3 import S3Store
from wal.seal import decode_seal

pytestmark = pytest.mark.integration

BUCKET = "wal-sink"
s3s = load_script_module("s3_server")
try:
    s3s.find_moto_server()
except s3s.S3ServerError as e:  # moto[server] is a test dependency
    pytest.skip(str(e), allow_module_level=True)
boto3 = pytest.importorskip("boto3")

S3 = ServerScript("s3", "moto_server", by_cwd=True, timeout=120)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests", "integration")]
    from tests.helpers.spark_session import local_builder
    import sinks
    from sinks.driver.registry import registries
    from sinkutil import write_json_files
    from wal.checkpoint import open_checkpoint
    from wal.remote import working_copy_of

    repo, conf, cp, host, port, keyspace, src, types_src = sys.argv[1:9]
    builder = local_builder("s3-sink")
    for k, v in json.loads(conf).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    sinks.register(spark)

    def events(k):
        return [{"id": k * 10 + i, "tag": k, "name": f"e{k}-{i}"} for i in range(5)]

    def run(through):
        stream = (spark.readStream.schema("id INT, tag INT, name STRING")
                  .option("maxFilesPerTrigger", 1).json(src))
        query = (stream.writeStream.format("cassandra_wal")
                 .option("keyspace", keyspace).option("table", "events")
                 .option("checkpointLocation", cp)
                 .option("spark.cassandra.connection.host", host)
                 .option("spark.cassandra.connection.port", port)
                 .trigger(processingTime="500 milliseconds").start())
        deadline = time.monotonic() + 240
        while (open_checkpoint(cp).committed_batches() or [-1])[-1] < through:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"batch {through} not committed"
            time.sleep(0.3)
        sinks.wait_flushed(query, timeout=120)
        query.stop()
        for registry in registries:            # the run's last drain and log close
            for flusher in registry.flushers_of(str(query.runId)):
                assert flusher.stopped.wait(60)

    write_json_files(src, [events(k) for k in range(3)])
    run(2)
    wal_uri = cp + "/cassandra_wal"
    copy = working_copy_of(wal_uri)
    assert os.path.isdir(os.path.join(copy, "log")), copy
    import shutil
    shutil.rmtree(copy)                         # a driver on another host
    write_json_files(src, [events(k) for k in range(3, 5)], first_index=3)
    run(4)

    # The typed acceptance (test_sink_types.py): every supported type through S3.
    import test_sink_types as types
    types_cp = cp + "-types"
    query = (spark.readStream.schema(types.SPARK_SCHEMA).option("maxFilesPerTrigger", 1)
             .parquet(types_src).writeStream.format("cassandra_wal")
             .option("keyspace", keyspace).option("table", "types")
             .option("checkpointLocation", types_cp)
             .option("spark.cassandra.connection.host", host)
             .option("spark.cassandra.connection.port", port)
             .options(**types.LISTS)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(240) and query.exception() is None, query.exception()
    sinks.wait_flushed(query, timeout=120)
    print(json.dumps({"working_copy": copy,
                      "types_batches": open_checkpoint(types_cp).committed_batches()}))
    spark.stop()
""")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server_dir = (tmp_path_factory.mktemp("s3") / "server").resolve()
    port = s3s.free_port()
    with S3.started(server_dir, "--port", port, "--bucket", BUCKET) as result:
        yield result.stdout.strip().splitlines()[-1]


def test_a_stream_checkpointed_on_s3_lands_exactly_once_and_survives_a_lost_working_copy(
        s3, cassandra_node, cql, keyspace, tmp_path):
    jars = S3.run("jars", timeout=600)
    assert jars.returncode == 0, jars
    conf = s3s.spark_conf(s3, jars.stdout.strip().splitlines()[-1].split(","))
    create_table(cql, keyspace, "events (id int PRIMARY KEY, tag int, name text)")
    create_table(cql, keyspace, types.TABLE)
    table = pa.Table.from_pylist([dict(zip(types.COLUMNS, row)) for row in types.INPUT],
                                 schema=types.ARROW_SCHEMA)
    write_parquet_files(tmp_path / "types-src", [table.slice(0, 2), table.slice(2)])
    cp = f"s3a://{BUCKET}/cp-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               CASSANDRA_WAL_WORKING_DIR=str(tmp_path / "working"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        env.pop(name, None)       # the keys reach the sink from the session's conf alone
    if not env.get("JAVA_HOME"):
        env.update(java_home_env())
    program = tmp_path / "s3_sink_stream.py"
    program.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, str(program), REPO, json.dumps(conf), cp, cassandra_node.host,
         str(cassandra_node.port), keyspace, str(tmp_path / "src"), str(tmp_path / "types-src")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the Spark program did not finish in 600 s\n{err[-4000:]}")
    finally:
        reap_group(proc.pid)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-6000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["working_copy"].startswith(str(tmp_path))
    assert result["types_batches"] == [0, 1]
    types.check_table(cql, keyspace)

    files = [[{"id": k * 10 + i, "tag": k, "name": f"e{k}-{i}"} for i in range(5)]
             for k in range(5)]
    got = rows_by_key(read_table(cql, keyspace, "events"), "id")
    assert_rows_equal(got, {r["id"]: r for f in files for r in f}, "events")

    client = boto3.client("s3", **s3s.boto3_kwargs(s3))
    store = S3Store(BUCKET, cp.split("/", 3)[3] + "/cassandra_wal", client=client)
    keys = store.list()
    assert "WAL_FORMAT" in keys and "query.json" in keys, keys
    assert "flushed/00000000000000000004" in keys, keys
    assert not [k for k in keys if k.startswith("segments/")], keys
    # The second run's rows carry their batches' sealed timestamps, above every row of the
    # first run. (The rebuilt log never knew batches 0-2, so retention removed their seals,
    # kept only for the timestamps once a newer batch was flushed, as on a local WAL.)
    seals = {}
    for key in keys:
        if key.startswith("seals/"):
            seal = decode_seal(store.read(key), key)
            seals[seal.batch] = seal           # one version each: no batch re-ran here
    assert sorted(seals) == [3, 4], keys
    times = {r["id"]: (r["tag"], r["wt"]) for r in
             read_table(cql, keyspace, "events", "id, tag, writetime(name) AS wt")}
    for tag, wt in times.values():
        if tag in seals:
            assert seals[tag].base_ts_us <= wt <= seals[tag].last_ts_us, (tag, wt)
    assert seals[3].base_ts_us > max(wt for tag, wt in times.values() if tag < 3)

    # The offline tool on the URI, the keys from the usual AWS variables.
    wal_uri = f"{cp}/cassandra_wal"
    env = dict(os.environ, AWS_ENDPOINT_URL=s3, AWS_ACCESS_KEY_ID=s3s.ACCESS_KEY,
               AWS_SECRET_ACCESS_KEY=s3s.SECRET_KEY, AWS_DEFAULT_REGION=s3s.REGION)
    inspect = cassandra_wal("inspect", wal_uri, "--json", env=env)
    assert inspect.returncode == 0, inspect.stderr
    doc = json.loads(inspect.stdout)
    assert doc["wal"]["path"] == wal_uri and doc["wal"]["checkpoint_source"] == "target.json"
    assert [b["action"] for b in doc["batches"]] == ["nothing"] * len(doc["batches"])
    verify = cassandra_wal("verify", wal_uri, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert store.list() == keys                      # read only: the store is as it was



# -- an outage of Cassandra with the WAL on S3 ---------------------------------------------------
OUTAGE_PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests", "integration")]
    from tests.helpers.spark_session import local_builder
    import sinks
    from sinkutil import write_json_files
    from wal.checkpoint import open_checkpoint

    repo, conf, cp, host, port, keyspace, src, signals = sys.argv[1:9]
    builder = local_builder("s3-outage")
    for k, v in json.loads(conf).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    sinks.register(spark)

    def rows(k):
        return [{"id": k * 1000 + i, "tag": k, "name": f"row {i} of file {k}"} for i in range(20)]

    def signal(name):
        open(os.path.join(signals, name), "w").close()

    def await_signal(name, timeout=300):
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(signals, name)):
            assert time.monotonic() < deadline, f"no {name} signal"
            time.sleep(0.2)

    def committed():
        return (open_checkpoint(cp).committed_batches() or [-1])[-1]

    write_json_files(src, [rows(0), rows(1)])
    query = (spark.readStream.schema("id INT, tag INT, name STRING")
             .option("maxFilesPerTrigger", 1).json(src)
             .writeStream.format("cassandra_wal")
             .option("keyspace", keyspace).option("table", "events")
             .option("checkpointLocation", cp)
             .option("spark.cassandra.connection.host", host)
             .option("spark.cassandra.connection.port", port)
             .trigger(processingTime="500 milliseconds").start())
    while committed() < 1:
        assert query.exception() is None, query.exception()
        time.sleep(0.3)
    sinks.wait_flushed(query, timeout=120)
    signal("flushed-1")
    await_signal("node-down")
    write_json_files(src, [rows(k) for k in range(2, 6)], first_index=2)
    deadline = time.monotonic() + 120
    while committed() < 5:               # Spark goes on committing while Cassandra is away
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "batches 2..5 not committed during the outage"
        time.sleep(0.3)
    signal("committed-5")
    await_signal("node-up")
    assert query.isActive and query.exception() is None, "the outage failed the query"
    sinks.wait_flushed(query, timeout=180)
    query.stop()
    spark.stop()
    print(json.dumps({"committed": open_checkpoint(cp).committed_batches()}))
""")


@pytest.fixture(scope="module")
def restartable_node():
    node = RestartableNode("s3-outage")
    try:
        yield node.start()
    finally:
        node.purge()


@pytest.mark.full_matrix(reason="the S3 outage (the HDFS one, test_sink_stores.py, runs in "
                                "the default suite)")
def test_a_cassandra_outage_is_absorbed_by_a_wal_on_s3_and_drained(s3, restartable_node,
                                                                   tmp_path):
    node = restartable_node
    jars = S3.run("jars", timeout=600)
    assert jars.returncode == 0, jars
    conf = s3s.spark_conf(s3, jars.stdout.strip().splitlines()[-1].split(","))
    cp = f"s3a://{BUCKET}/outage-{uuid.uuid4().hex[:8]}"
    wal_uri = f"{cp}/cassandra_wal"
    signals = tmp_path / "signals"
    signals.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               CASSANDRA_WAL_WORKING_DIR=str(tmp_path / "working"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        env.pop(name, None)
    if not env.get("JAVA_HOME"):
        env.update(java_home_env())
    aws = dict(os.environ, AWS_ENDPOINT_URL=s3, AWS_ACCESS_KEY_ID=s3s.ACCESS_KEY,
               AWS_SECRET_ACCESS_KEY=s3s.SECRET_KEY, AWS_DEFAULT_REGION=s3s.REGION)
    program = tmp_path / "s3_outage.py"
    program.write_text(OUTAGE_PROGRAM)

    def wait_signal(name: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not (signals / name).exists():
            assert proc.poll() is None, f"the program ended early\n{proc.stderr.read()[-4000:]}"
            assert time.monotonic() < deadline, f"no {name} signal"
            time.sleep(0.2)

    with node.keyspace("s3_outage", "events (id int PRIMARY KEY, tag int, name text)") as ks:
        proc = subprocess.Popen(
            [sys.executable, str(program), REPO, json.dumps(conf), cp, node.host,
             str(node.port), ks, str(tmp_path / "src"), str(signals)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_signal("flushed-1")
            node.stop()
            down_at = time.monotonic()
            (signals / "node-down").touch()
            wait_signal("committed-5")
            report = cassandra_wal("inspect", wal_uri, "--json", env=aws)
            assert report.returncode == 0, report.stderr
            doc = json.loads(report.stdout)
            backlog = {b["batch"]: b for b in doc["batches"] if b["batch"] >= 2}
            assert sorted(backlog) == [2, 3, 4, 5], doc["batches"]
            assert all(b["committed"] is True and b["action"] == "replay"
                       for b in backlog.values()), backlog
            assert doc["totals"]["rows_pending"] == 4 * 20
            time.sleep(max(0.0, 20.0 - (time.monotonic() - down_at)))
            client = boto3.client("s3", **s3s.boto3_kwargs(s3))
            store = S3Store(BUCKET, wal_uri.split("/", 3)[3], client=client)
            assert store.read("blocked.json") is None
            node.start()
            (signals / "node-up").touch()
            out, err = proc.communicate(timeout=420)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            reap_group(proc.pid)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-6000:]}"
        assert json.loads(out.strip().splitlines()[-1])["committed"][-1] == 5
        seals = {}
        for key in store.list("seals"):
            seal = decode_seal(store.read(key), key)
            seals[seal.batch] = seal
        with node.session() as cql:
            rows = list(cql.execute(f"SELECT id, tag, name, WRITETIME(name) AS wt "
                                    f"FROM {ks}.events"))
        assert {r.id: (r.tag, r.name) for r in rows} == {
            k * 1000 + i: (k, f"row {i} of file {k}") for k in range(6) for i in range(20)}
        for r in rows:
            assert seals[r.tag].base_ts_us <= r.wt < seals[r.tag].base_ts_us + 20, r
        assert store.list("segments") == []
