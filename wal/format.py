"""Constants of the WAL's on-disk format. The whole layout is specified in ``wal/FORMAT.md``;
change nothing here without changing that page and ``FORMAT_VERSION`` (the files) or
``LOG_FORMAT_VERSION`` (the RocksDB log).
"""

from __future__ import annotations

import struct

FORMAT_NAME = "cassandra-wal"
FORMAT_VERSION = 1           # the files under WAL_DIR (WAL_FORMAT)
FORMAT_CHANGES = 2           # WAL_FORMAT of a local WAL once a change stream writes it: the same
                             # files, and seals an older release would misread (FORMAT.md)
LOG_FORMAT_VERSION = 3       # the RocksDB log's keys (m/format), the highest this release writes
LOG_FORMAT_ROWS_IN_LOG = 2   # a log every batch of which has its rows in it: what a new log is,
                             # and format 1's upgrade; raised to 3 with its first seal-only batch
                             # (FORMAT.md, "Log formats")

# Files and folders under WAL_DIR (FORMAT.md, "Directory").
MARKER_FILE = "WAL_FORMAT"
TARGET_FILE = "target.json"
FLUSHED_THROUGH_FILE = "flushed_through"   # highest flushed batch id, ASCII (shared copy)
REPAIR_FILE = "repair.json"                # in a repair's kept copy: what it removed (wal/repair.py)
REPAIR_DIR_PREFIX = "repair-"              # WAL_DIR/repair-<UTC time>/: a repair's kept copy
BINDING_FILE = "query.json"                # the query a stream's WAL belongs to (wal/binding.py)
BLOCKED_FILE = "blocked.json"              # the flusher cannot go on: why (WalDir.read_blocked)
MOVED_FILE = "moved.json"                  # the stream's WAL moved away from this one (wal/move.py)
POINTER_FILE = "cassandra_wal_sink.json"   # in a stream's checkpoint: its WAL (before POINTERS_DIR)
SEGMENTS_DIR = "segments"
SEALS_DIR = "seals"
ENTRIES_DIR = "entered"                    # a foreachBatch writer's entries (wal/entries.py)
AMENDMENTS_DIR = "amended"                 # operators' amendments of sealed batches (wal/amendments.py)
ENTRIES_SINCE_FILE = "since"               # in entered/: the first batch entries were kept for
POINTERS_DIR = "cassandra_wal_sinks"       # in a stream's checkpoint: one file per WAL it uses
LOG_DIR = "log"
SEAL_SUFFIX = ".seal"
ENTRY_SUFFIX = ".json"
AMENDMENT_SUFFIX = ".json"
SEGMENT_SUFFIX = ".seg"
TMP_SUFFIX = ".tmp"

# A batch job's table root (FORMAT.md, "Batch jobs"): one WAL per job under it.
JOBS_DIR = "jobs"
DONE_DIR = "done"             # flushed job WALs, moved out of jobs/ in one rename, then removed
LAST_TS_FILE = "last_ts"
TABLE_LOCK_FILE = "lock"
JOB_LOCK_FILE = "job.lock"

# Segment framing (FORMAT.md, "Segment files"). Little-endian throughout.
SEGMENT_MAGIC = b"CWALSEG1"
FOOTER_MAGIC = b"CWALEND1"
HEADER_LEN = struct.Struct("<I")            # u32 length of the JSON header that follows
CHUNK_HEAD = struct.Struct("<III")          # u32 payload length, u32 rows, u32 crc32(payload)
FOOTER = struct.Struct("<8sIQI")            # magic, u32 chunks, u64 rows, u32 crc32(all before)

# RocksDB log keys (FORMAT.md, "The log"). Batch ids are zero-padded to 20 digits so that
# byte order is numeric order.
KEY_META_FORMAT = b"m/format"
KEY_FLUSHED_THROUGH = b"m/flushed_through"
KEY_COMMITTED_THROUGH = b"m/committed_through"
KEY_REPAIR = b"m/repair"                    # a repair under way (wal/repair.py): the log is fenced
KEY_BATCH_PREFIX = b"b/"
KEY_SEAL_PREFIX = b"s/"                     # the batch's seal, written once when ingested
KEY_PROGRESS_PREFIX = b"p/"                 # one small key per acknowledgement
KEY_ACKED_PREFIX = b"a/"                    # a whole segment acknowledged beyond the progress
KEY_ROWS_PREFIX = b"r/"
ROW_VALUE_HEAD = struct.Struct("<II")       # u32 crc32(payload), u32 rows


def batch_name(batch_id: int) -> str:
    return f"{batch_id:020d}"


def batch_key(batch_id: int) -> bytes:
    return KEY_BATCH_PREFIX + batch_name(batch_id).encode()


def seal_key(batch_id: int) -> bytes:
    return KEY_SEAL_PREFIX + batch_name(batch_id).encode()


def progress_prefix(batch_id: int) -> bytes:
    return KEY_PROGRESS_PREFIX + batch_name(batch_id).encode() + b"/"


#: The log's keys give a segment's index 5 digits and a chunk's 8, so that key order is flush
#: order (the greatest progress key is the progress; rows are read in key order): a batch has
#: at most this many segments (one per Spark task that wrote rows), a segment this many chunks.
#: A seal beyond them is refused (``wal.errors.BatchTooWide``): a sixth digit would sort
#: segment 100000 before 99999, and a drain would skip rows.
MAX_SEGMENTS_PER_BATCH = 99_999
MAX_CHUNKS_PER_SEGMENT = 99_999_999


def progress_key(batch_id: int, next_segment: int, next_chunk: int) -> bytes:
    """Key order is flush order: the greatest key of a batch is its progress."""
    return progress_prefix(batch_id) + f"{next_segment:05d}/{next_chunk:08d}".encode()


def acked_prefix(batch_id: int) -> bytes:
    return KEY_ACKED_PREFIX + batch_name(batch_id).encode() + b"/"


def acked_key(batch_id: int, segment_index: int) -> bytes:
    return acked_prefix(batch_id) + f"{segment_index:05d}".encode()


def rows_prefix(batch_id: int) -> bytes:
    return KEY_ROWS_PREFIX + batch_name(batch_id).encode() + b"/"


def rows_key(batch_id: int, segment_index: int, chunk_index: int) -> bytes:
    return rows_prefix(batch_id) + f"{segment_index:05d}/{chunk_index:08d}".encode()


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
