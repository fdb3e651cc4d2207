"""Contestant: the DataStax Spark Cassandra Connector's streaming sink, on pyspark 3.5.

Run it through ``bench/scc_env.sh run --spec SPEC.json`` (its own venv: the connector has no
release for Spark 4). The same stream as our sink's: the landing parquet files,
``maxFilesPerTrigger``, trigger ``availableNow``, into
``writeStream.format("org.apache.spark.sql.cassandra")`` with the connector's default write
settings (``concurrent.writes`` 5, grouping by partition, ``batch.size.bytes`` 1024). Timed
from ``start()`` to the end of the query: the connector writes synchronously in each task, so
every row is acknowledged by Cassandra when the last batch commits.

``--resolve-only``: start a session (resolving the jar from Maven Central) and exit.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def session(spec: dict | None):
    from pyspark.sql import SparkSession
    extra = {"spark.jars.packages": os.environ.get(
                 "SCC_PACKAGE", "com.datastax.spark:spark-cassandra-connector_2.12:3.5.1"),
             "spark.jars.ivy": os.environ.get("SCC_IVY", os.path.expanduser("~/.ivy2")),
             "spark.jars.ivySettings": os.environ.get("SCC_IVY_SETTINGS", ""),
             "spark.sql.extensions": "com.datastax.spark.connector.CassandraSparkExtensions"}
    if spec:
        extra["spark.cassandra.connection.host"] = spec["host"]
        extra["spark.cassandra.connection.port"] = str(spec["port"])
        extra["spark.cassandra.output.consistency.level"] = common.consistency(spec)
    return common.spark_session(SparkSession.builder.appName("bench-scc"), spec or {}, extra)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec")
    ap.add_argument("--resolve-only", action="store_true")
    args = ap.parse_args()
    if args.resolve_only:
        spark, _ = session(None)
        spark.stop()
        return
    spec = common.load_spec()
    monitor = common.RssMonitor().start()
    spark, startup_s = session(spec)
    import pyspark
    source = common.stream_source(spark, spec)
    writer = (source.writeStream.format("org.apache.spark.sql.cassandra")
              .option("keyspace", spec["keyspace"]).option("table", spec["table"])
              .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True))
    _, seconds, last = common.run_to_end(writer, spec["checkpoint"])
    batches = last + 1
    rss = monitor.stop()
    spark.stop()
    common.emit({"rows": spec["rows"], "seconds": seconds, "committed_s": seconds,
                 "startup_s": startup_s, "batches": batches, "rss_mb": rss,
                 "peak_rss_mb": rss["driver"], "pyspark": pyspark.__version__,
                 "package": os.environ.get("SCC_PACKAGE")})


if __name__ == "__main__":
    main()
