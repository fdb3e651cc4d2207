"""The one switch for the long matrices: ``--full-matrix`` on pytest's command line (an option
of ``tests/conftest.py``) or ``CASSANDRA_WAL_FULL_MATRIX=1`` in the environment, which
``scripts/test --full-matrix`` sets. A test that runs only then carries
``@pytest.mark.full_matrix(reason=...)``; a test whose size depends on it reads
:func:`full_matrix`."""

from __future__ import annotations

import os

ENV = "CASSANDRA_WAL_FULL_MATRIX"


def full_matrix(config=None) -> bool:
    """Whether the long matrices run: the environment, or ``config``'s ``--full-matrix``."""
    if os.environ.get(ENV, "") not in ("", "0"):
        return True
    return bool(config is not None and config.getoption("--full-matrix", default=False))
