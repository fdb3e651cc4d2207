"""Imported at the start of every Python process whose ``PYTHONPATH`` has this folder: the
processes of Spark's Python workers that the tests start (``tests/helpers/spark_session.py``).

Spark puts its own ``pyspark.zip`` and py4j zip first on a worker's ``PYTHONPATH``. They hold
the same files as the venv's pyspark (the zip is inside that pyspark), but a zip holds no
compiled bytecode, so every worker daemon compiled pyspark anew: about a second a process,
four processes at each query's first batch. This moves the two zips after the venv, when the
venv's pyspark is the zip's own, so that they are imported from the venv and its bytecode.

And a worker daemon (``python -m pyspark.daemon``, which forks every worker of one worker
module: the tasks' ``write()``, each batch's ``commit()``) imports the sink's worker modules
before it forks, so that each forked worker has them already: 0.56 CPU-seconds a worker
measured here, some five hundred workers a suite run. Equivalent for the code under test: a
worker starts from a copy of the daemon's freshly imported modules, as it would from its own
imports (none of them reads its process id, starts a thread or caches a clock at import);
outside the tests each worker imports them itself."""

import os
import sys


def _zip_after_venv() -> None:
    zips = [p for p in sys.path if p.endswith(".zip")
            and os.path.basename(p).startswith(("pyspark.zip", "py4j-"))]
    for path in zips:
        # <venv>/lib/python3.X/site-packages/pyspark/python/lib/pyspark.zip: the venv's own.
        site_packages = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.dirname(path))))
        if site_packages not in sys.path:
            return
    for path in zips:
        sys.path.remove(path)
        sys.path.append(path)


def _is_worker_daemon() -> bool:
    argv = getattr(sys, "orig_argv", [])
    return any(arg == "-m" and argv[i + 1:i + 2] == ["pyspark.daemon"]
               for i, arg in enumerate(argv))


def _preload_in_daemon() -> None:
    if not _is_worker_daemon():
        return
    try:
        import pyarrow  # noqa: F401
        import sinks.source  # noqa: F401
    except Exception:  # noqa: BLE001 - a worker then imports them itself, and fails there
        pass


_zip_after_venv()
_preload_in_daemon()
