"""A change stream's input (issue 35), refused before anything is staged: the ``op.*`` options
(:func:`sinks.worker.options.parse_options`), the op column against the DataFrame and the
table (:func:`sinks.worker.validation.validate_schema`), each task's rows
(:func:`sinks.worker.validation.check_operations_and_keys`), and a restart that would change
where a change stream's write timestamps come from (:func:`sinks.worker.plan.prepare_write`).
What a delete writes, on the real node: ``tests/integration/test_change_streams.py``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from recovery.config import SinkConfig
from recovery.cql import changes
from recovery.cql.config import WriteConfig
from recovery.cql.errors import InvalidValueError, NullPrimaryKeyError, OptionError, SchemaError
from recovery.cql.table import TableSchema
from recovery.target import RecordedTarget, Target
from sinks.worker import plan as plan_module
from sinks.worker.options import parse_options
from sinks.worker.validation import check_operations_and_keys, validate_schema
from wal.seal import Seal
from wal.sealed_write import SEALED_OPTIONS

pytestmark = pytest.mark.unit

BASE = {"keyspace": "ks", "table": "t"}
TABLE = TableSchema("ks", "t", (("k", "int"), ("c", "int"), ("v", "text")), ("k",), ("c",))
STREAM = WriteConfig(op_column="op", partition_delete_values=("P",))


def schema(op_type: T.DataType = T.StringType(), op_name: str = "op") -> T.StructType:
    return T.StructType([T.StructField("k", T.IntegerType()), T.StructField("c", T.IntegerType()),
                         T.StructField("v", T.StringType()), T.StructField(op_name, op_type)])


def rows(*values, op_type=pa.string()) -> pa.RecordBatch:
    k, c, v, op = zip(*values)
    return pa.record_batch({"k": pa.array(k, pa.int32()), "c": pa.array(c, pa.int32()),
                            "v": pa.array(v, pa.string()), "op": pa.array(op, op_type)})


# -- options --------------------------------------------------------------------------------
def test_the_op_options_become_the_write_config_and_the_seal_records_them():
    config = parse_options({**BASE, "op.column": "op", "op.deleteValues": "d,x",
                            "op.partitionDeleteValues": "P"})
    write = config.write
    assert (write.op_column, write.upsert_values, write.delete_values,
            write.partition_delete_values) == ("op", ("c", "u", "r"), ("d", "x"), ("P",))
    assert parse_options(BASE).write.op_column is None
    # What decides a row's operation travels with its seal: a restart with other options
    # replays a pending batch as it was sealed.
    assert {"op_column", "upsert_values", "delete_values",
            "partition_delete_values"} <= set(SEALED_OPTIONS)
    sealed = Target(config, TABLE, ("k", "c", "v")).write_record()
    later = Target(parse_options(BASE), TABLE, ("k", "c", "v")).as_sealed(sealed)
    assert later.config.write.delete_values == ("d", "x")
    assert later.config.write.op_column == "op"


@pytest.mark.parametrize("options, option, words", [
    ({"op.deleteValues": "u"}, "op.deleteValues", "also one of op.upsertValues"),
    ({"op.partitionDeleteValues": "d"}, "op.partitionDeleteValues", "also one of op.deleteValues"),
    ({"op.upsertValues": ""}, "op.upsertValues", "at least one value"),
    ({"op.deleteValues": " , "}, "op.deleteValues", "at least one value"),
    ({"writetime": "1700000000000000"}, "writetime", "the delete always wins"),
])
def test_change_stream_options_that_disagree_are_refused_naming_the_option(options, option, words):
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "op.column": "op", **options})
    assert info.value.option == option
    assert words in str(info.value)


def test_a_writetime_column_is_accepted_in_a_change_stream():
    write = parse_options({**BASE, "op.column": "op", "writetime": "ts"}).write
    assert (write.op_column, write.writetime_column) == ("op", "ts")


# -- the op column against the DataFrame and the table --------------------------------------
def test_the_op_column_is_not_written():
    assert validate_schema(schema(), TABLE, STREAM) == ["k", "c", "v"]
    deleted = WriteConfig(op_column="op", upsert_values=("false",), delete_values=("true",))
    assert validate_schema(schema(T.BooleanType()), TABLE, deleted) == ["k", "c", "v"]


@pytest.mark.parametrize("spark_schema, table, words", [
    (schema(op_name="operation"), TABLE, "the op column is not in the DataFrame"),
    (schema(T.IntegerType()), TABLE, "the op column must be string or boolean, not int"),
    (schema(), TableSchema("ks", "t", (("k", "int"), ("c", "int"), ("v", "text"), ("op", "text")),
                           ("k",), ("c",)), "is the op column and also a column of ks.t"),
])
def test_a_bad_op_column_is_refused_naming_it(spark_schema, table, words):
    with pytest.raises(SchemaError) as info:
        validate_schema(spark_schema, table, STREAM)
    assert words in str(info.value)


# -- each task's rows -----------------------------------------------------------------------
def check(batch: pa.RecordBatch, write: WriteConfig = STREAM) -> None:
    check_operations_and_keys(batch, ["k", "c"], ["k"], write)


def test_operations_are_read_exactly_and_booleans_as_true_and_false():
    kinds = changes.operations(pa.array(["c", "u", "r", "d", "P", "D", None, "x"]), STREAM)
    assert kinds.tolist() == [0, 0, 0, 1, 2, -1, -1, -1]
    deleted = WriteConfig(op_column="gone", upsert_values=("false",), delete_values=("true",))
    assert changes.operations(pa.array([False, True, None]), deleted).tolist() == [0, 1, -1]


def test_rows_of_every_operation_with_their_keys_pass():
    check(rows((1, 1, "a", "c"), (1, 1, None, "d"), (2, None, None, "P"), (2, 5, "y", "u")))
    check(rows((1, 1, "a", False), (1, 1, None, True), op_type=pa.bool_()),
          WriteConfig(op_column="op", upsert_values=("false",), delete_values=("true",)))


@pytest.mark.parametrize("batch, error, column, words", [
    (rows((1, 1, "a", "c"), (1, 2, "b", "t")), InvalidValueError, "op",
     "operation 't' is none of the change stream's values (op.upsertValues: c,u,r; "
     "op.deleteValues: d; op.partitionDeleteValues: P)"),
    (rows((1, 1, "a", "c"), (1, 2, "b", None)), InvalidValueError, "op", "operation None"),
    (rows((1, 1, "a", "c"), (1, None, None, "d")), InvalidValueError, "c",
     "a row delete needs the whole primary key"),
    (rows((None, 1, None, "d"),), InvalidValueError, "k", "a row delete needs the whole"),
    (rows((None, None, None, "P"),), NullPrimaryKeyError, "k", "first at row 0 of 1"),
    (rows((2, None, None, "P"), (2, None, "y", "c")), NullPrimaryKeyError, "c",
     "first at row 1 of 2"),
])
def test_a_row_a_change_stream_cannot_tell_is_refused_naming_the_column_and_row(
        batch, error, column, words):
    with pytest.raises(error) as info:
        check(batch)
    assert info.value.column == column
    assert words in str(info.value)


def test_without_op_column_a_null_key_is_refused_as_before():
    with pytest.raises(NullPrimaryKeyError):
        check_operations_and_keys(rows((1, None, "a", "c")), ["k", "c"], ["k"], WriteConfig())


def test_a_partition_delete_is_never_inferred_from_null_clustering_columns():
    """A row delete with a null clustering column is refused, not widened to its partition."""
    with pytest.raises(InvalidValueError) as info:
        check(rows((2, None, None, "d")), WriteConfig(op_column="op"))
    assert "op.partitionDeleteValues (now: none)" in str(info.value)


# -- a restart's source of write timestamps -------------------------------------------------
class _Wal:
    def __init__(self, flushed_through: int = -1, sealed: tuple = ()):
        self.flushed_through, self.sealed = flushed_through, list(sealed)

    def read_flushed_through(self) -> int:
        return self.flushed_through

    def sealed_batch_ids(self) -> list[int]:
        return self.sealed


def recorded(write: WriteConfig, kept: str | None = None) -> RecordedTarget:
    target = Target(SinkConfig("ks", "t", write=write), TABLE, ("k", "c", "v"))
    return RecordedTarget.of(target, "fingerprint", kept)


def kept_source(before, after: WriteConfig, *wals):
    earlier = recorded(before) if isinstance(before, WriteConfig) else before
    return plan_module._kept_source_of_timestamps(earlier, after, list(wals))


@pytest.mark.parametrize("before, after", [
    (WriteConfig(op_column="op"), WriteConfig(op_column="op", writetime_column="ts")),
    (WriteConfig(op_column="op", writetime_column="ts"), WriteConfig(op_column="op")),
    (WriteConfig(writetime_column="ts"), WriteConfig(op_column="op")),
    (WriteConfig(op_column="op", writetime_column="ts"),
     WriteConfig(op_column="op", writetime_column="lsn")),
    # a change stream that became a plain one still may not switch (the review's two steps)
    (WriteConfig(op_column="op"), WriteConfig(writetime_column="ts")),
])
def test_a_change_stream_may_not_switch_its_source_of_write_timestamps(before, after):
    with pytest.raises(OptionError) as info:
        kept_source(before, after, _Wal(flushed_through=3))
    assert info.value.option == "writetime"
    assert "new checkpoint and table" in str(info.value)
    kept_source(before, after, _Wal())      # nothing sealed yet: fine
    with pytest.raises(OptionError):
        kept_source(before, after, _Wal(sealed=(0,)))
    with pytest.raises(OptionError):        # sealed in the WAL it moved from
        kept_source(before, after, _Wal(), _Wal(flushed_through=0))


def test_the_source_a_change_stream_fixed_is_kept_through_plain_writes():
    """(op, sealed) -> (plain, sealed) -> (plain, lsn) -> (op, lsn) went through one step at a
    time (the review of 047c083): the source is now kept in target.json from the first change
    stream on, and the third step is refused."""
    sealed = "sealed timestamps (writetime unset)"
    assert kept_source(WriteConfig(), WriteConfig(op_column="op"), _Wal()) == sealed
    step1 = kept_source(WriteConfig(op_column="op"), WriteConfig(), _Wal(flushed_through=0))
    assert step1 == sealed
    with pytest.raises(OptionError) as info:
        kept_source(recorded(WriteConfig(), step1), WriteConfig(writetime_column="lsn"),
                    _Wal(flushed_through=1))
    assert "by a change stream" in str(info.value)


def test_a_plain_upsert_stream_may_still_change_its_writetime():
    assert kept_source(WriteConfig(), WriteConfig(writetime_column="ts"),
                       _Wal(flushed_through=3)) is None


def test_operations_of_a_chunked_column():
    column = pa.chunked_array([["c", "d"], ["P"]])
    assert np.array_equal(changes.operations(column, STREAM), [0, 1, 2])


def test_a_seal_that_recorded_no_write_options_is_written_as_upserts():
    """A batch a release before seals recorded their options sealed has no op column in its
    segments: a restart that sets op.column must not look for one (the review of 047c083:
    KeyError 'Field "op" does not exist')."""
    target = Target(parse_options({**BASE, "op.column": "op"}), TABLE, ("k", "c", "v"))
    assert target.as_sealed(None).config.write.op_column is None
    empty = Seal.from_dict({"batch": 0, "segments": [], "base_ts_us": 1, "commit_point": "seal",
                            "seal_id": "s", "sealed_at_us": 1, "write": {}})
    assert empty.write is None and target.as_sealed(empty.write).config.write.op_column is None
    assert target.as_sealed(target.write_record()).config.write.op_column == "op"


def test_a_boolean_op_column_takes_true_and_false_only():
    deleted = WriteConfig(op_column="op", upsert_values=("false",), delete_values=("True",))
    with pytest.raises(OptionError) as info:
        validate_schema(schema(T.BooleanType()), TABLE, deleted)
    assert info.value.option == "op.deleteValues" and "'true' and 'false'" in str(info.value)


def test_a_release_before_change_streams_is_refused_a_local_wal_one_wrote(tmp_path):
    """The review of 047c083: a release before change streams ignored a seal's op column and
    wrote its deletes as upserts. A change stream raises WAL_FORMAT to 2 before it stages, and
    such a release (which reads version 1 only) refuses it; this release reads both. Its
    target.json carries the change-stream fields only for a change stream, so that release
    still reads a plain stream's."""
    import json

    from wal import format as fmt
    from wal.errors import UnsupportedFormat
    from wal.layout import WalDir

    wal = WalDir(str(tmp_path / "wal")).create()
    assert json.loads(open(wal.marker).read())["version"] == fmt.FORMAT_VERSION == 1
    wal.hold_changes()
    assert json.loads(open(wal.marker).read())["version"] == fmt.FORMAT_CHANGES == 2
    wal.check()
    with pytest.MonkeyPatch.context() as patch:      # the earlier release's check
        patch.setattr(fmt, "FORMAT_CHANGES", fmt.FORMAT_VERSION)
        with pytest.raises(UnsupportedFormat):
            wal.check()
    plain = parse_options(BASE)
    assert "op_column" not in plain.public_dict()["write"]
    assert "marker_table" not in plain.public_dict()["wal"]
    stream = parse_options({**BASE, "op.column": "op", "marker.table": "p"})
    assert stream.public_dict()["write"]["op_column"] == "op"
    assert stream.public_dict()["wal"]["marker_table"] == "p"


def test_a_flush_tasks_upserter_keeps_the_change_streams_operations(monkeypatch):
    """A flush task (``executors``) is handed its target already as sealed and asks for the
    Upserter without a seal: it must write the change stream's deletes as deletes. (After a
    seal that recorded no options was made to mean upserts, the task's target lost its op
    column and every delete went out as an upsert: the simulation's seed 649, and the crash
    matrix's executors-flush.mid@5 of a change stream.)"""
    from recovery import output

    made = []
    monkeypatch.setattr(output, "Upserter", lambda session, table, columns, write, *a, **k:
                        made.append(write) or write)
    monkeypatch.setattr(output.CassandraOutput, "_session_for", lambda self, connection: None)
    target = Target(parse_options({**BASE, "op.column": "op"}), TABLE, ("k", "c", "v"))
    sealed = target.as_sealed(target.write_record())
    assert output.CassandraOutput(sealed).upserter().op_column == "op"
    assert output.CassandraOutput(target).upserter_for(None).op_column is None   # a seal
    assert [w.op_column for w in made] == ["op", None]
