"""Issue 20: ``df.write.format("cassandra_wal")`` from threads other than the session's own.

PySpark 4.3 resolves a format name in the JVM (``DataSource.lookupDataSource``), and it finds
a Python data source only in the *JVM thread's active session*
(``SparkSession.getActiveSession``: an inheritable thread-local, with no fallback to the
default session). PySpark pins each Python thread to a JVM thread of its own that py4j's
gateway creates, so a thread the user starts has no active session, and the lookup fails with
``DATA_SOURCE_NOT_FOUND`` however the sink was registered. The sink cannot register around
that; the user guide ("Batch writes") gives the one-line remedy, which these tests run as it
is written there: the pool's initializer makes the session active in each thread.

What proves the lookup: a save without the ``keyspace`` option. If Spark finds the data
source, the sink's own option check refuses the write (``OptionError`` naming ``keyspace``)
before anything is staged or any connection is opened, so no Cassandra is needed; if it does
not, Spark says ``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sinkutil import error_text, register

pytestmark = [pytest.mark.integration]

THREADS = 3
FOUND = "found: the sink refused the missing keyspace"
NOT_FOUND = "DATA_SOURCE_NOT_FOUND"


def _lookup(spark) -> str:
    """Run a ``df.write.format("cassandra_wal")`` far enough to know whether Spark found the
    data source; FOUND, NOT_FOUND, or the unexpected error's text."""
    try:
        spark.range(2).write.format("cassandra_wal").mode("append") \
            .option("table", "t").save()
    except Exception as exc:  # noqa: BLE001 - sorted just below; anything else is returned
        text = error_text(exc)
    else:
        return "saved (unexpected: the keyspace option is missing)"
    if "recovery.cql.errors.OptionError: option 'keyspace'" in text:
        return FOUND
    if NOT_FOUND in text:
        return NOT_FOUND
    return text[:3000]


def _lookup_in_pool(spark, initializer=None) -> dict[int, str]:
    """``_lookup`` from each of THREADS pool threads at once; outcome by thread id."""
    barrier = threading.Barrier(THREADS)   # every task on a thread of its own, concurrently

    def task(_):
        barrier.wait(timeout=120)
        return threading.get_ident(), _lookup(spark)

    with ThreadPoolExecutor(THREADS, initializer=initializer) as pool:
        outcomes = dict(pool.map(task, range(THREADS)))
    assert len(outcomes) == THREADS, f"tasks shared threads: {outcomes}"
    return outcomes


def test_the_sessions_own_thread_finds_the_sink(spark):
    register(spark)
    assert _lookup(spark) == FOUND


def test_every_pool_thread_finds_the_sink_once_the_session_is_active_in_it(spark):
    register(spark)

    def use_session():   # the user guide's remedy, verbatim
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)

    outcomes = _lookup_in_pool(spark, initializer=use_session)
    assert all(o == FOUND for o in outcomes.values()), outcomes


def test_a_bare_pool_thread_does_not_find_the_sink(spark):
    """The reason for the remedy. If this fails because every thread found the sink, PySpark
    now looks Python data sources up from any thread: the remedy in the user guide (and in
    test_sink_batch's threads) is no longer needed, and this test can go."""
    from py4j.clientserver import ClientServer

    if not isinstance(spark.sparkContext._gateway, ClientServer):
        # PYSPARK_PIN_THREAD=false: Python threads share py4j connections, and a connection
        # (its JVM thread) may be one the session's thread made active, or may not.
        pytest.skip("PySpark runs without pinned threads here")
    register(spark)
    outcomes = _lookup_in_pool(spark)
    assert all(o == NOT_FOUND for o in outcomes.values()), outcomes
