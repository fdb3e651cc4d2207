"""A stream's WAL moved between runs (``wal.path`` changed, set or unset): the old WAL is left
only once it has nothing left to write, and the new one starts where the old one ended.

A WAL decides by batch id, and batch ids are the query's: after a move, the batches the old WAL
wrote are committed in the checkpoint but absent from the new one, and a move back finds the
batches the other WAL wrote missing. Three things make a move safe:

* **Refused while the old WAL holds committed batches not written yet** (an outage, a block):
  the new WAL would go on without them, the old one no longer flushed. The user restarts with
  the old ``wal.path`` until it is drained.
* **The old WAL is told** (``moved.json``: where to, after which batch): a flusher of it still
  running until the registry sees the move takes no later batch for one of its own.
* **The new WAL skips what came before**: its ``flushed_through`` is raised to the highest
  batch Spark committed, so batches written through the old WAL, or leftovers of its own from
  before a move back (seals of executions Spark never committed, whose ids it committed later
  through the other WAL), are never taken for its own to write. A move back is refused only
  for what the WAL was left holding when it was current (its ``m/committed_through``).
* **Timestamps go on rising**: a seal of no segment at that batch, its base at the old WAL's
  last write timestamp (the *timestamp seal*), is what the new WAL's next seal starts above
  (:func:`wal.seal.next_base_timestamp`), whatever the clock does.

Crash-safe: the checkpoint's pointer naming the new WAL (written after this, by the caller)
is what makes the move. Before it, every step can be cut short (a kill, a full disk) and run
again, or the user can go back to the old ``wal.path``: the new WAL's own ``moved.json`` goes
last (until then it says, on every try, which of its batches were its own), and the old WAL is
told after the new one is ready; a ``moved.json`` on the WAL the pointer still names is of a
move that never happened, cleared by that WAL's next batch (:func:`confirm_current`).
"""

from __future__ import annotations

from . import catalog
from .catalog import RecoveryAction
from .entries import entered_batch_ids
from .errors import WalMoveRefused
from .layout import WalDir
from .log import WalLog
from .recovery_policy import RecoveryPolicy
from .retention import remove_batch_files
from .seal import COMMIT_POINT_CHECKPOINT, Seal, last_written_ts_us, read_seal, write_seal


def follow_move(old: WalDir, new: WalDir, checkpoint: str, leave_old: bool = True) -> None:
    """Make ``new`` the stream's WAL in place of ``old`` (both this query's), or raise
    :class:`~wal.errors.WalMoveRefused` naming what ``old`` (or ``new``) still has to write.
    Run before the first batch goes through ``new``. ``leave_old`` False: ``old`` stays
    another table's WAL (a foreachBatch function's tables that shared it): it is neither
    checked nor told, and ``new`` still starts above its timestamps."""
    for wal in (old, new):
        if wal.remote:      # what the store holds, as the flusher would see it
            wal.remote.pull(wal.root, segments=False)
    # Read once, before anything changes: new's moved.json goes last (a re-run after a kill
    # at any step reads the same value; see the module's "Crash-safe").
    was_current_through = _last_batch_while_current(new)
    for wal, which in ((old, "old"), (new, "new")):
        if wal is old and not leave_old:
            continue
        pending = [v for v in catalog.describe_read_only(wal, checkpoint,
                                                     RecoveryPolicy.QUERY_FLUSHER)
                   if v.action in (RecoveryAction.REPLAY, RecoveryAction.ERROR)
                   and (wal is old or v.batch <= was_current_through)]
        if pending:
            raise WalMoveRefused(old.location, new.location, which,
                                 [(v.batch, v.rows - v.flushed_rows) for v in pending])
    highest, _ = catalog.committed_through(None, checkpoint)
    if highest >= 0 and new.read_flushed_through() < highest:
        _start_above(old, new, highest, was_current_through)
    if leave_old:
        # The old WAL holds nothing after this batch: a flusher of it still running until the
        # registry sees the move must take no later batch, which Spark commits through the
        # new WAL, for one of its own (missing, or a leftover seal to replay). Told only once
        # the new WAL is ready: a move failing before (a full disk) leaves the old WAL as it
        # was, and one failing after, before the pointer names the new WAL, leaves a moved.json
        # the pointer does not confirm, which the next batch through it clears
        # (:func:`confirm_current`).
        old.write_moved((new.location, highest))
    new.write_moved(None)                  # a move back: the stream's WAL again


def _start_above(old: WalDir, new: WalDir, highest: int, was_current_through: int) -> None:
    """The new WAL skips every batch through ``highest`` and starts above the old one's
    timestamps. Each step can run again after a kill: new's ``moved.json`` still says what
    it said (a batch after it is ``moved``, never written), and ``flushed_through`` is raised
    last (once at ``highest``, the steps are done)."""
    # What the new WAL holds of batches after it was last current, up to the last one Spark
    # committed, is a leftover of executions Spark never committed there (it committed them
    # through the other WAL): gone, before the timestamp seal is written over one of them (or
    # a timestamp seal a killed earlier try wrote: written again below).
    for batch in sorted(set(new.sealed_batch_ids()) | set(new.staged_batch_ids())
                        | set(entered_batch_ids(new))):
        if was_current_through < batch <= highest:
            remove_batch_files(new, batch)
    newest = max((b for b in old.sealed_batch_ids() if b <= highest), default=None)
    last = read_seal(old, newest) if newest is not None else None
    if last is not None:
        # The timestamp seal: a seal of no rows at the last batch Spark committed, at the old
        # WAL's last write timestamp (it writes nothing): the next seal starts above it.
        write_seal(new, Seal(batch=highest, segments=(), base_ts_us=last_written_ts_us(old, last),
                             query_id=last.query_id, commit_point=COMMIT_POINT_CHECKPOINT))
    new.write_flushed_through(highest)


def confirm_current(wal: WalDir) -> None:
    """``wal`` is the stream's WAL and the checkpoint's pointer names it: a ``moved.json`` it
    holds is of a move that failed before the pointer named the WAL moved to (a full disk, a
    kill; the user went back to this ``wal.path``). No batch went through the other WAL, and
    every later one goes through this one: cleared, before the batch is staged, or its
    catalog would call it ``moved`` and it would never be written."""
    if wal.read_moved() is not None:
        wal.write_moved(None)


def _last_batch_while_current(wal: WalDir) -> int:
    """The last batch Spark committed while ``wal`` was the stream's WAL: when the stream
    moved away from it (``moved.json``), or else (a move an earlier release followed) as its
    flusher recorded it (``m/committed_through``). A WAL moved back to may hold a seal of a
    batch Spark never committed then, whose id Spark committed later through another WAL:
    that seal is a leftover, never its to write."""
    moved = wal.read_moved()
    if moved is not None:
        return moved[1]
    reader = WalLog.open_reader(wal)
    if reader is None:
        return -1
    try:
        return reader.committed_through()
    finally:
        reader.close()
