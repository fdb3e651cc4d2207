"""The fake Cassandra's row and partition deletes (issue 35): what a change stream's ``DELETE
FROM ... USING TIMESTAMP ? WHERE <key>`` leaves, as Cassandra reconciles it.

A row deletion at T hides every cell of its row at or below T, a partition deletion every cell
of every row of its partition; the tombstone wins a tie, a write above T shows again, and the
order the writes arrive in changes nothing. The statements are the real ``Upserter``'s, sent
through the fake's ``RecordingSession`` (what the row writers' contract tests read back) and
applied by the simulation's node (``tests/sim/cassandra.py``), which must agree.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from cassandra import cqltypes

from recovery.cql.config import WriteConfig
from recovery.cql.table import TableSchema
from recovery.cql.upsert import Upserter
from tests.helpers.fake_cassandra import (
    PARTITION_DELETE,
    ROW_DELETE,
    Deletions,
    RecordingSession,
    Statements,
    parse_delete,
    read,
    visible,
)
from tests.sim.cassandra import SimCassandra

pytestmark = pytest.mark.unit

CLUSTERED = TableSchema("ks", "t", (("k", "int"), ("c", "int"), ("v", "text")), ("k",), ("c",))
PLAIN = TableSchema("ks", "p", (("k", "int"), ("v", "text")), ("k",))
STREAM = WriteConfig(op_column="op", partition_delete_values=("P",), group_rows=1)
NOW_S = 2_000_000_000.0


def changes(table: TableSchema, *rows: tuple) -> pa.RecordBatch:
    """A chunk of a change stream: each row its table's columns, then its operation."""
    names = list(table.column_names) + ["op"]
    types = [pa.int32() if t == "int" else pa.string() for _, t in table.columns] + [pa.string()]
    return pa.record_batch([pa.array([row[i] for row in rows], types[i])
                            for i in range(len(names))], names=names)


class Recorded:
    """A real ``Upserter`` over a ``RecordingSession`` of ``table``: each chunk written at the
    first timestamp given, what a SELECT shows read back from the records."""

    def __init__(self, table: TableSchema, tmp_path, write: WriteConfig = STREAM):
        self.path = str(tmp_path / "requests.jsonl")
        self.session = RecordingSession(table, self.path)
        self.upserter = Upserter(self.session, table, table.column_names, write)

    def write(self, first_ts: int, *rows: tuple) -> "Recorded":
        self.upserter.write_chunk(changes(self.upserter.table, *rows), first_ts, 0)
        return self

    def shown(self) -> dict:
        return visible(read(self.path), NOW_S)


def test_a_change_streams_deletes_are_prepared_with_the_timestamp_first_then_the_key(tmp_path):
    recorded = Recorded(CLUSTERED, tmp_path).write(10, (1, 0, None, "d"), (2, None, None, "P"))
    statements = recorded.session.statements
    kinds = {statements.deletions[qid][1]: statements.prepared[qid]
             for qid in statements.deletions}
    assert set(kinds) == {ROW_DELETE, PARTITION_DELETE}
    assert not statements.deletes                  # no column deleted by name
    row, partition = kinds[ROW_DELETE], kinds[PARTITION_DELETE]
    assert [m.name for m in row.column_metadata] == ["[timestamp]", "k", "c"]
    assert [m.name for m in partition.column_metadata] == ["[timestamp]", "k"]
    assert row.column_metadata[0].type is cqltypes.LongType
    assert row.routing_key_indexes == partition.routing_key_indexes == [1]
    assert row.query_id != partition.query_id
    assert [(r["op"], r["key"], r["ts"]) for r in read(recorded.path)] == [
        (ROW_DELETE, [1, 0], 10), (PARTITION_DELETE, [2], 11)]


def test_a_delete_without_columns_is_parsed_and_a_delete_of_columns_as_before():
    assert parse_delete('DELETE FROM "ks"."t" USING TIMESTAMP ? WHERE "k" = ? AND "c" = ?') \
        == ("t", [], ["k", "c"])
    assert parse_delete('DELETE FROM "ks"."t" USING TIMESTAMP ? WHERE "k" = ?') \
        == ("t", [], ["k"])
    assert parse_delete('DELETE "v", "w" FROM "ks"."t" USING TIMESTAMP ? WHERE "k" = ?') \
        == ("t", ["v", "w"], ["k"])


def test_a_delete_of_columns_is_still_column_tombstones():
    statements = Statements({"t": CLUSTERED})
    prepared = statements.prepare('DELETE "v" FROM "ks"."t" USING TIMESTAMP ? '
                                  'WHERE "k" = ? AND "c" = ?')
    assert statements.deletes == {prepared.query_id: ("t", ["v"])}
    assert not statements.deletions


def test_without_clustering_columns_a_partition_delete_is_its_rows_delete(tmp_path):
    recorded = Recorded(PLAIN, tmp_path).write(10, (1, "a", "u"), (2, "b", "u"))
    recorded.write(20, (1, None, "P"))
    assert [r["op"] for r in read(recorded.path)][-1] == ROW_DELETE
    assert recorded.shown() == {(2,): {"v": "b"}}


def test_a_row_delete_hides_the_older_cells_of_its_row_and_no_other_row(tmp_path):
    recorded = Recorded(CLUSTERED, tmp_path).write(10, (1, 0, "a", "u"), (1, 1, "b", "u"),
                                                   (1, 0, None, "d"))
    assert recorded.shown() == {(1, 1): {"v": "b"}}


def test_an_upsert_above_the_delete_shows_again_and_an_older_one_arriving_late_does_not(tmp_path):
    recorded = Recorded(CLUSTERED, tmp_path).write(10, (1, 0, "a", "u"), (1, 0, None, "d"),
                                                   (1, 0, "c", "u"))
    assert recorded.shown() == {(1, 0): {"v": "c"}}
    recorded.write(5, (1, 0, "old", "u"), (1, 0, None, "d"))      # a replay of older changes
    assert recorded.shown() == {(1, 0): {"v": "c"}}
    recorded.write(11, (1, 0, "late", "u"))         # at the delete's timestamp: the tie
    assert recorded.shown() == {(1, 0): {"v": "c"}}


@pytest.mark.parametrize("delete_first", [False, True])
def test_a_tie_goes_to_the_tombstone_whichever_arrives_first(tmp_path, delete_first):
    recorded = Recorded(CLUSTERED, tmp_path)
    writes = [(10, (1, 0, "a", "u")), (10, (1, 0, None, "d"))]
    for first_ts, row in reversed(writes) if delete_first else writes:
        recorded.write(first_ts, row)
    assert recorded.shown() == {}


def test_a_partition_delete_hides_every_row_of_its_partition_at_or_below_it_only(tmp_path):
    recorded = Recorded(CLUSTERED, tmp_path)
    recorded.write(10, (1, 0, "a", "u"), (1, 1, "b", "u"), (2, 0, "other", "u"))
    recorded.write(15, (1, None, None, "P"))                     # c null: the whole partition
    recorded.write(15, (1, 1, "tie", "u"))                       # at its timestamp: hidden
    recorded.write(20, (1, 1, "after", "u"))
    assert recorded.shown() == {(1, 1): {"v": "after"}, (2, 0): {"v": "other"}}


def test_the_highest_of_a_rows_and_its_partitions_deletions_counts(tmp_path):
    recorded = Recorded(CLUSTERED, tmp_path)
    recorded.write(18, (1, 0, "a", "u"), (1, 1, "b", "u"))
    recorded.write(20, (1, 0, None, "d"))      # above the row's cells
    recorded.write(15, (1, None, None, "P"))   # below them: hides nothing
    assert recorded.shown() == {(1, 1): {"v": "b"}}
    recorded.write(25, (1, None, None, "P"))
    recorded.write(22, (1, 0, "under", "u"))   # above the row's deletion, under the partition's
    assert recorded.shown() == {}


def test_deletions_keep_the_highest_timestamp_of_each_row_and_partition():
    deletions = Deletions()
    deletions.delete(ROW_DELETE, (1, 0), 20)
    deletions.delete(ROW_DELETE, (1, 0), 12)
    deletions.delete(PARTITION_DELETE, (1,), 15)
    deletions.delete(PARTITION_DELETE, (2,), 30)
    assert deletions.of((1, 0)) == 20
    assert deletions.of((1, 1)) == 15
    assert deletions.of((2, 5)) == 30
    assert deletions.of((3, 0)) == -(2**63)


def node_of(table: TableSchema) -> SimCassandra:
    return SimCassandra({table.table: table}, random.Random(0), lambda: int(NOW_S * 1e6))


def test_the_simulated_node_applies_them_as_the_records_show_them_in_any_order(tmp_path):
    chunks = [(10, [(1, 0, "a", "u"), (1, 1, "b", "u"), (2, 0, "x", "u")]),
              (13, [(1, 0, None, "d"), (1, None, None, "P")]),
              (12, [(1, 1, "c", "u"), (2, 0, None, "d"), (2, 0, "y", "u")]),
              (15, [(1, 0, "z", "u")])]
    recorded = Recorded(CLUSTERED, tmp_path)
    for first_ts, rows in chunks:
        recorded.write(first_ts, *rows)
    for order in (chunks, list(reversed(chunks))):
        node = node_of(CLUSTERED)
        upserter = Upserter(node.connect()[1], CLUSTERED, CLUSTERED.column_names, STREAM)
        for first_ts, rows in order:
            upserter.write_chunk(changes(CLUSTERED, *rows), first_ts, 0)
        assert node.visible("t") == recorded.shown() == {(1, 0): {"v": "z"}, (2, 0): {"v": "y"}}
    kinds = [(w.deletion, w.key, w.ts, w.cells) for w in node.writes if w.deletion]
    assert sorted(kinds) == [(PARTITION_DELETE, (1,), 14, ()), (ROW_DELETE, (1, 0), 13, ()),
                             (ROW_DELETE, (2, 0), 13, ())]
