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

from recovery.cql.errors import SinkError
from recovery.health import LAG_AFTER_S, Health, combined, read_health
from recovery.target import RecordedTarget
from wal.layout import WalDir
from wal.pointer import pointed_wals

from .registry import flushers_of_run
from .wait import checkpoint_root


def status(query, lag_after_s: float = LAG_AFTER_S, table: str | None = None) -> Health:
    """The :class:`~recovery.health.Health` of ``query``'s WAL now. ``state`` is
    ``"blocked"`` (``blocked_reason`` says why and what to do), ``"lagging"`` (a committed
    batch has waited ``lag_after_s`` seconds or more to be written, or the backlog is over
    ``wal.maxBytes``) or ``"healthy"``. ``retries`` and ``replays`` count since the query's
    run started, and are None once its flusher is gone (a stopped query).

    A ``foreachBatch`` function writing several tables has a WAL for each: the figures are
    then over all of them (:func:`~recovery.health.combined`: sums, the oldest pending batch,
    the worst state), or of one table's WAL with ``table="<keyspace>.<table>"``.

    Raises :class:`~recovery.cql.errors.SinkError` for a query that does not write through this sink
    (or has not committed its first batch yet: its WAL is not known before), or that writes
    no ``table`` of that name.

    Runs: in the driver process, on the calling thread; reads the WALs through read-only log
    instances, beside the running flushers."""
    checkpoint = checkpoint_root(query)
    roots = pointed_wals(checkpoint)
    if not roots:
        raise SinkError(f"query {query.id}: its checkpoint {checkpoint} names no cassandra_wal "
                        "WAL yet (cassandra_wal_sink.json): it does not write through this "
                        "sink, or its first batch is not prepared yet")
    live = {f.wal.location: f for f in flushers_of_run(str(query.runId))
            if not f.stopped.is_set()}
    healths = []
    for root in roots:
        wal = WalDir.at(root)
        if table is not None and table_of(wal) != table:
            continue
        flusher = live.get(wal.location)
        healths.append(flusher.health(lag_after_s) if flusher is not None
                       else read_health(wal, checkpoint, None, lag_after_s))
    if not healths:
        raise SinkError(f"query {query.id} writes no table {table!r} through this sink "
                        f"(its WALs: {', '.join(roots)})")
    return combined(healths)


def table_of(wal: WalDir) -> str | None:
    """The table a WAL writes (``<keyspace>.<table>`` of its recorded target)."""
    recorded = RecordedTarget.read(wal)
    return recorded.table_name if recorded is not None else None
