"""The completeness marker: what a reader of Cassandra is told of the batches that have landed.

A reader of the target table cannot tell which micro-batches are in it whole. With
``marker.table`` set, the flusher records, per query and target table, the newest batch whose
every row Cassandra acknowledged (:class:`Completeness`), in a table of its own
(:mod:`recovery.cql.marker_table`, its schema). The same figures are ``sinks.status(query)``'s and
``cassandra-wal inspect``'s ``last_written`` (:mod:`recovery.health`).

When: after the batch is marked FLUSHED in the log, never before, so the marker never names a
batch with a row missing; a crash between the two leaves it one batch behind until the next
drain, or ``cassandra-wal recover`` (:func:`recovery.recover.replay_wal`), writes it again.
Who: whoever holds the WAL's log as its writer (:func:`write_marker`): the query's flusher,
or an offline recovery of a stream's WAL. How: ``INSERT ... USING TIMESTAMP`` the batch's
last sealed write timestamp, at the data's consistency level, every value read from the log's
record of the batch (fixed once it was marked flushed): a replay writes the very same row, and
an older batch's marker, written late, loses to a newer one. A reader that reads it at a consistency
level overlapping the writes' (``LOCAL_QUORUM`` with ``LOCAL_QUORUM`` writes; ``ALL`` with
``ONE``) then sees every row of that batch and of every batch before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cassandra import InvalidRequest

from recovery.cql.errors import SinkError
from recovery.cql.marker_table import TABLE_OPTION, create_cql, insert_cql, split_name
from wal import checkpoint as ckpt
from wal.log import BatchRecord, WalLog
from wal.seal import Seal
from wal.states import BatchState

from .target import Target


@dataclass(frozen=True)
class Completeness:
    """The newest batch of a WAL written whole, as the marker records it."""

    target_table: str               # "<keyspace>.<table>" its rows went to
    batch: int
    rows: int
    commit_seen_at_us: int | None   # when the flusher took it in, after Spark's commit
    acknowledged_at_us: int         # when it was marked written: its last write acknowledged
    watermark_ms: int | None        # the event-time watermark it ran with (None: none)
    write_ts_us: int                # the marker row's write timestamp: its last sealed one

    @classmethod
    def of(cls, record: BatchRecord, target: Target, watermark_ms: int | None
           ) -> "Completeness":
        """The figures of a FLUSHED ``record``, written to ``target`` (as its seal says)."""
        seal = record.seal
        sealed = target.as_sealed(seal.write)
        return cls(f"{sealed.config.keyspace}.{sealed.config.table}", record.batch, seal.rows,
                   record.taken_at_us, record.updated_at_us, watermark_ms, seal.last_ts_us)


class MarkerWriter:
    """Writes a query's :class:`Completeness` rows to the ``marker.table`` of ``target``
    through a session it is handed (the flusher's)."""

    def __init__(self, target: Target, query_id: str):
        wal = target.config.wal
        self.keyspace, self.table = split_name(wal.marker_table, target.config.keyspace)
        self.query_id = query_id
        self.consistency_level = target.config.connection.consistency_level
        self._insert: tuple[object, object] | None = None   # (session, its prepared INSERT)
        self.written: Completeness | None = None     # the last row written by this process

    def write(self, session, done: Completeness) -> None:
        """Record ``done``. Raises what cassandra-driver raises, the flusher retrying a transient
        failure; a table gone or changed since the query checked it (InvalidRequest) is a
        :class:`SinkError` naming the option and the remedy, which blocks the sink."""
        try:
            self._write(session, done)
        except InvalidRequest as exc:
            raise SinkError(f"{TABLE_OPTION} {self.keyspace}.{self.table}: {exc}; batch "
                            f"{done.batch} is written, its completeness marker is not: give "
                            f"the table back ({create_cql(self.keyspace, self.table)}), or "
                            f"restart the query without {TABLE_OPTION}") from None
        self.written = done

    def _write(self, session, done: Completeness) -> None:
        if self._insert is None or self._insert[0] is not session:   # a new session: again
            prepared = session.prepare(insert_cql(self.keyspace, self.table))
            prepared.is_idempotent = True
            if self.consistency_level is not None:
                prepared.consistency_level = self.consistency_level
            self._insert = (session, prepared)
        prepared = self._insert[1]
        session.execute(prepared, (
            self.query_id, done.target_table, done.batch,
            None if done.commit_seen_at_us is None else done.commit_seen_at_us // 1000,
            done.acknowledged_at_us // 1000, done.rows, done.watermark_ms, done.write_ts_us))


def marker_query_id(checkpoint: str) -> str:
    """The query a marker row is of: the checkpoint's query id (its path where none is
    recorded yet)."""
    return ckpt.open_checkpoint(checkpoint).query_id() or checkpoint


def write_marker(writer: MarkerWriter, wal_log: WalLog, target: Target, checkpoint: str,
                 batch: int, session_of: Callable[[Seal], object]) -> bool:
    """Record batch ``batch``'s completeness with ``writer`` if the log holds it written
    (FLUSHED) and ``writer`` has not recorded it yet, in the session ``session_of`` gives for
    its seal (its cluster's). False when the log does not hold it written (none yet, or
    retention took it: a later batch's marker will come). Raises as :meth:`MarkerWriter.write`."""
    record = wal_log.get(batch) if batch >= 0 else None
    if record is None or record.seal is None or record.state is not BatchState.FLUSHED:
        return False
    done = Completeness.of(record, target,
                           ckpt.open_checkpoint(checkpoint).batch_watermark_ms(batch))
    if done != writer.written:
        writer.write(session_of(record.seal), done)
    return True
