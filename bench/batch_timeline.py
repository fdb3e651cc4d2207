"""Where a micro-batch's time goes, batch by batch: one stream of ``ours`` (full guarantee), timed
at each step of a batch's life, from Spark's ``offsets/N`` to the batch FLUSHED.

Spark's side from the checkpoint's and the WAL's files (mtimes): ``offsets/N`` (batch
planned), the first and last segment staged by its tasks, ``seals/N`` (the commit worker's
seal), ``commits/N`` (Spark's commit). The driver's side from the sink's own code, instrumented
in this process (the driver): when the listener hands the flusher its wake-up
(``FlushRegistry.progressed``), when the flusher starts the batch, its ingest into the log,
its write, and when it is marked FLUSHED. Plus the one-off costs of the query's first
batch: making the flusher (RocksDB, target, binding) and connecting its session.

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/batch_timeline.py \\
        [--rows 200000] [--batch-rows 10000] [--out bench/results/batch_timeline.json]

Prints a table of medians per phase (first batch apart) and writes every batch's timeline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "contestants"))

import bench_sinks  # noqa: E402
import common  # noqa: E402

#: Phases, each from one instant to the next (seconds), in the order a batch lives them.
PHASES = [
    ("offsets", "first_segment", "plan and start the tasks"),
    ("first_segment", "last_segment", "tasks staging"),
    ("last_segment", "sealed", "commit worker: seal"),
    ("sealed", "committed", "Spark: commits/N"),
    ("committed", "kicked", "listener: wake-up"),
    ("kicked", "flush_start", "flusher: to the batch's flush"),
    ("flush_start", "ingest_end", "flusher: ingest into the log"),
    ("ingest_end", "flushed", "flusher: write and mark"),
]


class Recorder:
    """Instants (time.time()) per batch and event, recorded from any thread."""

    def __init__(self):
        self.at: dict[int, dict[str, float]] = {}
        self.once: dict[str, float] = {}
        self.drains: list[tuple[float, float]] = []     # (start, end) of every drain
        self.profiler = None     # a cProfile.Profile over every drain (--profile-drains)
        self.lock = threading.Lock()

    def mark(self, batch: int, event: str, when: float | None = None, first: bool = True):
        with self.lock:
            slot = self.at.setdefault(batch, {})
            if not first or event not in slot:
                slot[event] = time.time() if when is None else when


def instrument(rec: Recorder, checkpoint: str) -> None:
    """Wrap the driver-side steps of the sink (this process only)."""
    from recovery import flusher as flusher_mod
    from recovery import output as output_mod
    from recovery import replay as replay_mod
    from sinks.driver import registry as registry_mod
    from wal import log as log_mod

    real_progressed = registry_mod.FlushRegistry.progressed

    def progressed(self, query_id, run_id):
        now = time.time()
        commits = os.path.join(checkpoint, "commits")
        done = [int(n) for n in os.listdir(commits) if n.isdigit()] if os.path.isdir(commits) else []
        for batch in done:
            rec.mark(batch, "kicked", now)
        return real_progressed(self, query_id, run_id)

    registry_mod.FlushRegistry.progressed = progressed

    real_init = flusher_mod.QueryFlusher.__init__

    def init(self, *args, **kwargs):
        started = time.time()
        real_init(self, *args, **kwargs)
        rec.once.setdefault("flusher_made_at", started)
        rec.once.setdefault("flusher_make_s", time.time() - started)

    flusher_mod.QueryFlusher.__init__ = init

    real_ingest = log_mod.WalLog.ingest

    def ingest(self, seal, *args, **kwargs):
        rec.mark(seal.batch, "ingest_start")
        try:
            return real_ingest(self, seal, *args, **kwargs)
        finally:
            rec.mark(seal.batch, "ingest_end")

    log_mod.WalLog.ingest = ingest

    real_connect = output_mod.connect

    def connect(*args, **kwargs):
        started = time.time()
        try:
            return real_connect(*args, **kwargs)
        finally:
            rec.once.setdefault("session_connect_s", time.time() - started)
            rec.once.setdefault("session_connected_at", time.time())

    output_mod.connect = connect

    real_drain = flusher_mod.QueryFlusher.drain

    def drain(self, *args, **kwargs):
        started = time.time()
        profiler = rec.profiler
        if profiler is not None:
            profiler.enable()
        try:
            return real_drain(self, *args, **kwargs)
        finally:
            if profiler is not None:
                profiler.disable()
            with rec.lock:
                rec.drains.append((started, time.time()))

    flusher_mod.QueryFlusher.drain = drain

    real_flush = replay_mod.Replayer.flush

    def flush(self, view, *args, **kwargs):
        rec.mark(view.batch, "flush_start")
        out = real_flush(self, view, *args, **kwargs)
        rec.mark(view.batch, "flushed")
        return out

    replay_mod.Replayer.flush = flush


def files_timeline(rec: Recorder, checkpoint: str) -> None:
    """Spark's instants, from the mtimes of the files it and the tasks wrote."""
    offsets = os.path.join(checkpoint, "offsets")
    commits = os.path.join(checkpoint, "commits")
    for name in os.listdir(offsets):
        if name.isdigit():
            rec.mark(int(name), "offsets", os.stat(os.path.join(offsets, name)).st_mtime)
    for name in os.listdir(commits):
        if name.isdigit():
            rec.mark(int(name), "committed", os.stat(os.path.join(commits, name)).st_mtime)


class SegmentWatcher:
    """Segments and seals are removed once their batch is flushed: note their mtimes while
    they exist (every 20 ms)."""

    def __init__(self, rec: Recorder, wal_root: str):
        self.rec, self.wal_root = rec, wal_root
        self.segments: dict[int, list[float]] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.wait(0.02):
            self.poll()

    def poll(self):
        seg_root = os.path.join(self.wal_root, "segments")
        try:
            batches = os.listdir(seg_root)
        except FileNotFoundError:
            batches = []
        for b in batches:
            try:
                for name in os.listdir(os.path.join(seg_root, b)):
                    if name.endswith(".seg"):
                        m = os.stat(os.path.join(seg_root, b, name)).st_mtime
                        self.segments.setdefault(int(b), {})[name] = m
            except (FileNotFoundError, ValueError):
                pass
        seals = os.path.join(self.wal_root, "seals")
        try:
            for name in os.listdir(seals):
                if name.endswith(".seal"):
                    self.rec.mark(int(name.split(".")[0]), "sealed",
                                  os.stat(os.path.join(seals, name)).st_mtime)
        except FileNotFoundError:
            pass

    def finish(self):
        self._stop.set()
        self.thread.join(2)
        for batch, names in self.segments.items():
            times = sorted(names.values())
            self.rec.mark(batch, "first_segment", times[0])
            self.rec.mark(batch, "last_segment", times[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-rows", type=int, default=10_000)
    bench_sinks.add_node_arguments(ap)
    ap.add_argument("--out", default=str(bench_sinks.RESULTS / "batch_timeline.json"))
    ap.add_argument("--floor", action="store_true",
                    help="first run the same stream into a sink that writes nothing (Spark's "
                         "own cost), in the same session, and compare its batches' offsets "
                         "to commits with ours")
    ap.add_argument("--profile-drains", action="store_true",
                    help="print the flusher's drains' cProfile (top 25 by cumulative time)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="batch-timeline-"))
    table = bench_sinks.replicate(bench_sinks.flights_table(), args.rows)
    files = bench_sinks.write_landing(table, work / "landing", args.batch_rows // 2)
    node = bench_sinks.Node(args.host, args.port)
    name = node.table("timeline")
    node.truncate(name)
    spec = {"host": args.host, "port": args.port, "keyspace": node.keyspace, "table": name,
            "landing": str(work / "landing"), "files_per_trigger": 2, "rows": args.rows,
            "checkpoint": str(work / "checkpoint")}
    checkpoint = spec["checkpoint"]

    # Spark's Python workers: this interpreter, this tree.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    import sinks
    from contestants import spark43

    rec = Recorder()
    if args.profile_drains:
        import cProfile
        rec.profiler = cProfile.Profile()
    instrument(rec, checkpoint)
    spark, _ = common.spark_session(SparkSession.builder.appName("batch-timeline"), spec)
    sinks.register(spark)
    watcher = SegmentWatcher(rec, os.path.join(checkpoint, "cassandra_wal"))
    watcher.thread.start()
    if args.floor:
        spark.dataSource.register(spark43._floor_source())
        floor_writer = (common.stream_source(spark, dict(spec, checkpoint=checkpoint + "-floor"))
                        .writeStream.format("bench_floor")
                        .option("checkpointLocation", checkpoint + "-floor")
                        .trigger(availableNow=True))
        floor_started = time.time()
        floor_query = floor_writer.start()
        floor_query.awaitTermination()
        floor = Recorder()
        files_timeline(floor, checkpoint + "-floor")
        floor_batches = [floor.at[b] for b in sorted(floor.at)]
        floor_spans = [t["committed"] - t["offsets"] for t in floor_batches
                       if "committed" in t and "offsets" in t]
        rec.once["floor_query_s"] = time.time() - floor_started
        rec.once["floor_batch0_s"] = floor_spans[0]
        rec.once["floor_later_median_s"] = statistics.median(floor_spans[1:])
        rec.once["floor_start_to_offsets0_s"] = floor_batches[0]["offsets"] - floor_started
    writer = (common.stream_source(spark, spec).writeStream.format("cassandra_wal")
              .options(**spark43.options(spec)).option("checkpointLocation", checkpoint)
              .trigger(availableNow=True))
    started = time.time()
    query = writer.start()
    query.awaitTermination()
    query_end = time.time()
    sinks.wait_flushed(query, 600)
    flushed = time.time()
    watcher.finish()
    files_timeline(rec, checkpoint)
    spark.stop()
    node.close()
    spans = [rec.at[b]["committed"] - rec.at[b]["offsets"] for b in sorted(rec.at)
             if "committed" in rec.at[b] and "offsets" in rec.at[b]]
    rec.once["ours_batch0_s"] = spans[0]
    rec.once["ours_later_median_s"] = statistics.median(spans[1:])
    rec.once["ours_start_to_offsets0_s"] = rec.at[0]["offsets"] - started

    batches = sorted(b for b in rec.at if "flushed" in rec.at[b])
    out_rows = []
    for b in batches:
        t = rec.at[b]
        row = {"batch": b}
        for a, z, _ in PHASES:
            if a in t and z in t:
                row[f"{a}->{z}"] = round(t[z] - t[a], 4)
        nxt = rec.at.get(b + 1, {})
        if "committed" in t and "offsets" in nxt:
            row["committed->next offsets"] = round(nxt["offsets"] - t["committed"], 4)
        if "committed" in t:
            row["commit_to_visible"] = round(t["flushed"] - t["committed"], 4)
        if "offsets" in t:
            row["batch_to_visible"] = round(t["flushed"] - t["offsets"], 4)
        out_rows.append(row)
    later = out_rows[1:]
    print(f"{len(batches)} batches of {args.batch_rows} rows ({files} files); query "
          f"{query_end - started:.1f} s, visible {flushed - started:.1f} s after start()")
    print(f"flusher made in {rec.once.get('flusher_make_s', 0):.2f} s, "
          f"{rec.once.get('flusher_made_at', started) - started:.2f} s after start(); session "
          f"connected in {rec.once.get('session_connect_s', 0):.2f} s")
    print("Spark's side, offsets/N to commits/N: ours batch 0 {:.2f} s, later median {:.2f} s; "
          "start() to offsets/0 {:.2f} s".format(rec.once["ours_batch0_s"],
                                                 rec.once["ours_later_median_s"],
                                                 rec.once["ours_start_to_offsets0_s"]))
    if args.floor:
        print("  writing nothing (run first, so it paid the session's warm-up): batch 0 {:.2f} s, "
              "later median {:.2f} s; start() to offsets/0 {:.2f} s".format(
                  rec.once["floor_batch0_s"], rec.once["floor_later_median_s"],
                  rec.once["floor_start_to_offsets0_s"]))
    print("| phase | batch 0 | later batches, median | p90 |")
    print("|---|---:|---:|---:|")
    summary = {}
    keys = [f"{a}->{z}" for a, z, _ in PHASES] + ["committed->next offsets",
                                                  "commit_to_visible", "batch_to_visible"]
    labels = dict((f"{a}->{z}", text) for a, z, text in PHASES)
    for key in keys:
        values = sorted(r[key] for r in later if key in r)
        first = out_rows[0].get(key) if out_rows else None
        if not values:
            continue
        med = statistics.median(values)
        p90 = values[int(0.9 * (len(values) - 1))]
        summary[key] = {"batch0": first, "median": med, "p90": p90}
        print(f"| {labels.get(key, key)} | {first if first is not None else '-'} | "
              f"{med:.3f} | {p90:.3f} |")
    busy = sum(end - start for start, end in rec.drains)
    print(f"{len(rec.drains)} drains, {busy:.1f} s in all "
          f"({busy / max(1e-9, flushed - started):.0%} of the run)")
    if rec.profiler is not None:
        import pstats
        pstats.Stats(rec.profiler).sort_stats("cumulative").print_stats(25)
    result = {"command": " ".join(["bench/batch_timeline.py", *sys.argv[1:]]),
              "drains": len(rec.drains), "drains_busy_s": busy, "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": bench_sinks.machine(), "rows": args.rows, "batch_rows": args.batch_rows,
              "query_s": query_end - started, "visible_s": flushed - started,
              "once": rec.once, "summary": summary, "batches": out_rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
