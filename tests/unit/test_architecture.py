"""The floors (docs/architecture.md): wal <- recovery (its Cassandra floor ``recovery.cql``
at its bottom, the offline tool ``recovery.cli`` at its top) <- sinks, each importing only
from those below it, no import cycles, no import of the project's own modules
deferred into a function (which is how a cycle hides) but the few that keep Spark's one-shot
Python workers light, and every method the data source gives Spark saying where it runs. The
import contracts are import-linter's, in pyproject.toml; its graph includes imports inside
functions, so the deferred ones obey the floors too."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.planted_tree import PACKAGES

try:
    import tomllib
except ImportError:                 # Python 3.10: build (the test extra) brings tomli
    import tomli as tomllib

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of ``root``/pyproject.toml over the packages under ``root``."""
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                           "lint_imports_command()", "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "250"})


def probe_output(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter on this tree (stripped); it must exit 0."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_import_contracts_are_kept():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


PLANTS = [
    ("wal/format.py", "import recovery.errors", "Floors"),
    ("wal/format.py", "import cassandra.query", "The log on disk knows neither Spark nor Cassandra"),
    ("recovery/cql/config.py", "import wal.format", "The Cassandra floor knows neither Spark nor the WAL"),
    ("recovery/cql/table.py", "import recovery.target", "Inside recovery"),
    ("recovery/replay.py", "import recovery.cli.render", "Inside recovery"),
    ("sinks/driver/wait.py", "import recovery.cli.render", "The offline tool is the top floor's"),
    ("recovery/config.py", "import pyspark", "The flusher imports no Spark"),
    ("sinks/worker/options.py", "import sinks.worker.plan", "No import cycles"),
    ("sinks/worker/plan.py", "import sinks.driver.registry", "Spark's Python workers load nothing"),
]


def test_every_contract_has_a_planted_violation():
    """A contract added to pyproject.toml without a violation planted below fails here."""
    with open(REPO / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    planted = {contract for _, _, contract in PLANTS}
    assert [c["name"] for c in contracts
            if not any(c["name"].startswith(p) for p in planted)] == []


@pytest.mark.parametrize("module, bad_import, contract", PLANTS)
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
    broken = [line for line in result.stdout.splitlines()
              if line.endswith("BROKEN") or " BROKEN (" in line]    # "(2 ignored imports)"
    assert any(line.startswith(contract) for line in broken), result.stdout


#: The only imports of the project's own modules that wait for a call, and why: a stream's
#: commit worker (twice a micro-batch) must not load the flusher, recovery's writers and the
#: cassandra-driver's cluster module, which only a batch job's commit needs (about 90 ms a
#: worker: test_one_shot_workers_import_no_flusher_and_no_cassandra_driver_cluster).
OWN_DEFERRED = {("sinks/worker/source.py", "commit", "sinks.worker.batch_jobs"),
                ("sinks/worker/source.py", "abort", "sinks.worker.batch_jobs"),
                # A store's client (boto3, an HTTP client) only where a location names it.
                ("wal/stores.py", "_open_remote", "wal.s3"),
                ("wal/stores.py", "_open_remote", "wal.webhdfs")}
#: Third-party modules that may be imported on first use, for the same reason.
HEAVY_THIRD_PARTY = ("cassandra.cluster", "cassandra.connection", "cassandra.protocol",
                     "cassandra.query", "cassandra.auth", "cassandra.policies",
                     "cassandra.concurrent", "ssl",
                     "boto3", "botocore.config",     # a store's client: wal/stores.py
                     # an optional extra, only where wal.metrics.port asks for it
                     "prometheus_client", "prometheus_client.core")


def _deferred_imports(path: Path, package: str = "") -> list[tuple[str, str, str]]:
    """``(file, function, module)`` of every import inside a function of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                modules = [base]
            else:
                continue
            found += [(str(path.relative_to(REPO)), func.name, m) for m in modules]
    return sorted(set(found))


def _all_deferred() -> list[tuple[str, str, str]]:
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            # the package a relative import starts from (a module's, or an __init__'s own)
            package = ".".join(path.relative_to(REPO).parts[:-1])
            out += _deferred_imports(path, package)
    return out


def test_no_own_module_is_imported_in_a_function_but_the_listed_few():
    own = {d for d in _all_deferred() if d[2].split(".")[0] in PACKAGES}
    assert own == OWN_DEFERRED


def test_third_party_imports_wait_only_for_the_heavy_modules():
    third = [d for d in _all_deferred() if d[2].split(".")[0] not in PACKAGES]
    assert [d for d in third if d[2] not in HEAVY_THIRD_PARTY] == []


def test_a_deferred_import_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from wal import layout\n    return layout\n\n"
                      "class C:\n    def g(self):\n        from .x import y\n")
    assert _deferred_imports(module, "pkg") == [("m.py", "f", "wal"), ("m.py", "g", "pkg.x")]


def test_sinks_loads_only_the_driver_sides_public_functions_on_first_use():
    """``import sinks`` (what every Spark worker does) loads :mod:`sinks.worker` only; the
    public functions of :mod:`sinks.driver` are the package's only attributes loaded on first
    use (PEP 562), each the driver side's own, and a name neither has is an AttributeError."""
    probe = ("import sys, sinks\n"
             "before = sorted(m for m in sys.modules if m.startswith('sinks.driver'))\n"
             "import sinks.driver as driver\n"
             "same = [getattr(sinks, n) is getattr(driver, n) for n in sinks.DRIVER_SIDE]\n"
             "listed = set(sinks.DRIVER_SIDE) <= set(dir(sinks)) & set(sinks.__all__)\n"
             "try:\n    sinks.no_such_name\nexcept AttributeError as e:\n    missing = str(e)\n"
             "print(before, sinks.DRIVER_SIDE, same, listed, missing)")
    assert probe_output(probe) == ("[] ('register', 'wait_flushed', 'status', 'recover') "
                                  "[True, True, True, True] True "
                                  "module 'sinks' has no attribute 'no_such_name'")


@pytest.mark.parametrize("base", ["sinks.worker.source:CassandraWalDataSource",
                                  "sinks.worker.connect_source:ConnectCassandraWalDataSource"])
def test_a_worker_unpickling_the_registered_data_source_loads_nothing_of_the_driver_side(base):
    """The class ``sinks.register`` bakes (for a classic session, and for Spark Connect,
    whose server workers unpickle it), pickled as Spark pickles it and unpickled in a fresh
    process as a one-shot worker does. (Until the Connect class moved to the workers' half,
    each server worker loaded the registry, the flusher and cassandra-driver's cluster
    module with it: the review of the split.)"""
    module, name = base.split(":")
    maker = (f"import importlib, sys\nfrom pyspark import cloudpickle\n"
             f"base = getattr(importlib.import_module({module!r}), {name!r})\n"
             "source = type('CassandraWalDataSource', (base,), {'session_conf': {}, "
             "'__module__': 'sinks', '__qualname__': 'CassandraWalDataSource<registered>'})\n"
             "sys.stdout.buffer.write(cloudpickle.dumps(source))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pickled = subprocess.run([sys.executable, "-c", maker], cwd=REPO, capture_output=True,
                             timeout=120, env=env)
    assert pickled.returncode == 0, pickled.stderr.decode()
    probe = ("import pickle, sys\npickle.loads(sys.stdin.buffer.read())\n"
             "print([m for m in sys.modules if m.startswith(('sinks.driver', "
             "'recovery.flusher', 'cassandra.cluster'))])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, input=pickled.stdout,
                         capture_output=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "[]"


def test_the_flush_task_loads_nothing_of_the_driver_side():
    """An executor's Python worker unpickling a flush job's task loads
    :mod:`sinks.worker.flush_task` (with ``sinks``), never :mod:`sinks.driver`. (Until the
    task had a module of its own, it lived beside the job's launcher, which brought the
    Spark Connect side, ``sinks.driver.connect``, into every executor.)"""
    probe = ("import sys, sinks.worker.flush_task\n"
             "print([m for m in sys.modules if m.startswith(('sinks.driver', 'recovery.flusher'))])")
    assert probe_output(probe) == "[]"


def test_one_shot_workers_import_no_flusher_and_no_cassandra_driver_cluster():
    """What a Python worker loads to unpickle the data source and prepare or commit a batch:
    none of the driver side. (After the floors were first built, ``import sinks`` loaded all
    of it: 150 ms a worker instead of 60, two workers a micro-batch.)"""
    heavy = ["cassandra.cluster", "cassandra.connection", "cassandra.query",
             "cassandra.concurrent", "cassandra.protocol", "recovery.flusher",
             "recovery.executors", "recovery.processes", "recovery.output", "recovery.batch_jobs",
             "recovery.cql.upsert", "recovery.cql.encode", "sinks.driver", "sinks.worker.batch_jobs",
             "wal.s3", "wal.webhdfs", "boto3", "botocore", "urllib.request"]
    probe = ("import sys, sinks, sinks.worker.source, sinks.worker.plan\n"
             f"print([m for m in {heavy!r} if m in sys.modules])")
    assert probe_output(probe) == "[]"


def _spark_facing_methods():
    """Every method Spark (or its listener bus) calls on the sink's objects."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
    )
    from pyspark.sql.streaming import StreamingQueryListener

    import sinks
    from sinks.driver.listener import CassandraWalListener
    from sinks.worker import source

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
    yield "sinks.status", sinks.status
    yield "CassandraWalWriter.__call__", sinks.CassandraWalWriter.__call__


@pytest.mark.parametrize("name, method", list(_spark_facing_methods()),
                         ids=[n for n, _ in _spark_facing_methods()])
def test_each_spark_facing_method_says_where_it_runs(name, method):
    doc = method.__doc__ or ""     # its own: inspect.getdoc would take pyspark's
    assert "Runs:" in doc, f"{name}: its docstring does not say where it runs ('Runs: ...')"


def test_the_read_only_tools_load_no_cassandra_cluster_module():
    """``cassandra-wal inspect|dump|verify`` read files: they start without cassandra-driver's
    cluster module (which needs an event loop implementation to even import)."""
    probe = ("import sys, recovery.cli.main\n"
             "print([m for m in ('cassandra.cluster', 'cassandra.connection', 'pyspark')"
             " if m in sys.modules])")
    assert probe_output(probe) == "[]"


def test_cassandra_drivers_exit_hooks_are_registered_before_the_flushers():
    """atexit runs the last registered first; the flushers' last drains (sinks.driver.registry's
    exit hook, registered with the first registry) must run before cassandra-driver stops
    its event loop at exit, or they wait forever for answers. cassandra-driver registers its hooks
    when cassandra.cluster is first imported: importing the registry must do that. (When the
    cassandra-driver's cluster module was loaded on first use only, a script that stopped its query
    and exited hung: tests/integration/test_outage.py.)"""
    probe = "import sys, sinks.driver.registry\nprint('cassandra.cluster' in sys.modules)"
    assert probe_output(probe) == "True"


def test_the_cassandra_floor_loads_without_the_rest_of_recovery():
    """``recovery/__init__.py`` imports nothing: the Cassandra floor, now inside ``recovery``
    (issue 36), still loads alone, as a top-level ``cql`` did."""
    probe = ("import sys, recovery.cql.table, recovery.cql.upsert\n"
             "print(sorted(m for m in sys.modules if m.startswith('recovery')"
             " and not m.startswith('recovery.cql') and m != 'recovery'))")
    assert probe_output(probe) == "[]"
