"""Imported at the start of every Python process whose ``PYTHONPATH`` has this folder: the
processes of Spark's Python workers that the tests start (``tests/helpers/spark_session.py``).

Spark puts its own ``pyspark.zip`` and py4j zip first on a worker's ``PYTHONPATH``. They hold
the same files as the venv's pyspark (the zip is inside that pyspark), but a zip holds no
compiled bytecode, so every worker daemon compiled pyspark anew: about a second a process,
four processes at each query's first batch. This moves the two zips after the venv, when the
venv's pyspark is the zip's own, so that they are imported from the venv and its bytecode."""

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


_zip_after_venv()
