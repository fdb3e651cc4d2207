"""Seals: the durable record that fixes which segments make up a batch, and its timestamps.

A seal is written by the sink's commit (``commit(N)`` in Spark's commit worker) *before* it
returns, so Spark never writes ``commits/N`` for a batch the WAL cannot reproduce (invariant 3
in ``docs/guarantees.md``). Until ``commits/N`` exists a later execution of batch N may replace
the seal; after that it is final. File format: ``wal/FORMAT.md``, "Seal files".
"""

from __future__ import annotations

import json
import hashlib
import threading
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from .amendments import read_amendment
from .clock import now_us
from . import format as fmt
from .errors import BatchTooWide, WalCorrupted
from .files import atomic_write
from .sealed_write import SealedWrite
from .layout import WalDir
from .segment import SegmentRef

COMMIT_POINT_CHECKPOINT = "spark-checkpoint"   # streaming: final once commits/N exists
COMMIT_POINT_SEAL = "seal"                     # batch df.write / foreachBatch: final when sealed


class TimestampClaims(Protocol):
    """Where a batch job's timestamps start: above every timestamp the table's other jobs
    claimed (:class:`wal.batch_jobs.TableTimestamps`)."""

    def claim(self, base_ts_us: int, rows: int) -> int:
        """The base timestamp for ``rows`` rows, at least ``base_ts_us``, above every earlier
        claim; recorded before it returns."""


@dataclass(frozen=True)
class Seal:
    batch: int
    segments: tuple[SegmentRef, ...]
    base_ts_us: int
    query_id: str = ""
    commit_point: str = COMMIT_POINT_CHECKPOINT
    seal_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sealed_at_us: int = field(default_factory=now_us)
    #: How and where the rows are written, fixed when the batch is sealed. None in seals of
    #: format 1's first releases: written with the options of the query as it runs.
    write: SealedWrite | None = None

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    @property
    def last_ts_us(self) -> int:
        """The largest write timestamp any row of this batch gets."""
        return self.base_ts_us + max(self.rows - 1, 0)

    def row_offsets(self) -> list[int]:
        """Batch-wide position of each segment's first row (segments are in partition order)."""
        out, acc = [], 0
        for seg in self.segments:
            out.append(acc)
            acc += seg.rows
        return out

    def to_dict(self) -> dict:
        return {
            "batch": self.batch, "query_id": self.query_id, "seal_id": self.seal_id,
            "commit_point": self.commit_point, "base_ts_us": self.base_ts_us,
            "sealed_at_us": self.sealed_at_us, "rows": self.rows,
            "segments": [s.to_dict() for s in self.segments],
            "write": self.write.to_dict() if self.write is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Seal":
        return cls(batch=d["batch"], segments=tuple(SegmentRef.from_dict(s) for s in d["segments"]),
                   base_ts_us=d["base_ts_us"], query_id=d.get("query_id", ""),
                   commit_point=d["commit_point"], seal_id=d["seal_id"],
                   sealed_at_us=d["sealed_at_us"],
                   write=SealedWrite.from_dict(d["write"]) if d.get("write") else None)


def encode_seal(seal: Seal) -> bytes:
    body = json.dumps(seal.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    return body + b"\n" + f"crc32:{zlib.crc32(body):08x}\n".encode()


def decode_seal(data: bytes, path: str, batch: int | None = None) -> Seal:
    body, sep, tail = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or not tail.startswith(b"crc32:"):
        raise WalCorrupted(path, "seal has no checksum line (truncated?)", batch=batch,
                           segment=path)
    try:
        want = int(tail[6:], 16)
    except ValueError:
        raise WalCorrupted(path, "seal checksum line unreadable", batch=batch, segment=path) from None
    if zlib.crc32(body) != want:
        raise WalCorrupted(path, "seal checksum mismatch", batch=batch, segment=path)
    try:
        return Seal.from_dict(json.loads(body))
    except (ValueError, KeyError, TypeError) as exc:
        raise WalCorrupted(path, f"seal content invalid: {exc}", batch=batch, segment=path) from None


class _DecodedSeals:
    """Seal files decoded in this process, by path and by their bytes (a SHA-1 digest): a
    drain, a commit's backlog and a health look each read every pending seal; a seal of 2,000
    segments is ~285 KB of JSON (~8.5 ms to decode, well under 1 ms to read and digest), decoded
    once per process while its bytes stay the same. Not by the file's inode, size and mtime: a
    replaced seal often gets the freed inode of an earlier one, has the same size, and on a
    filesystem with coarse timestamps the same mtime. Bounded; thread-safe."""

    LIMIT = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seals: OrderedDict[str, tuple[bytes, Seal]] = OrderedDict()

    def read(self, path: str, batch: int) -> Seal | None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        identity = hashlib.sha1(data, usedforsecurity=False).digest()
        with self._lock:
            found = self._seals.get(path)
            if found is not None and found[0] == identity:
                self._seals.move_to_end(path)
                return found[1]
        seal = decode_seal(data, path, batch)
        with self._lock:
            self._seals[path] = (identity, seal)
            self._seals.move_to_end(path)
            while len(self._seals) > self.LIMIT:
                self._seals.popitem(last=False)
        return seal


_decoded = _DecodedSeals()


def read_seal(wal: WalDir, batch: int) -> Seal | None:
    """The seal of ``batch`` (None: none), decoded once per process while its file stays."""
    return _decoded.read(wal.seal_path(batch), batch)


def write_seal(wal: WalDir, seal: Seal) -> None:
    """Durably (re)place the seal of ``seal.batch``: a crash leaves the old one or the new.
    On a store, a new version of it first (:mod:`wal.remote`): the store is the WAL."""
    data = encode_seal(seal)
    if wal.remote:
        wal.remote.publish_seal(seal.batch, data)
    atomic_write(wal.seal_path(seal.batch), data)


def next_base_timestamp(wal: WalDir, batch: int, clock_us: int | None = None) -> int:
    """Close to wall-clock time, and greater than every timestamp of every earlier batch.

    Looks at the seals of batches before ``batch`` (as amended, :mod:`wal.amendments`);
    retention always keeps the newest seal, so the chain of timestamps never goes backwards
    even when the clock does.
    """
    after_previous_seal = 0
    for other in reversed(wal.sealed_batch_ids()):
        if other >= batch:
            continue
        prev = read_seal(wal, other)
        if prev is not None:
            after_previous_seal = last_written_ts_us(wal, prev) + 1
            break
    return max(clock_us if clock_us is not None else now_us(), after_previous_seal)


def last_written_ts_us(wal: WalDir, seal: Seal) -> int:
    """The largest write timestamp ``seal``'s batch gets or got: its own, or above it where an
    operator re-stamped the batch above a column's drop (:mod:`wal.amendments`)."""
    amendment = read_amendment(wal, seal.batch)
    if amendment is None or not amendment.amends(seal):
        return seal.last_ts_us
    return max(seal.last_ts_us, amendment.apply(seal).last_ts_us)


def check_width(batch: int, segments: tuple[SegmentRef, ...]) -> None:
    """Refuse a batch whose segments or chunks the log's keys cannot order (:class:`BatchTooWide`)."""
    if len(segments) > fmt.MAX_SEGMENTS_PER_BATCH:
        raise BatchTooWide(batch, "segments (one per Spark task that wrote rows)",
                           len(segments), fmt.MAX_SEGMENTS_PER_BATCH)
    widest = max((s.chunks for s in segments), default=0)
    if widest > fmt.MAX_CHUNKS_PER_SEGMENT:
        raise BatchTooWide(batch, "chunks in one segment", widest, fmt.MAX_CHUNKS_PER_SEGMENT)


def seal_batch(wal: WalDir, batch: int, segments: list[SegmentRef], query_id: str = "",
               commit_point: str = COMMIT_POINT_CHECKPOINT, write: SealedWrite | None = None,
               shared_timestamps: TimestampClaims | None = None,
               seal_id: str | None = None) -> Seal:
    """Choose the winning segments' order, fix the timestamps, and write the seal.
    ``seal_id``: the one the caller announced (a foreachBatch writer's entry names it).

    ``shared_timestamps``: a batch job's table's last timestamp
    (:class:`wal.batch_jobs.TableTimestamps`). Each job has a WAL of its own, so its seals alone say
    nothing of other jobs' timestamps; the table's last timestamp does, and is raised
    (durably) before the seal is written."""
    ordered = tuple(sorted(segments, key=lambda s: (s.partition, s.attempt, s.name)))
    check_width(batch, ordered)
    if wal.remote:      # the previous seal may have been written on another host
        wal.remote.pull_seals(wal.root)
    base_ts_us = next_base_timestamp(wal, batch)
    if shared_timestamps is not None:
        base_ts_us = shared_timestamps.claim(base_ts_us, sum(s.rows for s in ordered))
    seal = Seal(batch=batch, segments=ordered, base_ts_us=base_ts_us,
                query_id=query_id, commit_point=commit_point, write=write,
                **({"seal_id": seal_id} if seal_id else {}))
    write_seal(wal, seal)
    return seal
