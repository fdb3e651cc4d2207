"""The completeness marker's parts without a node (issue 35): the table's schema check, the
batch's figures from the log (``taken_at_us`` kept from ingest to FLUSHED) and the checkpoint's
watermark. On the real node and Spark: ``tests/integration/test_change_streams.py``."""

from __future__ import annotations

import json

import pytest

from recovery.config import SinkConfig, WalConfig
from recovery.cql import marker_table
from recovery.cql.config import WriteConfig
from recovery.cql.errors import OptionError, SinkError
from recovery.cql.table import TableSchema
from recovery.marker import Completeness, MarkerWriter, marker_query_id, write_marker
from recovery.target import Target
from tests.helpers.walfactory import WalFactory
from wal import checkpoint as ckpt
from wal.log import _Head
from wal.states import BatchState

pytestmark = pytest.mark.unit

MARKER = TableSchema("ks", "progress", marker_table.COLUMNS, ("query_id",), ("target_table",))


def test_the_created_table_is_one_the_check_accepts():
    cql = marker_table.create_cql("ks", "progress")
    assert cql.startswith('CREATE TABLE IF NOT EXISTS "ks"."progress" ("query_id" text, ')
    assert cql.endswith("PRIMARY KEY ((query_id), target_table))")
    marker_table.check_schema(MARKER, "progress")
    extra = TableSchema("ks", "progress", marker_table.COLUMNS + (("note", "text"),),
                        ("query_id",), ("target_table",))
    marker_table.check_schema(extra, "progress")     # other columns are left alone


@pytest.mark.parametrize("schema, words", [
    (TableSchema("ks", "p", marker_table.COLUMNS, ("query_id", "target_table")),
     "its primary key is (query_id, target_table), no clustering"),
    (TableSchema("ks", "p", tuple(c for c in marker_table.COLUMNS if c[0] != "watermark"),
                 ("query_id",), ("target_table",)), "column watermark is missing"),
    (TableSchema("ks", "p", tuple((n, "text" if n == "rows" else t)
                                  for n, t in marker_table.COLUMNS),
                 ("query_id",), ("target_table",)), "column rows is text, not bigint"),
])
def test_a_table_that_is_not_the_markers_is_refused_with_its_schema(schema, words):
    with pytest.raises(OptionError) as info:
        marker_table.check_schema(schema, "ks.p")
    assert info.value.option == "marker.table" and words in str(info.value)
    assert "CREATE TABLE IF NOT EXISTS" in str(info.value)


def test_the_tables_name_defaults_to_the_targets_keyspace():
    assert marker_table.split_name("progress", "shop") == ("shop", "progress")
    assert marker_table.split_name("ops.progress", "shop") == ("ops", "progress")


def test_a_batchs_figures_come_from_its_record_kept_from_ingest_to_flushed(tmp_path):
    table = TableSchema("ks", "t", (("id", "bigint"), ("name", "text")), ("id",))
    target = Target(SinkConfig("ks", "t", write=WriteConfig()), table, ("id", "name"))
    with WalFactory(tmp_path / "wal") as f:
        sealed = f.sealed(3, rows=[4, 2], write=target.write_record(), committed=None)
        taken = f.wal_log.ingest(sealed.seal).taken_at_us
        assert taken is not None
        assert f.wal_log.begin_flush(3).taken_at_us == taken
        assert f.wal_log.record_progress(3, 1, 0, 4).taken_at_us == taken
        done = f.wal_log.mark_flushed(3)
        assert done.taken_at_us == taken == f.wal_log.get(3).taken_at_us
        figures = Completeness.of(f.wal_log.get(3), target, 1_800_000)
    assert figures == Completeness("ks.t", 3, 6, taken, done.updated_at_us, 1_800_000,
                                   sealed.seal.base_ts_us + 5)
    assert done.updated_at_us >= taken


def test_a_head_written_before_taken_at_was_kept_reads_as_unknown():
    old = json.dumps({"batch": 1, "state": "flushed", "seal_id": "s", "rows": 3,
                      "updated_at_us": 5, "reason": "", "rows_in_log": True}).encode()
    head = _Head.decode(old)
    assert head.taken_at_us is None and head.state is BatchState.FLUSHED


@pytest.mark.parametrize("second_line, expected", [
    ('{"batchWatermarkMs":1795911452130,"batchTimestampMs":1}', 1795911452130),
    ('{"batchWatermarkMs":0,"batchTimestampMs":1}', None),
    ('{"batchTimestampMs":1}', None),
    ('not json', None),
])
def test_the_watermark_a_batch_ran_with_is_read_from_its_offsets(tmp_path, second_line,
                                                                   expected):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text(f"v1\n{second_line}\n{{\"logOffset\":4}}\n")
    checkpoint = ckpt.open_checkpoint(str(tmp_path))
    assert checkpoint.batch_watermark_ms(4) == expected
    assert checkpoint.batch_watermark_ms(5) is None            # purged, or never run


class _Session:
    def __init__(self, error=None):
        self.error, self.executed = error, []

    def prepare(self, cql):
        from types import SimpleNamespace
        return SimpleNamespace(cql=cql, is_idempotent=False, consistency_level=None)

    def execute(self, prepared, values):
        if self.error is not None:
            raise self.error
        self.executed.append((prepared.cql, values))


def _writer() -> "MarkerWriter":
    table = TableSchema("ks", "t", (("id", "bigint"),), ("id",))
    config = SinkConfig("ks", "t", wal=WalConfig(marker_table="progress"))
    return MarkerWriter(Target(config, table, ("id",)), "query-1")


DONE = Completeness("ks.t", 7, 100, 1_000_000, 2_000_000, None, 5_000_007)


def test_the_marker_row_is_written_with_the_batchs_last_sealed_timestamp():
    session, writer = _Session(), _writer()
    writer.write(session, DONE)
    ((cql, values),) = session.executed
    assert cql.startswith('INSERT INTO "ks"."progress" ("query_id", "target_table", "batch_id"')
    assert cql.endswith("USING TIMESTAMP ?")
    assert values == ("query-1", "ks.t", 7, 1_000, 2_000, 100, None, 5_000_007)
    assert writer.written == DONE


def test_a_marker_table_gone_since_the_check_blocks_naming_the_option_and_the_remedy():
    from cassandra import InvalidRequest

    from recovery.errors import is_transient

    writer = _writer()
    with pytest.raises(SinkError) as info:
        writer.write(_Session(InvalidRequest("unconfigured table progress")), DONE)
    text = str(info.value)
    assert "marker.table ks.progress" in text and "batch 7 is written" in text
    assert "CREATE TABLE IF NOT EXISTS" in text and not is_transient(info.value)
    assert writer.written is None


def test_the_marker_is_written_for_a_batch_the_log_holds_written_and_once(tmp_path):
    """:func:`write_marker`, the flusher's and an offline recovery's: a batch the log does not
    hold FLUSHED (sealed only, or gone) is not named; one it does is written once per
    writer."""
    writer, session = _writer(), _Session()
    target = Target(SinkConfig("ks", "t", wal=WalConfig(marker_table="progress")),
                    TableSchema("ks", "t", (("id", "bigint"),), ("id",)), ("id",))
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "wal", checkpoint=cp) as f:
        f.flushed(0, rows=[3])
        f.ingested(1, rows=[2])
        sessions = []

        def session_of(seal):
            sessions.append(seal.batch)
            return session

        assert not write_marker(writer, f.wal_log, target, str(cp), 1, session_of)
        assert not write_marker(writer, f.wal_log, target, str(cp), -1, session_of)
        assert not write_marker(writer, f.wal_log, target, str(cp), 7, session_of)
        assert session.executed == []
        assert write_marker(writer, f.wal_log, target, str(cp), 0, session_of)
        assert write_marker(writer, f.wal_log, target, str(cp), 0, session_of)
    ((_, values),) = session.executed                  # once: the same figures again
    assert values[0] == "query-1" and values[2] == 0 and values[5] == 3
    assert sessions == [0] and writer.written.batch == 0
    # The query a row is of: Spark's id, or the checkpoint's path before Spark wrote one.
    assert marker_query_id(str(cp)) == str(cp)
    (cp / "metadata").write_text('{"id":"q-7"}\n')
    assert marker_query_id(str(cp)) == "q-7"
