"""Model-based test of the sink's protocol: thousands of seeded schedules of a simulated Spark
and Cassandra driving the real ``wal``, catalog, replayer, retention and commit path.

Each seed is one schedule (``tests/sim/runner.py``): streams with task retries, speculative
and zombie attempts, crashes at any step, restarts with other options, purged checkpoints,
checkpoint resets and shared WALs; concurrent batch jobs; foreachBatch functions writing one or
two tables (``tests/sim/foreach.py``); Cassandra outages and timeouts that did or did not apply
the write; list columns, with and without ``wal.lists.atLeastOnce``; clocks that differ between
hosts and step, and flush tasks on executors whose clocks are hours off
(``tests/sim/clocks.py``); an operator's ``cassandra-wal recover`` and ``repair`` beside a
live query or after it stopped (``tests/sim/operators.py``); a full or read-only disk at any
write of the sink's files (``tests/sim/disk.py``); change streams of upserts and row and
partition deletes (``tests/sim/deletes.py``). The invariants (``tests/sim/invariants.py``) are
checked after every step. 5,000 schedules by default, in blocks so progress shows, 100,000 with
``--full-matrix`` (``tests/helpers/matrix.py``). ``CASSANDRA_WAL_SIM_SEED=<n>``
replays one seed, printing its schedule step by step (run with ``-s``). Schedules run on
``CASSANDRA_WAL_SIM_WORKERS`` processes (default: 2, or 1 on a one-core machine).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter

import pytest

from tests.helpers.matrix import full_matrix

from . import runner

pytestmark = [pytest.mark.unit, pytest.mark.sim]

SCHEDULES = 5_000             # the default: the suite's 30 minutes
FULL_MATRIX_SCHEDULES = 100_000
BLOCK = 500
REPLAY = os.environ.get(runner.ENV_SEED)


def pytest_generate_tests(metafunc):
    if "seeds" in metafunc.fixturenames:
        total = FULL_MATRIX_SCHEDULES if full_matrix(metafunc.config) else SCHEDULES
        metafunc.parametrize("seeds", [range(start, start + BLOCK)
                                       for start in range(0, total, BLOCK)],
                             ids=lambda r: f"seeds-{r.start}-{r.stop - 1}")


@pytest.fixture(scope="module")
def pool():
    # Always processes of their own, even one: the seams patch the sink's modules for good, and
    # installed in pytest's process they leaked into every later test of it (scripts/test runs
    # the unit tests after the simulation in one process).
    workers = max(1, int(os.environ.get("CASSANDRA_WAL_SIM_WORKERS",
                                        min(2, os.cpu_count() or 1))))
    # spawn, not fork: the parent holds cassandra-driver's and Arrow's threads and locks.
    with multiprocessing.get_context("spawn").Pool(workers, initializer=runner.installed) as p:
        yield p


@pytest.mark.skipif(REPLAY is not None, reason=f"{runner.ENV_SEED} replays one seed")
def test_schedules_keep_the_invariants(seeds, pool):
    started = time.perf_counter()
    outcomes = pool.map(runner.run_quiet, seeds, chunksize=10)
    seconds = time.perf_counter() - started
    print(f"{len(seeds)} schedules in {seconds:.1f} s ({len(seeds) / seconds:.0f}/s)")
    drawn = sum((Counter(o.counts) for o in outcomes), Counter())
    print("drawn: " + ", ".join(f"{what} {n}" for what, n in sorted(drawn.items())))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        pytest.fail(runner.summary(failed, len(seeds)), pytrace=False)


@pytest.mark.skipif(REPLAY is None, reason=f"set {runner.ENV_SEED}=<seed> to replay one")
def test_replay_one_seed():
    runner.installed()
    outcome = runner.run_seed(int(REPLAY), verbose=True)
    assert outcome.ok, runner.failure_text(outcome)
