"""Shared pytest fixtures: a real Cassandra node, a CQL session, a fresh keyspace, Spark.

Cassandra: set CASSANDRA_HOST / CASSANDRA_PORT to use a running node (e.g. one started with
`scripts/cassandra start`); otherwise the session starts its own node (Cassandra 5.0 on JDK 17,
jars cached in .cache/cassandra) on a free port in a temp dir and stops + purges it at the end.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pytest

from tests.helpers import timings
from tests.helpers.matrix import full_matrix
from tests.helpers.node import (fresh_keyspace, hdfs_started, java_home_env,
                                load_cassandra_node_module, start_timeout,
                                use_test_node_jvm_options)


def pytest_addoption(parser):
    parser.addoption("--full-matrix", action="store_true", default=False,
                     help="the long matrices too: every crash point at several batches, 20 "
                          "random-kill seeds, 100,000 simulated schedules, the tests marked "
                          "full_matrix (also CASSANDRA_WAL_FULL_MATRIX=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: fast tests without external services")
    config.addinivalue_line(
        "markers", "integration: needs a real Cassandra node and/or a local Spark")
    config.addinivalue_line(
        "markers", "full_matrix(reason): runs only with --full-matrix (tests/helpers/matrix.py)")
    use_test_node_jvm_options()
    timings.start()


def pytest_runtest_logreport(report):
    timings.record(report)


def pytest_collection_finish(session):
    """A run that starts Spark makes the class archive its Spark drivers start from, once per
    checkout, and gives its processes the environment that uses it
    (``tests/helpers/spark_session.py``)."""
    if session.config.option.collectonly:
        return
    if not any(item.get_closest_marker("integration") for item in session.items):
        return
    if not os.environ.get("JAVA_HOME"):
        os.environ.update(java_home_env())
    from tests.helpers.spark_session import class_archive, make_class_archive, spark_environment

    if not class_archive().exists():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("making the Spark class archive (once per checkout) ...")
        made = make_class_archive()
        if reporter is not None:
            reporter.write_line(f"  {made or 'not made: Spark starts without it'}")
    # Every Spark the tests start, in this process or a program of theirs, starts from it.
    os.environ.update(spark_environment())


def pytest_collection_modifyitems(config, items):
    if full_matrix(config):
        return
    for item in items:
        marker = item.get_closest_marker("full_matrix")
        if marker is not None:
            why = marker.kwargs.get("reason", "part of the long matrices")
            item.add_marker(pytest.mark.skip(reason=f"{why}: runs with --full-matrix"))


@dataclass
class CassandraNode:
    host: str
    port: int
    node_dir: Optional[Path] = None  # None: an external node (CASSANDRA_HOST/PORT)
    pid: Optional[int] = None
    release_version: Optional[str] = None
    contact_points: List[str] = field(init=False)

    def __post_init__(self):
        self.contact_points = [self.host]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def managed(self) -> bool:
        return self.node_dir is not None


@pytest.fixture(scope="session")
def cassandra_node():
    host, port = os.environ.get("CASSANDRA_HOST"), os.environ.get("CASSANDRA_PORT")
    if host or port:
        yield CassandraNode(host=host or "127.0.0.1", port=int(port or 9042))
        return

    cn = load_cassandra_node_module()
    node_dir = Path(tempfile.mkdtemp(prefix="cassandra-wal-node-"))
    stopped = False

    def teardown():
        nonlocal stopped
        if stopped:
            return
        stopped = True
        try:
            cn.stop(None, node_dir, purge=True)
        finally:
            shutil.rmtree(node_dir, ignore_errors=True)

    atexit.register(teardown)  # also covers exits that skip fixture finalization
    # A SIGTERM (CI timeout, `kill`) would end pytest without teardown; turn it into a
    # KeyboardInterrupt so pytest stops and finalizes fixtures. (A SIGKILLed pytest still
    # takes the node down: it runs with PR_SET_PDEATHSIG, see die_with_parent.)
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    if previous_sigterm == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        info = cn.start(
            cn.free_port(), node_dir, fast=True, die_with_parent=True,
            timeout=start_timeout())
        yield CassandraNode(host=cn.HOST, port=info.port, node_dir=node_dir, pid=info.pid,
                            release_version=info.extra.get("release_version"))
    finally:
        teardown()
        atexit.unregister(teardown)
        if previous_sigterm == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def cql(cassandra_node):
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    last_error = None
    for protocol_version in (5, 4):
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
            request_timeout=30)
        cluster = Cluster(contact_points=cassandra_node.contact_points,
                          port=cassandra_node.port, protocol_version=protocol_version,
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                          connect_timeout=15)
        try:
            session = cluster.connect()
        except NoHostAvailable as e:
            last_error = e
            cluster.shutdown()
            continue
        try:
            yield session
        finally:
            cluster.shutdown()
        return
    raise RuntimeError(f"cannot connect to Cassandra at {cassandra_node.address}: {last_error}")


@pytest.fixture
def keyspace(cql):
    with fresh_keyspace(cql) as name:
        yield name


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if not os.environ.get("JAVA_HOME"):
        os.environ.update(java_home_env())
    from tests.helpers.spark_session import local_builder

    session = local_builder("cassandra-wal-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def hdfs_server(tmp_path_factory):
    """One HDFS (``scripts/hdfs``, a MiniDFSCluster) for the session's tests that need a running
    one: ``(hdfs://127.0.0.1:<port>, 127.0.0.1:<http port>)``. (The script's own tests start
    theirs: they check what a start prints.)"""
    with hdfs_started(tmp_path_factory.mktemp("hdfs") / "server") as (port, http_port, _):
        yield f"hdfs://127.0.0.1:{port}", f"127.0.0.1:{http_port}"
