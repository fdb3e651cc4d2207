"""A contestant of ``bench/bench_latency.py``: files land in a folder at a steady rate while this
process writes them to Cassandra; it reports when each became visible.

* ``--mode ours``: a stream of the landing folder (one file a micro-batch, trigger
  ``processingTime`` of the spec's ``trigger_s``) through our sink, full guarantee. Per batch:
  ``commits/N``'s mtime, the moment the WAL says it is FLUSHED (polled every 20 ms), and its
  files (Spark's ``sources/0`` log).
* ``--mode raw``: the raw cassandra-driver (``raw.py``'s replica-set batches, 32 in flight)
  looking at the folder every ``trigger_s`` seconds, writing each new file, and noting when it is
  written.

Either prints ``READY`` once it can take files, then runs until the harness's sentinel
``_fed`` (the number of files) is there and every file is visible, and prints one ``RESULT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SENTINEL = "_fed"


def fed(landing: str) -> int | None:
    try:
        with open(os.path.join(landing, SENTINEL)) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None


def landed_files(landing: str) -> list[str]:
    return sorted(f for f in os.listdir(landing) if f.endswith(".parquet"))


def batch_files(checkpoint: str) -> dict[int, list[str]]:
    """Spark's file source log: which files each batch read (``N`` and ``N.compact`` files,
    one JSON entry a line after the version line; a compact file repeats the entries of the
    batches before it, which may still have files of their own)."""
    folder = os.path.join(checkpoint, "sources", "0")
    batch_of: dict[str, int] = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if not name.split(".")[0].isdigit() or name.endswith(".crc") or name.endswith(".tmp"):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f.read().splitlines()[1:]:
                entry = json.loads(line)
                batch_of[os.path.basename(entry["path"])] = int(entry["batchId"])
    out: dict[int, list[str]] = {}
    for file_name, batch in sorted(batch_of.items()):
        out.setdefault(batch, []).append(file_name)
    return out


def run_ours(spec: dict) -> dict:
    from pyspark.sql import SparkSession

    import sinks
    from spark43 import FlushPoller, options

    spark, _ = common.spark_session(SparkSession.builder.appName("latency-ours"), spec)
    sinks.register(spark)
    checkpoint = spec["checkpoint"]
    poller = FlushPoller(checkpoint, os.path.join(checkpoint, "cassandra_wal"), 0.02).start()
    source = (spark.readStream.schema(common.SCHEMA_DDL).option("maxFilesPerTrigger", 1)
              .parquet(spec["landing"]))
    query = (source.writeStream.format("cassandra_wal").options(**options(spec))
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{spec['trigger_s']} seconds").start())
    print("READY", flush=True)
    while True:
        expected = fed(spec["landing"])
        if expected is not None:
            files = batch_files(checkpoint)
            done = sum(len(v) for v in files.values())
            if done >= expected and files and poller.flushed_through() >= max(files):
                break
        if query.exception():
            raise SystemExit(f"query failed: {query.exception()}")
        time.sleep(0.2)
    poller.poll()
    query.stop()
    poller.stop()
    files = batch_files(checkpoint)
    spark.stop()
    return {"visible": {f: poller.flushed[b] for b, names in files.items() for f in names},
            "batches": {str(b): {"files": names, "committed": poller.committed.get(b),
                                 "visible": poller.flushed.get(b)}
                        for b, names in sorted(files.items())}}


def run_raw(spec: dict) -> dict:
    from raw import RawWriter, rows_of

    writer = RawWriter(spec, "replicas", 32)
    print("READY", flush=True)
    visible: dict[str, float] = {}
    try:
        while True:
            started = time.monotonic()
            for name in landed_files(spec["landing"]):
                if name not in visible:
                    writer.write(rows_of(os.path.join(spec["landing"], name)))
                    visible[name] = time.time()
            expected = fed(spec["landing"])
            if expected is not None and len(visible) >= expected:
                break
            time.sleep(max(0.0, spec["trigger_s"] - (time.monotonic() - started)))
    finally:
        writer.close()
    return {"visible": visible}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--mode", choices=("ours", "raw"), required=True)
    args = ap.parse_args()
    spec = common.load_spec()
    result = run_ours(spec) if args.mode == "ours" else run_raw(spec)
    common.emit(result)


if __name__ == "__main__":
    main()
