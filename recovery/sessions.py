"""The Cassandra sessions a process that writes rows keeps from one task or batch to the next.

A flush task (``wal.flush.mode=executors``) runs in one of Spark's Python workers, which Spark
reuses for the next tasks (``spark.python.worker.reuse``, on by default), and a flush worker
process (``wal.flush.mode=processes``) serves every batch of its flusher. Connecting costs a
control connection, the schema and the token map from every node, and the Upserter's prepared
statements: this is paid once per process and target, not once per task and batch. A process
keeps the sessions of its :data:`KEPT` most recently used targets (a restart with other
options, contact points or credentials is another target) and shuts the older ones down. A
session that cannot connect is not kept: the next task tries again.

Runs: in the process that writes the rows (a Spark Python worker on an executor, a flush
worker process), one task at a time.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import threading
from collections.abc import Iterator

from recovery.cql.upsert import Upserter

from .output import CassandraOutput
from .target import Target

#: How many targets' sessions a process keeps.
KEPT = 2

_kept: collections.OrderedDict[bytes, CassandraOutput] = collections.OrderedDict()
_lock = threading.Lock()


@contextlib.contextmanager
def kept_upserter(target: Target) -> Iterator[Upserter]:
    """The Upserter of ``target`` on this process's kept session, connected at first use."""
    key = pickle.dumps(target)
    with _lock:
        output = _kept.get(key)
        if output is None:
            output = CassandraOutput(target)
            try:
                output.upserter()                   # connects: a failure keeps nothing
            except BaseException:
                output.close()
                raise
            _kept[key] = output
            while len(_kept) > KEPT:
                _, oldest = _kept.popitem(last=False)
                oldest.close()
        else:
            _kept.move_to_end(key)
    yield output.upserter()


def close_kept() -> None:
    """Shut every kept session down (a process about to exit, or a test)."""
    with _lock:
        outputs = list(_kept.values())
        _kept.clear()
    for output in outputs:
        output.close()
