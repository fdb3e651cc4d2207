"""``cassandra-wal inspect``: every batch of a WAL, its state, progress and recovery action.

Built on :func:`wal.catalog.describe` (the same view recovery plans from), with the log opened
as a RocksDB secondary (never the lock). Spark's checkpoint says which batches are committed:
``--checkpoint``, else ``target.json``'s ``checkpoint_location``, else unknown (``?``).

The top lines are the WAL's health (:mod:`recovery.health`, what ``cassandra-wal status`` and
the sink's metrics say): the blocked reason first when there is one, then the backlog against
``wal.maxBytes`` and the oldest pending batch's age. ``--watch`` redraws it all every few
seconds until interrupted (``--count``: that many times), each time from a fresh read-only
look at the WAL.
"""

from __future__ import annotations

import argparse
import json
import sys

from recovery.cli import EXIT_OK, UsageError, log_errors, warn
from recovery.cli.location import WAL_DIR_HELP, read_only_wal, shown
from recovery.cli.render import human_age, human_bytes, human_time, progress, table, yes_no
from recovery.health import Health, read_health
from recovery.target import RecordedTarget
from wal import checkpoint as ckpt
from wal import clock
from wal.catalog import BatchView, RecoveryAction, ViewState, describe
from wal.errors import WalCorrupted
from wal.format import FORMAT_VERSION
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.retention import wal_size
from wal.schemes import is_local, store_schemes_text

NAME = "inspect"

EPILOG = """\
columns:
  FLUSHED    rows acknowledged by Cassandra / rows of the batch (percent)
  COMMITTED  Spark's <checkpoint>/commits/N exists: yes, no, or ? (checkpoint unknown)
  ACTION     what recovery would do: replay, discard, wait, nothing, or error
rows pending: sealed rows Cassandra has not acknowledged yet, of batches to replay or waiting.

--json prints one object: {"wal": {...}, "health": {...}, "batches": [...], "totals": {...},
"size": {...}} (sizes in bytes, ages in seconds, "committed" true/false/null); "health" is
what `cassandra-wal status --json` prints. With --watch, one such object a line per refresh.

Examples:
  cassandra-wal inspect /data/wal
  cassandra-wal inspect /data/wal --checkpoint /data/checkpoints/q1
  cassandra-wal inspect /data/wal --json | jq '.batches[] | select(.action == "replay")'
  cassandra-wal inspect /data/wal --watch        # redraw every 2 s until Ctrl-C
  cassandra-wal inspect /data/wal --watch 10 --count 6 --json > samples.jsonl"""

#: The order of states in the summary line (any other state comes after them).
STATE_ORDER = (ViewState.STAGED, ViewState.SEALED, ViewState.FLUSHING, ViewState.FLUSHED,
               ViewState.DISCARDED, ViewState.MISSING)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="list the batches of a WAL, their state and recovery action",
                       description="List every batch of the WAL with its state, size, age, "
                                   "flush progress,\nSpark commit status and the action "
                                   "recovery would take; then totals\nand the WAL's size.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    p.add_argument("--checkpoint", metavar="CP",
                   help="Spark checkpoint folder (default: target.json's checkpoint_location)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--watch", metavar="SECONDS", nargs="?", type=_interval, const=2.0,
                   help="redraw every SECONDS (default 2) until interrupted")
    p.add_argument("--count", metavar="N", type=_count,
                   help="with --watch: stop after N refreshes")
    p.set_defaults(run=run)
    return p


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--watch {text}: not a positive number of seconds")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--count {text}: not a positive whole number")
    return int(text)


def resolve_checkpoint(wal: WalDir, given: str | None) -> tuple[str | None, str | None]:
    """(the checkpoint, a local folder or a store's URI, or None; where it came from:
    "option", "target.json", None)."""
    if given is not None:
        try:
            found = ckpt.exists(given)
        except ValueError as exc:
            raise UsageError(str(exc), f"pass the query's checkpointLocation: a local folder, "
                             f"{store_schemes_text()}") from None
        if not found:
            what = "no such directory" if is_local(given) else "no Spark checkpoint there"
            raise UsageError(f"--checkpoint {given}: {what}", "pass the query's checkpointLocation")
        return ckpt.normal_location(given), "option"
    try:
        recorded = RecordedTarget.read(wal)
    except WalCorrupted as exc:
        warn(f"cannot read {wal.target_file} ({exc.detail}); Spark's commits are unknown")
        return None, None
    location = recorded.checkpoint_location if recorded is not None else None
    if not location:
        return None, None
    try:
        found = ckpt.exists(location)
    except ValueError as exc:
        warn(f"{exc}; Spark's commits are unknown (pass --checkpoint)")
        return None, None
    if not found:
        warn(f"checkpoint {location} (from target.json) not found; Spark's commits are "
             f"unknown (pass --checkpoint)")
        return None, None
    return ckpt.normal_location(location), "target.json"


def flush_progress(view: BatchView) -> str | None:
    if view.seal is None:
        return None
    if view.state is ViewState.FLUSHED and view.record is None:   # forgotten by the log, seal kept
        return progress(view.rows, view.rows)
    if view.state in (ViewState.SEALED, ViewState.FLUSHING, ViewState.FLUSHED):
        return progress(view.flushed_rows, view.rows)
    return None


def batch_dict(view: BatchView) -> dict:
    d = view.to_dict()
    d["age_s"] = round(d["age_s"], 3)
    d["progress"] = flush_progress(view)
    seal = view.seal
    d["seal"] = None if seal is None else {
        "seal_id": seal.seal_id, "commit_point": seal.commit_point,
        "base_ts_us": seal.base_ts_us, "sealed_at_us": seal.sealed_at_us,
        "segments": len(seal.segments)}
    record = view.record
    d["log"] = None if record is None else {
        "state": record.state.value, "next_segment": record.next_segment,
        "next_chunk": record.next_chunk, "updated_at_us": record.updated_at_us}
    return d


def totals(views: list[BatchView]) -> dict:
    by_state: dict[str, int] = {}
    by_action: dict[str, int] = {}
    for v in views:
        by_state[v.state] = by_state.get(v.state, 0) + 1
        by_action[v.action] = by_action.get(v.action, 0) + 1
    pending = sum(max(v.rows - v.flushed_rows, 0) for v in views
                  if v.action in (RecoveryAction.REPLAY, RecoveryAction.WAIT)
                  and v.seal is not None)
    return {"batches": len(views), "by_state": by_state, "by_action": by_action,
            "rows_pending": pending}


def run(args) -> int:
    wal = read_only_wal(args.wal_dir)
    checkpoint, source = resolve_checkpoint(wal, args.checkpoint)
    if args.count is not None and args.watch is None:
        raise UsageError("--count goes with --watch", "add --watch [SECONDS]")
    if args.watch is None:
        show(wal, checkpoint, source, args.json)
        return EXIT_OK
    shown_times = 0
    try:
        while True:
            if not args.json:
                sys.stdout.write(CLEAR if sys.stdout.isatty() else "\n")
            show(wal, checkpoint, source, args.json, compact=True)
            sys.stdout.flush()
            shown_times += 1
            if args.count is not None and shown_times >= args.count:
                return EXIT_OK
            clock.sleep(args.watch)
    except KeyboardInterrupt:      # the way out of --watch: not an error
        return EXIT_OK


CLEAR = "\x1b[H\x1b[2J"          # cursor home, clear screen


def show(wal: WalDir, checkpoint: str | None, source: str | None, as_json: bool,
         compact: bool = False) -> None:
    """One look at the WAL: health first, then every batch, then totals."""
    wal_log = WalLog.open_reader(wal)
    try:
        with log_errors(wal):
            views = describe(wal, wal_log, checkpoint, RecoveryPolicy.QUERY_START)
            flushed_through = max(wal_log.flushed_through() if wal_log is not None else -1,
                                  wal.read_flushed_through())
            health = read_health(wal, checkpoint, wal_log=wal_log, views=views)
    finally:
        if wal_log is not None:
            wal_log.close()
    size = wal_size(wal)
    summary = totals(views)
    head = {"path": shown(wal), "format_version": FORMAT_VERSION,
            "checkpoint": checkpoint, "checkpoint_source": source,
            "log": wal_log is not None, "flushed_through": flushed_through}
    out = sys.stdout
    if as_json:
        json.dump({"wal": head, "health": health.to_dict(),
                   "batches": [batch_dict(v) for v in views], "totals": summary,
                   "size": size.to_dict()}, out, indent=None if compact else 2,
                  sort_keys=False)
        out.write("\n")
        return
    if flushed_through >= 0:
        log_line = f"flushed through batch {flushed_through}"
    elif wal_log is None:
        log_line = "none yet"
    else:
        log_line = "nothing flushed yet"
    for line in health_lines(health):
        print(line, file=out)
    print(f"WAL         {head['path']} (format {FORMAT_VERSION})", file=out)
    print(f"checkpoint  {f'{checkpoint} (from {source})' if checkpoint else 'unknown'}",
          file=out)
    print(f"log         {log_line}", file=out)
    print(file=out)
    if views:
        headers = ("BATCH", "STATE", "PARTS", "ROWS", "BYTES", "AGE", "FLUSHED", "COMMITTED",
                   "ACTION", "DETAIL")
        rows = [(v.batch, v.state, v.partitions, v.rows, human_bytes(v.bytes),
                 human_age(v.age_s), flush_progress(v) or "-", yes_no(v.committed), v.action,
                 v.detail) for v in views]
        print(table(headers, rows, right=("BATCH", "PARTS", "ROWS", "BYTES", "AGE")), file=out)
    else:
        print("no batches", file=out)
    print(file=out)
    states = sorted(summary["by_state"].items(),
                    key=lambda kv: STATE_ORDER.index(kv[0]) if kv[0] in STATE_ORDER else 99)
    detail = ", ".join(f"{n} {s}" for s, n in states)
    print(f"batches       {summary['batches']}" + (f" ({detail})" if detail else ""), file=out)
    print(f"rows pending  {summary['rows_pending']}", file=out)
    print(f"size          {human_bytes(size.total)} (segments {human_bytes(size.segments)}, "
          f"log {human_bytes(size.log)}, seals {human_bytes(size.seals)})", file=out)


def health_lines(health: Health) -> list[str]:
    """The top of the page: the blocked reason before anything else, then the backlog
    against the cap and the oldest pending batch."""
    lines = []
    if health.blocked_reason is not None:
        lines.append(f"BLOCKED     {health.blocked_reason}")
    cap = "?" if health.max_bytes is None else human_bytes(health.max_bytes)
    backlog = (f"{health.pending_batches} batches, {health.pending_rows} rows, "
               f"{human_bytes(health.pending_bytes)} of wal.maxBytes {cap}")
    if health.oldest_pending_age_s is not None:
        backlog += f"; oldest pending {human_age(health.oldest_pending_age_s)}"
    lines.append(f"health      {health.state}")
    lines.append(f"backlog     {backlog}")
    if health.last_written_batch is not None:
        lines.append(f"last write  batch {health.last_written_batch}, visible "
                     f"{health.last_write_latency_s:.1f} s after its commit; "
                     f"{health.rows_per_s:.0f} rows/s")
    done = health.last_written
    if done is not None:
        seen = "?" if done.commit_seen_at_us is None else human_time(done.commit_seen_at_us)
        watermark = ("none" if done.watermark_ms is None
                     else human_time(done.watermark_ms * 1000))
        lines.append(f"complete    batch {done.batch} of {done.target_table}: {done.rows} rows, "
                     f"commit seen {seen}, acknowledged {human_time(done.acknowledged_at_us)}, "
                     f"watermark {watermark}")
    lines.append("")
    return lines
