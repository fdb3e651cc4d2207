"""Floor 3 of 4: the flusher, live and offline. Every flush is a replay of the WAL: the same
:class:`~recovery.replay.Replayer` writes a batch right after Spark commits it, after a crash,
and by hand. Imports :mod:`wal` and its own bottom floor, :mod:`recovery.cql` (rows to
Cassandra); no Spark (floors: ``docs/architecture.md``). Its top floor, :mod:`recovery.cli`,
is the offline tool ``cassandra-wal``. This file imports nothing, so that each floor loads
alone.

Its part of a batch's life, once the batch is sealed:

1. **Decide** (:mod:`recovery.replay`): the WAL's catalog joins seals, log and Spark's
   ``commits/``: per batch in order, replay (committed, not yet written), wait (not committed
   yet, the query runs), discard (never committed, the query restarts) or nothing.
2. **Write**: the batch's rows go through a row writer (:class:`~recovery.replay.RowWriter`):
   the driver's own :class:`~recovery.cql.upsert.Upserter`, or one task per segment on Spark executors
   or on worker processes (:mod:`recovery.executors`, :mod:`recovery.processes`), each with a
   session of its own (:mod:`recovery.output`), all at the sealed timestamps. Only the
   Replayer records progress and marks a batch FLUSHED, in order.
3. **Who drives it**: a stream's :class:`~recovery.flusher.QueryFlusher` (one per run of a
   query, in the driver: recovery at start, a drain after each commit, a last drain at stop);
   a batch job's commit (:mod:`recovery.batch_jobs`); ``cassandra-wal recover``
   (:mod:`recovery.recover`).
4. **When it fails**: :func:`recovery.errors.is_transient` decides, in one place, whether a
   failure keeps the batch for the next drain (Cassandra away) or blocks the sink with the
   reason (corruption, a refused write).

What a WAL writes to is recorded, without secrets, in ``target.json``
(:mod:`recovery.target`), with the configs of :mod:`recovery.config`, so any of these can
run from the WAL alone, given credentials.
"""
