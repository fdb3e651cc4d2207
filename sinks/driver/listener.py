"""The StreamingQueryListener that drives :class:`sinks.driver.registry.FlushRegistry`.

Runs: in the driver process, on Spark's listener bus thread (``onQueryStarted`` on the
query's own thread, synchronously, before its first batch). With Spark Connect, in the client
process: ``onQueryStarted`` on the thread that called ``start()``, as it returns (the query
already runs on the server), the others on the client's listener thread (measured:
:mod:`sinks.driver.connect`). An exception here must never reach
Spark's listener bus (it would be dropped there), so failures are handled below it: a flusher
that cannot start or flush for a reason no retry cures blocks the WAL (``blocked.json``), and
the query's next commit fails with the reason. What still reaches this module is logged with
its traceback.
"""

from __future__ import annotations

import logging

from pyspark import SparkContext
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener

log = logging.getLogger(__name__)


class _ProgressByIds(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener bus (py4j), but a progress event is read for
    its query and run ids alone. PySpark converts it whole for a Python listener (every metric,
    source and sink, a py4j call each): measured about 30 ms of the driver's CPU a micro-batch,
    against 0.5 ms for the two ids, whatever the flush mode (``docs/performance.md``, "Driver
    CPU of the flush")."""

    def onQueryProgress(self, jevent) -> None:
        progress = jevent.progress()
        self.pylistener.progressed(progress.id().toString(), progress.runId().toString())


class CassandraWalListener(StreamingQueryListener):
    """Hands each event of a query to the session's
    :class:`~sinks.driver.registry.FlushRegistry`."""

    def __init__(self, registry):     # the session's sinks.driver.registry.FlushRegistry
        self.registry = registry

    def _safely(self, what, query_id, run_id) -> None:
        try:
            what(str(query_id), str(run_id))
        except Exception:  # noqa: BLE001 - see module docstring
            log.exception("cassandra_wal: listener failed for query %s (run %s)", query_id, run_id)

    def onQueryStarted(self, event) -> None:
        """Start the run's flusher and recover its WAL before the first batch.

        Runs: in the driver process, on the query's thread, synchronously, before its first
        batch."""
        self._safely(self.registry.started, event.id, event.runId)

    @property
    def _jlistener(self):
        """The JVM's side of this listener (classic Spark; Spark Connect delivers events to
        the client apart from it), through :class:`_ProgressByIds`."""
        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(
                _ProgressByIds(self))
        return self._jlistenerobj

    def onQueryProgress(self, event) -> None:
        """A batch is committed (``commits/N`` written): wake the flusher (Spark Connect: the
        event as the client received it; classic Spark: :meth:`progressed`).

        Runs: in the driver process, on the listener bus thread."""
        self.progressed(event.progress.id, event.progress.runId)

    def progressed(self, query_id, run_id) -> None:
        """A batch is committed, as its query's and run's ids say: wake the flusher.

        Runs: in the driver process, on the listener bus thread."""
        self._safely(self.registry.progressed, query_id, run_id)

    def onQueryIdle(self, event) -> None:
        """No new data: wake the flusher all the same (a retry may be due).

        Runs: in the driver process, on the listener bus thread."""
        self._safely(self.registry.progressed, event.id, event.runId)

    def onQueryTerminated(self, event) -> None:
        """The run ended: its flusher's last drain starts on a thread of its own.

        Runs: in the driver process, on the listener bus thread."""
        self._safely(self.registry.terminated, event.id, event.runId)
