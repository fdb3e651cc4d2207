"""A flush without Spark or Cassandra: a recording Upserter, a job that runs its tasks in this
process the way Spark would, the target they write, and a flusher made for a flush mode.

Row ids are ``batch * 1000 + position in the batch`` (:class:`tests.helpers.walfactory.WalFactory`),
so every chunk in :data:`WRITES` says which rows and which timestamps it got. ``tests/unit/conftest.py``
empties :data:`WRITES` and :data:`FAIL_IDS` around every test.
"""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import replace

from pyspark import cloudpickle

from recovery.cql.table import TableSchema
from recovery.errors import FlushFailed
from recovery.target import RecordedTarget, Target
from sinks.driver.spark_jobs import SparkJobs
from sinks.worker.options import ConnectionConfig, SinkConfig
from tests.helpers.walfactory import WalFactory

PASSWORD = "s3cret-for-the-closure-only"

#: What the fake Upserter wrote, per test: (batch, first timestamp, row ids).
WRITES: list[tuple[int, int, list[int]]] = []
#: Row ids whose chunk fails, as a transient Cassandra failure would after its retries.
FAIL_IDS: set[int] = set()


class RecordingUpserter:
    def write_chunk(self, rb, first_ts: int, batch_id: int) -> int:
        ids = rb.column("id").to_pylist()
        if FAIL_IDS & set(ids):
            raise FlushFailed(batch_id, "injected: write timed out")
        WRITES.append((batch_id, first_ts, ids))
        return rb.num_rows

    def write_chunks(self, chunks, batch_id: int, age=None):
        for rb, first_ts, tag in chunks:
            self.write_chunk(rb, first_ts, batch_id)
            yield tag


@contextlib.contextmanager
def recording_upserter(target):
    assert target.config.connection.password == PASSWORD   # the flusher's own credentials
    yield RecordingUpserter()


def target() -> Target:
    config = SinkConfig("ks", "t", connection=ConnectionConfig(username="u", password=PASSWORD))
    table = TableSchema("ks", "t", (("id", "bigint"), ("name", "text"), ("value", "double")),
                        ("id",))
    return Target(config, table, ("id",))


def record_target_capped(wal, max_bytes: int, checkpoint: str | None = None) -> None:
    """Record :func:`target` with ``wal.maxBytes`` = ``max_bytes`` as ``wal``'s target.json."""
    t = target()
    t = replace(t, config=replace(t.config, checkpoint_location=checkpoint,
                                  wal=replace(t.config.wal, max_bytes=max_bytes)))
    RecordedTarget.of(t, "f").write(wal)


def target_flushed_by(mode: str) -> Target:
    """:func:`target` with ``wal.flush.mode`` = ``mode``."""
    t = target()
    return replace(t, config=replace(t.config, wal=replace(t.config.wal, flush_mode=mode)))


class LocalJob:
    """Plays Spark: one partition per task, everything pickled on the way like a real job."""

    def __init__(self, factory: WalFactory | None = None, drop_results: set[int] = frozenset(),
                 fail_job: bool = False):
        self.factory, self.drop, self.fail_job = factory, drop_results, fail_job
        self.jobs: list[list[int]] = []        # segment indexes per job
        self.states_during_job: list[str] = []
        self.closures: list[bytes] = []
        self.task_lists: list[bytes] = []

    def __call__(self, batch, tasks, fn):
        self.jobs.append([t.index for t in tasks])
        if self.factory is not None:
            self.states_during_job.append(self.factory.wal_log.get(batch).state.value)
        self.task_lists.append(cloudpickle.dumps(tasks))
        self.closures.append(cloudpickle.dumps(fn))
        if self.fail_job:
            raise FlushFailed(batch, "the Spark job of the flush failed: executor lost")
        fn = cloudpickle.loads(self.closures[-1])
        out = []
        for task in pickle.loads(self.task_lists[-1]):
            out += [pickle.loads(pickle.dumps(r)) for r in fn(iter([task]))
                    if r.index not in self.drop]
        return out


def flusher_for(tmp_path, mode: str, spark):
    from recovery.flusher import QueryFlusher
    from wal.layout import WalDir

    wal = WalDir(str(tmp_path / "wal")).create()
    wal.write_target({"fingerprint": "f", "target": target_flushed_by(mode).to_dict()})
    flusher = QueryFlusher(wal.root, str(tmp_path / "cp"),
                           spark_jobs=SparkJobs(spark) if spark is not None else None)
    runs = []

    def run(policy, prefix, writer=None, replay=True):
        runs.append(writer)
        flusher.replays.append(replay)      # False: only discards (a scale-out start)

    flusher.replays = []
    flusher.replayer.run = run
    return flusher, runs




def recover_job_asked(tmp_path, monkeypatch, keyword: str) -> tuple[str, list]:
    """``sinks.driver.recover_job`` over a WAL that records :func:`target`, with no session to
    register and its ``replay_wal`` recording, instead of writing, the ``keyword`` argument
    of each call: (the WAL's root, what each call was given)."""
    from types import SimpleNamespace

    import sinks.driver.recover_job as recover_job

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.wal.write_target({"fingerprint": "f", "target": target().to_dict()})
        root = f.root
    asked: list = []
    monkeypatch.setattr(recover_job, "register_session",
                        lambda spark: SimpleNamespace(session_conf={}))
    monkeypatch.setattr(recover_job, "load_target", lambda wal, conf: target())   # credentials
    monkeypatch.setattr(recover_job, "replay_wal",
                        lambda *args, **kwargs: asked.append(kwargs[keyword]))
    return root, asked
