"""Replayer.run finishes a flush that a crash cut short after the batch was marked FLUSHED.

``Replayer.flush`` marks a batch FLUSHED, writes ``flushed_through``, then removes the batch's
staged segment files. A crash between the mark and the removal leaves the files of a batch that
is done: recovery plans nothing for it, so without this step they would stay forever and count
against ``wal.maxBytes``. The next run removes them (keeping the seal), and writes no row of that
batch again. Found by the crash test ``stage.after@3``: the driver was killed while its flusher
was between those two steps.
"""

from __future__ import annotations

import os

import pytest

import recovery.replay as replay
from recovery.replay import Replayer
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import WRITES, RecordingUpserter
from wal.recovery_policy import RecoveryPolicy
from wal.states import BatchState

pytestmark = pytest.mark.unit


class Killed(BaseException):
    """The process dies here (nothing after this line runs)."""


def killed(*args, **kwargs):
    raise Killed()


@pytest.fixture(autouse=True)
def _clean():
    WRITES.clear()
    yield
    WRITES.clear()


def test_files_of_a_batch_flushed_before_a_crash_are_removed_by_the_next_run(tmp_path, monkeypatch):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 2))
        f.sealed(1, rows=(4,))
        monkeypatch.setattr(replay, "remove_batch_files", killed)
        with pytest.raises(Killed):
            Replayer(f.wal, f.wal_log, lambda seal: RecordingUpserter(), f.checkpoint).run(
                RecoveryPolicy.QUERY_START)
        assert f.wal_log.get(0).state is BatchState.FLUSHED
        assert f.wal.read_flushed_through() == 0
        assert f.wal.staged_batch_ids() == [0, 1]      # batch 0 is done, its files are not gone
        monkeypatch.undo()
        WRITES.clear()

        report = Replayer(f.wal, f.wal_log, lambda seal: RecordingUpserter(), f.checkpoint).run(
            RecoveryPolicy.QUERY_START)
        assert report.replayed == [1]
        assert {batch for batch, _, _ in WRITES} == {1}   # no row of batch 0 written again
        assert f.wal.staged_batch_ids() == []
        assert os.path.exists(f.wal.seal_path(0)) and os.path.exists(f.wal.seal_path(1))


def test_a_flushed_batch_without_files_and_other_batches_are_left_alone(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.sealed(1, committed=False)                   # Spark may still commit it
        report = Replayer(f.wal, f.wal_log, lambda seal: RecordingUpserter(), f.checkpoint).run(
            RecoveryPolicy.QUERY_FLUSHER)
        assert report.replayed == [] and report.waiting_at == 1
        assert f.wal.staged_batch_ids() == [1]         # the undecided batch keeps its files
        assert WRITES == []
