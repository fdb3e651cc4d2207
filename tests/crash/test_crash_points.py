"""Kill the whole driver machine at every named crash point, restart, finish, check everything.

Each case runs the crash driver program (8 input files of 200 rows: 8 batches, 2 segments of
4 chunks each per batch) with ``CASSANDRA_WAL_CRASH_AT=<step>`` and
``CASSANDRA_WAL_CRASH_SCOPE=group`` once per step, then once more without a crash point on the
same checkpoint, and checks the invariants (``harness.CrashHarness.check``). ``@n`` picks the
n-th time the point is reached in one process, so that earlier batches are already flushed.

Which instant of the protocol each case covers: ``docs/testing.md``, "Crash tests".

On a store (``storage.py``): the same cases with the checkpoint and WAL on HDFS or S3, some
restarted "on another host" (the driver's working copy of the WAL deleted after each crash).
The default suite runs two points on HDFS (:data:`HDFS_DEFAULT`), ``--full-matrix`` every
case on HDFS and S3 (:func:`on_store`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wal.crashpoints import POINTS

from .harness import crash_harness  # noqa: F401 - fixture
from .storage import HDFS, LOCAL, S3

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@dataclass(frozen=True)
class CrashCase:
    steps: tuple[str, ...]          # one crashed run per step, then a clean run
    storage: str = LOCAL            # where the checkpoint and WAL are (storage.py)
    lose_working_copy: bool = False  # each restart "on another host" (a store only)
    flush_mode: str = "driver"      # wal.flush.mode of every run

    @property
    def id(self) -> str:
        steps = ("" if self.flush_mode == "driver" else f"{self.flush_mode}-") + \
            "+".join(self.steps)
        if self.storage == LOCAL:
            return steps
        return f"{self.storage}-{'lost-copy-' if self.lose_working_copy else ''}{steps}"

    @property
    def points(self) -> set[str]:
        return {s.partition("@")[0] for s in self.steps}


# Every point once. Counts are per process: the flusher (flush.*) and recovery (recover.*) live
# in the driver; stage.* in Spark's reused Python workers (two of them, tasks alternate);
# commit.* in the worker that runs the batch's commit (reused too).
EVERY_POINT = (
    CrashCase(("stage.mid@3",)),              # while staging (a task's segment half written)
    CrashCase(("stage.after@3",)),            # after staging, before the batch's commit
    CrashCase(("commit.before_seal@2",)),     # inside commit, before the seal
    CrashCase(("commit.after_seal@2",)),      # after the seal: commits/N never written
    CrashCase(("flush.before_ingest@3",)),    # commits/N written, the flush not started
    CrashCase(("flush.mid@20",)),             # batch 2 half written (after 4 of its 8 chunks)
    CrashCase(("flush.before_mark@3",)),      # batch 2 written, FLUSHED not recorded
    # Recovery's own replay: leave batch 2 half flushed, crash recovery after one chunk.
    CrashCase(("flush.mid@20", "recover.mid@1")),
)

# The default suite: every point once, but flush.mid@20 alone (40 s, for the suite's 30
# minutes): the chained case crashes there first too, and HDFS_DEFAULT restarts from it, on
# another host, with nothing but a clean run after.
DEFAULT = tuple(c for c in EVERY_POINT if c.steps != ("flush.mid@20",))

# The scale-out path (--full-matrix): every batch, and a restart's backlog (only discards run
# before its first batch), written by Spark tasks; flush.mid fires after each segment
# acknowledged.
SCALE_OUT = (
    CrashCase(("flush.before_ingest@3",), flush_mode="executors"),
    CrashCase(("flush.mid@5",), flush_mode="executors"),
    CrashCase(("flush.before_mark@3",), flush_mode="executors"),
    CrashCase(("flush.mid@5", "flush.mid@1"), flush_mode="executors"),
)

# --full-matrix: every point at several batches, the last batch (no new data on restart: only
# recovery can finish it), and crashes during a restart's recovery or flush.
FULL = EVERY_POINT + (
    CrashCase(("stage.mid@1",)),
    CrashCase(("stage.mid@5",)),
    CrashCase(("stage.after@1",)),
    CrashCase(("stage.after@5",)),
    CrashCase(("commit.before_seal@1",)),
    CrashCase(("commit.before_seal@3",)),
    CrashCase(("commit.after_seal@1",)),
    CrashCase(("commit.after_seal@3",)),
    CrashCase(("flush.before_ingest@1",)),
    CrashCase(("flush.before_ingest@8",)),
    CrashCase(("flush.mid@1",)),
    CrashCase(("flush.mid@12",)),
    CrashCase(("flush.mid@60",)),
    CrashCase(("flush.before_mark@1",)),
    CrashCase(("flush.before_mark@8",)),
    CrashCase(("flush.mid@4", "recover.mid@1")),
    CrashCase(("flush.before_ingest@8", "recover.mid@3")),
    CrashCase(("flush.mid@4", "recover.mid@1", "recover.mid@2")),
    CrashCase(("commit.after_seal@2", "flush.before_ingest@2")),
    CrashCase(("flush.mid@12", "flush.mid@5")),
    CrashCase(("stage.after@3", "commit.after_seal@1")),
) + SCALE_OUT


def on_store(case: CrashCase, storage: str, lose_working_copy: bool = False) -> CrashCase:
    return CrashCase(case.steps, storage, lose_working_copy, case.flush_mode)


# The default suite on HDFS: two instants where the store, not the driver's disk, must hold
# the answer (each case costs 40-70 s, and the suite has 30 minutes; stage.after on a store,
# losers' segments deleted there, runs under --full-matrix and in the simulation's store
# schedules):
# * commit.after_seal: the seal is on the store as a version, commits/N never written; Spark
#   re-runs the batch and publishes a newer version, which alone may decide the timestamps.
# * flush.mid, restarted on another host: half a batch in Cassandra and the log that knew how
#   far is gone with the working copy; the new host replays from the store's seal and
#   segments alone, at the sealed timestamps (identical cells), and goes on above them.
HDFS_DEFAULT = (
    on_store(CrashCase(("commit.after_seal@2",)), HDFS),
    on_store(CrashCase(("flush.mid@20",)), HDFS, lose_working_copy=True),
)


def store_cases(storage: str) -> list[CrashCase]:
    """--full-matrix on a store: every case of :data:`FULL`, and every default case and every
    scale-out case again restarted on another host (whose working copy holds no segment: the
    restart's tasks read them from the store)."""
    return ([on_store(c, storage) for c in FULL]
            + [on_store(c, storage, lose_working_copy=True)
               for c in EVERY_POINT + SCALE_OUT])


def cases(full: bool) -> list[CrashCase]:
    """Called by tests/crash/conftest.py to parametrize ``crash_case``."""
    if not full:
        return list(DEFAULT + HDFS_DEFAULT)
    chosen = list(FULL) + store_cases(HDFS) + store_cases(S3)
    assert set(HDFS_DEFAULT) <= set(chosen)
    return chosen


def test_default_cases_cover_every_crash_point():
    covered = set().union(*(c.points for c in DEFAULT))
    assert covered == set(POINTS), f"crash points without a test: {set(POINTS) - covered}"


def test_the_default_cases_on_a_store_cover_a_lost_working_copy():
    assert all(c.storage == HDFS for c in HDFS_DEFAULT)
    assert any(c.lose_working_copy for c in HDFS_DEFAULT)
    assert not any(c.lose_working_copy for c in DEFAULT + FULL)   # local: nothing to lose


def test_crash_restart_finish(crash_harness, crash_case):  # noqa: F811 - fixture
    crash_harness.flush_mode = crash_case.flush_mode
    if crash_case.lose_working_copy:
        crash_harness.restart_on_another_host()
    phases = [crash_harness.crash_at(step) for step in crash_case.steps]
    finish = crash_harness.finish()
    if crash_case.lose_working_copy:
        # Every restart ran without the working copy the crashed run had made.
        lost = [p.lost_working_copy for p in phases[1:] + [finish]]
        assert all(lost), f"{crash_case.id}: a restart found no working copy to lose: {lost}"
    crash_harness.check(crash_case.id)
