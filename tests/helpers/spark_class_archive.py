"""``python -m tests.helpers.spark_class_archive OUT``: a short Spark run whose driver JVM
writes the classes it loaded to ``OUT`` at exit (``-XX:ArchiveClassesAtExit``), the class
archive that ``tests/helpers/spark_session.py`` gives later test sessions. It runs what the
tests' drivers run: a JSON read, a streaming query over JSON files, a Python data source's
batch and streaming writes."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.helpers.spark_session import FAST_JVM, local_builder


def nothing_source():
    """A Python data source, ``nothing``, whose batch and streaming writers take every row and
    write nothing (defined in a function: Spark's workers get it by value, importing nothing)."""
    from pyspark.sql.datasource import (DataSource, DataSourceStreamWriter, DataSourceWriter,
                                        WriterCommitMessage)

    class Writer(DataSourceWriter, DataSourceStreamWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId=None):
            pass

        def abort(self, messages, batchId=None):
            pass

    class Nothing(DataSource):
        @classmethod
        def name(cls):
            return "nothing"

        def writer(self, schema, overwrite):
            return Writer()

        def streamWriter(self, schema, overwrite):
            return Writer()

    return Nothing


def main(out: str) -> int:
    spark = (local_builder("cassandra-wal-class-archive")
             .config("spark.driver.extraJavaOptions", f"{FAST_JVM} -XX:ArchiveClassesAtExit={out}")
             .getOrCreate())
    spark.dataSource.register(nothing_source())
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "in"
        data.mkdir()
        (data / "a.json").write_text('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')
        spark.read.json(str(data)).write.format("nothing").mode("append").save()
        query = (spark.readStream.schema("id INT, v STRING").json(str(data))
                 .writeStream.format("nothing").trigger(availableNow=True)
                 .option("checkpointLocation", str(Path(folder) / "checkpoint")).start())
        query.awaitTermination(120)
    # The JVM writes the archive as it exits, which is after this process would have: end it
    # here (it exits when its standard input closes) and wait.
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
