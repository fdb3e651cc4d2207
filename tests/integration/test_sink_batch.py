"""End to end: a batch ``df.write.format("cassandra_wal").save()`` -> Cassandra."""

from __future__ import annotations

import os
import threading
import time

import pytest

from sinkutil import (assert_rows_equal, create_table, read_table, register, rows_by_key,
                      sink_options, error_text)
from wal.batch_jobs import TableTimestamps

pytestmark = pytest.mark.integration

SCHEMA = "id INT, name STRING, score DOUBLE, tags ARRAY<STRING>"
# tags is frozen<list<text>>: a non-frozen list is refused without wal.lists.atLeastOnce
# (tests/integration/test_sink_validation.py, tests/unit/test_lists.py).


def _rows(ids, name_prefix):
    return [(i, f"{name_prefix}-{i}", i * 1.25, [name_prefix, str(i)]) for i in ids]


def _expected(rows):
    return {r[0]: {"id": r[0], "name": r[1], "score": r[2], "tags": r[3]} for r in rows}


def test_batch_save_writes_exactly_the_rows_then_upserts(spark, cassandra_node, cql, keyspace,
                                                         tmp_path):
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags frozen<list<text>>)")
    root = tmp_path / "wal"
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": str(root)})

    first = _rows(range(0, 40), "first")
    spark.createDataFrame(first, SCHEMA).repartition(3).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()
    # save() returns after the job's commit flushed: no waiting.
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "items"), "id"), _expected(first),
                      "after the first save")

    # Overlapping keys 30..59: 30..39 are replaced, 40..59 added, 0..29 untouched.
    second = _rows(range(30, 60), "second")
    spark.createDataFrame(second, SCHEMA).repartition(2).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()
    expected = _expected(first[:30])
    expected.update(_expected(second))
    actual = rows_by_key(read_table(cql, keyspace, "items"), "id")
    assert len(actual) == 60
    assert_rows_equal(actual, expected, "after the second save")

    # Each job went through a WAL of its own, removed once its rows were written: nothing is
    # left that a later job could misread. The table's last timestamp (last_ts) stays.
    assert os.listdir(root / "jobs") == []
    assert not (root / "WAL_FORMAT").exists()
    stamps = {r.id: r.ts for r in cql.execute(
        f"SELECT id, writetime(name) AS ts FROM {keyspace}.items")}
    # The second job's timestamps are above the first's: it wins the overlapping keys.
    assert min(stamps[i] for i in range(30, 60)) > max(stamps[i] for i in range(0, 30))
    assert TableTimestamps(str(root)).read() == max(stamps.values())


def test_batch_overwrite_mode_is_refused(spark, cassandra_node, cql, keyspace, tmp_path):
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags frozen<list<text>>)")
    cql.execute(f"INSERT INTO {keyspace}.items (id, name) VALUES (1, 'kept')")
    root = tmp_path / "wal"
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": str(root)})
    with pytest.raises(Exception) as info:
        spark.createDataFrame(_rows([2], "x"), SCHEMA).write.format("cassandra_wal") \
            .mode("overwrite").options(**opts).save()
    text = error_text(info.value)
    assert "mode" in text and "overwrite" in text and "append" in text, text
    assert [r["id"] for r in read_table(cql, keyspace, "items")] == [1]
    assert not root.exists()    # refused before anything was staged


def _save_in_thread(spark, rows, opts, partitions: int, errors: dict, key) -> None:
    """A ``df.write`` from its own thread, as concurrent jobs of one application run.

    PySpark looks a Python data source up in the JVM thread's active session, which a new
    thread does not have (``DATA_SOURCE_NOT_FOUND``): set it first."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    try:
        spark.createDataFrame(rows, SCHEMA).repartition(partitions).write \
            .format("cassandra_wal").mode("append").options(**opts).save()
    except Exception as exc:  # noqa: BLE001 - reported by the test thread, with every job's
        errors[key] = exc


def test_concurrent_jobs_to_one_table_each_land_every_row(spark, cassandra_node, cql, keyspace,
                                                          tmp_path):
    """Issue 17, item 2: jobs writing to one table at once share its WAL root. Each job must
    be isolated (no job deletes, discards or writes another's rows) and its save() must
    return only once its own rows are acknowledged."""
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags frozen<list<text>>)")
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": str(tmp_path / "wal")})
    jobs, rows_per_job = 3, 120
    expected: dict = {}
    for round_ in range(3):
        errors: dict = {}
        batches = {k: _rows(range((round_ * jobs + k) * rows_per_job,
                                  (round_ * jobs + k + 1) * rows_per_job), f"r{round_}j{k}")
                   for k in range(jobs)}
        threads = [threading.Thread(target=_save_in_thread,
                                    args=(spark, batches[k], opts, 2, errors, k))
                   for k in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not any(t.is_alive() for t in threads), "a job did not finish in 10 minutes"
        assert not errors, "\n\n".join(f"job {k}: {error_text(e)[:2000]}"
                                       for k, e in sorted(errors.items()))
        # Each save() returned: its rows are in Cassandra now, no waiting.
        for rows in batches.values():
            expected.update(_expected(rows))
        assert_rows_equal(rows_by_key(read_table(cql, keyspace, "items"), "id"), expected,
                          f"after round {round_}")


def _writetimes(cql, keyspace: str) -> dict:
    return {r.id: r.ts for r in cql.execute(
        f"SELECT id, writetime(name) AS ts FROM {keyspace}.items")}


def test_later_job_wins_when_its_clock_is_behind_the_earlier_jobs(spark, cassandra_node, cql,
                                                                   keyspace, tmp_path):
    """Issue 17, item 2: jobs no longer share a WAL whose chain of seals ordered their
    timestamps; the table's last timestamp must. The first job writes with timestamps an hour
    ahead of the clock (as a job on a machine whose clock is ahead, or before the clock stepped
    back: the table's last timestamp it finds, ``last_ts``, is an hour ahead); the second job's
    clock is then behind the first job's timestamps, and its rows must still win the keys both
    write."""
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags frozen<list<text>>)")
    root = tmp_path / "wal"
    root.mkdir(mode=0o700)
    ahead = time.time_ns() // 1000 + 3600 * 1_000_000
    (root / "last_ts").write_text(f"{ahead}\n")
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": str(root)})

    first = _rows(range(0, 50), "first")
    spark.createDataFrame(first, SCHEMA).repartition(2).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()
    stamps = _writetimes(cql, keyspace)
    assert min(stamps.values()) > ahead          # the first job's rows: an hour ahead
    second = _rows(range(25, 75), "second")      # its clock now is an hour behind them
    spark.createDataFrame(second, SCHEMA).repartition(2).write.format("cassandra_wal") \
        .mode("append").options(**opts).save()

    expected = _expected(first[:25])
    expected.update(_expected(second))
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "items"), "id"), expected,
                      "after the second job")
    later = _writetimes(cql, keyspace)
    assert min(later[i] for i in range(25, 75)) > max(stamps.values())


def test_a_sealed_job_left_behind_is_written_by_the_next_job(spark, cassandra_node, cql,
                                                             keyspace, tmp_path):
    """A job whose commit sealed its rows and did not write them (here ``wal.flush=false``:
    the state a job that died after its seal leaves, with its lock released) is completed by
    the next job to the table, with the options it recorded; both WALs are then removed."""
    register(spark)
    create_table(cql, keyspace, "items (id int PRIMARY KEY, name text, score double, "
                                "tags frozen<list<text>>)")
    root = tmp_path / "wal"
    opts = sink_options(cassandra_node, keyspace, "items", **{"wal.path": str(root)})
    left = _rows(range(0, 30), "left")
    spark.createDataFrame(left, SCHEMA).repartition(2).write.format("cassandra_wal") \
        .mode("append").options(**opts, **{"wal.flush": "false"}).save()
    assert read_table(cql, keyspace, "items") == []
    assert len(os.listdir(root / "jobs")) == 1

    # The next job writes with TTL 3600: the orphan must keep its own options (no TTL).
    after = _rows(range(30, 40), "after")
    spark.createDataFrame(after, SCHEMA).write.format("cassandra_wal").mode("append") \
        .options(**opts, **{"spark.cassandra.output.ttl": "3600"}).save()
    expected = _expected(left)
    expected.update(_expected(after))
    assert_rows_equal(rows_by_key(read_table(cql, keyspace, "items"), "id"), expected,
                      "after the next job")
    ttls = {r.id: r.t for r in cql.execute(f"SELECT id, ttl(name) AS t FROM {keyspace}.items")}
    assert all(ttls[i] is None for i in range(0, 30)), "the orphan was written with TTL"
    assert all(ttls[i] is not None for i in range(30, 40))
    assert os.listdir(root / "jobs") == []


def test_a_ttl_column_counts_from_the_seal_and_a_null_ttl_takes_the_tables_default(
        spark, cassandra_node, cql, keyspace, tmp_path):
    """Issue 17, item 9, on the real node: a TTL of 100 s, a null TTL (sent unset: the table's
    ``default_time_to_live`` applies; it used to be sent as 0, no expiry at all) and a TTL of 0
    (no expiry, as in CQL)."""
    register(spark)
    create_table(cql, keyspace, "expiring (id int PRIMARY KEY, name text) "
                                "WITH default_time_to_live = 5000")
    rows = [(1, "a", 100), (2, "b", None), (3, "c", 0)]
    spark.createDataFrame(rows, "id INT, name STRING, expires INT").write \
        .format("cassandra_wal").mode("append") \
        .options(**sink_options(cassandra_node, keyspace, "expiring",
                                **{"wal.path": str(tmp_path / "wal"), "ttl": "expires"})).save()
    ttls = {r.id: r.t for r in
            cql.execute(f"SELECT id, ttl(name) AS t FROM {keyspace}.expiring")}
    assert 60 < ttls[1] <= 100
    assert 4900 < ttls[2] <= 5000, "a null TTL must take the table's default"
    assert ttls[3] is None
