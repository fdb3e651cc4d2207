"""The local SparkSession the tests and their programs start: on 127.0.0.1 only (a machine
shared with other runs must not see them), no UI, two shuffle partitions, the JVM that starts
fast on a small machine where asked.

Programs that run as processes of their own (the crash driver, the cluster driver, the stop-
and-exit script) put the repository on ``sys.path`` to import this, as they import the sink
through the venv's editable install."""

from __future__ import annotations

#: The C1 compiler only and a serial GC: a JVM that starts several times cheaper on a small,
#: busy machine (each crash case starts Spark two or three times).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def local_builder(app_name: str, master: str = "local[2]", *, fast_jvm: bool = False):
    """``SparkSession.builder`` with the settings every test session shares; the caller adds
    its own ``.config(...)`` and calls ``getOrCreate()``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder
               .master(master)
               .appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2"))
    if fast_jvm:
        builder = builder.config("spark.driver.extraJavaOptions", FAST_JVM)
    return builder
