"""Segment files: one immutable file per (batch, partition, task attempt), written by a task.

Framing, byte order and checksum coverage are specified in ``wal/FORMAT.md`` ("Segment
files"). A segment is written under a temporary name, fsynced and renamed into place, so a
complete name always means a complete file; a crash mid-write leaves only a ``.tmp`` file that
nothing references and retention removes.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from dataclasses import asdict, dataclass
from typing import Iterator

import pyarrow as pa

from . import format as fmt
from .errors import SegmentMissing, SegmentTruncated, WalCorrupted
from .files import FILE_MODE, fsync_dir, make_private_dirs
from .layout import WalDir


@dataclass(frozen=True)
class SegmentRef:
    """What a task reports about the segment it wrote (it travels in the commit message)."""

    name: str          # relative to WAL_DIR/segments: "<batch>/<partition>-<attempt>-<token>.seg"
    partition: int
    attempt: int
    rows: int
    chunks: int
    bytes: int
    crc32: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SegmentRef":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Chunk:
    """One Arrow IPC stream (schema + one record batch) and where it sits."""

    index: int
    rows: int
    payload: bytes

    def record_batch(self) -> pa.RecordBatch:
        return decode_chunk(self.payload)


def encode_chunk(batch: pa.RecordBatch, options: pa.ipc.IpcWriteOptions | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_chunk(payload: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(payload))
    return reader.read_next_batch()


class SegmentWriter:
    """Writes one segment. Use as a context manager: an exception removes the partial file."""

    def __init__(self, wal: WalDir, batch_id: int, partition: int, attempt: int,
                 header: dict | None = None, compression: str | None = None):
        self.wal, self.batch_id, self.partition, self.attempt = wal, batch_id, partition, attempt
        folder = wal.batch_segments(batch_id)
        make_private_dirs(folder)
        token = uuid.uuid4().hex[:12]
        base = f"{partition:05d}-{attempt:03d}-{token}"
        self.name = f"{fmt.batch_name(batch_id)}/{base}{fmt.SEGMENT_SUFFIX}"
        self._final = wal.segment_path(self.name)
        self._tmp = self._final + fmt.TMP_SUFFIX
        self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        self._crc = 0
        self._bytes = 0
        self.rows = 0
        self.chunks = 0
        self._options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None
        head = dict(header or {}, batch=batch_id, partition=partition, attempt=attempt,
                    format=fmt.FORMAT_VERSION)
        body = json.dumps(head, sort_keys=True).encode()
        try:
            self._write(fmt.SEGMENT_MAGIC + fmt.HEADER_LEN.pack(len(body)) + body)
        except BaseException:   # a full disk: no writer to abort yet, so the file goes here
            self.abort()
            raise

    def _write(self, data: bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)
        self._bytes += len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def append(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        payload = encode_chunk(batch, self._options)
        self._write(fmt.CHUNK_HEAD.pack(len(payload), batch.num_rows, zlib.crc32(payload)))
        self._write(payload)
        self.rows += batch.num_rows
        self.chunks += 1

    def finish(self) -> SegmentRef:
        """Write the footer, fsync, and rename into place. Returns the segment's reference."""
        self._write(fmt.FOOTER.pack(fmt.FOOTER_MAGIC, self.chunks, self.rows, 0)[:-4])
        crc = self._crc  # covers every byte before the checksum itself
        os.write(self._fd, crc.to_bytes(4, "little"))
        self._bytes += 4
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self._tmp, self._final)
        folder = os.path.dirname(self._final)
        fsync_dir(folder)
        # And the batch folder's own entry in segments/: the task that created it may have
        # died between its mkdir and its fsync (make_private_dirs), and this segment is about
        # to be named in a seal.
        fsync_dir(os.path.dirname(folder))
        if self.wal.remote:     # a WAL on a store: published there before the task reports it
            try:
                self.wal.remote.publish_segment(self.name, self._final)
            finally:            # a spool keeps nothing, published or not (Spark retries the task)
                if self.wal.spool_for:
                    os.unlink(self._final)
        return SegmentRef(self.name, self.partition, self.attempt, self.rows, self.chunks,
                          self._bytes, crc)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "SegmentWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class SegmentReader:
    """Reads and verifies a segment file; every chunk's checksum is checked as it is read."""

    def __init__(self, path: str, batch: int | None = None, partition: int | None = None,
                 name: str | None = None):
        self.path, self.batch, self.partition = path, batch, partition
        self.name = name or os.path.basename(path)

    def _corrupt(self, detail: str, offset: int | None = None, truncated: bool = False):
        cls = SegmentTruncated if truncated else WalCorrupted
        return cls(self.path, detail, batch=self.batch, partition=self.partition,
                   segment=self.name, offset=offset)

    def header(self) -> dict:
        with open(self.path, "rb") as f:
            return self._read_header(f)[0]

    def _read_header(self, f) -> tuple[dict, bytes]:
        start = f.read(len(fmt.SEGMENT_MAGIC) + fmt.HEADER_LEN.size)
        if len(start) < len(fmt.SEGMENT_MAGIC) + fmt.HEADER_LEN.size:
            raise self._corrupt("file ends inside the header", 0, truncated=True)
        if start[: len(fmt.SEGMENT_MAGIC)] != fmt.SEGMENT_MAGIC:
            raise self._corrupt("bad segment magic", 0)
        (length,) = fmt.HEADER_LEN.unpack_from(start, len(fmt.SEGMENT_MAGIC))
        body = f.read(length)
        if len(body) < length:
            raise self._corrupt("file ends inside the header", len(start), truncated=True)
        try:
            head = json.loads(body)
        except ValueError:
            raise self._corrupt("header is not JSON", len(start)) from None
        return head, start + body

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """Yield every chunk from index ``start`` on, verified; then check the footer.

        Chunks before ``start`` are read and checksummed too (the whole-file checksum covers
        them), but not yielded.
        """
        try:
            size = os.path.getsize(self.path)
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise SegmentMissing(self.path, "segment file is missing", batch=self.batch,
                                 partition=self.partition, segment=self.name) from None
        with f:
            head, raw = self._read_header(f)
            crc = zlib.crc32(raw)
            pos, index, rows = len(raw), 0, 0
            footer_at = size - fmt.FOOTER.size
            while pos < footer_at:
                chunk_head = f.read(fmt.CHUNK_HEAD.size)
                if len(chunk_head) < fmt.CHUNK_HEAD.size:
                    raise self._corrupt("file ends inside a chunk header", pos, truncated=True)
                length, nrows, chunk_crc = fmt.CHUNK_HEAD.unpack(chunk_head)
                if pos + fmt.CHUNK_HEAD.size + length > footer_at:
                    raise self._corrupt(f"chunk {index} runs past the footer "
                                        f"(length {length})", pos, truncated=True)
                payload = f.read(length)
                if zlib.crc32(payload) != chunk_crc:
                    raise self._corrupt(f"chunk {index} checksum mismatch", pos)
                crc = zlib.crc32(payload, zlib.crc32(chunk_head, crc))
                if index >= start:
                    yield Chunk(index, nrows, payload)
                pos += fmt.CHUNK_HEAD.size + length
                index += 1
                rows += nrows
            footer = f.read(fmt.FOOTER.size)
            if len(footer) < fmt.FOOTER.size:
                raise self._corrupt("no footer (segment truncated)", pos, truncated=True)
            magic, nchunks, nrows, file_crc = fmt.FOOTER.unpack(footer)
            if magic != fmt.FOOTER_MAGIC:
                raise self._corrupt("bad footer magic (segment truncated or overwritten)",
                                    pos, truncated=True)
            crc = zlib.crc32(footer[:-4], crc)
            if file_crc != crc:
                raise self._corrupt("segment checksum mismatch", pos)
            if nchunks != index or nrows != rows:
                raise self._corrupt(f"footer says {nchunks} chunks/{nrows} rows, "
                                    f"found {index}/{rows}", pos)
        self.verified_rows, self.verified_crc = rows, crc

    def verify(self, expect: SegmentRef | None = None) -> tuple[int, int]:
        """Read everything; return (rows, crc32). Compare with ``expect`` when given."""
        for _ in self.chunks(start=1 << 62):
            pass
        if expect is not None:
            if self.verified_crc != expect.crc32:
                raise self._corrupt(f"checksum {self.verified_crc:#010x} differs from the "
                                    f"sealed {expect.crc32:#010x}")
            if self.verified_rows != expect.rows:
                raise self._corrupt(f"{self.verified_rows} rows, sealed with {expect.rows}")
        return self.verified_rows, self.verified_crc
