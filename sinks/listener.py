"""The StreamingQueryListener that drives :class:`sinks.driver.FlushRegistry`.

Listener callbacks run in the driver's Python process. An exception here must never reach
Spark's listener bus (it would be dropped there), so failures are handled below it: a flusher
that cannot start or flush for a reason no retry cures blocks the WAL (``blocked.json``), and
the query's next commit fails with the reason. What still reaches this module is logged with
its traceback.
"""

from __future__ import annotations

import logging

from pyspark.sql.streaming import StreamingQueryListener

from .driver import FlushRegistry

log = logging.getLogger(__name__)


class CassandraWalListener(StreamingQueryListener):
    def __init__(self, registry: FlushRegistry):
        self.registry = registry

    def _safely(self, what, query_id, run_id) -> None:
        try:
            what(str(query_id), str(run_id))
        except Exception:  # noqa: BLE001 - see module docstring
            log.exception("cassandra_wal: listener failed for query %s (run %s)", query_id, run_id)

    def onQueryStarted(self, event) -> None:
        self._safely(self.registry.started, event.id, event.runId)

    def onQueryProgress(self, event) -> None:
        self._safely(self.registry.progressed, event.progress.id, event.progress.runId)

    def onQueryIdle(self, event) -> None:
        self._safely(self.registry.progressed, event.id, event.runId)

    def onQueryTerminated(self, event) -> None:
        self._safely(self.registry.terminated, event.id, event.runId)
