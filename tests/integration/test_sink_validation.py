"""Bad writes fail before anything is staged or written, with an error naming the culprit.

Each case checks three things: the sink's error message (Spark wraps it in an
AnalysisException, PythonException or StreamingQueryException; we read the
``recovery.cql.errors.<Type>: <message>`` line, not the traceback's source lines) names the option /
column / keyspace / table, the WAL directory holds no segment and no seal, and the target
table is still empty.
"""

from __future__ import annotations

import os

import pytest

from sinkutil import (create_table, error_text, read_table, register, running, sink_error_line,
                      sink_options, stream_wal, wait_all_flushed, wal_files, write_json_files)
from wal.layout import WalDir

pytestmark = pytest.mark.integration

SCHEMA = "id INT, name STRING, age INT"
ROWS = [(1, "ada", 36), (2, "alan", 41)]


@pytest.fixture
def people(spark, cql, keyspace):
    """A keyspace holding ``people (id int PRIMARY KEY, name text, age int)``."""
    register(spark)
    create_table(cql, keyspace, "people (id int PRIMARY KEY, name text, age int)")
    return keyspace


def _assert_nothing_staged(wal: WalDir) -> None:
    segments, seals = wal_files(wal)
    assert segments == [] and seals == [], f"staged {segments}, sealed {seals}"


def _save_fails(cassandra_node, tmp_path, df, keyspace, table, error_type, needles, **extra):
    """``df.write...save()`` must fail with ``recovery.cql.errors.<error_type>`` whose message holds
    every needle, staging nothing."""
    wal = WalDir(str(tmp_path / "wal"))
    opts = sink_options(cassandra_node, keyspace, table, **{"wal.path": wal.root}, **extra)
    with pytest.raises(Exception) as info:
        df.write.format("cassandra_wal").mode("append").options(**opts).save()
    line = sink_error_line(info.value)
    assert line.startswith(f"recovery.cql.errors.{error_type}: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    _assert_nothing_staged(wal)
    return line


def test_unknown_keyspace(spark, cql, cassandra_node, people, tmp_path):
    _save_fails(cassandra_node, tmp_path, spark.createDataFrame(ROWS, SCHEMA),
                "no_such_keyspace_x", "people", "UnknownKeyspaceError",
                ["keyspace 'no_such_keyspace_x' does not exist"])
    assert read_table(cql, people, "people") == []


def test_unknown_table(spark, cql, cassandra_node, people, tmp_path):
    _save_fails(cassandra_node, tmp_path, spark.createDataFrame(ROWS, SCHEMA),
                people, "no_such_table", "UnknownTableError",
                [f"table {people}.no_such_table does not exist"])
    assert read_table(cql, people, "people") == []


def test_dataframe_column_not_in_table(spark, cql, cassandra_node, people, tmp_path):
    df = spark.createDataFrame([(1, "ada", 36, "x")], SCHEMA + ", nickname STRING")
    _save_fails(cassandra_node, tmp_path, df, people, "people", "SchemaError",
                ["column 'nickname'", f"not a column of {people}.people"])
    assert read_table(cql, people, "people") == []


def test_missing_primary_key_column(spark, cql, cassandra_node, people, tmp_path):
    df = spark.createDataFrame([("ada", 36)], "name STRING, age INT")
    _save_fails(cassandra_node, tmp_path, df, people, "people", "SchemaError",
                ["column 'id'", "partition key", "missing from the DataFrame"])
    assert read_table(cql, people, "people") == []


def test_incompatible_type(spark, cql, cassandra_node, people, tmp_path):
    df = spark.createDataFrame([(1, "ada", "thirty-six")], "id INT, name STRING, age STRING")
    _save_fails(cassandra_node, tmp_path, df, people, "people", "SchemaError",
                ["column 'age'", "Spark type string", "CQL type int"])
    assert read_table(cql, people, "people") == []


def test_counter_table_is_refused(spark, cql, cassandra_node, people, tmp_path):
    create_table(cql, people, "hits (page text PRIMARY KEY, n counter)")
    df = spark.createDataFrame([("home", 1)], "page STRING, n BIGINT")
    _save_fails(cassandra_node, tmp_path, df, people, "hits", "CounterTableError",
                [f"table {people}.hits is a counter table", "not idempotent", "replay"])
    assert read_table(cql, people, "hits") == []


def test_bad_option_value(spark, cql, cassandra_node, people, tmp_path):
    _save_fails(cassandra_node, tmp_path, spark.createDataFrame(ROWS, SCHEMA), people, "people",
                "OptionError",
                ["option 'spark.cassandra.output.concurrent.writes' = '-1'", "must be >= 1"],
                **{"spark.cassandra.output.concurrent.writes": "-1"})
    assert read_table(cql, people, "people") == []


def test_unknown_option(spark, cql, cassandra_node, people, tmp_path):
    _save_fails(cassandra_node, tmp_path, spark.createDataFrame(ROWS, SCHEMA), people, "people",
                "OptionError",
                ["option 'spark.cassandra.output.concurent.writes'", "unknown option",
                 "did you mean 'spark.cassandra.output.concurrent.writes'"],
                **{"spark.cassandra.output.concurent.writes": "8"})
    assert read_table(cql, people, "people") == []


def test_null_primary_key_value_in_a_batch_job(spark, cql, cassandra_node, people, tmp_path):
    # One partition: the failing task is the only one, so nothing at all may be staged.
    df = spark.createDataFrame([(1, "ada", 36), (None, "nobody", 0), (3, "grace", 85)],
                               SCHEMA).coalesce(1)
    _save_fails(cassandra_node, tmp_path, df, people, "people", "NullPrimaryKeyError",
                ["column 'id'", "primary key column is null", "row 1 of 3"])
    assert read_table(cql, people, "people") == []


def test_null_primary_key_value_in_a_stream(spark, cql, cassandra_node, people, tmp_path):
    """Found at run time, in the task: the query fails and batch 0 is never sealed."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [[{"id": 1, "name": "ada", "age": 36}, {"name": "no id", "age": 1}]])
    stream = spark.readStream.schema(SCHEMA).json(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, people, "people", cp))
             .trigger(availableNow=True).start())
    with running(query):
        with pytest.raises(Exception) as info:
            query.awaitTermination(180)
    line = sink_error_line(info.value)
    assert line.startswith("recovery.cql.errors.NullPrimaryKeyError: column 'id': primary key "
                           "column is null"), line
    assert not os.path.exists(cp / "commits" / "0")
    _assert_nothing_staged(stream_wal(cp))
    assert read_table(cql, people, "people") == []


def test_missing_checkpoint_location_for_a_stream(spark, cql, cassandra_node, people, tmp_path):
    src = tmp_path / "src"
    write_json_files(src, [[{"id": 1, "name": "ada", "age": 36}]])
    stream = spark.readStream.schema(SCHEMA).json(str(src))
    writer = (stream.writeStream.format("cassandra_wal")
              .options(**sink_options(cassandra_node, people, "people"))
              .trigger(availableNow=True))
    # Spark itself refuses a sink without a checkpoint location...
    with pytest.raises(Exception) as info:
        with running(writer.start()) as query:
            query.awaitTermination(180)
    assert "checkpointLocation" in error_text(info.value)

    # ...unless the session sets spark.sql.streaming.checkpointLocation. The sink still
    # wants the option: its WAL and its flusher are tied to the query's own checkpoint.
    session_cp = tmp_path / "session-checkpoints"
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(session_cp))
    try:
        with pytest.raises(Exception) as info:
            with running(writer.start()) as query:
                query.awaitTermination(180)
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    line = sink_error_line(info.value)
    assert line.startswith("recovery.cql.errors.OptionError: option 'checkpointLocation': required"), line
    staged = [os.path.join(d, f) for d, _, fs in os.walk(session_cp) for f in fs
              if "cassandra_wal" in d]
    assert staged == []
    assert read_table(cql, people, "people") == []


def test_empty_partition_key_value_is_refused_and_does_not_block_the_wal(
        spark, cql, cassandra_node, people, tmp_path):
    """Cassandra refuses an empty single-column partition key ("Key may not be empty"). Found
    only at flush time, such a row would leave a sealed batch that can never be written and
    that blocks every later batch of the WAL; it must be refused while staging, like a null."""
    create_table(cql, people, "tags (name text PRIMARY KEY, n int)")
    df = spark.createDataFrame([("ok", 1), ("", 2), ("fine", 3)], "name STRING, n INT").coalesce(1)
    _save_fails(cassandra_node, tmp_path, df, people, "tags", "InvalidValueError",
                ["column 'name'", "empty", "partition key", "row 1 of 3"])
    assert read_table(cql, people, "tags") == []

    # The same WAL takes the next, valid write.
    good = spark.createDataFrame([("ok", 1)], "name STRING, n INT")
    good.write.format("cassandra_wal").mode("append").options(
        **sink_options(cassandra_node, people, "tags", **{"wal.path": str(tmp_path / "wal")})
    ).save()
    assert read_table(cql, people, "tags") == [{"name": "ok", "n": 1}]


def test_invalid_value_is_refused_while_staging_and_does_not_block_the_wal(
        spark, cql, cassandra_node, people, tmp_path):
    """A string that is not a UUID matches the schema (uuid columns take Spark strings) but
    not the data: it must fail the task, before the batch is sealed, not the flush after."""
    create_table(cql, people, "refs (id int PRIMARY KEY, ref uuid)")
    good_uuid = "3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e"
    df = spark.createDataFrame([(1, good_uuid), (2, "not-a-uuid")], "id INT, ref STRING").coalesce(1)
    _save_fails(cassandra_node, tmp_path, df, people, "refs", "InvalidValueError",
                ["column 'ref'", "'not-a-uuid' is not a UUID", "row 1 of 2"])
    assert read_table(cql, people, "refs") == []

    good = spark.createDataFrame([(1, good_uuid)], "id INT, ref STRING")
    good.write.format("cassandra_wal").mode("append").options(
        **sink_options(cassandra_node, people, "refs", **{"wal.path": str(tmp_path / "wal")})
    ).save()
    rows = read_table(cql, people, "refs")
    assert [(r["id"], str(r["ref"])) for r in rows] == [(1, good_uuid)]


@pytest.mark.parametrize("option,column,bad,needle", [
    ("ttl", "ttl", -5, "TTL -5 is out of range"),
    ("ttl", "ttl", 2**31, "TTL 2147483648 is out of range"),   # would wrap to -2**31 when sent
    ("writetime", "wt", None, "write timestamp is null"),
], ids=["negative-ttl", "ttl-2^31", "null-writetime"])
def test_bad_ttl_or_writetime_in_a_stream_fails_the_batch_without_blocking_the_wal(
        spark, cql, cassandra_node, people, tmp_path, option, column, bad, needle):
    """Cassandra refuses such a row only when it is written: staged and sealed, it would fail
    every flush and block the WAL for good. It must fail its task instead, naming column and
    row, with nothing of its batch staged, while the earlier batch is written in full."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    good = 1_700_000_000_000_000 if option == "writetime" else 3600
    write_json_files(src, [[{"id": 1, "name": "ada", "age": 36, column: good},
                            {"id": 2, "name": "alan", "age": 41, column: good}]])
    stream = (spark.readStream.schema(f"{SCHEMA}, {column} BIGINT")
              .option("maxFilesPerTrigger", 1).json(str(src)))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, people, "people", cp, **{option: column}))
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        wait_all_flushed(cp, at_least=0)
        write_json_files(src, [[{"id": 3, "name": "grace", "age": 85, column: good},
                                {"id": 4, "name": "bad", "age": 0, column: bad}]], first_index=1)
        with pytest.raises(Exception) as info:
            query.awaitTermination(180)
    line = sink_error_line(info.value)
    assert line.startswith(f"recovery.cql.errors.InvalidValueError: column '{column}': {needle}"), line
    assert "row 1 of 2" in line, line
    wal = stream_wal(cp)
    assert not os.path.exists(cp / "commits" / "1")
    segments, seals = wal_files(wal)
    assert [s for s in segments if s.startswith("1/")] == [], segments
    assert not os.path.exists(wal.seal_path(1)), seals
    assert not os.path.exists(os.path.join(wal.root, "blocked.json"))
    assert [r["id"] for r in read_table(cql, people, "people")] == [1, 2]


def test_a_non_frozen_list_column_is_refused_before_staging_and_written_with_the_opt_in(
        spark, cql, cassandra_node, people, tmp_path):
    """Issue 30, item 1: Cassandra stores each element of a non-frozen list under a new cell
    id it picks at each write, so every write of a row appends its list again
    (CASSANDRA-11368), and the sink writes rows again on purpose (retries, replays, flush tasks
    run again). A stream or a batch write to such a column is refused before anything is
    staged, naming the column and the remedies; with ``wal.lists.atLeastOnce`` naming it, the
    stream writes."""
    create_table(cql, people, "tagged (id int PRIMARY KEY, name text, tags list<text>)")
    schema = "id INT, name STRING, tags ARRAY<STRING>"
    rows = [{"id": 1, "name": "ada", "tags": ["b", "a", "b"]},
            {"id": 2, "name": "alan", "tags": ["x"]}]
    needles = ["column 'tags'", "list<text>", "frozen<list<text>>", "set<text>",
               "wal.lists.atLeastOnce=tags"]
    _save_fails(cassandra_node, tmp_path / "job", spark.createDataFrame(
        [tuple(r.values()) for r in rows], schema), people, "tagged", "SchemaError", needles)

    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [rows])
    stream = spark.readStream.schema(schema).json(str(src))

    def start(**extra):
        return (stream.writeStream.format("cassandra_wal")
                .options(**sink_options(cassandra_node, people, "tagged", cp, **extra))
                .trigger(availableNow=True).start())

    with running(start()) as query:
        with pytest.raises(Exception) as info:
            query.awaitTermination(180)
    line = sink_error_line(info.value)
    assert line.startswith("recovery.cql.errors.SchemaError: column 'tags'"), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert not os.path.exists(cp / "commits" / "0")
    _assert_nothing_staged(stream_wal(cp))
    assert read_table(cql, people, "tagged") == []

    with running(start(**{"wal.lists.atLeastOnce": "tags"})) as query:
        assert query.awaitTermination(180) and query.exception() is None
    wait_all_flushed(cp, at_least=0)
    assert read_table(cql, people, "tagged") == [
        {"id": 1, "name": "ada", "tags": ["b", "a", "b"]},
        {"id": 2, "name": "alan", "tags": ["x"]}]
