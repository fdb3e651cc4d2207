"""One view of every batch a WAL knows, joining the files (segments, seals), the RocksDB log
and Spark's checkpoint, with the action recovery would take. Used by ``cassandra-wal inspect``
and by recovery's planner, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

from . import checkpoint as ckpt
from .entries import entered_batch_ids, entries_since, read_entry, read_runs, run_of
from .errors import WalCorrupted
from .layout import WalDir
from .log import BatchRecord, WalLog
from .recovery_policy import RecoveryPolicy
from .seal import COMMIT_POINT_SEAL, Seal, now_us, read_seal
from .states import BatchState

class RecoveryAction(str, Enum):
    """What recovery does with a batch (docs/guarantees.md, "Recovery"). The value is the word
    ``cassandra-wal inspect`` and ``recover --dry-run`` show (``--json`` too): never changed."""

    NOTHING = "nothing"     # flushed, discarded or never ours: retention will remove it
    REPLAY = "replay"       # committed, not fully flushed: write it (again) with its timestamps
    DISCARD = "discard"     # never committed by Spark: drop it, Spark re-runs the batch
    WAIT = "wait"           # sealed, commit not decided yet (a running query), or no checkpoint
    #: Recovery cannot go past this batch, and stops at it with an error
    #: (``recovery.replay.RecoveryBlocked``, the sink blocked): committed by Spark yet its
    #: seal is missing or corrupted, so it can be neither written nor dropped. The detail says
    #: why; docs/runbook.md says what to do.
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


class ViewState(str, Enum):
    """The state :func:`describe` gives a batch, from the log, the files and the checkpoint
    together: the log's own states (:class:`~wal.states.BatchState`, by the same words) and
    what only the join tells. The value is the word ``inspect`` shows (``--json`` too), and
    ``repair`` records in its plan: never changed."""

    STAGED = "staged"           # segments and no seal
    ENTERED = "entered"         # a foreachBatch writer's entry and no seal (wal.entries)
    SEALED = "sealed"
    FLUSHING = "flushing"
    FLUSHED = "flushed"
    DISCARDED = "discarded"
    #: Spark committed it and this WAL's foreachBatch writer was never called for it
    #: (:mod:`wal.entries`): nothing to write; the flusher moves ``flushed_through`` past it.
    SKIPPED = "skipped"
    MOVED = "moved"             # the stream's WAL moved elsewhere before this batch
    MISSING = "missing"         # Spark committed it and the WAL holds nothing of it

    @classmethod
    def of(cls, state: BatchState) -> ViewState:
        """The view of a batch the log records in ``state``: the log's word."""
        return cls(state.value)

    def __str__(self) -> str:
        return self.value


#: Detail of segments left by a task attempt that finished after its batch was done.
LATE_ATTEMPT = "leftover of a late task attempt of a finished batch"
#: Detail of a batch the current run committed without entering this WAL's writer, over what
#: an earlier run left of it (a seal, an entry, segments: never committed, now garbage).
LEFT_BY_ANOTHER_RUN = ("the foreachBatch writer was not called for it by the run that "
                       "committed it: nothing to write (what an earlier run left is removed)")
#: Detail of a batch whose foreachBatch writer was called but sealed nothing, and which Spark
#: committed all the same.
ENTERED_NOT_SEALED = (
    "the foreachBatch writer was called for it and sealed nothing, yet Spark committed the "
    "batch: the function went on after the writer failed (did it catch the writer's "
    "exception?), so its rows for this table were never staged")


@dataclass(frozen=True)
class BatchView:
    batch: int
    state: ViewState
    partitions: int
    rows: int
    bytes: int
    age_s: float
    flushed_rows: int
    committed: bool | None         # Spark's commits/N exists (None: checkpoint unknown)
    action: RecoveryAction
    detail: str = ""
    seal: Seal | None = None
    record: BatchRecord | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("seal"), d.pop("record")
        return d


def _seal_or_error(wal: WalDir, batch: int) -> tuple[Seal | None, str]:
    try:
        return read_seal(wal, batch), ""
    except WalCorrupted as exc:
        return None, str(exc)


def committed_through(wal_log: WalLog | None,
                      checkpoint: str | None) -> tuple[int, list[int] | None]:
    """The highest batch id known to be committed, and the ``commits/N`` ids the checkpoint
    lists (None: the checkpoint was not read).

    Spark commits strictly in order and purges old ``commits/N`` files (it keeps
    ``spark.sql.streaming.minBatchesToRetain`` of them), so a batch at or below the highest
    ``commits/N`` is committed whether its own file is still there or not. The log keeps the
    highest it has seen (:meth:`~wal.log.WalLog.note_committed`), for when the checkpoint is not
    at hand. A checkpoint folder that does not exist (a mistyped path) is not read: it must not
    make committed batches look uncommitted.
    """
    recorded = wal_log.committed_through() if wal_log else -1
    if not checkpoint or not ckpt.exists(checkpoint):
        return recorded, None
    listed = ckpt.committed_batches(checkpoint)
    return max(max(listed, default=-1), recorded), listed


def describe_read_only(wal: WalDir, checkpoint: str | None,
                       policy: RecoveryPolicy = RecoveryPolicy.QUERY_START) -> list[BatchView]:
    """:func:`describe` through a read-only view of the log, beside a live writer if any."""
    reader = WalLog.open_reader(wal)
    try:
        return describe(wal, reader, checkpoint, policy)
    finally:
        if reader is not None:
            reader.close()


def describe(wal: WalDir, wal_log: WalLog | None, checkpoint: str | None,
             policy: RecoveryPolicy = RecoveryPolicy.QUERY_START,
             committed: tuple[int, list[int] | None] | None = None,
             current_run: tuple[str, int] | None = None) -> list[BatchView]:
    """Every batch, in id order, with what recovery under ``policy`` does with it (the
    default: what the query's next start does). ``policy`` decides only whether a batch Spark
    never committed is discarded or waits (:class:`~wal.recovery_policy.RecoveryPolicy`).
    ``committed``: :func:`committed_through` as read *before* the seals were (a WAL on a store
    pulls its seals after reading the checkpoint: a seal pulled then is the one Spark
    committed, never an earlier run's that ``commits/N`` appeared beside meanwhile).
    ``current_run``: (Spark's runId, the first batch it runs) of the query's run the caller
    flushes for, if not recorded yet (``wal.entries.record_run``): a batch a run committed
    whose foreachBatch writer that run did not enter was not written to this table by it,
    whatever an earlier run left of that batch (:func:`_left_by_another_run`)."""
    # Spark's commits first, the files after: Spark commits a batch only once its writer is
    # done with it, so every file of a batch read as committed is listed below (a batch with
    # none is one this WAL's foreachBatch writer was never called for: SKIPPED).
    highest, listed = committed if committed is not None else \
        committed_through(wal_log, checkpoint)
    records = {r.batch: r for r in (wal_log.records() if wal_log else [])}
    flushed_through = max(wal_log.flushed_through() if wal_log else -1, wal.read_flushed_through())
    staged_ids = set(wal.staged_batch_ids())
    sealed_ids = set(wal.sealed_batch_ids())
    entered_ids = set(entered_batch_ids(wal))
    since = entries_since(wal)
    ids = set(records) | sealed_ids | staged_ids | entered_ids
    moved = wal.read_moved()
    left_after = moved[1] if moved is not None else None
    runs = read_runs(wal) if since is not None else []
    if current_run is not None:     # the newest run: its first batch is its, whoever else's
        runs = sorted(dict(runs + [(current_run[1], current_run[0])]).items())
    if listed and (ids or since is not None):
        # A committed batch the WAL should hold but does not. Batches below the first one the
        # WAL knows were written before this WAL existed (or by another sink), and batches
        # after the stream moved away from it went through another WAL: not ours.
        first = min(ids | ({since} if since is not None else set()))
        ids |= {b for b in listed if b > flushed_through and b >= first
                and (left_after is None or b <= left_after)}
    now = now_us()
    views = []
    for batch in sorted(ids):
        record = records.get(batch)
        if record is not None and record.state is BatchState.DISCARDED and (
                batch in sealed_ids or batch in entered_ids):
            # Discarding removes the batch's files, and Spark then re-runs the batch with the
            # same id: a seal or an entry found now is that re-run's (or the leftover of a
            # discard cut short by a crash, never committed). Decide from it as for a batch
            # the log has not seen: replay once committed (DISCARDED -> SEALED), a re-run's
            # writer that entered and sealed nothing is a loss, else wait or discard.
            record = None
        # None: not known (no checkpoint given, and beyond what the log saw committed).
        is_committed = True if batch <= highest else (False if listed is not None else None)
        seal, seal_error = (record.seal, "") if record and record.seal else _seal_or_error(wal, batch)
        if record is None and seal is not None and batch in entered_ids \
                and batch > flushed_through:
            entry = read_entry(wal, batch)
            if entry is not None and not entry.sealed_by(seal):
                seal = None     # an earlier call's (a run that died): this call sealed nothing
        if seal is not None and seal.commit_point == COMMIT_POINT_SEAL:
            is_committed = True
        segs = seal.segments if seal else ()
        rows = seal.rows if seal else 0
        size = seal.bytes if seal else 0
        born = seal.sealed_at_us if seal else (record.updated_at_us if record else now)
        base = dict(batch=batch, partitions=len({s.partition for s in segs}), rows=rows,
                    bytes=size, age_s=max(0.0, (now - born) / 1e6),
                    flushed_rows=record.flushed_rows if record else 0, committed=is_committed,
                    seal=seal, record=record)
        if left_after is not None and batch > left_after and (
                record is None or record.state is not BatchState.FLUSHED):
            # The stream moved away from this WAL after batch left_after: anything of a later
            # batch here (a seal of a run Spark never committed, whose id it committed later
            # through the other WAL) was never committed through this one: never written.
            views.append(BatchView(state=ViewState.MOVED, action=RecoveryAction.NOTHING,
                                   detail=f"the stream's WAL moved to {moved[0]}", **base))
        elif (since is not None and is_committed
              and (record is None or record.state is BatchState.DISCARDED)
              and _left_by_another_run(wal, batch, run_of(runs, batch), seal is not None,
                                       since)):
            views.append(BatchView(state=ViewState.SKIPPED, action=RecoveryAction.NOTHING,
                                   detail=LEFT_BY_ANOTHER_RUN, **base))
        elif record is not None and record.state in (BatchState.FLUSHED, BatchState.DISCARDED):
            views.append(BatchView(state=ViewState.of(record.state),
                                   action=RecoveryAction.NOTHING,
                                   detail=record.reason, **base))
        elif record is not None:  # SEALED or FLUSHING in the log: committed and final
            views.append(BatchView(state=ViewState.of(record.state),
                                   action=RecoveryAction.REPLAY,
                                   detail=_resume_detail(record), **base))
        elif seal_error:
            views.append(BatchView(state=ViewState.SEALED, action=RecoveryAction.ERROR,
                                   detail=seal_error, **base))
        elif seal is not None and batch <= flushed_through:
            # Flushed, then forgotten by retention, which keeps the newest seal (its segments
            # are gone): the timestamps of later batches are chosen above its last one.
            views.append(BatchView(state=ViewState.FLUSHED, action=RecoveryAction.NOTHING,
                                   detail="flushed; only its seal is kept", **base))
        elif seal is not None:
            if is_committed:
                action, detail = RecoveryAction.REPLAY, ""
            elif is_committed is None:
                action, detail = RecoveryAction.WAIT, "checkpoint unknown: pass --checkpoint"
            elif policy.discards_uncommitted:
                action, detail = (RecoveryAction.DISCARD,
                                  "Spark never committed it; it re-runs the batch")
            else:
                action, detail = RecoveryAction.WAIT, "waiting for Spark to commit the batch"
            views.append(BatchView(state=ViewState.SEALED, action=action, detail=detail, **base))
        elif batch in staged_ids and batch <= flushed_through:
            # Segments without a seal of a batch older than the newest flushed one: every such
            # batch was flushed (or discarded) in order, so these are a late task attempt's
            # (a zombie or speculative task finishing after its batch was done): garbage.
            views.append(BatchView(state=ViewState.STAGED, action=RecoveryAction.NOTHING,
                                   detail=LATE_ATTEMPT, **base))
        elif batch in staged_ids or batch in entered_ids:
            state = ViewState.STAGED if batch in staged_ids else ViewState.ENTERED
            if is_committed:
                detail = ("Spark committed it but it has no seal" if batch not in entered_ids
                          else ENTERED_NOT_SEALED)
                views.append(BatchView(state=state, action=RecoveryAction.ERROR, detail=detail,
                                       **base))
            else:
                action = (RecoveryAction.DISCARD if policy.discards_uncommitted
                          else RecoveryAction.WAIT)
                views.append(BatchView(state=state, action=action, detail="not sealed", **base))
        elif since is not None and batch >= since and is_committed:
            # No entry: the foreachBatch writer of this WAL was never called for the batch.
            views.append(BatchView(state=ViewState.SKIPPED, action=RecoveryAction.NOTHING,
                                   detail="the foreachBatch writer was not called for it: "
                                          "nothing to write", **base))
        else:  # committed by Spark, newer than anything flushed, and nothing in the WAL
            views.append(BatchView(state=ViewState.MISSING, action=RecoveryAction.ERROR,
                                   detail="Spark committed it but the WAL holds no seal", **base))
    return views


def _left_by_another_run(wal: WalDir, batch: int, run_id: str | None, sealed: bool,
                         since: int) -> bool:
    """Whether the files of committed ``batch`` in a WAL that keeps entries are not a call of
    its writer by ``run_id``, the run that committed it: segments with neither entry nor seal
    (every call records its entry before it stages: a zombie task's, or a late one of a
    checkpoint deleted since), a seal with no entry from ``since`` on, or an entry of another
    run. An unknown run, or an entry that names none (Spark Connect's server-side function
    cannot read it), decides nothing else."""
    entry = read_entry(wal, batch)
    if entry is None and not sealed:
        return batch >= since       # before since: a release without entries staged it
    if not run_id:
        return False
    if entry is None:
        return batch >= since
    return bool(entry.run_id) and entry.run_id != run_id


def _resume_detail(record) -> str:
    """Where a replay of ``record`` starts: the acknowledged prefix's row, and the segments
    acknowledged beyond it, which it skips."""
    beyond = sum(rows for _, rows in record.acknowledged)
    detail = f"resume at row {record.flushed_rows - beyond}"
    if record.acknowledged:
        detail += (f", {len(record.acknowledged)} later segment(s) ({beyond} rows) "
                   f"acknowledged already")
    return detail
