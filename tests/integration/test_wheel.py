"""The package as users get it: a wheel, installed into a clean venv on the lowest PySpark
pyproject.toml accepts, outside the source tree.

* The wheel is built by the standard front end (``python -m build --wheel``, isolated build
  env) from a copy of the tree's packaging files in a temp dir: nothing is written into the
  repository (no ``build/``, no new ``*.egg-info``).
* Its contents: every module of every package pyproject.toml lists, the declared package
  data (``wal/FORMAT.md``), the ``cassandra-wal`` entry point, and nothing else at the top.
* A clean venv (``python -m venv``) gets the oldest PySpark supported first, then the wheel with its
  dependencies from PyPI (pip's cache keeps reruns short). A tiny program run by that venv's
  python from a temp working dir (so the repository is not on ``sys.path``) streams JSON
  files through ``cassandra_wal`` into the real Cassandra node; this test's own driver
  session then finds every row. ``cassandra-wal --version`` and ``inspect`` run from the venv.

The first run downloads and builds the oldest PySpark supported (an sdist of ~450 MB, ~2 min); later
runs install it from pip's wheel cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from tests.helpers.node import fresh_keyspace, java_home_env

try:
    import tomllib
except ImportError:                 # Python 3.10: build (the test extra) brings tomli
    import tomli as tomllib

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
FILES = 8 * 3      # rows: 3 input files of 8 rows, one micro-batch each
PIP_TIMEOUT = 900


def oldest_pyspark() -> str:
    """The lowest PySpark the package accepts: ``X`` of ``pyspark>=X`` in its dependencies."""
    (spec,) = [d for d in PROJECT["dependencies"] if re.match(r"pyspark\b", d)]
    match = re.search(r">=\s*([0-9][^,;\s]*)", spec)
    assert match, f"pyproject.toml: {spec!r} has no lower bound"
    return match.group(1)


def package_patterns() -> list[str]:
    return PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]


def source_packages(root: Path) -> list[str]:
    """The packages under ``root`` that pyproject's include patterns pick, as dotted names."""
    import fnmatch

    found = []
    for init in sorted(root.rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(root).parts)
        if name and any(fnmatch.fnmatchcase(name, pat) for pat in package_patterns()):
            found.append(name)
    return found


def run(cmd, *, timeout, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    assert done.returncode == 0, (f"{' '.join(map(str, cmd))} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}")
    return done


def clean_env(**extra: str) -> dict:
    """The environment without anything that would put the repository on ``sys.path``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    if not env.get("JAVA_HOME"):
        env.update(java_home_env())
    env.update(extra)
    return env


# ------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python -m build --wheel`` on a copy of what the wheel is made of."""
    repo_before = sorted(p.name for p in REPO.iterdir())
    src = tmp_path_factory.mktemp("wheel-src")
    for name in ("pyproject.toml", PROJECT["readme"]):
        shutil.copy2(REPO / name, src / name)
    tops = {pkg.split(".")[0] for pkg in source_packages(REPO)}
    for top in tops:
        shutil.copytree(REPO / top, src / top,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", out, src],
        timeout=PIP_TIMEOUT, cwd=src, env=clean_env())
    assert sorted(p.name for p in REPO.iterdir()) == repo_before, \
        "building the wheel wrote into the repository"
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A clean venv: the oldest PySpark supported first, then the wheel and its dependencies."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", root], timeout=120)
    py = root / "bin" / "python"
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    env = clean_env()
    run([*pip, f"pyspark=={oldest_pyspark()}"], timeout=PIP_TIMEOUT, env=env, cwd=root)
    run([*pip, wheel], timeout=PIP_TIMEOUT, env=env, cwd=root)
    return root


# ------------------------------------------------------------------------------- the wheel
def test_the_wheel_holds_every_package_and_its_data(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        (info,) = dist_info
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
        metadata = zf.read(f"{info}/METADATA").decode()

    packages = source_packages(REPO)
    assert {"wal", "recovery", "recovery.cql", "recovery.cli", "sinks"} <= set(packages)
    for pkg in packages:
        folder = REPO.joinpath(*pkg.split("."))
        for module in sorted(folder.glob("*.py")):
            arc = "/".join([*pkg.split("."), module.name])
            assert arc in names, f"{arc} is not in {wheel.name}"
    for pkg, patterns in PYPROJECT["tool"]["setuptools"].get("package-data", {}).items():
        for pattern in patterns:
            for data in REPO.joinpath(*pkg.split(".")).glob(pattern):
                arc = "/".join([*pkg.split("."), data.name])
                assert arc in names, f"package data {arc} is not in {wheel.name}"
    assert "wal/FORMAT.md" in names

    # Nothing but the three packages at the top: no tests, bench, examples or scripts, and no
    # name of our own that another distribution may install too (an old PyPI client installs
    # a top-level ``cql``).
    tops = {n.split("/")[0] for n in names} - dist_info
    assert tops == {"wal", "recovery", "sinks"}

    assert re.search(r"^cassandra-wal\s*=\s*recovery\.cli\.main:main$", entry_points, re.M)
    requires = re.findall(r"^Requires-Dist: (pyspark[^;\n]*)$", metadata, re.M)
    assert requires and all(f">={oldest_pyspark()}" in r for r in requires), requires


# ------------------------------------------------------------------------------- installed
PROGRAM = """\
import json, os, sys, time
from pathlib import Path

from pyspark.sql import SparkSession
import pyspark
import sinks

work = Path(sys.argv[1])
host, port, keyspace = os.environ["CASSANDRA_HOST"], os.environ["CASSANDRA_PORT"], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").appName("wheel-test")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
sinks.register(spark)
rows = (spark.readStream.schema("id INT, name STRING, amount DOUBLE, at TIMESTAMP")
        .option("maxFilesPerTrigger", 1).json(str(work / "landing")))
query = (rows.writeStream.format("cassandra_wal")
         .option("keyspace", keyspace).option("table", "events")
         .option("spark.cassandra.connection.host", host)
         .option("spark.cassandra.connection.port", port)
         .option("checkpointLocation", str(work / "checkpoint"))
         .trigger(availableNow=True).start())
query.awaitTermination(300)
sinks.wait_flushed(query, timeout=120)
batches = query.lastProgress["batchId"] + 1 if query.lastProgress else 0
print(json.dumps({"pyspark": pyspark.__version__, "sinks": sinks.__file__,
                  "sys_path": sys.path, "batches": batches}))
spark.stop()
"""


def write_landing(folder: Path) -> list[tuple]:
    """3 JSON files of 8 rows, oldest first (the file source takes them in mtime order)."""
    folder.mkdir(parents=True)
    expected = []
    for k in range(FILES // 8):
        lines = []
        for i in range(k * 8, k * 8 + 8):
            lines.append(json.dumps({"id": i, "name": f"row-{i}", "amount": i * 1.5,
                                     "at": f"2026-11-25T10:{i:02d}:00Z"}))
            expected.append((i, f"row-{i}", i * 1.5))
        path = folder / f"part-{k}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + k, 1_700_000_000 + k))
    return expected


@pytest.fixture(scope="module")
def streamed(venv, tmp_path_factory, cql, cassandra_node):
    """The program's stream, run once by the venv's python from a temp dir; its output."""
    with fresh_keyspace(cql, prefix="wheel") as keyspace:
        cql.execute(f"CREATE TABLE {keyspace}.events (id int PRIMARY KEY, name text, "
                    "amount double, at timestamp)", timeout=60)
        work = tmp_path_factory.mktemp("wheel-run")
        expected = write_landing(work / "landing")
        (work / "program.py").write_text(PROGRAM)
        py = venv / "bin" / "python"
        env = clean_env(CASSANDRA_HOST=cassandra_node.host, CASSANDRA_PORT=str(cassandra_node.port),
                        PYSPARK_PYTHON=str(py), PYSPARK_DRIVER_PYTHON=str(py))
        started = time.monotonic()
        done = run([py, "program.py", work, keyspace], timeout=600, cwd=work, env=env)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["seconds"] = time.monotonic() - started
        landed = sorted((r.id, r.name, r.amount) for r in
                        cql.execute(f"SELECT id, name, amount FROM {keyspace}.events"))
        yield {"report": report, "expected": expected, "landed": landed,
               "wal": work / "checkpoint" / "cassandra_wal", "env": env}


def test_the_oldest_pyspark_supported_runs_the_installed_package(streamed, venv):
    report = streamed["report"]
    assert report["pyspark"] == oldest_pyspark()
    assert Path(report["sinks"]).resolve().is_relative_to(venv.resolve()), report["sinks"]
    assert not any(Path(p).resolve() == REPO for p in report["sys_path"] if p), report["sys_path"]
    assert report["batches"] == FILES // 8


def test_every_row_landed(streamed):
    assert streamed["landed"] == streamed["expected"]


def test_version_from_the_installed_console_script(venv, tmp_path):
    done = run([venv / "bin" / "cassandra-wal", "--version"], timeout=60, cwd=tmp_path,
               env=clean_env())
    assert done.stdout == f"cassandra-wal {PROJECT['version']}\n"


def test_inspect_from_the_installed_console_script(venv, streamed, tmp_path):
    done = run([venv / "bin" / "cassandra-wal", "inspect", streamed["wal"], "--json"],
               timeout=120, cwd=tmp_path, env=clean_env())
    report = json.loads(done.stdout)
    batches = report["batches"]
    assert [b["batch"] for b in batches] == list(range(FILES // 8))
    assert {b["state"] for b in batches} == {"flushed"}
    assert sum(b["rows"] for b in batches) == FILES
    assert {b["action"] for b in batches} == {"nothing"}


def imported_modules(stderr: str) -> set[str]:
    """Module names from a ``PYTHONPROFILEIMPORTTIME=1`` run's stderr, with their top-level
    packages' (``recovery.cli.main`` gives it, ``recovery.cli`` and ``recovery``)."""
    names = {line.rsplit("|", 1)[-1].strip()
             for line in stderr.splitlines() if line.startswith("import time:")}
    return names | {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 1)}


def test_the_read_only_tools_run_without_spark(venv, streamed, tmp_path):
    """``inspect``, ``dump`` and ``verify`` of the installed package, run to the end, import
    neither pyspark nor py4j (``test_architecture`` checks importing ``recovery.cli.main``; this checks
    the commands' own runs, lazy imports included)."""
    cli, wal = venv / "bin" / "cassandra-wal", streamed["wal"]
    env = clean_env(PYTHONPROFILEIMPORTTIME="1")
    dumped = []
    for args in (["inspect", wal], ["verify", wal],
                 *(["dump", wal, "--batch", str(b)] for b in range(FILES // 8))):
        done = run([cli, *args], timeout=120, cwd=tmp_path, env=env)
        modules = imported_modules(done.stderr)
        assert "wal" in modules and "recovery.cli" in modules      # the probe sees our imports
        assert not modules & {"pyspark", "py4j"}, f"cassandra-wal {args[0]} imported Spark"
        if args[0] == "dump":
            dumped += [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["id"] for r in dumped) == list(range(FILES))
