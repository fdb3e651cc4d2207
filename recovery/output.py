"""The Cassandra side of a flush: one session, opened on first use, and an
:class:`~cql.upsert.Upserter` for each way a batch was sealed to be written.

Every row writer uses one (:mod:`recovery.replay` in the driver, each task of
:mod:`recovery.executors`, each worker of :mod:`recovery.processes`); the flusher closes and
reopens it when a failure may have been the session's.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from cql import credentials
from cql.connection import connect
from cql.upsert import Upserter
from wal.seal import Seal

from .target import Target


class CassandraOutput:
    """A lazily opened session, and an Upserter for each way a batch was sealed to be written
    (``Seal.write``: columns, TTL, write time, nulls); closed with the flusher.

    With ``wal_root`` (a stream's flusher), every (re)connection takes the credentials of
    :func:`cql.credentials.of_stream` anew (a restarted query hands its options' over with its
    first batch, after the flusher was made)."""

    def __init__(self, target: Target, wal_root: str | None = None,
                 session_conf: dict | None = None, on_retry: Callable[[], None] | None = None):
        self.target, self._cluster, self._session = target, None, None
        self.on_retry = on_retry          # each retry of failed requests (the flusher counts)
        self.wal_root, self.session_conf = wal_root, session_conf
        self._upserters: dict[str, Upserter] = {}

    def current_target(self) -> Target:
        """The target with the newest credentials (what the executors' tasks get, too)."""
        if self.wal_root is not None:
            return self.target.with_credentials(
                credentials.of_stream(self.wal_root, self.session_conf))
        return self.target

    def upserter(self, seal: Seal | None = None) -> Upserter:
        """The Upserter writing ``seal``'s rows as it recorded (the current options for a seal
        that recorded none, or with no seal)."""
        return self.upserter_for(seal.write if seal is not None else None)

    def upserter_for(self, record: dict | None) -> Upserter:
        """The Upserter writing the way ``record`` (a seal's ``write``, or
        :meth:`Target.write_record <recovery.target.Target.write_record>` of the batches to
        come) says; connects the session on first use."""
        key = json.dumps(record, sort_keys=True)
        if key not in self._upserters:
            if self._session is None:
                self._cluster, self._session = connect(self.current_target().config.connection)
            target = self.target.as_sealed(record)
            self._upserters[key] = Upserter(self._session, target.table, target.columns,
                                            target.config.write,
                                            target.config.connection.consistency_level,
                                            on_retry=self.on_retry)
        return self._upserters[key]

    def close(self) -> None:
        self._upserters.clear()
        self._session = None
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
