"""Entries: which batches a ``foreachBatch`` writer was called for (layout: ``wal/FORMAT.md``,
"Entries").

A data source's WAL sees every batch of its query: Spark calls ``commit(N)`` for each, so a
batch Spark committed without a seal here is a lost seal. A ``foreachBatch`` function is the
user's code: it may write a table only in some batches (``if df.isEmpty(): return``), or
write it through one of several writers, one WAL per table. From outside, a batch it did not
write to this table looks the same as a batch whose writer failed after the function caught
the error: committed, no seal. So the writer records each batch it is called for *before* it
stages anything (``entered/<batch>.json``), and the WAL says from which batch on it keeps
such records (``entered/since``). Then, for a batch Spark committed with no seal:

* no entry, at or after ``since``: the writer was never called for it, so it has nothing to
  write (the catalog calls it *skipped*);
* an entry: the writer was called and sealed nothing, yet Spark committed the batch (the
  function went on after the writer failed): the batch's rows for this table are lost, and
  the WAL blocks, naming the batch.

An entry goes with its batch's files (flushed, discarded); ``since`` stays.

Runs (``entered/runs/<batch>``: a run id): which run of the query ran batches from ``<batch>``
on, recorded when a run starts (and by its writer's first call). A run that dies leaves the
files of the batch it was running; the next run re-runs that batch, and its function may call
no writer of this table: Spark commits the batch all the same. What the earlier run left of
it (an entry, segments, a seal Spark never committed) is then garbage, told apart by the run
that committed the batch (:func:`run_of`), whose entry it is not.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace

from . import format as fmt
from .errors import WalCorrupted
from .files import atomic_write, make_private_dirs
from .layout import WalDir
from .seal import now_us


@dataclass(frozen=True)
class Entry:
    """A writer was called for ``batch``: by which run of the query, for which table."""

    batch: int
    run_id: str = ""        # Spark's runId of the query run ("" if unknown)
    table: str = ""         # "<keyspace>.<table>" the writer writes
    at_us: int = 0
    seal_id: str = ""       # the seal this call writes if it seals ("": not said)

    def sealed_by(self, seal) -> bool:
        """Whether ``seal`` is this call's: a seal of the batch an earlier call left (a run
        that died before Spark committed it) is not, when the entry names its own."""
        return not self.seal_id or seal.seal_id == self.seal_id

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode() + b"\n"


def record_entry(wal: WalDir, entry: Entry) -> None:
    """Record, durably, that a writer was called for ``entry.batch`` (on a store, published
    there first); the first entry also records ``since``. Before the writer stages a row."""
    entry = entry if entry.at_us else replace(entry, at_us=now_us())
    make_private_dirs(wal.entries)
    if entries_since(wal) is None:
        since = str(entry.batch).encode() + b"\n"
        if wal.remote:      # another host may have recorded it first: theirs stands
            since = wal.remote.publish_once(f"{fmt.ENTRIES_DIR}/{fmt.ENTRIES_SINCE_FILE}", since)
        atomic_write(os.path.join(wal.entries, fmt.ENTRIES_SINCE_FILE), since)
    data = entry.encode()
    if wal.remote:
        wal.remote.publish_entry(entry.batch, data)
    atomic_write(wal.entry_path(entry.batch), data)


def entries_since(wal: WalDir) -> int | None:
    """The first batch this WAL recorded entries for (None: it records none: a data source's
    WAL, or one written before entries existed)."""
    try:
        with open(os.path.join(wal.entries, fmt.ENTRIES_SINCE_FILE), "rb") as f:
            return int(f.read().strip())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise WalCorrupted(os.path.join(wal.entries, fmt.ENTRIES_SINCE_FILE),
                           f"unreadable: {exc}") from None


def read_entry(wal: WalDir, batch: int) -> Entry | None:
    path = wal.entry_path(batch)
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
        return Entry(int(d["batch"]), str(d.get("run_id", "")), str(d.get("table", "")),
                     int(d.get("at_us", 0)), str(d.get("seal_id", "")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WalCorrupted(path, f"unreadable entry: {exc}", batch=batch) from None


def entered_batch_ids(wal: WalDir) -> list[int]:
    try:
        names = os.listdir(wal.entries)
    except FileNotFoundError:
        return []
    stems = (n[: -len(fmt.ENTRY_SUFFIX)] for n in names if n.endswith(fmt.ENTRY_SUFFIX))
    return sorted(int(s) for s in stems if s.isdigit())


def remove_entry(wal: WalDir, batch: int) -> None:
    """The batch's entry, on the store first (a working copy pulls what the store has)."""
    if wal.remote:
        wal.remote.delete_entry(batch)
    try:
        os.unlink(wal.entry_path(batch))
    except FileNotFoundError:
        pass


RUNS = "runs"          # entered/runs/<batch>: the run of the batches from <batch> on
RUN_SUFFIX = ".run"


def record_run(wal: WalDir, first_batch: int, run_id: str) -> None:
    """Record that run ``run_id`` runs the batches from ``first_batch`` on (the latest record
    of a batch wins: a run that died before committing anything is followed by another one
    starting at the same batch). On a store, published there first."""
    if not run_id:
        return
    make_private_dirs(os.path.join(wal.entries, RUNS))
    data = run_id.encode()
    if wal.remote:
        wal.remote.publish_run(first_batch, data)
    atomic_write(run_path(wal, first_batch), data)


def run_path(wal: WalDir, first_batch: int) -> str:
    return os.path.join(wal.entries, RUNS, fmt.batch_name(first_batch) + RUN_SUFFIX)


def read_runs(wal: WalDir) -> list[tuple[int, str]]:
    """``(first batch, run id)`` of every run recorded, in batch order."""
    folder = os.path.join(wal.entries, RUNS)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        stem = name[: -len(RUN_SUFFIX)]
        if name.endswith(RUN_SUFFIX) and stem.isdigit():
            with open(os.path.join(folder, name), "rb") as f:
                out.append((int(stem), f.read().decode()))
    return sorted(out)


def run_of(runs: list[tuple[int, str]], batch: int) -> str | None:
    """The run that ran ``batch`` last (the recorded run with the greatest first batch at or
    below it; Spark commits a batch in the last run that runs it), or None if none is."""
    found = None
    for first, run_id in runs:
        if first > batch:
            break
        found = run_id
    return found
