"""The floors (docs/architecture.md): wal <- cql <- recovery <- sinks | cli, each package
importing only from those below it, no import cycles, no imports deferred into functions
(which is how a cycle hides), and every method the data source gives Spark saying where it
runs. The import contracts are import-linter's, in pyproject.toml."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("wal", "cql", "recovery", "sinks", "cli")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of ``root``/pyproject.toml over the packages under ``root``."""
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                           "lint_imports_command()", "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "250"})


def test_the_import_contracts_are_kept():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, bad_import, contract", [
    ("wal/format.py", "import recovery.errors", "Floors"),
    ("cql/config.py", "import wal.format", "The Cassandra floor knows neither Spark nor the WAL"),
    ("recovery/config.py", "import pyspark", "The flusher imports no Spark"),
    ("sinks/options.py", "import sinks.plan", "No import cycles"),
])
def test_a_broken_floor_is_caught(tmp_path, module, bad_import, contract):
    """The contracts can fail: each kind of violation, planted in a copy of the packages."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / module
    planted.write_text(planted.read_text() + f"\n{bad_import}  # planted by the test\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), result.stdout


def _deferred_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    return [f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top]


def test_no_import_is_deferred_into_a_function():
    found = [hit for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             for hit in _deferred_imports(path)]
    assert found == []


def test_a_deferred_import_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from wal import layout\n    return layout\n")
    assert _deferred_imports(module) == ["m.py:4: from wal import layout"]


def _spark_facing_methods():
    """Every method Spark (or its listener bus) calls on the sink's objects."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter,
                                        DataSourceStreamArrowWriter)
    from pyspark.sql.streaming import StreamingQueryListener

    import sinks
    from sinks import source
    from sinks.listener import CassandraWalListener

    bases = {source.CassandraWalDataSource: DataSource,
             source.CassandraWalStreamWriter: DataSourceStreamArrowWriter,
             source.CassandraWalBatchWriter: DataSourceArrowWriter,
             CassandraWalListener: StreamingQueryListener}
    for cls, base in bases.items():
        for name, member in vars(cls).items():
            member = getattr(member, "__func__", member)     # a classmethod's function
            if callable(member) and not name.startswith("_") and hasattr(base, name):
                yield f"{cls.__name__}.{name}", member
    yield "sinks.register", sinks.register
    yield "sinks.wait_flushed", sinks.wait_flushed
    yield "CassandraWalWriter.__call__", sinks.CassandraWalWriter.__call__


@pytest.mark.parametrize("name, method", list(_spark_facing_methods()),
                         ids=[n for n, _ in _spark_facing_methods()])
def test_each_spark_facing_method_says_where_it_runs(name, method):
    doc = method.__doc__ or ""     # its own: inspect.getdoc would take pyspark's
    assert "Runs:" in doc, f"{name}: its docstring does not say where it runs ('Runs: ...')"
