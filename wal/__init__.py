"""A write-ahead log for Spark micro-batches bound for Cassandra.

Lifecycle of one batch N (the on-disk layout is on one page: ``wal/FORMAT.md``):

1. **Stage** (executor task, ``write()``): a :class:`~wal.segment.SegmentWriter` writes the
   task's rows as Arrow IPC chunks into an immutable segment file, checksummed, fsynced and
   renamed into place. Tasks open no database, so they never block one another.
2. **Seal** (Spark's commit worker, ``commit(N)``): :func:`~wal.seal.seal_batch` records the
   winning segments (losing attempts are simply not named) and fixes the batch's base write
   timestamp, atomically, before ``commit`` returns.
3. **Spark commits**: ``<checkpoint>/commits/N`` appears. Only now may N reach Cassandra.
4. **Ingest** (the single writer of the RocksDB log, in the Spark driver):
   :meth:`~wal.log.WalLog.ingest` copies the sealed segments into the log, verifying every
   checksum; state SEALED. Unnamed segments are deleted.
5. **Flush** (``recovery.replay``): FLUSHING, chunk by chunk, progress recorded, with
   idempotent upserts at the sealed timestamps; then **mark** FLUSHED.
6. **Retain** (:mod:`wal.retention`): flushed batches are dropped after a count/age.
7. **Reopen / replay**: after any crash, :func:`wal.catalog.describe` joins files, log and
   checkpoint and says, per batch, replay, discard or nothing; recovery acts on it.

Offline, ``cassandra-wal`` (``wal/cli``) inspects, dumps and verifies without taking the lock.
"""

from .errors import (IllegalTransition, NotAWal, SealMissing, SegmentTruncated,
                     UnsupportedFormat, WalBoundElsewhere, WalCorrupted, WalError, WalFull,
                     WalLocked)
from .layout import WalDir
from .log import BatchRecord, LogChunk, WalLog
from .seal import Seal, read_seal, seal_batch
from .segment import SegmentReader, SegmentRef, SegmentWriter
from .states import BatchState

__all__ = [
    "BatchRecord", "BatchState", "IllegalTransition", "LogChunk", "NotAWal", "Seal",
    "SealMissing", "SegmentReader", "SegmentRef", "SegmentTruncated", "SegmentWriter",
    "UnsupportedFormat", "WalBoundElsewhere", "WalCorrupted", "WalDir", "WalError", "WalFull",
    "WalLocked", "WalLog",
    "read_seal", "seal_batch",
]
