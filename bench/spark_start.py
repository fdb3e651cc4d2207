"""What a test's Spark start costs, with and without the two things the tests do to make it
cheaper (``tests/helpers/spark_session.py``): the driver JVM's class archive and the workers'
pyspark imported from the venv instead of Spark's zip.

Each measurement is a fresh Python process that starts a local Spark session (the crash
driver's settings: ``local[2]``, the fast JVM) and runs a streaming query over four JSON files
into a Python data source that writes nothing, one file per batch: ``up`` is the session's
start, ``first`` the first batch (the Python workers start: the planner's, the tasks', the
commit's), ``rest`` the other three. The four variants alternate within each round; medians
over the rounds, and each variant's ratio to the plain start.

    .venv/bin/python bench/spark_start.py [--rounds 3] [--out bench/results/spark_start.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.node import java_home_env  # noqa: E402
from tests.helpers.spark_session import (FAST_JVM, class_archive,  # noqa: E402
                                         make_class_archive, spark_environment)

VARIANTS = {               # name: (class archive, workers import pyspark from the venv)
    "plain": (False, False),
    "archive": (True, False),
    "venv_pyspark": (False, True),
    "both": (True, True),
}

MEASURE = r'''
import json, os, sys, tempfile, time
from pathlib import Path
from pyspark.sql import SparkSession
from tests.helpers.spark_class_archive import nothing_source

folder = Path(tempfile.mkdtemp())
(folder / "in").mkdir()
for f in range(4):
    (folder / "in" / f"{f}.json").write_text(
        "".join(json.dumps({"id": f * 1000 + i, "v": "x"}) + "\n" for i in range(200)))
t0 = time.monotonic()
spark = (SparkSession.builder.master("local[2]").appName("spark-start")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
         .config("spark.driver.extraJavaOptions", sys.argv[1]).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(nothing_source())
up = time.monotonic() - t0
t1 = time.monotonic()
query = (spark.readStream.schema("id INT, v STRING").option("maxFilesPerTrigger", 1)
         .json(str(folder / "in")).writeStream.format("nothing")
         .option("checkpointLocation", str(folder / "checkpoint"))
         .trigger(processingTime="100 milliseconds").start())
first = None
while True:
    p = query.lastProgress
    if p is not None and first is None:
        first = time.monotonic() - t1
    if p is not None and p["batchId"] >= 3:
        break
    time.sleep(0.02)
rest = time.monotonic() - t1 - first
query.stop()
spark.stop()
print(json.dumps({"up": up, "first": first, "rest": rest}))
'''


def measure(archive: bool, venv_pyspark: bool) -> dict:
    options = FAST_JVM + (f" -XX:SharedArchiveFile={class_archive()} -Xshare:auto"
                          if archive else "")
    env = spark_environment() if venv_pyspark else dict(os.environ)
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    out = subprocess.run([sys.executable, "-c", MEASURE, options], env=env, check=True, cwd=REPO,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "spark_start.json"))
    args = parser.parse_args(argv)
    if not os.environ.get("JAVA_HOME"):
        os.environ.update(java_home_env())
    if make_class_archive() is None:
        print("the class archive could not be made", file=sys.stderr)
        return 1
    runs: dict = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            runs[name].append(measure(*VARIANTS[name]))
            print(f"round {round_ + 1} {name}: " + ", ".join(
                f"{k} {v:.2f}s" for k, v in runs[name][-1].items()), flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in ("up", "first", "rest")}
               for name, rs in runs.items()}
    for name, m in medians.items():
        m["total"] = m["up"] + m["first"] + m["rest"]
    plain = medians["plain"]["total"]
    print("\nmedians (s): variant, up, first batch, three more batches, total, plain/variant")
    for name, m in medians.items():
        print(f"  {name:13s} {m['up']:5.2f} {m['first']:5.2f} {m['rest']:5.2f} "
              f"{m['total']:6.2f}  {plain / m['total']:.2f}x")
    result = {"command": "bench/spark_start.py " + " ".join(argv or sys.argv[1:]),
              "when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
              "cores": os.cpu_count(), "load": os.getloadavg()[0], "rounds": args.rounds,
              "medians": medians, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
