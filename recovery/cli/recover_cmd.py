"""``cassandra-wal recover``: its arguments, the checks before anything is changed (the
checkpoint is local, Spark's, and this WAL's query's), the plan of ``--dry-run``, progress and
exit codes. The recovery itself is :func:`recovery.recover.replay_wal`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from recovery.cli import EXIT_CORRUPT, EXIT_ERROR, EXIT_OK, CliError, UsageError
from recovery.cli.location import WAL_DIR_HELP, working_wal
from recovery.cli.render import table
from recovery.cql import credentials
from recovery.cql.credentials import ENV_KEYSTORE_PASSWORD, ENV_PASSWORD, ENV_USERNAME
from recovery.cql.errors import ConnectionFailed, FlushFailed, is_transient_answer
from recovery.errors import RecoveryBlocked
from recovery.recover import replay_wal
from recovery.replay import Progress
from recovery.target import RecordedTarget, Target
from wal import binding, catalog
from wal import checkpoint as ckpt
from wal import clock
from wal.catalog import RecoveryAction
from wal.errors import StoreUnavailable, WalBoundElsewhere
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy
from wal.schemes import store_schemes_text

NAME = "recover"

DESCRIPTION = """\
Replay what Spark committed and the sink did not finish writing to Cassandra, as the sink
does when the query restarts: committed batches are written in order with their sealed write
timestamps (the same cells, so a batch written twice ends the same). Batches Spark never
committed are left (the query's next start discards them; Spark re-runs them), or discarded
with --force. --dry-run prints the plan and changes nothing."""

EPILOG = f"""\
Credentials are never stored in the WAL: pass --username and set the password in the
environment variable named by --password-env (default {ENV_PASSWORD}), or set
{ENV_USERNAME} / {ENV_PASSWORD}. Connection settings default to those the sink recorded in
WAL_DIR/target.json, TLS included (spark.cassandra.connection.ssl.*: the CA and client
certificate PEM paths); a client key's password comes from the variable named by
--keystore-password-env (default {ENV_KEYSTORE_PASSWORD}). Secrets are never printed.

Stop the streaming query first: recover takes the WAL's writer lock (exit 1 if a running sink
holds it). Restarting the query runs the same recovery automatically. The lock does not see
every live run: a run whose flusher has not started yet (its first batch still staging) holds
nothing, and on HDFS or S3 the lock is only this host's working copy, so a query running on
another host is not seen. A batch such a run staged or sealed and Spark has not committed yet
looks like one Spark never will. So recover writes what Spark committed and leaves the rest,
unless --force says no run of the query is live anywhere.

exit codes: 0 done (or plan printed), 1 a flush failed (Cassandra down, lock held),
            2 usage, 3 a batch cannot be replayed (named): corruption, or a column dropped
            since its seal (the error names the cassandra-wal amend to run), see
            docs/runbook.md

Examples:
  cassandra-wal recover /data/wal --checkpoint /data/checkpoints/q1 --dry-run
  cassandra-wal recover /data/wal --checkpoint /data/checkpoints/q1
  CASSANDRA_WAL_PASSWORD=... cassandra-wal recover /data/wal --username etl --host 10.0.0.5
  ETL_PW=... cassandra-wal recover /data/wal --username etl --password-env ETL_PW
  cassandra-wal recover /data/wal --json
  cassandra-wal recover /data/wal --processes 4      # a long backlog: 4 writers, 4 sessions
  cassandra-wal recover hdfs://nn:8020/wal --checkpoint hdfs://nn:8020/cp --force"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="replay committed batches not yet flushed; --force: discard "
                            "the rest (takes the WAL's lock)",
                       description=DESCRIPTION,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wal_dir", metavar="WAL_DIR", help=WAL_DIR_HELP)
    p.add_argument("--checkpoint", metavar="CP",
                   help="Spark checkpoint folder (default: target.json's checkpoint_location)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    p.add_argument("--force", action="store_true",
                   help="discard what Spark never committed too: only when no run of the "
                        "query is live anywhere (the next start of the query does it anyway); "
                        "refused when the checkpoint does not exist")
    p.add_argument("--host", help="contact points, comma separated (default: recorded)")
    p.add_argument("--port", type=int, help="native port (default: recorded)")
    p.add_argument("--username", help=f"user name (default: ${ENV_USERNAME})")
    p.add_argument("--password-env", default=ENV_PASSWORD, metavar="VAR",
                   help=f"environment variable holding the password (default {ENV_PASSWORD})")
    p.add_argument("--keystore-password-env", default=ENV_KEYSTORE_PASSWORD, metavar="VAR",
                   help="environment variable holding the password of the client key "
                        f"(spark.cassandra.connection.ssl.keyStore.path; default {ENV_KEYSTORE_PASSWORD})")
    p.add_argument("--processes", type=int, metavar="N",
                   help="write the rows through N worker processes of this command, a segment "
                        "at a time, each with its own session (as wal.flush.mode=processes); "
                        "0: from this process (default: the WAL's recorded "
                        "wal.flush.processes if its mode is processes, else 0)")
    p.add_argument("--json", action="store_true", help="print the plan/summary as JSON")
    p.set_defaults(run=run)
    return p


def _target(wal: WalDir, args) -> Target:
    recorded = RecordedTarget.read(wal)
    if recorded is None or not recorded.target_fields:
        raise UsageError(f"{wal.root} records no target (target.json)",
                         "is this the WAL of a cassandra_wal sink?")
    hosts = tuple(h.strip() for h in args.host.split(",")) if args.host else None
    given = {"username": args.username, "password": os.environ.get(args.password_env),
             "ssl_keystore_password": os.environ.get(args.keystore_password_env)}
    return recorded.target.with_credentials(credentials.layered(given)).with_connection(
        hosts=hosts, port=args.port)


def _processes(target: Target, args) -> int:
    """How many worker processes write the rows: ``--processes``, else the recorded mode's."""
    if args.processes is not None:
        if args.processes < 0:
            raise UsageError(f"--processes {args.processes}: a count of worker processes",
                             "pass 0 (this process) or more")
        return args.processes
    return target.config.wal.worker_processes()


def _checkpoint(wal: WalDir, args) -> str | None:
    """The checkpoint recovery decides by: a local folder, or a store's URI (None: a batch job's
    WAL, whose seals are their own commit point). One that cannot be read is an error that
    changes nothing: every batch would look uncommitted and be discarded."""
    given = args.checkpoint or (RecordedTarget.read(wal) or RecordedTarget(None)).checkpoint_location
    if not given:
        return None
    where = "--checkpoint" if args.checkpoint else f"{wal.target_file} (checkpoint_location)"
    try:
        local = ckpt.normal_location(given)
        found = ckpt.exists(local)
    except ValueError as exc:
        raise UsageError(f"{where}: the checkpoint {given}: {exc}: recover cannot read which "
                         f"batches Spark committed there",
                         f"pass the query's checkpoint (a local folder, {store_schemes_text()}) "
                         f"with --checkpoint; nothing was changed") from None
    except StoreUnavailable as exc:
        raise CliError(f"{where}: {exc}", "check the store's address and credentials "
                       "(AWS_*, ~/.aws, CASSANDRA_WAL_WEBHDFS); nothing was changed") from None
    if not found and args.force:
        # Every batch would look uncommitted, and --force discards those: batches Spark did
        # commit, whose commits went with the folder, would be lost.
        raise UsageError(f"{where}: the checkpoint {local} does not exist: recover cannot read "
                         f"which batches Spark committed, and --force would discard them",
                         "pass the query's checkpoint, or leave out --force (batches the log "
                         "saw committed are written, the rest left); nothing was changed")
    if found and not ckpt.written_by_spark(local):
        # What an earlier release left when Spark's default filesystem was HDFS: the sink
        # wrote its pointer into a local folder of that name, and Spark its checkpoint on HDFS.
        raise UsageError(f"{where}: {local} is not a Spark checkpoint (no metadata, offsets/ "
                         f"or commits/): Spark may have written it on its default filesystem "
                         f"(fs.defaultFS, e.g. HDFS)",
                         "pass the folder Spark wrote (copied to a local disk) with "
                         "--checkpoint; nothing was changed")
    try:
        # Another query's checkpoint would make its commits this WAL's, for good (the log
        # records the highest commit it sees): replaying batches Spark never committed.
        binding.check(wal, local)
    except WalBoundElsewhere as exc:
        raise UsageError(f"{where}: {exc}", "pass the checkpoint of the query that wrote this "
                         "WAL; nothing was changed") from None
    return local


class _Reporter:
    """Progress on stderr, at most every 2 s: rows, rate, time left."""

    def __init__(self, quiet: bool):
        self.quiet, self._last = quiet, 0.0

    def __call__(self, p: Progress) -> None:
        now = clock.monotonic()
        if self.quiet or (now - self._last < 2 and p.rows_done < p.rows_total):
            return
        self._last = now
        eta = f", {p.eta_s:.0f}s left" if p.eta_s is not None else ""
        print(f"batch {p.batch}: {p.rows_done}/{p.rows_total} rows, {p.rate:,.0f} rows/s{eta}",
              file=sys.stderr)


#: Why recover leaves uncommitted batches (without --force).
LEFT_NOTE = ("recover cannot tell a stopped query from a live run it does not see (one whose "
             "flusher has not started, or on another host when the WAL is on a store), whose "
             "batch Spark is about to commit: it never discards without --force; the query's "
             "next start discards what Spark never committed")


def run(args) -> int:
    wal = working_wal(args.wal_dir)
    checkpoint = _checkpoint(wal, args)
    policy = RecoveryPolicy.OFFLINE_FORCED if args.force else RecoveryPolicy.OFFLINE
    if args.dry_run:
        plan = catalog.describe_read_only(wal, checkpoint, policy)
        todo = [v for v in plan if v.action != RecoveryAction.NOTHING]
        if args.json:
            print(json.dumps({"dry_run": True, "checkpoint": checkpoint,
                              "plan": [v.to_dict() for v in todo]}, indent=2))
        else:
            rows = [(v.batch, v.state, v.rows, v.flushed_rows, v.action, v.detail) for v in todo]
            print(table(("BATCH", "STATE", "ROWS", "FLUSHED", "ACTION", "DETAIL"), rows)
                  if rows else "nothing to do")
        return EXIT_OK
    target = _target(wal, args)
    processes = _processes(target, args)
    try:
        report = replay_wal(wal, checkpoint, target, on_progress=_Reporter(quiet=args.json),
                            policy=policy, processes=processes)
    except RecoveryBlocked as exc:
        print(f"cassandra-wal: error: {exc}", file=sys.stderr)
        return EXIT_CORRUPT
    except (FlushFailed, ConnectionFailed) as exc:
        print(f"cassandra-wal: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - Cassandra away is said; anything else raised
        if not is_transient_answer(exc):
            raise
        # the dropped-columns query before a batch, met by an outage
        print(f"cassandra-wal: error: Cassandra did not answer: {type(exc).__name__}: {exc}; "
              f"run it again once it does", file=sys.stderr)
        return EXIT_ERROR
    left = report.waiting_at
    if args.json:
        print(json.dumps(dict(report.to_dict(), left_from=left, processes=processes,
                              note=LEFT_NOTE if left is not None else None), indent=2))
    else:
        by = f" by {processes} worker processes" if processes else ""
        print(f"replayed {len(report.replayed)} batches ({report.rows_written} rows){by}, "
              f"discarded {len(report.discarded)}, in {report.seconds:.1f}s")
        if left is not None:
            print(f"left batch {left} and later ones, which Spark has not committed: "
                  f"{LEFT_NOTE}", file=sys.stderr)
    return EXIT_OK
