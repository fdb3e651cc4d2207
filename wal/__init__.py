"""Floor 1 of 4: a write-ahead log for Spark micro-batches bound for Cassandra, on disk. Knows
neither Spark nor Cassandra (floors: ``docs/architecture.md``).

Lifecycle of one batch N (the on-disk layout is on one page: ``wal/FORMAT.md``):

1. **Stage** (executor task, ``write()``): a :class:`~wal.segment.SegmentWriter` writes the
   task's rows as Arrow IPC chunks into an immutable segment file, checksummed, fsynced and
   renamed into place. Tasks open no database, so they never block one another.
2. **Seal** (Spark's commit worker, ``commit(N)``): :func:`~wal.seal.seal_batch` records the
   winning segments (losing attempts are simply not named) and fixes the batch's base write
   timestamp, atomically, before ``commit`` returns.
3. **Spark commits**: ``<checkpoint>/commits/N`` appears. Only now may N reach Cassandra.
4. **Ingest** (the single writer of the RocksDB log, in the Spark driver):
   :meth:`~wal.log.WalLog.ingest` verifies every sealed segment's checksum and copies its
   rows into the log for a writer that reads them there (a scale-out writer's tasks read the
   segments themselves: the log keeps the seal alone); state SEALED. Unnamed segments are
   deleted.
5. **Flush** (driven by :mod:`recovery`): FLUSHING, progress recorded chunk by chunk (or
   segment by segment) as Cassandra acknowledges; then **mark** FLUSHED.
6. **Retain** (:mod:`wal.retention`): flushed batches are dropped after a count/age.
7. **Reopen / replay**: after any crash, :func:`wal.catalog.describe` joins files, log and
   checkpoint and says, per batch, replay, discard or nothing; recovery acts on it.

Files beside the log: ``target.json`` (where the rows go), ``query.json`` (the stream the WAL
belongs to, :mod:`wal.binding`), ``blocked.json``, the pointer file in the checkpoint
(:mod:`wal.pointer`), a batch job's own WAL (:mod:`wal.batch_jobs`). Offline, ``cassandra-wal``
(:mod:`recovery.cli`) inspects, dumps and verifies without taking the lock; its ``repair``
(:mod:`wal.repair`) has Spark run batches again from the source when the WAL lost a
committed one.

On HDFS or S3 (:mod:`wal.remote`, over a :mod:`wal.store`), the same steps publish each file to
the store before they return (a segment in step 1, a seal *version* in step 2, the flushed
marker in step 5), and the folder above is the driver host's *working copy*, a cache that
step 4 pulls from the store and that any host can rebuild.
"""

from .errors import (
                     IllegalTransition,
                     NotAWal,
                     SegmentMissing,
                     SegmentTruncated,
                     UnsupportedFormat,
                     WalBoundElsewhere,
                     WalCorrupted,
                     WalError,
                     WalFull,
                     WalLocked,
)
from .layout import WalDir
from .log import BatchRecord, LogChunk, WalLog
from .seal import Seal, read_seal, seal_batch
from .segment import SegmentReader, SegmentRef, SegmentWriter
from .states import BatchState

__all__ = [
    "BatchRecord", "BatchState", "IllegalTransition", "LogChunk", "NotAWal", "Seal",
    "SegmentMissing", "SegmentReader", "SegmentRef", "SegmentTruncated", "SegmentWriter",
    "UnsupportedFormat", "WalBoundElsewhere", "WalCorrupted", "WalDir", "WalError", "WalFull",
    "WalLocked", "WalLog",
    "read_seal", "seal_batch",
]
