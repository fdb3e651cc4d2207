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

What it refuses, before it changes anything (:class:`~wal.errors.RepairRefused`): a WAL or a
checkpoint on a store (not supported yet), a checkpoint with ``state/`` (a stateful query: its
state store versions would not match the re-run), a checkpoint shared with other WALs (a
``foreachBatch`` function writing several tables: not supported yet), K above the newest
``offsets/N`` or one whose K-1 Spark no longer keeps, and batches from K on that are already
in Cassandra in whole or part unless ``rewrite`` accepts writing them again with new
timestamps.

Crash safety: the log is fenced first (``m/repair``, :meth:`~wal.log.WalLog.begin_repair`):
until the last step, no flusher, recovery or ``recover`` opens it
(:class:`~wal.errors.WalRepairing`), and running the repair again finishes it. Then the WAL's
files of batches K.. and Spark's ``commits/K..``, ``offsets/K..`` are *moved* into the kept
copy (each move fsynced at both ends), the shared ``flushed_through`` is lowered, and one
synced write rewinds the log and lifts the fence. The kept copy (``<WAL_DIR>/repair-<UTC
time>/`` unless given) holds ``repair.json`` (what was planned and removed, the log's records
of those batches) and the files under ``wal/`` and ``checkpoint/``, by their paths there.

Local WAL and local checkpoint only; the query must be stopped (the repair takes the WAL's
writer lock, as ``recover`` does).
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
from . import checkpoint as ckpt
from . import format as fmt
from .entries import entered_batch_ids
from .errors import RepairRefused, WalBoundElsewhere
from .files import atomic_write, fsync_dir, make_private_dirs
from .layout import WalDir
from .log import WalLog
from .pointer import pointed_wals
from .seal import now_us

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
class RepairPlan:
    """What a repair from ``from_batch`` does (:func:`plan_repair`): read-only."""

    wal: str
    checkpoint: str
    from_batch: int
    highest_offset: int
    batches: tuple[dict, ...]         # every batch >= K the WAL knows: batch, state, rows, ...
    written: tuple[tuple[int, int], ...]   # ranges (first, last) of batches >= K in Cassandra
    wal_files: tuple[str, ...]        # moved out of WAL_DIR (relative paths)
    checkpoint_files: tuple[str, ...]  # moved out of the checkpoint (relative paths)
    markers: dict = field(default_factory=dict)   # name -> [before, after]
    warnings: tuple[str, ...] = ()

    @property
    def rerun(self) -> str:
        """What Spark does after the repair, in one sentence."""
        return REPLAYABLE.format(k=self.from_batch, prev=self.from_batch - 1) \
            if self.from_batch > 0 else ("Spark plans batch 0 again from the source's starting "
                                         "offsets: the source must still hold every row")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["written"] = [list(r) for r in self.written]
        d["rerun"] = self.rerun
        return d


@dataclass(frozen=True)
class RepairReport:
    plan: RepairPlan
    keep: str
    resumed: bool           # an earlier run began this repair; this one finished it
    unblocked: bool         # blocked.json removed: nothing before K is broken

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
    too), entries."""
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
                continue    # not empty: something new (cannot be: the log is fenced)
            fsync_dir(wal.segments)


# --------------------------------------------------------------------------------- plan
def plan_repair(wal: WalDir, log: WalLog | None, checkpoint: str, from_batch: int,
                rewrite: bool = False, check: bool = True) -> RepairPlan:
    """What a repair from ``from_batch`` would do; raises :class:`RepairRefused` (changing
    nothing) when it must not, unless ``check`` is False (finishing a repair begun earlier,
    whose checks were made then). ``log``: the WAL's log (a reader will do), None if it has
    none. Reads only."""
    if check:
        _check_where(wal, checkpoint)
    offsets = offset_ids(checkpoint)
    highest = max(offsets, default=-1)
    if check:
        _check_offsets(checkpoint, offsets, from_batch)
    views = catalog.describe(wal, log, checkpoint)
    later = [v for v in views if v.batch >= from_batch]
    flushed_through = max(log.flushed_through() if log else -1, wal.read_flushed_through())
    skipped = {v.batch for v in later if v.state == catalog.SKIPPED}
    # Up to flushed_through every batch was written (retention may have forgotten it since),
    # but for one a foreachBatch writer was never called for; after it, what the log says.
    written = {v.batch for v in later if v.state in ("flushed", "flushing")} | \
        (set(range(from_batch, flushed_through + 1)) - skipped)
    written_runs = ranges(written)
    if check and written_runs and not rewrite:
        raise RepairRefused(
            f"{spell(written_runs)} (from batch {from_batch} on): already written to "
            f"Cassandra, in whole or part; Spark re-running them writes their rows again",
            f"{REWRITE_MEANS}; add --rewrite if that is fine, or repair from a later batch "
            f"(nothing was changed)")
    if check and written_runs:
        newest = max((v.seal.last_ts_us for v in later if v.seal is not None), default=0)
        if now_us() <= newest:
            raise RepairRefused(
                f"this machine's clock is behind the write timestamps of the batches to be "
                f"written again (up to {newest} µs): their re-run would be written below them, "
                f"and the old cells would win",
                "set the clock right, then run the repair again (nothing was changed)")
    log_flushed = log.flushed_through() if log else -1
    committed = log.committed_through() if log else -1
    lowest = from_batch - 1
    markers = {"m/committed_through": [committed, min(committed, lowest)],
               "m/flushed_through": [log_flushed, min(log_flushed, lowest)],
               fmt.FLUSHED_THROUGH_FILE: [wal.read_flushed_through(),
                                          min(wal.read_flushed_through(), lowest)]}
    warnings = tuple(
        f"batch {v.batch} (before {from_batch}) cannot be written either ({v.detail}): the "
        f"sink stays blocked there; repair from batch {v.batch} instead"
        for v in views if v.batch < from_batch and v.action == catalog.BROKEN)
    batches = tuple({"batch": v.batch, "state": v.state, "rows": v.rows,
                     "committed": v.committed, "written": v.batch in written,
                     "detail": v.detail} for v in later)
    return RepairPlan(wal=wal.root, checkpoint=checkpoint, from_batch=from_batch,
                      highest_offset=highest, batches=batches, written=written_runs,
                      wal_files=tuple(wal_files(wal, from_batch)),
                      checkpoint_files=tuple(checkpoint_files(checkpoint, from_batch)),
                      markers=markers, warnings=warnings)


def _check_where(wal: WalDir, checkpoint: str) -> None:
    if wal.remote is not None or not ckpt.is_local(checkpoint):
        raise RepairRefused(
            f"{wal.location if wal.remote else checkpoint} is on a store (HDFS, S3): repair is "
            f"not supported on a store yet",
            "copy the WAL and the checkpoint to local folders, repair there and copy them "
            "back, or re-deliver the rows with a batch write (nothing was changed)")
    if not os.path.isdir(checkpoint) or not ckpt.written_by_spark(checkpoint):
        raise RepairRefused(f"{checkpoint} is not a Spark checkpoint (no metadata, offsets/ or "
                            f"commits/)", "pass the query's checkpointLocation with "
                            "--checkpoint (nothing was changed)", usage=True)
    try:
        binding.check(wal, checkpoint)
    except WalBoundElsewhere as exc:
        raise RepairRefused(str(exc), "pass the checkpoint of the query that wrote this WAL "
                            "(nothing was changed)", usage=True) from None
    state = os.path.join(checkpoint, STATE)
    if os.path.isdir(state) and os.listdir(state):
        raise RepairRefused(
            f"{checkpoint} holds {STATE}/: the query is stateful (an aggregation, a join, "
            f"dropDuplicates...), and its state store versions would not match the batches "
            f"Spark re-runs",
            "re-deliver the rows with a batch write instead, or run the query again on a new "
            "checkpoint (nothing was changed)")
    here = os.path.realpath(wal.root)
    others = [w for w in pointed_wals(checkpoint)
              if not ckpt.is_local(w) or os.path.realpath(ckpt.local_path(w)) != here]
    if others:
        raise RepairRefused(
            f"{checkpoint} is shared with {len(others)} other WAL(s) ({', '.join(others)}): "
            f"a foreachBatch function writing several tables, whose batches Spark would re-run "
            f"for every table; repair is not supported for such a query yet",
            "re-deliver the lost rows with a batch write of them (nothing was changed)")


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
    base = os.path.join(wal.root, fmt.REPAIR_DIR_PREFIX
                        + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def repair(wal: WalDir, checkpoint: str, from_batch: int, *, rewrite: bool = False,
           keep: str | None = None) -> RepairReport:
    """Repair ``wal`` and the local Spark checkpoint ``checkpoint`` from batch ``from_batch``
    (the module docstring), keeping what it removes in ``keep`` (default
    :func:`default_keep`). Takes the WAL's writer lock (``WalLocked`` if a sink holds it);
    :class:`RepairRefused` changes nothing. A repair that began and did not finish (the log
    is fenced) is finished, with the kept copy it began."""
    checkpoint = os.path.abspath(checkpoint)
    log = WalLog.open_writer(wal, repairing=True)
    try:
        under_way = log.repair_under_way()
        resumed = under_way is not None
        if resumed:
            if int(under_way["from"]) != from_batch or under_way["checkpoint"] != checkpoint:
                raise RepairRefused(
                    f"a repair from batch {under_way['from']} with the checkpoint "
                    f"{under_way['checkpoint']} began and did not finish",
                    f"run it again as it began: --from {under_way['from']} --checkpoint "
                    f"{under_way['checkpoint']}")
            keep = under_way["keep"]
            plan = plan_repair(wal, log, checkpoint, from_batch, rewrite, check=False)
        else:
            plan = plan_repair(wal, log, checkpoint, from_batch, rewrite)
            keep = os.path.abspath(keep) if keep else default_keep(wal)
            if os.path.exists(keep) and os.listdir(keep):
                raise RepairRefused(f"--keep {keep} is not empty",
                                    "name a new folder (nothing was changed)", usage=True)
            log.begin_repair({"from": from_batch, "checkpoint": checkpoint, "keep": keep,
                              "started_at_us": now_us()})
        _write_manifest(keep, plan, log, rewrite)
        for relative in plan.wal_files:
            _move(wal.root, relative, os.path.join(keep, KEPT_WAL))
        _remove_empty_batch_folders(wal, from_batch)
        for relative in plan.checkpoint_files:
            _move(checkpoint, relative, os.path.join(keep, KEPT_CHECKPOINT))
        if wal.read_flushed_through() >= from_batch:
            path = os.path.join(wal.root, fmt.FLUSHED_THROUGH_FILE)
            if from_batch > 0:
                atomic_write(path, b"%d\n" % (from_batch - 1))
            else:
                os.unlink(path)
                fsync_dir(wal.root)
        log.rewind(from_batch)          # the last step that matters: lifts the fence
        broken = [v for v in catalog.describe(wal, log, checkpoint)
                  if v.action == catalog.BROKEN]
        if not broken:
            wal.write_blocked(None)
        _finish_manifest(keep)
        return RepairReport(plan, keep, resumed, unblocked=not broken)
    finally:
        log.close()


def _write_manifest(keep: str, plan: RepairPlan, log: WalLog, rewrite: bool) -> None:
    """``repair.json`` in the kept copy, before anything moves (a run finishing an earlier
    one adds the time it resumed)."""
    make_private_dirs(keep)
    path = os.path.join(keep, fmt.REPAIR_FILE)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
        manifest.setdefault("resumed_at", []).append(time.time())
    except FileNotFoundError:
        records = [json.loads(r.to_json()) for r in log.records()
                   if r.batch >= plan.from_batch]
        manifest = {"status": "started", "started_at": time.time(), "rewrite": rewrite,
                    "plan": plan.to_dict(), "log_records": records}
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")


def _finish_manifest(keep: str) -> None:
    path = os.path.join(keep, fmt.REPAIR_FILE)
    with open(path, "rb") as f:
        manifest = json.loads(f.read())
    manifest.update(status="done", finished_at=time.time())
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
