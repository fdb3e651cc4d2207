"""Floor 2 of 4, at the bottom of :mod:`recovery`: rows -> requests -> Cassandra. Knows the
cassandra-driver; knows neither Spark nor the WAL, nor the rest of :mod:`recovery` (floors:
``docs/architecture.md``).

Its part of a batch's life:

* **Before anything is staged** (``prepare_write``, :mod:`sinks.worker.plan`): :mod:`recovery.cql.connection`
  opens a session from a :class:`~recovery.cql.config.ConnectionConfig`, :mod:`recovery.cql.table` reads the
  table's schema, and :mod:`recovery.cql.convert` says, per column, how a Spark value becomes a CQL one
  (and refuses those that cannot: a bad uuid, an out-of-range tinyint).
* **Whenever a batch is written** (the live flusher, a batch job, ``recover``, a flush task):
  an :class:`~recovery.cql.upsert.Upserter` turns sealed Arrow chunks into requests: cells serialized
  whole by :mod:`recovery.cql.encode`, every row at its sealed write timestamp, partitions grouped by
  replica set and packed into unlogged batches under the node's limits
  (:mod:`recovery.cql.batch_limits`), sent concurrently, transient failures retried with tenacity,
  acknowledged in order. It is the only code that writes rows to Cassandra, and the same
  chunk always gives the same bytes: what makes a replay idempotent.
* **Credentials** never reach a file: :mod:`recovery.cql.credentials` decides their precedence
  (environment < session conf < the write's options) and carries options-level ones from
  the worker that plans a batch to the driver's flusher, in memory.

:mod:`recovery.cql.errors` holds the typed errors the sink raises on purpose (options, schema, values,
connection), each naming what is at fault.
"""
