"""What the driver spends taking one sealed batch into the RocksDB log (``WalLog.ingest``):
N rows of ``bench_staging.py``'s table in 4 segments of 10,000-row chunks, CPU seconds of this
process, per round, each way side by side: ``copy`` (the rows copied into the log, for the
``driver`` writer) and ``verify`` (the seal alone, every segment read and checked against it:
the scale-out writers on a local or shared folder). No Spark, no Cassandra. Usage::

    python bench/ingest_cost.py [--rows 250000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_staging import make_table  # noqa: E402
from wal.layout import WalDir  # noqa: E402
from wal.log import WalLog  # noqa: E402
from wal.seal import seal_batch  # noqa: E402
from wal.segment import SegmentWriter  # noqa: E402

SEGMENTS = 4


def one_round(table, rows: int, copy_rows: bool) -> tuple[float, float]:
    root = tempfile.mkdtemp(prefix="ingest-cost-")
    try:
        wal = WalDir(root).create()
        refs, per = [], rows // SEGMENTS
        for p in range(SEGMENTS):
            with SegmentWriter(wal, 0, p, 0, header={"query_id": "q", "columns": None}) as w:
                for rb in table.slice(p * per, per).to_batches(max_chunksize=10_000):
                    w.append(rb)
                refs.append(w.finish())
        seal = seal_batch(wal, 0, refs, "q", "checkpoint")
        wal_log = WalLog.open_writer(wal)
        try:
            c0, w0 = time.process_time(), time.perf_counter()
            wal_log.ingest(seal, copy_rows=copy_rows)
            return time.process_time() - c0, time.perf_counter() - w0
        finally:
            wal_log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=250_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    table = make_table(args.rows)
    for _ in range(args.rounds):
        got = {how: one_round(table, args.rows, how == "copy") for how in ("copy", "verify")}
        for how, (cpu, wall) in got.items():
            print(f"{args.rows} rows: ingest ({how}) {cpu:.3f} CPU-s "
                  f"({cpu / args.rows * 1e6:.2f} µs a row), wall {wall:.3f} s")
        print(f"  verify / copy: {got['verify'][0] / got['copy'][0]:.2f} of the CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
