"""Tasks stage concurrently and never block (FORMAT.md "Who writes what").

Eight spawned processes play executor tasks writing segments of the same batch into one WAL
directory at once (seven partitions, partition 3 twice: a retried attempt), released together
by a barrier, while a ninth process holds the log's writer lock as the driver's flusher does.
Tasks open no database, so all of them finish; then the batch is sealed with the winning
attempts, ingested, and read back row for row.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time

import pyarrow as pa
import pytest

from wal.errors import WalLocked
from wal.layout import WalDir
from wal.log import WalLog
from wal.seal import seal_batch
from wal.segment import SegmentReader, SegmentRef, SegmentWriter, decode_chunk

pytestmark = pytest.mark.unit

BATCH = 11
CHUNKS = 5
CHUNK_ROWS = 400
TASKS = [(p, 0) for p in range(7)] + [(3, 1)]   # (partition, attempt)
STARTUP_S = 180   # spawning 9 interpreters that import pyarrow, on a possibly loaded machine
STAGE_S = 30      # from the barrier's release to a task's finish(): a blocked task exceeds it


def task_rows(partition: int, attempt: int, chunk: int) -> pa.RecordBatch:
    base = (partition * 10 + attempt) * 1_000_000 + chunk * CHUNK_ROWS
    ids = list(range(base, base + CHUNK_ROWS))
    return pa.record_batch({
        "id": pa.array(ids, pa.int64()),
        "partition": pa.array([partition] * CHUNK_ROWS, pa.int32()),
        "attempt": pa.array([attempt] * CHUNK_ROWS, pa.int32()),
        "payload": pa.array([f"p{partition}-a{attempt}-{i:08d}" * 3 for i in ids]),
    })


def expected_ids(partition: int, attempt: int) -> list[int]:
    return [i for c in range(CHUNKS)
            for i in task_rows(partition, attempt, c).column("id").to_pylist()]


def stage_task(root: str, partition: int, attempt: int, barrier, results) -> None:
    """One executor task: wait for the others, then write a segment chunk by chunk."""
    try:
        barrier.wait(STARTUP_S)
        started = time.monotonic()
        wal = WalDir(root)
        with SegmentWriter(wal, BATCH, partition, attempt, header={"query_id": "q"}) as writer:
            for c in range(CHUNKS):
                writer.append(task_rows(partition, attempt, c))
                time.sleep(0.005)   # let the tasks interleave
            ref = writer.finish()
        results.put(("ok", ref.to_dict(), time.monotonic() - started))
    except BaseException as exc:   # report it to the test rather than die silently
        results.put(("error", f"task {partition}/{attempt}: {exc!r}", None))
        raise


def hold_writer(root: str, locked, release) -> None:
    """The driver's flusher: holds the RocksDB writer lock until told to let go."""
    with WalLog.open_writer(WalDir(root)):
        locked.set()
        release.wait(STARTUP_S + STAGE_S)


def test_concurrent_tasks_stage_one_batch_while_the_log_is_locked(tmp_path):
    ctx = mp.get_context("spawn")
    wal = WalDir(str(tmp_path / "wal")).create()
    locked, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=hold_writer, args=(wal.root, locked, release), daemon=True)
    holder.start()
    tasks = []
    try:
        assert locked.wait(STARTUP_S), "the writer process never opened the log"
        with pytest.raises(WalLocked):
            WalLog.open_writer(wal)

        barrier, results = ctx.Barrier(len(TASKS)), ctx.Queue()
        tasks = [ctx.Process(target=stage_task, args=(wal.root, p, a, barrier, results),
                             daemon=True) for p, a in TASKS]
        for t in tasks:
            t.start()
        deadline = time.monotonic() + STARTUP_S + STAGE_S
        outcomes = []
        while len(outcomes) < len(TASKS):
            try:
                outcomes.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"only {len(outcomes)} of {len(TASKS)} tasks finished within "
                            f"{STARTUP_S + STAGE_S}s: a task blocked")
        for t in tasks:
            t.join(STAGE_S)
            assert t.exitcode == 0, f"task pid {t.pid} exit code {t.exitcode}"
        errors = [detail for status, detail, _s in outcomes if status != "ok"]
        assert errors == []
        slowest = max(seconds for _status, _detail, seconds in outcomes)
        assert slowest < STAGE_S, f"a task took {slowest:.1f}s to stage: it was blocked"
        refs = [SegmentRef.from_dict(detail) for _status, detail, _s in outcomes]
        assert holder.is_alive(), "the writer lock was released during staging"
    finally:
        release.set()
        holder.join(STAGE_S)
        for p in [holder, *tasks]:
            if p.is_alive():
                p.kill()
    assert holder.exitcode == 0

    # Every segment is complete, verifies against what its task reported, and is unique.
    assert len({r.name for r in refs}) == len(TASKS)
    assert sorted(wal.segment_files(BATCH)) == sorted(r.name for r in refs)
    assert not [n for n in os.listdir(wal.batch_segments(BATCH)) if n.endswith(".tmp")]
    for ref in refs:
        reader = SegmentReader(wal.segment_path(ref.name), BATCH, ref.partition, ref.name)
        assert reader.verify(ref) == (CHUNKS * CHUNK_ROWS, ref.crc32)
        assert (reader.header()["partition"], reader.header()["attempt"]) == \
            (ref.partition, ref.attempt)
    assert sorted((r.partition, r.attempt) for r in refs) == sorted(TASKS)

    # The commit picks one attempt per partition (here the retry of partition 3).
    winners = [r for r in refs if (r.partition, r.attempt) != (3, 0)]
    seal = seal_batch(wal, BATCH, winners, query_id="q")
    with WalLog.open_writer(wal) as wal_log:
        wal_log.ingest(seal)
        got = []
        for chunk in wal_log.chunks(BATCH):
            assert chunk.first_row == len(got)
            got += decode_chunk(chunk.payload).column("id").to_pylist()
    want = [i for p in range(7) for i in expected_ids(p, 1 if p == 3 else 0)]
    assert got == want
    assert len(got) == seal.rows == 7 * CHUNKS * CHUNK_ROWS
