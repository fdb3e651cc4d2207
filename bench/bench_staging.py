"""WAL staging throughput: our Arrow IPC segments vs one pickle per row (the rejected design).

What one executor task does in ``write()``: stage N rows durably on local disk. Contestants,
each from the input it would get in Spark (Arrow record batches for the Arrow writer, Python
rows for a row-at-a-time writer):

* ``arrow``, ``arrow-lz4``, ``arrow-zstd``: :class:`wal.segment.SegmentWriter`, one Arrow IPC
  chunk per record batch of ``--chunk-rows`` rows (Spark's default arrow batch is 10,000),
  fsync, rename. Then :meth:`wal.log.WalLog.ingest` copies the sealed segment into the log
  (the driver's side, measured separately as "ingest").
* ``pickle``: ``pickle.dumps`` of one tuple per row, each written as a length-prefixed record
  with its crc32 into one file, fsynced at the end.
* ``rocksdb-put`` (skipped with ``--no-rocksdb``): one RocksDB ``put`` per pickled row, the WAL
  synced at the end, the database closed (default options: snappy-compressed SST files).

Logical bytes are the rows' Arrow in-memory size (the same for every contestant); on-disk bytes
are what the contestant left on disk. Contestants alternate (the order rotates each repetition);
medians of ``--reps`` runs are reported, with ratios against ``arrow``.

Usage::

    python bench/bench_staging.py [--rows N] [--reps R] [--chunk-rows C] [--dir DIR]

Prints a markdown table and writes ``bench/results/staging.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from wal.files import tree_size  # noqa: E402
from wal.layout import WalDir  # noqa: E402
from wal.log import WalLog  # noqa: E402
from wal.seal import seal_batch  # noqa: E402
from wal.segment import SegmentWriter  # noqa: E402

MB = 1_000_000
RECORD_HEAD = struct.Struct("<II")   # the pickle contestant's frame: u32 length, u32 crc32


# -- data ---------------------------------------------------------------------------------

def _strings(rng: np.random.Generator, n: int, lo: int, hi: int, alphabet: bytes,
             prefix: bytes = b"") -> pa.Array:
    """n strings of lo..hi characters (prefix included), random characters from alphabet."""
    lengths = rng.integers(lo - len(prefix), hi - len(prefix) + 1, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths + len(prefix), out=offsets[1:])
    body = np.frombuffer(alphabet, np.uint8)[rng.integers(0, len(alphabet), int(lengths.sum()))]
    data = np.empty(int(offsets[-1]), np.uint8)
    starts = offsets[:-1]
    for i, ch in enumerate(prefix):
        data[starts + i] = ch
    mask = np.ones(len(data), bool)
    for i in range(len(prefix)):
        mask[starts + i] = False
    data[mask] = body
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def make_table(rows: int, seed: int = 42) -> pa.Table:
    """~200 bytes a row: two longs, a timestamp, a double, three ~50-char strings, a bool."""
    rng = np.random.default_rng(seed)
    words = [f"customer-{i:05d}-" + "".join(rng.choice(list("abcdefghijklmnop"),
                                                         rng.integers(27, 44)))
             for i in range(5000)]      # a column with repeats (names, categories)
    start = 1_750_000_000_000_000
    return pa.table({
        "id": pa.array(np.arange(rows, dtype=np.int64)),
        "account": pa.array(rng.integers(0, 10_000_000, rows, dtype=np.int64)),
        "event_ts": pa.array(start + np.sort(rng.integers(0, 3_600_000_000, rows)),
                             pa.timestamp("us", tz="UTC")),
        "amount": pa.array(np.round(rng.normal(100, 50, rows), 2)),
        "name": pa.array(words).take(pa.array(rng.integers(0, len(words), rows))),
        "session": _strings(rng, rows, 42, 58, b"0123456789abcdef"),
        "url": _strings(rng, rows, 42, 58, b"abcdefghijklmnopqrstuvwxyz0123456789/-",
                        prefix=b"https://shop.example.com/p/"),
        "flag": pa.array(rng.random(rows) < 0.5),
    })


def python_rows(table: pa.Table) -> list[tuple]:
    """What a row-at-a-time writer gets: one tuple of Python values per row (timestamps as
    naive datetimes, as PySpark gives them)."""
    cols = [col.cast(pa.timestamp(col.type.unit)) if pa.types.is_timestamp(col.type) else col
            for col in table.columns]
    return list(zip(*(col.to_pylist() for col in cols)))


# -- contestants --------------------------------------------------------------------------

def stage_arrow(workdir: str, batches: list[pa.RecordBatch], compression: str | None) -> dict:
    wal = WalDir(os.path.join(workdir, "wal")).create()
    t0, c0 = time.perf_counter(), time.process_time()
    with SegmentWriter(wal, 0, 0, 0, compression=compression) as writer:
        for b in batches:
            writer.append(b)
        ref = writer.finish()
    stage_s, stage_cpu = time.perf_counter() - t0, time.process_time() - c0
    seal = seal_batch(wal, 0, [ref])
    with WalLog.open_writer(wal) as wal_log:
        t0, c0 = time.perf_counter(), time.process_time()
        wal_log.ingest(seal)
        ingest_s, ingest_cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": stage_s, "cpu_seconds": stage_cpu, "disk_bytes": ref.bytes,
            "ingest_seconds": ingest_s, "ingest_cpu_seconds": ingest_cpu,
            "log_bytes": tree_size(wal.log)}


def stage_pickle(workdir: str, rows: list[tuple]) -> dict:
    path = os.path.join(workdir, "rows.pickles")
    dumps, crc32, head = pickle.dumps, zlib.crc32, RECORD_HEAD.pack
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "wb", buffering=1 << 20) as f:
        write = f.write
        for row in rows:
            p = dumps(row, 5)
            write(head(len(p), crc32(p)))
            write(p)
        f.flush()
        os.fsync(f.fileno())
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "cpu_seconds": cpu, "disk_bytes": os.path.getsize(path)}


def stage_rocksdb(workdir: str, rows: list[tuple]) -> dict:
    from rocksdict import Options, Rdict
    path = os.path.join(workdir, "rows.rocksdb")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    dumps = pickle.dumps
    t0, c0 = time.perf_counter(), time.process_time()
    db = Rdict(path, opts)
    put, key = db.put, struct.Struct(">Q").pack
    for i, row in enumerate(rows):
        put(key(i), dumps(row, 5))
    db.flush_wal(True)
    db.close()     # a task closes its database (this flushes the memtable)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "cpu_seconds": cpu, "disk_bytes": tree_size(path)}


# -- running ------------------------------------------------------------------------------

def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import rocksdict
    versions = {"python": platform.python_version(), "pyarrow": pa.__version__,
                "numpy": np.__version__,
                "rocksdict": getattr(rocksdict, "__version__", _dist_version("rocksdict"))}
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "cpu": cpu,
            "loadavg_1_5_15": list(os.getloadavg()),
            "platform": platform.platform(), "versions": versions}


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def summarize(name: str, runs: list[dict], rows: int, logical: int) -> dict:
    seconds = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    disk = statistics.median(r["disk_bytes"] for r in runs)
    out = {
        "contestant": name, "reps": len(runs), "seconds": seconds, "cpu_seconds": cpu,
        "rows_per_cpu_s": rows / cpu if cpu else None,
        "rows_per_s": rows / seconds, "logical_mb_per_s": logical / seconds / MB,
        "disk_mb_per_s": disk / seconds / MB, "disk_bytes": disk,
        "disk_bytes_per_row": disk / rows, "runs": runs,
    }
    if "ingest_seconds" in runs[0]:
        ingest = statistics.median(r["ingest_seconds"] for r in runs)
        out.update(ingest_seconds=ingest, ingest_rows_per_s=rows / ingest,
                   ingest_cpu_seconds=statistics.median(r["ingest_cpu_seconds"] for r in runs),
                   ingest_logical_mb_per_s=logical / ingest / MB,
                   log_bytes=statistics.median(r["log_bytes"] for r in runs))
    return out


def table_markdown(results: list[dict], base: dict) -> str:
    head = ("| contestant | rows/s | logical MB/s | on-disk MB/s | on-disk B/row | on-disk MB "
            "| wall s | CPU s | rows/s vs arrow | CPU vs arrow | disk vs arrow | ingest rows/s |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    for r in results:
        ingest = f"{r['ingest_rows_per_s']:,.0f}" if "ingest_rows_per_s" in r else "n/a"
        lines.append(
            f"| {r['contestant']} | {r['rows_per_s']:,.0f} | {r['logical_mb_per_s']:,.1f} "
            f"| {r['disk_mb_per_s']:,.1f} | {r['disk_bytes_per_row']:.1f} "
            f"| {r['disk_bytes'] / MB:,.1f} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} "
            f"| {r['rows_per_s'] / base['rows_per_s']:.2f}x "
            f"| {r['cpu_seconds'] / base['cpu_seconds']:.2f}x "
            f"| {r['disk_bytes'] / base['disk_bytes']:.2f}x | {ingest} |")
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, default=10_000,
                    help="rows per Arrow chunk (Spark's arrow batch size; default 10000)")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    ap.add_argument("--no-rocksdb", action="store_true", help="skip the RocksDB-put contestant")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "staging.json"))
    args = ap.parse_args(argv)

    load_at_start = list(os.getloadavg())
    t0 = time.perf_counter()
    table = make_table(args.rows)
    batches = table.to_batches(max_chunksize=args.chunk_rows)
    logical = sum(b.nbytes for b in batches)
    rows = python_rows(table)
    gc.collect()
    gc.freeze()   # the million row tuples are input, not garbage: keep the GC off them
    print(f"# {args.rows:,} rows, {logical / args.rows:.1f} logical bytes/row "
          f"({logical / MB:,.1f} MB), {len(batches)} chunks of <= {args.chunk_rows:,} rows; "
          f"data made in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    contestants = {
        "arrow": lambda d: stage_arrow(d, batches, None),
        "arrow-lz4": lambda d: stage_arrow(d, batches, "lz4"),
        "arrow-zstd": lambda d: stage_arrow(d, batches, "zstd"),
        "pickle": lambda d: stage_pickle(d, rows),
    }
    if not args.no_rocksdb:
        contestants["rocksdb-put"] = lambda d: stage_rocksdb(d, rows)
    names = list(contestants)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    scratch_root = args.dir or tempfile.gettempdir()
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            work = tempfile.mkdtemp(prefix=f"bench-staging-{name}-", dir=scratch_root)
            try:
                gc.collect()
                run = contestants[name](work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            runs[name].append(run)
            print(f"rep {rep + 1}/{args.reps} {name:12s} {run['seconds']:7.2f}s "
                  f"(CPU {run['cpu_seconds']:6.2f}s)"
                  + (f"  ingest {run['ingest_seconds']:.2f}s" if "ingest_seconds" in run else ""),
                  file=sys.stderr)

    results = [summarize(n, runs[n], args.rows, logical) for n in names]
    base = results[0]
    for r in results:
        r["rows_per_s_vs_arrow"] = r["rows_per_s"] / base["rows_per_s"]
        r["cpu_seconds_vs_arrow"] = r["cpu_seconds"] / base["cpu_seconds"]
        r["disk_bytes_vs_arrow"] = r["disk_bytes"] / base["disk_bytes"]
    report = {
        "benchmark": "wal-staging",
        "command": "python bench/bench_staging.py " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": args.rows, "reps": args.reps, "chunk_rows": args.chunk_rows,
        "logical_bytes": logical, "logical_bytes_per_row": logical / args.rows,
        "machine": machine(), "loadavg_at_start": load_at_start, "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(table_markdown(results, base))
    print(f"\n(medians of {args.reps}; logical = Arrow in-memory bytes, "
          f"{logical / args.rows:.1f} B/row; CPU s = process CPU time, all threads; "
          f"load average {load_at_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
          f"results in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
