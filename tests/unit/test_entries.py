"""Entries (``wal/entries.py``): a foreachBatch writer records each batch it is called for, so
that a batch Spark committed without a seal tells "the writer was never called: nothing to
write" (skipped) from "the writer was called and its rows never staged" (broken). Issue 30,
item 3: before, every committed batch without a seal blocked the WAL for good, so a function
that skipped a batch (``if df.isEmpty(): return``) stopped the sink."""

from __future__ import annotations

import os

import pytest

from recovery.errors import RecoveryBlocked
from recovery.replay import Replayer
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import WRITES, RecordingUpserter
from wal import catalog
from wal.catalog import RecoveryAction, ViewState
from wal.entries import entered_batch_ids, entries_since, read_entry
from wal.recovery_policy import RecoveryPolicy

pytestmark = pytest.mark.unit


def replay(f: WalFactory, policy: RecoveryPolicy = RecoveryPolicy.QUERY_FLUSHER):
    WRITES.clear()
    return Replayer(f.wal, f.wal_log, lambda seal: RecordingUpserter(), f.checkpoint).run(
        policy)


def views(f: WalFactory, policy: RecoveryPolicy = RecoveryPolicy.QUERY_FLUSHER
          ) -> dict[int, catalog.BatchView]:
    return {v.batch: v for v in catalog.describe(f.wal, f.wal_log, f.checkpoint, policy)}


def test_a_committed_batch_the_writer_was_never_called_for_is_skipped_and_passed(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        f.commit(1)                      # the function did not call the writer for batch 1
        f.commit(2)
        f.entered(3)
        f.sealed(3)
        seen = views(f)
        assert (seen[1].state, seen[1].action) == (ViewState.SKIPPED, RecoveryAction.NOTHING)
        assert (seen[2].state, seen[2].action) == (ViewState.SKIPPED, RecoveryAction.NOTHING)
        report = replay(f)
        assert report.replayed == [3]
        assert f.wal_log.flushed_through() == 3 and f.wal.read_flushed_through() == 3
        f.commit(4)                      # a skipped batch at the end moves the mark too
        replay(f)
        assert f.wal_log.flushed_through() == 4 and f.wal.read_flushed_through() == 4


def test_a_skipped_batch_after_one_the_flusher_cannot_write_yet_waits_its_turn(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.sealed(0)
        f.commit(1)
        wal_log = f.wal_log

        def failing(seal):
            raise ConnectionError("Cassandra away")

        with pytest.raises(ConnectionError):
            Replayer(f.wal, wal_log, failing, f.checkpoint).run(RecoveryPolicy.QUERY_FLUSHER)
        assert wal_log.flushed_through() == -1 and f.wal.read_flushed_through() == -1


def test_an_entered_batch_without_a_seal_that_spark_committed_blocks_naming_it(tmp_path):
    """The function caught the writer's error and returned: Spark committed the batch, whose
    rows for this table never reached the WAL. Nothing can write them: block, loudly."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        f.entered(1)
        f.commit(1)
        seen = views(f)
        assert (seen[1].state, seen[1].action) == ("entered", RecoveryAction.ERROR)
        assert "catch the writer's exception" in seen[1].detail
        with pytest.raises(RecoveryBlocked) as info:
            replay(f)
        assert info.value.batch == 1 and "sealed nothing" in str(info.value)


def test_an_entered_batch_spark_did_not_commit_waits_and_is_discarded_at_the_next_start(
        tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        f.entered(1)                     # the writer is staging it, or its run died
        assert views(f)[1].action == RecoveryAction.WAIT
        assert replay(f).waiting_at == 1
        report = replay(f, RecoveryPolicy.QUERY_START)
        assert report.discarded == [1]
        assert read_entry(f.wal, 1) is None and entered_batch_ids(f.wal) == []
        assert entries_since(f.wal) == 0          # kept: later skips are still told apart


def test_a_flushed_batch_takes_its_entry_with_it(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0, run_id="r", table="ks.t")
        assert read_entry(f.wal, 0).run_id == "r" and read_entry(f.wal, 0).table == "ks.t"
        f.sealed(0)
        replay(f)
        assert entered_batch_ids(f.wal) == [] and entries_since(f.wal) == 0


def test_without_entries_a_committed_batch_without_a_seal_still_blocks(tmp_path):
    """A data source's WAL (or one an earlier release wrote) sees every batch of its query: a
    committed batch with no seal is a lost seal, as before."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.commit(1)
        assert views(f)[1].action == RecoveryAction.ERROR
        with pytest.raises(RecoveryBlocked):
            replay(f)


def test_batches_before_the_first_entry_are_not_the_wals(tmp_path):
    """A table first written at batch 5: the WAL's first entry. Batches 0-4 (committed, the
    function wrote other tables) are not looked at."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        for b in range(5):
            f.commit(b)
        f.entered(5)
        f.sealed(5)
        assert sorted(views(f)) == [5]
        assert replay(f).replayed == [5]


def test_the_catalog_reads_sparks_commits_before_the_files(tmp_path, monkeypatch):
    """A reader beside a live sink: the writer enters, seals and Spark commits batch 1 between
    the reader's listing and its read of commits/. Read in that order, batch 1 would look
    committed with no entry: skipped. Commits are read first, so it is seen whole."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        real = catalog.committed_through

        def commits_then_the_writer_runs(wal_log, checkpoint):
            out = real(wal_log, checkpoint)
            if not os.path.exists(f.wal.seal_path(1)):
                f.entered(1)
                f.sealed(1)
            return out

        monkeypatch.setattr(catalog, "committed_through", commits_then_the_writer_runs)
        seen = views(f)
        assert 1 not in seen or seen[1].action != RecoveryAction.NOTHING


# -- what the simulation found after the fix (tests/sim/README.md, F3 and F4) --------------------

def test_a_batch_a_later_run_committed_without_the_writer_is_skipped_over_an_earlier_runs_files(
        tmp_path):
    """F3: run r1 entered and sealed batch 1 and died before Spark committed it; run r2's
    recovery did not get to discard it (a store away), r2 re-ran batch 1 without calling this
    writer, and Spark committed it: r1's seal was taken for batch 1's, and rows Spark never
    committed reached Cassandra. The run that committed the batch is on record."""
    from wal.entries import record_run

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        record_run(f.wal, 0, "r1")
        f.entered(0, run_id="r1")
        f.flushed(0)
        f.entered(1, run_id="r1")
        f.sealed(1, committed=False)             # r1's, never committed
        record_run(f.wal, 1, "r2")               # r2 runs batch 1 again, skips the writer
        f.commit(1)
        seen = views(f)
        assert (seen[1].state, seen[1].detail) == (ViewState.SKIPPED, catalog.LEFT_BY_ANOTHER_RUN)
        report = replay(f)
        assert report.replayed == [] and WRITES == []
        assert f.wal.sealed_batch_ids() == [0] and entered_batch_ids(f.wal) == []
        assert f.wal_log.flushed_through() == 1


def test_an_entry_of_the_run_that_committed_the_batch_still_blocks(tmp_path):
    from wal.entries import record_run

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        record_run(f.wal, 0, "r1")
        f.entered(0, run_id="r1")
        f.flushed(0)
        record_run(f.wal, 1, "r2")
        f.entered(1, run_id="r2")                # r2's own call failed; its function went on
        f.commit(1)
        assert views(f)[1].action == RecoveryAction.ERROR


def test_a_reruns_lost_batch_is_not_hidden_by_the_discard_of_the_first_run(tmp_path):
    """F4: r1 entered batch 1 and failed; r2's recovery discarded it (DISCARDED in the log);
    r2's call of batch 1 failed too and its function caught it; Spark committed batch 1. The
    DISCARDED record made the lost batch count as done."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        f.entered(1, run_id="r1")
        assert replay(f, RecoveryPolicy.QUERY_START).discarded == [1]
        f.entered(1, run_id="r2")
        f.commit(1)
        assert views(f)[1].action == RecoveryAction.ERROR


def test_an_earlier_runs_seal_is_not_the_seal_of_a_reruns_call_that_sealed_nothing(tmp_path):
    """r1 entered and sealed batch 1 and died before Spark committed it; r2 re-ran batch 1,
    its writer entered and failed, its function caught the error, and Spark committed batch 1.
    r1's seal was taken for r2's: rows of a run Spark never committed would be written, while
    r2's rows for the table are lost unsaid. An entry names the seal its call writes."""
    from wal.entries import record_run

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        record_run(f.wal, 0, "r1")
        f.entered(0, run_id="r1")
        f.flushed(0)
        f.entered(1, run_id="r1", seal_id="seal-0001")
        f.sealed(1, committed=False)             # r1's seal, seal_id seal-0001
        record_run(f.wal, 1, "r2")
        f.entered(1, run_id="r2", seal_id="r2-call")   # r2's call: it would write r2-call
        f.commit(1)
        seen = views(f)
        assert (seen[1].action, seen[1].detail) == (RecoveryAction.ERROR,
                                                    catalog.ENTERED_NOT_SEALED)
        with pytest.raises(RecoveryBlocked):
            replay(f)
        assert WRITES == []


def test_the_seal_a_call_named_in_its_entry_is_written(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0, run_id="r1", seal_id="seal-0000")
        f.sealed(0, committed=False)
        f.commit(0)
        assert views(f)[0].action == RecoveryAction.REPLAY


def test_segments_without_a_seal_before_since_still_block_once_committed(tmp_path):
    """Before ``since`` the WAL kept no entries (an earlier release wrote those batches): a
    committed batch with segments and no seal there is a lost seal, as it always was, not
    a leftover of another run."""
    from wal.entries import record_run

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.staged(0)
        f.commit(0)
        record_run(f.wal, 1, "r2")
        f.entered(1, run_id="r2")             # entries kept from batch 1 on
        seen = views(f)
        assert seen[0].action == RecoveryAction.ERROR
