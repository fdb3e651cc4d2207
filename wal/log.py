"""The RocksDB log: the batch state machine and a local working copy of sealed rows.

One process at a time opens it for writing (RocksDB's own ``LOCK``): the sink's flusher in the
Spark driver, or ``cassandra-wal recover``. Readers (``cassandra-wal inspect``) open it as a
RocksDB *secondary* instance whose own files live in a private temporary folder, so they never
take the lock and never change a byte under the WAL directory.

Keys and values are specified in ``wal/FORMAT.md``, "The log". What a batch costs the driver
is linear in its segments: its seal is written once (``s/<batch>``) and decoded once per
process (:class:`_SealCache`), each acknowledgement is one small key (``p/<batch>/...``), and
the batch record (``b/<batch>``) holds only its state. A batch's rows are copied into the log
(``r/<batch>/...``) for a writer that reads them from here (``wal.flush.mode=driver``); for the
scale-out writers, whose tasks read the sealed segments where they are, the log keeps the seal
alone (:meth:`WalLog.ingest` with ``copy_rows=False``) and copies the rows only if a writer of
this process needs them later (:meth:`WalLog.copy_rows`). A log of format 1 (whose records
held the seal and the progress, rewritten at each acknowledgement) is rewritten to format 2, in
one synced write, when a writer first opens it; a log is of format 2 while every batch's rows
are in it (a release of format 2 can open it), and 3 from the first batch ingested without its
rows, in the same write; readers read all three.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field, replace
from typing import Iterator

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions
from tenacity import Retrying, stop_after_attempt

from . import format as fmt
from .errors import (
    IllegalTransition,
    RowsNotInLog,
    UnsupportedFormat,
    WalCorrupted,
    WalError,
    WalLocked,
    WalRepairing,
    WalStorageError,
)
from .files import DIR_MODE, make_private_dirs
from .layout import WalDir
from .seal import Seal, check_width, now_us
from .segment import SegmentReader
from .states import BatchState, check_transition


@dataclass(frozen=True)
class BatchRecord:
    """The log's view of one batch: its state (``b/<batch>``), its seal (``s/<batch>``) and
    its flush progress (the greatest ``p/<batch>/...`` key)."""

    batch: int
    state: BatchState
    seal: Seal | None = None
    next_segment: int = 0          # flush progress: first (segment, chunk) not yet acknowledged
    next_chunk: int = 0
    flushed_rows: int = 0          # acknowledged: the prefix's rows and the segments' beyond it
    updated_at_us: int = field(default_factory=now_us)
    reason: str = ""
    #: (segment, rows) of each segment at or after ``next_segment`` acknowledged whole, out of
    #: order (a scale-out writer's task finished it while an earlier one failed): not written
    #: again (``a/`` keys)
    acknowledged: tuple[tuple[int, int], ...] = ()
    #: whether the batch's rows are copied into the log (``r/`` keys); False: they are only in
    #: its sealed segments (ingested for a scale-out writer, whose tasks read the segments)
    rows_in_log: bool = True
    #: when the log took the sealed batch in (µs): for a stream, once Spark had committed it,
    #: so when the flusher saw the commit (None: a log written before it was kept)
    taken_at_us: int | None = None

    def to_json(self) -> bytes:
        """The whole view in one JSON object (a repair's manifest, dumps; and format 1's
        record)."""
        return json.dumps({
            "batch": self.batch, "state": self.state.value,
            "seal": self.seal.to_dict() if self.seal else None,
            "next_segment": self.next_segment, "next_chunk": self.next_chunk,
            "flushed_rows": self.flushed_rows, "updated_at_us": self.updated_at_us,
            "reason": self.reason, "acknowledged": [list(a) for a in self.acknowledged],
            "rows_in_log": self.rows_in_log, "taken_at_us": self.taken_at_us,
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "BatchRecord":
        """A :meth:`to_json` object (format 1's ``b/<batch>`` value)."""
        d = json.loads(data)
        return cls(batch=d["batch"], state=BatchState(d["state"]),
                   seal=Seal.from_dict(d["seal"]) if d["seal"] else None,
                   next_segment=d["next_segment"], next_chunk=d["next_chunk"],
                   flushed_rows=d["flushed_rows"], updated_at_us=d["updated_at_us"],
                   reason=d.get("reason", ""),
                   acknowledged=tuple(tuple(a) for a in d.get("acknowledged", ())),
                   rows_in_log=d.get("rows_in_log", True), taken_at_us=d.get("taken_at_us"))


@dataclass(frozen=True)
class _Head:
    """``b/<batch>`` of formats 2 and 3: the state, of the seal only its id and rows, and
    (format 3) whether the rows are in the log."""

    batch: int
    state: BatchState
    seal_id: str | None = None
    rows: int = 0                  # the seal's rows (FLUSHED: every one of them written)
    updated_at_us: int = field(default_factory=now_us)
    reason: str = ""
    rows_in_log: bool = True       # format 2 copied every batch's rows
    taken_at_us: int | None = None  # BatchRecord.taken_at_us

    def encode(self) -> bytes:
        return json.dumps({"batch": self.batch, "state": self.state.value,
                           "seal_id": self.seal_id, "rows": self.rows,
                           "updated_at_us": self.updated_at_us, "reason": self.reason,
                           "rows_in_log": self.rows_in_log, "taken_at_us": self.taken_at_us},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "_Head":
        d = json.loads(data)
        return cls(batch=d["batch"], state=BatchState(d["state"]), seal_id=d.get("seal_id"),
                   rows=d.get("rows", 0), updated_at_us=d["updated_at_us"],
                   reason=d.get("reason", ""), rows_in_log=d.get("rows_in_log", True),
                   taken_at_us=d.get("taken_at_us"))

    @classmethod
    def of(cls, record: BatchRecord) -> "_Head":
        seal = record.seal
        return cls(record.batch, record.state, seal.seal_id if seal else None,
                   seal.rows if seal else record.flushed_rows, record.updated_at_us,
                   record.reason, record.rows_in_log, record.taken_at_us)


def _progress_value(flushed_rows: int, at_us: int) -> bytes:
    return b"%d %d" % (flushed_rows, at_us)


class _SealCache:
    """Decoded seals by (batch, seal id): a seal of 2,000 segments is ~285 KB of JSON, decoded
    once per process rather than at every look at the log. Bounded; a batch leaves it when
    it leaves the log."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._seals: dict[int, Seal] = {}

    def get(self, batch: int, seal_id: str) -> Seal | None:
        seal = self._seals.get(batch)
        return seal if seal is not None and seal.seal_id == seal_id else None

    def put(self, seal: Seal) -> Seal:
        if len(self._seals) >= self.LIMIT and seal.batch not in self._seals:
            self._seals.pop(next(iter(self._seals)))
        self._seals[seal.batch] = seal
        return seal

    def drop(self, batch: int | None = None) -> None:
        """Forget ``batch`` (None: every batch)."""
        if batch is None:
            self._seals.clear()
        else:
            self._seals.pop(batch, None)


@dataclass(frozen=True)
class LogChunk:
    """A chunk of sealed rows read back from the log, checksum verified."""

    batch: int
    segment_index: int
    chunk_index: int
    first_row: int        # batch-wide position of the chunk's first row (write timestamp offset)
    rows: int
    payload: bytes


def _open_secondary(log_dir: str, scratch: str, attempts: int = 5) -> Rdict:
    """Open ``log_dir`` as a RocksDB secondary without writing a byte under it.

    rocksdict (re)writes ``rocksdict-config.json`` into whatever path it opens, secondary or
    not. So the secondary opens a *shadow* of the log inside ``scratch``: a symlink to every
    RocksDB file, and a private copy of that config. A writer may delete or add files between
    the listing and the open (flushes, compactions): then try again with a fresh listing.
    """
    config = "rocksdict-config.json"
    log_dir = os.path.abspath(log_dir)      # symlink targets must not be relative
    for attempt in Retrying(stop=stop_after_attempt(attempts), reraise=True):
        with attempt:
            return _open_shadow(log_dir, scratch, attempt.retry_state.attempt_number, config)


def _open_shadow(log_dir: str, scratch: str, attempt: int, config: str) -> Rdict:
    """One try of :func:`_open_secondary`: a fresh shadow of ``log_dir``, opened."""
    shadow = os.path.join(scratch, f"primary-{attempt}")
    os.mkdir(shadow)
    for name in os.listdir(log_dir):
        if name == config:
            shutil.copyfile(os.path.join(log_dir, name), os.path.join(shadow, name))
        else:
            os.symlink(os.path.join(log_dir, name), os.path.join(shadow, name))
    own_files = AccessType.secondary(os.path.join(scratch, f"secondary-{attempt}"))
    db = Rdict(shadow, Options(raw_mode=True), access_type=own_files)
    db.try_catch_up_with_primary()
    return db


def _private_log_dir(log_dir: str) -> None:
    """Create the RocksDB folder 0700 ourselves (RocksDB would make it 0755). RocksDB creates
    its files 0644 and rocksdict has no option to change that; inside 0700 folders no other
    user can reach them."""
    make_private_dirs(log_dir)
    if os.stat(log_dir).st_mode & 0o777 != DIR_MODE:
        os.chmod(log_dir, DIR_MODE)   # made by an older version


def _storage_errors(method):
    """Raise a RocksDB I/O failure of a writing method as :class:`WalStorageError` (rocksdict
    raises a plain ``Exception`` carrying RocksDB's status text, e.g. "IO error: No space left
    on device"), so the flusher can tell a full disk from a bug."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except WalError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is RocksDB's I/O error
            if str(exc).startswith("IO error"):
                raise WalStorageError(self.wal.log, str(exc)) from None
            raise
    return wrapper


#: The formats this release writes (FORMAT.md, "Log formats"); it reads format 1 too.
_WRITTEN_FORMATS = tuple(str(f).encode() for f in range(fmt.LOG_FORMAT_ROWS_IN_LOG,
                                                         fmt.LOG_FORMAT_VERSION + 1))


def _sync() -> WriteOptions:
    wo = WriteOptions()
    wo.sync = True
    return wo


class WalLog:
    """Open with :meth:`open_writer` (one process) or :meth:`open_reader` (any number)."""

    def __init__(self, wal: WalDir, db: Rdict, writable: bool, scratch: str | None = None):
        self.wal, self._db, self.writable, self._scratch = wal, db, writable, scratch
        self._sync = _sync()
        self._seals = _SealCache()
        #: format 1 (a reader of a log no writer of a later format opened yet), 2 or 3: only
        #: format 1 is read differently (a format-2 record has every batch's rows in the log)
        self.format = fmt.LOG_FORMAT_VERSION
        #: ``m/format`` as stored: 2 until the first batch is ingested without its rows
        self.stored_format = fmt.LOG_FORMAT_VERSION

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open_writer(cls, wal: WalDir, repairing: bool = False) -> "WalLog":
        """The log, for writing (RocksDB's lock: one process). A log a repair began and did
        not finish is fenced (``m/repair``): :class:`WalRepairing`, unless ``repairing`` (the
        repair itself, :mod:`wal.repair`, running again to finish it)."""
        wal.create().check()
        _private_log_dir(wal.log)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        try:
            db = Rdict(wal.log, opts)
        except Exception as exc:  # rocksdict raises a plain Exception carrying RocksDB's text
            if "lock" in str(exc).lower():
                raise WalLocked(wal.log, str(exc)) from None
            if str(exc).startswith("IO error"):   # a full or read-only disk: transient
                raise WalStorageError(wal.log, str(exc)) from None
            raise
        wal_log = cls(wal, db, writable=True)
        found = db.get(fmt.KEY_META_FORMAT)
        if found is None:
            db.put(fmt.KEY_META_FORMAT, str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode(), wal_log._sync)
            found = str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode()
        elif found == b"1":
            try:
                wal_log._upgrade_from_format_1()
            except BaseException:
                db.close()
                raise
            found = str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode()
        if found not in _WRITTEN_FORMATS:
            db.close()
            raise UnsupportedFormat(wal.log, found.decode(errors="replace"),
                                    fmt.LOG_FORMAT_VERSION)
        wal_log.stored_format = int(found)
        under_way = wal_log.repair_under_way()
        if under_way is not None and not repairing:
            db.close()
            raise WalRepairing(wal.root, int(under_way.get("from", -1)),
                               str(under_way.get("keep", "")))
        return wal_log

    @classmethod
    def open_reader(cls, wal: WalDir) -> "WalLog | None":
        """A read-only view beside a live writer; None when the WAL has no log yet."""
        wal.check()
        if not os.path.exists(os.path.join(wal.log, "CURRENT")):
            return None
        scratch = tempfile.mkdtemp(prefix="cassandra-wal-reader-")
        db = None
        try:
            db = _open_secondary(wal.log, scratch)
            found = db.get(fmt.KEY_META_FORMAT)
        except Exception as exc:
            if db is not None:
                db.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise WalCorrupted(wal.log, f"cannot open the RocksDB log: {exc}") from None
        if found is not None and found not in (b"1", *_WRITTEN_FORMATS):
            db.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise UnsupportedFormat(wal.log, found.decode(errors="replace"),
                                    fmt.LOG_FORMAT_VERSION)
        reader = cls(wal, db, writable=False, scratch=scratch)
        reader.format = 1 if found == b"1" else fmt.LOG_FORMAT_VERSION
        return reader

    @property
    def closed(self) -> bool:
        return self._db is None

    @property
    def db(self) -> Rdict:
        """The open RocksDB handle; a :class:`WalStorageError` (transient: the flusher reopens
        the log at its next drain) once it is closed, e.g. after a :meth:`reopen` failed."""
        if self._db is None:
            raise WalStorageError(self.wal.log, "the log is closed (a failed reopen after an "
                                                "I/O error): opened again at the next drain")
        return self._db

    def reopen(self) -> None:
        """Close and open the log again (writer only): after an I/O error RocksDB refuses
        every write until then, even once the disk has room again. If it cannot be opened
        (the disk still full or read-only), the log stays closed and this raises
        :class:`WalStorageError`: call it again later."""
        self.close()
        try:
            self._db = WalLog.open_writer(self.wal)._db
        except WalError:
            raise
        except Exception as exc:  # noqa: BLE001 - rocksdict's plain Exception, or an OSError
            raise WalStorageError(self.wal.log, f"cannot open the log again: {exc}") from None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> "WalLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------
    def get(self, batch: int) -> BatchRecord | None:
        raw = self.db.get(fmt.batch_key(batch))
        return self._view(fmt.batch_key(batch), raw) if raw is not None else None

    def records(self) -> list[BatchRecord]:
        return [self._view(k, v) for k, v in self._pages(fmt.KEY_BATCH_PREFIX,
                                                         fmt.prefix_end(fmt.KEY_BATCH_PREFIX),
                                                         size=256)]

    def _head(self, batch: int) -> _Head | None:
        """``b/<batch>`` alone: what a state check needs, O(1) whatever the seal's size."""
        raw = self.db.get(fmt.batch_key(batch))
        if raw is None:
            return None
        if self.format == 1:
            return _Head.of(self._view(fmt.batch_key(batch), raw))
        return self._decode_head(fmt.batch_key(batch), raw)

    def _decode_head(self, key: bytes, raw: bytes) -> _Head:
        try:
            return _Head.decode(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise WalCorrupted(self.wal.log, f"malformed batch record {key!r}: {exc}") from None

    def _view(self, key: bytes, raw: bytes) -> BatchRecord:
        """The whole view of a batch from its ``b/`` value: its seal (decoded once per
        process) and its progress (the greatest ``p/`` key: one seek)."""
        if self.format == 1:
            try:
                return BatchRecord.from_json(raw)
            except (ValueError, KeyError, TypeError) as exc:
                raise WalCorrupted(self.wal.log, f"malformed batch record {key!r}: {exc}") \
                    from None
        head = self._decode_head(key, raw)
        seal = self._seal(head)
        record = BatchRecord(head.batch, head.state, seal, flushed_rows=(
            head.rows if head.state is BatchState.FLUSHED else 0),
            updated_at_us=head.updated_at_us, reason=head.reason, rows_in_log=head.rows_in_log,
            taken_at_us=head.taken_at_us)
        if head.state is BatchState.FLUSHING:
            record = self._with_progress(record)
        return record

    def _seal(self, head: _Head) -> Seal | None:
        if head.seal_id is None:
            return None
        seal = self._seals.get(head.batch, head.seal_id)
        if seal is not None:
            return seal
        raw = self.db.get(fmt.seal_key(head.batch))
        try:
            seal = Seal.from_dict(json.loads(raw)) if raw is not None else None
        except (ValueError, KeyError, TypeError) as exc:
            raise WalCorrupted(self.wal.log, f"malformed seal of batch {head.batch} in the "
                                             f"log: {exc}", batch=head.batch) from None
        if seal is None or seal.seal_id != head.seal_id:
            raise WalCorrupted(self.wal.log, f"the log's seal of batch {head.batch} is "
                                             f"missing or not the one its record names",
                               batch=head.batch)
        return self._seals.put(seal)

    def _with_progress(self, record: BatchRecord) -> BatchRecord:
        prefix = fmt.progress_prefix(record.batch)
        it = self.db.iter()
        try:
            it.seek_for_prev(fmt.prefix_end(prefix))
            found = it.valid() and bytes(it.key()).startswith(prefix)
            key, value = (bytes(it.key()), bytes(it.value())) if found else (b"", b"")
        finally:
            del it
        if found:
            try:
                segment, chunk = (int(p) for p in key[len(prefix):].split(b"/"))
                rows, at_us = (int(p) for p in value.split())
            except ValueError:
                raise WalCorrupted(self.wal.log, f"unreadable progress {key!r} = {value!r}",
                                   batch=record.batch) from None
            record = replace(record, next_segment=segment, next_chunk=chunk, flushed_rows=rows,
                             updated_at_us=max(at_us, record.updated_at_us))
        acked, latest = [], record.updated_at_us
        lo = fmt.acked_prefix(record.batch)
        for key, value in self._pages(lo, fmt.prefix_end(lo), size=256):
            try:
                segment = int(key[len(lo):])
                rows, at_us = (int(p) for p in value.split())
            except ValueError:
                raise WalCorrupted(self.wal.log, f"unreadable acknowledgement {key!r} = "
                                                 f"{value!r}", batch=record.batch) from None
            if segment >= record.next_segment:      # the prefix has not passed it yet
                acked.append((segment, rows))
                latest = max(latest, at_us)
        if acked:
            record = replace(record, acknowledged=tuple(acked), updated_at_us=latest,
                             flushed_rows=record.flushed_rows + sum(r for _, r in acked))
        return record

    def flushed_through(self) -> int:
        """Highest batch id flushed so far (-1 if none): earlier batches need nothing more."""
        raw = self.db.get(fmt.KEY_FLUSHED_THROUGH)
        return int(raw) if raw is not None else -1

    def committed_through(self) -> int:
        """Highest batch id the log has seen Spark commit (-1 if none): see :meth:`note_committed`."""
        raw = self.db.get(fmt.KEY_COMMITTED_THROUGH)
        return int(raw) if raw is not None else -1

    def repair_under_way(self) -> dict | None:
        """What a repair that began and has not finished recorded (:meth:`begin_repair`):
        ``{"from", "keep", "checkpoint", "started_at_us"}``; None: no repair under way."""
        raw = self.db.get(fmt.KEY_REPAIR)
        if raw is None:
            return None
        try:
            return dict(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise WalCorrupted(self.wal.log, f"malformed {fmt.KEY_REPAIR!r}: {exc}") from None

    def chunks(self, batch: int, segment: int = 0, chunk: int = 0) -> Iterator[LogChunk]:
        """Sealed rows of ``batch`` in flush order, from (segment, chunk) on, verified.
        :class:`RowsNotInLog` for a batch ingested without its rows (never an empty batch)."""
        record = self.get(batch)
        if record is None or record.seal is None:
            return
        if not record.rows_in_log:
            raise RowsNotInLog(self.wal.log, batch)
        offsets = record.seal.row_offsets()
        current_seg, seen_rows = -1, 0
        prefix = fmt.rows_prefix(batch)
        for key, value in self._pages(prefix, fmt.prefix_end(prefix)):
            seg_i, chunk_i = (int(p) for p in key.decode().split("/")[2:4])
            if seg_i != current_seg:
                current_seg, seen_rows = seg_i, 0
            crc, rows = fmt.ROW_VALUE_HEAD.unpack_from(value)
            payload = value[fmt.ROW_VALUE_HEAD.size:]
            first_row = offsets[seg_i] + seen_rows
            seen_rows += rows
            if (seg_i, chunk_i) < (segment, chunk):
                continue
            if zlib.crc32(payload) != crc:
                raise WalCorrupted(self.wal.log, f"log chunk {seg_i}/{chunk_i} checksum mismatch",
                                   batch=batch, partition=record.seal.segments[seg_i].partition,
                                   segment=record.seal.segments[seg_i].name)
            yield LogChunk(batch, seg_i, chunk_i, first_row, rows, payload)

    def _pages(self, lo: bytes, hi: bytes, size: int = 8) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` in ``[lo, hi)``, read ``size`` at a time by a RocksDB iterator
        that is gone before any of them is handed out. RocksDB holds the log's writer lock
        while an iterator lives, closed or not: a reader suspended here (a flush stopped by
        an error, whose traceback keeps its frames) would otherwise keep the next owner of the
        WAL out."""
        ro = ReadOptions()
        ro.set_iterate_upper_bound(hi)
        start = lo
        while True:
            page = []
            items = self.db.items(from_key=start, read_opt=ro)
            for item in items:
                page.append(item)
                if len(page) == size:
                    break
            del items
            yield from page
            if len(page) < size:
                return
            start = page[-1][0] + b"\x00"    # the smallest key after the page's last

    # -- writing (state machine) ----------------------------------------------------------
    def _put(self, head: _Head, wb: WriteBatch | None = None, sync: bool = True) -> None:
        wb = wb if wb is not None else WriteBatch(raw_mode=True)
        wb.put(fmt.batch_key(head.batch), head.encode())
        if sync:
            self.db.write(wb, self._sync)
        else:
            self.db.write(wb)

    def _transition(self, batch: int, wanted: BatchState) -> _Head | None:
        current = self._head(batch)
        check_transition(batch, current.state if current else None, wanted)
        return current

    def _flushing(self, batch: int, what: str) -> _Head:
        """``batch``'s record, which must be FLUSHING for ``what`` to be recorded."""
        current = self._transition(batch, BatchState.FLUSHING)
        if current.state is not BatchState.FLUSHING:  # SEALED -> FLUSHING is begin_flush's edge
            raise IllegalTransition(batch, current.state.value, BatchState.FLUSHING.value,
                                    f"{what} is recorded only while flushing (begin_flush first)")
        return current

    @staticmethod
    def _clear_progress(wb: WriteBatch, batch: int) -> None:
        """``batch``'s progress and the segments acknowledged beyond it."""
        for prefix in (fmt.progress_prefix(batch), fmt.acked_prefix(batch)):
            wb.delete_range(prefix, fmt.prefix_end(prefix))

    def _clear(self, wb: WriteBatch, batch: int) -> None:
        """Everything of ``batch`` but its record: seal, progress, rows."""
        self._clear_progress(wb, batch)
        wb.delete_range(fmt.rows_prefix(batch), fmt.prefix_end(fmt.rows_prefix(batch)))
        wb.delete(fmt.seal_key(batch))
        self._seals.drop(batch)

    @_storage_errors
    def ingest(self, seal: Seal, copy_rows: bool = True, verify: bool = True) -> BatchRecord:
        """Take a final seal into the log -> SEALED, its segments' checksums verified.

        ``copy_rows``: and copy the segments' rows into the log, for a writer that reads them
        from here; False (a scale-out writer, whose tasks read the segments): the segments are
        read and verified against the seal, not copied, and the log keeps the seal alone;
        ``verify`` False too: not even read (a WAL on a store, whose tasks read and verify
        each its own segment from the store: ``wal/FORMAT.md``, "States").

        Idempotent: ingesting the same seal again returns the existing record. A segment that
        fails its checksum raises WalCorrupted naming it, and leaves the log as it was.
        """
        current = self._head(seal.batch)
        if current is not None and current.seal_id == seal.seal_id:
            return self.get(seal.batch)
        check_transition(seal.batch, current.state if current else None, BatchState.SEALED)
        check_width(seal.batch, seal.segments)
        if copy_rows:
            self._copy_segments(seal)
        elif verify:
            for ref in seal.segments:
                SegmentReader(self.wal.segment_path(ref.name), seal.batch, ref.partition,
                              ref.name).verify(expect=ref)
        taken_at_us = now_us()
        record = BatchRecord(seal.batch, BatchState.SEALED, seal=seal, rows_in_log=copy_rows,
                             updated_at_us=taken_at_us, taken_at_us=taken_at_us)
        wb = WriteBatch(raw_mode=True)
        if not copy_rows and self.stored_format < fmt.LOG_FORMAT_VERSION:
            # the first batch whose rows are not in the log: from now on a release of format
            # 2 must refuse the log, for it would take that batch for an empty one
            wb.put(fmt.KEY_META_FORMAT, str(fmt.LOG_FORMAT_VERSION).encode())
        self._clear_progress(wb, seal.batch)
        wb.put(fmt.seal_key(seal.batch), json.dumps(seal.to_dict(), sort_keys=True).encode())
        self._put(_Head.of(record), wb)   # synced: makes the row writes above durable too
        if not copy_rows:
            self.stored_format = fmt.LOG_FORMAT_VERSION
        self._seals.put(seal)
        return record

    @_storage_errors
    def copy_rows(self, batch: int) -> BatchRecord:
        """Copy the rows of ``batch`` (SEALED or FLUSHING, ingested without them) from its
        sealed segments into the log, verifying every checksum: for a writer that reads them
        from here, after a scale-out writer had the batch. Its progress and acknowledgements
        stay. A segment that fails its checksum raises WalCorrupted naming it, and leaves the
        log as it was."""
        current = self._head(batch)
        record = self.get(batch)
        if current is None or record.seal is None or current.state not in (
                BatchState.SEALED, BatchState.FLUSHING):
            raise IllegalTransition(batch, current.state.value if current else "absent",
                                    "rows copied", "only a sealed batch's rows are copied")
        if current.rows_in_log:
            return record
        self._copy_segments(record.seal)
        self._put(replace(current, rows_in_log=True))   # synced: the rows above durable too
        return replace(record, rows_in_log=True)

    def _copy_segments(self, seal: Seal) -> None:
        """``seal``'s segments into ``r/<batch>/...``, verified against the seal; on any
        failure none of them stays. Not synced: the caller's synced record write is."""
        lo, hi = fmt.rows_prefix(seal.batch), fmt.prefix_end(fmt.rows_prefix(seal.batch))
        self.db.delete_range(lo, hi)
        try:
            for seg_i, ref in enumerate(seal.segments):
                reader = SegmentReader(self.wal.segment_path(ref.name), seal.batch, ref.partition,
                                       ref.name)
                wb = WriteBatch(raw_mode=True)
                for chunk in reader.chunks():
                    head = fmt.ROW_VALUE_HEAD.pack(zlib.crc32(chunk.payload), chunk.rows)
                    wb.put(fmt.rows_key(seal.batch, seg_i, chunk.index), head + chunk.payload)
                    if wb.size_in_bytes() > (8 << 20):
                        self.db.write(wb)
                        wb = WriteBatch(raw_mode=True)
                if reader.verified_crc != ref.crc32 or reader.verified_rows != ref.rows:
                    raise WalCorrupted(reader.path, "segment differs from what its seal records",
                                       batch=seal.batch, partition=ref.partition, segment=ref.name)
                if not wb.is_empty():
                    self.db.write(wb)
        except BaseException:
            self.db.delete_range(lo, hi)
            raise

    @_storage_errors
    def note_committed(self, batch: int) -> None:
        """Record that Spark committed every batch up to ``batch`` (it commits strictly in order).

        Spark purges old ``commits/N`` files (it keeps ``spark.sql.streaming.minBatchesToRetain``
        of them), so the checkpoint alone cannot say a batch was committed once its file is gone;
        this record can. Synced: a restart must never take a committed batch for an uncommitted
        one and discard it.
        """
        if batch > self.committed_through():
            self.db.put(fmt.KEY_COMMITTED_THROUGH, str(batch).encode(), self._sync)

    @_storage_errors
    def note_skipped(self, batch: int) -> None:
        """Record that every batch up to ``batch`` is done, ``batch`` having nothing in this WAL
        (Spark committed it and this WAL's foreachBatch writer was never called for it:
        :mod:`wal.entries`). No record of the batch is kept. Synced, as a mark."""
        if batch > self.flushed_through():
            self.db.put(fmt.KEY_FLUSHED_THROUGH, str(batch).encode(), self._sync)

    @_storage_errors
    def begin_repair(self, record: dict) -> None:
        """Fence the log for a repair (:mod:`wal.repair`) before it changes anything: until
        :meth:`rewind` ends it, every :meth:`open_writer` but the repair's raises
        :class:`WalRepairing`. Synced."""
        self.db.put(fmt.KEY_REPAIR, json.dumps(record, sort_keys=True).encode(), self._sync)

    @_storage_errors
    def rewind(self, batch: int) -> None:
        """Forget every batch from ``batch`` on (records and rows), lower ``m/flushed_through``
        and ``m/committed_through`` to ``batch - 1`` where higher, and lift a repair's fence:
        one synced write, so a crash leaves the log as it was or rewound. Only a repair calls
        this, once Spark's checkpoint no longer holds those batches (:mod:`wal.repair`): a
        committed batch is otherwise never thrown away."""
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(fmt.batch_key(batch), fmt.prefix_end(fmt.KEY_BATCH_PREFIX))
        wb.delete_range(fmt.seal_key(batch), fmt.prefix_end(fmt.KEY_SEAL_PREFIX))
        wb.delete_range(fmt.progress_prefix(batch), fmt.prefix_end(fmt.KEY_PROGRESS_PREFIX))
        wb.delete_range(fmt.acked_prefix(batch), fmt.prefix_end(fmt.KEY_ACKED_PREFIX))
        wb.delete_range(fmt.rows_prefix(batch), fmt.prefix_end(fmt.KEY_ROWS_PREFIX))
        self._seals.drop()
        for key, current in ((fmt.KEY_FLUSHED_THROUGH, self.flushed_through()),
                             (fmt.KEY_COMMITTED_THROUGH, self.committed_through())):
            if current >= batch:
                if batch > 0:
                    wb.put(key, str(batch - 1).encode())
                else:
                    wb.delete(key)
        wb.delete(fmt.KEY_REPAIR)
        self.db.write(wb, self._sync)

    @_storage_errors
    def begin_flush(self, batch: int) -> BatchRecord:
        current = self._transition(batch, BatchState.FLUSHING)
        self._put(replace(current, state=BatchState.FLUSHING, updated_at_us=now_us()))
        return self.get(batch)

    @_storage_errors
    def record_progress(self, batch: int, next_segment: int, next_chunk: int,
                        flushed_rows: int) -> BatchRecord:
        """Everything before (next_segment, next_chunk) is acknowledged by Cassandra.

        One small key (``p/<batch>/<next_segment>/<next_chunk>``), whatever the batch's size:
        the record and the seal are not rewritten. Not synced: losing the latest progress only
        means replaying a few chunks again, which writes identical cells.
        """
        current = self._flushing(batch, "progress")
        at_us = now_us()
        self.db.put(fmt.progress_key(batch, next_segment, next_chunk),
                    _progress_value(flushed_rows, at_us))
        return BatchRecord(batch, BatchState.FLUSHING, self._seal(current), next_segment,
                           next_chunk, flushed_rows, max(at_us, current.updated_at_us),
                           current.reason, rows_in_log=current.rows_in_log,
                           taken_at_us=current.taken_at_us)

    @_storage_errors
    def record_acknowledged(self, batch: int, segment: int, rows: int) -> None:
        """Segment ``segment`` (its index in the seal) is acknowledged whole, beyond the
        progress (an earlier segment is not): a retry does not write it again. One small key
        (``a/<batch>/<segment>``), not synced, as progress: losing it means writing the
        segment again, identical cells."""
        self._flushing(batch, "acknowledgements")
        self.db.put(fmt.acked_key(batch, segment), _progress_value(rows, now_us()))

    @_storage_errors
    def mark_flushed(self, batch: int) -> BatchRecord:
        current = self._transition(batch, BatchState.FLUSHED)
        head = replace(current, state=BatchState.FLUSHED, updated_at_us=now_us())
        wb = WriteBatch(raw_mode=True)
        self._clear_progress(wb, batch)
        if batch > self.flushed_through():
            wb.put(fmt.KEY_FLUSHED_THROUGH, str(batch).encode())
        self._put(head, wb)
        return BatchRecord(batch, BatchState.FLUSHED, self._seal(head),
                           flushed_rows=head.rows, updated_at_us=head.updated_at_us,
                           reason=head.reason, taken_at_us=head.taken_at_us)

    @_storage_errors
    def discard(self, batch: int, reason: str) -> BatchRecord:
        self._transition(batch, BatchState.DISCARDED)
        record = BatchRecord(batch, BatchState.DISCARDED, reason=reason)
        wb = WriteBatch(raw_mode=True)
        self._clear(wb, batch)
        self._put(_Head.of(record), wb)
        return record

    @_storage_errors
    def forget(self, batch: int) -> None:
        """Drop a finished batch's record and rows (retention). Only FLUSHED or DISCARDED."""
        current = self.get(batch)
        if current is None:
            return
        if current.state not in (BatchState.FLUSHED, BatchState.DISCARDED):
            raise ValueError(f"batch {batch} is {current.state}: only finished batches are forgotten")
        wb = WriteBatch(raw_mode=True)
        self._clear(wb, batch)
        wb.delete(fmt.batch_key(batch))
        self.db.write(wb, self._sync)

    def _upgrade_from_format_1(self) -> None:
        """Rewrite a format-1 log (each record held its seal and its progress) to format 2, in
        one synced write: a crash leaves it as it was (opened again, it is upgraded then) or
        upgraded. Rows, marks and the repair fence are the same in both formats."""
        self.format = 1
        records = self.records()
        wb = WriteBatch(raw_mode=True)
        for record in records:
            wb.put(fmt.batch_key(record.batch), _Head.of(record).encode())
            if record.seal is not None:
                wb.put(fmt.seal_key(record.batch),
                       json.dumps(record.seal.to_dict(), sort_keys=True).encode())
            if record.state is BatchState.FLUSHING and (record.next_segment or record.next_chunk):
                wb.put(fmt.progress_key(record.batch, record.next_segment, record.next_chunk),
                       _progress_value(record.flushed_rows, record.updated_at_us))
        wb.put(fmt.KEY_META_FORMAT, str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode())
        self.db.write(wb, self._sync)
        self.format = fmt.LOG_FORMAT_VERSION
        self._seals.drop()
