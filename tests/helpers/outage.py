"""A real ``QueryFlusher`` on a real WAL against a fake Cassandra that is away until the test
says it is back: ``prepare`` (and the dropped-columns query) raise the outage's error while it
lasts; rows written go to :attr:`Outage.written`."""

from __future__ import annotations

import contextlib
import recovery.cql.connection
from recovery.flusher import QueryFlusher
from tests.helpers.fake_cassandra import FakeCluster
from tests.helpers.flush_fakes import target_flushed_by
from tests.helpers.walfactory import WalFactory


class Outage:
    """The fake cluster's state: ``down`` makes ``prepare`` raise ``error``."""

    def __init__(self, error: Exception):
        self.error, self.down, self.written = error, True, []


class FakeUpserter:
    """What the flusher makes per connection: it prepares first, as the real Upserter does."""

    def __init__(self, session, table, columns, write, consistency_level=None, **_):
        session.prepare("INSERT ...")
        self.outage = session.outage

    def write_chunks(self, chunks, batch_id, **_):
        for rb, first_ts, tag in chunks:
            self.outage.written.append((batch_id, rb.column("id").to_pylist()))
            yield tag


def fake_cassandra(monkeypatch, flusher: QueryFlusher, outage: Outage) -> None:
    class Session:
        def prepare(self, cql):
            if outage.down:
                raise outage.error

        def execute(self, cql, parameters=None):     # system_schema.dropped_columns
            if outage.down:
                raise outage.error
            return []

    Session.outage = outage
    cluster = FakeCluster()
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (cluster, Session()))
    names = type(flusher.output).upserter.__globals__   # wherever CassandraOutput lives
    monkeypatch.setitem(names, "Upserter", FakeUpserter)


def driver_side_up(monkeypatch, flusher: QueryFlusher) -> None:
    """The driver's own session answers (what it asks before a batch: dropped columns); the
    rows go through the flush tasks or workers the test arranges."""
    up = Outage(None)
    up.down = False
    fake_cassandra(monkeypatch, flusher, up)


@contextlib.contextmanager
def flusher_on(tmp_path, batches: int = 2, mode: str = "driver"):
    """A real QueryFlusher on a WAL holding ``batches`` sealed batches Spark committed."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                    target={"fingerprint": "f", "target": target_flushed_by(mode).to_dict()}) as f:
        for b in range(batches):
            f.sealed(b, rows=(3, 2))
    flusher = QueryFlusher(str(tmp_path / "wal"), str(tmp_path / "cp"), retry_interval_s=0.01)
    try:
        yield flusher
    finally:
        flusher.stop()
