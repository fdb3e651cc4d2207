"""The contract every row writer (``wal.flush.mode``: driver, executors, processes) must keep,
one suite run over each (as Flink's ``WriteAheadSinkTestBase`` runs over every backend).

A :class:`~recovery.replay.RowWriter` writes the rows of one batch that are not acknowledged
yet, row *i* at ``seal.base_ts_us + i``; yields acknowledgements in seal order, each a longer
prefix; raises ``WalCorrupted`` before writing a row of a damaged chunk, and the write's error
when rows were not acknowledged; and never touches the log's states. The Replayer relies on
exactly that to record progress and mark the batch.

No Cassandra: a file-recording Upserter stands in for it (in this process, in a task played
the way Spark runs it, or in real worker processes), and fails the rows a test names.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import pytest

from recovery.cql.config import WriteConfig
from recovery.cql.errors import FlushFailed
from recovery.cql.table import TableSchema
from recovery.cql.upsert import Upserter
from recovery.errors import is_transient
from recovery.executors import ExecutorsWriter
from recovery.processes import ProcessPool
from recovery.config import SinkConfig
from recovery.replay import Acknowledged, DriverWriter, Replayer, SegmentAcknowledged
from recovery.target import Target
from tests.helpers.fake_cassandra import RecordingSession, visible
from tests.helpers.skewed_clock import skewed_clock
from tests.helpers.fake_cassandra import read as read_requests
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import LocalJob, target
from wal import format as fmt
from wal.errors import WalCorrupted
from wal.recovery_policy import RecoveryPolicy
from wal.seal import now_us
from wal.states import BatchState

pytestmark = pytest.mark.unit

WRITES_ENV = "CWAL_CONTRACT_WRITES"      # the file every writer's Upserter appends to
FAIL_ENV = "CWAL_CONTRACT_FAIL_IDS"      # row ids whose chunk fails (comma separated)
BATCH = 3
ROWS = (4, 3, 5)                         # three segments ...
CHUNK_ROWS = 2                           # ... of 2, 2, 2 and 1 rows a chunk


class ContractUpserter:
    """Records ``[batch, first_ts, ids]`` per chunk; a chunk holding a failing id fails, as a
    write whose retries are spent does."""

    def write_chunks(self, chunks, batch_id: int, age=None):
        failing = {int(i) for i in os.environ.get(FAIL_ENV, "").split(",") if i}
        for rb, first_ts, tag in chunks:
            ids = rb.column("id").to_pylist()
            if failing & set(ids):
                raise FlushFailed(batch_id, "injected: retry budget spent")
            with open(os.environ[WRITES_ENV], "a") as fh:
                fh.write(json.dumps([batch_id, first_ts, ids]) + "\n")
            yield tag


@contextlib.contextmanager
def contract_upserter(_target):
    yield ContractUpserter()


@pytest.fixture(params=["driver", "executors", "executors-store", "processes"])
def writer(request, tmp_path, monkeypatch):
    """One row writer of each flush mode, over the WAL at ``tmp_path / "wal"``;
    ``executors-store``: the tasks of a WAL on a store, which read every segment from the
    store (here a ``file:`` store holding the WAL's files; the folder the tasks are told is
    the WAL's does not exist)."""
    monkeypatch.setenv(WRITES_ENV, str(tmp_path / "writes.jsonl"))
    monkeypatch.setenv(FAIL_ENV, "")
    root = str(tmp_path / "wal")
    if request.param == "driver":
        made = DriverWriter(lambda seal: ContractUpserter())
    elif request.param == "executors":
        made = ExecutorsWriter(LocalJob(), root, target, open_upserter=contract_upserter)
    elif request.param == "executors-store":
        made = ExecutorsWriter(LocalJob(), str(tmp_path / "not-on-this-host"), target,
                               open_upserter=contract_upserter, store_uri=f"file:{root}")
    else:
        made = ExecutorsWriter(ProcessPool(2), root, target, open_upserter=contract_upserter)
    yield made
    made.reset()


@pytest.fixture
def wal(tmp_path):
    """A WAL holding batch 3, committed, ingested and FLUSHING, no progress recorded."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushing(BATCH, rows=ROWS, chunk_rows=CHUNK_ROWS)
        yield f


def written(tmp_path) -> list[tuple[int, int]]:
    """``(row id, write timestamp)`` of every row written, in the order written."""
    path = tmp_path / "writes.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        _, first_ts, ids = json.loads(line)
        out += [(row, first_ts + i) for i, row in enumerate(ids)]
    return out


def ids_of_segment(segment: int) -> list[int]:
    start = BATCH * 1000 + sum(ROWS[:segment])
    return list(range(start, start + ROWS[segment]))


ALL_IDS = [i for s in range(len(ROWS)) for i in ids_of_segment(s)]


def write(writer, f: WalFactory) -> list[Acknowledged]:
    return list(writer.write(f.wal_log, f.built[BATCH].seal, f.wal_log.get(BATCH)))


def test_every_row_is_written_once_at_its_sealed_timestamp(writer, wal, tmp_path):
    acks = write(writer, wal)
    rows = written(tmp_path)
    assert sorted(row for row, _ in rows) == ALL_IDS          # each row, once
    base = wal.built[BATCH].seal.base_ts_us
    assert all(ts == base + (row - BATCH * 1000) for row, ts in rows)
    assert sum(a.rows for a in acks) == len(ALL_IDS)


def test_acknowledgements_are_growing_prefixes_in_seal_order(writer, wal, tmp_path):
    acks = write(writer, wal)
    marks = [(a.next_segment, a.next_chunk) for a in acks]
    assert marks == sorted(set(marks)) and marks
    assert all(a.rows > 0 for a in acks)


def test_a_write_resumes_after_the_acknowledged_prefix(writer, wal, tmp_path):
    wal.wal_log.record_progress(BATCH, 1, 0, ROWS[0])    # segment 0 acknowledged
    acks = write(writer, wal)
    assert sorted(row for row, _ in written(tmp_path)) == ids_of_segment(1) + ids_of_segment(2)
    assert sum(a.rows for a in acks) == ROWS[1] + ROWS[2]


def test_a_damaged_chunk_raises_before_any_of_its_rows_is_written(writer, wal, tmp_path):
    """Segment 1's second chunk damaged, in its file (what flush tasks read) and in the log
    (what the driver reads)."""
    seal = wal.built[BATCH].seal
    with open(wal.wal.segment_path(seal.segments[1].name), "r+b") as fh:
        data = bytearray(fh.read())
        data[-30] ^= 0xFF                     # inside the last chunk's payload
        fh.seek(0)
        fh.write(data)
    key = fmt.rows_key(BATCH, 1, 1)
    value = bytearray(wal.wal_log._db[key])
    value[-1] ^= 0xFF
    wal.wal_log._db[key] = bytes(value)
    with pytest.raises(WalCorrupted):
        write(writer, wal)
    damaged = ids_of_segment(1)[2:]             # the chunk of rows 2.. of segment 1
    assert not set(damaged) & {row for row, _ in written(tmp_path)}


def test_a_failed_write_raises_having_acknowledged_only_rows_written(writer, wal, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv(FAIL_ENV, str(ids_of_segment(2)[0]))
    acks = []
    with pytest.raises(Exception) as raised:
        for ack in writer.write(wal.wal_log, wal.built[BATCH].seal, wal.wal_log.get(BATCH)):
            acks.append(ack)
    assert is_transient(raised.value), raised.value        # the batch is kept and retried
    done = {row for row, _ in written(tmp_path)}
    acknowledged = ALL_IDS[:sum(a.rows for a in acks)]
    assert set(acknowledged) <= done
    assert not set(ids_of_segment(2)[:2]) & set(acknowledged)


def test_the_writer_leaves_the_log_alone(writer, wal, tmp_path):
    before = wal.wal_log.get(BATCH)
    write(writer, wal)
    after = wal.wal_log.get(BATCH)
    assert after.state is BatchState.FLUSHING
    assert (after.next_segment, after.next_chunk, after.flushed_rows) == \
        (before.next_segment, before.next_chunk, before.flushed_rows)


def test_written_twice_the_cells_are_the_same(writer, wal, tmp_path):
    write(writer, wal)
    first = sorted(written(tmp_path))
    write(writer, wal)                           # a replay of the whole batch
    both = sorted(written(tmp_path))
    assert both == sorted(first + first)


def test_through_the_replayer_the_batch_is_marked_once_every_row_is_written(writer, wal,
                                                                            tmp_path):
    replayer = Replayer(wal.wal, wal.wal_log, None, wal.checkpoint, writer=writer)
    report = replayer.run(RecoveryPolicy.QUERY_FLUSHER)
    assert report.replayed == [BATCH]
    assert wal.wal_log.get(BATCH).state is BatchState.FLUSHED
    assert sorted(row for row, _ in written(tmp_path)) == ALL_IDS


def failed_flush(writer, wal, monkeypatch, segment: int) -> Replayer:
    """A Replayer whose flush of the batch failed at the first row of ``segment`` (which it
    keeps failing until ``FAIL_ENV`` is cleared)."""
    monkeypatch.setenv(FAIL_ENV, str(ids_of_segment(segment)[0]))
    replayer = Replayer(wal.wal, wal.wal_log, None, wal.checkpoint, writer=writer)
    with pytest.raises(Exception):
        replayer.run(RecoveryPolicy.QUERY_FLUSHER)
    assert wal.wal_log.get(BATCH).state is BatchState.FLUSHING
    return replayer


def test_through_the_replayer_a_failure_keeps_the_batch_and_a_retry_writes_the_rest(
        writer, wal, tmp_path, monkeypatch):
    replayer = failed_flush(writer, wal, monkeypatch, 2)
    progress = wal.wal_log.get(BATCH)
    monkeypatch.setenv(FAIL_ENV, "")
    writer.reset()                               # as the flusher does after a failure
    replayer.run(RecoveryPolicy.QUERY_FLUSHER)
    assert wal.wal_log.get(BATCH).state is BatchState.FLUSHED
    rows = written(tmp_path)
    assert sorted(set(row for row, _ in rows)) == ALL_IDS
    rewritten = [row for row in ALL_IDS if [r for r, _ in rows].count(row) > 1]
    assert not set(rewritten) & set(ALL_IDS[:progress.flushed_rows])   # the prefix stays written


def acknowledged_ids(acks) -> set[int]:
    """The row ids the acknowledgements claim: the longest prefix (in seal order, chunk by
    chunk) and every segment acknowledged whole."""
    prefix = max(((a.next_segment, a.next_chunk) for a in acks
                  if isinstance(a, Acknowledged)), default=(0, 0))
    ids = {i for s in range(prefix[0]) for i in ids_of_segment(s)}
    if prefix[0] < len(ROWS):
        ids |= set(ids_of_segment(prefix[0])[:prefix[1] * CHUNK_ROWS])
    return ids | {i for a in acks if isinstance(a, SegmentAcknowledged)
                  for i in ids_of_segment(a.segment)}


def test_a_write_skips_the_segments_acknowledged_beyond_the_prefix(writer, wal, tmp_path):
    wal.wal_log.record_acknowledged(BATCH, 1, ROWS[1])     # segment 1 written whole, 0 failed
    record = wal.wal_log.get(BATCH)
    assert record.acknowledged == ((1, ROWS[1]),) and record.flushed_rows == ROWS[1]
    acks = write(writer, wal)
    assert sorted(row for row, _ in written(tmp_path)) == ids_of_segment(0) + ids_of_segment(2)
    assert sum(a.rows for a in acks) == ROWS[0] + ROWS[2]
    assert acknowledged_ids(acks) | set(ids_of_segment(1)) == set(ALL_IDS)


def test_after_a_failed_segment_each_later_segment_written_whole_is_acknowledged(
        writer, wal, tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_ENV, str(ids_of_segment(1)[0]))     # segment 1 fails at once
    acks = []
    with pytest.raises(Exception) as raised:
        for ack in writer.write(wal.wal_log, wal.built[BATCH].seal, wal.wal_log.get(BATCH)):
            acks.append(ack)
    assert is_transient(raised.value), raised.value
    done = {row for row, _ in written(tmp_path)}
    assert acknowledged_ids(acks) <= done                 # nothing claimed that was not written
    assert not set(ids_of_segment(1)) & acknowledged_ids(acks)
    if isinstance(writer, ExecutorsWriter):               # one task a segment: 2 is done
        assert [(a.segment, a.rows) for a in acks if isinstance(a, SegmentAcknowledged)] == \
            [(2, ROWS[2])]


def test_through_the_replayer_a_retry_writes_only_the_segments_not_acknowledged(
        writer, wal, tmp_path, monkeypatch):
    replayer = failed_flush(writer, wal, monkeypatch, 1)
    kept = wal.wal_log.get(BATCH)
    scale_out = isinstance(writer, ExecutorsWriter)
    assert kept.acknowledged == (((2, ROWS[2]),) if scale_out else ())
    assert kept.flushed_rows == ROWS[0] + (ROWS[2] if scale_out else 0)
    first = len(written(tmp_path))
    monkeypatch.setenv(FAIL_ENV, "")
    writer.reset()
    replayer.run(RecoveryPolicy.QUERY_FLUSHER)
    assert wal.wal_log.get(BATCH).state is BatchState.FLUSHED
    again = sorted(row for row, _ in written(tmp_path)[first:])
    assert again == ids_of_segment(1) + ([] if scale_out else ids_of_segment(2))
    assert sorted(set(row for row, _ in written(tmp_path))) == ALL_IDS
    base = wal.built[BATCH].seal.base_ts_us
    assert all(ts == base + (row - BATCH * 1000) for row, ts in written(tmp_path))


# -- where the rows are: the log keeps a copy only for a writer that reads it --------------
@pytest.fixture
def sealed_wal(tmp_path):
    """A WAL holding batch 3, committed and sealed, not ingested yet."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(BATCH, rows=ROWS, chunk_rows=CHUNK_ROWS)
        yield f


def test_through_the_replayer_the_rows_are_copied_into_the_log_only_for_a_writer_reading_it(
        writer, sealed_wal, tmp_path):
    """The scale-out writers' tasks read the segments: the driver copies no row (before,
    every row went through the driver's log first, whatever the mode); the driver's writer
    reads the log's copy, which retention keeps."""
    f = sealed_wal
    Replayer(f.wal, f.wal_log, None, f.checkpoint,
             writer=writer).run(RecoveryPolicy.QUERY_FLUSHER)
    record = f.wal_log.get(BATCH)
    assert record.state is BatchState.FLUSHED
    assert sorted(row for row, _ in written(tmp_path)) == ALL_IDS
    base = f.built[BATCH].seal.base_ts_us
    assert all(ts == base + (row - BATCH * 1000) for row, ts in written(tmp_path))
    prefix = fmt.rows_prefix(BATCH)
    copied = [k for k in f.wal_log._db.keys(from_key=prefix) if k.startswith(prefix)]
    assert record.rows_in_log == writer.reads_log == bool(copied)


def test_a_damaged_segment_blocks_before_any_row_of_the_batch_is_written(
        writer, sealed_wal, tmp_path):
    """Nothing of a damaged batch is written by a writer whose segments the driver can read:
    they are all verified when the batch is ingested, before a task writes a row (segments
    0 and 2 are intact and written by no one). Tasks that read a store's segments verify each
    their own (the driver fetches none): nothing of the damaged segment is written, the
    batch stops there, blocked, and the intact segments are acknowledged
    (``docs/guarantees.md``, "A damaged segment on a store")."""
    from recovery.errors import RecoveryBlocked

    f = sealed_wal
    seal = f.built[BATCH].seal
    with open(f.wal.segment_path(seal.segments[1].name), "r+b") as fh:
        data = bytearray(fh.read())
        data[-30] ^= 0xFF
        fh.seek(0)
        fh.write(data)
    with pytest.raises(RecoveryBlocked) as info:
        Replayer(f.wal, f.wal_log, None, f.checkpoint,
                 writer=writer).run(RecoveryPolicy.QUERY_FLUSHER)
    assert info.value.batch == BATCH and seal.segments[1].name in str(info.value)
    if not writer.reads_store:
        assert written(tmp_path) == [] and f.wal_log.get(BATCH) is None
        return
    assert sorted(row for row, _ in written(tmp_path)) == ids_of_segment(0) + ids_of_segment(2)
    left = f.wal_log.get(BATCH)
    assert left.state is BatchState.FLUSHING and left.next_segment == 1
    assert left.acknowledged == ((2, ROWS[2]),)


def test_a_batch_a_scale_out_writer_left_is_finished_by_the_drivers_writer(
        sealed_wal, tmp_path, monkeypatch):
    """Spark stopped (or the mode changed) after a scale-out writer's tasks wrote part of the
    batch: the driver's writer copies the rows in then, and writes only what is not
    acknowledged, each row at its sealed timestamp."""
    monkeypatch.setenv(WRITES_ENV, str(tmp_path / "writes.jsonl"))
    monkeypatch.setenv(FAIL_ENV, str(ids_of_segment(1)[0]))
    f = sealed_wal
    tasks = ExecutorsWriter(LocalJob(), f.root, target, open_upserter=contract_upserter)
    replayer = Replayer(f.wal, f.wal_log, None, f.checkpoint, writer=tasks)
    with pytest.raises(Exception):
        replayer.run(RecoveryPolicy.QUERY_FLUSHER)
    left = f.wal_log.get(BATCH)
    assert left.state is BatchState.FLUSHING and not left.rows_in_log
    assert left.acknowledged == ((2, ROWS[2]),)
    first = len(written(tmp_path))
    monkeypatch.setenv(FAIL_ENV, "")
    replayer.run(RecoveryPolicy.QUERY_FLUSHER, writer=DriverWriter(lambda seal: ContractUpserter()))
    assert f.wal_log.get(BATCH).state is BatchState.FLUSHED
    assert sorted(row for row, _ in written(tmp_path)[first:]) == ids_of_segment(1)
    base = f.built[BATCH].seal.base_ts_us
    assert sorted(set(written(tmp_path))) == [(row, base + row - BATCH * 1000)
                                                for row in ALL_IDS]


# -- TTLs: the age the driver measured, whatever the clock of the process that writes ---------
# A real Upserter writes, over a session that records every request's rows in a file
# (tests/helpers/fake_cassandra.py), in the process that writes: the driver, a task played
# the way Spark runs it, or a real worker process. That process's wall clock is SKEW_ENV
# seconds off while it writes (an executor whose clock runs ahead or behind; in driver mode,
# the driver's clock stepping once it took the batch in hand).
REQUESTS_ENV = "CWAL_CONTRACT_REQUESTS"
SKEW_ENV = "CWAL_CONTRACT_SKEW_S"
HOUR = 3600
TTL_TABLE = TableSchema("ks", "t", (("id", "bigint"), ("name", "text"), ("value", "double")),
                        ("id",))


def ttl_target() -> Target:
    """Rows written with a TTL of two hours; only ``id`` and ``name`` (``value`` is another
    writer's column)."""
    config = SinkConfig("ks", "t", write=WriteConfig(ttl_seconds=2 * HOUR,
                                                     batch_grouping_key="partition"))
    return Target(config, TTL_TABLE, ("id", "name"))


def recording_upserter_of(target: Target) -> Upserter:
    session = RecordingSession(target.table, os.environ[REQUESTS_ENV])
    return Upserter(session, target.table, target.columns, target.config.write)


@contextlib.contextmanager
def skewed_upserter(target: Target):
    """A flush task's or worker's Upserter, its process's clock SKEW_ENV seconds off."""
    with skewed_clock(float(os.environ.get(SKEW_ENV) or 0)):
        yield recording_upserter_of(target)


@pytest.fixture(params=["driver", "executors", "processes"])
def ttl_writer(request, tmp_path, monkeypatch):
    """A row writer of each flush mode whose rows a real Upserter writes (``ttl_target``)."""
    monkeypatch.setenv(REQUESTS_ENV, str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv(SKEW_ENV, "0")
    root = str(tmp_path / "wal")
    with contextlib.ExitStack() as clocks:
        if request.param == "driver":
            def upserter(seal):          # the driver's clock steps once it has the batch
                clocks.enter_context(skewed_clock(float(os.environ[SKEW_ENV])))
                return recording_upserter_of(ttl_target().as_sealed(seal.write))

            made = DriverWriter(upserter)
        elif request.param == "executors":
            made = ExecutorsWriter(LocalJob(), root, ttl_target, open_upserter=skewed_upserter)
        else:
            made = ExecutorsWriter(ProcessPool(1), root, ttl_target,
                                   open_upserter=skewed_upserter)
        yield made
        made.reset()


@contextlib.contextmanager
def ttl_wal(tmp_path, sealed_ago_s: float):
    """Batch 3 sealed ``sealed_ago_s`` seconds ago with ``ttl_target``'s TTL; committed."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushing(BATCH, rows=ROWS, chunk_rows=CHUNK_ROWS, write=ttl_target().write_record(),
                   sealed_at_us=now_us() - int(sealed_ago_s * 1e6))
        yield f


def flush(writer, f: WalFactory) -> None:
    """What the flusher does: the Replayer takes the batch in hand and has the writer write it."""
    Replayer(f.wal, f.wal_log, None, f.checkpoint,
             writer=writer).run(RecoveryPolicy.QUERY_FLUSHER)
    assert f.wal_log.get(BATCH).state is BatchState.FLUSHED


def sent(tmp_path) -> list[dict]:
    return read_requests(tmp_path / "requests.jsonl")


def requests(rows: list[dict]) -> list[str]:
    """The rows sent, whenever they were applied."""
    return sorted(json.dumps({k: v for k, v in r.items() if k != "at_s"}, sort_keys=True)
                  for r in rows)


@pytest.mark.parametrize("skew_h", [2, -2], ids=["ahead", "behind"])
def test_a_writer_whose_clock_is_off_sends_the_ttl_left_as_the_driver_measured_it(
        ttl_writer, tmp_path, monkeypatch, skew_h):
    """Sealed an hour ago with a TTL of two: every row has an hour left, and is written with
    it, whatever the clock of the process that writes says. Before, that process counted the
    batch's age on its own clock: 2 h ahead it found 3 h gone and skipped every row; 2 h
    behind it found none gone (never less than 0) and sent the whole TTL, two hours, so
    every row would have lived an hour longer than sealed."""
    with ttl_wal(tmp_path, sealed_ago_s=HOUR) as f:
        monkeypatch.setenv(SKEW_ENV, str(skew_h * HOUR))
        flush(ttl_writer, f)
        rows = sent(tmp_path)
        assert sorted(r["key"][0] for r in rows) == ALL_IDS
        assert {r["op"] for r in rows} == {"insert"}
        ttls = {r["ttl"] for r in rows}
        assert min(ttls) >= HOUR - 10 and max(ttls) <= HOUR, ttls   # never longer than sealed


def test_a_row_whose_ttl_ran_out_while_pending_is_written_as_a_tombstone_at_its_timestamp(
        ttl_writer, tmp_path):
    """Sealed three hours ago with a TTL of two: the rows expired while they were pending.
    Cassandra would hold, of each, a tombstone per written cell at its write timestamp (an
    expired cell is one): so the writer deletes the columns written (``name``) at the sealed
    timestamp, not the row, and a replay writes the same tombstones. An older cell of another
    writer is hidden in ``name`` and stays in ``value``, which the row never wrote. Before,
    the rows were skipped: the other writer's older ``name`` stayed visible."""
    with ttl_wal(tmp_path, sealed_ago_s=3 * HOUR) as f:
        seal = f.built[BATCH].seal
        write(ttl_writer, f)
        first = sent(tmp_path)
        assert sorted(r["key"][0] for r in first) == ALL_IDS
        assert all(r["op"] == "delete" and r["columns"] == ["name"] and
                   r["ts"] == seal.base_ts_us + r["key"][0] - BATCH * 1000 for r in first)
        write(ttl_writer, f)                                   # a replay
        again = sent(tmp_path)[len(first):]
        assert requests(again) == requests(first)
        older = [{"op": "insert", "key": [i], "ts": seal.base_ts_us - 1, "ttl": None,
                  "cells": {"name": "older", "value": 1.5}, "at_s": time.time()} for i in ALL_IDS]
        assert visible(older + first, time.time()) == {(i,): {"value": 1.5} for i in ALL_IDS}
