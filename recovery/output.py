"""The Cassandra side of a flush: one session, opened on first use, and an
:class:`~recovery.cql.upsert.Upserter` for each way a batch was sealed to be written.

Every row writer uses one (:mod:`recovery.replay` in the driver, each task of
:mod:`recovery.executors`, each worker of :mod:`recovery.processes`); the flusher closes and
reopens it when a failure may have been the session's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

import recovery.cql.connection
from recovery.cql import credentials
from recovery.cql.table import dropped_columns
from recovery.cql.upsert import Upserter, micros
from wal.log import WalLog
from wal.seal import Seal
from wal.sealed_write import SealedWrite
from wal.segment import SegmentReader, decode_chunk

from .errors import ColumnDroppedAfterSeal
from .target import Target

#: A batch's rows, as record batches (of the columns it staged, its writetime column too).
RowsOf = Callable[[], Iterable[pa.RecordBatch]]


class CassandraOutput:
    """Sessions opened on first use, one a cluster, and an Upserter for each way a batch was
    sealed to be written (``Seal.write``: columns, TTL, write time, nulls, its table and its
    cluster); closed with the flusher. A batch sealed for another cluster than the current
    target's (a restart moved the contact points to another cluster while batches were
    pending: :meth:`Target.is_cluster_of <recovery.target.Target.is_cluster_of>`) is written
    there, through a session of its own.

    With ``wal_root`` (a stream's flusher), every (re)connection takes the credentials of
    :func:`recovery.cql.credentials.of_stream` anew (a restarted query hands its options' over with its
    first batch, after the flusher was made)."""

    def __init__(self, target: Target, wal_root: str | None = None,
                 session_conf: dict | None = None, on_retry: Callable[[], None] | None = None):
        self.target = target
        self.on_retry = on_retry          # each retry of failed requests (the flusher counts)
        self.wal_root, self.session_conf = wal_root, session_conf
        self._upserters: dict[str, Upserter] = {}
        self._clusters: dict[tuple, tuple] = {}     # contact points -> (cluster, session)
        #: A bound on each request's retries, below ``spark.cassandra.query.retry.count``
        #: (recovery at query start holds the query's first batch: it gives up sooner, and
        #: the running flusher retries every few seconds); None: the option's.
        self.retries_at_most: int | None = None
        self._smallest: dict[tuple, dict[str, int]] = {}   # _stamps, by seal and columns

    def current_target(self) -> Target:
        """The target with the newest credentials (what the executors' tasks get, too)."""
        if self.wal_root is not None:
            return self.target.with_credentials(
                credentials.of_stream(self.wal_root, self.session_conf))
        return self.target

    @property
    def _session(self):
        """The session to the current target's cluster (None: not connected yet)."""
        found = self._clusters.get(_contact(self.target.config.connection))
        return found[1] if found else None

    def upserter(self, seal: Seal | None = None) -> Upserter:
        """The Upserter writing ``seal``'s rows as it recorded (a seal that recorded none: as
        upserts, with the current options, :meth:`Target.as_sealed
        <recovery.target.Target.as_sealed>`); with no seal, the current target's as it is
        (a flush task's, already as sealed: a change stream's deletes stay deletes)."""
        return self.upserter_for(seal.write if seal is not None
                                 else self.current_target().write_record())

    def upserter_for(self, record: SealedWrite | None) -> Upserter:
        """The Upserter writing the way ``record`` (a seal's ``write``, or
        :meth:`Target.write_record <recovery.target.Target.write_record>` of the batches to
        come) says; connects its cluster's session on first use."""
        key = json.dumps([record.to_dict() if record is not None else None,
                          self.retries_at_most], sort_keys=True)
        if key not in self._upserters:
            target = self.current_target().as_sealed(record)
            write = target.config.write
            if self.retries_at_most is not None and write.retry_count > self.retries_at_most:
                write = replace(write, retry_count=self.retries_at_most)
            self._upserters[key] = Upserter(self._session_for(target.config.connection),
                                            target.table, target.columns, write,
                                            target.config.connection.consistency_level,
                                            on_retry=self.on_retry)
        return self._upserters[key]

    def dropped_after_seal(self, seal: Seal, rows: RowsOf | None = None
                           ) -> list[tuple[str, int]]:
        """The columns ``seal`` writes that Cassandra dropped at or after the write timestamps
        of the batch's cells, each with the last timestamp its drop hides: cells of them would
        stay hidden (:func:`recovery.cql.table.dropped_columns`). Asked of the batch's cluster before
        each write.

        The timestamps are the sink's (from ``base_ts_us``: the first row's is the smallest),
        the constant ``writetime``, or, with a ``writetime`` column, the rows' own: for each
        dropped column, the smallest of the rows with a value in it, read from ``rows()``
        (the batch's record batches: :func:`sealed_rows`, :func:`segment_rows`); never the
        sealing driver's clock, which may run ahead of Cassandra's. Without ``rows``, every
        dropped column such a batch writes counts (it may hide them)."""
        if seal.rows == 0:
            return []
        target = self.current_target().as_sealed(seal.write)
        session = self._session_for(target.config.connection)
        dropped = dropped_columns(session, target.table.keyspace, target.table.table)
        if not dropped:
            return []
        names = {c: target.table.resolve_column(c) or c for c in target.columns}
        candidates = [c for c in target.columns if names[c] in dropped]
        if not candidates:
            return []
        write = target.config.write
        if write.writetime_column and write.writetime_micros is None:
            first = self._stamps(seal, write.writetime_column, candidates, rows)
        else:
            base = (write.writetime_micros if write.writetime_micros is not None
                    else seal.base_ts_us)
            first = {c: base for c in candidates}
        return [(c, dropped[names[c]]) for c in candidates
                if c in first and dropped[names[c]] >= first[c]]

    def _stamps(self, seal: Seal, stamp_column: str, columns: list[str],
                rows: RowsOf | None) -> dict[str, int]:
        """Each of ``columns`` -> the smallest write timestamp of a row of ``seal``'s batch
        with a value in it (a column no row has a value in: absent); read once per seal and
        columns (a blocked batch is tried again every few seconds)."""
        if rows is None:
            return {c: -(2**63) for c in columns}
        key = (seal.batch, seal.seal_id, stamp_column, tuple(columns))
        if key not in self._smallest:
            if len(self._smallest) >= 64:
                self._smallest.pop(next(iter(self._smallest)))
            self._smallest[key] = smallest_stamps(rows(), stamp_column, columns)
        return self._smallest[key]

    def check_not_dropped(self, seal: Seal, wal_location: str,
                          rows: RowsOf | None = None) -> None:
        """Raise :class:`~recovery.errors.ColumnDroppedAfterSeal` if a column ``seal`` writes
        was dropped after the write timestamps of its cells (:meth:`dropped_after_seal`; an
        operator's amendment, already applied to ``seal``, may leave it out or write above
        the drop)."""
        hidden = self.dropped_after_seal(seal, rows)
        if hidden:
            target = self.current_target().as_sealed(seal.write)
            write = target.config.write
            raise ColumnDroppedAfterSeal(seal.batch, wal_location, hidden,
                                         user_timestamps=bool(write.writetime_column
                                                              or write.writetime_micros),
                                         adds=added_again(target.table, hidden))

    def session_of(self, seal: Seal):
        """The session to the cluster ``seal``'s batch was written to (connected on first
        use): where its completeness marker goes (:mod:`recovery.marker`)."""
        return self._session_for(self.current_target().as_sealed(seal.write).config.connection)

    def _session_for(self, connection):
        key = _contact(connection)
        if key not in self._clusters:
            self._clusters[key] = recovery.cql.connection.connect(connection)
        return self._clusters[key][1]

    def close(self) -> None:
        self._upserters.clear()
        clusters, self._clusters = list(self._clusters.values()), {}
        for cluster, _ in clusters:
            cluster.shutdown()


def _contact(connection) -> tuple:
    return (connection.hosts, connection.port, connection.cloud_bundle_path)


def added_again(table, hidden: list[tuple[str, int]]) -> list[str]:
    """The CQL that gives ``table`` (its schema as sealed) each of the ``hidden`` columns
    again, should it have none of that name now: a re-stamped batch still writes them, and
    Cassandra refuses a column the table does not have."""
    out = []
    for column, _ in hidden:
        name = table.resolve_column(column) or column
        try:
            cql_type = table.column_type(name)
        except KeyError:
            cql_type = "<its type>"
        out.append(f"ALTER TABLE {table.keyspace}.{table.table} ADD {name} {cql_type}")
    return out


def smallest_stamps(rows: Iterable[pa.RecordBatch], stamp_column: str,
                    columns: list[str]) -> dict[str, int]:
    """Each of ``columns`` -> the smallest value of ``stamp_column`` (the user's write
    timestamps, in µs) among the rows with a value in that column; a column no row has a
    value in is absent (a null writes no cell a drop could hide that would be seen)."""
    out: dict[str, int] = {}
    for batch in rows:
        stamps = micros(batch.column(stamp_column))
        for column in columns:
            present = pc.is_valid(batch.column(column))
            low = pc.min(pc.filter(stamps, present)).as_py()
            if low is not None and (column not in out or low < out[column]):
                out[column] = low
    return out


def sealed_rows(wal, wal_log: WalLog, seal: Seal) -> Iterable[pa.RecordBatch]:
    """The rows of ``seal``'s batch: from the log where they were copied in, else from its
    sealed segments (verified as they are read; a WAL on a store's fetched first, where the
    working copy left them on the store for the tasks)."""
    record = wal_log.get(seal.batch)
    if record is None or not record.rows_in_log:
        if wal.remote:
            wal.remote.fetch_segments(wal.root, [ref.name for ref in seal.segments])
        yield from segment_rows(wal, seal)
        return
    for chunk in wal_log.chunks(seal.batch):
        yield decode_chunk(chunk.payload)


def segment_rows(wal, seal: Seal) -> Iterable[pa.RecordBatch]:
    """The rows of a sealed batch, from its staged segments (verified as they are read)."""
    for ref in seal.segments:
        reader = SegmentReader(wal.segment_path(ref.name), seal.batch, ref.partition, ref.name)
        for chunk in reader.chunks():
            yield chunk.record_batch()
