"""Two versions of the sink side by side: ``bench_sinks.py`` run from a git worktree of an older
commit and from this tree, alternating, one repetition each, so that both meet the same machine
(it is shared and noisy: compare the ratios, not the seconds).

Each run times ``ours`` (the sink, full guarantee) and ``spark-floor`` (a Python data source that
writes nothing: Spark's own cost) over the same rows; the figure that says whether the sink got
slower is ``ours / spark-floor`` of each side, median over the rounds.

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/ab_commits.py --old 2897704 \\
        [--rounds 3] [--rows 100000] [--batch-rows 25000] [--out bench/results/ab.json]

The older commit's worktree goes to a temporary folder (removed afterwards); its code is put
first on ``PYTHONPATH``, so its driver, its Spark workers and its contestants import it, not
this tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_side(tree: str, args, out: str, work: str) -> dict:
    """One ``bench_sinks.py`` run of ``ours`` and ``spark-floor`` from ``tree``."""
    cmd = [sys.executable, os.path.join(tree, "bench", "bench_sinks.py"),
           "--rows", str(args.rows), "--reps", "1", "--batch-rows", str(args.batch_rows),
           "--contestants", "ours,spark-floor", "--memory-batches", "", "--no-profile",
           "--plots", "", "--out", out, "--work", work]
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=1800)
    with open(out) as f:
        result = json.load(f)
    ours = result["contestants"]["ours"]["rows_per_s"]
    floor = result["contestants"]["spark-floor"]["rows_per_s"]
    return {"ours_rows_per_s": ours, "spark_floor_rows_per_s": floor,
            "ours_vs_spark_floor": round(ours / floor, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the older commit (any git revision)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch-rows", type=int, default=25_000)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ab.json"))
    args = ap.parse_args()
    old_rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="cwal-ab-") as scratch:
        old_tree = os.path.join(scratch, "old")
        subprocess.run(["git", "worktree", "add", "-q", "--detach", old_tree, old_rev],
                       cwd=ROOT, check=True)
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        try:
            for round_ in range(args.rounds):
                for side, tree in (("old", old_tree), ("new", ROOT)):
                    started = time.monotonic()
                    result = run_side(tree, args, os.path.join(scratch, f"{side}-{round_}.json"),
                                      os.path.join(scratch, f"work-{side}-{round_}"))
                    runs[side].append(result)
                    print(f"round {round_ + 1} {side}: ours {result['ours_rows_per_s']:,.0f} "
                          f"rows/s, spark-floor {result['spark_floor_rows_per_s']:,.0f}, "
                          f"ratio {result['ours_vs_spark_floor']} "
                          f"({time.monotonic() - started:.0f} s)", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old_tree], cwd=ROOT)
    medians = {side: statistics.median(r["ours_vs_spark_floor"] for r in rs)
               for side, rs in runs.items()}
    summary = {"command": " ".join(["python", "bench/ab_commits.py", *sys.argv[1:]]),
               "old": old_rev, "new": new_rev, "rows": args.rows, "batch_rows": args.batch_rows,
               "ours_vs_spark_floor_median": medians,
               "new_vs_old": round(medians["new"] / medians["old"], 3), "runs": runs}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps({k: summary[k] for k in ("old", "new", "ours_vs_spark_floor_median",
                                              "new_vs_old")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
