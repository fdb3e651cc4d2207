"""``cassandra-wal``: argument parsing, dispatch, and errors -> messages and exit codes.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) ->
int``. Errors end here: a one-line ``cassandra-wal: error: ...`` on stderr and the documented
exit code (see :data:`EPILOG`), never a traceback. ``--version`` prints the installed
distribution's version (:func:`version`).

``inspect``, ``status``, ``dump`` and ``verify`` read the WAL only (floor ``wal``); ``recover`` writes to
Cassandra through :mod:`recovery.recover`; ``repair`` changes the WAL and Spark's checkpoint
(:mod:`wal.repair`).
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version

from recovery.cli import (
    EXIT_CORRUPT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CliError,
    UsageError,
    amend_cmd,
    clean,
    dump_cmd,
    inspect_cmd,
    recover_cmd,
    repair_cmd,
    status_cmd,
    verify_cmd,
)
from recovery.cql.errors import FlushFailed, SinkError
from recovery.errors import RecoveryBlocked, RecoveryError
from wal.errors import NotAWal, UnsupportedFormat, WalCorrupted, WalError

COMMANDS = (inspect_cmd, status_cmd, dump_cmd, verify_cmd, recover_cmd, repair_cmd, amend_cmd)

DESCRIPTION = """\
Offline tools for a cassandra-wal write-ahead log (the WAL_DIR of a Spark -> Cassandra sink).
inspect, status, dump and verify are read-only: they never take the WAL's lock, never write under
WAL_DIR, and run beside a live sink or on a copy of a WAL taken from a crashed machine.
recover and repair change things and take the WAL's lock: stop the query first. amend records
an operator's choice for batches a dropped column would hide, beside a running query too."""

EPILOG = """\
exit codes:
  0  fine (verify: no corruption found)
  1  other errors (e.g. the batch asked for does not exist)
  2  bad usage
  3  corruption found, or WAL_DIR is not a WAL, has an unsupported (newer) format version,
     or holds files that cannot be read; recover: a batch that cannot be replayed (named)
  status: 0 healthy, 1 lagging, 2 blocked (see 'cassandra-wal status --help')

Examples:
  cassandra-wal inspect /data/wal
  cassandra-wal inspect /data/wal --checkpoint /data/checkpoints/q1 --json
  cassandra-wal inspect /data/wal --watch
  cassandra-wal status /data/wal || echo "lagging or blocked"
  cassandra-wal dump /data/wal --batch 42 --limit 10
  cassandra-wal verify /data/wal || echo "corrupted"
  cassandra-wal recover /data/wal --dry-run
  cassandra-wal repair /data/wal --checkpoint /data/checkpoints/q1 --from 42 --dry-run
  cassandra-wal amend /data/wal --pending --without-column notes --dry-run
  cassandra-wal --version

Run 'cassandra-wal COMMAND --help' for a command's options and examples."""


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors say how to get help and raise instead of exiting."""

    def error(self, message: str):  # noqa: D401 - argparse's name
        raise UsageError(message, f"run '{self.prog} --help' for usage and examples",
                         usage=self.format_usage())


DISTRIBUTION = "cassandra-wal-sink"    # [project] name in pyproject.toml


def version() -> str:
    """The installed distribution's version, or ``unknown`` when the code runs from a source
    tree that was never installed (there is no metadata to read then; guessing from a
    ``pyproject.toml`` nearby would report whatever checkout happens to sit beside it)."""
    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """argparse's ``version`` action, but the version is looked up only when asked for (it
    searches ``sys.path`` for the distribution's metadata)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{PROG} {version()}")
        parser.exit()


def build_parser() -> Parser:
    """The whole command line."""
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def _error(message: str, hint: str = "") -> None:
    print(f"{PROG}: error: {clean(message)}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def _under(path: str | None, root: str | None) -> bool:
    if not path or not root:
        return False
    path, root = os.path.abspath(os.fsdecode(path)), os.path.abspath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def main(argv: list[str] | None = None) -> int:
    """Run ``cassandra-wal`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(exc.usage)
        _error(exc.message, exc.hint)
        return EXIT_USAGE
    except SystemExit as exc:   # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    wal_dir = getattr(args, "wal_dir", None)
    try:
        return args.run(args)
    except UsageError as exc:
        _error(exc.message, exc.hint)
        return EXIT_USAGE
    except CliError as exc:
        _error(exc.message, exc.hint)
        return EXIT_ERROR
    except (NotAWal, UnsupportedFormat, WalCorrupted, RecoveryBlocked) as exc:
        # RecoveryBlocked: a batch no retry can write (a column dropped since its seal:
        # ColumnDroppedAfterSeal), named with its remedy, as recover says it
        _error(str(exc))
        return EXIT_CORRUPT
    except (WalError, RecoveryError, SinkError, FlushFailed) as exc:
        # the sink's own errors say what failed and what to do: never a traceback
        _error(str(exc))
        return EXIT_ERROR
    except BrokenPipeError:
        _silence_stdout()       # the reader went away (`| head`): not an error
        return EXIT_OK
    except OSError as exc:
        # Files of the WAL that cannot be read count as damage (exit 3); anything else
        # (a full temp folder, a closed terminal) is another error.
        where = os.fsdecode(exc.filename) if exc.filename else ""
        _error(f"{where}: {exc.strerror or exc}" if where else str(exc))
        return EXIT_CORRUPT if _under(where, wal_dir) else EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass            # stdout is not a real file (tests capture it)


if __name__ == "__main__":
    sys.exit(main())
