"""The simulation runs against this repository's code, or against the code of another worktree
named first in ``PYTHONPATH`` (to show what it finds in older code):

    git worktree add ../before d62ab05
    cd ../before && PYTHONPATH=$PWD python -m pytest <this repository>/tests/sim

pytest puts this repository first on ``sys.path`` (``pythonpath`` in pyproject.toml), ahead of
``PYTHONPATH``; when this file loads before anything imported the sink (running
``tests/sim`` alone), putting the named worktree first decides where ``wal``, ``sinks`` and
``recovery`` come from. The header line says which code ran.
"""

from __future__ import annotations

import os
import sys


def _code_under_test() -> str | None:
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isfile(os.path.join(entry, "wal", "catalog.py")):
            return os.path.abspath(entry)
    return None


_CODE = _code_under_test()
if _CODE is not None and not any(n.split(".")[0] in ("wal", "sinks", "recovery")
                                 for n in sys.modules):
    sys.path.insert(0, _CODE)


def pytest_report_header(config):
    import wal

    return f"protocol simulation: code under test in {os.path.dirname(os.path.dirname(wal.__file__))}"
