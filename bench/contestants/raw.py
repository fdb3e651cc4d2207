"""Contestant: the raw ``cassandra-driver``, no Spark. The most a Python client gets.

Reads the landing parquet files with pyarrow, turns each into row tuples (``to_pylist``, column
by column) and writes them with one prepared ``INSERT``:

* ``--mode args``: ``execute_concurrent_with_args(..., concurrency=C)``, one statement a row;
* ``--mode batch``: rows grouped by partition key into single-partition UNLOGGED batches of up
  to 32 rows, through ``execute_concurrent(..., concurrency=C)``;
* ``--mode replicas``: rows grouped by the replicas owning their partition
  (``cluster.metadata.get_replicas``) into UNLOGGED batches of up to 32 rows and 10 partitions,
  the grouping our sink uses by default, with cassandra-driver's own ``bind``;
* ``--procs P``: P processes, each with its own session, the files split between them.

Timed from before the first file is read to the last acknowledgement (everything is visible at
the spec's consistency level, ``LOCAL_QUORUM`` unless it says otherwise: what our sink and
the connector write at by default).

    python bench/contestants/raw.py --spec SPEC.json --mode args --concurrency 64 --procs 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def rows_of(path: str) -> list[tuple]:
    import pyarrow.parquet as pq
    table = pq.read_table(path, columns=common.COLUMNS)
    cols = [table.column(c).to_pylist() for c in common.COLUMNS]
    return list(zip(*cols))


class RawWriter:
    """One session and prepared INSERT; :meth:`write` sends rows the way ``mode`` says and
    returns once every one is acknowledged."""

    def __init__(self, spec: dict, mode: str, concurrency: int):
        from cassandra.cluster import Cluster

        from cassandra import ConsistencyLevel

        self.spec, self.mode, self.concurrency = spec, mode, concurrency
        self.cluster = Cluster(common.hosts(spec), port=spec["port"], protocol_version=5)
        self.session = self.cluster.connect()
        self.level = ConsistencyLevel.name_to_value[common.consistency(spec)]
        self.session.default_consistency_level = self.level
        self.stmt = self.session.prepare(common.insert_cql(spec["keyspace"], spec["table"]))
        self.key = [common.COLUMNS.index(c) for c in common.PARTITION_KEY]

    def write(self, rows: list[tuple]) -> int:
        from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
        from cassandra.query import BatchStatement, BatchType

        session, stmt = self.session, self.stmt
        if self.mode == "args":
            results = execute_concurrent_with_args(session, stmt, rows,
                                                   concurrency=self.concurrency,
                                                   raise_on_first_error=True)
        else:
            groups: dict[tuple, list] = {}
            for r in rows:
                groups.setdefault(tuple(r[i] for i in self.key), []).append(r)
            if self.mode == "replicas":
                groups = replica_set_groups(self.cluster, stmt, self.spec["keyspace"], groups)
            pending = []
            for members in groups.values():
                for i in range(0, len(members), 32):
                    part = members[i:i + 32]
                    if len(part) == 1:
                        pending.append((stmt, part[0]))
                        continue
                    b = BatchStatement(batch_type=BatchType.UNLOGGED,
                                       consistency_level=self.level)
                    for r in part:
                        b.add(stmt, r)
                    pending.append((b, ()))
            results = execute_concurrent(session, pending, concurrency=self.concurrency,
                                         raise_on_first_error=True)
        for ok, res in results:
            if not ok:
                raise res
        return len(rows)

    def close(self) -> None:
        self.cluster.shutdown()


def write_files(spec: dict, files: list[str], mode: str, concurrency: int) -> int:
    writer = RawWriter(spec, mode, concurrency)
    try:
        return sum(writer.write(rows_of(path)) for path in files)
    finally:
        writer.close()


def replica_set_groups(cluster, stmt, keyspace: str, partitions: dict) -> dict:
    """Partitions owned by the same replicas, at most 10 to a group (Cassandra's default
    warning threshold for multi-partition batches)."""
    groups: list[list] = []
    filling: dict[frozenset, list] = {}   # replicas -> [rows of the group being filled, partitions]
    for rows in partitions.values():
        owners = frozenset(cluster.metadata.get_replicas(keyspace, stmt.bind(rows[0]).routing_key))
        current = filling.get(owners)
        if current is None or current[1] == 10:
            current = filling[owners] = [[], 0]
            groups.append(current[0])
        current[0].extend(rows)
        current[1] += 1
    return dict(enumerate(groups))


def _child(args):
    spec, files, mode, conc = args
    return write_files(spec, files, mode, conc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--mode", choices=("args", "batch", "replicas"), default="args")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args()
    spec = common.load_spec()
    files = sorted(os.path.join(spec["landing"], f) for f in os.listdir(spec["landing"])
                   if f.endswith(".parquet"))
    monitor = common.RssMonitor().start()
    busy_before = common.machine_busy_s()
    started = time.monotonic()
    if args.procs == 1:
        rows = write_files(spec, files, args.mode, args.concurrency)
    else:
        shares = [files[i::args.procs] for i in range(args.procs)]
        with mp.get_context("fork").Pool(args.procs) as pool:
            rows = sum(pool.map(_child, [(spec, s, args.mode, args.concurrency) for s in shares]))
    seconds = time.monotonic() - started
    machine_cpu_s = common.machine_busy_s() - busy_before
    rss = monitor.stop()
    common.emit({"rows": rows, "seconds": seconds, "rss_mb": rss, "peak_rss_mb": rss["tree"],
                 "machine_cpu_s": machine_cpu_s, "cores_busy": machine_cpu_s / seconds})


if __name__ == "__main__":
    main()
