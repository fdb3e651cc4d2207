"""Pipelined chunks against one chunk at a time, written to a real node by the sink's
:class:`recovery.cql.upsert.Upserter`, side by side.

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

import logging
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH / "contestants")]

from bench_grouping import side_by_side  # noqa: E402
from bench_sinks import node_bench_arguments  # noqa: E402


def main() -> None:
    args = node_bench_arguments(__doc__, rows=100_000, reps=3, out="pipeline.json")
    logging.basicConfig(level=logging.ERROR)
    side_by_side(args, "variant", {"one-at-a-time": {"grouping": "replica_set", "pipelined": False},
                                   "pipelined": {"grouping": "replica_set", "pipelined": True}},
                 ("rows_per_s", "cpu_us_per_row", "requests"))


if __name__ == "__main__":
    main()
