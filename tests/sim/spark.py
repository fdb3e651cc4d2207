"""The simulated Spark: a real checkpoint per query (a folder, or on the simulated store),
task attempts, batch jobs.

Spark's behaviour as measured (``../shared/docs/spark-facts.md``): ``offsets/N`` is written
when batch N starts, and entries older than the newest ``minBatchesToRetain`` are purged then
(``purge(N - minBatchesToRetain)``, exclusive); ``commits/N`` is written after the sink's
``commit`` returned, strictly in order; a restart re-runs the batch whose offsets exist without
its commit (same id, possibly other rows), else starts the next one. Tasks may be retried
(an attempt fails mid-write, or dies after staging without reporting), run speculatively (two
attempts stage, the first to report wins) or be zombies that stage late, even after the batch
was committed, flushed and forgotten. The sink reads only the names of ``commits/``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import dataclass, field

import pyarrow as pa

from .oracle import WRITETIME_COLUMN, Execution, RunOptions


class TaskFailed(Exception):
    """A task attempt failed mid-write (its rows iterator raised, as a lost executor would)."""


class Checkpoint:
    """``<checkpointLocation>``: ``metadata``, ``offsets/N``, ``commits/N`` as Spark writes them."""

    def __init__(self, path: str):
        self.path = path

    def create(self, query_id: str) -> None:
        os.makedirs(os.path.join(self.path, "offsets"), exist_ok=True)
        os.makedirs(os.path.join(self.path, "commits"), exist_ok=True)
        with open(os.path.join(self.path, "metadata"), "w") as f:
            f.write(json.dumps({"id": query_id}) + "\n")

    def _ids(self, folder: str) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(os.path.join(self.path, folder)) if n.isdigit())
        except FileNotFoundError:
            return []

    def next_batch(self) -> tuple[int, bool]:
        """The batch a (re)started query runs first, and whether it is a re-run."""
        offsets, commits = self._ids("offsets"), self._ids("commits")
        if offsets and (not commits or offsets[-1] > commits[-1]):
            return offsets[-1], True
        return (commits[-1] + 1 if commits else 0), False

    def start_batch(self, batch: int, min_retain: int) -> None:
        self._touch("offsets", batch, '{"batchWatermarkMs":0}')
        if min_retain < batch:
            for folder in ("offsets", "commits"):
                for old in self._ids(folder):
                    if old < batch - min_retain:
                        os.unlink(os.path.join(self.path, folder, str(old)))

    def commit(self, batch: int) -> None:
        self._touch("commits", batch, '{"nextBatchWatermarkMs":0}')

    def _touch(self, folder: str, batch: int, body: str) -> None:
        path = os.path.join(self.path, folder, str(batch))
        with open(path + ".tmp", "w") as f:
            f.write("v1\n" + body + "\n")
        os.replace(path + ".tmp", path)

    def wipe(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def exists(self) -> bool:
        return os.path.exists(os.path.join(self.path, "metadata"))

    def available(self) -> bool:
        """Spark can read and write it now (a local folder always)."""
        return True


class StoreCheckpoint(Checkpoint):
    """A checkpoint on the simulated store (``path`` is its ``simstore://`` URI), written as
    Spark's HDFS and S3A metadata logs write it: each file created once (a re-run of batch N
    finds ``offsets/N`` there), purged by deletes. Spark reaches the store on its own client:
    only a store that is down fails it (:meth:`available`), and then the query fails."""

    def __init__(self, location: str, state):
        self.path, self.state = location, state

    @property
    def _store(self):
        return self.state.raw(self.path)

    def available(self) -> bool:
        from .store import DOWN

        return self.state.mode != DOWN or self.state.calm

    def exists(self) -> bool:
        return self._store.read("metadata") is not None

    def create(self, query_id: str) -> None:
        self._store.create("metadata", (json.dumps({"id": query_id}) + "\n").encode())

    def _ids(self, folder: str) -> list[int]:
        names = (k.rsplit("/", 1)[-1] for k in self._store.list(folder))
        return sorted(int(n) for n in names if n.isdigit())

    def start_batch(self, batch: int, min_retain: int) -> None:
        self._touch("offsets", batch, '{"batchWatermarkMs":0}')
        if min_retain < batch:
            for folder in ("offsets", "commits"):
                for old in self._ids(folder):
                    if old < batch - min_retain:
                        self._store.delete(f"{folder}/{old}")

    def _touch(self, folder: str, batch: int, body: str) -> None:
        self._store.create(f"{folder}/{batch}", f"v1\n{body}\n".encode())

    def wipe(self) -> None:
        shutil.rmtree(self.state.folder(self.path), ignore_errors=True)


@dataclass
class Attempt:
    """One task attempt: ``fate`` is ok, fail (raises mid-write) or lost (stages, then its
    executor dies before the attempt reports: Spark runs another)."""

    execution: Execution
    partition: int
    number: int
    fate: str
    plan: object = None            # the WritePlan (streams) or the job's writer (batch jobs)

    @property
    def label(self) -> str:
        return f"p{self.partition}/a{self.number}"


@dataclass
class InFlight:
    """The batch a stream's run or a batch job is executing: its attempts and their winners."""

    execution: Execution
    plan: object
    pending: list[Attempt] = field(default_factory=list)
    winners: dict[int, object] = field(default_factory=dict)    # partition -> commit message
    sealed: bool = False

    def ready(self) -> bool:
        return not self.pending and len(self.winners) == len(self.execution.rows)


def plan_attempts(rng, execution: Execution, plan, zombies: list) -> list[Attempt]:
    """Spark's attempts for each partition: retries, speculation, zombies (added to
    ``zombies``: they stage whenever the world lets them, possibly much later)."""
    out = []
    for p in sorted(execution.rows):
        n, r = 0, rng.random()
        if r < 0.12:
            out.append(Attempt(execution, p, n, "fail", plan))
            n += 1
        elif r < 0.22:
            out.append(Attempt(execution, p, n, "lost", plan))
            n += 1
        out.append(Attempt(execution, p, n, "ok", plan))
        n += 1
        r = rng.random()
        if r < 0.1:
            out.append(Attempt(execution, p, n, "ok", plan))          # speculative twin
        elif r < 0.25:
            zombies.append(Attempt(execution, p, n, "lost", plan))    # stages late
    return out


@functools.lru_cache(maxsize=None)
def arrow_schema(options: RunOptions) -> pa.Schema:
    """The Arrow schema Spark hands a Python writer for the run's DataFrame."""
    def arrow(spark_type: str):
        return {"int": pa.int32(), "array<string>": pa.list_(pa.string())}.get(spark_type,
                                                                             pa.string())

    return pa.schema([(f.name, pa.int64() if f.name == WRITETIME_COLUMN else
                       arrow(f.dataType.simpleString()))
                      for f in options.spark_schema().fields])


def record_batches(execution: Execution, partition: int, fail: bool):
    """The Arrow batches a task's iterator yields (``execution.chunk_rows`` rows each);
    ``fail``: raises after the first, as a task whose executor is lost mid-write."""
    schema = arrow_schema(execution.options)
    rows, size = execution.rows[partition], execution.chunk_rows
    for i in range(0, len(rows), size):
        if fail and i > 0:
            raise TaskFailed(f"executor lost while writing partition {partition}")
        chunk = rows[i:i + size]
        yield pa.record_batch([pa.array([row[f.name] for row in chunk], f.type) for f in schema],
                              schema=schema)
    if fail:
        raise TaskFailed(f"executor lost while writing partition {partition}")


class TaskContext:
    """``pyspark.TaskContext`` as ``sinks.worker.source`` uses it in a batch job's ``write()``."""

    def __init__(self, partition: int, attempt: int):
        self._partition, self._attempt = partition, attempt

    def partitionId(self) -> int:
        return self._partition

    def attemptNumber(self) -> int:
        return self._attempt

    def getLocalProperty(self, _key):
        return None
