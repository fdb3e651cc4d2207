"""Named crash points: the crash tests kill a real process at an exact step of the protocol.

Set ``CASSANDRA_WAL_CRASH_AT=<point>`` (or ``<point>@<n>`` to crash on the n-th time the point
is reached in one process). When the point is reached the process is killed with SIGKILL: no
``finally``, no atexit, no flush of anything, like a power cut. With
``CASSANDRA_WAL_CRASH_SCOPE=group`` the whole process group dies (the Spark driver, its JVM and
every Python worker), which is what a crashed driver machine looks like in ``local`` mode.
Spark's Python workers (the tasks' ``write()`` and the commit worker, which Spark reuses
between batches) are forked by daemons that put themselves in process groups of their own, so
a group kill from a worker does not reach the driver: the crash harness watches the once-file
and kills the rest of the run itself (docs/testing.md).
``CASSANDRA_WAL_CRASH_ONCE=<file>``: crash only if the file does not exist, and create it
first, so the restarted run goes through.

Unset (production), a crash point costs one dictionary lookup. A test that runs the sink in a
world of its own (the protocol simulation) sets :data:`on_point` instead: every point reached
calls it, and no process is killed.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

ENV_POINT = "CASSANDRA_WAL_CRASH_AT"
ENV_SCOPE = "CASSANDRA_WAL_CRASH_SCOPE"
ENV_ONCE = "CASSANDRA_WAL_CRASH_ONCE"

POINTS = (
    "stage.mid",            # executor write(): some chunks of a segment written
    "stage.after",          # executor write(): segment complete, before the task returns
    "commit.before_seal",   # commit(N): before the seal is written
    "commit.after_seal",    # commit(N): seal durable, before commit returns to Spark
    "flush.before_ingest",  # driver: commits/N exists, nothing ingested or written yet
    "flush.mid",            # driver: some chunks of batch N written to Cassandra
    "flush.before_mark",    # driver: every row acknowledged, FLUSHED not yet recorded
    "recover.mid",          # recovery's own replay: some chunks written
)

#: Points of ``wal.flush.mode=executors`` (recovery/executors.py), reached in executor
#: tasks, which get the driver's crash variables in their closure; covered by
#: tests/cluster/test_executors_flush.py (the crash tests in tests/crash run local[2]).
EXECUTOR_POINTS = (
    "flush.task_written",   # an executor task: its segment's rows acknowledged, before it returns
)

_hits: dict[str, int] = {}

#: Called with each point's name instead of the kill above, when set (tests only).
on_point: Callable[[str], None] | None = None


def crash_point(name: str) -> None:
    if on_point is not None:
        on_point(name)
        return
    wanted = os.environ.get(ENV_POINT)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if nth and _hits[name] != int(nth):
        return
    once = os.environ.get(ENV_ONCE)
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return
        os.write(fd, f"{name} pid={os.getpid()}\n".encode())
        os.fsync(fd)
        os.close(fd)
    if os.environ.get(ENV_SCOPE) == "group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
