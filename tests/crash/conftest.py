"""Options of the crash tests: ``--seeds N`` (see docs/testing.md; ``--full-matrix`` is every
test's, ``tests/helpers/matrix.py``), and the stores their checkpoints may live on
(``storage.py``): HDFS and S3 servers started once per session, only when a case on that store
runs.

pytest reads a conftest's options only when the conftest is loaded before the command line is
parsed, i.e. when ``tests/crash`` (or a file in it) is on the command line:
``pytest tests/crash --seeds 5``. The same switch works anywhere as an environment variable:
``CASSANDRA_WAL_CRASH_SEEDS=N``.
"""

from __future__ import annotations

import os
import uuid

import pytest

from tests.helpers.matrix import full_matrix
from tests.helpers.node import ServerScript, load_script_module

from .storage import LOCAL, hdfs_storage, s3_storage

DEFAULT_SEEDS = 0     # local seeds; seed 1 on HDFS always: the suite's 30 minutes
FULL_MATRIX_SEEDS = 20


def pytest_addoption(parser):
    group = parser.getgroup("crash", "crash tests (tests/crash)")
    group.addoption("--seeds", type=int, default=None,
                    help="number of local random-kill seeds (default 0: seed 1 on HDFS only; 20 with --full-matrix)")


def pytest_configure(config):
    config.addinivalue_line("markers", "crash: crash tests that kill real processes")


def seed_count(config) -> int:
    seeds = config.getoption("--seeds", default=None)
    if seeds is None and os.environ.get("CASSANDRA_WAL_CRASH_SEEDS"):
        seeds = int(os.environ["CASSANDRA_WAL_CRASH_SEEDS"])
    if seeds is None:
        seeds = FULL_MATRIX_SEEDS if full_matrix(config) else DEFAULT_SEEDS
    return seeds


def pytest_generate_tests(metafunc):
    """``crash_case`` and ``kill_trial`` are parametrized here, where the options are known,
    each with the storage its harness uses (``crash_storage``)."""
    config = metafunc.config
    if "crash_case" in metafunc.fixturenames:
        cases = metafunc.module.cases(full_matrix(config))
        metafunc.parametrize(("crash_storage", "crash_case"), [(c.storage, c) for c in cases],
                             ids=[c.id for c in cases])
    if "kill_trial" in metafunc.fixturenames:
        trials = metafunc.module.trials(full_matrix(config), seed_count(config))
        metafunc.parametrize(("crash_storage", "kill_trial"), [(t.storage, t) for t in trials],
                             ids=[t.id for t in trials])


@pytest.fixture
def crash_storage() -> str:
    """Where the harness keeps the checkpoint: ``local`` unless a case says (parametrized)."""
    return LOCAL


@pytest.fixture(scope="session")
def crash_hdfs(hdfs_server):
    """The session's HDFS (``tests/conftest.py``) for the crash cases on HDFS."""
    return hdfs_storage(*hdfs_server)


@pytest.fixture(scope="session")
def crash_s3(tmp_path_factory):
    """A moto S3 server (``scripts/s3``) with a bucket, and the s3a jars for the program's
    Spark, for the session's crash cases on S3."""
    s3s = load_script_module("s3_server")
    try:
        s3s.find_moto_server()
    except s3s.S3ServerError as e:      # moto[server] is a test dependency
        pytest.skip(str(e))
    script = ServerScript("s3", "moto_server", by_cwd=True, timeout=120)
    jars = script.run("jars", timeout=600)
    assert jars.returncode == 0, jars.stderr
    server_dir = (tmp_path_factory.mktemp("crash-s3") / "server").resolve()
    bucket = f"crash-{uuid.uuid4().hex[:8]}"
    with script.started(server_dir, "--port", s3s.free_port(), "--bucket", bucket) as started:
        endpoint = started.stdout.strip().splitlines()[-1]
        conf = s3s.spark_conf(endpoint, jars.stdout.strip().splitlines()[-1].split(","))
        yield s3_storage(bucket, conf)
