"""A row whose TTL ran out while its batch was pending, on the real node (issue 31, item 6).

Cassandra turns an expired cell into a tombstone at its write timestamp: an older cell of
another writer in that column stays hidden, and the row's other columns are untouched. So a
row the sink writes after its TTL ran out (a backlog longer than the TTL) is written as just
that, a tombstone per column it writes at its sealed timestamp, not skipped (which left the
other writer's older cells visible) and not a row deletion (which would hide the columns it
never wrote). The batch is written by ``replay_wal`` (``cassandra-wal recover``, the query's
recovery at start: the Replayer and the driver's Upserter), from a WAL sealed two hours ago.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from recovery.cql.config import ConnectionConfig, WriteConfig
from recovery.cql.table import TableSchema
from recovery.config import SinkConfig
from recovery.recover import replay_wal
from recovery.target import Target
from sinkutil import create_table
from tests.helpers.walfactory import WalFactory
from wal.recovery_policy import RecoveryPolicy
from wal.seal import now_us
from wal.states import BatchState

pytestmark = pytest.mark.integration

HOUR_US = 3600 * 1_000_000


def test_a_row_that_expired_while_pending_hides_an_older_cell_of_another_writer(
        cassandra_node, cql, keyspace, tmp_path):
    create_table(cql, keyspace,
                 "expiring (id bigint PRIMARY KEY, name text, value double, note text)")
    table = TableSchema(keyspace, "expiring", (("id", "bigint"), ("name", "text"),
                                               ("value", "double"), ("note", "text")), ("id",))
    config = SinkConfig(keyspace, "expiring", write=WriteConfig(ttl_seconds=3600),
                        connection=ConnectionConfig(hosts=(cassandra_node.host,),
                                                    port=cassandra_node.port, consistency="ONE"))
    target = Target(config, table, ("id", "name", "value"))
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        # Batch 0 (ids 0-4) sealed two hours ago with a TTL of one: it expired while pending.
        # Batch 1 (ids 1000-1004) sealed now: written with its hour.
        expired = f.sealed(0, write=target.write_record(), sealed_at_us=now_us() - 2 * HOUR_US)
        f.sealed(1, write=target.write_record())
    base = expired.seal.base_ts_us
    for i in (*range(5), *range(1000, 1005)):   # another writer, earlier than either seal
        cql.execute(f"INSERT INTO {keyspace}.expiring (id, name, value, note) "
                    f"VALUES ({i}, 'theirs', 1.5, 'note') USING TIMESTAMP {base - 1000}")
    report = replay_wal(f.wal, f.checkpoint, target, policy=RecoveryPolicy.OFFLINE)
    assert report.replayed == [0, 1]
    rows = {r.id: r for r in cql.execute(
        f"SELECT id, name, value, note, ttl(name) AS ttl FROM {keyspace}.expiring")}
    for i in range(5):        # what the expired row leaves: its columns deleted, not the row
        assert (rows[i].name, rows[i].value, rows[i].note) == (None, None, "note"), rows[i]
    for i in range(1000, 1005):
        assert rows[i].name == f"row-{i}" and rows[i].note == "note"
        assert 3500 < rows[i].ttl <= 3600
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        assert f.wal_log.get(0).state is BatchState.FLUSHED


def test_an_expired_row_of_static_columns_alone_deletes_them_by_partition(
        cassandra_node, cql, keyspace, tmp_path):
    """Cassandra refuses a DELETE of static columns alone restricted by a clustering key, and
    the schema the sink records does not say which columns are static: the node does."""
    create_table(cql, keyspace,
                 "shared (k int, c int, s text STATIC, v text, PRIMARY KEY (k, c))")
    table = TableSchema(keyspace, "shared", (("k", "int"), ("c", "int"), ("s", "text"),
                                             ("v", "text")), ("k",), ("c",))
    config = SinkConfig(keyspace, "shared", write=WriteConfig(ttl_seconds=60),
                        connection=ConnectionConfig(hosts=(cassandra_node.host,),
                                                    port=cassandra_node.port, consistency="ONE"))
    target = Target(config, table, ("k", "c", "s"))
    rows = pa.record_batch({"k": pa.array([1, 2], pa.int32()), "c": pa.array([0, 0], pa.int32()),
                            "s": ["ours", "ours"]})
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        sealed = f.sealed(0, rows=[rows], write=target.write_record(),
                          sealed_at_us=now_us() - HOUR_US)
    for k in (1, 2):
        cql.execute(f"INSERT INTO {keyspace}.shared (k, c, s, v) VALUES ({k}, 0, 'theirs', 'v') "
                    f"USING TIMESTAMP {sealed.seal.base_ts_us - 1000}")
    report = replay_wal(f.wal, f.checkpoint, target, policy=RecoveryPolicy.OFFLINE)
    assert report.replayed == [0]
    assert sorted(tuple(r) for r in cql.execute(f"SELECT k, c, s, v FROM {keyspace}.shared")) \
        == [(1, 0, None, "v"), (2, 0, None, "v")]
