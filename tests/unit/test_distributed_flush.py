"""``wal.flush.mode=executors`` (recovery/executors.py) driven by the real Replayer.

No Spark and no Cassandra: the "job" runs each task in this process, the way Spark would (the
task list and the closure pickled with cloudpickle, the results with pickle), and a recording
Upserter stands in for Cassandra. Row ids are ``batch * 1000 + position in the batch``
(:class:`tests.helpers.walfactory.WalFactory`), so every written chunk says which rows and which
timestamps it got.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from dataclasses import replace

from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException, PySparkTypeError

from recovery.errors import FlushFailed, RecoveryBlocked, is_transient
from recovery.executors import ExecutorsWriter, SegmentJob, _armed, segment_tasks, write_segments
from recovery.replay import Replayer
from sinks.driver.spark_jobs import SparkJobs
from tests.helpers.flush_fakes import (FAIL_IDS, PASSWORD, WRITES, LocalJob, flusher_for,
                                       recording_upserter, target, target_flushed_by)
from tests.helpers.spark_fakes import FakeSpark
from tests.helpers.walfactory import WalFactory
from wal.crashpoints import ENV_POINT
from wal.errors import WalCorrupted
from wal.recovery_policy import RecoveryPolicy
from wal.stores import StoreAccess
from wal.states import BatchState

pytestmark = pytest.mark.unit


def writer(wal_root: str, job: LocalJob) -> ExecutorsWriter:
    return ExecutorsWriter(job, wal_root, target, open_upserter=recording_upserter)


def replayer(f: WalFactory, w: ExecutorsWriter) -> Replayer:
    return Replayer(f.wal, f.wal_log, None, f.checkpoint, writer=w)


def ids_written(batch: int | None = None) -> list[int]:
    return sorted(i for b, _, ids in WRITES if batch in (None, b) for i in ids)


def corrupt_last_chunk(f: WalFactory, batch: int, segment: int) -> None:
    """Flip a byte inside the segment's last chunk payload (before the footer)."""
    path = f.wal.segment_path(f.built[batch].segments[segment].name)
    with open(path, "r+b") as fh:
        data = bytearray(fh.read())
        at = len(data) - 30
        data[at] ^= 0xFF
        fh.seek(0)
        fh.write(data)


# -- marking -------------------------------------------------------------------------------------
def test_marks_flushed_only_after_every_segment_is_acknowledged(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 5, 2), chunk_rows=2)
        job = LocalJob(f)
        report = replayer(f, writer(f.root, job)).run(RecoveryPolicy.QUERY_FLUSHER)
        assert report.replayed == [0] and report.rows_written == 10
        assert job.jobs == [[0, 1, 2]]                  # one job, one task per segment
        assert job.states_during_job == ["flushing"]    # not marked while the tasks ran
        assert ids_written(0) == list(range(10))
        record = f.wal_log.get(0)
        assert record.state is BatchState.FLUSHED and record.flushed_rows == 10
        assert f.wal.read_flushed_through() == 0
        assert not os.path.exists(f.wal.batch_segments(0))     # files go once FLUSHED


def test_a_segment_without_a_result_leaves_the_batch_unmarked(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 5, 2))
        with pytest.raises(FlushFailed, match="returned no result"):
            replayer(f, writer(f.root, LocalJob(f, drop_results={1}))).run(
                RecoveryPolicy.QUERY_FLUSHER)
        record = f.wal_log.get(0)
        assert record.state is BatchState.FLUSHING
        assert (record.next_segment, record.next_chunk, record.flushed_rows) == (1, 0, 5)
        assert record.acknowledged == ((2, 2),)       # segment 2's task answered: kept
        assert f.wal.read_flushed_through() == -1


def test_a_failed_task_leaves_the_batch_unmarked_and_the_retry_finishes_it(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 5, 2), chunk_rows=2)
        f.sealed(1, rows=(4,))
        FAIL_IDS.add(4)                     # segment 1's first chunk (ids 3, 4) times out
        job = LocalJob(f)
        r = replayer(f, writer(f.root, job))
        with pytest.raises(FlushFailed, match="injected"):
            r.run(RecoveryPolicy.QUERY_FLUSHER)
        record = f.wal_log.get(0)
        assert record.state is BatchState.FLUSHING
        # Segments 0 and 2 were written by their tasks: the prefix, and 2 on its own.
        assert (record.next_segment, record.flushed_rows, record.acknowledged) == (1, 5, ((2, 2),))
        assert set(ids_written(0)) == {0, 1, 2, 8, 9}
        assert ids_written(1) == [] and f.wal_log.get(1) is None     # nothing later was touched
        assert f.wal.read_flushed_through() == -1
        assert os.path.exists(f.wal.segment_path(f.built[0].segments[1].name))

        FAIL_IDS.clear()
        WRITES.clear()
        report = r.run(RecoveryPolicy.QUERY_FLUSHER)
        assert report.replayed == [0, 1]
        assert job.jobs[1] == [1]           # the retry writes only the unacknowledged one
        assert ids_written(0) == [3, 4, 5, 6, 7]
        assert f.wal_log.get(0).state is BatchState.FLUSHED and f.wal_log.get(0).flushed_rows == 10
        assert f.wal_log.get(1).state is BatchState.FLUSHED
        assert f.wal.read_flushed_through() == 1


def test_a_failed_job_acknowledges_nothing(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 5))
        with pytest.raises(FlushFailed, match="executor lost"):
            replayer(f, writer(f.root, LocalJob(f, fail_job=True))).run(
                RecoveryPolicy.QUERY_FLUSHER)
        record = f.wal_log.get(0)
        assert record.state is BatchState.FLUSHING and record.flushed_rows == 0
        assert f.wal.read_flushed_through() == -1


# -- corruption ----------------------------------------------------------------------------------
def test_a_segment_corrupted_after_ingest_blocks_without_writing_any_of_it(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.ingested(0, rows=(3, 6, 2), chunk_rows=2)    # checksums verified at ingest
        corrupt_last_chunk(f, 0, 1)                    # then the file is damaged
        f.sealed(1, rows=(2,))
        with pytest.raises(RecoveryBlocked) as info:
            replayer(f, writer(f.root, LocalJob(f))).run(RecoveryPolicy.QUERY_FLUSHER)
        assert info.value.batch == 0 and "checksum" in str(info.value)
        # Not one row of segment 1 (ids 3..8), although its first chunks were intact.
        assert not set(ids_written(0)) & set(range(3, 9))
        assert f.wal_log.get(0).state is BatchState.FLUSHING
        assert ids_written(1) == []


def test_a_corrupted_segment_wins_over_a_transient_failure(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.ingested(0, rows=(3, 4))
        FAIL_IDS.add(0)                     # segment 0: transient failure
        corrupt_last_chunk(f, 0, 1)         # segment 1: corrupted: retrying would not help
        with pytest.raises(RecoveryBlocked):
            replayer(f, writer(f.root, LocalJob(f))).run(RecoveryPolicy.QUERY_FLUSHER)


def test_a_segment_missing_on_the_executor_is_a_permanent_failure(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.ingested(0, rows=(3, 4))
        os.unlink(f.wal.segment_path(f.built[0].segments[1].name))
        with pytest.raises(FlushFailed, match="mounted at the same path") as info:
            replayer(f, writer(f.root, LocalJob(f))).run(RecoveryPolicy.QUERY_FLUSHER)
        assert info.value.permanent


# -- timestamps ----------------------------------------------------------------------------------
def test_each_segment_is_written_at_base_plus_its_first_row_ordinal(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(3, rows=(3, 5, 2), chunk_rows=2)
        replayer(f, writer(f.root, LocalJob(f))).run(RecoveryPolicy.QUERY_FLUSHER)
        base = built.seal.base_ts_us
        assert [t.first_row for t in segment_tasks(built.seal, 0, 0)] == [0, 3, 8]
        for batch, first_ts, ids in WRITES:
            assert first_ts == base + (ids[0] - 3000), (first_ts, ids)
        firsts = {ids[0]: ts for _, ts, ids in WRITES}
        assert [firsts[3000], firsts[3003], firsts[3008]] == [base, base + 3, base + 8]


def test_resumes_inside_a_segment_at_the_driver_modes_progress(tmp_path):
    """A driver-mode flush (or recovery) that stopped after 3 chunks: the executors write the
    rest, from chunk 1 of segment 1, at the same timestamps."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.flushing(0, rows=(4, 6), chunk_rows=2, progress_rows=6)
        record = f.wal_log.get(0)
        assert (record.next_segment, record.next_chunk) == (1, 1)
        job = LocalJob(f)
        replayer(f, writer(f.root, job)).run(RecoveryPolicy.QUERY_FLUSHER)
        assert job.jobs == [[1]]
        assert ids_written(0) == [6, 7, 8, 9]
        assert {ids[0]: ts - built.seal.base_ts_us for _, ts, ids in WRITES} == {6: 6, 8: 8}
        assert f.wal_log.get(0).state is BatchState.FLUSHED and f.wal_log.get(0).flushed_rows == 10


# -- what travels --------------------------------------------------------------------------------
def test_credentials_travel_in_the_closure_only(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 2))
        job = LocalJob(f)
        replayer(f, writer(f.root, job)).run(RecoveryPolicy.QUERY_FLUSHER)
        assert PASSWORD.encode() not in job.task_lists[0]    # PySpark spools these to a file
        assert PASSWORD.encode() in job.closures[0]          # in memory, with the task
        assert PASSWORD not in repr(SegmentJob(f.root, 0, 1, target()))


def test_crash_points_armed_in_the_driver_reach_the_task_and_are_disarmed(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_POINT, raising=False)
    with _armed(((ENV_POINT, "flush.task_written@99"),)):
        assert os.environ[ENV_POINT] == "flush.task_written@99"
    assert ENV_POINT not in os.environ


def test_a_task_without_a_session_reports_every_segment_failed(tmp_path):
    @contextlib.contextmanager
    def unreachable(_target):
        raise ConnectionError("no route to host")
        yield   # pragma: no cover

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=(3, 2))
        job = SegmentJob(f.root, 0, built.seal.base_ts_us, target(), (), unreachable)
        results = list(write_segments(job, segment_tasks(built.seal, 0, 0)))
        assert [(r.index, r.rows, type(r.error)) for r in results] == \
            [(0, 0, ConnectionError), (1, 0, ConnectionError)]


def test_a_segment_missing_from_the_store_is_corruption_naming_batch_and_segment(tmp_path):
    # A WAL on a store: the tasks read their segments there (recovery/executors.py), and a
    # sealed segment that is not there blocks the sink, as a damaged one does.
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=(3, 2))
        lost = built.seal.segments[1].name
        os.remove(f.wal.segment_path(lost))
        job = SegmentJob(str(tmp_path / "elsewhere"), 0, built.seal.base_ts_us, target(), (),
                         recording_upserter, store_uri=f"file:{f.root}")
        results = list(write_segments(job, segment_tasks(built.seal, 0, 0)))
        assert [(r.index, r.rows, r.error is None) for r in results] == \
            [(0, 3, True), (1, 0, False)]
        error = results[1].error
        assert isinstance(error, WalCorrupted), error
        assert (error.batch, error.segment) == (0, lost) and lost in str(error)


def test_store_keys_travel_in_the_closure_only(tmp_path):
    access = StoreAccess(s3_endpoint="http://127.0.0.1:9", s3_access_key="AKIDSECRET",
                         s3_secret_key="SECRETKEY")
    job = SegmentJob(str(tmp_path), 0, 1, target(), store_uri="s3a://b/wal", access=access)
    assert "SECRETKEY" not in repr(job) and "AKIDSECRET" not in repr(job)


# -- which writer the flusher picks --------------------------------------------------------------
def test_the_flusher_writes_from_the_executors_when_asked_and_recovery_leaves_them_the_backlog(
        tmp_path):
    flusher, runs = flusher_for(tmp_path, "executors", FakeSpark())
    try:
        flusher.recover()
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs[0] is None and flusher.replays[0] is False   # query start: discards only
        assert isinstance(runs[1], ExecutorsWriter) and flusher.replays[1] is True
    finally:
        flusher.wal_log.close()


def test_the_flusher_writes_from_the_driver_by_default_or_once_spark_stopped(tmp_path):
    flusher, runs = flusher_for(tmp_path, "driver", FakeSpark())
    try:
        flusher.recover()                           # driver mode: recovery writes too
        assert runs == [None] and flusher.replays == [True]
        runs.clear()
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        flusher.spark_jobs = SparkJobs(FakeSpark(stopped=True))
        target_json = flusher.wal.read_target()
        target_json["target"]["config"]["wal"]["flush_mode"] = "executors"   # a restarted query
        target_json["fingerprint"] = "g"                      # (new options, new fingerprint)
        flusher.wal.write_target(target_json)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        flusher.spark_jobs = SparkJobs(FakeSpark())
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs[:2] == [None, None] and isinstance(runs[2], ExecutorsWriter)
    finally:
        flusher.wal_log.close()


# -- the flusher follows the options of the query as it runs now ----------------------------------
def rewrite_target(flusher, fingerprint: str, **changes) -> None:
    """What a restarted query's first batch does: new options, new ``target.json``."""
    recorded = flusher.wal.read_target()
    for path, value in changes.items():
        node = recorded["target"]["config"]
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    recorded["fingerprint"] = fingerprint
    flusher.wal.write_target(recorded)


def test_a_restart_that_turns_the_flush_on_is_followed_without_a_second_restart(tmp_path):
    from dataclasses import replace

    from recovery.flusher import QueryFlusher
    from wal.layout import WalDir

    wal = WalDir(str(tmp_path / "wal")).create()
    t = target()
    t = replace(t, config=replace(t.config, wal=replace(t.config.wal, flush=False)))
    wal.write_target({"fingerprint": "staging-only", "target": t.to_dict()})
    flusher = QueryFlusher(wal.root, str(tmp_path / "cp"))
    runs = []
    flusher.replayer.run = (lambda policy, prefix, writer=None, replay=True:
                            runs.append(policy))
    try:
        flusher.recover()                  # query start, with the previous run's options
        assert runs == []
        rewrite_target(flusher, "flushing", **{"wal.flush": True, "wal.retention_batches": 3})
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs == [RecoveryPolicy.QUERY_FLUSHER]
        assert flusher.target.config.wal.flush is True
        assert flusher.replayer.retention.keep_batches == 3
    finally:
        flusher.wal_log.close()


def test_new_contact_points_reach_the_next_connection_and_old_sessions_are_closed(tmp_path):
    flusher, runs = flusher_for(tmp_path, "driver", None)
    closed = []
    flusher.output.close = lambda: closed.append(True)
    try:
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert closed == [] and flusher.output.target.config.connection.hosts == ("localhost",)
        rewrite_target(flusher, "moved", **{"connection.hosts": ["10.0.0.5"],
                                             "connection.port": 9142})
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert closed == [True]
        conn = flusher.output.current_target().config.connection
        assert (conn.hosts, conn.port) == (("10.0.0.5",), 9142)
    finally:
        flusher.wal_log.close()


def test_an_unchanged_fingerprint_keeps_the_session(tmp_path):
    flusher, runs = flusher_for(tmp_path, "driver", None)
    output = flusher.output
    try:
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.output is output and len(runs) == 2
    finally:
        flusher.wal_log.close()


def test_a_flush_task_runs_the_tasks_of_its_rows_and_returns_their_results_pickled():
    # sinks/worker/flush_task.run_partition, as mapInArrow calls it on an executor: the partition's
    # rows carry pickled SegmentTasks; each result comes back pickled, one row each.
    import pickle

    import pyarrow as pa

    from recovery.executors import SegmentResult, SegmentTask
    from sinks.worker.flush_task import run_partition
    from wal.segment import SegmentRef

    tasks = [SegmentTask(i, SegmentRef(f"00/{i}.seg", i, 0, 3, 1, 10, 7), 3 * i) for i in (4, 5)]
    seen = []

    def fn(partition):
        for task in partition:
            seen.append(task)
            yield SegmentResult(task.index, task.segment.rows, None, "h")

    rows = pa.RecordBatch.from_pydict({"task": [pickle.dumps(t) for t in tasks]})
    out = list(run_partition(fn, iter([rows])))
    assert seen == tasks
    assert [pickle.loads(rb.column("result")[0].as_py()) for rb in out] == \
        [SegmentResult(4, 3, None, "h"), SegmentResult(5, 3, None, "h")]


def test_through_spark_connect_without_tls_a_flush_with_credentials_stays_in_the_client(
        tmp_path, monkeypatch, caplog):
    # The job's closure travels to a Connect server in the plan: with credentials, only over
    # TLS; otherwise the client flushes itself and says so once (sinks/driver/spark_jobs.py).
    flusher, runs = flusher_for(tmp_path, "executors", FakeSpark())
    try:
        monkeypatch.setattr(flusher.spark_jobs, "carries_secrets", lambda: False)
        monkeypatch.setattr(flusher.output, "current_target", lambda: target_flushed_by("executors"))
        with caplog.at_level("WARNING", logger="recovery.flusher"):
            flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
            flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs == [None, None]
        assert sum("use_ssl=true" in r.getMessage() for r in caplog.records) == 1
        without = replace(target_flushed_by("executors"), config=replace(
            target().config, connection=replace(target().config.connection, password=None),
            wal=target_flushed_by("executors").config.wal))
        monkeypatch.setattr(flusher.output, "current_target", lambda: without)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert isinstance(runs[2], ExecutorsWriter)      # nothing secret: through the server
    finally:
        flusher.wal_log.close()


class _FailingSession:
    """A classic session whose DataFrame calls raise ``error``."""

    def __init__(self, error):
        self.error = error
        self.sparkContext = None          # setJobDescription fails: cosmetic, ignored

    def createDataFrame(self, *args):
        raise self.error

    def range(self, *args):
        raise self.error


@pytest.mark.parametrize("error, permanent", [
    (AnalysisException("[UNRESOLVED_COLUMN] A column named `task` cannot be resolved."), True),
    (PySparkTypeError("the closure's argument is not a Column"), True),
    (Py4JError("An error occurred while calling o12.collectToPython"), False),
])
def test_a_flush_job_that_cannot_run_blocks_and_one_that_failed_is_retried(error, permanent):
    with pytest.raises(FlushFailed) as info:
        SparkJobs(_FailingSession(error))(7, [object()], lambda tasks: iter(()))
    assert info.value.batch == 7
    assert is_transient(info.value) is not permanent
    if permanent:
        assert "wal.flush.mode=driver" in str(info.value)


def test_a_task_gets_only_the_store_access_its_wal_needs():
    access = StoreAccess(webhdfs=(("nn:8020", "http://nn:9870"),), s3_endpoint="http://s3",
                         s3_access_key="AK", s3_secret_key="SK")
    assert access.for_uri("hdfs://nn:8020/wal") == StoreAccess(webhdfs=access.webhdfs)
    on_s3 = access.for_uri("s3a://bucket/wal")
    assert (on_s3.webhdfs, on_s3.s3_access_key, on_s3.s3_secret_key) == ((), "AK", "SK")
    assert access.for_uri("/local/wal") == StoreAccess()


# -- recovery at query start in a scale-out mode ----------------------------------------------------
def test_a_scale_out_start_discards_at_once_and_leaves_the_committed_backlog_to_the_tasks(
        tmp_path):
    # Only the discard must finish before Spark re-runs a batch it never committed; the backlog
    # (here two committed batches) is written by Spark tasks from the flusher's first drain,
    # in order, at the sealed timestamps, instead of from the driver inside onQueryStarted.
    from recovery.flusher import QueryFlusher

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.wal.write_target({"fingerprint": "f", "target": target_flushed_by("executors").to_dict()})
        first, second = f.sealed(0, rows=(3, 2)), f.sealed(1, rows=(4,))
        uncommitted = f.sealed(2, rows=(2,), committed=False)
        root, cp = f.root, f.checkpoint
    flusher = QueryFlusher(root, cp, spark_jobs=SparkJobs(FakeSpark()))
    job = LocalJob()
    flusher._executors_writer = ExecutorsWriter(job, root, target,
                                                open_upserter=recording_upserter)
    flusher.output.check_not_dropped = lambda *args, **kwargs: None   # no node here
    try:
        flusher.recover()
        assert WRITES == [] and job.jobs == []                    # nothing written at start
        assert flusher.last_report.discarded == [2] and flusher.last_report.backlog_from == 0
        assert flusher.wal_log.get(2).state is BatchState.DISCARDED
        assert not os.path.exists(flusher.wal.batch_segments(2))
        assert flusher.wal_log.get(0) is None                        # untouched, not even ingested
        assert flusher.wal.read_flushed_through() == -1
        assert flusher._wake.is_set() and flusher.backlog_from == 0   # the thread: at once
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.backlog_from is None
        assert job.jobs == [[0, 1], [0]]                         # batch 0, then batch 1
        assert ids_written() == list(range(5)) + list(range(1000, 1004))
        stamps = {ids[0]: ts for _, ts, ids in WRITES}
        assert stamps[0] == first.seal.base_ts_us and stamps[1000] == second.seal.base_ts_us
        assert flusher.wal.read_flushed_through() == 1
        assert uncommitted.seal.batch not in flusher.last_report.replayed
    finally:
        flusher.stop(final_drain=False)


def test_a_driver_mode_start_still_writes_the_backlog_before_the_first_batch(tmp_path):
    from recovery.flusher import QueryFlusher

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.wal.write_target({"fingerprint": "f", "target": target_flushed_by("driver").to_dict()})
        f.sealed(0, rows=(3, 2))
        f.sealed(1, rows=(2,), committed=False)
        root, cp = f.root, f.checkpoint
    flusher = QueryFlusher(root, cp, spark_jobs=SparkJobs(FakeSpark()))
    flusher.output.check_not_dropped = lambda *args, **kwargs: None
    upserters = []
    flusher.replayer.writer._factory = lambda seal: upserters.append(seal.batch) or \
        recording_upserter(target()).__enter__()
    try:
        flusher.recover()
        assert ids_written(0) == list(range(5)) and upserters == [0]
        assert flusher.last_report.discarded == [1] and flusher.last_report.backlog_from is None
        assert not flusher._wake.is_set() and flusher.backlog_from is None
    finally:
        flusher.stop(final_drain=False)


# -- wal.flush.mode=auto (the default) -------------------------------------------------------------
@pytest.mark.parametrize("master, on_a_store, scale_out", [
    ("local[2]", False, False), ("local", False, False), ("local[*]", False, False),
    ("local-cluster[2,1,1024]", False, True), ("yarn", False, True),
    ("spark://10.0.0.1:7077", False, True), ("k8s://https://api:6443", False, True),
    ("local[2]", True, True),
])
def test_auto_writes_from_the_executors_on_a_cluster_or_a_store_else_from_the_driver(
        tmp_path, master, on_a_store, scale_out):
    from types import SimpleNamespace

    flusher, runs = flusher_for(tmp_path, "auto", FakeSpark(master=master))
    try:
        if on_a_store:      # the flusher's view of a WAL on HDFS (its working copy here)
            flusher.wal.__dict__["remote"] = SimpleNamespace(uri="hdfs://nn:8020/wal")
        flusher.recover()
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.flush_mode() == ("executors" if scale_out else "driver")
        assert isinstance(runs[1], ExecutorsWriter) is scale_out
        assert flusher.replays[0] is not scale_out      # a scale-out start only discards
        flusher.spark_jobs = SparkJobs(FakeSpark(stopped=True, master=master))
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs[2] is None and flusher.flush_mode() == "driver"   # Spark stopped
    finally:
        flusher.wal.__dict__["remote"] = None      # the cached property, as found
        flusher.wal_log.close()


def test_auto_without_spark_writes_from_the_driver(tmp_path):
    flusher, runs = flusher_for(tmp_path, "auto", None)
    try:
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs == [None] and flusher.flush_mode() == "driver"
    finally:
        flusher.wal_log.close()


def test_sinks_recover_through_connect_without_tls_writes_from_this_process(tmp_path,
                                                                           monkeypatch):
    # As the flusher: the job's closure would carry the credentials to the server in the plan.
    import sinks.driver.recover_job as recover_job
    from tests.helpers.flush_fakes import recover_job_asked

    root, asked = recover_job_asked(tmp_path, monkeypatch, "writer")
    for secure, writes_from in ((False, type(None)), (True, ExecutorsWriter)):
        monkeypatch.setattr(SparkJobs, "carries_secrets", lambda self, s=secure: s)
        recover_job.recover(FakeSpark(), root)
        assert isinstance(asked[-1], writes_from)
