"""Pipelined chunks against one chunk at a time, written to a real node by the sink's
:class:`recovery.upsert.Upserter`, side by side.

The flusher writes a batch's chunks with ``Upserter.write_chunks``: while one chunk's requests
are in flight, the next chunk is read and its requests built. Before, each chunk was built,
sent, and waited for before the next one was read (``write_chunk`` in a loop), leaving the node
idle while the client worked. Same rows, same requests, same grouping (the default,
``replica_set``), both table shapes of ``bench_grouping.py``; the variants alternate for
``--reps`` repetitions, the table truncated before each run. Reported: median rows/s, client
CPU µs a row, and the ratio pipelined / one at a time::

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/bench_pipeline.py [--rows 100000] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH / "contestants")]

import common  # noqa: E402
from bench_grouping import EVENTS_DDL, KEYSPACE, events_table, write_once  # noqa: E402
from bench_sinks import Node, add_node_arguments, flights_table, machine  # noqa: E402

VARIANTS = {"one-at-a-time": False, "pipelined": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    add_node_arguments(ap)
    ap.add_argument("--out", default=str(BENCH / "results" / "pipeline.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)

    admin = Node(args.host, args.port, KEYSPACE)
    admin.table("flights")
    admin.session.execute(EVENTS_DDL.format(ks=KEYSPACE))
    admin.close()
    shapes = {"flights": (common.COLUMNS, flights_table().slice(0, args.rows)),
              "events": (["id", "a", "d", "s", "b"], events_table(args.rows))}
    runs: dict[str, list[dict]] = {f"{s}/{v}": [] for s in shapes for v in VARIANTS}
    for rep in range(args.reps):
        for shape, (columns, data) in shapes.items():
            order = list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]
            for variant in order:
                result = write_once(args.host, args.port, shape, list(columns), data,
                                    "replica_set", pipelined=VARIANTS[variant])
                runs[f"{shape}/{variant}"].append(result)
                print(f"rep {rep} {shape}/{variant}: {result['rows_per_s']:,.0f} rows/s, "
                      f"{result['cpu_us_per_row']:.0f} µs CPU a row", file=sys.stderr, flush=True)
    summary = {name: {k: statistics.median(r[k] for r in results)
                      for k in ("rows_per_s", "cpu_us_per_row", "requests")}
               for name, results in runs.items()}
    for shape in shapes:
        fast, slow = summary[f"{shape}/pipelined"], summary[f"{shape}/one-at-a-time"]
        fast["rows_per_s_vs_one_at_a_time"] = round(fast["rows_per_s"] / slow["rows_per_s"], 2)
        fast["cpu_vs_one_at_a_time"] = round(fast["cpu_us_per_row"] / slow["cpu_us_per_row"], 2)
    out = {"command": "python " + " ".join(sys.argv), "rows": args.rows, "reps": args.reps,
           "machine": machine(), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("| table / variant | rows/s | client CPU µs/row | requests | vs one at a time (rows/s, CPU) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in summary.items():
        ratio = (f"{r['rows_per_s_vs_one_at_a_time']:.2f}x, {r['cpu_vs_one_at_a_time']:.2f}x"
                 if "rows_per_s_vs_one_at_a_time" in r else "1.00x, 1.00x")
        print(f"| {name} | {r['rows_per_s']:,.0f} | {r['cpu_us_per_row']:.0f} | {r['requests']:,} | {ratio} |")


if __name__ == "__main__":
    main()
