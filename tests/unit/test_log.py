"""The RocksDB log (wal/log.py, FORMAT.md "The log" and "States"): one named test per edge case."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from wal import format as fmt
from wal.errors import (IllegalTransition, SegmentTruncated, UnsupportedFormat, WalCorrupted,
                        WalLocked)
from wal.layout import WalDir
from wal.log import WalLog
from wal.seal import Seal, seal_batch
from wal.segment import SegmentWriter
from wal.states import BatchState

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


# -- helpers ------------------------------------------------------------------------------

def stage(wal: WalDir, batch: int, partition: int, chunk_rows, attempt: int = 0,
          start: int = 0):
    """Write a segment whose chunks hold ``chunk_rows`` rows; ids count up from ``start``."""
    with SegmentWriter(wal, batch, partition, attempt) as writer:
        for n in chunk_rows:
            writer.append(pa.record_batch({
                "id": pa.array(range(start, start + n), pa.int64()),
                "part": pa.array([partition] * n, pa.int32())}))
            start += n
        return writer.finish()


def sealed(wal: WalDir, batch: int, parts=None) -> Seal:
    """Stage and seal a batch: partition -> chunk sizes (default: p0 [2, 3], p1 [4])."""
    parts = parts if parts is not None else {0: [2, 3], 1: [4]}
    refs, start = [], 0
    for p, sizes in sorted(parts.items()):
        refs.append(stage(wal, batch, p, sizes, start=start))
        start += sum(sizes)
    return seal_batch(wal, batch, refs, query_id="q")


def row_keys(wal_log: WalLog, batch: int) -> list[bytes]:
    prefix = fmt.rows_prefix(batch)
    return [k for k in wal_log._db.keys(from_key=prefix) if k.startswith(prefix)]


def ids_of(chunks) -> list[int]:
    out = []
    for c in chunks:
        out += pa.ipc.open_stream(pa.py_buffer(c.payload)).read_all().column("id").to_pylist()
    return out


def corrupt_byte(path: str, offset_from_end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        b = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


# -- the happy path -----------------------------------------------------------------------

def test_ingest_copies_every_chunk_and_records_sealed(wal, wal_log):
    seal = sealed(wal, 4)
    record = wal_log.ingest(seal)
    assert record.state is BatchState.SEALED and record.seal == seal
    assert (record.next_segment, record.next_chunk, record.flushed_rows) == (0, 0, 0)
    assert wal_log.get(4) == record
    assert len(row_keys(wal_log, 4)) == 3
    assert ids_of(wal_log.chunks(4)) == list(range(9))


def test_ingest_begin_flush_progress_mark_flushed(wal, wal_log):
    seal = sealed(wal, 4)
    wal_log.ingest(seal)
    flushing = wal_log.begin_flush(4)
    assert flushing.state is BatchState.FLUSHING
    progress = wal_log.record_progress(4, next_segment=0, next_chunk=2, flushed_rows=5)
    assert (progress.state, progress.next_segment, progress.next_chunk, progress.flushed_rows) \
        == (BatchState.FLUSHING, 0, 2, 5)
    assert wal_log.get(4) == progress
    done = wal_log.mark_flushed(4)
    assert done.state is BatchState.FLUSHED and done.flushed_rows == seal.rows == 9
    assert done.seal == seal
    assert wal_log.flushed_through() == 4


def test_progress_survives_a_clean_reopen(wal):
    with WalLog.open_writer(wal) as wal_log:
        wal_log.ingest(sealed(wal, 1))
        wal_log.begin_flush(1)
        wal_log.record_progress(1, 1, 0, 5)
    with WalLog.open_writer(wal) as wal_log:
        got = wal_log.get(1)
        assert (got.state, got.next_segment, got.next_chunk, got.flushed_rows) == \
            (BatchState.FLUSHING, 1, 0, 5)


def test_progress_before_begin_flush_raises(wal, wal_log):
    wal_log.ingest(sealed(wal, 1))
    with pytest.raises(IllegalTransition, match="sealed -> flushing"):
        wal_log.record_progress(1, 0, 1, 2)


def test_mark_flushed_before_begin_flush_raises(wal, wal_log):
    wal_log.ingest(sealed(wal, 1))
    with pytest.raises(IllegalTransition, match="flush must begin"):
        wal_log.mark_flushed(1)
    assert wal_log.get(1).state is BatchState.SEALED


def test_begin_flush_of_an_absent_batch_raises(wal_log):
    with pytest.raises(IllegalTransition, match="absent -> flushing"):
        wal_log.begin_flush(3)


def test_mark_flushed_twice_raises(wal, wal_log):
    wal_log.ingest(sealed(wal, 1))
    wal_log.begin_flush(1)
    wal_log.mark_flushed(1)
    with pytest.raises(IllegalTransition, match="flushed -> flushed"):
        wal_log.mark_flushed(1)


def test_ingest_of_an_empty_batch(wal, wal_log):
    seal = seal_batch(wal, 2, [stage(wal, 2, 0, [])])
    assert wal_log.ingest(seal).state is BatchState.SEALED
    assert list(wal_log.chunks(2)) == []
    wal_log.begin_flush(2)
    assert wal_log.mark_flushed(2).flushed_rows == 0


def test_records_are_in_batch_order(wal, wal_log):
    for b in (10, 2, 1):
        wal_log.ingest(sealed(wal, b, {0: [1]}))
    assert [r.batch for r in wal_log.records()] == [1, 2, 10]


# -- idempotence and replaced seals -------------------------------------------------------

def test_reingest_of_the_same_seal_is_idempotent(wal, wal_log):
    seal = sealed(wal, 4)
    first = wal_log.ingest(seal)
    assert wal_log.ingest(seal) == first
    assert len(row_keys(wal_log, 4)) == 3
    assert ids_of(wal_log.chunks(4)) == list(range(9))


def test_reingest_of_the_same_seal_keeps_flush_progress(wal, wal_log):
    seal = sealed(wal, 4)
    wal_log.ingest(seal)
    wal_log.begin_flush(4)
    progress = wal_log.record_progress(4, 1, 0, 5)
    assert wal_log.ingest(seal) == progress


def test_reingest_of_the_same_seal_after_flush_is_a_no_op(wal, wal_log):
    seal = sealed(wal, 4)
    wal_log.ingest(seal)
    wal_log.begin_flush(4)
    done = wal_log.mark_flushed(4)
    assert wal_log.ingest(seal) == done


def test_different_seal_for_an_ingested_batch_raises(wal, wal_log):
    wal_log.ingest(sealed(wal, 4))
    other = sealed(wal, 4, {0: [1]})
    with pytest.raises(IllegalTransition, match="sealed -> sealed") as exc:
        wal_log.ingest(other)
    assert exc.value.batch == 4
    assert wal_log.get(4).seal.rows == 9
    assert ids_of(wal_log.chunks(4)) == list(range(9))


@pytest.mark.parametrize("state", ["flushing", "flushed"])
def test_different_seal_for_a_flushing_or_flushed_batch_raises(wal, wal_log, state):
    wal_log.ingest(sealed(wal, 4))
    wal_log.begin_flush(4)
    if state == "flushed":
        wal_log.mark_flushed(4)
    with pytest.raises(IllegalTransition, match=f"{state} -> sealed"):
        wal_log.ingest(sealed(wal, 4, {0: [1]}))
    assert wal_log.get(4).state.value == state


# -- discard ------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["sealed", "flushing", "flushed"])
def test_discard_of_a_committed_batch_raises(wal, wal_log, state):
    wal_log.ingest(sealed(wal, 4))
    if state != "sealed":
        wal_log.begin_flush(4)
    if state == "flushed":
        wal_log.mark_flushed(4)
    with pytest.raises(IllegalTransition, match=f"{state} -> discarded"):
        wal_log.discard(4, "never committed")
    assert wal_log.get(4).state.value == state
    assert len(row_keys(wal_log, 4)) == 3


def test_discard_of_an_absent_batch_records_the_reason(wal_log):
    record = wal_log.discard(6, "Spark never committed it")
    assert (record.state, record.reason, record.seal) == \
        (BatchState.DISCARDED, "Spark never committed it", None)
    assert wal_log.get(6) == record


def test_discard_twice_is_allowed(wal_log):
    wal_log.discard(6, "first")
    assert wal_log.discard(6, "second").reason == "second"


def test_discard_then_reingest_when_spark_reran_the_batch(wal, wal_log):
    wal_log.discard(6, "not committed")
    seal = sealed(wal, 6)
    record = wal_log.ingest(seal)
    assert record.state is BatchState.SEALED and record.reason == ""
    assert ids_of(wal_log.chunks(6)) == list(range(9))
    wal_log.begin_flush(6)
    assert wal_log.mark_flushed(6).state is BatchState.FLUSHED


# -- reading rows back --------------------------------------------------------------------

def test_chunks_first_row_is_the_batch_wide_position(wal, wal_log):
    seal = sealed(wal, 3, {0: [2, 3], 1: [], 2: [4, 1, 5]})
    wal_log.ingest(seal)
    got = [(c.segment_index, c.chunk_index, c.first_row, c.rows) for c in wal_log.chunks(3)]
    assert got == [(0, 0, 0, 2), (0, 1, 2, 3), (2, 0, 5, 4), (2, 1, 9, 1), (2, 2, 10, 5)]
    for c in wal_log.chunks(3):
        assert ids_of([c])[0] == c.first_row   # ids were written as batch-wide positions


def test_chunks_resume_inside_a_segment(wal, wal_log):
    wal_log.ingest(sealed(wal, 3, {0: [2, 3], 1: [4, 1, 5]}))
    got = [(c.segment_index, c.chunk_index, c.first_row) for c in wal_log.chunks(3, 1, 1)]
    assert got == [(1, 1, 9), (1, 2, 10)]
    assert ids_of(wal_log.chunks(3, 1, 1)) == list(range(9, 15))


def test_chunks_resume_at_the_start_of_a_later_segment(wal, wal_log):
    wal_log.ingest(sealed(wal, 3, {0: [2, 3], 1: [4, 1, 5]}))
    assert [c.first_row for c in wal_log.chunks(3, 1, 0)] == [5, 9, 10]


def test_chunks_resume_past_the_last_chunk_of_a_segment_moves_on(wal, wal_log):
    wal_log.ingest(sealed(wal, 3, {0: [2, 3], 1: [4]}))
    assert [(c.segment_index, c.first_row) for c in wal_log.chunks(3, 0, 2)] == [(1, 5)]


def test_chunks_resume_past_the_end_yields_nothing(wal, wal_log):
    wal_log.ingest(sealed(wal, 3, {0: [2, 3], 1: [4]}))
    assert list(wal_log.chunks(3, 2, 0)) == []


def test_chunks_of_an_unknown_or_discarded_batch_yield_nothing(wal_log):
    assert list(wal_log.chunks(99)) == []
    wal_log.discard(98, "x")
    assert list(wal_log.chunks(98)) == []


def test_chunks_of_one_batch_never_include_another(wal, wal_log):
    wal_log.ingest(sealed(wal, 1, {0: [1]}))
    wal_log.ingest(sealed(wal, 10, {0: [2]}))
    wal_log.ingest(sealed(wal, 100, {0: [3]}))
    assert [c.rows for c in wal_log.chunks(1)] == [1]
    assert [c.rows for c in wal_log.chunks(10)] == [2]


def test_damaged_row_in_the_log_raises_naming_the_segment(wal, wal_log):
    seal = sealed(wal, 3)
    wal_log.ingest(seal)
    key = fmt.rows_key(3, 1, 0)
    value = bytearray(wal_log._db.get(key))
    value[-1] ^= 0xFF
    wal_log._db.put(key, bytes(value))
    chunks = wal_log.chunks(3)
    assert [c.rows for c in (next(chunks), next(chunks))] == [2, 3]
    with pytest.raises(WalCorrupted, match="checksum mismatch") as exc:
        next(chunks)
    assert (exc.value.batch, exc.value.partition, exc.value.segment) == \
        (3, 1, seal.segments[1].name)


# -- damaged segments at ingest -----------------------------------------------------------

def test_corrupted_segment_at_ingest_raises_naming_it_and_leaves_the_log_unchanged(wal, wal_log):
    seal = sealed(wal, 5, {0: [2, 3], 1: [4], 2: [1]})
    bad = seal.segments[1]
    corrupt_byte(wal.segment_path(bad.name), 40)   # inside the last chunk's payload
    with pytest.raises(WalCorrupted) as exc:
        wal_log.ingest(seal)
    assert (exc.value.batch, exc.value.partition, exc.value.segment) == (5, 1, bad.name)
    assert bad.name in str(exc.value)
    assert wal_log.get(5) is None
    assert row_keys(wal_log, 5) == []
    assert wal_log.records() == []


def test_truncated_segment_at_ingest_raises_segment_truncated(wal, wal_log):
    seal = sealed(wal, 5)
    path = wal.segment_path(seal.segments[0].name)
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(SegmentTruncated):
        wal_log.ingest(seal)
    assert wal_log.get(5) is None and row_keys(wal_log, 5) == []


def test_segment_replaced_after_sealing_raises(wal, wal_log):
    seal = sealed(wal, 5)
    victim = seal.segments[1]
    other = stage(wal, 5, victim.partition, [4], start=100)   # valid file, other rows
    os.replace(wal.segment_path(other.name), wal.segment_path(victim.name))
    with pytest.raises(WalCorrupted, match="differs from what its seal records") as exc:
        wal_log.ingest(seal)
    assert exc.value.segment == victim.name
    assert wal_log.get(5) is None and row_keys(wal_log, 5) == []


def test_segment_missing_after_sealing_raises_wal_corrupted(wal, wal_log):
    seal = sealed(wal, 5)
    os.unlink(wal.segment_path(seal.segments[1].name))
    with pytest.raises(WalCorrupted) as exc:
        wal_log.ingest(seal)
    assert exc.value.segment == seal.segments[1].name
    assert wal_log.get(5) is None and row_keys(wal_log, 5) == []


def test_failed_ingest_of_a_discarded_batch_keeps_it_discarded(wal, wal_log):
    wal_log.discard(5, "not committed")
    seal = sealed(wal, 5)
    corrupt_byte(wal.segment_path(seal.segments[0].name), 40)
    with pytest.raises(WalCorrupted):
        wal_log.ingest(seal)
    assert wal_log.get(5).state is BatchState.DISCARDED


def test_ingest_after_repairing_the_segment_succeeds(wal, wal_log):
    seal = sealed(wal, 5)
    path = wal.segment_path(seal.segments[0].name)
    with open(path, "rb") as f:
        good = f.read()
    corrupt_byte(path, 40)
    with pytest.raises(WalCorrupted):
        wal_log.ingest(seal)
    with open(path, "wb") as f:
        f.write(good)
    assert wal_log.ingest(seal).state is BatchState.SEALED
    assert ids_of(wal_log.chunks(5)) == list(range(9))


# -- opening: lock, readers, format -------------------------------------------------------

def test_second_open_writer_in_the_same_process_raises_wal_locked(wal, wal_log):
    with pytest.raises(WalLocked):
        WalLog.open_writer(wal)


def test_open_writer_in_another_process_raises_wal_locked(wal, wal_log):
    code = textwrap.dedent(f"""
        from wal import WalDir, WalLog, WalLocked
        try:
            WalLog.open_writer(WalDir({wal.root!r}))
        except WalLocked:
            raise SystemExit(7)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), timeout=60)
    assert proc.returncode == 7


def test_writer_reopens_after_close(wal):
    WalLog.open_writer(wal).close()
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log.writable and wal_log.records() == []


def test_open_reader_without_a_log_is_none(wal):
    assert WalLog.open_reader(wal) is None


def test_open_reader_beside_a_writer_sees_new_records_after_reopen(wal, wal_log):
    wal_log.ingest(sealed(wal, 1))
    reader = WalLog.open_reader(wal)
    assert not reader.writable
    assert [r.batch for r in reader.records()] == [1]
    wal_log.begin_flush(1)
    wal_log.mark_flushed(1)
    wal_log.ingest(sealed(wal, 2, {0: [1]}))
    reader.close()
    with WalLog.open_reader(wal) as reader:
        assert [(r.batch, r.state) for r in reader.records()] == \
            [(1, BatchState.FLUSHED), (2, BatchState.SEALED)]
        assert reader.flushed_through() == 1
        assert ids_of(reader.chunks(2)) == [0]


def test_reader_cannot_write(wal, wal_log):
    with WalLog.open_reader(wal) as reader:
        with pytest.raises(Exception):
            reader.discard(3, "no")
    assert wal_log.get(3) is None


def test_reader_removes_its_scratch_folder_on_close(wal, wal_log):
    reader = WalLog.open_reader(wal)
    scratch = reader._scratch
    assert scratch and os.path.isdir(scratch)
    assert not scratch.startswith(wal.root)
    reader.close()
    assert not os.path.exists(scratch)


def test_open_writer_refuses_a_newer_log_format(wal):
    with WalLog.open_writer(wal) as wal_log:
        wal_log._db.put(fmt.KEY_META_FORMAT, str(fmt.LOG_FORMAT_VERSION + 1).encode())
    with pytest.raises(UnsupportedFormat):
        WalLog.open_writer(wal)


# -- flushed_through and forget -----------------------------------------------------------

def _flush(wal, wal_log, batch):
    wal_log.ingest(sealed(wal, batch, {0: [1]}))
    wal_log.begin_flush(batch)
    return wal_log.mark_flushed(batch)


def test_flushed_through_is_minus_one_when_nothing_was_flushed(wal, wal_log):
    assert wal_log.flushed_through() == -1
    wal_log.ingest(sealed(wal, 0, {0: [1]}))
    assert wal_log.flushed_through() == -1


def test_flushed_through_is_the_highest_flushed_batch(wal, wal_log):
    _flush(wal, wal_log, 0)
    _flush(wal, wal_log, 3)
    assert wal_log.flushed_through() == 3


def test_flushed_through_never_goes_down(wal, wal_log):
    _flush(wal, wal_log, 5)
    _flush(wal, wal_log, 2)
    assert wal_log.flushed_through() == 5


def test_flushed_through_survives_forget(wal, wal_log):
    _flush(wal, wal_log, 5)
    wal_log.forget(5)
    assert wal_log.flushed_through() == 5


def test_forget_a_flushed_batch_removes_its_record_and_rows(wal, wal_log):
    _flush(wal, wal_log, 5)
    _flush(wal, wal_log, 6)
    wal_log.forget(5)
    assert wal_log.get(5) is None and row_keys(wal_log, 5) == []
    assert wal_log.get(6) is not None and len(row_keys(wal_log, 6)) == 1


def test_forget_a_discarded_batch(wal_log):
    wal_log.discard(5, "x")
    wal_log.forget(5)
    assert wal_log.get(5) is None


@pytest.mark.parametrize("state", ["sealed", "flushing"])
def test_forget_an_unfinished_batch_raises(wal, wal_log, state):
    wal_log.ingest(sealed(wal, 5))
    if state == "flushing":
        wal_log.begin_flush(5)
    with pytest.raises(ValueError, match="only finished batches"):
        wal_log.forget(5)
    assert wal_log.get(5).state.value == state and len(row_keys(wal_log, 5)) == 3


def test_forget_an_absent_batch_does_nothing(wal_log):
    wal_log.forget(5)
    assert wal_log.records() == []


# -- durability ---------------------------------------------------------------------------

def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_and_sigkill(wal: WalDir, steps: str) -> None:
    """Run ``steps`` against the writer in a child process that then SIGKILLs itself."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        from wal import WalDir, WalLog, read_seal
        wal = WalDir({wal.root!r})
        wal_log = WalLog.open_writer(wal)
        seal = read_seal(wal, 8)
    """) + textwrap.dedent(steps) + textwrap.dedent("""
        sys.stdout.write("done\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout == "done\n", proc.stderr
    assert proc.returncode == -signal.SIGKILL


def test_ingest_and_mark_flushed_survive_sigkill(wal):
    seal = sealed(wal, 8)
    _run_and_sigkill(wal, """
        wal_log.ingest(seal)
        wal_log.begin_flush(8)
        wal_log.mark_flushed(8)
    """)
    with WalLog.open_writer(wal) as wal_log:
        got = wal_log.get(8)
        assert got.state is BatchState.FLUSHED and got.seal == seal
        assert got.flushed_rows == 9
        assert wal_log.flushed_through() == 8
        assert ids_of(wal_log.chunks(8)) == list(range(9))


def test_ingest_survives_sigkill_with_every_row(wal):
    seal = sealed(wal, 8)
    _run_and_sigkill(wal, "wal_log.ingest(seal)\n")
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log.get(8).state is BatchState.SEALED
        assert ids_of(wal_log.chunks(8)) == list(range(9))


def test_discard_survives_sigkill(wal):
    _run_and_sigkill(wal, "wal_log.discard(9, 'never committed')\n")
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log.get(9).state is BatchState.DISCARDED
        assert wal_log.get(9).reason == "never committed"


def test_lock_is_released_when_the_writer_is_killed(wal):
    _run_and_sigkill(wal, "")
    WalLog.open_writer(wal).close()


# -- readers never keep the writer lock ------------------------------------------------------

def test_a_suspended_chunk_reader_does_not_keep_the_lock_from_the_next_writer(wal):
    # A flush stopped by an error leaves its chunks() generator suspended (its frames kept by
    # the error's traceback). RocksDB holds the writer lock while an iterator lives, even
    # after close: the next owner of the WAL (a restarted run, wait_flushed) got WalLocked.
    wal_log = WalLog.open_writer(wal)
    wal_log.ingest(sealed(wal, 0, {0: [1] * 12, 1: [2] * 9}))
    reader = wal_log.chunks(0)
    first = next(reader)
    wal_log.close()
    WalLog.open_writer(wal).close()
    assert first.rows == 1 and reader is not None


def test_chunks_read_in_pages_are_every_chunk_in_order_with_its_first_row(wal, wal_log):
    wal_log.ingest(sealed(wal, 0, {0: [1] * 12, 1: [2] * 9}))
    chunks = list(wal_log.chunks(0))
    assert [(c.segment_index, c.chunk_index) for c in chunks] == \
        [(0, i) for i in range(12)] + [(1, i) for i in range(9)]
    assert [c.first_row for c in chunks] == list(range(12)) + [12 + 2 * i for i in range(9)]
    assert ids_of(chunks) == list(range(30))
    resumed = list(wal_log.chunks(0, segment=1, chunk=3))
    assert [(c.segment_index, c.chunk_index, c.first_row) for c in resumed][0] == (1, 3, 18)


# -- the seal alone: rows left in the segments (scale-out writers) ------------------------

def test_ingest_without_copying_keeps_the_seal_alone_and_says_where_the_rows_are(wal):
    """A scale-out writer's tasks read the segments: the log keeps no copy of the rows (the
    driver's cost per row); asked for them, it says so rather than yield nothing."""
    from wal.errors import RowsNotInLog

    seal = sealed(wal, 4)
    with WalLog.open_writer(wal) as wal_log:
        record = wal_log.ingest(seal, copy_rows=False)
        assert record.state is BatchState.SEALED and record.seal == seal
        assert not record.rows_in_log and row_keys(wal_log, 4) == []
    with WalLog.open_writer(wal) as wal_log:           # durable, as the rest of the record
        assert wal_log.get(4) == record
        with pytest.raises(RowsNotInLog, match="batch 4"):
            list(wal_log.chunks(4))
        wal_log.begin_flush(4)
        wal_log.record_progress(4, next_segment=1, next_chunk=0, flushed_rows=5)
        wal_log.record_acknowledged(4, 1, 4)
        copied = wal_log.copy_rows(4)                   # a writer that reads the log takes over
        assert copied.rows_in_log and ids_of(wal_log.chunks(4)) == list(range(9))
        assert (copied.next_segment, copied.acknowledged) == (1, ((1, 4),))   # progress kept
        assert wal_log.get(4) == copied


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing", "replaced"])
def test_ingest_without_copying_still_verifies_every_segment_first(wal, wal_log, damage):
    """Nothing of a damaged batch is written: a local WAL's segments are read and checked
    against the seal when the batch is ingested, though not copied."""
    seal = sealed(wal, 5, {0: [2, 3], 1: [4], 2: [1]})
    bad = seal.segments[1]
    path = wal.segment_path(bad.name)
    if damage == "flipped":
        corrupt_byte(path, 40)
    elif damage == "truncated":
        os.truncate(path, os.path.getsize(path) - 3)
    elif damage == "missing":
        os.unlink(path)
    else:
        other = stage(wal, 5, bad.partition, [4], start=100)
        os.replace(wal.segment_path(other.name), path)
    with pytest.raises(WalCorrupted) as exc:
        wal_log.ingest(seal, copy_rows=False)
    assert (exc.value.batch, exc.value.segment) == (5, bad.name)
    assert wal_log.get(5) is None and wal_log.records() == []


def test_copy_rows_of_a_damaged_segment_leaves_the_log_as_it_was(wal, wal_log):
    seal = sealed(wal, 5)
    wal_log.ingest(seal, copy_rows=False)
    corrupt_byte(wal.segment_path(seal.segments[0].name), 40)
    with pytest.raises(WalCorrupted):
        wal_log.copy_rows(5)
    assert row_keys(wal_log, 5) == [] and not wal_log.get(5).rows_in_log


def test_a_log_stays_format_2_until_a_batch_is_ingested_without_its_rows(wal):
    """Format 2 copied every batch's rows: its records read as rows in the log, and a release
    of format 2 opens a log this one wrote while every batch's rows are in it (a rollback, an
    operator's older `cassandra-wal`). The first seal-only batch raises `m/format` to 3 in
    the same write as its record: from then on a release of format 2 refuses the log, for it
    would take that batch for an empty one. Before, opening the log raised it at once."""
    seal = sealed(wal, 4)
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log._db.get(fmt.KEY_META_FORMAT) == b"2"          # a new log
        wal_log.ingest(seal)
        head = json.loads(wal_log._db.get(fmt.batch_key(4)))
        del head["rows_in_log"]                                  # as format 2 wrote it
        wal_log._db.put(fmt.batch_key(4), json.dumps(head).encode())
    reader = WalLog.open_reader(wal)
    try:
        assert reader.get(4).rows_in_log and ids_of(reader.chunks(4)) == list(range(9))
    finally:
        reader.close()
    with WalLog.open_writer(wal) as wal_log:
        wal_log.ingest(sealed(wal, 5))                               # rows copied: still 2
        assert wal_log._db.get(fmt.KEY_META_FORMAT) == b"2"
        assert wal_log.get(4).rows_in_log and ids_of(wal_log.chunks(4)) == list(range(9))
        wal_log.ingest(sealed(wal, 6), copy_rows=False)
        assert wal_log._db.get(fmt.KEY_META_FORMAT) == b"3"
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log._db.get(fmt.KEY_META_FORMAT) == b"3" and not wal_log.get(6).rows_in_log
