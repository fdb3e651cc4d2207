"""The Cassandra side of a flush: one session, opened on first use, and an
:class:`~cql.upsert.Upserter` for each way a batch was sealed to be written.

Every row writer uses one (:mod:`recovery.replay` in the driver, each task of
:mod:`recovery.executors`, each worker of :mod:`recovery.processes`); the flusher closes and
reopens it when a failure may have been the session's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from cql import credentials
from cql.connection import connect
from cql.table import dropped_columns
from cql.upsert import Upserter
from wal.seal import Seal

from .errors import ColumnDroppedAfterSeal
from .target import Target


class CassandraOutput:
    """Sessions opened on first use, one a cluster, and an Upserter for each way a batch was
    sealed to be written (``Seal.write``: columns, TTL, write time, nulls, its table and its
    cluster); closed with the flusher. A batch sealed for another cluster than the current
    target's (a restart moved the contact points to another cluster while batches were
    pending: :meth:`Target.is_cluster_of <recovery.target.Target.is_cluster_of>`) is written
    there, through a session of its own.

    With ``wal_root`` (a stream's flusher), every (re)connection takes the credentials of
    :func:`cql.credentials.of_stream` anew (a restarted query hands its options' over with its
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
        """The Upserter writing ``seal``'s rows as it recorded (the current options for a seal
        that recorded none, or with no seal)."""
        return self.upserter_for(seal.write if seal is not None else None)

    def upserter_for(self, record: dict | None) -> Upserter:
        """The Upserter writing the way ``record`` (a seal's ``write``, or
        :meth:`Target.write_record <recovery.target.Target.write_record>` of the batches to
        come) says; connects its cluster's session on first use."""
        key = json.dumps([record, self.retries_at_most], sort_keys=True)
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

    def dropped_after_seal(self, seal: Seal) -> list[tuple[str, int]]:
        """The columns ``seal`` writes that Cassandra dropped at or after the batch's write
        timestamps (with its own ``writetime``: after it was sealed), each with the last
        timestamp its drop hides: cells of them would stay hidden
        (:func:`cql.table.dropped_columns`). Asked of the batch's cluster before each write."""
        if seal.rows == 0:
            return []
        target = self.current_target().as_sealed(seal.write)
        session = self._session_for(target.config.connection)
        dropped = dropped_columns(session, target.table.keyspace, target.table.table)
        if not dropped:
            return []
        write = target.config.write
        first = (write.writetime_micros if write.writetime_micros is not None
                 else seal.sealed_at_us if write.writetime_column else seal.base_ts_us)
        out = []
        for column in target.columns:
            name = target.table.resolve_column(column) or column
            if name in dropped and dropped[name] >= first:
                out.append((column, dropped[name]))
        return out

    def check_not_dropped(self, seal: Seal, wal_location: str) -> None:
        """Raise :class:`~recovery.errors.ColumnDroppedAfterSeal` if a column ``seal`` writes
        was dropped after it was sealed (:meth:`dropped_after_seal`; an operator's amendment,
        already applied to ``seal``, may leave it out or write above the drop)."""
        hidden = self.dropped_after_seal(seal)
        if hidden:
            target = self.current_target().as_sealed(seal.write)
            write = target.config.write
            raise ColumnDroppedAfterSeal(seal.batch, wal_location, hidden,
                                         user_timestamps=bool(write.writetime_column
                                                              or write.writetime_micros),
                                         adds=added_again(target.table, hidden))

    def _session_for(self, connection):
        key = _contact(connection)
        if key not in self._clusters:
            self._clusters[key] = connect(connection)
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
