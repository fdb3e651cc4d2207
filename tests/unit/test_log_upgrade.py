"""The log's upgrade from format 1 (issue 32): a WAL that the release before progress keys
wrote (``tests/fixtures/wal_format1.tar.gz``, made by ``make_wal_format1.py`` with that
release's code), with a batch half flushed and batches waiting, drains under this one: the
half-flushed batch from its recorded progress, the others whole, each row at its sealed
timestamp."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from recovery.cli.main import main
from recovery.replay import Replayer
from wal import format as fmt
from wal.layout import WalDir
from wal.log import WalLog
from wal.states import BatchState

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parents[1] / "fixtures" / "wal_format1.tar.gz"


class Recorder:
    """An Upserter that records (batch, first write timestamp, ids) of each chunk."""

    def __init__(self, writes: list):
        self.writes = writes

    def write_chunks(self, chunks, batch_id: int, age=None):
        for rb, first_ts, tag in chunks:
            self.writes.append((batch_id, first_ts, rb.column("id").to_pylist()))
            yield tag


@pytest.fixture
def old_wal(tmp_path) -> tuple[WalDir, str, dict]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    expected = json.loads((tmp_path / "expected.json").read_text())
    assert expected["format"] == 1
    return WalDir(str(tmp_path / "wal")), str(tmp_path / "cp"), expected


def format_of(wal: WalDir) -> bytes:
    reader = WalLog.open_reader(wal)
    try:
        return reader.db.get(fmt.KEY_META_FORMAT)
    finally:
        reader.close()


def test_a_reader_reads_a_format_1_log_as_it_is(old_wal, capsys):
    wal, cp, expected = old_wal
    reader = WalLog.open_reader(wal)
    try:
        assert reader.format == 1
        seen = {r.batch: r for r in reader.records()}
        flushing = seen[1]
        assert (flushing.next_segment, flushing.next_chunk, flushing.flushed_rows) == (
            expected["progress"]["next_segment"], expected["progress"]["next_chunk"],
            expected["progress"]["flushed_rows"])
        assert {str(b): r.state.value for b, r in seen.items()} == expected["states"]
    finally:
        reader.close()
    assert main(["inspect", wal.root, "--checkpoint", cp, "--json"]) == 0
    assert format_of(wal) == b"1"                # a reader changes nothing


def test_a_writer_upgrades_it_and_the_pending_batches_drain_from_their_progress(old_wal):
    wal, cp, expected = old_wal
    with WalLog.open_writer(wal) as wal_log:
        before = {r.batch: r for r in wal_log.records()}
        writes: list = []
        report = Replayer(wal, wal_log, lambda seal: Recorder(writes), cp).run(True)
        assert report.replayed == [1, 2, 3, 4]
        assert all(r.state is BatchState.FLUSHED for r in wal_log.records()
                   if r.batch in (1, 2, 3, 4))
    assert format_of(wal) == str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode()   # every row in it
    assert before[1].seal.seal_id == expected["seals"]["1"]["seal_id"]
    assert before[1].next_segment == expected["progress"]["next_segment"]
    written = {}
    for batch, first_ts, ids in writes:
        base = expected["seals"][str(batch)]["base_ts_us"]
        for k, row_id in enumerate(ids):
            written.setdefault(batch, []).append((first_ts - base + k, row_id))
    # Batch 1: rows 0..6 were acknowledged before the upgrade; the rest, once, at their place.
    skipped = expected["progress"]["flushed_rows"]
    assert [pos for pos, _ in written[1]] == list(range(skipped, 15))
    for batch in (2, 3, 4):
        rows = expected["seals"][str(batch)]["rows"]
        assert [pos for pos, _ in written[batch]] == list(range(rows)), batch
    # Positions are the batch-wide row ids the factory gave: batch * 1000 + position.
    for batch, rows in written.items():
        assert all(row_id == batch * 1000 + pos for pos, row_id in rows), batch


def test_an_upgrade_cut_short_leaves_format_1_and_is_done_at_the_next_open(old_wal,
                                                                           monkeypatch):
    wal, cp, expected = old_wal

    def fail(self):
        raise OSError("disk gone")

    monkeypatch.setattr(WalLog, "_upgrade_from_format_1", fail)
    with pytest.raises(OSError):
        WalLog.open_writer(wal)
    monkeypatch.undo()
    assert format_of(wal) == b"1"
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log.get(1).flushed_rows == expected["progress"]["flushed_rows"]
    assert format_of(wal) == str(fmt.LOG_FORMAT_ROWS_IN_LOG).encode()   # every row in it


# -- what an acknowledgement costs ------------------------------------------------------------
class CountingDb:
    """The log's RocksDB handle, counting the bytes each write puts."""

    def __init__(self, db):
        self._db, self.bytes = db, 0

    def put(self, key, value, *args):
        self.bytes += len(key) + len(value)
        return self._db.put(key, value, *args)

    def write(self, wb, *args):
        self.bytes += wb.size_in_bytes()
        return self._db.write(wb, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def bytes_per_acknowledgement(tmp_path, segments: int) -> float:
    from tests.helpers.walfactory import WalFactory

    with WalFactory(tmp_path / f"wal-{segments}", checkpoint=tmp_path / f"cp-{segments}") as f:
        f.ingested(0, rows=(1,) * segments)
        f.wal_log.begin_flush(0)
        counting = CountingDb(f.wal_log._db)
        f.wal_log._db = counting
        for index in range(segments):
            f.wal_log.record_progress(0, index + 1, 0, index + 1)
        f.wal_log._db = counting._db
        assert f.wal_log.get(0).next_segment == segments
        return counting.bytes / segments


def test_an_acknowledgement_writes_the_same_few_bytes_whatever_the_batchs_size(tmp_path):
    """Format 1 rewrote the batch record, seal included, at each acknowledgement: a batch of
    N segments acknowledged segment by segment (processes and executors modes) wrote O(N²)
    bytes, and cost the driver 73 CPU s at 2,000 segments."""
    small, large = (bytes_per_acknowledgement(tmp_path, n) for n in (10, 400))
    assert large <= 64 and large < small * 1.1       # the digits of larger numbers, no more


def test_a_seal_is_decoded_once_per_process_while_its_file_stays(tmp_path, monkeypatch):
    """A drain, a commit's backlog and a health look each read every pending seal: one of
    2,000 segments is ~285 KB of JSON. Decoded once; a seal replaced (a re-run of the batch
    before Spark committed it) is decoded again."""
    from tests.helpers.walfactory import WalFactory
    from wal import seal as seal_module

    decoded = []
    real = seal_module.decode_seal
    monkeypatch.setattr(seal_module, "decode_seal",
                        lambda data, path, batch: decoded.append(batch) or real(data, path, batch))
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        first = f.sealed(0, rows=(3, 2), committed=False).seal
        for _ in range(3):
            assert seal_module.read_seal(f.wal, 0) == first
        assert decoded == [0]
        again = f.sealed(0, rows=(4,), committed=False).seal      # replaced: a re-run
        assert seal_module.read_seal(f.wal, 0) == again != first
        assert decoded == [0, 0]


def test_a_replaced_seal_is_read_anew_though_its_file_looks_the_same(tmp_path, monkeypatch):
    """A seal replaced by a re-run often gets the freed inode of an earlier seal file and has
    the same size; on a filesystem with 1 s timestamps (ext3, small-inode ext4, HFS+, some NFS)
    the same mtime too. The cache went by (inode, size, mtime) and handed back the replaced
    seal: the aborted run's timestamps and segments (review of log format 2, finding 2)."""
    import os

    from tests.helpers.walfactory import WalFactory
    from wal import seal as seal_module

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        first = f.sealed(0, rows=(3, 2), committed=False).seal
        looks = os.stat(f.wal.seal_path(0))
        real_fstat = os.fstat

        def same_look(fd):              # the filesystem cannot tell the two files apart
            st = real_fstat(fd)
            return os.stat_result(
                (st.st_mode, looks.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                 looks.st_size, looks.st_atime, looks.st_mtime, looks.st_ctime),
                {"st_mtime_ns": looks.st_mtime_ns})

        monkeypatch.setattr(os, "fstat", same_look)
        assert seal_module.read_seal(f.wal, 0) == first
        again = f.sealed(0, rows=(2, 3), committed=False).seal      # a re-run's seal
        assert seal_module.read_seal(f.wal, 0) == again != first


def test_a_batch_wider_than_the_logs_keys_is_refused_before_its_seal(tmp_path):
    """Segment indexes are 5 digits in the log's keys, whose order is flush order: a batch of
    100,001 segments sorted segment 100000 before 99999, so its progress read as 99999 and a
    drain in driver mode skipped segment 100000's rows and marked the batch FLUSHED (review of
    log format 2, finding 1). Refused at the seal, naming the batch and what to change; and a
    seal from elsewhere is refused by the log before it is ingested."""
    from wal.errors import BatchTooWide
    from wal.seal import Seal, seal_batch
    from wal.segment import SegmentRef

    wal = WalDir(str(tmp_path / "wal")).create()
    refs = [SegmentRef(f"3/{i:05d}-000-t.seg", i, 0, 1, 1, 10, 0)
            for i in range(fmt.MAX_SEGMENTS_PER_BATCH + 1)]
    with pytest.raises(BatchTooWide) as refused:
        seal_batch(wal, 3, refs)
    assert "batch 3: 100,000 segments" in str(refused.value)
    assert "coalesce" in str(refused.value) and "spark.sql.shuffle.partitions" in str(refused.value)
    assert not Path(wal.seal_path(3)).exists()
    seal = Seal(batch=3, segments=tuple(refs), base_ts_us=1)
    with WalLog.open_writer(wal) as wal_log, pytest.raises(BatchTooWide):
        wal_log.ingest(seal)
    with pytest.raises(BatchTooWide, match="chunks in one segment"):
        seal_batch(wal, 4, [SegmentRef("4/0.seg", 0, 0, 1, fmt.MAX_CHUNKS_PER_SEGMENT + 1, 1, 0)])


def test_unreadable_progress_is_corruption_naming_the_batch(tmp_path):
    """A damaged progress value was a bare ValueError: a block that named no batch."""
    from tests.helpers.walfactory import WalFactory
    from wal.errors import WalCorrupted

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.ingested(5, rows=(2, 2))
        f.wal_log.begin_flush(5)
        f.wal_log.record_progress(5, 1, 0, 2)
        f.wal_log.db.put(fmt.progress_key(5, 1, 0), b"garbage")
        with pytest.raises(WalCorrupted) as damaged:
            f.wal_log.get(5)
        assert damaged.value.batch == 5 and "progress" in str(damaged.value)
