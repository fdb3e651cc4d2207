"""What the one-task-per-key check of a change stream in sealed order costs (issue 35).

A change stream without a ``writetime`` column has each task report its distinct keys, hashed
(:mod:`sinks.worker.key_order`, :mod:`recovery.cql.key_identity`), and the commit look for a key in two
tasks. Side by side, in one process, on the same rows (a text partition key, an int clustering
column, two values, an ``op`` column; ``--tasks`` tasks of ``--rows`` rows each, keys
distinct across tasks):

* ``writetime``: ``op.column`` with a ``writetime`` column, which needs no check (the baseline);
* ``sealed``: ``op.column`` in sealed order, checked;
* ``sealed+P``: the same with ``op.partitionDeleteValues`` (partition keys reported too).

For each, a task's staging (:func:`sinks.worker.plan.stage_partition`, Arrow batches of
``--chunk-rows``, into a WAL in ``--dir``) in rows/s, the commit message's bytes a row, and the
commit (:func:`sinks.worker.plan.commit_batch`, seal included) in ms. Contestants alternate,
the order rotating each repetition; medians of ``--reps``; ratios against ``writetime``.

Usage::

    .venv/bin/python bench/key_check_cost.py [--rows N] [--tasks T] [--reps R] [--dir DIR]

Prints a markdown table and writes ``bench/results/key_check_cost.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recovery.config import SinkConfig  # noqa: E402
from recovery.cql.config import WriteConfig  # noqa: E402
from recovery.cql.table import TableSchema  # noqa: E402
from recovery.target import Target  # noqa: E402
from sinks.worker.plan import WritePlan, commit_batch, stage_partition  # noqa: E402
from wal.layout import WalDir  # noqa: E402

TABLE = TableSchema("ks", "flights", (("carrier", "text"), ("flight", "int"), ("dest", "text"),
                                      ("delay", "bigint")), ("carrier",), ("flight",))
CONTESTANTS = {
    "writetime": WriteConfig(op_column="op", writetime_column="lsn"),
    "sealed": WriteConfig(op_column="op"),
    "sealed+P": WriteConfig(op_column="op", partition_delete_values=("P",)),
}


def task_rows(task: int, rows: int, chunk: int) -> list[pa.RecordBatch]:
    """A task's rows: 20 flights a carrier, carriers of this task only; every tenth row a
    delete, the rest upserts."""
    out = []
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        index = range(start, start + n)
        out.append(pa.record_batch({
            "carrier": pa.array([f"c{task}-{i // 20}" for i in index], pa.string()),
            "flight": pa.array([i % 20 for i in index], pa.int32()),
            "dest": pa.array(["SFO"] * n, pa.string()),
            "delay": pa.array(list(index), pa.int64()),
            "op": pa.array(["d" if i % 10 == 0 else "u" for i in index], pa.string()),
            "lsn": pa.array([task * rows + i for i in index], pa.int64())}))
    return out


def run_once(name: str, base: Path, inputs: list[list[pa.RecordBatch]]) -> dict:
    root = base / name
    shutil.rmtree(root, ignore_errors=True)
    wal = WalDir(str(root)).create()
    write = CONTESTANTS[name]
    config = SinkConfig(keyspace="ks", table="flights", write=write)
    stored = ("carrier", "flight", "dest", "delay", "op") + (("lsn",) if write.writetime_column
                                                             else ())
    plan = WritePlan(config=config, wal_root=wal.root, stored_columns=stored,
                     target=Target(config, TABLE, ("carrier", "flight", "dest", "delay")))
    started = time.perf_counter()
    messages = [stage_partition(plan, [rb.select(list(stored)) for rb in batches], 0, task, 0)
                for task, batches in enumerate(inputs)]
    staged = time.perf_counter() - started
    started = time.perf_counter()
    commit_batch(plan, messages, 0, commit_point="seal")
    committed = time.perf_counter() - started
    rows = sum(b.num_rows for batches in inputs for b in batches)
    plain = len(pickle.dumps([type(m)(m.segment, m.query_id) for m in messages]))
    return {"stage_rows_per_s": rows / staged, "commit_ms": committed * 1000,
            "key_bytes_per_row": (len(pickle.dumps(messages)) - plain) / rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows a task")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--chunk-rows", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the WALs go (default: a temp folder)")
    p.add_argument("--out", default=str(ROOT / "bench/results/key_check_cost.json"))
    args = p.parse_args(argv)
    inputs = [task_rows(t, args.rows, args.chunk_rows) for t in range(args.tasks)]
    base = Path(args.dir or tempfile.mkdtemp(prefix="key_check_cost-"))
    names = list(CONTESTANTS)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            runs[name].append(run_once(name, base, inputs))
    shutil.rmtree(base, ignore_errors=True)
    medians = {n: {k: statistics.median(r[k] for r in runs[n]) for k in runs[n][0]}
               for n in names}
    baseline = medians["writetime"]
    print("| contestant | staging rows/s | vs writetime | commit ms | vs writetime | "
          "key bytes/row |\n|---|---:|---:|---:|---:|---:|")
    for n in names:
        m = medians[n]
        print(f"| {n} | {m['stage_rows_per_s']:,.0f} | "
              f"{m['stage_rows_per_s'] / baseline['stage_rows_per_s']:.2f} | "
              f"{m['commit_ms']:.1f} | {m['commit_ms'] / baseline['commit_ms']:.2f} | "
              f"{m['key_bytes_per_row']:.1f} |")
    result = {"command": "python bench/key_check_cost.py " + " ".join(argv or sys.argv[1:]),
              "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.platform(), "rows_per_task": args.rows,
              "tasks": args.tasks, "chunk_rows": args.chunk_rows, "reps": args.reps,
              "medians": medians}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
