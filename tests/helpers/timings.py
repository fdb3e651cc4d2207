"""Where a run's time goes, test by test: with ``CASSANDRA_WAL_TEST_TIMES=<folder>``, each
pytest process appends one line per test phase to ``<folder>/<pid>.tsv`` (node id, phase,
seconds, wall-clock start), for balancing the suite's processes (docs/testing.md)."""

from __future__ import annotations

import os

ENV_TEST_TIMES = "CASSANDRA_WAL_TEST_TIMES"


def record(report) -> None:
    """pytest's ``pytest_runtest_logreport``: one line for ``report`` if asked."""
    folder = os.environ.get(ENV_TEST_TIMES)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{os.getpid()}.tsv"), "a") as out:
        out.write(f"{report.nodeid}\t{report.when}\t{report.duration:.3f}\t{report.start:.3f}\n")
