"""Options of the crash tests: ``--full-matrix`` and ``--seeds N`` (see docs/testing.md).

pytest reads a conftest's options only when the conftest is loaded before the command line is
parsed, i.e. when ``tests/crash`` (or a file in it) is on the command line:
``pytest tests/crash --full-matrix``. The same switches work anywhere as environment variables:
``CASSANDRA_WAL_FULL_MATRIX=1`` and ``CASSANDRA_WAL_CRASH_SEEDS=N``.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_SEEDS = 2
FULL_MATRIX_SEEDS = 20


def pytest_addoption(parser):
    group = parser.getgroup("crash", "crash tests (tests/crash)")
    group.addoption("--full-matrix", action="store_true", default=False,
                    help="run every crash point at several batches and 20 random-kill seeds")
    group.addoption("--seeds", type=int, default=None,
                    help="number of random-kill seeds (default 2, 20 with --full-matrix)")


def pytest_configure(config):
    config.addinivalue_line("markers", "crash: crash tests that kill real processes")
    config.addinivalue_line("markers",
                            "full_matrix: the full crash matrix; runs only with --full-matrix")


def full_matrix(config) -> bool:
    return bool(config.getoption("--full-matrix", default=False)
                or os.environ.get("CASSANDRA_WAL_FULL_MATRIX", "") not in ("", "0"))


def seed_count(config) -> int:
    seeds = config.getoption("--seeds", default=None)
    if seeds is None and os.environ.get("CASSANDRA_WAL_CRASH_SEEDS"):
        seeds = int(os.environ["CASSANDRA_WAL_CRASH_SEEDS"])
    if seeds is None:
        seeds = FULL_MATRIX_SEEDS if full_matrix(config) else DEFAULT_SEEDS
    return seeds


def pytest_generate_tests(metafunc):
    """``crash_case`` and ``kill_seed`` are parametrized here, where the options are known."""
    config = metafunc.config
    if "crash_case" in metafunc.fixturenames:
        module = metafunc.module
        cases = module.cases(full_matrix(config))
        metafunc.parametrize("crash_case", cases, ids=[c.id for c in cases])
    if "kill_seed" in metafunc.fixturenames:
        seeds = list(range(1, seed_count(config) + 1))
        metafunc.parametrize("kill_seed", seeds, ids=[f"seed{s}" for s in seeds])


def pytest_collection_modifyitems(config, items):
    if full_matrix(config):
        return
    skip = pytest.mark.skip(reason="full crash matrix only: pass --full-matrix")
    for item in items:
        if "full_matrix" in item.keywords:
            item.add_marker(skip)
