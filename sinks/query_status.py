"""``sinks.status(query)``: the figures of a query's WAL while it runs (or after it stopped):
its backlog, how old the oldest unwritten batch is, the last batch written and its latency,
rows per second, retries and replays, and the blocked state with its reason.

The figures are :mod:`recovery.health`'s, the one owner that the Prometheus endpoint and
``cassandra-wal status`` read too. :func:`sinks.wait_flushed` waits for the backlog this
reports to be written; ``status`` never waits and never writes.

Why not ``sinks/status.py``: importing a submodule sets it as an attribute of its package,
and ``sinks.status`` must stay the function.

Runs: in the driver process, on the calling thread.
"""

from __future__ import annotations

from cql.errors import SinkError
from recovery.health import LAG_AFTER_S, Health, read_health
from wal.layout import WalDir
from wal.pointer import read_pointer

from .registry import flusher_of_run
from .wait import checkpoint_root


def status(query, lag_after_s: float = LAG_AFTER_S) -> Health:
    """The :class:`~recovery.health.Health` of ``query``'s WAL now. ``state`` is
    ``"blocked"`` (``blocked_reason`` says why and what to do), ``"lagging"`` (a committed
    batch has waited ``lag_after_s`` seconds or more to be written, or the backlog is over
    ``wal.maxBytes``) or ``"healthy"``. ``retries`` and ``replays`` count since the query's
    run started, and are None once its flusher is gone (a stopped query).

    Raises :class:`~cql.errors.SinkError` for a query that does not write through this sink
    (or has not committed its first batch yet: its WAL is not known before).

    Runs: in the driver process, on the calling thread; reads the WAL through a read-only
    log instance, beside the running flusher."""
    checkpoint = checkpoint_root(query)
    root = read_pointer(checkpoint)
    if root is None:
        raise SinkError(f"query {query.id}: its checkpoint {checkpoint} names no cassandra_wal "
                        "WAL yet (cassandra_wal_sink.json): it does not write through this "
                        "sink, or its first batch is not prepared yet")
    flusher = flusher_of_run(str(query.runId))
    if flusher is not None and not flusher.stopped.is_set():
        return flusher.health(lag_after_s)
    return read_health(WalDir.at(root), checkpoint, None, lag_after_s)
