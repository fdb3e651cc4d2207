"""Repair: have Spark run batch K and every later one again from the source, and make the WAL
ready for it (``cassandra-wal repair``; etcd's ``wal/repair.go`` is the model: it keeps what it
removes, fsyncs, and has tests of its own).

What it is for: a batch Spark committed whose rows the WAL can no longer give (a damaged
segment or seal with no good copy; a batch a ``foreachBatch`` function lost). Its rows must
come from the source again, and so must those of every later batch, to keep the order. Two
things make that work, and the runbook's old manual step (delete ``commits/K..``) did neither:

* Spark re-plans from its **offsets log**: on restart it re-runs only its newest
  ``offsets/N`` when ``commits/`` lags, and logs "Batch completion log latest batch id is
  K-1, which is not trailing batchid N by one" (measured on 4.3.0): batches K..N-1 would
  never run again. So ``offsets/K..`` go too (with ``commits/K..`` and their ``.crc`` files),
  and Spark plans a new batch K from the end offsets of K-1. The source hands back every row
  of the old K..N then, in as many batches as it likes (a file source: in one).
* The WAL's own records: ``m/committed_through`` keeps the highest batch the log saw
  committed, so a re-run of K would count as committed as soon as it is sealed, and be written
  before Spark commits it; ``m/flushed_through`` (and the shared ``flushed_through`` file)
  would make it look written, and be skipped. Both are lowered to K-1, and every batch from K
  on leaves the log and its files leave the WAL.

A ``foreachBatch`` function writing several tables has one WAL a table and one checkpoint:
Spark re-runs the batches for every table, so every WAL the checkpoint's pointer files name is
repaired with the one named.

What it refuses, before it changes anything (:class:`~wal.errors.RepairRefused`): a WAL or a
checkpoint on a store (not supported yet), a checkpoint with ``state/`` (a stateful query: its
state store versions would not match the re-run), K above the newest ``offsets/N`` or one whose
K-1 Spark no longer keeps, and batches from K on that are already in Cassandra in whole or part
(in any of the WALs) unless ``rewrite`` accepts writing them again with new timestamps.

Crash safety: every log is fenced first (``m/repair``, :meth:`~wal.log.WalLog.begin_repair`):
until its last step, no flusher, recovery or ``recover`` opens it
(:class:`~wal.errors.WalRepairing`), and running the repair again finishes it. Then the WALs'
files of batches K.. and Spark's ``commits/K..``, ``offsets/K..`` are *moved* into the kept
copy (each move fsynced at both ends), and for each WAL the shared ``flushed_through`` (and
a WAL the stream moved away from: its ``moved.json``'s last batch) is lowered and one synced
write rewinds its log and lifts its fence. The kept copy
(``<WAL_DIR>/repair-<UTC time>/`` unless given) holds ``repair.json`` (what was planned and
removed, the logs' records of those batches) and the files under ``wal/`` (the WAL named),
``wals/<folder name>/`` (the others) and ``checkpoint/``, by their paths there.

Local WAL and local checkpoint only; the query must be stopped (the repair takes the WAL's
writer lock, as ``recover`` does; a WAL of the checkpoint with no target recorded yet may be a
live run's whose flusher, and lock, has not started: refused unless ``force``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field

from . import binding, catalog

from .catalog import RecoveryAction, ViewState
from . import checkpoint as ckpt
from . import clock
from . import format as fmt
from .amendments import amended_batch_ids
from .entries import entered_batch_ids, entries_since, read_runs, run_path
from .errors import RepairRefused, WalBoundElsewhere
from .files import atomic_write, fsync_dir, make_private_dirs
from .layout import WalDir
from .log import WalLog
from .pointer import pointed_wals
from .schemes import is_local, is_remote
from .seal import last_written_ts_us, now_us

KEPT_WAL = "wal"                     # the kept copy's folder of the WAL's files
KEPT_CHECKPOINT = "checkpoint"       # and of Spark's
STATE = "state"                      # a stateful query's state store, in its checkpoint
#: Spark's checksummed filesystem writes ``N`` and ``.N.crc`` beside it.
_CHECKPOINT_NAME = re.compile(r"^(?:\.(\d+)\.crc|(\d+))$")

REPLAYABLE = ("Spark plans batch {k} again from the end offsets of batch {prev} and reads the "
              "source again from there: the source must still hold those rows (files kept, "
              "Kafka retention); it may hand them back in fewer, larger batches")
REWRITE_MEANS = ("writing them again gives their rows new write timestamps: a later write of "
                 "the same keys by anyone else is overwritten, a deleted row comes back, TTLs "
                 "start again, and a non-frozen list column taken at least once "
                 "(wal.lists.atLeastOnce) gets its elements again")


@dataclass(frozen=True)
class WalPlan:
    """What a repair does to one WAL of the checkpoint."""

    wal: str                          # WAL_DIR
    kept_as: str                      # its folder in the kept copy
    batches: tuple[dict, ...]         # every batch >= K it knows: batch, state, rows, ...
    written: tuple[tuple[int, int], ...]   # runs (first, last) of batches >= K in Cassandra
    wal_files: tuple[str, ...]        # moved out of WAL_DIR (relative paths)
    markers: dict = field(default_factory=dict)   # name -> [before, after]
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["written"] = [list(r) for r in self.written]
        return d


@dataclass(frozen=True)
class RepairPlan:
    """What a repair from ``from_batch`` does (:func:`plan_repair`): read-only. ``wals``: the
    WAL named first, then every other WAL the checkpoint names (the tables of a foreachBatch
    function: Spark re-runs the batches for all of them)."""

    checkpoint: str
    from_batch: int
    highest_offset: int
    wals: tuple[WalPlan, ...]
    checkpoint_files: tuple[str, ...]  # moved out of the checkpoint (relative paths)

    @property
    def rerun(self) -> str:
        """What Spark does after the repair, in one sentence."""
        return REPLAYABLE.format(k=self.from_batch, prev=self.from_batch - 1) \
            if self.from_batch > 0 else ("Spark plans batch 0 again from the source's starting "
                                         "offsets: the source must still hold every row")

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(w for p in self.wals for w in p.warnings)

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "from_batch": self.from_batch,
                "highest_offset": self.highest_offset, "rerun": self.rerun,
                "checkpoint_files": list(self.checkpoint_files),
                "wals": [p.to_dict() for p in self.wals]}


@dataclass(frozen=True)
class RepairReport:
    plan: RepairPlan
    keep: str
    resumed: bool           # an earlier run began this repair; this one finished it
    unblocked: bool         # every WAL's blocked.json removed: nothing before K is broken

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "keep": self.keep, "resumed": self.resumed,
                "unblocked": self.unblocked}


def ranges(ids: list[int] | set[int]) -> tuple[tuple[int, int], ...]:
    """Sorted ids as (first, last) runs of consecutive ids."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return tuple((a, b) for a, b in out)


def spell(runs: tuple[tuple[int, int], ...]) -> str:
    """``((3, 5), (7, 7))`` -> ``batches 3..5, 7``; ``((3, 3),)`` -> ``batch 3``."""
    text = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)
    return f"batch {text}" if len(runs) == 1 and runs[0][0] == runs[0][1] else f"batches {text}"


# -------------------------------------------------------------------------------- files
def checkpoint_files(checkpoint: str, from_batch: int) -> list[str]:
    """``commits/N``, ``offsets/N`` and their ``.crc`` files for N >= ``from_batch``: commits
    first, each log newest first (so every prefix of the moves leaves Spark's logs as a
    stop could: commits at most one behind offsets)."""
    out = []
    for folder in (ckpt.COMMITS, ckpt.OFFSETS):
        found = []
        try:
            names = os.listdir(os.path.join(checkpoint, folder))
        except FileNotFoundError:
            continue
        for name in names:
            match = _CHECKPOINT_NAME.match(name)
            if match and int(match.group(1) or match.group(2)) >= from_batch:
                found.append((int(match.group(1) or match.group(2)), name))
        out += [f"{folder}/{name}" for _n, name in sorted(found, reverse=True)]
    return out


def offset_ids(checkpoint: str) -> list[int]:
    """The batch ids Spark planned and still keeps (``offsets/N``), in order."""
    return _ids(os.path.join(checkpoint, ckpt.OFFSETS))


def _ids(folder: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    except FileNotFoundError:
        return []


def wal_files(wal: WalDir, from_batch: int) -> list[str]:
    """Every file of batches >= ``from_batch`` under WAL_DIR: seals, segments (``.tmp`` ones
    too), entries, the records of runs that started at them (left, one would name its run the
    run of a batch Spark runs again in another) and amendments (an operator's choice for rows
    the re-run replaces)."""
    out = []
    for batch in wal.sealed_batch_ids():
        if batch >= from_batch:
            out.append(os.path.relpath(wal.seal_path(batch), wal.root))
    for batch in wal.staged_batch_ids():
        if batch >= from_batch:
            folder = wal.batch_segments(batch)
            out += sorted(os.path.relpath(os.path.join(folder, n), wal.root)
                          for n in os.listdir(folder))
    for batch in entered_batch_ids(wal):
        if batch >= from_batch:
            out.append(os.path.relpath(wal.entry_path(batch), wal.root))
    for first_batch, _run_id in read_runs(wal):
        if first_batch >= from_batch:
            out.append(os.path.relpath(run_path(wal, first_batch), wal.root))
    for batch in amended_batch_ids(wal):
        if batch >= from_batch:
            out.append(os.path.relpath(wal.amendment_path(batch), wal.root))
    return out


def _move(src_root: str, relative: str, dest_root: str) -> bool:
    """Move ``src_root/relative`` to ``dest_root/relative``, durably at both ends: the new
    name is synced before the old one goes. False: it was moved already (a run cut short)."""
    src, dest = os.path.join(src_root, relative), os.path.join(dest_root, relative)
    make_private_dirs(os.path.dirname(dest))
    try:
        os.rename(src, dest)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copy2(src, dest)         # another filesystem: copy, sync, then remove
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(dest))
        os.unlink(src)
    fsync_dir(os.path.dirname(dest))
    fsync_dir(os.path.dirname(src))
    return True


def _remove_empty_batch_folders(wal: WalDir, from_batch: int) -> None:
    for batch in wal.staged_batch_ids():
        if batch >= from_batch:
            try:
                os.rmdir(wal.batch_segments(batch))
            except OSError:
                continue    # not empty: a task of a query still running wrote into it
            fsync_dir(wal.segments)


# --------------------------------------------------------------------------------- plan
def checkpoint_wals(wal: WalDir, checkpoint: str) -> list[WalDir]:
    """``wal``, then every other WAL the checkpoint's pointer files name (a foreachBatch
    function's tables share its checkpoint: one WAL each), in a fixed order. Raises
    :class:`RepairRefused` for one on a store."""
    here = os.path.realpath(wal.root)
    others: dict[str, WalDir] = {}
    for location in pointed_wals(checkpoint):
        if not is_local(location) or is_remote(location):
            raise _on_a_store(location)
        path = os.path.realpath(ckpt.local_path(location))
        if path != here and os.path.isdir(path):
            others[path] = WalDir(path).check()
    return [wal] + [others[p] for p in sorted(others)]


def _kept_as(wals: list[WalDir]) -> list[str]:
    """Each WAL's folder in the kept copy: ``wal`` for the one named, ``wals/<its folder's
    name>`` for the others (``-2``... if two share a name)."""
    out = ["wal"]
    for other in wals[1:]:
        base = f"wals/{os.path.basename(os.path.normpath(other.root))}"
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def plan_repair(wals: list[tuple[WalDir, WalLog | None]], checkpoint: str, from_batch: int,
                rewrite: bool = False, check: bool = True, force: bool = False) -> RepairPlan:
    """What a repair from ``from_batch`` would do to ``wals`` (each with its log, a reader
    will do, or None if it has none: :func:`checkpoint_wals`, the WAL named first) and to the
    local Spark checkpoint ``checkpoint``; raises :class:`RepairRefused` (changing nothing)
    when it must not, unless ``check`` is False (finishing a repair begun earlier, whose
    checks were made then). ``force``: no run of the query is live anywhere (a WAL with no
    target yet is then no run's first batch: :func:`_check_no_unseen_run`). Reads only."""
    if check:
        for wal, _ in wals:
            _check_where(wal, checkpoint)
        _check_checkpoint(checkpoint)
        if not force:
            for wal, _ in wals:
                _check_no_unseen_run(wal)
    offsets = offset_ids(checkpoint)
    if check:
        _check_offsets(checkpoint, offsets, from_batch)
    kept_as = _kept_as([w for w, _ in wals])
    plans = tuple(_plan_wal(wal, wal_log, checkpoint, from_batch, kept)
                  for (wal, wal_log), kept in zip(wals, kept_as))
    written = [p for p in plans if p.written]
    if check and written and not rewrite:
        said = "; ".join(f"{spell(p.written)} of {p.wal}" for p in written)
        raise RepairRefused(
            f"{said}: already written to Cassandra, in whole or part (from batch {from_batch} "
            f"on); Spark re-running them writes their rows again",
            f"{REWRITE_MEANS}; add --rewrite if that is fine, or repair from a later batch "
            f"(nothing was changed)")
    if check and written:
        newest = max(p.newest_ts for p in plans)
        if now_us() <= newest:
            raise RepairRefused(
                f"this machine's clock is behind the write timestamps of the batches to be "
                f"written again (up to {newest} µs): their re-run would be written below them, "
                f"and the old cells would win",
                "set the clock right, then run the repair again (nothing was changed)")
    return RepairPlan(checkpoint=checkpoint, from_batch=from_batch,
                      highest_offset=max(offsets, default=-1),
                      wals=tuple(p.plan for p in plans),
                      checkpoint_files=tuple(checkpoint_files(checkpoint, from_batch)))


@dataclass(frozen=True)
class _Planned:
    plan: WalPlan
    newest_ts: int          # the last write timestamp of its batches >= K (0: none sealed)

    @property
    def written(self) -> tuple[tuple[int, int], ...]:
        return self.plan.written

    @property
    def wal(self) -> str:
        return self.plan.wal


def _plan_wal(wal: WalDir, wal_log: WalLog | None, checkpoint: str, from_batch: int,
              kept_as: str) -> _Planned:
    views = catalog.describe(wal, wal_log, checkpoint)
    later = [v for v in views if v.batch >= from_batch]
    flushed_through = max(wal_log.flushed_through() if wal_log else -1, wal.read_flushed_through())
    skipped = {v.batch for v in later if v.state is ViewState.SKIPPED}
    # Up to flushed_through every batch was written (retention may have forgotten it since),
    # but for one a foreachBatch writer was never called for; after it, what the log says.
    written = {v.batch for v in later if v.state in (ViewState.FLUSHED, ViewState.FLUSHING)} | \
        (set(range(from_batch, flushed_through + 1)) - skipped)
    log_flushed = wal_log.flushed_through() if wal_log else -1
    committed = wal_log.committed_through() if wal_log else -1
    lowest = from_batch - 1
    markers = {"m/committed_through": [committed, min(committed, lowest)],
               "m/flushed_through": [log_flushed, min(log_flushed, lowest)],
               fmt.FLUSHED_THROUGH_FILE: [wal.read_flushed_through(),
                                          min(wal.read_flushed_through(), lowest)]}
    moved = wal.read_moved()
    if moved is not None:       # a WAL the stream moved away from: _lower_moved
        markers[f"{fmt.MOVED_FILE} after"] = [moved[1], min(moved[1], lowest)]
    warnings = tuple(
        f"{wal.root}: batch {v.batch} (before {from_batch}) cannot be written either "
        f"({v.detail}): the sink stays blocked there; repair from batch {v.batch} instead"
        for v in views if v.batch < from_batch and v.action == RecoveryAction.ERROR)
    batches = tuple({"batch": v.batch, "state": v.state, "rows": v.rows,
                     "committed": v.committed, "written": v.batch in written,
                     "detail": v.detail} for v in later)
    newest = max((last_written_ts_us(wal, v.seal) for v in later if v.seal is not None),
                 default=0)
    return _Planned(WalPlan(wal=wal.root, kept_as=kept_as, batches=batches,
                            written=ranges(written), wal_files=tuple(wal_files(wal, from_batch)),
                            markers=markers, warnings=warnings), newest)


def _on_a_store(where: str) -> RepairRefused:
    return RepairRefused(
        f"{where} is on a store (HDFS, S3): repair is not supported on a store yet",
        "copy the WAL and the checkpoint to local folders, repair there and copy them back, "
        "or re-deliver the rows with a batch write (nothing was changed)")


def _check_where(wal: WalDir, checkpoint: str) -> None:
    if wal.remote is not None:
        raise _on_a_store(wal.location)
    if not is_local(checkpoint):
        raise _on_a_store(checkpoint)
    if not os.path.isdir(checkpoint) or not ckpt.written_by_spark(checkpoint):
        raise RepairRefused(f"{checkpoint} is not a Spark checkpoint (no metadata, offsets/ or "
                            f"commits/)", "pass the query's checkpointLocation with "
                            "--checkpoint (nothing was changed)", usage=True)
    try:
        binding.check(wal, checkpoint)
    except WalBoundElsewhere as exc:
        raise RepairRefused(str(exc), "pass the checkpoint of the query that wrote this WAL "
                            "(nothing was changed)", usage=True) from None


def _check_no_unseen_run(wal: WalDir) -> None:
    """The writer lock the repair takes is the flusher's, and a live run's flusher starts only
    once a batch recorded the WAL's target (``target.json``): a WAL of the checkpoint with
    none may be a live run's, its first batch under way (a new query, a table a foreachBatch
    function writes for the first time, a moved ``wal.path``). The repair would move that
    batch's files and Spark's ``offsets/`` from under it (the gap ``recover`` closed by never
    discarding without ``--force``)."""
    if wal.read_target() is None:
        raise RepairRefused(
            f"{wal.root} records no target yet (target.json): a run of the query may be live, "
            f"its first batch through this WAL under way, and its flusher, whose lock the "
            f"repair takes, not started yet; the repair would move that batch's files and "
            f"Spark's offsets from under it",
            "stop every run of the query, then run the repair again with --force (nothing "
            "was changed)")


def _check_checkpoint(checkpoint: str) -> None:
    state = os.path.join(checkpoint, STATE)
    if os.path.isdir(state) and os.listdir(state):
        raise RepairRefused(
            f"{checkpoint} holds {STATE}/: the query is stateful (an aggregation, a join, "
            f"dropDuplicates...), and its state store versions would not match the batches "
            f"Spark re-runs",
            "re-deliver the rows with a batch write instead, or run the query again on a new "
            "checkpoint (nothing was changed)")


def _check_offsets(checkpoint: str, offsets: list[int], from_batch: int) -> None:
    if from_batch < 0:
        raise RepairRefused(f"--from {from_batch}: batch ids start at 0", usage=True)
    if not offsets:
        raise RepairRefused(f"{checkpoint}/offsets holds no batch: Spark has planned none, "
                            f"there is nothing to run again", usage=True)
    if from_batch > offsets[-1]:
        raise RepairRefused(
            f"--from {from_batch}: Spark planned batches up to {offsets[-1]} only "
            f"({checkpoint}/offsets)", f"repair from a batch up to {offsets[-1]}", usage=True)
    if from_batch == 0:
        return
    previous = from_batch - 1
    if previous not in offsets or not os.path.exists(
            os.path.join(checkpoint, ckpt.COMMITS, str(previous))):
        raise RepairRefused(
            f"Spark no longer keeps batch {previous} (offsets/{previous} and commits/"
            f"{previous} in {checkpoint}): it would have nothing to plan batch {from_batch} "
            f"from (it keeps spark.sql.streaming.minBatchesToRetain batches)",
            f"repair from batch {offsets[0] + 1} or later (nothing was changed)")


# ------------------------------------------------------------------------------- repair
def default_keep(wal: WalDir) -> str:
    """``<WAL_DIR>/repair-<UTC time>`` (``-2``, ``-3``... if taken)."""
    base = os.path.join(os.path.abspath(wal.root), fmt.REPAIR_DIR_PREFIX
                        + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock.wall_s())))
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def repair(wal: WalDir, checkpoint: str, from_batch: int, *, rewrite: bool = False,
           keep: str | None = None, force: bool = False) -> RepairReport:
    """Repair ``wal``, every other WAL the local Spark checkpoint ``checkpoint`` names, and the
    checkpoint, from batch ``from_batch`` (the module docstring), keeping what it removes in
    ``keep`` (default :func:`default_keep`). Takes each WAL's writer lock (``WalLocked`` if a
    sink holds one; ``force``: no run of the query is live, whatever the locks say);
    :class:`RepairRefused` changes nothing. A repair that began and did not
    finish (a log is fenced) is finished, with the kept copy it began."""
    checkpoint = os.path.abspath(checkpoint)
    wals = checkpoint_wals(wal, checkpoint) if is_local(checkpoint) else [wal]
    wal_logs: list[WalLog] = []
    try:
        for each in wals:
            wal_logs.append(WalLog.open_writer(each, repairing=True))
        under_way = next((f for f in (each.repair_under_way() for each in wal_logs) if f), None)
        pairs = list(zip(wals, wal_logs))
        if under_way is not None:
            if int(under_way["from"]) != from_batch or under_way["checkpoint"] != checkpoint:
                raise RepairRefused(
                    f"a repair from batch {under_way['from']} with the checkpoint "
                    f"{under_way['checkpoint']} began and did not finish",
                    f"run it again as it began: --from {under_way['from']} --checkpoint "
                    f"{under_way['checkpoint']}")
            keep = under_way["keep"]
            plan = plan_repair(pairs, checkpoint, from_batch, rewrite, check=False)
        else:
            plan = plan_repair(pairs, checkpoint, from_batch, rewrite, force=force)
            keep = os.path.abspath(keep) if keep else default_keep(wal)
            if os.path.exists(keep) and os.listdir(keep):
                raise RepairRefused(f"--keep {keep} is not empty",
                                    "name a new folder (nothing was changed)", usage=True)
            fence = {"from": from_batch, "checkpoint": checkpoint, "keep": keep,
                     "started_at_us": now_us()}
            for wal_log in wal_logs:
                wal_log.begin_repair(fence)
        kept_as = _write_manifest(keep, plan, pairs, rewrite)
        for each, wal_plan in zip(wals, plan.wals):
            where = os.path.join(keep, kept_as.get(each.root, wal_plan.kept_as))
            for relative in wal_plan.wal_files:
                _move(each.root, relative, where)
            _remove_empty_batch_folders(each, from_batch)
        for relative in plan.checkpoint_files:
            _move(checkpoint, relative, os.path.join(keep, KEPT_CHECKPOINT))
        unblocked = True
        for each, wal_log in pairs:
            _lower_flushed_through(each, from_batch)
            _lower_entries_since(each, from_batch)
            _lower_moved(each, from_batch)
            wal_log.rewind(from_batch)          # the last step that matters: lifts the fence
            if any(v.action is RecoveryAction.ERROR
                   for v in catalog.describe(each, wal_log, checkpoint)):
                unblocked = False
            else:
                each.write_blocked(None)
        _finish_manifest(keep)
        return RepairReport(plan, keep, under_way is not None, unblocked)
    finally:
        for wal_log in wal_logs:
            wal_log.close()


def _lower_entries_since(wal: WalDir, from_batch: int) -> None:
    """A WAL keeping entries from a later batch (its table first written after K) keeps them
    from K on: Spark re-runs K.. and the writer records each call of the re-run, so a batch of
    the re-run without an entry is one it was not called for (skipped), not a lost seal."""
    since = entries_since(wal)
    if since is not None and since > from_batch:
        atomic_write(os.path.join(wal.entries, fmt.ENTRIES_SINCE_FILE), b"%d\n" % from_batch)


def _lower_moved(wal: WalDir, from_batch: int) -> None:
    """A WAL the stream moved away from after a batch from K on held that batch last; Spark
    runs K.. again through the WAL its pointer names, so this one now holds nothing after K-1:
    its ``moved.json`` says so, or its catalog would call the re-run's batches up to the old
    'after' committed and missing (a block no one can cure), and a move back to it would be
    refused for them."""
    moved = wal.read_moved()
    if moved is not None and moved[1] >= from_batch:
        wal.write_moved((moved[0], from_batch - 1))


def _lower_flushed_through(wal: WalDir, from_batch: int) -> None:
    if wal.read_flushed_through() < from_batch:
        return
    path = os.path.join(wal.root, fmt.FLUSHED_THROUGH_FILE)
    if from_batch > 0:
        atomic_write(path, b"%d\n" % (from_batch - 1))
    else:
        os.unlink(path)
        fsync_dir(wal.root)


def _write_manifest(keep: str, plan: RepairPlan, wals: list[tuple[WalDir, WalLog]],
                    rewrite: bool) -> dict[str, str]:
    """``repair.json`` in the kept copy, before anything moves; returns where each WAL's
    files go in it (a run finishing an earlier one keeps the first run's places, and adds the
    time it resumed)."""
    make_private_dirs(keep)
    path = os.path.join(keep, fmt.REPAIR_FILE)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
        manifest.setdefault("resumed_at", []).append(clock.wall_s())
    except FileNotFoundError:
        records = {w.root: [json.loads(r.to_json()) for r in wal_log.records()
                            if r.batch >= plan.from_batch] for w, wal_log in wals}
        manifest = {"status": "started", "started_at": clock.wall_s(), "rewrite": rewrite,
                    "plan": plan.to_dict(), "log_records": records}
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return {p["wal"]: p["kept_as"] for p in manifest["plan"]["wals"]}


def _finish_manifest(keep: str) -> None:
    path = os.path.join(keep, fmt.REPAIR_FILE)
    with open(path, "rb") as f:
        manifest = json.loads(f.read())
    manifest.update(status="done", finished_at=clock.wall_s())
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
