"""The sink with executors in separate JVMs, on two hosts, losing tasks, executors and the driver.

Two runs of ``cluster_program.py`` on one checkpoint (Spark startup dominates the time on a
loaded machine, so the scenarios share runs; each test checks its own part):

**Run A**, ``local-cluster[2,1,1024]`` (two executor JVMs with their own Python workers),
``spark.task.maxFailures=4``, files 0..3:

* batch 0: ``CASSANDRA_WAL_CRASH_AT=stage.after`` (inherited by the executors) kills the Python
  worker of the first task that *completed* its segment: that attempt's segment is on disk,
  complete, and loses; the task is retried (``test_task_retry``).
* batch 1: partition 0's first attempt kills its own Python worker (``os._exit``), partition
  1's raises: both retried (``test_task_retry``).
* batch 2: partition 0's first attempt stalls mid-staging; the program SIGKILLs that task's
  executor JVM (found from the worker's pid chain, checked against ``pgrep -f
  CoarseGrainedExecutorBackend`` under the program); Spark reschedules
  (``test_executor_killed``).
* batch 3: ``flush.before_ingest`` with ``CASSANDRA_WAL_CRASH_SCOPE=group``: the driver, its JVM
  and the executors die right after ``commits/3`` is written, before batch 3 is ingested.

Then the test deletes the driver's local working copy ``WAL_DIR/log`` entirely.

**Run B**, a standalone cluster of two Workers on two loopback hosts (127.0.0.1, 127.0.0.2), with
speculation on (``spark.speculation.multiplier=1``, ``quantile=0.5``, ``minTaskRuntime=1s``):
recovery at query start rebuilds the log from seals, segments and ``flushed_through`` and
replays batch 3 (``test_durability_without_the_log``); batch 4's partition 0 first attempt
stalls, a speculative copy runs on the other host and wins (``test_speculative_execution``).
``local-cluster`` cannot exercise speculation: all its executors are on one host, and Spark
never launches a speculative copy on a host where the task already has an attempt (measured:
with the same settings no copy is ever launched).

Every row carries the partition and the task attempt that staged it (``part``, ``attempt``,
added by a ``mapInArrow`` in the query), so the table shows which attempt's segment was
flushed, and every row's write time must be its batch's ``seal.base_ts_us`` + its position.

About 3 minutes on a loaded 2-vCPU machine (every JVM runs with ``-XX:TieredStopAtLevel=1
-XX:+UseSerialGC``, which cut Spark's start-up there from 2-5 minutes to about 1). Needs Java 17
and a Cassandra node (``CASSANDRA_HOST``/``CASSANDRA_PORT``, or the session's own node);
``CASSANDRA_WAL_CLUSTER_DEADLINE`` bounds each run (default 900 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tests.helpers.cluster_chain import (TABLE_DDL, Chain, assert_restart_completed,
                                         check_batches, log_step, positions_from_log,
                                         positions_from_segments, read_rows, run_to_end,
                                         run_until_crash, seals_of, write_pending)
from tests.helpers.node import fresh_keyspace
from wal import catalog
from wal.catalog import RecoveryAction
from wal import checkpoint as ckpt
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy

pytestmark = pytest.mark.integration

RETRY_BATCHES = (0, 1)
KILL_BATCH = 2
CRASH_BATCH = 3
SPEC_BATCH = 4


@pytest.fixture(scope="module")
def cluster_keyspace(cql):
    with fresh_keyspace(cql, "mx") as name:
        yield name


@pytest.fixture(scope="module")
def chain(cassandra_node, cql, cluster_keyspace, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster")
    c = Chain(workdir, cluster_keyspace, "events", str(workdir / "checkpoint"),
              node=cassandra_node, cql=cql)
    write_pending(c, range(SPEC_BATCH + 1))
    cql.execute(TABLE_DDL.format(ks=c.keyspace, table=c.table))
    yield c


@pytest.fixture(scope="module")
def run_a(chain):
    """local-cluster: retries, a killed executor, then the driver dies after commits/3."""
    once_stage = chain.workdir / "once-stage-after"
    once_flush = chain.workdir / "once-flush"
    faults = {"1/0/0": "exit", "1/1/0": "raise", f"{KILL_BATCH}/0/0": "slow:600"}
    # The crash takes the driver's group; the executors' Python daemons are not in it.
    run = run_until_crash(chain, "local-cluster", [
        "--master", "local-cluster[2,1,1024]",
        "--host", chain.node.host, "--port", str(chain.node.port),
        "--release", ",".join(str(b) for b in range(CRASH_BATCH + 1)),
        "--faults", json.dumps(faults),
        "--kill-executor-at-batch", str(KILL_BATCH),
        "--crash-flush-at-batch", str(CRASH_BATCH), "--crash-once", str(once_flush)],
        {"CASSANDRA_WAL_CRASH_AT": "stage.after", "CASSANDRA_WAL_CRASH_ONCE": str(once_stage)},
        once_flush)
    assert run.crashed, (f"run A never reached flush.before_ingest of batch {CRASH_BATCH} "
                         f"(rc {run.returncode}):\n{run.tail()}")
    wal = chain.wal()
    chain.seals_a = seals_of(wal)
    chain.positions = positions_from_log(wal)
    chain.positions[CRASH_BATCH] = positions_from_segments(wal, chain.seals_a[CRASH_BATCH])
    chain.rows_a = read_rows(chain.cql, chain)
    return chain


@pytest.fixture(scope="module")
def run_b(run_a):
    """Delete WAL_DIR/log, restart on a two-host standalone cluster with speculation."""
    chain = run_a
    wal = chain.wal()
    assert os.path.isdir(wal.log)
    shutil.rmtree(wal.log)
    run = run_to_end(chain, "standalone", [
        "--master", "standalone:2", "--speculation",
        "--host", chain.node.host, "--port", str(chain.node.port),
        "--release", str(SPEC_BATCH),
        "--faults", json.dumps({f"{SPEC_BATCH}/0/0": "slow:600"})], {})
    assert run.returncode == 0, f"run B failed (rc {run.returncode}):\n{run.tail()}"
    chain.seals_b = seals_of(wal)
    chain.positions.update({b: ids for b, ids in positions_from_log(wal).items()
                            if b not in chain.positions})
    chain.rows_b = read_rows(chain.cql, chain)
    return chain


# -- checks ------------------------------------------------------------------------------------
def test_task_retry(run_a):
    """A failed first attempt is retried; the losing attempt's segment is never flushed."""
    chain = run_a
    seal0, seal1 = chain.seals_a[0], chain.seals_a[1]
    # Batch 0: one task's worker was killed right after its segment was complete.
    assert (chain.workdir / "once-stage-after").exists(), "the stage.after crash never fired"
    retried = [s for s in seal0.segments if s.attempt > 0]
    assert len(retried) == 1, f"batch 0: expected one retried partition, seal {seal0.segments}"
    p = retried[0].partition
    losing = [n for n in chain.segments_seen(0)
              if n.startswith(f"{p:05d}-000-") and n.endswith(".seg")]
    assert losing, (f"batch 0: the killed attempt's complete segment was never seen; "
                    f"seen {chain.segments_seen(0)}")
    sealed = {s.name.split("/", 1)[1] for s in seal0.segments}
    assert not sealed & set(losing), f"batch 0: a losing segment was sealed: {losing}"
    # Batch 1: partition 0's worker exited, partition 1 raised; both retried.
    assert {s.partition: s.attempt for s in seal1.segments} == {0: 1, 1: 1}, seal1.segments
    assert "injected failure: batch 1 partition 1 attempt 0" in chain.runs[0].text()
    problems = check_batches(chain, chain.rows_a, chain.seals_a, RETRY_BATCHES)
    assert not problems, "\n".join(problems)
    # Flushed batches leave no segment behind, the losing one included.
    assert not os.path.exists(chain.wal().batch_segments(0))


def test_executor_killed(run_a):
    """An executor JVM SIGKILLed mid-batch: Spark reschedules, the batch lands exactly once."""
    chain = run_a
    killed = chain.events("executor_killed")
    assert len(killed) == 1, f"executor kills: {killed} (log:\n{chain.runs[0].tail()})"
    k = killed[0]
    assert (k["batch"], k["partition"], k["attempt"]) == (KILL_BATCH, 0, 0)
    assert k["pid"] in k["executors_before"] and len(k["executors_before"]) == 2
    assert re.search(r"Lost executor \S+ on \S+: Command exited with code 137",
                     chain.runs[0].text()), "Spark never noticed the lost executor"
    seal = chain.seals_a[KILL_BATCH]
    assert {s.partition: s.attempt for s in seal.segments}[0] >= 1, seal.segments
    # The dead attempt got as far as staging (usually a .tmp; its Python worker may also see
    # an ordinary end of input when the JVM dies and complete the file): never sealed.
    seen = chain.segments_seen(KILL_BATCH)
    log_step(f"batch {KILL_BATCH}: segments seen {seen}")
    dead = [n for n in seen if n.startswith("00000-000-")]
    assert dead, f"the killed attempt staged nothing: {seen}"
    assert not {n for n in dead if n.endswith(".seg")} & {
        s.name.split("/", 1)[1] for s in seal.segments}
    problems = check_batches(chain, chain.rows_a, chain.seals_a, [KILL_BATCH])
    assert not problems, "\n".join(problems)
    # The query went on after the kill: the next batch was staged, sealed and committed.
    assert ckpt.is_committed(chain.checkpoint, CRASH_BATCH)


def test_durability_without_the_log(run_b):
    """Sealed, committed, not ingested, driver dead, WAL_DIR/log deleted: after the restart
    nothing is lost and nothing is rewritten with new timestamps."""
    chain = run_b
    # Before the restart: batch 3 was committed and sealed, none of its rows visible.
    assert ckpt.is_committed(chain.checkpoint, CRASH_BATCH)
    assert not [i for i, r in chain.rows_a.items() if r[0] == CRASH_BATCH], \
        "rows of the crashed batch were visible before the restart"
    # The seal survived and was not replaced: same id, same timestamps. Batches flushed
    # before the crash were not written again (same cells, same write times). Seals of those
    # batches were kept by retention while the old log knew them; the rebuilt log does not,
    # and retention removes them as redundant (only the newest flushed seal matters for the
    # timestamp chain): they are compared with the seals read before.
    assert_restart_completed(chain, CRASH_BATCH, SPEC_BATCH)
    # The rebuilt log knows batch 3 as flushed; the WAL has nothing pending or left over.
    wal = chain.wal()
    reader = WalLog.open_reader(wal)
    try:
        assert reader.get(CRASH_BATCH).state.value == "flushed"
        views = catalog.describe(wal, reader, chain.checkpoint, RecoveryPolicy.QUERY_START)
    finally:
        reader.close()
    assert all(v.action == RecoveryAction.NOTHING for v in views), [v.to_dict() for v in views]
    assert wal.staged_batch_ids() == []
    assert not os.path.exists(os.path.join(wal.root, "blocked.json"))


def test_speculative_execution(run_b):
    """A slow task gets a speculative copy on the other host; exactly the winner is flushed."""
    chain = run_b
    log = chain.runs[1].text()
    slow = [e for e in chain.events("slow_task") if e["batch"] == SPEC_BATCH]
    assert [(e["partition"], e["attempt"]) for e in slow] == [(0, 0)], slow
    assert re.search(r"Marking task 0 in stage \S+ \(on \S+\) as speculatable", log), \
        f"Spark never marked the slow task speculatable:\n{chain.runs[1].tail()}"
    won = re.search(r"Killing attempt 0 for task 0\.0 in stage \S+ \(TID \d+\) on (\S+) "
                    r"as the attempt 1 succeeded on (\S+)", log)
    assert won, f"the speculative copy did not win:\n{chain.runs[1].tail()}"
    assert won.group(1) != won.group(2)
    seal = chain.seals_b[SPEC_BATCH]
    assert {s.partition: s.attempt for s in seal.segments} == {0: 1, 1: 0}, seal.segments
    # Both attempts of partition 0 staged segments in the WAL for this batch. The loser's file
    # may even be complete: when Spark kills a task, the sink's Python writer sees an ordinary
    # end of its input and finishes a segment holding a prefix of the partition. Only the
    # seal, built from the winning attempts' commit messages, decides what is flushed.
    seen = chain.segments_seen(SPEC_BATCH)
    log_step(f"batch {SPEC_BATCH}: segments seen (name: rows) {chain.segment_rows(SPEC_BATCH)}")
    assert [n for n in seen if n.startswith("00000-001-") and n.endswith(".seg")], seen
    assert [n for n in seen if n.startswith("00000-000-")], seen
    winner_rows = next(s.rows for s in seal.segments if s.partition == 0)
    loser_complete = {n: r for n, r in chain.segment_rows(SPEC_BATCH).items()
                      if n.startswith("00000-000-") and n.endswith(".seg") and r is not None}
    assert all(r < winner_rows for r in loser_complete.values()), (loser_complete, winner_rows)
    problems = check_batches(chain, chain.rows_b, chain.seals_b, [SPEC_BATCH])
    assert not problems, "\n".join(problems)


def test_commit_refuses_segments_the_driver_cannot_see(tmp_path):
    """The commit runs on the driver host and seals only segments it sees there, complete:
    with a WAL path that is not shared, a segment sits on an executor's local disk where no
    flush or recovery could ever read it, so the batch fails before Spark commits it (and is
    re-run) instead of being sealed. Needs neither Spark nor Cassandra."""
    from dataclasses import replace

    import pyarrow as pa

    from recovery.cql.errors import SinkError
    from sinks.worker.plan import check_segments_visible
    from wal.segment import SegmentWriter

    wal = WalDir(str(tmp_path / "wal")).create()
    writer = SegmentWriter(wal, 7, 0, 0, {"columns": ["id"]})
    writer.append(pa.record_batch({"id": pa.array([1, 2, 3], pa.int32())}))
    here = writer.finish()
    check_segments_visible(wal, [here], 7)
    on_another_host = replace(here, name=here.name.replace("/00000-000-", "/00001-000-"),
                              partition=1)
    with pytest.raises(SinkError, match=r"batch 7: 1 of 2 staged segments are not visible"):
        check_segments_visible(wal, [here, on_another_host], 7, wait_s=0.3)
    with pytest.raises(SinkError, match="not visible"):
        check_segments_visible(wal, [replace(here, bytes=here.bytes + 10)], 7, wait_s=0.3)
