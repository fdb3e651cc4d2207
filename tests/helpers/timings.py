"""Where a run's time goes, test by test: with ``CASSANDRA_WAL_TEST_TIMES=<folder>``, each
pytest process appends one line per test phase to ``<folder>/<pid>.tsv`` (node id, phase,
seconds, wall-clock start), for balancing the suite's processes (docs/testing.md).

The file is opened when pytest starts (:func:`start`): the hook that writes to it runs while a
test's patches of ``os`` are still in place, and must not call ``os`` itself."""

from __future__ import annotations

import os

ENV_TEST_TIMES = "CASSANDRA_WAL_TEST_TIMES"

_out = None


def start() -> None:
    """pytest's ``pytest_configure``: open this process's file if asked."""
    global _out
    folder = os.environ.get(ENV_TEST_TIMES)
    if folder and _out is None:
        os.makedirs(folder, exist_ok=True)
        _out = open(os.path.join(folder, f"{os.getpid()}.tsv"), "a", buffering=1)


def record(report) -> None:
    """pytest's ``pytest_runtest_logreport``: one line for ``report``."""
    if _out is not None:
        _out.write(f"{report.nodeid}\t{report.when}\t{report.duration:.3f}\t{report.start:.3f}\n")
