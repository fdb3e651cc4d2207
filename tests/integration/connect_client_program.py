"""A Spark Connect client that streams into cassandra_wal, run by test_spark_connect.py in a
process of its own (as a user's script would be: its listener and flusher live in it, and its
exit runs the last drain). Prints one JSON line of what it saw.

Usage: connect_client_program.py URL SRC CHECKPOINT HOST PORT KEYSPACE TABLE BATCHES
       connect_client_program.py URL --once SRC CHECKPOINT HOST PORT KEYSPACE TABLE FLUSH
  the second form: one availableNow run, flushing (FLUSH true), flushing from the
  executors (executors), or not (false).
"""

from __future__ import annotations

import json
import logging
import sys
import time

from pyspark.sql import SparkSession

import sinks
from recovery.cql.errors import SinkError


def main() -> None:
    url = sys.argv[1]
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        if sys.argv[2] == "--once":
            run_once(spark, *sys.argv[3:])
        else:
            run(spark, *sys.argv[2:])
    finally:
        # The Connect client's listener thread is not a daemon: without this the process
        # would not exit.
        spark.stop()


def run(spark, src, cp, host, port, keyspace, table, batches) -> None:
    out: dict = {"session": type(spark).__module__}
    registry = sinks.register(spark)
    out["registry"] = type(registry).__name__
    options = {"keyspace": keyspace, "table": table, "checkpointLocation": cp,
               "spark.cassandra.connection.host": host, "spark.cassandra.connection.port": port}
    stream = (spark.readStream.schema("id INT, tag INT, name STRING")
              .option("maxFilesPerTrigger", 1).json(src))
    query = (stream.writeStream.format("cassandra_wal").options(**options)
             .trigger(processingTime="500 milliseconds").start())
    try:
        try:
            registry.track(query, cp + "-not-its-checkpoint")
        except SinkError as exc:
            out["wrong_checkpoint"] = str(exc)
        out["checkpoint"] = registry.track(query, cp)
        deadline = time.monotonic() + 120
        while (query.lastProgress or {}).get("batchId", -1) < int(batches) - 1:
            if time.monotonic() > deadline or not query.isActive:
                raise SystemExit(f"the query did not commit {batches} batches: "
                                 f"{query.exception()}")
            time.sleep(0.3)
        out["flusher_running"] = bool(registry.flushers_of(str(query.runId)))
        sinks.wait_flushed(query, timeout=60)
        out["flushed_while_running"] = True
    finally:
        query.stop()
    sinks.wait_flushed(query, timeout=60)

    # A relative checkpoint: refused on the server before anything is staged.
    bad = (stream.writeStream.format("cassandra_wal")
           .options(**{**options, "checkpointLocation": "relative-cp"}).start())
    try:
        bad.awaitTermination(60)
    except Exception as exc:  # noqa: BLE001 - the query's failure is what is checked
        out["relative_checkpoint"] = next(
            (line for line in str(exc).splitlines() if "OptionError:" in line), str(exc))
    print(json.dumps(out), flush=True)


def run_once(spark, src, cp, host, port, keyspace, table, flush) -> None:
    """One availableNow run; ``flush`` "false": with ``wal.flush=false`` (its batches stay
    pending, as an outage lasting past a restart leaves them); "executors": flushed with
    ``wal.flush.mode=executors`` (jobs through this client's session, run on the server),
    the flush jobs' log lines on stderr."""
    registry = sinks.register(spark)
    options = {"keyspace": keyspace, "table": table, "checkpointLocation": cp,
               "spark.cassandra.connection.host": host,
               "spark.cassandra.connection.port": port,
               "wal.flush": "false" if flush == "false" else "true"}
    if flush == "executors":
        options["wal.flush.mode"] = "executors"
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        logging.getLogger("recovery.executors").setLevel(logging.INFO)
    query = (spark.readStream.schema("id INT, tag INT, name STRING")
             .option("maxFilesPerTrigger", 1).json(src).writeStream.format("cassandra_wal")
             .options(**options).trigger(availableNow=True).start())
    registry.track(query, cp)
    assert query.awaitTermination(120) and query.exception() is None, query.exception()
    if flush != "false":
        sinks.wait_flushed(query, timeout=60)
    print(json.dumps({"batch": (query.lastProgress or {}).get("batchId")}), flush=True)


if __name__ == "__main__":
    main()
