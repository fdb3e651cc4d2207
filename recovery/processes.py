"""``wal.flush.mode=processes``: a batch's sealed segments written by worker processes of the driver.

Why: in ``driver`` mode one Python process writes every row, and it is the Spark driver's own
process, whose GIL the flusher shares with py4j, the listener and the query's Python; the
cassandra-driver spends 40-50 µs of client CPU a row, so that process is the
limit (``docs/performance.md``). ``executors`` mode spreads the rows over Spark tasks, but
pays a Spark job per batch and needs the WAL folder on every node. This mode keeps the
writing on the driver's machine, where the WAL is, and spreads it over ``wal.flush.processes``
Python processes of its own, each with its own GIL and its own Cassandra session, kept
from batch to batch.

It is the same :class:`~recovery.executors.ExecutorsWriter` as ``executors`` mode (one
:class:`~recovery.executors.SegmentTask` per segment, every segment verified against its
seal before a row of it is written, rows at the sealed timestamps, acknowledgements in seal
order, and the :class:`~recovery.replay.Replayer` alone marks the batch), with a
:class:`ProcessPool` as its job runner instead of Spark. So it is safe for the same reason:
any process may write any segment, in any order, more than once, and the cells end the same.

The workers are plain ``python -m recovery.processes`` children, not ``multiprocessing``
ones: spawn and forkserver re-import the parent's ``__main__``, which in a Spark driver is
the user's job script, and fork copies a process full of py4j and cassandra-driver threads. A worker
reads ``(fn, tasks)`` from a pipe, runs ``fn(tasks)`` and sends back its list of results
(or the error ``fn`` raised, which the driver re-raises); the closure (with credentials) travels through that pipe only, never through a file. A
worker dies with its driver: it watches its parent and exits when the parent is gone. A
worker that dies mid-batch (killed, out of memory) fails the batch's flush as transient:
the pool is closed and the flusher retries from the batch's recorded progress with a new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Callable

from wal import clock

from .errors import FlushJobIncomplete, portable_error

log = logging.getLogger(__name__)

#: How often a worker checks that its parent (the driver) is still alive.
PARENT_WATCH_S = 0.5


class FlushWorker:
    """One worker process and the two pipes to it."""

    def __init__(self, env: dict[str, str]):
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "recovery.processes", str(to_child_r), str(from_child_w),
             str(os.getpid())],
            pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._send = Connection(self._to_child_w, readable=False)
        self._recv = Connection(self._from_child_r, writable=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def submit(self, payload: bytes) -> None:
        self._send.send_bytes(payload)

    def reply(self) -> tuple[bool, object]:
        """``(True, results)``, or ``(False, the error fn raised)`` (see :func:`serve`)."""
        return pickle.loads(self._recv.recv_bytes())

    def exit_status(self) -> str:
        code = self.process.poll()
        return "still running" if code is None else (
            f"killed by signal {-code}" if code < 0 else f"exit code {code}")

    def close(self) -> None:
        for conn in (self._send, self._recv):
            with contextlib.suppress(OSError):
                conn.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class ProcessPool:
    """A :data:`~recovery.executors.JobRunner` over ``processes`` worker processes.

    The workers start on the first batch and stay until :meth:`close` (the flusher stops, or a
    batch failed: the next one starts them anew). A batch's segments are dealt round-robin,
    one call per worker, as Spark deals partitions to executors."""

    label = "flush worker processes"

    def __init__(self, processes: int):
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        self.processes = processes
        self._workers: list[FlushWorker] = []

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    def _start(self) -> list[FlushWorker]:
        if not self._workers:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            self._workers = [FlushWorker(env) for _ in range(self.processes)]
            log.info("cassandra_wal: started %d flush worker processes (pids %s)",
                     self.processes, self.pids)
        return self._workers

    def __call__(self, batch: int, tasks: list, fn: Callable) -> list:
        workers = self._start()
        shares = [tasks[i::len(workers)] for i in range(len(workers))]
        busy = [(w, share) for w, share in zip(workers, shares) if share]
        results: list = []
        failed: list[str] = []
        raised: list[BaseException] = []
        try:
            for worker, share in busy:
                worker.submit(pickle.dumps((fn, share)))
            for worker, share in busy:
                try:
                    ok, value = worker.reply()
                except (EOFError, OSError):
                    worker.process.wait()
                    failed.append(f"pid {worker.pid} ({worker.exit_status()}, "
                                  f"{len(share)} segment(s))")
                    continue
                if ok:
                    results.extend(value)
                else:
                    raised.append(value)
        except (BrokenPipeError, OSError) as exc:
            failed.append(f"could not hand it the segments: {exc}")
        if failed:     # what the live workers wrote stays acknowledged
            self.close()
            raise FlushJobIncomplete(batch, "a flush worker process died: " + "; ".join(failed)
                                     + "; new workers take over from the recorded progress",
                                     results)
        if raised:   # the worker lives on; the flusher decides: retry, or block
            raise raised[0]
        return results

    def close(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


# -- worker side ---------------------------------------------------------------------------------
def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        clock.sleep(PARENT_WATCH_S)
    os._exit(1)    # the driver is gone: write nothing more


def serve(inbox: Connection, outbox: Connection) -> int:
    """Run ``fn(tasks)`` for every request until the driver closes the pipe; reply
    ``(True, results)``, or ``(False, error)`` when ``fn`` raised. The error is returned, not
    left to kill the worker (which the driver would take for a transient death, retried
    forever), and made portable (:func:`~recovery.errors.portable_error`) so the driver sees
    whether it is transient as this process did."""
    while True:
        try:
            fn, tasks = pickle.loads(inbox.recv_bytes())
        except EOFError:
            return 0
        try:
            reply = pickle.dumps((True, list(fn(tasks))))
        except Exception as exc:  # noqa: BLE001 - returned to the driver, which decides
            reply = pickle.dumps((False, portable_error(exc)))
        outbox.send_bytes(reply)


def main(argv: list[str]) -> int:
    inbox_fd, outbox_fd, parent = (int(a) for a in argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    return serve(Connection(inbox_fd, writable=False), Connection(outbox_fd, readable=False))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
