"""Retention and size: what the WAL keeps after a batch is flushed, and how big it is.

A flushed batch's rows, segments and seal are kept for ``keep_batches`` batches and/or
``keep_seconds`` (so ``cassandra-wal dump`` can still show recent batches), then removed. The
newest flushed batch's seal is always kept: the next batch's write timestamps are chosen above
its last one.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass

from . import clock
from . import format as fmt
from .amendments import remove_amendment
from .entries import entries_since, remove_entry
from .files import tree_size
from .layout import WalDir
from .log import WalLog
from .seal import now_us
from .states import BatchState


@dataclass(frozen=True)
class RetentionPolicy:
    keep_batches: int = 10             # newest finished batches kept
    keep_seconds: float | None = None  # and/or finished batches younger than this

    def __post_init__(self):
        if self.keep_batches < 0:
            raise ValueError("keep_batches must be >= 0")


@dataclass(frozen=True)
class WalSize:
    total: int
    segments: int
    log: int
    seals: int

    def to_dict(self) -> dict:
        return {"total": self.total, "segments": self.segments, "log": self.log, "seals": self.seals}


def wal_size(wal: WalDir) -> WalSize:
    seg, log, seals = _folder_sizes.segments(wal), tree_size(wal.log), tree_size(wal.seals)
    return WalSize(seg + log + seals, seg, log, seals)


class _FolderSizes:
    """The bytes under each batch's segment folder, walked again only when the folder changed:
    a file added, removed or renamed in it changes its modification time, and a complete
    segment is never rewritten. The health (every drain and every scrape) then looks at one
    folder per batch, not at every segment file of every pending batch (issue 32). A folder
    changed in the last :data:`QUIET_NS` is walked every time (a change within the clock's
    granularity would not move its time); a task's ``.tmp`` growing in place is seen when
    it is renamed. Thread-safe; holds the folders of the last listing of each WAL."""

    QUIET_NS = 2_000_000_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, tuple[tuple[int, int], int]] = {}

    def segments(self, wal: WalDir) -> int:
        total, seen = 0, set()
        try:
            entries = list(os.scandir(wal.segments))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    seen.add(entry.path)
                    total += self._folder(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue    # removed by retention while we look
        with self._lock:
            for path in [p for p in self._sizes
                         if os.path.dirname(p) == wal.segments and p not in seen]:
                del self._sizes[path]
        return total

    def _folder(self, path: str) -> int:
        st = os.lstat(path)
        identity = (st.st_ino, st.st_mtime_ns)
        with self._lock:
            found = self._sizes.get(path)
        if found is not None and found[0] == identity:
            return found[1]
        size = tree_size(path)
        if clock.wall_ns() - st.st_mtime_ns >= self.QUIET_NS:
            with self._lock:
                self._sizes[path] = (identity, size)
        return size


_folder_sizes = _FolderSizes()


def remove_batch_files(wal: WalDir, batch: int, keep_seal: bool = False) -> None:
    """The batch's segments (and seal, amendment and entry) here and, for a WAL on a store, there first:
    a working copy pulls what the store still has."""
    if entries_since(wal) is not None:
        remove_entry(wal, batch)
    if not keep_seal:           # a seal kept for the next batch's timestamps keeps its own
        remove_amendment(wal, batch)
    if wal.remote:
        wal.remote.delete_segments(batch)
        if not keep_seal:
            wal.remote.delete_seal(batch)
    shutil.rmtree(wal.batch_segments(batch), ignore_errors=True)
    if not keep_seal:
        try:
            os.unlink(wal.seal_path(batch))
        except FileNotFoundError:
            pass


def remove_unsealed_segments(wal: WalDir, batch: int, keep: set[str]) -> int:
    """Delete a batch's segment files that its seal does not name (losing attempts, earlier
    runs, ``.tmp`` leftovers of crashed tasks). Returns how many were removed here."""
    if wal.remote:
        wal.remote.delete_segments(batch, keep)
    folder = wal.batch_segments(batch)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if f"{fmt.batch_name(batch)}/{name}" not in keep:
            try:
                os.unlink(os.path.join(folder, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def apply_retention(wal: WalDir, wal_log: WalLog, policy: RetentionPolicy) -> list[int]:
    """Forget finished batches beyond the policy. Returns the batch ids removed."""
    finished = [r for r in wal_log.records()
                if r.state in (BatchState.FLUSHED, BatchState.DISCARDED)]
    finished.sort(key=lambda r: r.batch, reverse=True)
    # The newest flushed batch keeps its seal: the next batch's timestamps start above it, even
    # if every newer seal is later discarded (Spark never committed those batches).
    newest_flushed = next((r.batch for r in finished if r.state == BatchState.FLUSHED), None)
    now = now_us()
    removed = []
    for i, record in enumerate(finished):
        young = (policy.keep_seconds is not None
                 and (now - record.updated_at_us) / 1e6 < policy.keep_seconds)
        if i < policy.keep_batches or young:
            continue
        if record.state == BatchState.FLUSHED:
            remove_batch_files(wal, record.batch, keep_seal=record.batch == newest_flushed)
        # A DISCARDED batch's files went with the discard; any there now are Spark's re-run of
        # that batch (same id), staging or sealed and not yet ingested: never ours to delete.
        wal_log.forget(record.batch)
        removed.append(record.batch)
    # Seals kept only for their timestamps become redundant once a newer batch is flushed;
    # the newest seal at or below flushed_through stays, whatever moved the mark past it (in
    # a foreachBatch WAL, batches its writer was never called for): the next batch's
    # timestamps start above it.
    through = wal_log.flushed_through()
    known = {r.batch for r in wal_log.records()}
    sealed = wal.sealed_batch_ids()
    kept_for_timestamps = max((b for b in sealed if b <= through), default=None)
    for batch in sealed:
        if batch < through and batch not in known and batch != kept_for_timestamps:
            remove_batch_files(wal, batch)
    return sorted(removed)
