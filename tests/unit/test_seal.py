"""Seal files (wal/seal.py, FORMAT.md "Seal files"): one named test per edge case."""

from __future__ import annotations

import json
import os
import stat
import zlib

import pytest

from wal import format as fmt
from wal.errors import WalCorrupted
from wal.layout import WalDir
from wal.seal import (COMMIT_POINT_CHECKPOINT, COMMIT_POINT_SEAL, Seal, decode_seal,
                      encode_seal, next_base_timestamp, read_seal, seal_batch, write_seal)
from wal.segment import SegmentRef

pytestmark = pytest.mark.unit


def ref(batch: int, partition: int, attempt: int = 0, rows: int = 3) -> SegmentRef:
    name = f"{fmt.batch_name(batch)}/{partition:05d}-{attempt:03d}-{partition:012x}.seg"
    return SegmentRef(name, partition, attempt, rows, chunks=1, bytes=100 + rows,
                      crc32=(partition * 7919 + attempt) & 0xFFFFFFFF)


def make_seal(batch: int = 5, rows=(3, 4), base_ts_us: int = 1_000_000, **kw) -> Seal:
    segs = tuple(ref(batch, p, rows=r) for p, r in enumerate(rows))
    return Seal(batch=batch, segments=segs, base_ts_us=base_ts_us, **kw)


def seal_at(wal: WalDir, batch: int, rows: int, clock_us: int) -> Seal:
    """Seal a batch the way seal_batch does, with an injected clock."""
    seal = Seal(batch=batch, segments=(ref(batch, 0, rows=rows),) if rows else (),
                base_ts_us=next_base_timestamp(wal, batch, clock_us=clock_us))
    write_seal(wal, seal)
    return seal


# -- encoding -----------------------------------------------------------------------------

def test_encode_decode_round_trip():
    seal = make_seal(query_id="q-42", commit_point=COMMIT_POINT_SEAL)
    assert decode_seal(encode_seal(seal), "x.seal") == seal


def test_round_trip_of_a_seal_without_segments():
    seal = make_seal(rows=())
    back = decode_seal(encode_seal(seal), "x.seal")
    assert back == seal and back.rows == 0 and back.segments == ()


def test_encoding_is_one_sorted_json_line_then_a_crc_line():
    data = encode_seal(make_seal())
    body, crc_line, end = data.split(b"\n")
    assert end == b""
    assert crc_line == f"crc32:{zlib.crc32(body):08x}".encode()
    d = json.loads(body)
    assert list(d) == sorted(d)
    assert set(d) == {"batch", "query_id", "seal_id", "commit_point", "base_ts_us",
                      "sealed_at_us", "rows", "segments", "write"}
    assert set(d["segments"][0]) == {"name", "partition", "attempt", "rows", "chunks", "bytes",
                                     "crc32"}
    assert d["rows"] == 7


def test_default_commit_point_is_the_spark_checkpoint():
    assert make_seal().commit_point == COMMIT_POINT_CHECKPOINT


def test_two_seals_of_the_same_batch_have_distinct_ids():
    assert make_seal().seal_id != make_seal().seal_id


def test_write_then_read_seal(wal):
    seal = make_seal(batch=12)
    write_seal(wal, seal)
    assert read_seal(wal, 12) == seal
    assert wal.sealed_batch_ids() == [12]


def test_read_seal_of_an_absent_batch_is_none(wal):
    assert read_seal(wal, 3) is None


def test_seal_file_mode_is_0600(wal):
    write_seal(wal, make_seal(batch=1))
    assert stat.S_IMODE(os.stat(wal.seal_path(1)).st_mode) == 0o600


# -- damage -------------------------------------------------------------------------------

def test_every_flipped_byte_is_corrupted():
    data = encode_seal(make_seal())
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        with pytest.raises(WalCorrupted):
            decode_seal(bytes(damaged), "x.seal")


def test_every_single_bit_flip_in_the_json_is_corrupted():
    data = encode_seal(make_seal())
    body_len = data.index(b"\n")
    for offset in range(body_len):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            with pytest.raises(WalCorrupted):
                decode_seal(bytes(damaged), "x.seal")


def test_truncation_at_every_offset_is_corrupted():
    data = encode_seal(make_seal())
    # Every cut that loses a byte of the JSON or of the checksum: only the final newline
    # may go (the content and its checksum are then whole).
    for size in range(len(data) - 1):
        with pytest.raises(WalCorrupted):
            decode_seal(data[:size], "x.seal")
    assert decode_seal(data[:-1], "x.seal") == decode_seal(data, "x.seal")


def test_empty_seal_file_is_corrupted(wal):
    with open(wal.seal_path(4), "wb"):
        pass
    with pytest.raises(WalCorrupted, match="no checksum line"):
        read_seal(wal, 4)


def test_seal_without_checksum_line_is_corrupted():
    body = encode_seal(make_seal()).split(b"\n")[0]
    with pytest.raises(WalCorrupted, match="no checksum line"):
        decode_seal(body + b"\n", "x.seal")


def test_unreadable_checksum_is_corrupted():
    body = encode_seal(make_seal()).split(b"\n")[0]
    with pytest.raises(WalCorrupted, match="unreadable"):
        decode_seal(body + b"\ncrc32:zz\n", "x.seal")


def test_valid_checksum_over_incomplete_content_is_corrupted():
    d = make_seal().to_dict()
    del d["base_ts_us"]
    body = json.dumps(d, sort_keys=True).encode()
    with pytest.raises(WalCorrupted, match="content invalid"):
        decode_seal(body + f"\ncrc32:{zlib.crc32(body):08x}\n".encode(), "x.seal")


def test_valid_checksum_over_non_object_json_is_corrupted():
    body = b"[1,2]"
    with pytest.raises(WalCorrupted, match="content invalid"):
        decode_seal(body + f"\ncrc32:{zlib.crc32(body):08x}\n".encode(), "x.seal")


def test_corrupted_seal_names_its_batch_and_file(wal):
    write_seal(wal, make_seal(batch=8))
    path = wal.seal_path(8)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"#")
    with pytest.raises(WalCorrupted) as exc:
        read_seal(wal, 8)
    assert exc.value.batch == 8 and exc.value.path == path
    assert "batch 8" in str(exc.value)


# -- re-sealing (Spark re-ran batch N before commits/N) ----------------------------------

def test_resealing_a_batch_replaces_the_old_seal(wal):
    first = seal_batch(wal, 3, [ref(3, 0), ref(3, 1)])
    second = seal_batch(wal, 3, [ref(3, 0, attempt=1), ref(3, 1, attempt=1)])
    got = read_seal(wal, 3)
    assert got == second and got.seal_id != first.seal_id
    assert os.listdir(wal.seals) == [fmt.batch_name(3) + fmt.SEAL_SUFFIX]


def test_resealing_a_batch_keeps_its_base_timestamp_above_earlier_batches(wal):
    seal_at(wal, 2, rows=10, clock_us=5_000)
    second = seal_at(wal, 3, rows=1, clock_us=100)
    rerun = seal_at(wal, 3, rows=1, clock_us=50)
    assert second.base_ts_us == rerun.base_ts_us == 5_010


def test_reseal_crashing_before_the_rename_leaves_the_old_seal_whole(wal, monkeypatch):
    old = seal_batch(wal, 3, [ref(3, 0)])

    def crash(src, dst):
        raise OSError("power cut before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        seal_batch(wal, 3, [ref(3, 0, attempt=1)])
    monkeypatch.undo()
    assert read_seal(wal, 3) == old
    assert wal.sealed_batch_ids() == [3]


def test_seal_batch_orders_segments_by_partition_then_attempt(wal):
    segs = [ref(1, 2), ref(1, 0, attempt=1), ref(1, 1), ref(1, 0, attempt=0)]
    seal = seal_batch(wal, 1, segs, query_id="q")
    assert [(s.partition, s.attempt) for s in seal.segments] == [(0, 0), (0, 1), (1, 0), (2, 0)]
    assert read_seal(wal, 1) == seal


# -- timestamps ---------------------------------------------------------------------------

def test_first_base_timestamp_is_the_clock(wal):
    assert next_base_timestamp(wal, 0, clock_us=123_456) == 123_456


def test_base_timestamp_follows_the_clock_when_it_is_ahead(wal):
    seal_at(wal, 0, rows=5, clock_us=1_000)
    assert next_base_timestamp(wal, 1, clock_us=9_000) == 9_000


def test_base_timestamp_stays_above_the_previous_batch_when_the_clock_goes_back(wal):
    prev = seal_at(wal, 0, rows=5, clock_us=1_000)
    assert prev.last_ts_us == 1_004
    assert next_base_timestamp(wal, 1, clock_us=10) == 1_005


def test_base_timestamp_after_a_batch_of_zero_rows(wal):
    prev = seal_at(wal, 0, rows=0, clock_us=1_000)
    assert prev.last_ts_us == 1_000
    assert next_base_timestamp(wal, 1, clock_us=1_000) == 1_001


def test_base_timestamps_strictly_increase_across_batches_with_a_jumping_clock(wal):
    clock = [5_000, 4_000, 4_000, 9_000, 1, 9_001, 9_002, 0]
    rows = [3, 0, 7, 1, 2, 5, 0, 4]
    seals = [seal_at(wal, b, rows=r, clock_us=c) for b, (r, c) in enumerate(zip(rows, clock))]
    for prev, cur in zip(seals, seals[1:]):
        assert cur.base_ts_us > prev.last_ts_us, (prev, cur)
    assert [s.base_ts_us for s in seals] == [5_000, 5_003, 5_004, 9_000, 9_001, 9_003, 9_008,
                                             9_009]


def test_base_timestamp_uses_the_nearest_earlier_seal_only(wal):
    seal_at(wal, 1, rows=1, clock_us=100)
    seal_at(wal, 4, rows=2, clock_us=500)
    seal_at(wal, 9, rows=1, clock_us=10_000)   # a later batch does not raise batch 6's base
    assert next_base_timestamp(wal, 6, clock_us=0) == 502
    assert next_base_timestamp(wal, 3, clock_us=0) == 101


def test_base_timestamp_skips_gaps_left_by_retention(wal):
    seal_at(wal, 10, rows=3, clock_us=700)
    assert next_base_timestamp(wal, 20, clock_us=0) == 703


def test_base_timestamp_without_clock_is_wall_clock(wal):
    import time
    before = time.time_ns() // 1000
    got = next_base_timestamp(wal, 0)
    assert before <= got <= time.time_ns() // 1000


# -- derived values -----------------------------------------------------------------------

def test_row_offsets_are_the_first_row_of_each_segment():
    assert make_seal(rows=(3, 0, 4, 1)).row_offsets() == [0, 3, 3, 7]


def test_row_offsets_of_a_seal_without_segments():
    assert make_seal(rows=()).row_offsets() == []


def test_rows_and_bytes_sum_the_segments():
    seal = make_seal(rows=(3, 4))
    assert seal.rows == 7
    assert seal.bytes == 103 + 104


def test_last_ts_us_is_base_plus_rows_minus_one():
    assert make_seal(rows=(3, 4), base_ts_us=1_000).last_ts_us == 1_006


def test_last_ts_us_of_an_empty_batch_is_its_base():
    assert make_seal(rows=(), base_ts_us=1_000).last_ts_us == 1_000
