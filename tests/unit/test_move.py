"""A stream's WAL moved between runs (``wal/move.py``, issue 31 item 2): refused while the old
WAL has committed batches to write; else the new WAL starts above the old one's last write
timestamp and skips every batch Spark committed before; a move back finds nothing missing."""

from __future__ import annotations

import pytest

from recovery.replay import Replayer
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import WRITES, RecordingUpserter
from wal import catalog
from wal.catalog import RecoveryAction
from wal import move as move_mod
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
        assert [(v.batch, v.action) for v in views] == [(2, RecoveryAction.NOTHING)]


def test_a_move_back_skips_what_the_other_wal_wrote_and_its_own_leftovers(tmp_path):
    """X wrote 0-1 and left an uncommitted seal of batch 2 (its run died); Y wrote 2-3; the
    query moves back to X. Before: X called batches 2-3 committed (Spark did) and either
    missing (blocked) or, for batch 2, replayed X's never-committed seal."""
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y",
                                                                     checkpoint=cp) as y:
        x.flushed(0)
        x.flushed(1)
        x.wal_log.note_committed(1)                      # what X's flusher saw committed
        x.sealed(2, committed=False, rows=(7,))      # never committed: re-run through Y
        follow_move(x.wal, y.wal, str(cp))
        y.sealed(2)
        y.flush(2)
        # X's flusher, until the registry sees the move, must not take Spark's commits/2
        # (through Y) for X's own: its leftover seal replayed, or a missing batch.
        seen = {v.batch: v for v in catalog.describe(x.wal, x.wal_log, str(cp))}
        assert (seen[2].state, seen[2].action) == ("moved", RecoveryAction.NOTHING)
        WRITES.clear()
        Replayer(x.wal, x.wal_log, lambda s: RecordingUpserter(), str(cp)).run(True)
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
        report = Replayer(x.wal, x.wal_log, lambda s: RecordingUpserter(), str(cp)).run(False)
        assert WRITES == [] and report.replayed == []
        assert all(v.action == RecoveryAction.NOTHING
                   for v in catalog.describe(x.wal, x.wal_log, str(cp)))


def test_a_move_back_to_a_wal_left_with_committed_batches_to_write_is_refused(tmp_path):
    """Left so by an earlier release (which followed a move without asking)."""
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "x", checkpoint=cp) as x, WalFactory(tmp_path / "y",
                                                                     checkpoint=cp) as y:
        x.flushed(0)
        x.sealed(1)
        x.wal_log.note_committed(1)
        x.close()
        with pytest.raises(WalMoveRefused) as info:
            follow_move(y.wal, x.wal, str(cp))
        assert info.value.which == "new" and info.value.pending == [(1, 5)]
        said = str(info.value)     # the remedy is not the move that was just refused
        assert f"'cassandra-wal recover {x.wal.location}' writes them" in said
        assert f"restart with wal.path={y.wal.location} to stay" in said
        assert f"Restart with wal.path={x.wal.location} (the sink writes them" not in said


# -- what review 7 found ------------------------------------------------------------------------
def _views(f: WalFactory) -> dict[int, catalog.BatchView]:
    from wal.log import WalLog

    with WalLog.open_writer(f.wal) as wal_log:
        return {v.batch: v for v in catalog.describe(f.wal, wal_log, f.checkpoint, True)}


@pytest.mark.parametrize("entry_seal_id", ["", "sA"], ids=["entry-of-a-release-before",
                                                           "entry-naming-its-seal"])
def test_a_move_back_over_a_dead_runs_leftover_does_not_block(tmp_path, entry_seal_id):
    """Run A entered and sealed batch 5 in w1 and died before Spark committed it; run B moved
    to w2 and committed 5 there; run C moves back to w1. The timestamp seal written at 5 had
    another id than A's entry named: "entered, not sealed", blocking a batch written long
    ago (Spark Connect: the entries name no run, so nothing told A's leftover apart)."""
    from wal.entries import record_run

    cp = tmp_path / "cp"
    w1 = WalFactory(tmp_path / "w1", checkpoint=cp)
    record_run(w1.wal, 0, "A")
    for b in range(5):
        w1.entered(b, run_id="")
        w1.flushed(b)
    w1.entered(5, run_id="", seal_id=entry_seal_id)
    w1.seal(5, [])
    w1.close()
    w2 = WalFactory(tmp_path / "w2", checkpoint=cp)
    follow_move(w1.wal, w2.wal, str(cp))            # run B: wal.path -> w2
    w2.entered(5, run_id="")
    w2.flushed(5)                                    # batch 5 committed and written via w2
    w2.close()
    follow_move(w2.wal, w1.wal, str(cp))            # run C: wal.path back to w1
    assert _views(w1)[5].action != RecoveryAction.ERROR


@pytest.mark.parametrize("legacy_pointer", [False, True], ids=["this-release", "upgraded"])
def test_a_foreach_batch_wal_moved_keeps_its_timestamps_and_is_told(tmp_path, legacy_pointer):
    """A foreachBatch query upgraded from the release before one WAL per table has the data
    source's pointer and the table's slot naming <cp>/cassandra_wal: a wal.path change for the
    table was taken for leaving another table's WAL (no timestamp seal, no refusal, not told)."""
    from sinks.worker.plan import _follow_a_move
    from wal.layout import WalDir
    from wal.pointer import write_pointer
    from wal.seal import last_written_ts_us

    cp = tmp_path / "cp"
    shared = cp / "cassandra_wal"
    old = WalFactory(shared, checkpoint=cp)
    for b in range(3):
        old.entered(b, run_id="r1")
        old.flushed(b)
    old.close()
    if legacy_pointer:
        write_pointer(str(cp), str(shared))             # the earlier release's pointer
    write_pointer(str(cp), str(shared), ("ks", "t"))    # this release's slot for ks.t
    new = WalDir(str(tmp_path / "elsewhere")).create()
    _follow_a_move(new, str(cp), ("ks", "t"))           # the user sets wal.path for ks.t
    last = last_written_ts_us(old.wal, read_seal(old.wal, 2))
    assert next_base_timestamp(new, 3, clock_us=last - 60_000_000) > last, "no timestamp seal"
    assert new.read_flushed_through() == 2
    assert WalDir(str(shared)).read_moved() is not None, "the old WAL was not told"


def test_a_table_leaving_a_wal_another_table_writes_starts_above_its_timestamps(tmp_path):
    """Two tables' slots name one WAL (each run called one writer); table u gets a WAL of its
    own: the shared WAL stays t's (not told, not checked), and u's new WAL still starts above
    its timestamps: u's earlier rows went through it."""
    from sinks.worker.plan import _follow_a_move
    from wal.layout import WalDir
    from wal.pointer import write_pointer

    cp = tmp_path / "cp"
    shared = tmp_path / "shared"
    old = WalFactory(shared, checkpoint=cp)
    for b in range(2):
        old.flushed(b)
    old.close()
    write_pointer(str(cp), str(shared), ("ks", "t"))
    write_pointer(str(cp), str(shared), ("ks", "u"))
    new = WalDir(str(tmp_path / "own")).create()
    _follow_a_move(new, str(cp), ("ks", "u"))
    assert WalDir(str(shared)).read_moved() is None
    last = read_seal(old.wal, 1).last_ts_us
    assert next_base_timestamp(new, 2, clock_us=0) > last


# -- review 31: a move cut short (a kill, a full disk) ------------------------------------------
class Killed(BaseException):
    """kill -9 at this point: nothing after it runs."""


def _moved_away_and_written_elsewhere(tmp_path):
    """X wrote 0-1 and left a never-committed seal of batch 2 (7 rows); the stream moved to Y,
    which wrote 2-3; X's flusher (or 'cassandra-wal recover X') ran after the move and noted
    Spark's commits in X's log (m/committed_through = 2), as it does."""
    cp = tmp_path / "cp"
    x = WalFactory(tmp_path / "x", checkpoint=cp)
    y = WalFactory(tmp_path / "y", checkpoint=cp)
    x.flushed(0)
    x.flushed(1)
    x.wal_log.note_committed(1)
    x.sealed(2, committed=False, rows=(7,))          # never committed: re-run through Y
    follow_move(x.wal, y.wal, str(cp))
    y.sealed(2)
    y.flush(2)
    Replayer(x.wal, x.wal_log, lambda s: RecordingUpserter(), str(cp)).run(True)
    assert x.wal_log.committed_through() == 2             # noted from Spark's commits/2 (via Y)
    y.sealed(3)
    y.flush(3)
    x.close()
    y.close()
    return cp, x, y


def _batch_4_through_y_is_written(tmp_path, cp) -> None:
    """The user is back on wal.path=Y: batch 4, sealed there and committed by Spark, is
    written (not 'moved')."""
    y4 = WalFactory(tmp_path / "y", checkpoint=cp)
    y4.sealed(4)                                     # committed by Spark through Y
    WRITES.clear()
    report = Replayer(y4.wal, y4.wal_log, lambda s: RecordingUpserter(), str(cp)).run(True)
    views = {v.batch: v for v in catalog.describe(y4.wal, y4.wal_log, str(cp))}
    y4.close()
    assert report.replayed == [4] and views[4].state == "flushed", (
        f"batch 4, committed through Y, is {views[4].state}/{views[4].action}: "
        f"{views[4].detail}")


def test_a_move_that_failed_half_way_then_a_revert_never_writes_later_batches(
        tmp_path, monkeypatch):
    """Review 31, finding 2. The stream runs on Y (X before it) and is restarted with
    wal.path=X; the move fails writing X's timestamp seal (X's disk full, or kill -9): the start
    fails before the checkpoint's pointer names X. The user goes back to wal.path=Y (where
    the pointer still is: no move to follow). Before, Y had been told first (moved.json:
    moved to X after batch 3) and stayed so: every batch Spark committed through Y from then
    on was 'moved', never written."""
    import errno

    cp, x, y = _moved_away_and_written_elsewhere(tmp_path)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(move_mod, "write_seal", full)
        with pytest.raises(OSError):
            follow_move(y.wal, x.wal, str(cp))
    _batch_4_through_y_is_written(tmp_path, cp)


def test_a_move_killed_after_telling_the_old_wal_then_a_revert_clears_its_moved_json(tmp_path):
    """The same, killed after the old WAL Y was told (its moved.json) and before the pointer
    names X: the next batch through Y (the pointer names Y) clears the moved.json the pointer
    does not confirm, before it stages."""
    from sinks.worker.plan import _follow_a_move
    from wal.pointer import write_pointer

    cp, x, y = _moved_away_and_written_elsewhere(tmp_path)
    write_pointer(str(cp), y.wal.location)
    follow_move(y.wal, x.wal, str(cp))               # killed before write_pointer names X
    assert y.wal.read_moved() == (x.wal.location, 3)
    _follow_a_move(y.wal, str(cp), None)             # back to wal.path=Y: its next batch
    assert y.wal.read_moved() is None
    _batch_4_through_y_is_written(tmp_path, cp)


def test_clearing_moved_json_syncs_the_folder(tmp_path, monkeypatch):
    """A moved.json deleted and brought back by a crash would hide the WAL's next batches."""
    from wal import layout

    synced = []
    with WalFactory(tmp_path / "x") as x:
        x.wal.write_moved(("elsewhere", 3))
        monkeypatch.setattr(layout, "fsync_dir", synced.append)
        x.wal.write_moved(None)
    assert x.wal.read_moved() is None and synced == [x.wal.root]


def _kill_at(m, step: str, x: WalFactory, y: WalFactory) -> None:
    """kill -9 of a move from Y back to X at ``step``."""
    from wal.layout import WalDir

    def killed(*_a, **_k):
        raise Killed()

    if step in ("leftovers", "timestamp_seal"):
        m.setattr(move_mod, {"leftovers": "entered_batch_ids",
                             "timestamp_seal": "write_seal"}[step], killed)
        return
    write_moved, write_flushed = WalDir.write_moved, WalDir.write_flushed_through

    def moved_then_killed(wal, moved):
        write_moved(wal, moved)
        if (step == "told" and wal.root == y.root) or (step == "cleared" and wal.root == x.root):
            raise Killed()

    def flushed_killed(wal, batch):
        if wal.root == x.root:
            raise Killed()
        write_flushed(wal, batch)

    m.setattr(WalDir, "write_moved", moved_then_killed)
    if step == "flushed_through":
        m.setattr(WalDir, "write_flushed_through", flushed_killed)


KILL_STEPS = ["leftovers", "timestamp_seal", "flushed_through", "told", "cleared"]


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_move_back_killed_at_any_step_is_followed_again_on_restart(tmp_path, monkeypatch,
                                                                       step):
    """Review 31, finding 1. The move back to X is killed at ``step`` ('cleared': right
    after X's moved.json is removed, the reviewer's case) and the restart follows the same
    move again. Before, X's moved.json went first: the restart read X's last batch while
    current from m/committed_through (2, noted after the move), took X's never-committed seal
    of batch 2 for a committed batch to write and refused the move ('cassandra-wal recover X
    writes them') on every restart. The restart now ends where an uninterrupted move does."""
    cp, x, y = _moved_away_and_written_elsewhere(tmp_path)
    with monkeypatch.context() as m:
        _kill_at(m, step, x, y)
        with pytest.raises(Killed):
            follow_move(y.wal, x.wal, str(cp))
    follow_move(y.wal, x.wal, str(cp))                      # the restart: same wal.path
    assert x.wal.read_moved() is None and y.wal.read_moved() == (x.root, 3)
    assert x.wal.read_flushed_through() == 3 and 2 not in x.wal.sealed_batch_ids()
    assert next_base_timestamp(x.wal, 4, clock_us=1) == read_seal(y.wal, 3).last_ts_us + 1
    assert all(v.action == RecoveryAction.NOTHING
               for v in catalog.describe_read_only(x.wal, str(cp)))


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_move_back_killed_at_any_step_leaves_no_leftover_to_replay(tmp_path, monkeypatch,
                                                                       step):
    """Review 31, finding 1: what X holds after the kill, as 'cassandra-wal recover X' (the
    remedy the refusal named) would read it: X's leftover seal of batch 2, 7 rows of an
    execution Spark never committed, is never one to replay."""
    cp, x, y = _moved_away_and_written_elsewhere(tmp_path)
    with monkeypatch.context() as m:
        _kill_at(m, step, x, y)
        with pytest.raises(Killed):
            follow_move(y.wal, x.wal, str(cp))
    views = {v.batch: v for v in catalog.describe_read_only(x.wal, str(cp))}
    assert all(v.action != RecoveryAction.REPLAY for v in views.values()), (
        f"X holds {[(b, v.state, v.action) for b, v in views.items()]} after the kill")


@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_move_back_killed_at_any_step_then_a_revert_writes_the_old_wals_batches(
        tmp_path, monkeypatch, step):
    """The user goes back to wal.path=Y instead (the pointer still names it): Y's next
    batches are written, and a move to X later is followed."""
    from sinks.worker.plan import _follow_a_move
    from wal.pointer import write_pointer

    cp, x, y = _moved_away_and_written_elsewhere(tmp_path)
    write_pointer(str(cp), y.wal.location)
    with monkeypatch.context() as m:
        _kill_at(m, step, x, y)
        with pytest.raises(Killed):
            follow_move(y.wal, x.wal, str(cp))
    _follow_a_move(y.wal, str(cp), None)             # back to wal.path=Y: its next batch
    _batch_4_through_y_is_written(tmp_path, cp)
    follow_move(y.wal, x.wal, str(cp))               # later, the move to X once more
    assert x.wal.read_flushed_through() == 4 and y.wal.read_moved() == (x.root, 4)
    assert all(v.action == RecoveryAction.NOTHING
               for v in catalog.describe_read_only(x.wal, str(cp)))
