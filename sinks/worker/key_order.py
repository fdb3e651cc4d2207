"""One key, one task: what a change stream in sealed order needs within a batch.

A change stream (``op.column``) without a ``writetime`` column is written at the seal's
timestamps, which follow the batch's segments in Spark's partition order. Within one task that
is the order the task read its rows in; across two tasks it is no order of the source's. So a
key whose changes are in two tasks' segments of one batch could end with its earlier change:
an upsert beating the delete that came after it. Nothing at flush time can tell.

The check, for such streams only:

1. each task reports the keys it staged, in its commit message (:class:`TaskKeys`, 64-bit
   hashes of :mod:`recovery.cql.key_identity`, about 8 bytes a distinct key): the primary keys of its
   upserts and row deletes; with ``op.partitionDeleteValues``, also the partition keys of all
   its rows and of its partition deletes (a partition delete touches every row of its
   partition);
2. the commit (:func:`check_one_task_per_key`), before the seal, refuses the batch when a key
   is in two tasks' segments, or a partition deleted in one task is written in another,
   naming the key (read back from the segment) and the two remedies. Nothing is sealed, so
   Spark never commits the batch; it runs it again after a restart, and is refused again
   until the stream keeps each key in one partition or gives a source order.

A stream with a ``writetime`` column needs no check (the column decides, whatever the task),
and a stream that is no change stream is an upsert stream, whose documented rule is "the last
in sealed order wins".
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
from recovery.cql.key_identity import key_hashes
from recovery.target import Target
from wal.layout import WalDir
from wal.segment import SegmentReader, SegmentRef

_EMPTY = np.zeros(0, dtype=np.uint64)


def keys_checked(write: WriteConfig) -> bool:
    """Whether a batch's keys must each be in one task: a change stream in sealed order."""
    return write.op_column is not None and write.writetime_column is None


class KeyInTwoTasksError(SinkError):
    """A key's changes are in two tasks' segments of one batch of a change stream in sealed
    order: refused at the commit, before the seal."""

    _fields: ClassVar[tuple[str, ...]] = ("batch_id", "key", "partitions", "partition_delete")

    def __init__(self, batch_id: int, key: str, partitions: tuple[int, int],
                 partition_delete: bool = False) -> None:
        self.batch_id, self.key, self.partitions = batch_id, key, tuple(partitions)
        self.partition_delete = partition_delete
        what = ("partition " + key + " is deleted in one task and written in another"
                if partition_delete else "key " + key + " has changes in two tasks")
        super().__init__(
            f"batch {batch_id}: {what} (Spark partitions {partitions[0]} and "
            f"{partitions[1]}). The sink writes a batch's changes in Spark's partition order, "
            f"which across tasks is not the source's, so an earlier change could win; nothing "
            f"was sealed, and the batch is refused again until either each key's changes are "
            f"in one partition, in source order (a source partitioned by key, such as a Kafka "
            f"topic keyed by the row's key, read without a shuffle before the sink), or "
            f"`writetime` names a column in source order (docs/user-guide.md, 'Change streams')")


@dataclass(frozen=True)
class KeyColumns:
    """The key columns of a target, as the DataFrame names them, and their converter."""

    partition: tuple[str, ...]
    clustering: tuple[str, ...]
    converter: RowConverter

    @property
    def primary(self) -> tuple[str, ...]:
        return self.partition + self.clustering

    @classmethod
    def of(cls, target: Target) -> "KeyColumns":
        table = target.table
        key = [c for c in target.columns if table.resolve_column(c) in table.primary_key]
        partition = tuple(c for c in key if table.resolve_column(c) in table.partition_key)
        clustering = tuple(c for c in key if c not in partition)
        return cls(partition, clustering, row_converter(table, key))


@dataclass(frozen=True, eq=False)
class TaskKeys:
    """The distinct key hashes one task staged, sorted: ``rows`` (the primary keys of its
    upserts and row deletes); with partition deletes possible, ``partitions`` (the partition
    keys of all its rows) and ``deleted`` (those of its partition deletes)."""

    rows: np.ndarray
    partitions: np.ndarray
    deleted: np.ndarray

    def to_bytes(self) -> bytes:
        counts = np.array([len(self.rows), len(self.partitions), len(self.deleted)], "<u8")
        return b"".join(a.astype("<u8").tobytes()
                        for a in (counts, self.rows, self.partitions, self.deleted))

    @classmethod
    def from_bytes(cls, data: bytes) -> "TaskKeys":
        counts = np.frombuffer(data, "<u8", 3)
        arrays, start = [], 24
        for count in counts.tolist():
            arrays.append(np.frombuffer(data, "<u8", count, start).astype(np.uint64))
            start += 8 * count
        return cls(*arrays)


class KeyCollector:
    """In a task: the keys of every record batch it stages, reported by :meth:`finish`."""

    def __init__(self, keys: KeyColumns, write: WriteConfig) -> None:
        self.keys, self.write = keys, write
        self._rows: list[np.ndarray] = []
        self._partitions: list[np.ndarray] = []
        self._deleted: list[np.ndarray] = []

    def add(self, batch: pa.RecordBatch) -> None:
        kinds = changes.operations(batch.column(self.write.op_column), self.write)
        whole = kinds == changes.PARTITION_DELETE
        converter = self.keys.converter
        partitions = key_hashes(batch, self.keys.partition, converter)
        rows = key_hashes(batch, self.keys.clustering, converter, start=partitions)
        self._rows.append(rows[~whole])
        if self.write.partition_delete_values:
            self._partitions.append(partitions)
            self._deleted.append(partitions[whole])

    def finish(self) -> bytes:
        def union(parts: list[np.ndarray]) -> np.ndarray:
            return _distinct(np.concatenate(parts)) if parts else _EMPTY
        return TaskKeys(union(self._rows), union(self._partitions),
                        union(self._deleted)).to_bytes()


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


def _holders(numbered: Sequence[tuple[int, np.ndarray]], hashed: np.uint64) -> list[int]:
    return [p for p, h in numbered if np.isin(hashed, h)]


def _row_in_two(numbered: Sequence[tuple[int, TaskKeys]]) -> tuple[int, int, int] | None:
    rows = [(p, k.rows) for p, k in numbered]
    shared = _shared(rows)
    if not len(shared):
        return None
    first, second = _holders(rows, shared[0])[:2]
    return int(shared[0]), first, second


def _deleted_elsewhere(numbered: Sequence[tuple[int, TaskKeys]]) -> tuple[int, int, int] | None:
    """A partition deleted in one task (first) and written in another (second)."""
    if not any(len(k.deleted) for _, k in numbered):
        return None
    partitions = [(p, k.partitions) for p, k in numbered]
    shared = _shared(partitions)
    for p, k in numbered:
        hit = np.intersect1d(k.deleted, shared)
        if len(hit):
            other = next(q for q in _holders(partitions, hit[0]) if q != p)
            return int(hit[0]), p, other
    return None


def _key_text(wal: WalDir, ref: SegmentRef, hashed: int, columns: Sequence[str],
              converter: RowConverter) -> str:
    """The key with hash ``hashed`` as the segment of ``ref`` holds it (``(a=1, b='x')``); its
    hash in hex when the segment cannot be read (the error names the key either way)."""
    try:
        if wal.remote:
            wal.remote.fetch_segments(wal.root, [ref.name])
        for chunk in SegmentReader(wal.segment_path(ref.name)).chunks():
            batch = chunk.record_batch()
            found = np.flatnonzero(key_hashes(batch, columns, converter) == np.uint64(hashed))
            if len(found):
                row = batch.slice(int(found[0]), 1).select(list(columns)).to_pylist()[0]
                return "(" + ", ".join(f"{c}={v!r}" for c, v in row.items()) + ")"
    except Exception:       # noqa: BLE001 - naming the key is a courtesy; the refusal stands
        pass
    return f"with hash {hashed:#018x}"


def check_one_task_per_key(wal: WalDir, keys: KeyColumns, batch_id: int,
                           reports: Sequence[tuple[SegmentRef, bytes | None]]) -> None:
    """Refuse batch ``batch_id`` (:class:`KeyInTwoTasksError`) when a key is in two of its
    tasks' segments; ``reports``: each segment with its task's :meth:`TaskKeys.to_bytes`
    (None from a task that staged no rows). Runs in the commit, before the seal."""
    staged = [(ref, TaskKeys.from_bytes(data)) for ref, data in reports if data is not None]
    by_partition = {ref.partition: ref for ref, _ in staged}
    numbered = [(ref.partition, k) for ref, k in staged]
    found = _row_in_two(numbered)
    columns, partition_delete = keys.primary, False
    if found is None:
        found = _deleted_elsewhere(numbered)
        columns, partition_delete = keys.partition, True
    if found is None:
        return
    hashed, first, second = found
    key = _key_text(wal, by_partition[first], hashed, columns, keys.converter)
    raise KeyInTwoTasksError(batch_id, key, (first, second), partition_delete)


__all__ = ["keys_checked", "KeyColumns", "KeyCollector", "TaskKeys", "KeyInTwoTasksError",
           "check_one_task_per_key"]
