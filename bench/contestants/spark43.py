"""Contestants on the project's pyspark 4.3: a stream of the landing parquet files into Cassandra.

``--mode``:

* ``ours``: our sink with the full guarantee (``format("cassandra_wal")``): timed from
  ``start()`` until the WAL says every batch is FLUSHED (every row acknowledged by Cassandra).
  A poller records, per batch, ``commits/N``'s mtime and the moment the batch is seen flushed:
  the commit-to-visible latency.
* ``ours-driver``, ``ours-executors``, ``ours-processes``: ``ours`` with ``wal.flush.mode``
  ``driver`` / ``executors`` / ``processes`` (``ours`` keeps the default, ``auto``).
* ``ours-batch32``: ``ours`` sending the raw cassandra-driver's requests (``SINK_OPTIONS``);
  ``ours-group1``: ``ours`` grouping each chunk's rows on their own.
* ``ours-staging``: the same with ``wal.flush=false``: rows staged and sealed, never written.
  It leaves the WAL behind for the ``recovery`` contestant.
* ``ours-nowal``: the same Spark stream and the same writer code (``recovery.cql.upsert.Upserter``,
  ``recovery.cql.convert``) without the WAL: ``foreachBatch`` + ``mapInArrow``, each task upserting its
  Arrow batches directly. Our sink minus the WAL, to price the WAL.
* ``naive``: what users write by hand: ``foreachBatch`` + ``foreachPartition`` with one
  synchronous ``session.execute`` of a prepared statement per row.
* ``spark-floor``: the same stream into a Python data source whose tasks only count the Arrow
  batches they are handed and whose commit does nothing: Spark's own cost for a Python Data
  Source sink (planning worker, Arrow hand-off to the Python workers, commit worker), so the
  most any such sink, ours included, can deliver on the machine.

All use trigger ``availableNow`` with ``maxFilesPerTrigger``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


#: Contestants that are ``ours`` with another ``wal.flush.mode``.
FLUSH_MODES = {"ours-driver": "driver", "ours-executors": "executors",
               "ours-processes": "processes"}
#: Contestants that are ``ours`` with other sink options: ``ours-batch32`` sends the requests
#: ``raw-replicas32`` sends (UNLOGGED batches of up to 32 rows and 10 partitions, no byte cap),
#: where ``ours`` keeps each batch under Cassandra's ``batch_size_warn_threshold``;
#: ``ours-group1`` groups each chunk's rows on their own (``wal.flush.groupRows=1``).
SINK_OPTIONS = {"ours-batch32": {"spark.cassandra.output.batch.size.rows": "32",
                                 "spark.cassandra.output.batch.size.bytes": str(1 << 20)},
                "ours-group1": {"wal.flush.groupRows": "1"}}


def options(spec: dict) -> dict:
    return {"spark.cassandra.connection.host": spec["host"],
            "spark.cassandra.connection.port": str(spec["port"]),
            "spark.cassandra.output.consistency.level": common.consistency(spec),
            "keyspace": spec["keyspace"], "table": spec["table"]}


class FlushPoller:
    """Per batch: commits/N mtime, seal mtime, and when the WAL first says it is flushed."""

    def __init__(self, checkpoint: str, wal_root: str, interval: float = 0.05):
        self.checkpoint, self.wal_root, self.interval = checkpoint, wal_root, interval
        self.committed: dict[int, float] = {}
        self.flushed: dict[int, float] = {}
        self.sealed: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def flushed_through(self) -> int:
        from wal.layout import WalDir
        return WalDir(self.wal_root).read_flushed_through() if os.path.isdir(self.wal_root) else -1

    def poll(self) -> None:
        now = time.time()
        commits = os.path.join(self.checkpoint, "commits")
        if os.path.isdir(commits):
            for name in os.listdir(commits):
                if name.isdigit() and int(name) not in self.committed:
                    self.committed[int(name)] = os.stat(os.path.join(commits, name)).st_mtime
        seals = os.path.join(self.wal_root, "seals")
        if os.path.isdir(seals):
            for name in os.listdir(seals):
                digits = "".join(ch for ch in name if ch.isdigit())
                if digits and int(digits) not in self.sealed:
                    try:
                        self.sealed[int(digits)] = os.stat(os.path.join(seals, name)).st_mtime
                    except FileNotFoundError:
                        pass
        through = self.flushed_through()
        for batch in range(through + 1):
            self.flushed.setdefault(batch, now)

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def latencies(self) -> list[float]:
        return [self.flushed[b] - self.committed[b] for b in sorted(self.flushed)
                if b in self.committed]

    def flush_seconds(self) -> list[float]:
        """Per batch, how long the flusher took once it could start it: from the later of its
        commit and the previous batch becoming visible, to its own becoming visible."""
        out = []
        for b in sorted(self.flushed):
            if b in self.committed:
                start = max(self.committed[b], self.flushed.get(b - 1, 0.0))
                out.append(self.flushed[b] - start)
        return out


def _nowal_writer(spec: dict):
    """mapInArrow function: each task upserts its Arrow batches with our Upserter, no WAL."""
    opts = options(spec)
    columns = list(common.COLUMNS)   # not common.COLUMNS inside: workers cannot import common

    def write(batches):
        import pyarrow as pa
        from recovery.cql.upsert import Upserter
        from recovery.cql.connection import connect
        from sinks.worker.options import parse_options
        from recovery.cql.table import fetch_table_schema
        from wal.seal import now_us
        cache = globals().setdefault("_BENCH_UPSERTER", {})
        if "u" not in cache:
            config = parse_options(opts, {})
            cluster, session = connect(config.connection)
            table = fetch_table_schema(cluster, config.keyspace, config.table)
            cache["u"] = Upserter(session, table, columns, config.write,
                                  config.connection.consistency_level)
        upserter = cache["u"]
        # The flusher's own path: chunks grouped up to wal.flush.groupRows, pipelined.
        n = sum(upserter.write_chunks(((rb, now_us(), rb.num_rows) for rb in batches
                                       if rb.num_rows), 0))
        yield pa.RecordBatch.from_pydict({"n": [n]}, schema=pa.schema([("n", pa.int64())]))

    return write


def _floor_source():
    """A Python data source that writes nothing: ``spark-floor``'s sink."""
    from pyspark.sql.datasource import (DataSource, DataSourceStreamArrowWriter,
                                        WriterCommitMessage)

    class FloorWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:     # take every Arrow batch Spark hands the task
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class FloorSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_floor"

        def streamWriter(self, schema, overwrite):
            return FloorWriter()

    return FloorSink


def _naive_writer(spec: dict):
    hosts, port, cql = common.hosts(spec), spec["port"], common.insert_cql(spec["keyspace"], spec["table"])
    level = common.consistency(spec)
    columns = list(common.COLUMNS)

    def write_partition(rows):
        from cassandra import ConsistencyLevel
        from cassandra.cluster import Cluster
        cluster = Cluster(hosts, port=port)
        session = cluster.connect()
        session.default_consistency_level = ConsistencyLevel.name_to_value[level]
        stmt = session.prepare(cql)
        for row in rows:
            session.execute(stmt, tuple(row[c] for c in columns))
        cluster.shutdown()

    def each_batch(df, batch_id):
        df.foreachPartition(write_partition)

    return each_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--mode", choices=("ours", *FLUSH_MODES, *SINK_OPTIONS, "ours-staging",
                                       "ours-nowal", "naive", "spark-floor"),
                    required=True)
    ap.add_argument("--profile", help="write a pyinstrument profile of the driver here")
    args = ap.parse_args()
    spec = common.load_spec()
    from pyspark.sql import SparkSession

    monitor = common.RssMonitor().start()
    spark, startup_s = common.spark_session(SparkSession.builder.appName(f"bench-{args.mode}"),
                                            spec)
    checkpoint = spec["checkpoint"]
    source = common.stream_source(spark, spec)
    poller = None
    write_seconds: list[float] = []   # ours-nowal: each batch's write job
    if args.mode.startswith("ours") and args.mode != "ours-nowal":
        import sinks
        sinks.register(spark)
        writer = source.writeStream.format("cassandra_wal").options(**options(spec))
        if args.mode == "ours-staging":
            writer = writer.option("wal.flush", "false")
        if args.mode in FLUSH_MODES:
            writer = writer.option("wal.flush.mode", FLUSH_MODES[args.mode])
        writer = writer.options(**SINK_OPTIONS.get(args.mode, {}))
        poller = FlushPoller(checkpoint, os.path.join(checkpoint, "cassandra_wal")).start()
    elif args.mode == "spark-floor":
        spark.dataSource.register(_floor_source())
        writer = source.writeStream.format("bench_floor")
    elif args.mode == "ours-nowal":
        fn = _nowal_writer(spec)

        def write_batch(df, _id):   # the batch's write job, timed like the flusher's batches
            t = time.monotonic()
            df.mapInArrow(fn, "n long").agg({"n": "sum"}).collect()
            write_seconds.append(time.monotonic() - t)

        writer = source.writeStream.foreachBatch(write_batch)
    else:
        writer = source.writeStream.foreachBatch(_naive_writer(spec))
    writer = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True)

    busy_before = common.machine_busy_s()
    started, committed_s, last = common.run_to_end(writer, checkpoint)
    flushing = args.mode in ("ours", *FLUSH_MODES, *SINK_OPTIONS)
    if flushing:
        deadline = time.monotonic() + 3600
        while poller.flushed_through() < last:
            if time.monotonic() > deadline:
                raise SystemExit("timed out waiting for the flusher")
            time.sleep(0.02)
    seconds = time.monotonic() - started
    machine_cpu_s = common.machine_busy_s() - busy_before
    result = {"rows": spec["rows"], "seconds": seconds, "committed_s": committed_s,
              "startup_s": startup_s, "batches": last + 1, "machine_cpu_s": machine_cpu_s,
              "cores_busy": machine_cpu_s / seconds}
    result["flush_seconds"] = write_seconds
    if poller is not None:
        poller.poll()
        poller.stop()
        result["latencies_s"] = poller.latencies() if flushing else []
        if flushing:
            result["flush_seconds"] = poller.flush_seconds()
        result["seal_latencies_s"] = ([poller.flushed[b] - poller.sealed[b] for b in
                                       sorted(poller.flushed) if b in poller.sealed]
                                      if flushing else [])
    if args.mode == "ours-staging":
        from wal.files import tree_size
        wal_root = os.path.join(checkpoint, "cassandra_wal")
        result["wal_segment_bytes"] = tree_size(os.path.join(wal_root, "segments"))
        result["wal_bytes"] = tree_size(wal_root)
    rss = monitor.stop()
    result["rss_mb"] = rss
    result["peak_rss_mb"] = rss["driver"]
    spark.stop()
    common.emit(result)


if __name__ == "__main__":
    main()
