"""``cassandra-wal status``: one line and an exit code saying whether a WAL keeps up, for a
monitoring check (Nagios-style: 0 healthy, 1 lagging, 2 blocked).

The figures are :mod:`recovery.health`'s, read as ``inspect`` reads them (a RocksDB secondary
in a temporary folder, never the lock): beside a live sink it disturbs nothing. Retries and
replays are counted by the live flusher only: ``sinks.status(query)`` or the metrics
endpoint show them.
"""

from __future__ import annotations

import argparse
import json
import sys

from recovery.cli import UsageError, log_errors
from recovery.cli.inspect_cmd import resolve_checkpoint
from recovery.cli.location import WAL_DIR_HELP, read_only_wal
from recovery.cli.render import human_age, human_bytes
from recovery.health import LAG_AFTER_S, Health, HealthState, read_health

NAME = "status"

EXIT_HEALTHY, EXIT_LAGGING, EXIT_BLOCKED = 0, 1, 2
EXIT_OF = {HealthState.HEALTHY: EXIT_HEALTHY, HealthState.LAGGING: EXIT_LAGGING,
           HealthState.BLOCKED: EXIT_BLOCKED}

EPILOG = """\
exit codes (status only):
  0  healthy: nothing committed has waited --lag-after seconds to be written
  1  lagging: a committed batch has waited longer, or the backlog is over wal.maxBytes
  2  blocked: the flusher cannot go on (blocked.json), or a committed batch cannot be
     written (no seal, a damaged one); the line gives the reason
  (as for every command: a bad command line also exits 2, a damaged or unsupported WAL 3,
  and any other error, e.g. a store that does not answer, 1 with its message on stderr)

--json prints one object: the state, the blocked reason, the backlog (batches, rows, bytes),
max_bytes, the oldest pending age, the last batch written and its latency, rows/s.

Examples:
  cassandra-wal status /data/wal
  cassandra-wal status /data/wal --lag-after 120 || page-the-operator
  cassandra-wal status /data/wal --json | jq .pending_rows"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="one line of health; exit 0 healthy, 1 lagging, 2 blocked",
                       description="Say in one line whether the WAL keeps up: its backlog "
                                   "against wal.maxBytes,\nthe oldest unwritten batch, the "
                                   "last batch written, or why it is blocked.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    p.add_argument("--checkpoint", metavar="CP",
                   help="Spark checkpoint folder (default: target.json's checkpoint_location)")
    p.add_argument("--lag-after", metavar="SECONDS", type=float, default=LAG_AFTER_S,
                   help=f"a committed batch unwritten this long is lagging (default "
                        f"{LAG_AFTER_S:.0f})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    if not args.lag_after > 0:
        raise UsageError(f"--lag-after {args.lag_after}: not a positive number of seconds",
                         "e.g. --lag-after 60")
    wal = read_only_wal(args.wal_dir)
    checkpoint, _ = resolve_checkpoint(wal, args.checkpoint)
    with log_errors(wal):
        health = read_health(wal, checkpoint, lag_after_s=args.lag_after)
    if args.json:
        json.dump(health.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(one_line(health))
    return EXIT_OF[health.state]


def one_line(health: Health) -> str:
    """The state first, then the backlog against the cap and the last write."""
    if health.state == HealthState.BLOCKED:
        return f"blocked: {health.blocked_reason}"
    cap = "?" if health.max_bytes is None else human_bytes(health.max_bytes)
    line = (f"{health.state}: {health.pending_batches} batches pending ({health.pending_rows} "
            f"rows, {human_bytes(health.pending_bytes)} of wal.maxBytes {cap})")
    if health.oldest_pending_age_s is not None:
        line += f", oldest {human_age(health.oldest_pending_age_s)}"
    if health.flushed_through < 0:
        return line + "; nothing written yet"
    line += f"; written through batch {health.flushed_through}"
    if health.last_write_latency_s is not None:
        line += (f" (batch {health.last_written_batch} visible "
                 f"{health.last_write_latency_s:.1f} s after its commit, "
                 f"{health.rows_per_s:.0f} rows/s)")
    return line
