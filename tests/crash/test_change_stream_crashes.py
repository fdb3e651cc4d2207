"""A change stream killed at the flush's crash points and at random (issue 35): updates and
deletes of the same keys within a batch and across batches, in either order the user guide
gives (a source-order ``writetime``; sealed timestamps with each batch one task), end equal to the source applied in order, row by row, with the completeness
marker naming the last batch as the WAL holds it (``harness.change_lines``, and what
:meth:`CrashHarness.check` checks of a change stream).

The default suite runs batch 2 half written, then restarted, in both orders, and one random
kill with a ``writetime`` (about two minutes); ``--full-matrix`` every flush point, a crash
inside the restart's recovery, the scale-out path, and five random seeds, in both orders.
"""

from __future__ import annotations

import random

import pytest

from tests.helpers.matrix import full_matrix

from .harness import change_order, change_stream_harness  # noqa: F401 - fixtures

pytestmark = [pytest.mark.integration, pytest.mark.crash]

DEFAULT_POINTS = [(("flush.mid@20",), "driver")]
FULL_POINTS = DEFAULT_POINTS + [
    (("flush.before_ingest@3",), "driver"),
    (("flush.before_mark@3",), "driver"),
    (("flush.mid@12",), "driver"),
    (("flush.mid@20", "recover.mid@1"), "driver"),
    (("commit.after_seal@2",), "driver"),
    (("flush.mid@5",), "executors"),
]


def _points(config) -> list:
    return FULL_POINTS if full_matrix(config) else DEFAULT_POINTS


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "change_points" in metafunc.fixturenames:
        cases = _points(config)
        metafunc.parametrize("change_points", cases,
                             ids=[("" if mode == "driver" else f"{mode}-") + "+".join(steps)
                                  for steps, mode in cases])
    if "change_order" in metafunc.fixturenames:
        orders = (["lsn", "sealed"] if full_matrix(config) or "change_points" in
                  metafunc.fixturenames else ["lsn"])
        metafunc.parametrize("change_order", orders,
                             ids=["writetime-lsn" if o == "lsn" else "sealed-order"
                                  for o in orders])
    if "change_seed" in metafunc.fixturenames:
        seeds = range(1, 6) if full_matrix(config) else [2]
        metafunc.parametrize("change_seed", list(seeds), ids=[f"seed{s}" for s in seeds])


def test_a_change_stream_crashed_at_a_point_ends_equal_to_its_source(
        change_stream_harness, change_points):  # noqa: F811
    steps, mode = change_points
    change_stream_harness.flush_mode = mode
    for step in steps:
        change_stream_harness.crash_at(step)
    change_stream_harness.finish()
    change_stream_harness.check(f"change stream, {mode}, {'+'.join(steps)}")


def test_a_change_stream_killed_at_random_ends_equal_to_its_source(
        change_stream_harness, change_seed):  # noqa: F811
    rng = random.Random(change_seed)
    change_stream_harness.kill_randomly(rng, f"change stream: seed {change_seed}")
    change_stream_harness.finish()
    change_stream_harness.check(f"change stream: seed {change_seed}")
