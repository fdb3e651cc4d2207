"""The flush job's task, as Spark's Python workers on the executors run it: what
:class:`sinks.driver.spark_jobs.SparkJobs` hands to ``mapInArrow``, here so that an executor
unpickling it loads nothing of the driver's side.

Runs: in a Python worker on an executor, once per task of a flush job; each task's work is
:func:`recovery.executors.write_segments`, inside the job's closure ``fn``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

#: The schema of what the tasks hand back: one row per result, pickled.
RESULTS = "result binary"


def run_partition(fn: Callable[[Iterable], Iterator], batches) -> Iterator:
    """The ``mapInArrow`` function of a job whose tasks are a joined table, on an executor:
    ``fn`` over this partition's tasks (their pickled bytes in column ``task``), each result
    pickled into one row."""
    tasks = [pickle.loads(raw) for rb in batches for raw in rb.column("task").to_pylist()]
    yield from _results(fn(tasks))


def run_listed_partition(fn: Callable[[Iterable], Iterator], listed: list[bytes],
                         batches) -> Iterator:
    """The ``mapInArrow`` function of a job that carries its tasks (``listed``, pickled), on an
    executor: ``fn`` over the tasks of this partition's ids, each result pickled into one row."""
    tasks = [pickle.loads(listed[i]) for rb in batches for i in rb.column("id").to_pylist()]
    yield from _results(fn(tasks))


def _results(results: Iterable) -> Iterator:
    for result in results:
        yield pa.RecordBatch.from_pydict({"result": [pickle.dumps(result)]},
                                         schema=pa.schema([("result", pa.binary())]))
