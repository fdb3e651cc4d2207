"""``cassandra-wal amend``: an operator's choice for sealed batches a column dropped since their
seal would hide (:mod:`wal.amendments`): write them without those columns, or at timestamps
above the drop. Its arguments, the plan it prints (``--dry-run`` changes nothing), its
refusals with a hint, and exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from recovery.cli import EXIT_OK, CliError, UsageError
from recovery.cli.location import WAL_DIR_HELP, shown, working_wal
from recovery.cli.render import table
from recovery.cql import credentials
from recovery.cql.credentials import ENV_PASSWORD, ENV_USERNAME
from recovery.cql.errors import ConnectionFailed, is_transient_answer
from recovery.output import CassandraOutput, segment_rows
from recovery.target import RecordedTarget, Target
from wal import catalog
from wal import checkpoint as ckpt
from wal.amendments import Amendment, amended, read_amendment, write_amendment
from wal.catalog import RecoveryAction
from wal.errors import SegmentMissing
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy
from wal.seal import Seal, next_base_timestamp

NAME = "amend"

DESCRIPTION = """\
Write sealed batches otherwise than sealed, as an operator decides, when a column they write
was dropped after they were sealed. Cassandra hides every cell of a dropped column written at
or before the drop, even once a column of that name is added again, so such a batch cannot
land as sealed and the sink blocks on it (the reason names the batch and this command). Both
ways out lose something; choose one:

  --without-column C   write the batches without C: C's values in them are lost;
  --restamp            write them at timestamps just above the drop (in batch order): their
                       rows then win over whatever was written to their keys since (asks the
                       cluster for the drop time; not for batches with their own writetime).
                       They still write the dropped columns: a column the table has no more
                       must be added again first, or Cassandra refuses the batch.
                       Later sealed batches that would fall below them are re-stamped after
                       them, so a later batch still wins over an earlier one.

The choice is recorded in WAL_DIR/amended/<batch>.json before the flusher writes the batch
again, so every later write of it (a crash, a restart) makes the same cells. It may run beside
the running query: the flusher tries the blocked batch again every few seconds."""

EPILOG = f"""\
Credentials for --restamp as for recover: --username, the password in ${ENV_PASSWORD} (or
the variable --password-env names); connection settings as target.json recorded them.

exit codes: 0 amended (or plan printed), 1 refused, or Cassandra unreachable for --restamp
            (why and what to do on stderr; nothing recorded), or the disk refused to record
            it (full: run it again with room), 2 usage, 3 the WAL cannot be read

Examples:
  cassandra-wal amend /data/wal --pending --without-column notes --dry-run
  cassandra-wal amend /data/wal --batch 42 --without-column notes
  cassandra-wal amend /data/wal --pending --restamp --json"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="write batches a dropped column would hide without it, or "
                                  "above the drop (an operator's choice)",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--batch", type=int, metavar="N", help="the batch to amend")
    which.add_argument("--pending", action="store_true",
                       help="every batch Spark committed that is not written yet and that the "
                            "choice concerns")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--without-column", action="append", metavar="C", dest="without",
                     help="a DataFrame column to leave out (repeatable)")
    how.add_argument("--restamp", action="store_true",
                     help="write at timestamps above the drop of the columns that hide them")
    p.add_argument("--checkpoint", metavar="CP",
                   help="the query's Spark checkpoint (default: target.json's)")
    p.add_argument("--username", help=f"user name (default: ${ENV_USERNAME})")
    p.add_argument("--password-env", default=ENV_PASSWORD, metavar="VAR",
                   help=f"environment variable holding the password (default {ENV_PASSWORD})")
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    p.add_argument("--json", action="store_true", help="print the plan/result as JSON")
    p.set_defaults(run=run)
    return p


def _pending(wal: WalDir, checkpoint: str | None) -> dict[int, catalog.BatchView]:
    """Batches with a seal not fully written yet, by id: those Spark committed, and those
    sealed that it has not committed yet (a re-stamp keeps them above the batches before)."""
    views = catalog.describe_read_only(wal, checkpoint, RecoveryPolicy.QUERY_FLUSHER)
    return {v.batch: v for v in views if v.action == RecoveryAction.REPLAY
            or (v.action == RecoveryAction.WAIT and v.seal is not None)}


def _target(wal: WalDir, args) -> Target:
    recorded = RecordedTarget.read(wal)
    if recorded is None or not recorded.target_fields:
        raise UsageError(f"{wal.root} records no target (target.json)",
                         "is this the WAL of a cassandra_wal sink?")
    given = {"username": args.username, "password": os.environ.get(args.password_env)}
    return recorded.target.with_credentials(credentials.layered(given))


def plan(wal: WalDir, views: dict[int, catalog.BatchView], args,
         output: CassandraOutput | None) -> list[Amendment]:
    """The amendments the command would record, in batch order (``output``: to ask the
    cluster for drop times, with ``--restamp``)."""
    committed = {b: v for b, v in views.items() if v.action == RecoveryAction.REPLAY}
    batches = [args.batch] if args.batch is not None else sorted(committed)
    for batch in batches:
        if batch not in committed:
            raise CliError(f"batch {batch} is not waiting to be written (Spark has not "
                           f"committed it, or it is written already)",
                           "cassandra-wal inspect lists the batches and what they wait for")
    if args.without:
        return [a for a in (_without(wal, views[b], args) for b in batches) if a is not None]
    return _restamp(wal, views, batches, args, output)


def _earlier(wal: WalDir, seal: Seal) -> Amendment | None:
    """The amendment already recorded for ``seal`` (None: none, or one of another seal of its
    batch, which says nothing of this one)."""
    earlier = read_amendment(wal, seal.batch)
    return earlier if earlier is not None and earlier.amends(seal) else None


def _seal(view: catalog.BatchView) -> Seal:
    return view.seal or view.record.seal


def _without(wal: WalDir, view: catalog.BatchView, args) -> Amendment | None:
    seal = _seal(view)
    write = amended(wal, seal).write
    columns = write.columns if write is not None else ()
    gone = tuple(c for c in args.without if c in columns)
    if not gone:
        if args.batch is not None:
            raise CliError(f"batch {view.batch} does not write {', '.join(args.without)}",
                           f"it writes: {', '.join(columns)}")
        return None
    earlier = _earlier(wal, seal)
    return Amendment(view.batch, tuple(sorted(set(gone) | set(
        earlier.without_columns if earlier else ()))),
        earlier.base_ts_us if earlier else None,
        f"written without {', '.join(gone)}: dropped after the batch was sealed",
        seal_id=seal.seal_id)


def _restamp(wal: WalDir, views: dict[int, catalog.BatchView], batches: list[int], args,
             output: CassandraOutput) -> list[Amendment]:
    """Each chosen batch a drop hides, above the drop; and once one is, every later batch with
    a seal whose timestamps would then fall below the batch before it, in order (left there,
    its rows would lose to an earlier batch's on the keys both write)."""
    out: list[Amendment] = []
    next_base = None        # once a batch is re-stamped: the next batch's lowest timestamp
    chosen = set(batches)
    for batch in sorted(chosen | {b for b in views if chosen and b > min(chosen)}):
        view = views[batch]
        seal = _seal(view)
        current = amended(wal, seal)
        hidden = output.dropped_after_seal(current, lambda: _rows(wal, seal)) \
            if batch in chosen else []
        # Above every earlier batch as it is written (one re-stamped before included), and
        # above what this plan re-stamps before it.
        lowest_base = max(next_base_timestamp(wal, batch, clock_us=0), next_base or 0)
        if not hidden and current.base_ts_us >= lowest_base:
            if args.batch is not None and batch == args.batch:
                raise CliError(f"batch {batch} writes no column dropped after its seal: it "
                               f"lands as sealed", "nothing to amend")
            if next_base is not None:
                next_base = current.last_ts_us + 1
            continue
        why = (f"re-stamped above the drop of {', '.join(c for c, _ in hidden)}" if hidden
               else f"re-stamped to stay above batch {batch - 1}, re-stamped before it")
        write = output.current_target().as_sealed(seal.write).config.write
        if write.writetime_column or write.writetime_micros is not None:
            raise CliError(f"batch {batch} carries the user's own write timestamps "
                           f"(writetime): re-stamping them is not the sink's to decide",
                           "use --without-column for the dropped columns (nothing was "
                           "recorded)")
        if view.flushed_rows:
            raise CliError(f"batch {batch} is partly written ({view.flushed_rows} rows at its "
                           f"sealed timestamps): re-stamping the rest would split it",
                           "use --without-column for it (nothing was recorded)")
        base = max([t + 1 for _, t in hidden] + [lowest_base])
        next_base = base + seal.rows
        earlier = _earlier(wal, seal)
        out.append(Amendment(batch, earlier.without_columns if earlier else (), base, why,
                             seal_id=seal.seal_id))
    return out


def _storage_error(wal: WalDir, exc: OSError, batch: int, recorded: list[int]) -> CliError:
    """The disk holding the WAL refused an amendment's write (full, read-only, failing): a
    storage error, as the log's (exit 1), not a WAL that cannot be read."""
    where = os.fsdecode(exc.filename) if exc.filename else wal.amendments
    done = (f"the amendments of batches {', '.join(map(str, sorted(recorded)))} were "
            f"recorded, not those of batch {batch} and earlier" if recorded
            else "nothing was recorded")
    return CliError(f"{where}: {exc.strerror or exc}: the disk holding the WAL refused the "
                    f"amendment of batch {batch}; {done}",
                    "run the same command again once that disk has room (or is writable "
                    "again): it records what is missing")


def _rows(wal: WalDir, seal: Seal):
    """The batch's rows, from its segments (for the user's own write timestamps)."""
    try:
        yield from segment_rows(wal, seal)
    except SegmentMissing:
        raise CliError(f"batch {seal.batch}'s segments went away while amend read them (the "
                       f"running query wrote the batch meanwhile?); nothing was recorded",
                       "run it again") from None


def run(args) -> int:
    wal = working_wal(args.wal_dir)
    given = args.checkpoint or (RecordedTarget.read(wal) or RecordedTarget(None)).checkpoint_location
    checkpoint = ckpt.normal_location(given) if given else None
    views = _pending(wal, checkpoint)
    output = CassandraOutput(_target(wal, args)) if args.restamp else None
    try:
        amendments = plan(wal, views, args, output)
    except Exception as exc:  # noqa: BLE001 - Cassandra away is said; anything else raised
        if not isinstance(exc, ConnectionFailed) and not is_transient_answer(exc):
            raise
        hosts = ", ".join(output.current_target().config.connection.hosts)
        said = str(exc) if isinstance(exc, ConnectionFailed) else \
            f"Cassandra at {hosts} did not answer: {type(exc).__name__}: {exc}"
        raise CliError(f"{said}: --restamp reads the drop times from the cluster, so nothing "
                       f"was recorded", f"run it again once Cassandra answers at {hosts} (the "
                       "contact points target.json recorded); --without-column needs no "
                       "connection") from None
    finally:
        if output is not None:
            output.close()
    if not args.dry_run:
        # Newest first: cut short (Ctrl-C, a store's error), every batch left as sealed is
        # below every batch re-stamped already, never above a later one.
        recorded: list[int] = []
        for amendment in reversed(amendments):
            try:
                write_amendment(wal, amendment)
            except OSError as exc:
                raise _storage_error(wal, exc, amendment.batch, recorded) from None
            recorded.append(amendment.batch)
    rows = [(a.batch, ", ".join(a.without_columns) or "-",
             a.base_ts_us if a.base_ts_us is not None else "as sealed", a.reason)
            for a in amendments]
    if args.json:
        print(json.dumps({"wal": shown(wal), "dry_run": args.dry_run,
                          "amendments": [dict(batch=a.batch, without_columns=list(a.without_columns),
                                              base_ts_us=a.base_ts_us, reason=a.reason)
                                         for a in amendments]}, indent=2))
    elif rows:
        print(table(("BATCH", "WITHOUT", "BASE_TS_US", "WHY"), rows))
    else:
        print("nothing to amend")
    restamped = [a for a in amendments if a.base_ts_us is not None]
    if restamped:
        # A re-stamped batch writes its columns, the dropped ones too: the table must have
        # them again (asking the node would be a query the sink makes nowhere else).
        print("a re-stamped batch still writes the columns dropped after its seal: if the "
              "table has one no more, add it again before the flusher writes the batch (ALTER "
              "TABLE ... ADD <column> <type>), or Cassandra refuses it and the sink blocks "
              "again", file=sys.stderr)
    if amendments and not args.dry_run:
        print("recorded: the flusher writes these batches so at its next try (every few "
              "seconds while it runs; or restart the query, or cassandra-wal recover)",
              file=sys.stderr)
    return EXIT_OK
