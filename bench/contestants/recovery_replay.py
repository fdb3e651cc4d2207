"""Contestant: recovery replay of pending batches (what ``cassandra-wal recover`` and a query
restart run): :class:`recovery.replay.Replayer` over a WAL whose batches are sealed and
committed by Spark but not flushed (left by the ``ours-staging`` contestant).

Timed from opening the log to the last batch marked FLUSHED: ingest of every seal into the
RocksDB log, reading the chunks back, converting and upserting every row.
``--profile PATH`` runs it under pyinstrument and writes the text report to PATH.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--profile")
    args = ap.parse_args()
    spec = common.load_spec()
    from recovery.output import CassandraOutput
    from recovery.replay import Replayer
    from recovery.target import RecordedTarget
    from wal.files import tree_size
    from wal.layout import WalDir
    from wal.log import WalLog
    from wal.recovery_policy import RecoveryPolicy

    checkpoint = spec["checkpoint"]
    wal = WalDir(os.path.join(checkpoint, "cassandra_wal")).check()
    # The flusher's own: one session, an Upserter per way a batch was sealed to be written.
    output = CassandraOutput(RecordedTarget.require(wal).target)

    profiler = None
    if args.profile:
        from pyinstrument import Profiler
        profiler = Profiler(interval=0.005)
    monitor = common.RssMonitor().start()
    started = time.monotonic()
    if profiler:
        profiler.start()
    wal_log = WalLog.open_writer(wal)
    try:
        report = Replayer(wal, wal_log, output.upserter, checkpoint).run(RecoveryPolicy.QUERY_START)
        log_bytes = tree_size(wal.log)
    finally:
        wal_log.close()
    seconds = time.monotonic() - started
    if profiler:
        profiler.stop()
        with open(args.profile, "w") as f:
            f.write(profiler.output_text(unicode=False, color=False, show_all=False))
    output.close()
    rss = monitor.stop()
    common.emit({"rows": report.rows_written, "seconds": seconds, "batches": len(report.replayed),
                 "rocksdb_log_bytes": log_bytes, "rss_mb": rss, "peak_rss_mb": rss["driver"]})


if __name__ == "__main__":
    main()
