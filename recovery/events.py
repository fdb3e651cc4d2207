"""The flusher's log lines for an operator: one per batch written, one per change of state
(blocked, unblocked, replay started, replay finished, flush failing, flush going again), one
per batch an earlier release sealed with a non-frozen list column, on the ``cassandra_wal``
logger.

Why a logger of their own, and why INFO made visible: Python shows only WARNING and above when
nothing configured logging, which is the case in most Spark driver scripts, and a batch
written is not a warning. :func:`make_visible` (called by ``sinks.register``) sets the
``cassandra_wal`` logger to INFO unless the application set its level, and gives it a handler
on stderr unless the application configured logging (a handler on the root logger or on this
one): then these lines go through the application's handlers like any other. Tuning:
``logging.getLogger("cassandra_wal").setLevel(logging.WARNING)`` keeps the state changes that
matter most (blocked) and drops the per-batch lines (docs/user-guide.md, "Operating the
sink").

Runs: in the driver process, on the flusher's thread.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "cassandra_wal"
log = logging.getLogger(LOGGER_NAME)

FORMAT = "%(asctime)s %(levelname)s cassandra_wal: %(message)s"


def make_visible(logger: logging.Logger = log) -> None:
    """INFO and a stderr handler for ``logger``, unless the application chose otherwise
    (its level is set, or it or the root logger has a handler). Idempotent."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    logger.propagate = False     # the root has no handler: nothing else would print it


def batch_written(wal: str, batch: int, rows: int, size: int, latency_s: float) -> None:
    log.info("%s: batch %d written: %d rows, %d bytes, visible %.2f s after its commit",
             wal, batch, rows, size, latency_s)


def blocked(wal: str, reason: str, exc: BaseException | None = None) -> None:
    log.error("%s: blocked: %s", wal, reason, exc_info=exc)


def unblocked(wal: str) -> None:
    log.warning("%s: unblocked: a drain got through, batches are written again", wal)


def lists_at_least_once(wal: str, batch: int, columns: tuple[str, ...]) -> None:
    """A batch sealed by an earlier release, which wrote non-frozen lists without asking: it
    is written anyway (Spark committed it), and a replay may repeat its elements."""
    log.warning("%s: batch %d writes the non-frozen list column(s) %s, sealed by an earlier "
                "release without wal.lists.atLeastOnce: it is written at least once (a "
                "retried or replayed row appends its elements again); the query's next batch "
                "refuses such a column until it is frozen or named in wal.lists.atLeastOnce "
                "(docs/guarantees.md)", wal, batch, ", ".join(repr(c) for c in columns))


def replay_started(wal: str, batch: int, why: str) -> None:
    log.info("%s: replay started at batch %d (%s)", wal, batch, why)


def replay_finished(wal: str, batches: int, rows: int, seconds: float) -> None:
    log.info("%s: replay finished: %d batches, %d rows in %.1f s", wal, batches, rows, seconds)


def flush_failing(wal: str, error: str, retry_s: float) -> None:
    log.warning("%s: flush failing, retried every %.0f s: %s", wal, retry_s, error)


def flush_recovered(wal: str, seconds: float) -> None:
    log.warning("%s: flush going again after %.0f s of failures", wal, seconds)
