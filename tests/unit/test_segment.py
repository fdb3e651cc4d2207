"""Segment files (wal/segment.py, FORMAT.md "Segment files"): one named test per edge case.

Damage is made by hand: a byte flipped or the file cut at a known offset, located with an
independent parse of the framing (``_layout``), so each test says exactly which part it hits.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import stat
import zlib

import pyarrow as pa
import pytest

from wal import format as fmt
from wal.errors import SegmentTruncated, WalCorrupted
from wal.layout import WalDir
from wal.segment import SegmentReader, SegmentRef, SegmentWriter, decode_chunk, encode_chunk

pytestmark = pytest.mark.unit

UTC = dt.timezone.utc


# -- helpers ------------------------------------------------------------------------------

def typed_batch() -> pa.RecordBatch:
    """Spark's column types as Arrow gives them to a Python data source, nulls in every column."""
    return pa.record_batch({
        "i64": pa.array([1, None, -(2**63)], pa.int64()),
        "i32": pa.array([7, 2**31 - 1, None], pa.int32()),
        "s": pa.array(["é", None, ""], pa.string()),
        "ts": pa.array([dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC), None,
                        dt.datetime(1970, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
        "d": pa.array([dt.date(2024, 2, 29), dt.date(1, 1, 1), None], pa.date32()),
        "dec": pa.array([decimal.Decimal("12345678901234567890.1234567890"), None,
                         decimal.Decimal("-0.0000000001")], pa.decimal128(38, 10)),
        "bin": pa.array([b"\x00\xff", None, b""], pa.binary()),
        "lst": pa.array([[1, None, 3], None, []], pa.list_(pa.int64())),
        "map": pa.array([[("k", 1), ("z", None)], None, []], pa.map_(pa.string(), pa.int64())),
        "f64": pa.array([1.5, None, float("-inf")], pa.float64()),
        "flag": pa.array([True, False, None], pa.bool_()),
    })


def simple_batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "v": pa.array([f"row-{i}" for i in range(start, start + n)])})


def write_segment(wal: WalDir, batches, batch_id=7, partition=1, attempt=0, **kw) -> SegmentRef:
    with SegmentWriter(wal, batch_id, partition, attempt, **kw) as writer:
        for b in batches:
            writer.append(b)
        return writer.finish()


def reader_for(wal: WalDir, ref: SegmentRef, batch_id=7) -> SegmentReader:
    return SegmentReader(wal.segment_path(ref.name), batch_id, ref.partition, ref.name)


def _layout(data: bytes) -> dict:
    """Independent parse of the framing: offsets of the header JSON, each chunk, the footer."""
    pos = len(fmt.SEGMENT_MAGIC)
    (hlen,) = fmt.HEADER_LEN.unpack_from(data, pos)
    pos += fmt.HEADER_LEN.size
    out = {"header_len_at": len(fmt.SEGMENT_MAGIC), "json": (pos, pos + hlen), "chunks": []}
    pos += hlen
    footer_at = len(data) - fmt.FOOTER.size
    while pos < footer_at:
        length, _rows, _crc = fmt.CHUNK_HEAD.unpack_from(data, pos)
        head_end = pos + fmt.CHUNK_HEAD.size
        out["chunks"].append({"head": (pos, head_end), "payload": (head_end, head_end + length)})
        pos = head_end + length
    assert pos == footer_at
    out["footer"] = (footer_at, len(data))
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _flip(path: str, original: bytes, offset: int, mask: int = 0xFF) -> None:
    damaged = bytearray(original)
    damaged[offset] ^= mask
    with open(path, "wb") as f:
        f.write(bytes(damaged))


def _rows(reader: SegmentReader) -> list[dict]:
    return [row for c in reader.chunks() for row in c.record_batch().to_pylist()]


@pytest.fixture
def small(wal):
    """A segment of three chunks (2, 1, 3 rows) and its bytes."""
    ref = write_segment(wal, [simple_batch(0, 2), simple_batch(2, 1), simple_batch(3, 3)])
    path = wal.segment_path(ref.name)
    return ref, path, _read(path)


# -- round trips --------------------------------------------------------------------------

def test_round_trip_keeps_every_arrow_type_and_value(wal):
    batch = typed_batch()
    ref = write_segment(wal, [batch])
    chunks = list(reader_for(wal, ref).chunks())
    assert len(chunks) == 1
    back = chunks[0].record_batch()
    assert back.schema == batch.schema
    assert back.equals(batch)
    assert back.to_pylist() == batch.to_pylist()


def test_round_trip_keeps_timestamp_time_zone_and_unit(wal):
    batch = pa.record_batch({"ts": pa.array([0, 1], pa.timestamp("us", tz="Europe/Paris"))})
    ref = write_segment(wal, [batch])
    back = next(reader_for(wal, ref).chunks()).record_batch()
    assert back.schema.field("ts").type == pa.timestamp("us", tz="Europe/Paris")


def test_round_trip_of_an_all_null_batch(wal):
    schema = typed_batch().schema
    batch = pa.RecordBatch.from_arrays([pa.nulls(4, f.type) for f in schema], schema=schema)
    ref = write_segment(wal, [batch])
    back = next(reader_for(wal, ref).chunks()).record_batch()
    assert back.equals(batch)
    assert all(back.column(i).null_count == 4 for i in range(back.num_columns))


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_round_trip_with_compression(wal, compression):
    batch = typed_batch()
    ref = write_segment(wal, [batch, batch], compression=compression)
    assert ref.chunks == 2 and ref.rows == 6
    assert [c.record_batch().equals(batch) for c in reader_for(wal, ref).chunks()] == [True, True]


def test_round_trip_of_many_chunks_keeps_order(wal):
    ref = write_segment(wal, [simple_batch(i * 10, 10) for i in range(25)])
    reader = reader_for(wal, ref)
    assert [r["id"] for r in _rows(reader)] == list(range(250))
    assert [c.index for c in reader.chunks()] == list(range(25))


def test_chunk_payload_is_a_self_contained_arrow_stream(wal):
    batch = typed_batch()
    ref = write_segment(wal, [batch])
    payload = next(reader_for(wal, ref).chunks()).payload
    assert decode_chunk(payload).equals(batch)
    assert decode_chunk(encode_chunk(batch)).equals(batch)


def test_empty_segment_has_zero_rows_and_verifies(wal):
    ref = write_segment(wal, [])
    assert (ref.rows, ref.chunks) == (0, 0)
    reader = reader_for(wal, ref)
    assert list(reader.chunks()) == []
    assert reader.verify(ref) == (0, ref.crc32)
    assert ref.bytes == os.path.getsize(wal.segment_path(ref.name))


def test_zero_row_batch_writes_no_chunk(wal):
    ref = write_segment(wal, [simple_batch(0, 0), simple_batch(0, 2), simple_batch(2, 0)])
    assert (ref.rows, ref.chunks) == (2, 1)
    assert [c.rows for c in reader_for(wal, ref).chunks()] == [2]


def test_header_carries_location_and_caller_fields(wal):
    ref = write_segment(wal, [simple_batch(0, 1)], batch_id=9, partition=3, attempt=2,
                        header={"query_id": "q-1", "columns": ["id", "v"]})
    head = SegmentReader(wal.segment_path(ref.name)).header()
    assert head == {"batch": 9, "partition": 3, "attempt": 2, "format": fmt.FORMAT_VERSION,
                    "query_id": "q-1", "columns": ["id", "v"]}


def test_header_fields_cannot_override_the_location(wal):
    ref = write_segment(wal, [], batch_id=9, partition=3, attempt=2,
                        header={"batch": 1, "partition": 0, "attempt": 0})
    head = SegmentReader(wal.segment_path(ref.name)).header()
    assert (head["batch"], head["partition"], head["attempt"]) == (9, 3, 2)


def test_name_follows_the_format(wal):
    ref = write_segment(wal, [], batch_id=42, partition=5, attempt=1)
    folder, base = ref.name.split("/")
    assert folder == "00000000000000000042"
    part, att, token = base[: -len(".seg")].split("-")
    assert (part, att, len(token)) == ("00005", "001", 12)
    assert base.endswith(fmt.SEGMENT_SUFFIX)


def test_two_runs_of_the_same_attempt_get_distinct_names(wal):
    names = {write_segment(wal, [simple_batch(0, 1)], partition=0, attempt=0).name
             for _ in range(20)}
    assert len(names) == 20
    assert len(wal.segment_files(7)) == 20


# -- chunks(start) and verify() -----------------------------------------------------------

def test_chunks_from_a_start_index_yields_only_later_chunks(small):
    ref, path, _ = small
    chunks = list(SegmentReader(path).chunks(start=1))
    assert [(c.index, c.rows) for c in chunks] == [(1, 1), (2, 3)]
    assert [r["id"] for c in chunks for r in c.record_batch().to_pylist()] == [2, 3, 4, 5]


def test_chunks_from_the_last_index_yields_one_chunk(small):
    _ref, path, _ = small
    assert [c.index for c in SegmentReader(path).chunks(start=2)] == [2]


def test_chunks_from_past_the_end_yields_nothing_and_still_verifies(small):
    ref, path, _ = small
    reader = SegmentReader(path)
    assert list(reader.chunks(start=3)) == []
    assert (reader.verified_rows, reader.verified_crc) == (ref.rows, ref.crc32)


def test_chunks_from_a_start_index_still_checks_skipped_chunks(small):
    _ref, path, data = small
    first_payload = _layout(data)["chunks"][0]["payload"]
    _flip(path, data, first_payload[0] + 3)
    with pytest.raises(WalCorrupted, match="chunk 0 checksum"):
        list(SegmentReader(path).chunks(start=2))


def test_verify_returns_rows_and_crc_of_the_ref(small):
    ref, path, data = small
    assert SegmentReader(path).verify(ref) == (6, ref.crc32)
    assert ref.crc32 == zlib.crc32(data[:-4])
    assert ref.bytes == len(data)
    assert (ref.rows, ref.chunks) == (6, 3)


def test_verify_without_a_ref_checks_the_file_alone(small):
    ref, path, _ = small
    assert SegmentReader(path).verify() == (ref.rows, ref.crc32)


def test_verify_rejects_a_ref_with_another_crc(small):
    ref, path, _ = small
    other = SegmentRef(**{**ref.to_dict(), "crc32": ref.crc32 ^ 1})
    with pytest.raises(WalCorrupted, match="differs from the sealed"):
        SegmentReader(path).verify(other)


def test_verify_rejects_a_ref_with_other_rows(small):
    ref, path, _ = small
    other = SegmentRef(**{**ref.to_dict(), "rows": ref.rows + 1})
    with pytest.raises(WalCorrupted, match="sealed with 7"):
        SegmentReader(path).verify(other)


def test_segment_ref_dict_round_trip(small):
    ref, _path, _ = small
    assert SegmentRef.from_dict(ref.to_dict()) == ref
    assert SegmentRef.from_dict({**ref.to_dict(), "extra": 1}) == ref


# -- damage: flipped bytes ----------------------------------------------------------------

def test_flipped_byte_in_chunk_payload_is_corrupted_at_that_chunk(small, wal):
    ref, path, data = small
    chunk = _layout(data)["chunks"][1]
    _flip(path, data, (chunk["payload"][0] + chunk["payload"][1]) // 2, 0x01)
    with pytest.raises(WalCorrupted, match="chunk 1 checksum mismatch") as exc:
        reader_for(wal, ref).verify()
    assert not isinstance(exc.value, SegmentTruncated)
    assert exc.value.offset == chunk["head"][0]
    assert (exc.value.batch, exc.value.partition, exc.value.segment) == (7, 1, ref.name)


@pytest.mark.parametrize("field_at", range(fmt.CHUNK_HEAD.size))
def test_flipped_byte_in_chunk_header_is_corrupted(small, field_at):
    ref, path, data = small
    head = _layout(data)["chunks"][1]["head"]
    _flip(path, data, head[0] + field_at, 0x01)
    with pytest.raises(WalCorrupted):
        SegmentReader(path).verify(ref)


def test_flipped_rows_count_in_chunk_header_is_caught_by_the_file_checksum(small):
    ref, path, data = small
    head = _layout(data)["chunks"][0]["head"]
    _flip(path, data, head[0] + 4, 0x01)   # u32 rows: not covered by the chunk's own CRC
    with pytest.raises(WalCorrupted, match="segment checksum mismatch"):
        SegmentReader(path).verify()


def test_flipped_byte_in_header_json_is_corrupted(small):
    ref, path, data = small
    start, end = _layout(data)["json"]
    for offset in range(start, end):
        _flip(path, data, offset, 0x01)
        with pytest.raises(WalCorrupted):
            SegmentReader(path).verify(ref)


def test_flipped_byte_in_header_length_is_corrupted(small):
    ref, path, data = small
    at = _layout(data)["header_len_at"]
    for offset in range(at, at + fmt.HEADER_LEN.size):
        _flip(path, data, offset, 0x01)
        with pytest.raises(WalCorrupted):
            SegmentReader(path).verify(ref)


def test_flipped_byte_in_magic_is_corrupted(small):
    _ref, path, data = small
    _flip(path, data, 3)
    with pytest.raises(WalCorrupted, match="bad segment magic") as exc:
        SegmentReader(path).verify()
    assert exc.value.offset == 0


def test_flipped_byte_in_footer_is_corrupted(small):
    ref, path, data = small
    start, end = _layout(data)["footer"]
    for offset in range(start, end):
        _flip(path, data, offset, 0x01)
        with pytest.raises(WalCorrupted):
            SegmentReader(path).verify(ref)


def test_every_flipped_byte_is_detected(wal):
    ref = write_segment(wal, [simple_batch(0, 2), simple_batch(2, 1)])
    path = wal.segment_path(ref.name)
    data = _read(path)
    for offset in range(len(data)):
        _flip(path, data, offset)
        try:
            SegmentReader(path).verify(ref)
        except WalCorrupted:
            continue
        pytest.fail(f"a flipped byte at offset {offset} of {len(data)} went unnoticed")


# -- damage: truncation -------------------------------------------------------------------

def test_truncation_at_every_offset_is_detected(wal):
    ref = write_segment(wal, [simple_batch(0, 2), simple_batch(2, 1)])
    path = wal.segment_path(ref.name)
    data = _read(path)
    kinds = set()
    for size in range(len(data)):
        with open(path, "wb") as f:
            f.write(data[:size])
        try:
            rows = [c.rows for c in SegmentReader(path).chunks()]
        except SegmentTruncated as exc:
            kinds.add(type(exc))
            continue
        except WalCorrupted as exc:   # acceptable too, but never a success or another type
            kinds.add(type(exc))
            continue
        pytest.fail(f"a file cut to {size} of {len(data)} bytes read as {rows}")
    assert kinds == {SegmentTruncated}


def test_truncated_segment_is_a_wal_corrupted_naming_the_segment(small, wal):
    ref, path, data = small
    with open(path, "wb") as f:
        f.write(data[:-1])
    with pytest.raises(SegmentTruncated) as exc:
        reader_for(wal, ref).verify()
    assert isinstance(exc.value, WalCorrupted)
    assert (exc.value.batch, exc.value.partition, exc.value.segment) == (7, 1, ref.name)
    assert ref.name in str(exc.value)


def test_empty_file_is_truncated(small):
    _ref, path, _data = small
    open(path, "wb").close()
    with pytest.raises(SegmentTruncated, match="inside the header"):
        SegmentReader(path).header()


def test_bytes_appended_after_the_footer_are_corrupted(small):
    ref, path, data = small
    with open(path, "ab") as f:
        f.write(b"\x00" * 7)
    with pytest.raises(WalCorrupted):
        SegmentReader(path).verify(ref)


def test_missing_file_is_corrupted_naming_it(small, wal):
    ref, path, _data = small
    os.unlink(path)
    with pytest.raises(WalCorrupted, match="missing") as exc:
        reader_for(wal, ref).verify(ref)
    assert not isinstance(exc.value, SegmentTruncated)
    assert (exc.value.batch, exc.value.segment) == (7, ref.name)


# -- files on disk ------------------------------------------------------------------------

def _all_files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, _dirs, names in os.walk(root) for n in names)


def test_no_tmp_left_after_finish(wal):
    ref = write_segment(wal, [simple_batch(0, 3)])
    files = _all_files(wal.segments)
    assert files == [ref.name]
    assert not any(f.endswith(fmt.TMP_SUFFIX) for f in _all_files(wal.root))


def test_no_tmp_left_after_an_exception_inside_with(wal):
    with pytest.raises(RuntimeError, match="task failed"):
        with SegmentWriter(wal, 7, 0, 0) as writer:
            writer.append(simple_batch(0, 3))
            raise RuntimeError("task failed")
    assert _all_files(wal.segments) == []
    assert wal.segment_files(7) == []


def test_no_tmp_left_after_an_exception_before_any_chunk(wal):
    with pytest.raises(KeyError):
        with SegmentWriter(wal, 7, 0, 0):
            raise KeyError("x")
    assert _all_files(wal.segments) == []


def test_abort_twice_is_harmless(wal):
    writer = SegmentWriter(wal, 7, 0, 0)
    writer.abort()
    writer.abort()
    assert _all_files(wal.segments) == []


def test_file_is_visible_under_its_final_name_only_when_complete(wal):
    with SegmentWriter(wal, 7, 0, 0) as writer:
        writer.append(simple_batch(0, 3))
        final = wal.segment_path(writer.name)
        assert not os.path.exists(final)
        assert wal.segment_files(7) == []
        assert _all_files(wal.segments) == [writer.name + fmt.TMP_SUFFIX]
        ref = writer.finish()
        assert os.path.exists(final)
    assert wal.segment_files(7) == [ref.name]
    assert os.path.getsize(final) == ref.bytes


def test_file_mode_0600_and_dir_0700(wal):
    ref = write_segment(wal, [simple_batch(0, 1)])
    assert stat.S_IMODE(os.stat(wal.segment_path(ref.name)).st_mode) == 0o600
    for folder in (wal.root, wal.segments, wal.batch_segments(7)):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder


def test_folders_are_private_when_a_task_creates_them(tmp_path):
    """An executor task may be the first to touch the WAL directory (no create() yet)."""
    fresh = WalDir(str(tmp_path / "new" / "wal"))
    ref = write_segment(fresh, [simple_batch(0, 1)])
    assert stat.S_IMODE(os.stat(fresh.segment_path(ref.name)).st_mode) == 0o600
    for folder in (fresh.root, fresh.segments, fresh.batch_segments(7)):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder



def test_finish_syncs_the_segment_and_its_batch_folders_entry(tmp_path, monkeypatch):
    # The task that created segments/<batch> may have died between its mkdir and the fsync of
    # segments/; the segment about to be sealed must not depend on that fsync.
    wal = WalDir(str(tmp_path / "wal")).create()
    synced = []
    monkeypatch.setattr("wal.segment.fsync_dir", synced.append)
    with SegmentWriter(wal, 7, 0, 0) as writer:
        writer.append(pa.record_batch({"id": pa.array([1, 2], pa.int64())}))
        ref = writer.finish()
    assert os.path.exists(wal.segment_path(ref.name))
    assert synced == [wal.batch_segments(7), wal.segments]


def test_a_header_that_cannot_be_written_leaves_no_file(wal, monkeypatch):
    """Found by the simulation's disk faults (tests/sim/README.md, "Disk full", seed 2118): on
    a full disk the header's write in the constructor failed, and with no writer returned
    nothing aborted it: the partial .tmp stayed (a store's task spool, which nothing else
    cleans, kept one per failed attempt) and so did its file descriptor."""
    import errno

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SegmentWriter, "_write", full)
    with pytest.raises(OSError):
        SegmentWriter(wal, 0, 0, 0)
    folder = wal.batch_segments(0)
    assert os.listdir(folder) == []
