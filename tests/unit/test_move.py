"""A stream's WAL moved between runs (``wal/move.py``, issue 31 item 2): refused while the old
WAL has committed batches to write; else the new WAL starts above the old one's last write
timestamp and skips every batch Spark committed before; a move back finds nothing missing."""

from __future__ import annotations

import pytest

from recovery.replay import Replayer
from tests.helpers.walfactory import WalFactory
from tests.unit.test_distributed_flush import WRITES, RecordingUpserter
from wal import catalog
from wal.errors import WalMoveRefused
from wal.move import follow_move
from wal.seal import next_base_timestamp, read_seal

pytestmark = pytest.mark.unit


def test_a_move_is_refused_while_the_old_wal_has_committed_batches_to_write(tmp_path):
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y") as y:
        x.flushed(0)
        x.sealed(1)                      # committed, not written (an outage)
        with pytest.raises(WalMoveRefused) as info:
            follow_move(x.wal, y.wal, str(cp))
        text = str(info.value)
        assert "batch 1 (5 rows)" in text and f"wal.path={x.root}" in text
        assert y.wal.sealed_batch_ids() == [] and y.wal.read_flushed_through() == -1


def test_the_new_wal_starts_above_the_old_ones_timestamps_and_after_its_batches(tmp_path):
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y") as y:
        for b in (0, 1, 2):
            x.flushed(b)
        last = read_seal(x.wal, 2).last_ts_us
        follow_move(x.wal, y.wal, str(cp))
        assert y.wal.read_flushed_through() == 2
        # A clock far behind: the new WAL's next batch still writes above the old one's.
        assert next_base_timestamp(y.wal, 3, clock_us=1) == last + 1
        views = catalog.describe(y.wal, None, str(cp))
        assert [(v.batch, v.action) for v in views] == [(2, catalog.NOTHING)]


def test_a_move_back_skips_what_the_other_wal_wrote_and_its_own_leftovers(tmp_path):
    """X wrote 0-1 and left an uncommitted seal of batch 2 (its run died); Y wrote 2-3; the
    query moves back to X. Before: X called batches 2-3 committed (Spark did) and either
    missing (blocked) or, for batch 2, replayed X's never-committed seal."""
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y",
                                                                     checkpoint=cp) as y:
        x.flushed(0)
        x.flushed(1)
        x.log.note_committed(1)                      # what X's flusher saw committed
        x.sealed(2, committed=False, rows=(7,))      # never committed: re-run through Y
        follow_move(x.wal, y.wal, str(cp))
        y.sealed(2)
        y.flush(2)
        # X's flusher, until the registry sees the move, must not take Spark's commits/2
        # (through Y) for X's own: its leftover seal replayed, or a missing batch.
        seen = {v.batch: v for v in catalog.describe(x.wal, x.log, str(cp))}
        assert (seen[2].state, seen[2].action) == ("moved", catalog.NOTHING)
        WRITES.clear()
        Replayer(x.wal, x.log, lambda s: RecordingUpserter(), str(cp)).run(True)
        assert WRITES == [] and x.wal.read_blocked() is None
        y.sealed(3)
        y.flush(3)
        x.close()
        follow_move(y.wal, x.wal, str(cp))
        assert x.wal.read_moved() is None and y.wal.read_moved() == (x.root, 3)
        assert x.wal.read_flushed_through() == 3
        assert read_seal(x.wal, 3).last_ts_us == read_seal(y.wal, 3).last_ts_us
        assert next_base_timestamp(x.wal, 4, clock_us=1) == read_seal(y.wal, 3).last_ts_us + 1
        WRITES.clear()
        report = Replayer(x.wal, x.log, lambda s: RecordingUpserter(), str(cp)).run(False)
        assert WRITES == [] and report.replayed == []
        assert all(v.action == catalog.NOTHING for v in catalog.describe(x.wal, x.log, str(cp)))


def test_a_move_back_to_a_wal_left_with_committed_batches_to_write_is_refused(tmp_path):
    """Left so by an earlier release (which followed a move without asking)."""
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y",
                                                                     checkpoint=cp) as y:
        x.flushed(0)
        x.sealed(1)
        x.log.note_committed(1)
        x.close()
        with pytest.raises(WalMoveRefused) as info:
            follow_move(y.wal, x.wal, str(cp))
        assert info.value.which == "new" and info.value.pending == [(1, 5)]
