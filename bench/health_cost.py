"""What one look at a WAL's health costs (``recovery/health.py: read_health``), the call behind
every ``sinks.status``, every scrape of the metrics endpoint and every ``cassandra-wal status``,
as the backlog grows: during an outage every committed batch stays pending, and each look
reads every pending batch's seal.

WALs with ``N`` pending batches (sealed, committed by Spark, not written; 2 segments of 5
rows each) beside 10 flushed ones, built through the real ``wal`` API
(``tests/helpers/walfactory.py``) in a temp folder; the sizes alternate within each round, so
that a busy moment of the (shared) machine hits all of them alike. Reported: the median, min
and max wall time of one ``read_health`` per size, and the median per pending batch. No node
needed.

    .venv/bin/python bench/health_cost.py [--pending 10,100,1000,3000] [--rounds N] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from recovery.health import read_health  # noqa: E402
from tests.helpers.walfactory import WalFactory  # noqa: E402
from wal.layout import WalDir  # noqa: E402

OUT = REPO / "bench" / "results" / "health_cost.json"
FLUSHED = 10


def build(root: Path, pending: int) -> tuple[WalDir, str]:
    with WalFactory(root / "wal", checkpoint=root / "cp") as f:
        for b in range(FLUSHED):
            f.flushed(b, rows=(3, 2))
        for b in range(FLUSHED, FLUSHED + pending):
            f.sealed(b, rows=(3, 2), committed=True)
    return WalDir.at(str(root / "wal")), str(root / "cp")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pending", default="10,100,1000,3000",
                   help="comma-separated pending batch counts (default: 10,100,1000,3000)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    sizes = [int(n) for n in args.pending.split(",")]
    with tempfile.TemporaryDirectory(prefix="health-cost-") as tmp:
        wals = {}
        for n in sizes:
            started = time.perf_counter()
            wals[n] = build(Path(tmp) / f"p{n}", n)
            print(f"built {n} pending batches in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for r in range(args.rounds):
            order = sizes if r % 2 == 0 else list(reversed(sizes))
            for n in order:
                wal, cp = wals[n]
                started = time.perf_counter()
                health = read_health(wal, cp)
                times[n].append(time.perf_counter() - started)
                assert health.pending_batches == n, (n, health.pending_batches)
    results = {}
    for n in sizes:
        median = statistics.median(times[n])
        results[str(n)] = {"median_ms": round(median * 1e3, 2),
                           "min_ms": round(min(times[n]) * 1e3, 2),
                           "max_ms": round(max(times[n]) * 1e3, 2),
                           "ms_per_pending_batch": round(median * 1e3 / n, 4)}
        print(f"{n:>6} pending: {median * 1e3:8.1f} ms median "
              f"({min(times[n]) * 1e3:.1f}-{max(times[n]) * 1e3:.1f}), "
              f"{median * 1e3 / n:.3f} ms a pending batch")
    doc = {"command": "python " + " ".join(shlex.quote(a) for a in [
               "bench/health_cost.py", *(argv if argv is not None else sys.argv[1:])]),
           "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                       "python": platform.python_version(), "loadavg": os.getloadavg()},
           "flushed_batches": FLUSHED, "rounds": args.rounds, "read_health": results}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
