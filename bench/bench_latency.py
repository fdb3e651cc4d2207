"""Latency at small micro-batches: files of ``--batch-rows`` rows land in a folder at a steady
rate (half the sink's capacity unless ``--rate`` says otherwise) while each contestant writes
them to Cassandra; how soon is each row visible?

* ``ours``: a stream of the folder, one file a micro-batch, trigger ``processingTime`` of
  ``--trigger`` seconds, through our sink (full guarantee, defaults). Measured: commit-to-visible
  per batch (Spark's ``commits/N`` to the WAL's FLUSHED) and end to end per file (landed to
  visible).
* ``raw``: the reference, the raw cassandra-driver (replica-set batches, 32 in flight, no Spark)
  looking at the folder every ``--trigger`` seconds and writing each new file: end to end per
  file.

Each contestant gets one file first, not measured (Spark's first micro-batch and the driver's
first requests are start-up: see ``bench/batch_timeline.py`` for the first batch's cost); the
measured files land once it is visible. The capacity is measured first, in the same run: ``ours`` over ``--capacity-rows`` rows already
landed, in ``--batch-rows`` micro-batches, trigger ``availableNow`` (``bench_sinks.py``'s
contestant). Contestants run one after the other, each in its own process, on a fresh table.

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/bench_latency.py \\
        [--batch-rows 10000] [--trigger 2] [--seconds 150] [--rate ROWS_PER_S] \\
        [--out bench/results/latency_small.json] [--plot bench/results/latency_small.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_sinks  # noqa: E402
from bench_sinks import RESULTS, median, percentile  # noqa: E402

SENTINEL = "_fed"


def capacity(node, table, work: Path, rows: int, batch_rows: int, host: str,
             port: int) -> dict:
    """``ours`` over ``rows`` already landed, in ``batch_rows`` micro-batches: rows/s."""
    name = node.table("latency_capacity")
    node.truncate(name)
    landing = work / "capacity-landing"
    bench_sinks.write_landing(table.slice(0, rows), landing, batch_rows // 2)
    spec = {"host": host, "port": port, "keyspace": node.keyspace, "table": name,
            "landing": str(landing), "files_per_trigger": 2, "rows": rows,
            "checkpoint": str(work / "capacity-checkpoint")}
    result = bench_sinks.run_one("ours", spec, work)
    shutil.rmtree(work / "capacity-checkpoint", ignore_errors=True)
    return {"rows": rows, "seconds": result["seconds"],
            "rows_per_s": rows / result["seconds"]}


def run_contestant(mode: str, node, table, work: Path, args, rate: float) -> dict:
    name = node.table(f"latency_{mode}")
    node.truncate(name)
    landing, checkpoint = work / f"landing-{mode}", work / f"checkpoint-{mode}"
    for folder in (landing, checkpoint):
        shutil.rmtree(folder, ignore_errors=True)
    landing.mkdir(parents=True)
    spec = {"host": args.host, "port": args.port, "keyspace": node.keyspace, "table": name,
            "landing": str(landing), "checkpoint": str(checkpoint), "trigger_s": args.trigger}
    spec_path = work / f"spec-latency-{mode}.json"
    spec_path.write_text(json.dumps(spec))
    files = files_landed(rate, args.seconds, args.batch_rows)
    interval = args.batch_rows / rate
    log = open(work / f"log-latency-{mode}.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "contestants" / "latency.py"), "--spec",
         str(spec_path), "--mode", mode], cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
                        "PYSPARK_DRIVER_PYTHON": sys.executable})
    for line in proc.stdout:
        if line.startswith("READY"):
            break
    else:
        raise RuntimeError(f"{mode} did not start; see {log.name}")
    landed: dict[str, float] = {}
    staging = work / f"staging-{mode}"
    staging.mkdir(exist_ok=True)

    def land(fname: str, first_row: int) -> None:
        pq.write_table(table.slice(first_row, args.batch_rows), staging / fname)
        os.rename(staging / fname, landing / fname)     # whole, or not there
        landed[fname] = time.time()

    # One file first, not measured: Spark's first micro-batch (plans compiled, workers
    # started) and the raw cassandra-driver's first requests are start-up, not latency.
    land("part-warmup.parquet", files * args.batch_rows)
    deadline = time.monotonic() + 600
    while node.count(name) < args.batch_rows:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{mode}: the warm-up file never became visible")
        time.sleep(0.5)
    landed.clear()
    start = time.monotonic()
    for i in range(files):
        time.sleep(max(0.0, start + i * interval - time.monotonic()))
        land(f"part-{i:05d}.parquet", i * args.batch_rows)
    (landing / SENTINEL).write_text(str(files + 1))
    result = None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    proc.wait(600)
    log.close()
    if result is None:
        tail = Path(log.name).read_text()[-3000:]
        raise RuntimeError(f"{mode} failed (exit {proc.returncode}); stderr tail:\n{tail}")
    rows = node.count(name)
    end_to_end = [result["visible"][f] - landed[f] for f in sorted(landed)]
    out = {"files": files, "rows_expected": (files + 1) * args.batch_rows, "rows_in_table": rows,
           "rate_rows_per_s": rate, "interval_s": interval,
           "end_to_end_s": [round(v, 3) for v in end_to_end]}
    if mode == "ours":
        batches = result["batches"]
        out["commit_to_visible_s"] = [round(b["visible"] - b["committed"], 3)
                                      for b in batches.values()
                                      if b["visible"] is not None and b["committed"] is not None
                                      and "part-warmup.parquet" not in b["files"]]
        first = [b for b in batches.values() if "part-warmup.parquet" in b["files"]]
        if first and first[0]["visible"] is not None and first[0]["committed"] is not None:
            # The query's first batch (the warm-up file): its commit-to-visible against the
            # later ones' (the flusher and its session start while it stages).
            out["first_batch_commit_to_visible_s"] = round(first[0]["visible"]
                                                           - first[0]["committed"], 3)
        out["batches"] = len(batches)
        out["rows_per_batch_max"] = max(len(b["files"]) for b in batches.values()) * args.batch_rows
    return out


def files_landed(rate: float, seconds: float, batch_rows: int) -> int:
    return math.ceil(seconds * rate / batch_rows)


def rows_needed(rate: float, seconds: float, batch_rows: int) -> int:
    """The measured files and the warm-up file."""
    return (files_landed(rate, seconds, batch_rows) + 1) * batch_rows


def summary(values: list[float]) -> dict:
    return {"n": len(values), "median": median(values), "p90": percentile(values, 0.9),
            "p99": percentile(values, 0.99), "max": max(values) if values else None}


def plot(results: dict, path: str, batch_rows: int, trigger_s: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    series = [("ours: commit to visible", results.get("ours", {}).get("commit_to_visible_s")),
              ("ours: landed to visible", results.get("ours", {}).get("end_to_end_s")),
              ("raw cassandra-driver: landed to written",
               results.get("raw", {}).get("end_to_end_s"))]
    for label, values in series:
        if values:
            values = sorted(values)
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                    label=label)
    ax.axvline(2, color="grey", linestyle=":", linewidth=1)
    ax.axvline(5, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("share of batches / files")
    ax.set_title(f"Latency, {batch_rows:,}-row micro-batches at half capacity, "
                 f"{trigger_s:g} s trigger")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-rows", type=int, default=10_000)
    ap.add_argument("--trigger", type=float, default=2.0, help="seconds")
    ap.add_argument("--seconds", type=float, default=150.0, help="how long files land")
    ap.add_argument("--rate", type=float, help="rows/s landing (default: half the capacity)")
    ap.add_argument("--capacity-rows", type=int, default=200_000)
    ap.add_argument("--contestants", default="ours,raw")
    bench_sinks.add_node_arguments(ap)
    ap.add_argument("--out", default=str(RESULTS / "latency_small.json"))
    ap.add_argument("--plot", default=str(RESULTS / "latency_small.png"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    node = bench_sinks.Node(args.host, args.port)
    result = {"command": " ".join(["bench/bench_latency.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "machine": bench_sinks.machine(),
              "batch_rows": args.batch_rows, "trigger_s": args.trigger}
    try:
        need = (args.capacity_rows if args.rate is None
                else rows_needed(args.rate, args.seconds, args.batch_rows))
        table = bench_sinks.replicate(bench_sinks.flights_table(), need)
        rate = args.rate
        if rate is None:
            result["capacity"] = capacity(node, table, work, args.capacity_rows, args.batch_rows,
                                          args.host, args.port)
            rate = result["capacity"]["rows_per_s"] / 2
            print(f"capacity {result['capacity']['rows_per_s']:.0f} rows/s: landing "
                  f"{rate:.0f} rows/s")
            if table.num_rows < rows_needed(rate, args.seconds, args.batch_rows):
                table = bench_sinks.replicate(bench_sinks.flights_table(),
                                              rows_needed(rate, args.seconds, args.batch_rows))
        result["contestants"] = {}
        for mode in args.contestants.split(","):
            print(f"{mode} ...", flush=True)
            result["contestants"][mode] = run_contestant(mode, node, table, work, args, rate)
    finally:
        node.close()
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    print("| contestant | measure | n | median | p90 | p99 | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    result["summary"] = {}
    for mode, data in result["contestants"].items():
        for measure in ("commit_to_visible_s", "end_to_end_s"):
            if measure in data:
                s = summary(data[measure])
                result["summary"][f"{mode} {measure}"] = s
                print(f"| {mode} | {measure} | {s['n']} | {s['median']:.2f} | {s['p90']:.2f} | "
                      f"{s['p99']:.2f} | {s['max']:.2f} |")
        if "first_batch_commit_to_visible_s" in data:
            print(f"| {mode} | first batch (warm-up file), commit_to_visible_s | 1 | "
                  f"{data['first_batch_commit_to_visible_s']:.2f} | | | |")
        if data["rows_in_table"] != data["rows_expected"]:
            print(f"!! {mode}: {data['rows_in_table']} rows in the table, "
                  f"{data['rows_expected']} landed")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.plot:
        plot(result["contestants"], args.plot, args.batch_rows, args.trigger)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
