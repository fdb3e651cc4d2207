"""Crash tests of ``wal.flush.mode=processes``: the flush's worker processes killed with SIGKILL.

The crash driver program (8 batches, 2 segments each) runs with ``--flush-mode processes``, so
every committed batch is written by two worker processes of the driver, one segment each. The
crash point ``flush.task_written`` fires in a worker, after its segment is acknowledged by
Cassandra and before the worker answers the driver:

* with ``CASSANDRA_WAL_CRASH_SCOPE=group`` it takes the whole driver machine down (the workers
  are in the driver's process group): the restarted run's recovery must finish the batch,
  exactly once, at the sealed timestamps;
* without it only that worker dies: the run itself must notice, retry the batch from its
  recorded progress with new workers, and finish without a restart.

``flush.mid`` (the driver, after the first segment of a batch is recorded) covers a crash between
two segments' acknowledgements. Checks: ``harness.CrashHarness.check`` (rows, write timestamps,
nothing uncommitted ever visible, the WAL clean).
"""

from __future__ import annotations

import pytest

from wal.crashpoints import ENV_ONCE, ENV_POINT

from .harness import CrashHarness

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@pytest.fixture
def processes_harness(cql, cassandra_node, keyspace, tmp_path):
    with CrashHarness(cql, cassandra_node.host, cassandra_node.port, keyspace,
                      tmp_path / "crash", flush_mode="processes") as harness:
        yield harness


@pytest.mark.parametrize("point", ["flush.task_written@2", "flush.mid@3"])
def test_a_machine_crash_during_a_worker_flush_loses_nothing(processes_harness, point):
    phase = processes_harness.crash_at(point)
    assert phase.fired
    processes_harness.finish()
    processes_harness.check(f"processes {point}")


def test_a_killed_flush_worker_is_replaced_and_the_run_finishes_by_itself(processes_harness,
                                                                          tmp_path):
    once = tmp_path / "worker-killed"
    phase = processes_harness.finish({ENV_POINT: "flush.task_written@2", ENV_ONCE: str(once)})
    assert once.exists(), f"no worker reached its crash point:\n{phase.tail()}"
    log = phase.log_path.read_text(errors="replace")
    assert "a flush worker process died" in log and "killed by signal 9" in log, phase.tail()
    processes_harness.check("processes: one worker killed, the run went on")
