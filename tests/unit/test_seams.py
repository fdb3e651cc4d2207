"""The seams a test replaces the world through stay single (issue 33).

The protocol simulation (``tests/sim/patches.py``) runs the real sink on a clock, a Cassandra
and crash points of its own by replacing a handful of names where they are defined: the
clocks in ``wal/clock.py``, the crash points' hook in ``wal/crashpoints.py``, the session
factory ``recovery.cql.connection.connect`` and the table lookup ``recovery.cql.table.fetch_table_schema``. A
module that reads ``time`` itself, sleeps on its own, waits with tenacity's
``stop_after_delay``, or binds the session factory or the table lookup to a name of its own
would escape them (the simulation would run it on the machine's clock or a real Cassandra) and
the simulation would have to patch it again, module by module. This test finds such a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.planted_tree import PACKAGES, parsed_modules, plant

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

#: ``time`` functions that read a clock or wait: only wal/clock.py calls them.
CLOCK_READS = {"time", "time_ns", "monotonic", "monotonic_ns", "sleep", "perf_counter",
               "perf_counter_ns"}
#: Names bound only where they are defined, and always called through their module.
SEAMS = {("recovery.cql.connection", "connect"): "recovery/cql/connection.py",
         ("recovery.cql.table", "fetch_table_schema"): "recovery/cql/table.py",
         ("tenacity", "stop_after_delay"): "wal/clock.py"}


def escapes(root: Path) -> list[str]:
    """Each place under ``root``'s packages that goes around a seam, as ``path:line: what``."""
    found = []
    for rel, tree in parsed_modules(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if node.module == "time" and alias.name in CLOCK_READS \
                            and rel != "wal/clock.py":
                        found.append(f"{rel}:{node.lineno}: from time import {alias.name}")
                    owner = SEAMS.get((_absolute(rel, node), alias.name))
                    if owner is not None and owner != rel:
                        found.append(f"{rel}:{node.lineno}: from {node.module} import "
                                     f"{alias.name} (call it through its module)")
            elif isinstance(node, ast.Attribute) and node.attr in CLOCK_READS \
                    and isinstance(node.value, ast.Name) and node.value.id == "time" \
                    and rel != "wal/clock.py":
                found.append(f"{rel}:{node.lineno}: time.{node.attr} (use wal.clock)")
    return found


def _absolute(rel: str, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved against ``rel``."""
    if not node.level:
        return node.module
    parts = rel[:-3].split("/")[:-node.level]
    return ".".join(parts + [node.module])


def test_every_clock_reading_wait_and_session_goes_through_its_seam():
    assert escapes(REPO) == []


@pytest.mark.parametrize("module, planted, caught", [
    ("sinks/driver/wait.py", "import time\n_T = time.monotonic()", "time.monotonic"),
    ("recovery/output.py", "from recovery.cql.connection import connect", "from recovery.cql.connection import connect"),
    ("recovery/cql/upsert.py", "from .table import fetch_table_schema", "import fetch_table_schema"),
    ("recovery/recover.py", "from tenacity import stop_after_delay", "import stop_after_delay"),
    ("wal/layout.py", "from time import sleep", "from time import sleep"),
])
def test_a_module_going_around_a_seam_is_found(tmp_path, module, planted, caught):
    (found,) = escapes(plant(tmp_path, PACKAGES, module, planted))
    assert found.startswith(f"{module}:") and caught in found


def test_the_simulation_replaces_the_world_in_eleven_modules_only():
    """``tests/sim/patches.py`` patched 26 modules before the seams (every module holding a
    clock, a crash point, the session factory...); eleven now, each a seam named above or the
    world's store (its opener in ``wal.stores``, its scheme in the one table of schemes,
    ``wal.schemes``), disk, task context and seal spy."""
    import types

    from tests.sim.patches import Patches

    patches = Patches().install()
    try:
        patched = {owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
                   for owner, _name, _value in patches._undo}
    finally:
        patches.undo()
    assert patched == {"wal.clock", "wal.crashpoints", "recovery.cql.connection", "recovery.cql.table",
                       "sinks.worker.source", "wal.seal", "wal.stores", "wal.schemes", "wal.files",
                       "wal.segment", "wal.log"}
