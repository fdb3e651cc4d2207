"""The StreamingQueryListener that drives :class:`sinks.driver.FlushRegistry`.

Listener callbacks run in the driver's Python process. An exception here must never reach
Spark's listener bus, so every callback logs and swallows; the consequences are handled by the
flusher (a blocked WAL fails the next commit with its reason).
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
