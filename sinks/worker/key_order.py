"""One key, one task: what a change stream in sealed order needs within a batch.

A change stream (``op.column``) without a ``writetime`` column is written at the seal's
timestamps, which follow the batch's segments in Spark's partition order. Within one task that
is the order the task read its rows in; across two tasks it is no order of the source's. So a
key whose changes are in two tasks' segments of one batch could end with its earlier change:
an upsert beating the delete that came after it. Nothing at flush time can tell.

The check, for such streams only:

1. each task reports the keys it staged, in its commit message (:class:`TaskKeys`, 64-bit
   hashes of :mod:`recovery.cql.key_identity`, about 8 bytes a distinct key): the primary
   keys of its upserts and row deletes; with ``op.partitionDeleteValues``, also the partition
   keys of all its rows and of its partition deletes (a partition delete touches every row of
   its partition); when the sink writes a static column, the partition keys of its upserts
   (each writes the partition's one static cell);
2. the commit (:func:`check_one_task_per_key`), before the seal, looks for a hash in two
   tasks' reports, reads the rows with that hash back from both tasks' segments and compares
   their keys' canonical values (a hash is a candidate only: two keys may share one, by chance
   or on purpose). The same key in two tasks, or a partition deleted in one task and written
   in another, or its static cell written by two, refuses the batch, naming the key and the
   remedies. Nothing is sealed, so Spark never commits the batch; it runs it again after a
   restart, and it is refused again until the stream keeps each key in one partition or
   gives a source order. A segment that cannot be read back refuses the batch too (the
   restart tries again): the check never lets a batch through on a guess.

A stream with a ``writetime`` column needs no check (the column decides, whatever the task),
and a stream that is no change stream is an upsert stream, whose documented rule is "the last
in sealed order wins". Duplicates that could not change the result (the same delete in two
tasks) are refused too: the check compares keys, not what the changes do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa

from recovery.cql import changes
from recovery.cql.config import WriteConfig
from recovery.cql.convert import RowConverter, row_converter
from recovery.cql.errors import SinkError
from recovery.cql.key_identity import key_hashes, key_values
from recovery.target import Target
from wal.layout import WalDir
from wal.segment import SegmentReader, SegmentRef

_EMPTY = np.zeros(0, dtype=np.uint64)
#: The names of :class:`TaskKeys`'s arrays, in their order on the wire.
_KINDS = ("rows", "partitions", "deleted", "statics")


def keys_checked(write: WriteConfig) -> bool:
    """Whether a batch's keys must each be in one task: a change stream in sealed order."""
    return write.op_column is not None and write.writetime_column is None


class KeyInTwoTasksError(SinkError):
    """A key's changes are in two tasks' segments of one batch of a change stream in sealed
    order: refused at the commit, before the seal. ``kind``: ``key`` (a primary key),
    ``partition-delete`` (a partition deleted in one task, written in another), ``static``
    (a partition's static cell written by two tasks), ``unread`` (a task's keys could not be
    told apart: its report is missing, or its segment could not be read back)."""

    _fields: ClassVar[tuple[str, ...]] = ("batch_id", "key", "partitions", "kind", "detail")

    def __init__(self, batch_id: int, key: str, partitions: tuple[int, ...], kind: str = "key",
                 detail: str = "") -> None:
        self.batch_id, self.key, self.partitions = batch_id, key, tuple(partitions)
        self.kind, self.detail = kind, detail
        where = " and ".join(str(p) for p in self.partitions)
        what = {
            "key": f"key {key} has changes in two tasks",
            "partition-delete": f"partition {key} is deleted in one task and written in another",
            "static": f"the static columns of partition {key} are written by two tasks",
            "unread": f"the keys of a task could not be compared ({detail})",
        }[kind]
        super().__init__(
            f"batch {batch_id}: {what} (Spark partitions {where}). The sink writes a batch's "
            f"changes in Spark's partition order, which across tasks is not the source's, so "
            f"an earlier change could win; nothing was sealed, and the batch is refused again "
            f"until either each key's changes are in one partition, in source order (a source "
            f"partitioned by key, such as a Kafka topic keyed by the row's key, read without a "
            f"shuffle before the sink: a repartition by key after reading does not restore the "
            f"source's order), or `writetime` names a column in source order (once the WAL "
            f"has sealed a batch, on a new checkpoint and table: a change stream may not "
            f"switch its source of timestamps) (docs/user-guide.md, 'Change streams')")


@dataclass(frozen=True)
class KeyColumns:
    """The key columns of a target, as the DataFrame names them, their converter, and
    whether the target writes a static column."""

    partition: tuple[str, ...]
    clustering: tuple[str, ...]
    converter: RowConverter
    writes_statics: bool = False

    @property
    def primary(self) -> tuple[str, ...]:
        return self.partition + self.clustering

    @classmethod
    def of(cls, target: Target) -> "KeyColumns":
        table = target.table
        key = [c for c in target.columns if table.resolve_column(c) in table.primary_key]
        partition = tuple(c for c in key if table.resolve_column(c) in table.partition_key)
        clustering = tuple(c for c in key if c not in partition)
        statics = any(table.resolve_column(c) in table.static_columns for c in target.columns)
        return cls(partition, clustering, row_converter(table, key), statics)


@dataclass(frozen=True, eq=False)
class TaskKeys:
    """The distinct key hashes one task staged, sorted: ``rows`` (the primary keys of its
    upserts and row deletes); with partition deletes possible, ``partitions`` (the partition
    keys of all its rows) and ``deleted`` (those of its partition deletes); when the target
    writes a static column, ``statics`` (the partition keys of its upserts)."""

    rows: np.ndarray
    partitions: np.ndarray
    deleted: np.ndarray
    statics: np.ndarray

    def to_bytes(self) -> bytes:
        arrays = [getattr(self, kind) for kind in _KINDS]
        counts = np.array([len(a) for a in arrays], "<u8")
        return b"".join(a.astype("<u8").tobytes() for a in (counts, *arrays))

    @classmethod
    def from_bytes(cls, data: bytes) -> "TaskKeys":
        counts = np.frombuffer(data, "<u8", len(_KINDS))
        arrays, start = [], 8 * len(_KINDS)
        for count in counts.tolist():
            arrays.append(np.frombuffer(data, "<u8", count, start).astype(np.uint64))
            start += 8 * count
        return cls(*arrays)


class KeyCollector:
    """In a task: the keys of every record batch it stages, reported by :meth:`finish`."""

    def __init__(self, keys: KeyColumns, write: WriteConfig) -> None:
        self.keys, self.write = keys, write
        self._parts: dict[str, list[np.ndarray]] = {kind: [] for kind in _KINDS}

    def add(self, batch: pa.RecordBatch) -> None:
        kinds = changes.operations(batch.column(self.write.op_column), self.write)
        whole = kinds == changes.PARTITION_DELETE
        converter = self.keys.converter
        partitions = key_hashes(batch, self.keys.partition, converter)
        rows = key_hashes(batch, self.keys.clustering, converter, start=partitions)
        self._parts["rows"].append(rows[~whole])
        if self.write.partition_delete_values:
            self._parts["partitions"].append(partitions)
            self._parts["deleted"].append(partitions[whole])
        if self.keys.writes_statics:
            self._parts["statics"].append(partitions[kinds == changes.UPSERT])

    def finish(self) -> bytes:
        def union(parts: list[np.ndarray]) -> np.ndarray:
            return _distinct(np.concatenate(parts)) if parts else _EMPTY
        return TaskKeys(*(union(self._parts[kind]) for kind in _KINDS)).to_bytes()


def _distinct(hashes: np.ndarray) -> np.ndarray:
    """The distinct hashes, sorted (a sort: ``np.unique``'s hash table is slower on these)."""
    ordered = np.sort(hashes)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def _shared(numbered: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
    """The hashes in two or more of the tasks' arrays (each array's hashes distinct)."""
    if len(numbered) < 2:
        return _EMPTY
    ordered = np.sort(np.concatenate([h for _, h in numbered]))
    return _distinct(ordered[:-1][ordered[1:] == ordered[:-1]])


@dataclass(frozen=True)
class _Candidate:
    """A hash two tasks share: which tasks (by Spark partition), and what it must be to refuse
    (``kind`` of :class:`KeyInTwoTasksError`) over which columns."""

    hashed: int
    partitions: tuple[int, ...]
    kind: str
    columns: tuple[str, ...]


#: Candidates compared at once: a shuffled stream shares most of its keys, and the first that
#: is the same key refuses the batch; more are read only while candidates prove collisions.
_CANDIDATES_AT_ONCE = 64


def _holders(numbered: Sequence[tuple[int, np.ndarray]], hashed: int) -> tuple[int, ...]:
    return tuple(p for p, h in numbered
                 if (i := np.searchsorted(h, np.uint64(hashed))) < len(h) and h[i] == hashed)


def _candidates(numbered: Sequence[tuple[int, TaskKeys]], keys: KeyColumns):
    """The candidates, a few at a time (:data:`_CANDIDATES_AT_ONCE`): row keys in two tasks,
    partitions deleted in one task and held by another, static cells written by two."""
    rows = [(p, k.rows) for p, k in numbered]
    partitions = [(p, k.partitions) for p, k in numbered]
    statics = [(p, k.statics) for p, k in numbered]
    shared_partitions = _shared(partitions)

    def deleted():
        for p, k in numbered:
            for hashed in np.intersect1d(k.deleted, shared_partitions).tolist():
                others = tuple(q for q in _holders(partitions, hashed) if q != p)
                yield _Candidate(hashed, (p, *others), "partition-delete", keys.partition)

    found = [(_Candidate(h, _holders(rows, h), "key", keys.primary)
              for h in _shared(rows).tolist()),
             deleted(),
             (_Candidate(h, _holders(statics, h), "static", keys.partition)
              for h in _shared(statics).tolist())]
    batch: list[_Candidate] = []
    for candidate in (c for kind in found for c in kind):
        batch.append(candidate)
        if len(batch) == _CANDIDATES_AT_ONCE:
            yield batch
            batch = []
    if batch:
        yield batch


class _SegmentKeys:
    """Reads the keys behind candidate hashes back from the tasks' segments, each segment
    once per set of columns: hash -> {canonical key: the key as the segment holds it}."""

    def __init__(self, wal: WalDir, refs: dict[int, SegmentRef], converter: RowConverter,
                 wanted: dict[tuple[str, ...], set[int]]) -> None:
        self.wal, self.refs, self.converter, self.wanted = wal, refs, converter, wanted
        self._read: dict[tuple[int, tuple[str, ...]], dict[int, dict[tuple, str]]] = {}

    def of(self, partition: int, columns: tuple[str, ...]) -> dict[int, dict[tuple, str]]:
        key = (partition, columns)
        if key not in self._read:
            self._read[key] = self._keys(self.refs[partition], columns)
        return self._read[key]

    def _keys(self, ref: SegmentRef, columns: tuple[str, ...]) -> dict[int, dict[tuple, str]]:
        wanted = np.array(sorted(self.wanted[columns]), dtype=np.uint64)
        if self.wal.remote:
            self.wal.remote.fetch_segments(self.wal.root, [ref.name])
        found: dict[int, dict[tuple, str]] = {}
        for chunk in SegmentReader(self.wal.segment_path(ref.name)).chunks():
            batch = chunk.record_batch()
            hashed = key_hashes(batch, columns, self.converter)
            rows = np.flatnonzero(np.isin(hashed, wanted)).tolist()
            if not rows:
                continue
            shown = batch.take(pa.array(rows, pa.int64())).select(list(columns)).to_pylist()
            values = key_values(batch, columns, self.converter, rows)
            for row, value, plain in zip(rows, values, shown):
                text = "(" + ", ".join(f"{c}={v!r}" for c, v in plain.items()) + ")"
                found.setdefault(int(hashed[row]), {}).setdefault(value, text)
        return found


def check_one_task_per_key(wal: WalDir, keys: KeyColumns, batch_id: int,
                           reports: Sequence[tuple[SegmentRef, bytes | None]]) -> None:
    """Refuse batch ``batch_id`` (:class:`KeyInTwoTasksError`) when a key is in two of its
    tasks' segments; ``reports``: each segment with its task's :meth:`TaskKeys.to_bytes`.
    Runs in the commit, before the seal."""
    missing = [ref.partition for ref, data in reports if data is None]
    if missing:
        raise KeyInTwoTasksError(batch_id, "", tuple(missing), "unread",
                                 "its commit message holds no keys: a task of another release?")
    numbered = [(ref.partition, TaskKeys.from_bytes(data)) for ref, data in reports]
    refs = {ref.partition: ref for ref, _ in reports}
    for candidates in _candidates(numbered, keys):
        wanted: dict[tuple[str, ...], set[int]] = {}
        for candidate in candidates:
            wanted.setdefault(candidate.columns, set()).add(candidate.hashed)
        segments = _SegmentKeys(wal, refs, keys.converter, wanted)
        for candidate in candidates:
            try:
                held = [(p, segments.of(p, candidate.columns).get(candidate.hashed, {}))
                        for p in candidate.partitions]
            except Exception as exc:  # noqa: BLE001 - a segment that cannot be read: refuse
                raise KeyInTwoTasksError(batch_id, "", candidate.partitions, "unread",
                                         f"a segment could not be read back to compare keys "
                                         f"with hash {candidate.hashed:#018x}: {exc}") from exc
            _refuse_if_same(batch_id, candidate, held)


def _refuse_if_same(batch_id: int, candidate: _Candidate,
                    held: list[tuple[int, dict[tuple, str]]]) -> None:
    """Refuse when the first task's (the deleting one's, for a partition delete) key is one
    another task holds, or, for a row key or a static cell, when any two tasks hold one key.
    Different keys with one hash are left alone."""
    pairs = ([(held[0], other) for other in held[1:]] if candidate.kind == "partition-delete"
             else [(a, b) for i, a in enumerate(held) for b in held[i + 1:]])
    for (p, mine), (q, theirs) in pairs:
        same = mine.keys() & theirs.keys()
        if same:
            value = min(same, key=repr)
            raise KeyInTwoTasksError(batch_id, mine[value], (p, q), candidate.kind)


__all__ = ["keys_checked", "KeyColumns", "KeyCollector", "TaskKeys", "KeyInTwoTasksError",
           "check_one_task_per_key"]
