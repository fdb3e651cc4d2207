"""What tests share about the local servers of scripts/ (cassandra, hdfs, s3): the scripts as
modules and as command lines, servers started in a temp dir and purged, JDK 17 for Spark, and
throwaway keyspaces on the Cassandra node."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script_module(name: str):
    """Import scripts/<name>.py (stdlib only) as module ``name``, once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_cassandra_node_module():
    """scripts/cassandra_node.py as module ``cassandra_node``."""
    return load_script_module("cassandra_node")


class ServerScript:
    """One of scripts/cassandra, scripts/hdfs, scripts/s3 as the tests drive it: its command
    line, and a scan of /proc for its servers independent of the script's own bookkeeping
    (processes whose command line names ``program`` and whose command line names the server
    dir, or, ``by_cwd``, which run in it)."""

    def __init__(self, name: str, program: str, *, by_cwd: bool = False, timeout: float = 60):
        self.path, self.program = SCRIPTS / name, program
        self.by_cwd, self.timeout = by_cwd, timeout

    def run(self, *args, timeout: float | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.path), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout or self.timeout, stdin=subprocess.DEVNULL)

    def pids(self, server_dir: Path) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
                mine = (os.readlink(f"/proc/{entry}/cwd") == str(server_dir) if self.by_cwd
                        else str(server_dir) in cmdline)
            except OSError:
                continue
            if self.program in cmdline and mine:
                pids.append(int(entry))
        return sorted(pids)

    @contextlib.contextmanager
    def started(self, server_dir: Path, *args, timeout: float | None = None):
        """``start --dir server_dir *args`` (which must succeed); yields its result; then
        :meth:`stop_purged`, whatever happened."""
        try:
            result = self.run("start", "--dir", server_dir, *args, timeout=timeout)
            assert result.returncode == 0, result.stderr
            yield result
        finally:
            self.stop_purged(server_dir)

    def stop_purged(self, server_dir: Path) -> None:
        """``stop --purge``: no server of the dir is left, nor the dir."""
        result = self.run("stop", "--dir", server_dir, "--purge")
        assert self.pids(server_dir) == []
        assert result.returncode == 0, result.stderr
        assert not server_dir.exists()


HDFS = ServerScript("hdfs", "MiniDFSClusterManager", timeout=60)
HDFS_START_TIMEOUT = float(os.environ.get("HDFS_WAL_START_TIMEOUT", "180"))


@contextlib.contextmanager
def hdfs_started(node_dir: Path):
    """``scripts/hdfs`` started in ``node_dir`` on two free ports (the jars fetched on first
    use), stopped with --purge on the way out: yields ``(port, http_port, start result)``."""
    hn = load_script_module("hdfs_node")
    port = hn.free_port()
    http_port = hn.free_port(exclude=(port,))
    with HDFS.started(node_dir, "--port", port, "--http-port", http_port,
                      "--timeout", HDFS_START_TIMEOUT,
                      timeout=HDFS_START_TIMEOUT + 600) as start:     # + the jars
        yield port, http_port, start


#: JVM options of every Cassandra node the tests start (``CASSANDRA_WAL_JVM_EXTRA_OPTS``, set by
#: tests/conftest.py unless already set): the JIT's first tier only. A node's start and a
#: short workload (ten tables, 20,000 rows) took 16-19 CPU-seconds with it against 30-32
#: without (2026-11-29, docs/testing.md); the tests' nodes live minutes, not days.
TEST_NODE_JVM_OPTS = "-XX:TieredStopAtLevel=1"


def use_test_node_jvm_options() -> None:
    """Give every node this process (and its children) starts :data:`TEST_NODE_JVM_OPTS`,
    unless ``CASSANDRA_WAL_JVM_EXTRA_OPTS`` says otherwise."""
    os.environ.setdefault(load_cassandra_node_module().ENV_JVM_EXTRA_OPTS, TEST_NODE_JVM_OPTS)


def java_home_env() -> dict:
    """``{"JAVA_HOME": <JDK 17>}`` found the way the node script finds one; ``{}`` if none
    (pyspark then finds ``java`` on the PATH itself)."""
    try:
        return {"JAVA_HOME": str(load_cassandra_node_module().find_java_home())}
    except Exception:  # noqa: BLE001 - see docstring
        return {}


def start_timeout() -> float:
    """Seconds a test node may take to answer CQL: ``CASSANDRA_WAL_START_TIMEOUT``, else the
    node script's default."""
    return float(os.environ.get("CASSANDRA_WAL_START_TIMEOUT",
                                load_cassandra_node_module().DEFAULT_TIMEOUT))


def create_keyspace(cql, prefix: str = "t") -> str:
    """Create a new SimpleStrategy RF 1 keyspace named ``<prefix>_<random>``; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    cql.execute(f"CREATE KEYSPACE {name} WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    return name


@contextlib.contextmanager
def fresh_keyspace(cql, prefix: str = "t"):
    """A new keyspace (:func:`create_keyspace`), dropped afterwards."""
    name = create_keyspace(cql, prefix)
    try:
        yield name
    finally:
        cql.execute(f"DROP KEYSPACE IF EXISTS {name}")


@contextlib.contextmanager
def cql_session(contact_points: list[str], port: int, policy, **profile):
    """A CQL session of its own (protocol 5) routed by ``policy``, with the execution
    profile's other settings (``request_timeout``, ``consistency_level``); shut down on the
    way out."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile

    cluster = Cluster(contact_points=contact_points, port=port, protocol_version=5,
                      connect_timeout=15, execution_profiles={
                          EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=policy,
                                                                 **profile)})
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


class RestartableNode:
    """A Cassandra node of its own (not the session's), which a test may stop and start again
    on the same port and data: an outage. ``host``/``port`` as the sink options want them."""

    def __init__(self, prefix: str, heap: str = "512m"):
        import tempfile

        self.cn = load_cassandra_node_module()
        self.node_dir = Path(tempfile.mkdtemp(prefix=f"cassandra-wal-node-{prefix}-"))
        self.host, self.port, self.heap = self.cn.HOST, self.cn.free_port(), heap
        self.contact_points = [self.host]

    def start(self) -> "RestartableNode":
        self.cn.start(self.port, self.node_dir, fast=True, die_with_parent=True, heap=self.heap,
                      timeout=start_timeout())
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the script's timeout; the data stays."""
        self.cn.stop(self.port, self.node_dir)

    def purge(self) -> None:
        import shutil

        self.cn.stop(self.port, self.node_dir, purge=True)
        shutil.rmtree(self.node_dir, ignore_errors=True)

    @contextlib.contextmanager
    def session(self):
        """A CQL session of its own (protocol 5), shut down on the way out."""
        from cassandra.policies import DCAwareRoundRobinPolicy

        with cql_session(self.contact_points, self.port, DCAwareRoundRobinPolicy(),
                         request_timeout=30) as session:
            yield session

    @contextlib.contextmanager
    def keyspace(self, prefix: str, *ddl: str):
        """A fresh keyspace (:func:`create_keyspace`) with the tables of ``ddl`` (each the
        part after ``CREATE TABLE <keyspace>.``). Created and dropped through sessions of
        their own, so an outage in between leaves no stale connection behind."""
        with self.session() as cql:
            name = create_keyspace(cql, prefix)
            for table in ddl:
                cql.execute(f"CREATE TABLE {name}.{table}")
        try:
            yield name
        finally:
            with self.session() as cql:
                cql.execute(f"DROP KEYSPACE IF EXISTS {name}")


class LocalCluster:
    """A Cassandra cluster of ``scripts/cassandra cluster`` (nodes on 127.0.0.1, 127.0.0.2,
    ...), in a temp dir, for one test module. ``host`` (the nodes' addresses, comma-separated)
    and ``port`` as the sink options want them; :meth:`kill` and :meth:`start` take a node
    down (``kill -9``, its data kept) and bring it back."""

    def __init__(self, prefix: str, nodes: int = 3, heap: str | None = None):
        import tempfile

        self.cc = load_script_module("cassandra_cluster")
        self.cluster_dir = Path(tempfile.mkdtemp(prefix=f"cassandra-wal-cluster-{prefix}-"))
        self.nodes, self.heap = nodes, heap
        self.info = None

    @property
    def host(self) -> str:
        return self.info.contact_points

    @property
    def port(self) -> int:
        return self.info.port

    @property
    def contact_points(self) -> list[str]:
        return self.info.hosts

    def start(self) -> "LocalCluster":
        """Start the cluster, or the nodes of it that are down, and wait until they agree."""
        # Not --fast: a node killed with kill -9 whose system tables were not made durable
        # came back without the test's keyspace ("INCOMPATIBLE_SCHEMA" on every read of it).
        self.info = self.cc.start(self.nodes, cluster_dir=self.cluster_dir, heap=self.heap,
                                  die_with_parent=True, quiet=True, timeout=start_timeout())
        return self

    def start_node(self, index: int) -> "LocalCluster":
        """Start node ``index`` alone and wait until the running nodes agree."""
        self.cc.start_node(index, cluster_dir=self.cluster_dir, die_with_parent=True,
                           quiet=True, timeout=start_timeout())
        return self

    def kill(self, index: int) -> int:
        """``kill -9`` node ``index`` (1-based); its pid."""
        pid = self.cc.kill(index, cluster_dir=self.cluster_dir)
        assert pid, f"node {index} was not running"
        return pid

    def status(self) -> dict:
        return self.cc.status(cluster_dir=self.cluster_dir)

    def purge(self) -> None:
        import shutil

        # SIGKILL at once (timeout 0): the data goes anyway, and a drain takes 10 s or so.
        self.cc.stop(cluster_dir=self.cluster_dir, purge=True, timeout=0)
        shutil.rmtree(self.cluster_dir, ignore_errors=True)

    def node_host(self, index: int) -> str:
        return self.info.node(index).host

    @contextlib.contextmanager
    def session(self, *, only: str | None = None, consistency: str = "ONE"):
        """A CQL session of its own (protocol 5, token aware), at ``consistency``; ``only``:
        every request coordinated by that node (its virtual tables are its own)."""
        from cassandra import ConsistencyLevel
        from cassandra.policies import (DCAwareRoundRobinPolicy, TokenAwarePolicy,
                                        WhiteListRoundRobinPolicy)

        policy = (WhiteListRoundRobinPolicy([only]) if only
                  else TokenAwarePolicy(DCAwareRoundRobinPolicy()))
        with cql_session([only] if only else self.contact_points, self.port, policy,
                         request_timeout=60,
                         consistency_level=ConsistencyLevel.name_to_value[consistency]) as s:
            yield s

    @contextlib.contextmanager
    def keyspace(self, prefix: str, replication_factor: int, *ddl: str):
        """A fresh SimpleStrategy keyspace of ``replication_factor`` with the tables of
        ``ddl`` (each the part after ``CREATE TABLE <keyspace>.``), dropped afterwards."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self.session() as cql:
            cql.execute(f"CREATE KEYSPACE {name} WITH replication = {{'class': "
                        f"'SimpleStrategy', 'replication_factor': {replication_factor}}}")
            for table in ddl:
                cql.execute(f"CREATE TABLE {name}.{table}")
        try:
            yield name
        finally:
            with contextlib.suppress(Exception):
                with self.session() as cql:
                    cql.execute(f"DROP KEYSPACE IF EXISTS {name}")
