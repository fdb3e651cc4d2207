"""Top floor, beside :mod:`sinks`, at the top of :mod:`recovery` (which the sink never
imports it from): ``cassandra-wal``, the offline tool for a WAL directory, without Spark.

One module per subcommand (``inspect_cmd``, ``status_cmd``, ``dump_cmd``, ``verify_cmd``, ``recover_cmd``,
``repair_cmd``, ``amend_cmd``),
argument parsing, dispatch and the error -> exit code mapping in ``main``, tables and typed
JSON in ``render``. This module holds what the subcommands share: exit codes, the usage error,
and the guards that turn a damaged RocksDB log into :class:`~wal.errors.WalCorrupted` instead
of a traceback.

``inspect``, ``status``, ``dump`` and ``verify`` are read-only: files are opened with ``open(..., "rb")``,
the log as a RocksDB secondary whose own files live in a private temp folder
(``WalLog.open_reader``), so they run beside a live sink and on a copy taken from a crashed
machine alike. ``recover`` takes the WAL's writer lock and writes to Cassandra
(:mod:`recovery.recover`); ``repair`` takes it too and changes the WAL and Spark's checkpoint
(:mod:`wal.repair`); ``amend`` records an operator's amendment of sealed batches
(:mod:`wal.amendments`), beside a running query too.
"""

from __future__ import annotations

import contextlib
import re
import struct
import sys
from typing import Iterable, Iterator, TypeVar

from wal.errors import WalCorrupted, WalError
from wal.layout import WalDir

EXIT_OK = 0          # done; for verify: no corruption found
EXIT_ERROR = 1       # anything else (e.g. the batch asked for does not exist)
EXIT_USAGE = 2       # bad command line
EXIT_CORRUPT = 3     # corruption found, not a WAL, unsupported format, unreadable files

PROG = "cassandra-wal"

T = TypeVar("T")


class UsageError(Exception):
    """A bad command line, found after parsing (exit 2). ``hint`` says what to do instead."""

    def __init__(self, message: str, hint: str = "", usage: str = ""):
        super().__init__(message)
        self.message, self.hint, self.usage = message, hint, usage


class CliError(Exception):
    """A clear failure that is not corruption (exit 1), e.g. an unknown batch id."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


_READER_SHADOW = re.compile(r"\S*cassandra-wal-reader-[^/\s]+/primary-\d+")


def clean(message: str, wal: WalDir | None = None) -> str:
    """One line; paths into a log reader's private shadow folder shown as ``log`` paths."""
    text = " ".join(str(message).split())
    return _READER_SHADOW.sub(wal.log if wal is not None else "log", text)


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


@contextlib.contextmanager
def log_errors(wal: WalDir) -> Iterator[None]:
    """Inside: errors from reading the RocksDB log become ``WalCorrupted`` naming it.

    rocksdict raises plain ``Exception`` (exactly that class) carrying RocksDB's message
    ("Corruption: block checksum mismatch ..."); a malformed key or record shows up as a
    ValueError/KeyError/IndexError/struct.error from the decoding in ``wal.log``. Keep the
    ``with`` block tight around log calls, so that our own bugs are not disguised.
    """
    try:
        yield
    except WalError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, struct.error) as exc:
        raise WalCorrupted(wal.log, f"malformed log entry: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        if type(exc) is Exception:
            raise WalCorrupted(wal.log, f"RocksDB: {exc}") from exc
        raise


def guarded(items: Iterable[T], wal: WalDir) -> Iterator[T]:
    """Iterate ``items`` (a log iterator) with :func:`log_errors` around each step only."""
    it = iter(items)
    while True:
        with log_errors(wal):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item
