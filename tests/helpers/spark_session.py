"""The local SparkSession the tests and their programs start: on 127.0.0.1 only (a machine
shared with other runs must not see them), no UI, two shuffle partitions, the JVM that starts
fast on a small machine where asked.

The suite starts Spark some seventy times (each crash case two or three times), so two things
make each start cheaper, neither of which changes what runs:

* **A class archive** (JDK class-data sharing, ``-XX:SharedArchiveFile``): the classes a driver
  loads, dumped once per checkout by :func:`make_class_archive` (``tests/conftest.py`` calls it
  when a run has integration tests and no archive yet) and mapped by every driver JVM that
  ``spark-submit`` starts (``SPARK_SUBMIT_OPTS``, :func:`spark_environment`). A JVM that cannot
  use it (another JDK, a moved venv, another pyspark) starts without it (``-Xshare:auto``).
* **Spark's Python workers import pyspark from the venv, not from Spark's own zip**
  (``worker_site/sitecustomize.py``, on the ``PYTHONPATH`` that :func:`spark_environment`
  gives the processes that start Spark): the zip holds the same files as the venv's pyspark
  but no compiled bytecode, so each worker daemon compiled pyspark again, about a second each.

``bench/spark_start.py`` measures both.

Programs that run as processes of their own (the crash driver, the cluster driver, the stop-
and-exit script) put the repository on ``sys.path`` to import this, as they import the sink
through the venv's editable install."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The C1 compiler only and a serial GC: a JVM that starts several times cheaper on a small,
#: busy machine (each crash case starts Spark two or three times). Every test session's
#: driver JVM runs so unless a caller asks otherwise; the Cassandra nodes likewise
#: (``tests/helpers/node.py``).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Where the class archives live, one per pyspark version, JDK and venv.
ARCHIVE_DIR = REPO / ".cache" / "spark-class-archive"

#: The folder whose ``sitecustomize.py`` puts Spark's zip after the venv on a worker's path.
WORKER_SITE = Path(__file__).resolve().parent / "worker_site"


def _java_home() -> str:
    return os.environ.get("JAVA_HOME", "")


def class_archive() -> Path:
    """The class archive for this pyspark, JDK and venv (it may not exist yet)."""
    import pyspark

    key = "\n".join([pyspark.__version__, os.path.realpath(_java_home() or "java"),
                     os.path.realpath(sys.prefix)])
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return ARCHIVE_DIR / f"spark-{pyspark.__version__}-{digest}.jsa"


def spark_environment(env: dict | None = None) -> dict:
    """``env`` (default: this process's) for a process that starts Spark: :data:`WORKER_SITE`
    first on ``PYTHONPATH`` (the JVM passes it on to the Python workers) and the class archive,
    if there is one, in ``SPARK_SUBMIT_OPTS`` (the options ``spark-submit`` gives the driver
    JVM it starts, whoever builds the session: the tests, their programs, the example)."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(WORKER_SITE) not in paths:
        env["PYTHONPATH"] = os.pathsep.join([str(WORKER_SITE)] + paths)
    archive = class_archive()
    options = env.get("SPARK_SUBMIT_OPTS", "")
    if archive.exists() and "-XX:SharedArchiveFile=" not in options:
        env["SPARK_SUBMIT_OPTS"] = " ".join(
            filter(None, [options, f"-XX:SharedArchiveFile={archive}", "-Xshare:auto"]))
    return env


def local_builder(app_name: str, master: str = "local[2]", *, fast_jvm: bool = True):
    """``SparkSession.builder`` with the settings every test session shares; the caller adds
    its own ``.config(...)`` and calls ``getOrCreate()``."""
    from pyspark.sql import SparkSession

    os.environ.update(spark_environment())
    builder = (SparkSession.builder
               .master(master)
               .appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2"))
    if fast_jvm:     # the executors' too, where a local-cluster master has some
        builder = (builder.config("spark.driver.extraJavaOptions", FAST_JVM)
                   .config("spark.executor.extraJavaOptions", FAST_JVM))
    return builder


def make_class_archive(timeout: float = 300) -> Path | None:
    """Dump the class archive (:func:`class_archive`) if there is none: a short Spark run in a
    process of its own (a batch read, a streaming query, a Python data source) whose JVM
    writes the classes it loaded at exit. Returns the archive, or None if it could not be
    made (the tests then start Spark without it, only slower)."""
    archive = class_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    # One maker at a time (two test processes may both start): the other waits, then finds it.
    with open(archive.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        return _dump_class_archive(archive, timeout)


def _dump_class_archive(archive: Path, timeout: float) -> Path | None:
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = spark_environment()
    env.pop("SPARK_SUBMIT_OPTS", None)      # an archive of another JDK or venv: none at all
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    try:
        subprocess.run([sys.executable, "-m", "tests.helpers.spark_class_archive", str(partial)],
                       cwd=str(REPO), env=env, timeout=timeout, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(partial, archive)
    except (OSError, subprocess.SubprocessError):
        partial.unlink(missing_ok=True)
        return None
    return archive
