"""Flush throughput with 1 and 2 executors: where a batch's time goes, from staging to Cassandra.

Two measurements:

1. **End to end, per executor count and flush mode** (``local-cluster[E,1,1024]``, E = 1 and
   2; ``wal.flush.mode`` = ``driver`` and ``executors``, one after the other in the same
   SparkSession, each into its own table): a stream writes one large micro-batch (``--rows`` rows of about 200 bytes, the table of
   ``bench_staging.py``, one Parquet file of 4 row groups read as 4 tasks) through the sink.
   A small batch of 4 tasks runs first so that every executor's Python workers, the flusher's
   Cassandra session and its prepared statement exist (their start-up is not measured). For the large
   batch the time is split at points the WAL and Spark record:

   * *staging*: file released -> seal written (``seal.sealed_at_us``): file listing, planning,
     the tasks staging segments on the executors, and the commit sealing them;
   * *commit*: seal -> ``commits/N`` (Spark's own bookkeeping);
   * *flush*: ``commits/N`` -> ``flushed_through`` (the driver's flusher: wake-up by the
     listener, ingest of the segments into the RocksDB log, the upserts at the sealed
     timestamps, FLUSHED). Rows acknowledged at the consistency level are visible. In
     ``executors`` mode the upserts are a Spark job of one task per segment (4 here).

   Rates are rows / seconds of each part; "commit -> visible" is rows / *flush*. The ratios
   compare each mode with ``driver`` at the same executor count, within one run.

   *The driver host's CPU in the flush*: CPU seconds of the driver's Python process (less
   its main thread's: this bench's polling every 50 ms, which the flush window has and the
   idle one does not), of its
   other children (``processes`` mode's flush workers) and of the driver's JVM (not its
   children: local-cluster's executors), from ``commits/N`` seen to ``flushed_through``, less
   what the same processes spend over as long a time with the query idle (measured for
   :data:`IDLE_S` right after: the trigger loop, heartbeats). Per row, and as a share of
   ``driver`` mode's.

2. **The flusher alone, from a prepared WAL**: the same batch staged and sealed by a query with
   ``wal.flush=false`` (2 executors), then flushed in this process with
   :class:`recovery.replay.Replayer` and :class:`recovery.cql.upsert.Upserter`: ingest timed
   separately, then the upserts (wall and CPU seconds of this process, cassandra-driver's threads
   included), then a second, profiled pass (cProfile) from a pristine copy of the WAL, reduced
   to the share of the flush spent in each step. One more plain pass with 128 requests in
   flight (``spark.cassandra.output.concurrent.writes``, default 32).

3. **cassandra-driver alone**: the same rows (50,000) inserted with
   ``execute_concurrent_with_args`` and no WAL, at 32 and 128 in flight: the ceiling of any
   flusher written with cassandra-driver, on this machine and node.

Needs a Cassandra node (``--host``/``--port``, or ``CASSANDRA_HOST``/``CASSANDRA_PORT``) and
Java 17. Usage::

    python bench/bench_flush_executors.py [--rows 200000] [--executors 1,2]
        [--modes driver,executors] [--no-offline] [--host H --port P] [--results FILE]

Prints a markdown table and writes ``bench/results/flush_executors.json`` (or ``--results``). Each Spark run is a
child process of this script (``--child``): one SparkSession per process.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

RESULTS = ROOT / "bench" / "results" / "flush_executors.json"
KEYSPACE = "bench_flush"
TASKS = 4
WIDE = 128          # a second flusher run with this many requests in flight
WARMUP_ROWS = 2_000
TABLE_DDL = ("CREATE TABLE IF NOT EXISTS {ks}.{table} (id bigint PRIMARY KEY, account bigint, "
             "event_ts timestamp, amount double, name text, session text, url text, "
             "flag boolean)")
SCHEMA = ("id BIGINT, account BIGINT, event_ts TIMESTAMP, amount DOUBLE, name STRING, "
          "session STRING, url STRING, flag BOOLEAN")


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def java_home_env() -> dict:
    if os.environ.get("JAVA_HOME"):
        return {}
    import importlib.util
    spec = importlib.util.spec_from_file_location("cassandra_node",
                                                  ROOT / "scripts" / "cassandra_node.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cassandra_node"] = module
    spec.loader.exec_module(module)
    try:
        return {"JAVA_HOME": str(module.find_java_home())}
    except Exception:  # noqa: BLE001 - pyspark then finds java on the PATH
        return {}


# -- data ---------------------------------------------------------------------------------------
def write_data(folder: Path, rows: int) -> dict:
    """The large batch (one Parquet file, TASKS row groups) and the warm-up batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench_staging import make_table

    folder.mkdir(parents=True, exist_ok=True)
    table = make_table(rows)
    pq.write_table(table, folder / "big.parquet", row_group_size=-(-rows // TASKS))
    # The warm-up batch: one small file per task, so that every executor runs a task (and
    # starts its Python workers) before the measured batch.
    warm = make_table(WARMUP_ROWS, seed=7)
    warm = warm.set_column(0, "id", pa.array(np.arange(WARMUP_ROWS, dtype=np.int64) + 10**12))
    (folder / "warmup").mkdir()
    per = WARMUP_ROWS // TASKS
    for i in range(TASKS):
        pq.write_table(warm.slice(i * per, per), folder / "warmup" / f"warmup-{i}.parquet")
    return {"rows": rows, "arrow_bytes": table.nbytes,
            "bytes_per_row": round(table.nbytes / rows, 1),
            "parquet_bytes": os.path.getsize(folder / "big.parquet")}


def connect(host: str, port: int):
    from cassandra.cluster import Cluster

    cluster = Cluster([host], port=port, connect_timeout=30)
    return cluster, cluster.connect()


def prepare_table(session, table: str) -> None:
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute(TABLE_DDL.format(ks=KEYSPACE, table=table))
    session.execute(f"TRUNCATE {KEYSPACE}.{table}", timeout=120)


# -- child: one Spark run -------------------------------------------------------------------------
def cpu_ticks() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` used since it started."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except OSError:
            pass
    return kids


def driver_cpu_s(spark) -> dict:
    """CPU seconds the driver host's own processes used so far: this Python process (the
    flusher's thread, the query's planning), its other children but the JVM (``processes``
    mode's flush workers: the driver host's CPU too) and the driver's JVM itself (the query,
    the scheduling of the flush job; not its children, which are local-cluster's executors)."""
    jvm = spark.sparkContext._gateway.proc.pid
    workers = 0.0
    for kid in _children(os.getpid()):
        if kid != jvm:
            try:
                workers += process_cpu_s(kid)
            except OSError:
                pass
    # The calling thread's own CPU (this bench's polling loop, in the driver's process) is
    # taken out of the driver's Python: it is the measurement's, not the sink's.
    bench = time.thread_time()
    return {"python": process_cpu_s(os.getpid()) - bench, "workers": workers,
            "jvm": process_cpu_s(jvm), "flusher": flusher_thread_cpu_s()}


def flusher_thread_cpu_s() -> float:
    """CPU seconds of the sink's flusher threads of this process (``cassandra-wal-flusher``:
    the drains, the flush job's submission and results in the scale-out modes; in ``driver``
    mode the upserts' encoding too, cassandra-driver's I/O thread apart)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("cassandra-wal-flusher") and thread.native_id:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                pass
    return total


#: Seconds the query is left idle after the measured batch, to measure the driver's background
#: CPU (the trigger loop, heartbeats, the flusher's commit watch), subtracted from the flush's.
IDLE_S = 6.0


def _progress(query, batch: int) -> dict:
    for p in query.recentProgress:
        d = p if isinstance(p, dict) else json.loads(p.json)
        if d.get("batchId") == batch:
            return d
    return {}


def child(args) -> int:
    """One SparkSession (``local-cluster[E,1,1024]``): the measured stream once per flush mode,
    then optionally a query that only stages and seals (``wal.flush=false``) for the offline
    flusher run."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sinks
    from wal.pointer import read_pointer
    from wal import checkpoint as ckpt
    from wal.layout import WalDir
    from wal.seal import read_seal

    data = Path(args.data)
    work = Path(args.workdir)
    big = data / "big.parquet"
    split = os.path.getsize(big) // TASKS + 1
    t0 = time.time()
    spark = (SparkSession.builder
             .master(f"local-cluster[{args.child},1,1024]")
             .appName(f"bench-flush-{args.child}")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.files.maxPartitionBytes", str(split))
             .config("spark.sql.files.openCostInBytes", str(split))   # a small file: a task
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sinks.register(spark)
    out = {"executors": args.child, "spark_up_s": round(time.time() - t0, 1)}
    say(f"child {args.child}: spark up in {out['spark_up_s']}s")

    def run_stream(name: str, flush: bool, mode: str = "driver") -> dict:
        folder, cp = work / f"in-{name}", str(work / f"cp-{name}")
        folder.mkdir(parents=True)
        for f in sorted((data / "warmup").iterdir()):     # all of them in batch 0
            shutil.copy(f, folder / f.name)
        query = (spark.readStream.schema(SCHEMA).parquet(str(folder))
                 .writeStream.format("cassandra_wal")
                 .option("keyspace", KEYSPACE)
                 .option("table", f"{args.table}_{mode}" if flush else args.table + "_prep")
                 .option("checkpointLocation", cp)
                 .option("spark.cassandra.connection.host", args.host)
                 .option("spark.cassandra.connection.port", str(args.port))
                 .option("wal.flush", "true" if flush else "false")
                 .option("wal.flush.mode", mode)
                 .trigger(processingTime="200 milliseconds")
                 .start())

        cpu: dict[str, dict] = {}

        def release(src: Path | None, batch: int) -> float:
            released = time.time()
            if src is not None:
                tmp = work / f"{name}-{src.name}"
                shutil.copy(src, tmp)
                released = time.time()
                cpu["released"] = driver_cpu_s(spark)
                os.replace(tmp, folder / src.name)
            deadline = time.monotonic() + args.deadline_s
            while True:
                assert query.isActive, f"query failed: {query.exception()}"
                root = read_pointer(cp)
                if ckpt.is_committed(cp, batch) and root:
                    cpu.setdefault("committed", driver_cpu_s(spark))
                    if not flush or WalDir(root).read_flushed_through() >= batch:
                        cpu["flushed"] = driver_cpu_s(spark)
                        return released
                assert time.monotonic() < deadline, f"batch {batch} not done in time"
                time.sleep(0.05)

        release(None, 0)                                  # the warm-up batch
        cpu.clear()
        idle0, total0 = cpu_ticks()
        released = release(big, 1)
        idle1, total1 = cpu_ticks()
        cpu["idle_from"] = driver_cpu_s(spark)
        time.sleep(IDLE_S)                                # the query runs on, with no data
        cpu["idle_to"] = driver_cpu_s(spark)
        wal = WalDir(read_pointer(cp))
        seal = read_seal(wal, 1)
        committed = os.path.getmtime(os.path.join(cp, "commits", "1"))
        progress = _progress(query, 1)
        query.stop()
        res = {"rows": seal.rows, "segments": len(seal.segments), "bytes": seal.bytes,
               "released": released, "sealed": seal.sealed_at_us / 1e6, "committed": committed,
               "duration_ms": progress.get("durationMs", {}), "wal_root": wal.root,
               "checkpoint": cp,
               # the driver's CPU seconds: staging (release -> commits/N seen, polled every
               # 50 ms) and flush (commits/N seen -> flushed_through), Python and JVM apart
               "driver_cpu_s": {phase: {k: round(cpu[end][k] - cpu[start][k], 3)
                                        for k in ("python", "workers", "jvm", "flusher")}
                                for phase, start, end in (("staging", "released", "committed"),
                                                          ("flush", "committed", "flushed"),
                                                          ("idle", "idle_from", "idle_to"))},
               "idle_s": IDLE_S,
               # share of all the machine's CPUs busy from release to flushed (anyone's work)
               "machine_cpu_busy": round(1 - (idle1 - idle0) / max(1, total1 - total0), 2)}
        if flush:
            res["flushed"] = os.path.getmtime(os.path.join(wal.root, "flushed_through"))
        return res

    out["streams"] = {mode: run_stream(f"measured-{mode}", flush=True, mode=mode)
                      for mode in args.modes.split(",")}
    if args.prepare:
        out["prepared"] = run_stream("prepared", flush=False)
    spark.stop()
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


# -- the flusher alone ----------------------------------------------------------------------------
STEPS = {   # share of the flush, by the cumulative time of these functions (cProfile, this thread)
    "ingest segments into RocksDB": ("wal/log.py", "ingest"),
    "read chunks from the log": ("wal/log.py", "chunks"),
    "decode Arrow chunks": ("wal/segment.py", "decode_chunk"),
    "serialise the columns (CellEncoder.encode)": ("recovery/cql/encode.py", "encode"),
    "group rows into requests": ("recovery/cql/upsert.py", "statements"),
    "wait for the answers (driver, network, Cassandra)": ("recovery/cql/upsert.py", "_settle"),
    "record progress in the log": ("wal/log.py", "record_progress"),
}


def offline_flush(prep: dict, host: str, port: int, workdir: Path) -> dict:
    from recovery.replay import Replayer
    from recovery.flusher import load_target
    from recovery.output import CassandraOutput
    from wal.layout import WalDir
    from wal.log import WalLog
    from wal.recovery_policy import RecoveryPolicy
    from wal.seal import read_seal

    wal = WalDir(prep["wal_root"])
    pristine = workdir / "wal-pristine"
    shutil.copytree(wal.root, pristine)
    cluster, session = connect(host, port)
    table = f"{KEYSPACE}.{load_target(wal).table.table}"

    def fresh():
        session.execute(f"TRUNCATE {table}", timeout=120)
        shutil.rmtree(wal.root)
        shutil.copytree(pristine, wal.root)

    def flush(profile: cProfile.Profile | None = None, concurrency: int | None = None) -> dict:
        wal_log = WalLog.open_writer(wal)
        target = load_target(wal)
        if concurrency is not None:
            write = replace(target.config.write, concurrent_writes=concurrency)
            target = replace(target, config=replace(target.config, write=write))
        output = CassandraOutput(target, wal.root)
        try:
            seal = read_seal(wal, 1)
            upserter = output.upserter(seal)    # connect and prepare outside the timings
            replayer = Replayer(wal, wal_log, lambda _seal: upserter, prep["checkpoint"])
            if profile:
                profile.enable()
            w0, c0 = time.perf_counter(), time.process_time()
            wal_log.ingest(seal)
            w1, c1 = time.perf_counter(), time.process_time()
            report = replayer.run(RecoveryPolicy.QUERY_START)
            w2, c2 = time.perf_counter(), time.process_time()
            if profile:
                profile.disable()
            assert 1 in report.replayed, report
            return {"rows": seal.rows, "ingest_s": w1 - w0, "ingest_cpu_s": c1 - c0,
                    "upsert_s": w2 - w1, "upsert_cpu_s": c2 - c1}
        finally:
            output.close()
            wal_log.close()

    fresh()
    plain = flush()
    fresh()
    wide = flush(concurrency=WIDE)
    fresh()
    prof = cProfile.Profile()
    profiled = flush(prof)
    stats = pstats.Stats(prof)
    total = profiled["ingest_s"] + profiled["upsert_s"]
    shares = {}
    for label, (path, func) in STEPS.items():
        cum = sum(v[3] for k, v in stats.stats.items() if k[0].endswith(path) and k[2] == func)
        shares[label] = round(cum / total, 3) if total else None
    cluster.shutdown()
    rows = plain["rows"]
    return {"rows": rows,
            "ingest_s": round(plain["ingest_s"], 2), "ingest_rows_per_s": round(rows / plain["ingest_s"]),
            "upsert_s": round(plain["upsert_s"], 2), "upsert_rows_per_s": round(rows / plain["upsert_s"]),
            "upsert_cpu_s": round(plain["upsert_cpu_s"], 2),
            "upsert_cpu_per_wall": round(plain["upsert_cpu_s"] / plain["upsert_s"], 2),
            "flush_rows_per_s": round(rows / (plain["ingest_s"] + plain["upsert_s"])),
            "concurrent_writes": load_target(wal).config.write.concurrent_writes,
            f"upsert_rows_per_s_concurrency_{WIDE}": round(rows / wide["upsert_s"]),
            f"upsert_cpu_per_wall_concurrency_{WIDE}": round(wide["upsert_cpu_s"] / wide["upsert_s"], 2),
            "profiled_total_s": round(total, 2), "profile_shares": shares}


def raw_cassandra_driver(data: Path, host: str, port: int, rows: int) -> dict:
    """The same rows through cassandra-driver alone (prepared INSERT ... USING TIMESTAMP,
    ``execute_concurrent_with_args``), no WAL: the ceiling of any Python flusher here."""
    import pyarrow.parquet as pq
    from cassandra.concurrent import execute_concurrent_with_args

    from bench_staging import python_rows

    table = pq.read_table(data / "big.parquet").slice(0, rows)
    params = [r + (1_800_000_000_000_000 + i,) for i, r in enumerate(python_rows(table))]
    cluster, session = connect(host, port)
    prepare_table(session, "raw")
    cols = ", ".join(table.column_names)
    stmt = session.prepare(f"INSERT INTO {KEYSPACE}.raw ({cols}) VALUES "
                           f"({', '.join('?' * len(table.column_names))}) USING TIMESTAMP ?")
    out = {"rows": rows}
    for concurrency in (32, WIDE):
        w0, c0 = time.perf_counter(), time.process_time()
        execute_concurrent_with_args(session, stmt, params, concurrency=concurrency)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        out[f"concurrency_{concurrency}"] = {"rows_per_s": round(rows / wall),
                                             "cpu_per_wall": round(cpu / wall, 2)}
    cluster.shutdown()
    return out


# -- parent ---------------------------------------------------------------------------------------
def run_child(executors: int, args, workdir: Path, data: Path, prepare: bool) -> dict:
    out = workdir / f"child-{executors}.json"
    cmd = [sys.executable, __file__, "--child", str(executors), "--data", str(data),
           "--workdir", str(workdir / f"e{executors}"), "--out", str(out),
           "--table", f"events_e{executors}", "--host", args.host, "--port", str(args.port),
           "--deadline-s", str(args.deadline_s), "--modes", args.modes] + (
               ["--prepare"] if prepare else [])
    (workdir / f"e{executors}").mkdir()
    log = workdir / f"child-{executors}.log"
    env = dict(os.environ, **java_home_env(), PYTHONUNBUFFERED="1")
    say(f"executors={executors}: running (log {log})")
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True, timeout=args.deadline_s * 3 + 600)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(f"child for {executors} executors failed:\n" + "\n".join(tail))
    return json.loads(out.read_text())


def split_times(stream: dict) -> dict:
    rows = stream["rows"]
    staging = stream["sealed"] - stream["released"]
    commit = stream["committed"] - stream["sealed"]
    flush = stream["flushed"] - stream["committed"]
    total = stream["flushed"] - stream["released"]
    return {"rows": rows, "segments": stream["segments"],
            "staging_s": round(staging, 2), "commit_s": round(commit, 2),
            "flush_s": round(flush, 2), "total_s": round(total, 2),
            "staging_rows_per_s": round(rows / staging), "commit_to_visible_rows_per_s":
            round(rows / flush), "end_to_end_rows_per_s": round(rows / total),
            "flush_share": round(flush / total, 3), "spark_add_batch_ms":
            stream["duration_ms"].get("addBatch"),
            "machine_cpu_busy": stream.get("machine_cpu_busy"),
            "driver_cpu_s": stream.get("driver_cpu_s"),
            # the flush's own: its CPU less the idle query's over as long a time
            "driver_flush_cpu_s": {k: round(v - stream["driver_cpu_s"]["idle"][k]
                                            * flush / stream["idle_s"], 3)
                                   for k, v in stream["driver_cpu_s"]["flush"].items()},
            "driver_flush_cpu_us_per_row": round(max(0.0, sum(
                v - stream["driver_cpu_s"]["idle"][k] * flush / stream["idle_s"]
                for k, v in stream["driver_cpu_s"]["flush"].items())) / rows * 1e6, 2)}


def mode_ratios(rows: list[dict]) -> list[dict]:
    """executors-mode / driver-mode, per executor count (same run, same SparkSession)."""
    by = {(r["executors"], r["flush_mode"]): r for r in rows}
    out = []
    for e in sorted({r["executors"] for r in rows}):
        d = by.get((e, "driver"))
        for mode in ("executors", "processes"):
            x = by.get((e, mode))
            if d and x:
                out.append({"executors": e, "flush_mode": mode,
                            "flush_speedup": round(d["flush_s"] / x["flush_s"], 2),
                            "driver_flush_cpu_share": round(
                                x["driver_flush_cpu_us_per_row"]
                                / d["driver_flush_cpu_us_per_row"], 3),
                            # Python alone (the driver's process and its workers): the JVM's
                            # part is mostly the running query's own, in every mode
                            "driver_python_cpu_share": round(
                                (x["driver_flush_cpu_s"]["python"]
                                 + x["driver_flush_cpu_s"]["workers"])
                                / d["driver_flush_cpu_s"]["python"], 3),
                            # the flusher thread alone, no idle baseline (it sleeps then)
                            "flusher_thread_cpu_share": round(
                                x["driver_cpu_s"]["flush"]["flusher"]
                                / d["driver_cpu_s"]["flush"]["flusher"], 3)
                            if d["driver_cpu_s"]["flush"].get("flusher") else None,
                            "end_to_end_speedup": round(d["total_s"] / x["total_s"], 2)})
    return out


def markdown(result: dict) -> str:
    lines = ["| executors | flush mode | staging s | commit s | flush s | staging rows/s "
             "| commit -> visible rows/s | end-to-end rows/s | flush share | CPUs busy "
             "| driver host CPU s in the flush, less idle (Python + workers + JVM) "
             "| driver host CPU µs a row |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["end_to_end"]:
        lines.append(f"| {r['executors']} | {r['flush_mode']} | {r['staging_s']} | "
                     f"{r['commit_s']} | {r['flush_s']} | "
                     f"{r['staging_rows_per_s']:,} | {r['commit_to_visible_rows_per_s']:,} | "
                     f"{r['end_to_end_rows_per_s']:,} | {r['flush_share']:.0%} | "
                     f"{r.get('machine_cpu_busy', 0):.0%} | "
                     f"{r['driver_flush_cpu_s']['python']} + {r['driver_flush_cpu_s']['workers']} + "
                     f"{r['driver_flush_cpu_s']['jvm']} | "
                     f"{r['driver_flush_cpu_us_per_row']} |")
    for r in result.get("mode_ratios", []):
        lines.append(f"\n{r['executors']} executor(s): {r['flush_mode']} mode / driver mode: flush "
                     f"{r['flush_speedup']}x as fast, release -> visible "
                     f"{r['end_to_end_speedup']}x; the driver host's CPU a row in the flush "
                     f"{r['driver_flush_cpu_share']:.1%} of driver mode's "
                     f"({r['driver_python_cpu_share']:.1%} for its Python processes alone; "
                     f"the flusher thread's CPU {r['flusher_thread_cpu_share'] or 0:.1%} of "
                     f"driver mode's).")
    off = result.get("flusher_offline")
    if off:
        lines += ["", f"Flusher alone ({off['rows']:,} rows from a prepared WAL): ingest "
                  f"{off['ingest_rows_per_s']:,} rows/s ({off['ingest_s']} s), upserts "
                  f"{off['upsert_rows_per_s']:,} rows/s ({off['upsert_s']} s, CPU/wall "
                  f"{off['upsert_cpu_per_wall']}), together {off['flush_rows_per_s']:,} rows/s.",
                  "", "| step (cProfile, cumulative) | share of the flush |", "|---|---|"]
        for label, share in off["profile_shares"].items():
            lines.append(f"| {label} | {share:.0%} |")
        lines += ["", f"With {WIDE} requests in flight instead of {off['concurrent_writes']}: "
                  f"{off[f'upsert_rows_per_s_concurrency_{WIDE}']:,} rows/s."]
    raw = result.get("driver_alone")
    if raw:
        lines += ["", f"cassandra-driver alone ({raw['rows']:,} rows, no WAL): "
                  + ", ".join(f"{k.replace('_', ' ')}: {v['rows_per_s']:,} rows/s "
                              f"(CPU/wall {v['cpu_per_wall']})"
                              for k, v in raw.items() if k.startswith("concurrency"))]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--executors", default="1,2")
    p.add_argument("--modes", default="driver,executors",
                   help="wal.flush.mode values to measure, in this order, in each SparkSession")
    p.add_argument("--host", default=os.environ.get("CASSANDRA_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("CASSANDRA_PORT", "9042")))
    p.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    p.add_argument("--deadline-s", type=float, default=900.0)
    p.add_argument("--no-offline", action="store_true", help="skip the flusher-alone run")
    p.add_argument("--results", default=str(RESULTS), help="the result file to write")
    # child mode (internal)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--table", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return child(args)

    from bench_staging import machine

    executors = [int(x) for x in args.executors.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bench-flush-", dir=args.dir))
    started = time.time()
    result = {"benchmark": "flush-executors",
              "command": "python bench/bench_flush_executors.py " + " ".join(sys.argv[1:]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "loadavg_at_start": list(os.getloadavg())}
    try:
        result["data"] = write_data(workdir / "data", args.rows)
        cluster, session = connect(args.host, args.port)
        for e in executors:
            for mode in args.modes.split(","):
                prepare_table(session, f"events_e{e}_{mode}")
        if not args.no_offline:
            prepare_table(session, f"events_e{max(executors)}_prep")
        cluster.shutdown()
        result["end_to_end"] = []
        children = {}
        for e in executors:
            children[e] = run_child(e, args, workdir, workdir / "data",
                                    prepare=(e == max(executors) and not args.no_offline))
            for mode, stream in children[e]["streams"].items():
                row = {"executors": e, "flush_mode": mode,
                       "spark_up_s": children[e]["spark_up_s"], **split_times(stream)}
                result["end_to_end"].append(row)
                say(f"executors={e} mode={mode}: {row}")
        result["mode_ratios"] = mode_ratios(result["end_to_end"])
        if not args.no_offline:
            prep = children[max(executors)]["prepared"]
            result["flusher_offline"] = offline_flush(prep, args.host, args.port, workdir)
            say(f"flusher alone: {result['flusher_offline']}")
            result["driver_alone"] = raw_cassandra_driver(workdir / "data", args.host, args.port,
                                                min(args.rows, 50_000))
            say(f"cassandra-driver alone: {result['driver_alone']}")
        result["loadavg_at_end"] = list(os.getloadavg())
        result["seconds"] = round(time.time() - started, 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
