"""Back-pressure at ``wal.maxBytes`` (sinks/worker/plan.py: ``wait_for_room``), with a fake clock.

The cap bounds the backlog *before* the batch being committed: segment bytes of earlier
batches, sealed but not yet flushed. The batch itself is already on disk and never counts,
so a batch larger than the cap is not refused forever.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from sinks.worker.options import parse_options
from sinks.worker.plan import WritePlan, backlog_bytes, commit_batch, wait_for_room
from wal.errors import WalFull
from wal.files import tree_size
from wal.retention import remove_batch_files
from wal.seal import read_seal, seal_batch
from wal.segment import SegmentWriter

pytestmark = pytest.mark.unit


def stage(wal, batch: int, rows: int = 100, sealed: bool = True) -> None:
    """A batch staged by one task and, unless ``sealed=False``, sealed by its commit."""
    with SegmentWriter(wal, batch, 0, 0) as writer:
        writer.append(pa.record_batch({"id": pa.array(range(rows), pa.int64())}))
        ref = writer.finish()
    if sealed:
        seal_batch(wal, batch, [ref])


def plan_for(wal, **options: str) -> WritePlan:
    config = parse_options({"keyspace": "ks", "table": "t", **options})
    return WritePlan(config=config, wal_root=wal.root, target=None, stored_columns=("id",))


class FakeClock:
    """``sleep`` advances ``now``; ``on_sleep`` runs after each sleep (the flusher's work)."""

    def __init__(self, on_sleep=None):
        self.now, self.sleeps, self.on_sleep = 0.0, [], on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(len(self.sleeps))


def batch_bytes(wal, batch: int) -> int:
    return tree_size(wal.batch_segments(batch))


def test_backlog_counts_every_batch_but_the_one_being_committed(wal):
    for b in (0, 1, 2):
        stage(wal, b)
    assert backlog_bytes(wal, 2) == batch_bytes(wal, 0) + batch_bytes(wal, 1)
    assert backlog_bytes(wal, 0) == batch_bytes(wal, 1) + batch_bytes(wal, 2)


def test_a_batch_larger_than_the_cap_commits_when_nothing_is_pending(wal):
    stage(wal, 0, rows=10_000)
    clock = FakeClock()
    wait_for_room(plan_for(wal, **{"wal.maxBytes": "1"}), 0, clock.sleep, clock.clock)
    assert clock.sleeps == []


def test_fail_mode_raises_at_once_naming_the_cap_and_the_backlog(wal):
    stage(wal, 0)
    stage(wal, 1)
    clock = FakeClock()
    plan = plan_for(wal, **{"wal.maxBytes": "100", "wal.backpressure": "fail"})
    with pytest.raises(WalFull) as err:
        wait_for_room(plan, 1, clock.sleep, clock.clock)
    assert clock.sleeps == []
    assert (err.value.size, err.value.cap) == (batch_bytes(wal, 0), 100)
    message = str(err.value)
    assert "wal.maxBytes=100" in message and wal.root in message
    assert f"{batch_bytes(wal, 0)} bytes" in message


def test_block_mode_holds_the_commit_until_the_flusher_drains(wal):
    stage(wal, 0)
    stage(wal, 1)
    drained_after = 3       # the flusher finishes batch 0 during the third pause

    def flusher(pauses: int) -> None:
        if pauses == drained_after:     # as the flusher does: the marker, then the files
            wal.write_flushed_through(0)
            remove_batch_files(wal, 0, keep_seal=True)

    clock = FakeClock(flusher)
    plan = plan_for(wal, **{"wal.maxBytes": "100", "wal.backpressure.timeoutSeconds": "60"})
    wait_for_room(plan, 1, clock.sleep, clock.clock)
    assert len(clock.sleeps) == drained_after
    assert backlog_bytes(wal, 1) == 0


def test_block_mode_gives_up_after_its_timeout(wal):
    stage(wal, 0)
    stage(wal, 1)
    clock = FakeClock()
    plan = plan_for(wal, **{"wal.maxBytes": "100", "wal.backpressure.timeoutSeconds": "5"})
    with pytest.raises(WalFull) as err:
        wait_for_room(plan, 1, clock.sleep, clock.clock)
    assert sum(clock.sleeps) == pytest.approx(5.0)
    assert err.value.waited_s == pytest.approx(5.0)
    assert "waited 5s" in str(err.value)


def test_under_the_cap_nothing_waits(wal):
    stage(wal, 0)
    stage(wal, 1)
    clock = FakeClock()
    wait_for_room(plan_for(wal), 1, clock.sleep, clock.clock)   # default cap: 10 GiB
    assert clock.sleeps == []


def test_a_full_wal_seals_nothing_and_keeps_every_staged_byte(wal):
    """The refused batch keeps its segments (Spark re-runs it) and gets no seal; earlier
    batches are untouched."""
    stage(wal, 0)
    stage(wal, 1, sealed=False)
    before = {b: batch_bytes(wal, b) for b in (0, 1)}
    plan = plan_for(wal, **{"wal.maxBytes": "100", "wal.backpressure": "fail"})
    with pytest.raises(WalFull):
        commit_batch(plan, [], 1)
    assert wal.sealed_batch_ids() == [0]
    assert {b: batch_bytes(wal, b) for b in (0, 1)} == before


def test_the_backlog_is_what_the_seals_name_above_the_flushed_marker(wal):
    """Flushed batches (their files kept by a crash before removal) and staged files no seal
    names (an aborted batch's, a losing attempt's: never written, removed by the next drain)
    are not the backlog that wal.maxBytes caps."""
    for b in (0, 1, 2):
        stage(wal, b)
    stage(wal, 3, sealed=False)
    with SegmentWriter(wal, 2, 1, 0) as loser:      # a losing attempt's leftover
        loser.append(pa.record_batch({"id": pa.array(range(50), pa.int64())}))
        loser.finish()
    wal.write_flushed_through(0)
    sealed = {b: read_seal(wal, b).bytes for b in (1, 2)}
    assert backlog_bytes(wal, 4) == sealed[1] + sealed[2]
    assert backlog_bytes(wal, 2) == sealed[1]


def test_the_backlog_never_looks_at_a_segment_file(wal, monkeypatch):
    """Issue 32: the backlog walked and lstat-ed every staged segment file of every pending
    batch, at every commit and every second a commit was held. It reads one seal per pending
    batch (decoded once per process) and nothing under the segments folder."""
    for b in range(3):
        refs = []
        for partition in range(20):
            with SegmentWriter(wal, b, partition, 0) as writer:
                writer.append(pa.record_batch({"id": pa.array(range(10), pa.int64())}))
                refs.append(writer.finish())
        seal_batch(wal, b, refs)
    looked = []

    def counting(real):
        def call(path=".", *args, **kwargs):
            if os.fspath(path).startswith(wal.segments):
                looked.append((real.__name__, os.fspath(path)))
            return real(path, *args, **kwargs)
        return call

    for name in ("lstat", "stat", "scandir", "listdir", "walk"):
        monkeypatch.setattr(os, name, counting(getattr(os, name)))
    expected = sum(read_seal(wal, b).bytes for b in (0, 1))
    assert backlog_bytes(wal, 2) == expected
    assert looked == []
