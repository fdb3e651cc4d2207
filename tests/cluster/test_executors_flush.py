"""``wal.flush.mode=executors`` with executors in separate JVMs (``local-cluster[2,1,1024]``).

Two runs of ``cluster_program.py --flush-mode executors`` on one checkpoint, files of 200 rows,
two tasks (so two segments) per batch:

**Run 1**: batches 0 and 1 are flushed by Spark jobs of one task per segment
(``test_executors_mode_writes_the_sealed_rows``). Before file 2 is released the program arms
``flush.task_written`` (scope group): the flusher hands it to its tasks, and the first task of
batch 2 whose segment Cassandra acknowledged kills its Python worker's process group; the
test then SIGKILLs every process of the run. The driver dies in the middle of the flush: rows of
batch 2 are in Cassandra, the batch is not marked.

**Run 2**: the restart's recovery at query start only discards (nothing here); the flusher's
first drain finishes batch 2 through a Spark job, from its recorded progress, at the sealed
timestamps, and batch 3 is flushed by the executors too
(``test_driver_killed_mid_flush_is_completed_exactly_once``).

Every row's write time must be its batch's ``seal.base_ts_us`` + its position in the batch.
About 3-4 minutes on a loaded 2-vCPU machine. Needs Java 17 and a Cassandra node
(``CASSANDRA_HOST``/``CASSANDRA_PORT``, or the session's own node).
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.node import fresh_keyspace
from wal.log import WalLog
from wal.states import BatchState

from tests.helpers.cluster_chain import (TABLE_DDL, Chain, assert_restart_completed,
                                         check_batches, positions_from_log,
                                         positions_from_segments, read_rows,
                                         run_to_end, run_until_crash, seals_of, write_pending)

pytestmark = pytest.mark.integration

ROWS_PER_FILE = 200
FLUSHED_BEFORE = (0, 1)
CRASH_BATCH = 2
AFTER_BATCH = 3
LOCAL_CLUSTER = "local-cluster[2,1,1024]"


def written_by_executors(text: str, batch: int) -> re.Match | None:
    """The flusher's line for a batch its Spark tasks wrote (recovery/executors.py)."""
    return re.search(rf"batch {batch}: (\d+) segment\(s\), (\d+) rows written by executor "
                     r"tasks", text)


@pytest.fixture(scope="module")
def xchain(cassandra_node, cql, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("executors-flush")
    with fresh_keyspace(cql, "xf") as keyspace:
        c = Chain(workdir, keyspace, "events", str(workdir / "checkpoint"), node=cassandra_node,
                  cql=cql)
        write_pending(c, range(AFTER_BATCH + 1), ROWS_PER_FILE)
        cql.execute(TABLE_DDL.format(ks=c.keyspace, table=c.table))
        yield c


@pytest.fixture(scope="module")
def run_crash(xchain):
    """Batches 0, 1 flushed by the executors; the run dies in the middle of batch 2's flush."""
    chain = xchain
    once = chain.workdir / "once-task-written"
    # The crash point takes one executor's Python workers; the driver is killed right after.
    run = run_until_crash(chain, "executors-crash", [
        "--master", LOCAL_CLUSTER, "--flush-mode", "executors",
        "--host", chain.node.host, "--port", str(chain.node.port),
        "--release", ",".join(str(b) for b in range(CRASH_BATCH + 1)),
        "--crash-flush-at-batch", str(CRASH_BATCH),
        "--crash-flush-point", "flush.task_written", "--crash-once", str(once)], {}, once)
    assert run.crashed, (f"run 1 never reached flush.task_written in batch {CRASH_BATCH} "
                         f"(rc {run.returncode}):\n{run.tail()}")
    wal = chain.wal()
    chain.seals_a = seals_of(wal)
    chain.positions = positions_from_log(wal)      # none: the tasks read the segments
    # batch 2 was not flushed: its segments are there (its rows were never in the log)
    chain.positions[CRASH_BATCH] = positions_from_segments(wal, chain.seals_a[CRASH_BATCH])
    chain.rows_a = read_rows(chain.cql, chain)
    reader = WalLog.open_reader(wal)
    try:
        chain.state_at_crash = reader.get(CRASH_BATCH).state
    finally:
        reader.close()
    return chain


@pytest.fixture(scope="module")
def run_restart(run_crash):
    """Restart on the same checkpoint: the executors complete batch 2, then flush 3."""
    chain = run_crash
    run = run_to_end(chain, "executors-restart", [
        "--master", LOCAL_CLUSTER, "--flush-mode", "executors",
        "--host", chain.node.host, "--port", str(chain.node.port),
        "--release", str(AFTER_BATCH)], {})
    assert run.returncode == 0, f"run 2 failed (rc {run.returncode}):\n{run.tail()}"
    wal = chain.wal()
    chain.seals_b = seals_of(wal)
    chain.positions.update({b: ids for b, ids in positions_from_log(wal).items()
                            if b not in chain.positions})
    chain.rows_b = read_rows(chain.cql, chain)
    return chain


def test_executors_mode_writes_the_sealed_rows(run_crash):
    """Batches 0 and 1: written by one Spark task per segment, exactly the expected rows,
    each at its seal's base timestamp + its position in the batch."""
    chain = run_crash
    log = chain.runs[0].text()
    for batch in FLUSHED_BEFORE:
        line = written_by_executors(log, batch)
        assert line, f"batch {batch} was not written by executor tasks:\n{chain.runs[0].tail()}"
        assert (int(line.group(1)), int(line.group(2))) == \
            (len(chain.seals_a[batch].segments), ROWS_PER_FILE)
        assert len(chain.seals_a[batch].segments) == 2, chain.seals_a[batch].segments
    problems = check_batches(chain, chain.rows_a, chain.seals_a, FLUSHED_BEFORE)
    assert not problems, "\n".join(problems)


def test_driver_killed_mid_flush_is_completed_exactly_once(run_restart):
    """Killed while batch 2's tasks were writing: some of its rows were visible and it was
    not marked; the restart's recovery finishes it, nothing is written twice with other
    timestamps, and batch 3 is flushed by the executors again."""
    chain = run_restart
    # At the crash: a task had its segment acknowledged, the batch was not marked.
    assert chain.state_at_crash is not BatchState.FLUSHED, chain.state_at_crash
    visible = {i for i, r in chain.rows_a.items() if r[0] == CRASH_BATCH}
    assert visible, "no row of the crashed batch was visible: the crash was not mid-flush"
    assert not written_by_executors(chain.runs[0].text(), CRASH_BATCH)
    # The restart's backlog (batch 2) and batch 3: both written by Spark tasks, in order.
    restart = chain.runs[1].text()
    assert re.search(rf"flushed batch {CRASH_BATCH}: {ROWS_PER_FILE} rows", restart), \
        chain.runs[1].tail()
    assert "left batches 2 and after to the flusher" in restart, chain.runs[1].tail()
    finished = written_by_executors(restart, CRASH_BATCH)
    assert finished, chain.runs[1].tail()
    assert written_by_executors(restart, AFTER_BATCH), chain.runs[1].tail()
    assert restart.index(finished.group(0)) < restart.index(
        written_by_executors(restart, AFTER_BATCH).group(0))
    # The seal of batch 2 was not replaced; rows seen before the restart kept their cells;
    # every batch holds exactly its rows at their sealed write times.
    assert_restart_completed(chain, CRASH_BATCH, AFTER_BATCH)
    assert chain.wal().read_flushed_through() == AFTER_BATCH
    assert chain.wal().staged_batch_ids() == []
