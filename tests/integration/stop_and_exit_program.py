"""A streaming script that ends as users write them: read everything, ``query.stop()``, exit.

Run by ``tests/integration/test_outage.py`` in a process of its own::

    python tests/integration/stop_and_exit_program.py --input DIR --checkpoint DIR \
        --keyspace ks --table events --host 127.0.0.1 --port 9042

It streams the JSON files of ``--input`` (``id INT, file INT, name STRING``, one file per
micro-batch) into the table, waits until Spark has committed every file
(``processAllAvailable``), stops the query and returns at once: no ``wait_flushed``, no
``spark.stop()``. Whatever Spark committed must be in Cassandra when the process has exited
(Cassandra up), or stay in the WAL for the next run (Cassandra away). ``--wait-flushed``: wait
for it with ``sinks.wait_flushed`` first.
"""

from __future__ import annotations

import argparse
import os
import sys

# This checkout first on the path: tests.helpers, and the sink's code beside them.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.helpers.spark_session import local_builder  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("input", "checkpoint", "keyspace", "table", "host", "port"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--wait-flushed", action="store_true",
                   help="sinks.wait_flushed(query) before stopping it")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="another option of the sink (repeatable)")
    p.add_argument("--available-now", action="store_true",
                   help="trigger(availableNow=True) and wait for the query to end by itself, "
                        "instead of processAllAvailable() and stop()")
    args = p.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable

    import sinks

    spark = local_builder("cassandra-wal-stop-and-exit").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sinks.register(spark)
    writer = (spark.readStream.schema("id INT, file INT, name STRING")
              .option("maxFilesPerTrigger", 1).json(args.input).writeStream)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    query = (writer.format("cassandra_wal")
             .option("keyspace", args.keyspace).option("table", args.table)
             .option("checkpointLocation", args.checkpoint)
             .option("spark.cassandra.connection.host", args.host)
             .option("spark.cassandra.connection.port", args.port)
             .options(**dict(o.split("=", 1) for o in args.option))
             .start())
    if args.available_now:
        query.awaitTermination()
    else:
        query.processAllAvailable()
    if args.wait_flushed:
        print("[stop-and-exit] every file committed; waiting until it is flushed", flush=True)
        sinks.wait_flushed(query)
    query.stop()
    print("[stop-and-exit] query stopped; exiting", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
