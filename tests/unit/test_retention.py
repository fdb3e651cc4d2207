"""Retention and size (wal/retention.py): one named test per edge case.

Time is injected: ``clock`` sets what ``now_us`` returns in the log (when a batch is marked
flushed or discarded) and in retention (when ages are computed).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from wal.layout import WalDir
from wal.log import WalLog
from wal.retention import (RetentionPolicy, apply_retention, remove_batch_files,
                           remove_unsealed_segments, wal_size)
from wal.seal import next_base_timestamp, read_seal, seal_batch
from wal.segment import SegmentWriter
from wal.states import BatchState

pytestmark = pytest.mark.unit

SECOND = 1_000_000


class Clock:
    def __init__(self, now_us: int):
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        self.now_us += int(seconds * SECOND)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock(1_800_000_000 * SECOND)
    monkeypatch.setattr("wal.log.now_us", c)
    monkeypatch.setattr("wal.retention.now_us", c)
    return c


def stage(wal: WalDir, batch: int, partition: int = 0, rows: int = 100, attempt: int = 0):
    with SegmentWriter(wal, batch, partition, attempt) as writer:
        writer.append(pa.record_batch({"id": pa.array(range(rows), pa.int64()),
                                       "pad": pa.array(["x" * 50] * rows)}))
        return writer.finish()


def seal(wal: WalDir, batch: int, rows: int = 100):
    return seal_batch(wal, batch, [stage(wal, batch, rows=rows)])


def flush(wal: WalDir, wal_log: WalLog, batch: int, rows: int = 100):
    wal_log.ingest(seal(wal, batch, rows))
    wal_log.begin_flush(batch)
    return wal_log.mark_flushed(batch)


def kept(wal_log: WalLog) -> list[int]:
    return [r.batch for r in wal_log.records()]


def has_files(wal: WalDir, batch: int) -> tuple[bool, bool]:
    return os.path.isdir(wal.batch_segments(batch)), os.path.exists(wal.seal_path(batch))


# -- keep_batches -------------------------------------------------------------------------

def test_keep_batches_keeps_the_newest_finished_batches(wal, wal_log, clock):
    for b in range(6):
        flush(wal, wal_log, b)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=2)) == [0, 1, 2, 3]
    assert kept(wal_log) == [4, 5]
    assert [has_files(wal, b) for b in range(6)] == [(False, False)] * 4 + [(True, True)] * 2


def test_keep_batches_counts_discarded_batches_as_finished(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    wal_log.discard(1, "never committed")
    flush(wal, wal_log, 2)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1)) == [0, 1]
    assert kept(wal_log) == [2]


def test_keep_batches_larger_than_the_log_removes_nothing(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=10)) == []
    assert kept(wal_log) == [0, 1, 2]


def test_keep_batches_zero_removes_every_finished_batch(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0)) == [0, 1, 2]
    assert kept(wal_log) == []


def test_negative_keep_batches_is_rejected():
    with pytest.raises(ValueError, match="keep_batches"):
        RetentionPolicy(keep_batches=-1)


def test_retention_twice_removes_nothing_more(wal, wal_log, clock):
    for b in range(4):
        flush(wal, wal_log, b)
    policy = RetentionPolicy(keep_batches=2)
    assert apply_retention(wal, wal_log, policy) == [0, 1]
    assert apply_retention(wal, wal_log, policy) == []


# -- keep_seconds -------------------------------------------------------------------------

def test_batch_beyond_keep_batches_but_young_is_kept(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    clock.advance(59)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1, keep_seconds=60)) == []
    assert kept(wal_log) == [0, 1, 2]


def test_batch_beyond_keep_batches_and_old_is_removed(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    clock.advance(60)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1, keep_seconds=60)) == [0, 1]
    assert kept(wal_log) == [2]


def test_only_the_old_batches_beyond_keep_batches_are_removed(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    flush(wal, wal_log, 1)
    clock.advance(120)
    flush(wal, wal_log, 2)
    flush(wal, wal_log, 3)
    clock.advance(30)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1, keep_seconds=60)) == [0, 1]
    assert kept(wal_log) == [2, 3]


def test_batch_within_keep_batches_is_kept_however_old(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    clock.advance(10 * 365 * 86400)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=3, keep_seconds=1)) == []


def test_keep_seconds_alone_with_keep_batches_zero(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    clock.advance(100)
    flush(wal, wal_log, 1)
    clock.advance(10)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0, keep_seconds=50)) == [0]
    assert kept(wal_log) == [1]


def test_age_counts_from_when_the_batch_finished_not_when_it_was_sealed(wal, wal_log, clock):
    wal_log.ingest(seal(wal, 0))
    wal_log.begin_flush(0)
    clock.advance(1000)         # a slow flush
    wal_log.mark_flushed(0)
    flush(wal, wal_log, 1)
    clock.advance(10)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0, keep_seconds=50)) == []


# -- what is never removed ----------------------------------------------------------------

def test_forgetting_a_discarded_batch_leaves_the_files_of_sparks_rerun(wal, wal_log, clock):
    # Recovery discarded batch 1 (never committed) and removed its files; Spark re-ran it
    # with the same id, staged and sealed, not ingested yet. Forgetting the old DISCARDED
    # record must not delete the re-run's files: they are a committed batch's only copy.
    flush(wal, wal_log, 0)
    seal(wal, 1)
    wal_log.discard(1, "never committed")
    remove_batch_files(wal, 1)
    rerun = seal(wal, 1)
    clock.advance(100)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0, keep_seconds=50)) == [0, 1]
    assert has_files(wal, 1) == (True, True)
    assert read_seal(wal, 1).seal_id == rerun.seal_id


def test_unfinished_batches_are_never_removed(wal, wal_log, clock):
    wal_log.ingest(seal(wal, 0))
    wal_log.ingest(seal(wal, 1))
    wal_log.begin_flush(1)
    flush(wal, wal_log, 2)
    clock.advance(10_000)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0, keep_seconds=1)) == [2]
    assert [(r.batch, r.state) for r in wal_log.records()] == \
        [(0, BatchState.SEALED), (1, BatchState.FLUSHING)]
    assert has_files(wal, 0) == has_files(wal, 1) == (True, True)


def test_staged_and_sealed_batches_outside_the_log_are_untouched(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    stage(wal, 1)
    seal(wal, 2)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0)) == [0]
    assert wal.staged_batch_ids() == [1, 2]
    # Batch 0 keeps its seal: it is the newest *flushed* batch, whose last timestamp the next
    # seal must exceed even if the undecided seal 2 is later discarded.
    assert wal.sealed_batch_ids() == [0, 2]


def test_newest_seal_is_kept_when_its_batch_is_removed(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0))
    assert wal.sealed_batch_ids() == [2]
    assert has_files(wal, 2) == (False, True)
    assert read_seal(wal, 2).rows == 100


def test_newest_seal_is_kept_when_a_later_batch_was_discarded(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    wal_log.discard(3, "never committed")
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1)) == [0, 1, 2]
    assert wal.sealed_batch_ids() == [2]


def test_newest_flushed_seal_is_kept_when_a_newer_seal_was_discarded(wal, wal_log, clock):
    """A newer seal that Spark never committed must not displace the seal the next batch's
    timestamps start above."""
    for b in range(3):
        flush(wal, wal_log, b)
    seal(wal, 3)                       # sealed, then Spark never committed it
    wal_log.discard(3, "never committed")
    remove_batch_files(wal, 3)         # as recovery's discard does
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0)) == [0, 1, 2, 3]
    assert wal.sealed_batch_ids() == [2]
    assert next_base_timestamp(wal, 3, clock_us=0) == read_seal(wal, 2).last_ts_us + 1


def test_kept_seal_is_removed_once_a_newer_batch_is_flushed(wal, wal_log, clock):
    for b in range(3):
        flush(wal, wal_log, b)
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0))
    assert wal.sealed_batch_ids() == [2]
    flush(wal, wal_log, 3)
    assert apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1)) == []
    assert wal.sealed_batch_ids() == [3]
    assert kept(wal_log) == [3]


def test_timestamps_stay_increasing_after_retention(wal, wal_log, clock):
    last = max(flush(wal, wal_log, b).seal.last_ts_us for b in range(3))
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0))
    assert next_base_timestamp(wal, 3, clock_us=0) == last + 1


def test_retention_removes_rows_record_segments_and_seal(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    flush(wal, wal_log, 1)
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1))
    assert wal_log.get(0) is None
    assert list(wal_log.chunks(0)) == []
    assert has_files(wal, 0) == (False, False)
    assert wal.staged_batch_ids() == [1]


def test_remove_batch_files_can_keep_the_seal(wal):
    seal(wal, 4)
    remove_batch_files(wal, 4, keep_seal=True)
    assert has_files(wal, 4) == (False, True)
    remove_batch_files(wal, 4)
    assert has_files(wal, 4) == (False, False)
    remove_batch_files(wal, 4)   # nothing left: no error


# -- unsealed segments --------------------------------------------------------------------

def test_remove_unsealed_segments_keeps_only_the_named_ones(wal):
    winner = stage(wal, 5, partition=0, attempt=1)
    loser = stage(wal, 5, partition=0, attempt=0)
    earlier_run = stage(wal, 5, partition=1, attempt=0)
    crashed = os.path.join(wal.batch_segments(5), "00002-000-0123456789ab.seg.tmp")
    with open(crashed, "wb") as f:
        f.write(b"CWALSEG1")
    assert remove_unsealed_segments(wal, 5, {winner.name}) == 3
    assert wal.segment_files(5) == [winner.name]
    assert os.listdir(wal.batch_segments(5)) == [winner.name.split("/")[1]]
    assert loser.name != earlier_run.name


def test_remove_unsealed_segments_with_every_segment_named_removes_nothing(wal):
    refs = [stage(wal, 5, partition=p) for p in range(3)]
    assert remove_unsealed_segments(wal, 5, {r.name for r in refs}) == 0
    assert len(wal.segment_files(5)) == 3


def test_remove_unsealed_segments_of_a_batch_without_folder(wal):
    assert remove_unsealed_segments(wal, 99, set()) == 0


def test_remove_unsealed_segments_does_not_touch_other_batches(wal):
    other = stage(wal, 6)
    stage(wal, 5)
    assert remove_unsealed_segments(wal, 5, set()) == 1
    assert wal.segment_files(6) == [other.name]


# -- size ---------------------------------------------------------------------------------

def test_wal_size_of_a_fresh_wal_is_tiny(wal):
    size = wal_size(wal)
    assert (size.segments, size.seals, size.log) == (0, 0, 0)
    assert size.total == 0


def test_wal_size_grows_with_staged_data_and_shrinks_after_retention(wal, wal_log, clock):
    before = wal_size(wal)
    refs = [stage(wal, 0, partition=p, rows=2000) for p in range(3)]
    staged = wal_size(wal)
    assert staged.segments == sum(r.bytes for r in refs)
    assert staged.total >= before.total + staged.segments
    sealed = seal_batch(wal, 0, refs)
    assert wal_size(wal).seals == os.path.getsize(wal.seal_path(0))
    wal_log.ingest(sealed)
    wal_log.begin_flush(0)
    wal_log.mark_flushed(0)
    flush(wal, wal_log, 1, rows=10)
    grown = wal_size(wal)
    assert grown.total > staged.total
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=1))
    after = wal_size(wal)
    assert after.segments < grown.segments
    assert after.total < grown.total
    assert after.segments == grown.segments - sum(r.bytes for r in refs)


def test_wal_size_total_is_the_sum_of_its_parts(wal, wal_log, clock):
    flush(wal, wal_log, 0)
    size = wal_size(wal)
    assert size.total == size.segments + size.log + size.seals
    assert size.log > 0
    assert size.to_dict() == {"total": size.total, "segments": size.segments, "log": size.log,
                              "seals": size.seals}


def test_the_seal_kept_for_its_timestamps_stays_when_only_skipped_batches_follow_it(tmp_path):
    """Review 7: in a foreachBatch WAL, batches the writer was never called for move
    flushed_through past the newest flushed seal; retention took that seal (and its
    amendment) for one kept only for its timestamps, and removed it: nothing left to start above."""
    from recovery.replay import Replayer
    from tests.helpers.walfactory import WalFactory
    from tests.helpers.flush_fakes import RecordingUpserter
    from wal.amendments import Amendment, write_amendment
    from wal.seal import last_written_ts_us

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.entered(0)
        f.flushed(0)
        write_amendment(f.wal, Amendment(0, (), 4_000_000_000_000_000, "re-stamped",
                                         seal_id=read_seal(f.wal, 0).seal_id))
        last_ts = last_written_ts_us(f.wal, read_seal(f.wal, 0))
        f.commit(1)
        f.commit(2)                     # the writer was not called for 1 and 2: skipped
        Replayer(f.wal, f.wal_log, lambda s: RecordingUpserter(), f.checkpoint).run(True)
        assert f.wal_log.flushed_through() == 2
        for _ in range(2):
            apply_retention(f.wal, f.wal_log, RetentionPolicy(keep_batches=0))
        assert next_base_timestamp(f.wal, 3, clock_us=0) > last_ts


def test_the_wal_size_looks_at_a_folder_per_batch_not_at_every_segment_file(wal, monkeypatch):
    """Issue 32: the health (every drain and every scrape) walked and lstat-ed every staged
    segment file of every pending batch for the WAL's size. A batch folder that has not
    changed is not walked again; one that changed is."""
    import time

    from wal.retention import wal_size

    for batch in range(3):
        folder = wal.batch_segments(batch)
        os.makedirs(folder)
        for i in range(20):
            with open(os.path.join(folder, f"{i:05d}-0-x.seg"), "wb") as f:
                f.write(b"x" * 100)
        past = time.time() - 10
        os.utime(folder, (past, past))
    first = wal_size(wal)
    assert first.segments == 3 * 20 * 100
    looked = []
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if os.fspath(path).startswith(wal.segments):
            looked.append(os.fspath(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    assert wal_size(wal) == first
    assert len(looked) <= 3, looked           # one per batch folder at most
    with open(os.path.join(wal.batch_segments(1), "00020-0-x.seg"), "wb") as f:
        f.write(b"y" * 50)                    # a late attempt: the folder changed
    assert wal_size(wal).segments == first.segments + 50
