"""The suite's own layout: shared fakes and builders live in ``tests/helpers/``.

A test module that imports another test module runs that module's fixtures and module-level
state in a place nobody looks for them (a global list of writes cleared by a fixture the
importer never gets), and makes the two modules move together. Every shared fake belongs in
``tests/helpers/``; this test fails when a test module imports another one again.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

TESTS = pathlib.Path(__file__).resolve().parents[1]


def suite_modules() -> list[pathlib.Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if ".venv" not in p.parts)


def imported_modules(source: str, path: pathlib.Path) -> set[str]:
    """Every module the source of ``path`` imports, as dotted names (``from x import y``
    gives both ``x`` and ``x.y``: ``y`` may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "") if node.level == 0 else _relative(path, node.module,
                                                                         node.level)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _relative(path: pathlib.Path, module: str | None, level: int) -> str:
    package = path.parent
    for _ in range(level - 1):
        package = package.parent
    prefix = ".".join(package.relative_to(TESTS.parent).parts)
    return f"{prefix}.{module}" if module else prefix


def is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")


def test_no_test_module_imports_another_test_module():
    offenders = {}
    for path in suite_modules():
        names = sorted(n for n in imported_modules(path.read_text(), path) if is_test_module(n))
        if names:
            offenders[str(path.relative_to(TESTS.parent))] = names
    assert not offenders, (
        "test modules importing other test modules (move what they share to tests/helpers/): "
        f"{offenders}")


def test_the_check_sees_every_spelling_of_an_import_of_a_test_module():
    source = ("from tests.unit.test_upsert import chunk\n"
              "import tests.unit.test_lists\n"
              "from .test_health import flusher_on\n"
              "from . import test_wait_flushed\n"
              "from tests.helpers.walfactory import WalFactory\n")
    names = imported_modules(source, TESTS / "unit" / "test_probe.py")
    assert {n for n in names if is_test_module(n)} == {
        "tests.unit.test_upsert", "tests.unit.test_lists", "tests.unit.test_health",
        "tests.unit.test_wait_flushed"}


def own_server_modules() -> list[str]:
    """The modules ``scripts/test`` runs in its second process, after the unit tests."""
    script = (TESTS.parent / "scripts" / "test").read_text()
    listed = script.split("own_servers=(", 1)[1].split(")", 1)[0]
    return listed.split()


def test_the_modules_run_beside_the_unit_tests_are_integration_modules_that_exist():
    # A module renamed or gone would leave the list naming nothing (pytest then errors out), and
    # a module not marked integration would run twice (its --ignore does nothing in a -m run).
    modules = own_server_modules()
    assert len(modules) >= 3, modules
    for name in modules:
        path = TESTS.parent / name
        assert path.is_file(), name
        assert "pytestmark = pytest.mark.integration" in path.read_text(), name


def test_every_module_under_tests_unit_marks_its_tests_unit():
    """``-m unit`` runs what tests/unit holds: a module that forgets ``pytestmark`` is left
    out of every run that selects by marker (test_seams.py was, and failed unseen)."""
    unmarked = [p.name for p in sorted((TESTS / "unit").glob("test_*.py"))
                if "pytestmark = pytest.mark.unit" not in p.read_text()]
    assert unmarked == []


#: Words that name one thing each (issue 36): a module of ours imported under one of them
#: would make the word mean a module too (``driver`` was an alias of three modules: the flush
#: registry, ``wait_flushed``'s module and recovery's output).
RESERVED_ALIASES = {"driver", "log", "jobs", "floor"}


def test_no_module_of_ours_is_imported_under_a_word_that_names_something_else():
    """(A module may keep its own name: ``import recovery.batch_jobs as batch_jobs``.)"""
    found = []
    for path in suite_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{path.relative_to(TESTS.parent)}:{node.lineno}: as {a.asname}"
                          for a in node.names if a.asname in RESERVED_ALIASES
                          and a.asname != a.name.rsplit(".", 1)[-1]]   # its own name
    assert not found, found
