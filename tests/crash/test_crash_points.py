"""Kill the whole driver machine at every named crash point, restart, finish, check everything.

Each case runs the crash driver program (8 input files of 200 rows: 8 batches, 2 segments of
4 chunks each per batch) with ``CASSANDRA_WAL_CRASH_AT=<step>`` and
``CASSANDRA_WAL_CRASH_SCOPE=group`` once per step, then once more without a crash point on the
same checkpoint, and checks the invariants (``harness.CrashHarness.check``). ``@n`` picks the
n-th time the point is reached in one process, so that earlier batches are already flushed.

Which instant of the protocol each case covers: ``docs/testing.md``, "Crash tests".
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wal.crashpoints import POINTS

from .harness import crash_harness  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.crash]


@dataclass(frozen=True)
class CrashCase:
    steps: tuple[str, ...]          # one crashed run per step, then a clean run

    @property
    def id(self) -> str:
        return "+".join(self.steps)

    @property
    def points(self) -> set[str]:
        return {s.partition("@")[0] for s in self.steps}


# The default set: every point once. Counts are per process: the flusher (flush.*) and recovery
# (recover.*) live in the driver; stage.* in Spark's reused Python workers (two of them, tasks
# alternate); commit.* in the worker that runs the batch's commit (reused too).
DEFAULT = (
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

# --full-matrix: every point at several batches, the last batch (no new data on restart: only
# recovery can finish it), and crashes during a restart's recovery or flush.
FULL = DEFAULT + (
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
)


def cases(full: bool) -> list[CrashCase]:
    """Called by tests/crash/conftest.py to parametrize ``crash_case``."""
    return list(FULL if full else DEFAULT)


def test_default_cases_cover_every_crash_point():
    covered = set().union(*(c.points for c in DEFAULT))
    assert covered == set(POINTS), f"crash points without a test: {set(POINTS) - covered}"


def test_crash_restart_finish(crash_harness, crash_case):  # noqa: F811 - fixture
    for step in crash_case.steps:
        crash_harness.crash_at(step)
    crash_harness.finish()
    crash_harness.check(crash_case.id)
