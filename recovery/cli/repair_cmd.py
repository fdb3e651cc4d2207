"""``cassandra-wal repair``: its arguments, the plan it prints (``--dry-run`` prints it and
changes nothing), its refusals with a hint, and exit codes. The repair itself is
:func:`wal.repair.repair`.
"""

from __future__ import annotations

import argparse
import json
import textwrap

from recovery.cli import CliError, UsageError, note, warn
from recovery.cli.location import shown
from recovery.cli.render import table, yes_no
from recovery.target import RecordedTarget
from wal import checkpoint as ckpt
from wal.errors import RepairRefused, WalLocked
from wal.layout import WalDir
from wal.log import WalLog
from wal.repair import (
    REWRITE_MEANS,
    RepairPlan,
    checkpoint_wals,
    default_keep,
    plan_repair,
    repair,
    spell,
)
from wal.schemes import is_local, is_remote

NAME = "repair"

DESCRIPTION = """\
Make Spark run batch K and every later one again from the source, and make the WAL ready for
it: the remedy for a batch Spark committed whose rows the WAL cannot give any more (a damaged
segment or seal with no good copy, see 'A corrupted WAL' in docs/runbook.md; a batch a
foreachBatch function lost). The source must still hold those rows: Spark reads it again from
where batch K-1 ended.

What it changes, with the query stopped (it takes the WAL's writer lock, as recover does):
  - every batch from K on leaves the WAL: its seal, segments and entry are moved into the
    kept copy, its records leave the log;
  - the log's m/committed_through and m/flushed_through, and the flushed_through file, are
    lowered to K-1 where higher (else Spark's re-run of K would count as committed as soon as
    it is sealed, or as written, and be skipped);
  - in the checkpoint, offsets/K.. and commits/K.. (with their .crc files) are moved into the
    kept copy: Spark then plans batch K again from the offsets of K-1 (deleting commits/ alone
    makes Spark re-run only its newest batch).
Everything removed is kept in WAL_DIR/repair-<UTC time>/ (or --keep), with repair.json saying
what and why. A repair cut short (a crash) fences the WAL until it is run again to its end.

A foreachBatch function writing several tables has a WAL for each and one checkpoint: Spark
re-runs the batches for every table, so every WAL the checkpoint names is repaired too.

It refuses, changing nothing: a WAL or checkpoint on a store (HDFS, S3: not supported yet); a
checkpoint with state/ (a stateful query: its state would not match the re-run); K above the
newest offsets/N, or one whose K-1 Spark no longer keeps; batches from K on that are already
written to Cassandra, unless --rewrite says writing them again is fine; a WAL of the
checkpoint with no target recorded yet, unless --force: a live run's first batch may be under
way there, whose flusher (and the lock the repair takes) has not started."""

EPILOG = textwrap.fill(f"--rewrite: {REWRITE_MEANS}.", 92) + """

exit codes: 0 repaired (or plan printed), 1 refused (the reason and what to do on stderr) or
            the WAL's lock is held (stop the query), 2 usage (a batch Spark never planned),
            3 the WAL cannot be read (corruption, not a WAL)

Examples:
  cassandra-wal repair /data/wal --checkpoint /data/checkpoints/q1 --from 42 --dry-run
  cassandra-wal repair /data/wal --checkpoint /data/checkpoints/q1 --from 42
  cassandra-wal repair /data/wal --from 42 --keep /backup/wal-repair --json
  cassandra-wal repair /data/wal --from 40 --rewrite      # batches 40.. were written already"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="have Spark run batches K.. again from the source and make "
                                  "the WAL ready for it (takes the WAL's lock)",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help="the WAL directory (a local folder)")
    p.add_argument("--checkpoint", metavar="CP",
                   help="the query's Spark checkpoint folder (default: target.json's "
                        "checkpoint_location)")
    p.add_argument("--from", dest="from_batch", metavar="K", type=_batch_id, required=True,
                   help="the first batch to run again")
    p.add_argument("--rewrite", action="store_true",
                   help="batches from K on already written to Cassandra may be written again "
                        "(new write timestamps)")
    p.add_argument("--force", action="store_true",
                   help="no run of the query is live anywhere: repair a WAL that records no "
                        "target yet (its run's flusher, and lock, may not have started)")
    p.add_argument("--keep", metavar="DIR",
                   help="where to keep what is removed (default: WAL_DIR/repair-<UTC time>)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    p.add_argument("--json", action="store_true", help="print the plan/result as JSON")
    p.set_defaults(run=run)
    return p


def _batch_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a batch id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"batch ids start at 0: {value}")
    return value


def _checkpoint(wal: WalDir, given: str | None) -> str:
    where = given or (RecordedTarget.read(wal) or RecordedTarget(None)).checkpoint_location
    if not where:
        raise UsageError(f"{wal.root} records no checkpoint (target.json)",
                         "pass the query's checkpointLocation with --checkpoint")
    if not is_local(where):
        raise CliError(f"the checkpoint {where} is on a store (HDFS, S3): repair is not "
                       f"supported on a store yet", "nothing was changed")
    return ckpt.local_path(where)


def run(args) -> int:
    if is_remote(args.wal_dir):
        raise CliError(f"{args.wal_dir} is on a store (HDFS, S3): repair is not supported on a "
                       f"store yet", "nothing was changed")
    wal = WalDir(args.wal_dir).check()
    checkpoint = _checkpoint(wal, args.checkpoint)
    try:
        if args.dry_run:
            return _dry_run(wal, checkpoint, args)
        report = repair(wal, checkpoint, args.from_batch, rewrite=args.rewrite, keep=args.keep,
                        force=args.force)
    except RepairRefused as exc:
        if exc.usage:
            raise UsageError(exc.reason, exc.hint) from None
        raise CliError(exc.reason, exc.hint) from None
    except WalLocked as exc:
        raise CliError(str(exc), "stop the query (or the recovery) first; nothing was "
                                 "changed") from None
    if args.json:
        print(json.dumps(dict(report.to_dict(), dry_run=False), indent=2))
        return 0
    _print_plan(report.plan, done=True)
    print(f"kept in: {report.keep} (with repair.json)")
    if report.resumed:
        note("finished a repair that an earlier run began")
    if not report.unblocked:
        warn("the WAL is still blocked by a batch before the repair's first: see the warning "
             "above")
    print(textwrap.fill(f"next: start the query on its checkpoint. {report.plan.rerun}.", 92))
    return 0


def _dry_run(wal: WalDir, checkpoint: str, args) -> int:
    readers: list[tuple[WalDir, WalLog | None]] = []
    try:
        for each in checkpoint_wals(wal, checkpoint):
            readers.append((each, WalLog.open_reader(each)))
        under_way = next((f for f in (r.repair_under_way() for _w, r in readers if r) if f),
                         None)
        plan = plan_repair(readers, checkpoint, args.from_batch, args.rewrite,
                           check=under_way is None, force=args.force)
    finally:
        for _w, reader in readers:
            if reader is not None:
                reader.close()
    keep = under_way["keep"] if under_way else (args.keep or default_keep(wal))
    if args.json:
        print(json.dumps({"dry_run": True, "plan": plan.to_dict(), "keep": keep,
                          "resumed": under_way is not None}, indent=2))
        return 0
    if under_way:
        note(f"a repair from batch {under_way['from']} began and did not finish: running "
             f"it again finishes it")
    _print_plan(plan, done=False)
    print(f"would keep in: {keep}")
    print("dry run: nothing was changed")
    return 0


def _print_plan(plan: RepairPlan, done: bool) -> None:
    verb = "repaired" if done else "repair of"
    print(f"{verb} {plan.checkpoint} and its WAL{'s' if len(plan.wals) > 1 else ''} from batch "
          f"{plan.from_batch} (Spark planned up to batch {plan.highest_offset})")
    moved = "moved" if done else "to move"
    for wal_plan in plan.wals:
        print(f"\nWAL {shown(WalDir(wal_plan.wal))}:")
        rows = [(b["batch"], b["state"], b["rows"], yes_no(b["committed"]),
                 yes_no(b["written"]), b["detail"]) for b in wal_plan.batches]
        if rows:
            print(table(("BATCH", "STATE", "ROWS", "COMMITTED", "WRITTEN", "DETAIL"), rows,
                        right=("ROWS",)))
        else:
            print(f"no batch from {plan.from_batch} on")
        if wal_plan.written:
            print(f"written again (--rewrite): {spell(wal_plan.written)}")
        print(f"files {moved}: {len(wal_plan.wal_files)}; markers: " + ", ".join(
            f"{name} {a} -> {b}" for name, (a, b) in wal_plan.markers.items()))
    print(f"\ncheckpoint files {moved}: {len(plan.checkpoint_files)} (offsets/ and commits/ "
          f"from {plan.from_batch} on, .crc files included)")
    for text in plan.warnings:
        warn(text)
