"""End to end: Spark Structured Streaming -> cassandra_wal -> Cassandra.

Input is deterministic: JSON files written into a source folder (atomically, increasing
mtimes) and read with ``maxFilesPerTrigger=1``, so input file k is micro-batch k.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import pytest
from pyspark.sql import functions as F

import sinks
from sinkutil import (assert_rows_equal, batch_of_write_times, committed_batches, create_table,
                      log_rows_by_batch,
                      read_table, register, rows_by_key, running, sink_options, stream_wal,
                      wait_all_flushed, wait_for, wait_query_done, write_json_files,
                      connection_options)

pytestmark = pytest.mark.integration

EVENT_SCHEMA = "id INT, tag INT, name STRING, score DOUBLE"


def _events(file_index: int, n: int = 5) -> list[dict]:
    return [{"id": file_index * 10 + i, "tag": file_index, "name": f"e{file_index}-{i}",
             "score": file_index + i / 4} for i in range(n)]


def _expected_events(files: list[list[dict]]) -> dict:
    """Upsert semantics: a later file's row for the same key replaces the earlier one."""
    out = {}
    for rows in files:
        for r in rows:
            out[r["id"]] = dict(r)
    return out


@pytest.mark.parametrize("flush_mode", ["driver", "processes"])
def test_append_stream_writes_exactly_the_input(spark, cassandra_node, cql, keyspace, tmp_path,
                                                flush_mode, caplog, monkeypatch):
    """Both driver-side flush modes: the flusher's thread, and worker processes of the driver.
    The listener hears of each batch by its ids alone: PySpark's conversion of the whole
    progress event (about 30 ms of the driver's CPU a batch) is never made."""
    from pyspark.sql.streaming.listener import QueryProgressEvent

    from sinks.driver.listener import CassandraWalListener

    converted, heard = [], []
    convert, progressed = QueryProgressEvent.fromJObject, CassandraWalListener.progressed
    monkeypatch.setattr(QueryProgressEvent, "fromJObject", classmethod(
        lambda cls, jevent: converted.append(1) or convert.__func__(cls, jevent)))
    monkeypatch.setattr(CassandraWalListener, "progressed",
                        lambda self, q, r: heard.append(str(q)) or progressed(self, q, r))
    caplog.set_level(logging.INFO, logger="recovery.executors")
    register(spark)
    create_table(cql, keyspace, "events (id int PRIMARY KEY, tag int, name text, score double)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [_events(k) for k in range(4)]
    # A later batch re-delivers two keys of batch 0: the later batch's values must win.
    files[3] += [{"id": 0, "tag": 3, "name": "replaced", "score": -1.5},
                 {"id": 4, "tag": 3, "name": "replaced too", "score": 1e300}]
    write_json_files(src, files[:2])

    stream = (spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(src)))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "events", cp))
             .option("wal.flush.mode", flush_mode)
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        # Add input while the query runs: after the first batch is committed.
        wait_for(lambda: committed_batches(cp), what="batch 0 to be committed")
        write_json_files(src, files[2:], first_index=2)
        last = wait_all_flushed(cp, at_least=3)
        assert query.exception() is None
    assert last == 3, f"4 input files, maxFilesPerTrigger=1: expected batches 0..3, got ..{last}"
    assert heard.count(str(query.id)) >= 4 and converted == []

    actual = rows_by_key(read_table(cql, keyspace, "events"), "id")
    expected = _expected_events(files)
    assert len(actual) == len(expected) == 20
    assert_rows_equal(actual, expected, "events")
    by_workers = [r.getMessage() for r in caplog.records
                  if "written by flush worker processes" in r.getMessage()]
    assert len(by_workers) == (4 if flush_mode == "processes" else 0), by_workers
    # Each micro-batch holds exactly one input file's rows. The driver's flusher closes the log
    # on onQueryTerminated, which Spark delivers asynchronously after stop(): read it once the
    # reader sees all four batches (or fail after the timeout).
    if flush_mode == "driver":       # the log keeps the flushed rows it wrote
        by_batch = wait_for(lambda: (lambda b: b if sorted(b) == [0, 1, 2, 3] else None)(
            log_rows_by_batch(stream_wal(cp), ["id", "tag"])),
            what="the log to show batches 0..3")
        assert sorted(by_batch) == [0, 1, 2, 3]
        for batch, rows in by_batch.items():
            assert sorted(rows) == sorted((r["id"], r["tag"]) for r in files[batch]), batch
    else:   # the workers read the segments, and the log copies no row: each row's write
        # time lies within the sealed timestamps of the batch of the file it last came in
        last_file = {r["id"]: batch for batch, rows in enumerate(files) for r in rows}
        write_times = {r["id"]: r["wt"] for r in read_table(cql, keyspace, "events",
                                                            "id, writetime(name) AS wt")}
        batches = wait_for(lambda: (lambda b: b if None not in b.values() else None)(
            batch_of_write_times(stream_wal(cp), write_times)),
            what="the log to show batches 0..3")
        assert batches == last_file


def test_complete_mode_aggregation_equals_final_aggregate(spark, cassandra_node, cql, keyspace,
                                                          tmp_path):
    register(spark)
    create_table(cql, keyspace, "totals (k text PRIMARY KEY, n bigint, total bigint)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [
        [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "only-in-batch-0", "v": 7}],
        [{"k": "a", "v": 10}, {"k": "c", "v": -3}],
        [{"k": "b", "v": 5}, {"k": "c", "v": 3}, {"k": "a", "v": 100}, {"k": "d", "v": 0}],
    ]
    write_json_files(src, files)
    agg = (spark.readStream.schema("k STRING, v INT").option("maxFilesPerTrigger", 1)
           .json(str(src)).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total")))
    query = (agg.writeStream.format("cassandra_wal").outputMode("complete")
             .options(**sink_options(cassandra_node, keyspace, "totals", cp))
             .trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp) == 2

    expected = defaultdict(lambda: {"n": 0, "total": 0})
    for rows in files:
        for r in rows:
            expected[r["k"]]["n"] += 1
            expected[r["k"]]["total"] += r["v"]
    expected = {k: {"k": k, **v} for k, v in expected.items()}
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "totals"), "k"), expected, "totals")


def test_foreach_batch_update_mode_aggregation(spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, "totals (k text PRIMARY KEY, n bigint, total bigint)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = [
        [{"k": "x", "v": 1}, {"k": "y", "v": 2}],
        [{"k": "x", "v": 4}, {"k": "z", "v": 8}],
        [{"k": "y", "v": -16}, {"k": "x", "v": 32}, {"k": "w", "v": 64}],
    ]
    write_json_files(src, files)
    agg = (spark.readStream.schema("k STRING, v INT").option("maxFilesPerTrigger", 1)
           .json(str(src)).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total")))
    writer = sinks.CassandraWalWriter(keyspace, "totals", str(cp),
                                      options=connection_options(cassandra_node))
    query = (agg.writeStream.outputMode("update").foreachBatch(writer)
             .option("checkpointLocation", str(cp)).trigger(availableNow=True).start())
    with running(query):
        wait_query_done(spark, query)
    assert wait_all_flushed(cp) == 2

    # Update mode wrote only the changed groups each batch: batch 2 did not touch z. A reader
    # beside the flusher's live log may see it a moment late (a fresh clone's suite saw no
    # batch 2 once, its flusher having logged "batch 2 written"): read it as the append test
    # does, once it shows every batch.
    by_batch = wait_for(lambda: (lambda b: b if 2 in b else None)(
        log_rows_by_batch(stream_wal(cp), ["k", "n", "total"])),
        what="the log to show batches 0..2")
    assert sorted(by_batch[2]) == [("w", 1, 64), ("x", 3, 37), ("y", 2, -14)]
    expected = {"x": (3, 37), "y": (2, -14), "z": (1, 8), "w": (1, 64)}
    expected = {k: {"k": k, "n": n, "total": t} for k, (n, t) in expected.items()}
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "totals"), "k"), expected, "totals")


def test_no_row_is_visible_before_its_batch_is_committed(spark, cassandra_node, cql, keyspace,
                                                         tmp_path):
    """Sample Cassandra, *then* list ``commits/``: a row seen at time t was written by the
    flusher after ``commits/N`` of its batch appeared (before t), so the listing taken after
    t must contain N. A sink that wrote in ``commit()`` (before Spark's ``commits/N``) or in
    the tasks would show rows of a batch that the listing does not yet hold."""
    register(spark)
    create_table(cql, keyspace, "seen (id int PRIMARY KEY, tag int)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    n_files, per_file = 5, 4
    files = [[{"id": k * 100 + i, "tag": k} for i in range(per_file)] for k in range(n_files)]
    write_json_files(src, files)
    stream = spark.readStream.schema("id INT, tag INT").option("maxFilesPerTrigger", 1).json(str(src))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "seen", cp,
                                     **{"wal.retention.batches": "100"}))
             .trigger(processingTime="1 second").start())
    samples: list[tuple[float, set[int], set[int]]] = []
    total = n_files * per_file
    with running(query):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            visible = {r.id for r in cql.execute(f"SELECT id FROM {keyspace}.seen")}
            committed = set(committed_batches(cp))          # listed after the read
            samples.append((time.monotonic(), visible, committed))
            if len(visible) == total and len(committed) >= n_files:
                break
            assert query.exception() is None, query.exception()
            time.sleep(0.05)
        else:
            pytest.fail(f"the stream did not land {total} rows in time; last sample "
                        f"{len(samples[-1][1])} rows, commits {sorted(samples[-1][2])}")
        wait_all_flushed(cp, at_least=n_files - 1)

    # Which batch each row was in, as the WAL sealed it (not assumed from the file order).
    # The stopped query's flusher closes the log asynchronously (onQueryTerminated): read it
    # once a reader beside it sees every row (or fail after the timeout), as the append test
    # does.
    by_batch = wait_for(lambda: (lambda b: b if sum(map(len, b.values())) == total else None)(
        log_rows_by_batch(stream_wal(cp), ["id", "tag"])), what=f"the log to show {total} rows")
    batch_of = {}
    for batch, rows in by_batch.items():
        tags = {tag for _, tag in rows}
        assert len(tags) == 1, f"batch {batch} mixes input files {tags}"
        batch_of.update({row_id: batch for row_id, _ in rows})
    assert len(batch_of) == total and len(set(batch_of.values())) == n_files

    partial = 0
    for at, visible, committed in samples:
        early = sorted(i for i in visible if batch_of[i] not in committed)
        assert not early, (f"rows {early} (batches {sorted({batch_of[i] for i in early})}) "
                           f"were in Cassandra before commits/N existed (commits: "
                           f"{sorted(committed)})")
        if 0 < len(visible) < total:
            partial += 1
        # The flusher writes whole batches in order: what is visible is a prefix of batches,
        # plus possibly part of the next one.
        seen_batches = sorted({batch_of[i] for i in visible})
        assert seen_batches == list(range(len(seen_batches))), seen_batches
    assert len(samples) >= 10, f"only {len(samples)} samples"
    assert partial >= 2, f"only {partial} samples saw the stream mid-way; the test proved little"


def test_a_new_querys_flusher_connects_while_its_first_batch_stages(spark, cassandra_node, cql,
                                                                    keyspace, tmp_path):
    """Issue 22: a new query's flusher, its session and its prepared statement used to be made
    at the first progress event, after Spark committed the first batch, so that batch paid for
    them (2-5x a later one). The first batch's planning names the WAL (the pointer file); the
    registry finds it and connects while the batch's tasks are still staging (slowed here to
    about 4 s), so the session is there before ``commits/0``, and the batch needs no other."""
    registry = register(spark)
    create_table(cql, keyspace, "first (id int PRIMARY KEY, tag int, name text, score double)")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [_events(0), _events(1)])

    @F.udf("double")
    def slow(score):
        time.sleep(0.8)
        return score

    stream = (spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1)
              .json(str(src)).withColumn("score", slow("score")))
    query = (stream.writeStream.format("cassandra_wal")
             .options(**sink_options(cassandra_node, keyspace, "first", cp))
             .trigger(processingTime="500 milliseconds").start())
    with running(query):
        run_id = str(query.runId)

        def connected():
            flusher = next(iter(registry.flushers_of(run_id)), None)
            if flusher is None or flusher.output._session is None:
                return None
            return flusher, committed_batches(cp)

        flusher, committed_then = wait_for(connected, interval=0.05,
                                           what="the first batch's flusher and its session")
        assert committed_then == [], (
            f"the flusher connected only after Spark committed {committed_then}")
        wait_all_flushed(cp, at_least=1)
        assert registry.flushers_of(run_id) == [flusher]
        # The statement prepared before the first batch is the one its seal asked for.
        assert len(flusher.output._upserters) == 1
    actual = rows_by_key(read_table(cql, keyspace, "first"), "id")
    assert_rows_equal(actual, _expected_events([_events(0), _events(1)]), "first")


class _CountingSession:
    """A classic session that counts the local tables a flush job makes."""

    def __init__(self, spark):
        self._spark, self.tables = spark, 0

    def __getattr__(self, name):
        return getattr(self._spark, name)

    def createDataFrame(self, *args):
        self.tables += 1
        return self._spark.createDataFrame(*args)


def test_a_flush_job_carries_its_tasks_unless_they_would_make_its_closure_too_large(
        spark, monkeypatch):
    """Issue 34: the flush job of ``executors`` mode is a range of one row a task whose
    closure carries the pickled tasks (no exchange: ~0.6 CPU-s less of the driver's JVM a job
    than a broadcast join, bench/bench_flush_executors.py); a task list that would make the
    closure larger than CLOSURE_LIMIT is a broadcast table joined to the range instead. Both
    hand every task to exactly one Spark task."""
    import sinks.driver.spark_jobs as spark_jobs

    tasks = [("segment", i, "x" * 50) for i in range(5)]
    carried = _CountingSession(spark)
    assert sorted(spark_jobs.SparkJobs(carried)(0, tasks, list)) == tasks   # fn: list(tasks)
    assert carried.tables == 0
    monkeypatch.setattr(spark_jobs, "CLOSURE_LIMIT", 100)
    joined = _CountingSession(spark)
    assert sorted(spark_jobs.SparkJobs(joined)(1, tasks, list)) == tasks
    assert joined.tables == 1
