"""The listener's side in the driver: one :class:`FlushRegistry` per Spark session, which starts,
wakes and stops a :class:`~recovery.flusher.QueryFlusher` per run of each query that writes
through this sink (its checkpoint holds the pointer file ``cassandra_wal_sink.json``).

Runs: in the driver process (Spark Connect: the client's, :class:`ConnectFlushRegistry`);
``started`` on the query's thread (Spark calls
``onQueryStarted`` synchronously, before the first batch), the others on Spark's listener bus
thread; a run's last drain on a thread of its own, which interpreter exit waits for.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading

# Imported here, before any registry registers its exit hook: cassandra-driver registers
# its own exit hook (which stops its event loop) when this module is first imported, and ours
# must run before it (see _register_exit_hook).
import cassandra.cluster  # noqa: F401

from recovery import events
from recovery.cql import credentials
from recovery.errors import is_transient
from recovery.flusher import QueryFlusher, block_if_lost
from recovery.target import TargetNotRecorded
from sinks.worker.connect_source import ConnectCassandraWalDataSource
from sinks.worker.foreach_batch import forget_run, note_run
from sinks.worker.source import CassandraWalDataSource
from wal.catalog import committed_through
from wal.checkpoint import Filesystems
from wal.errors import WalBoundElsewhere
from wal.layout import WalDir
from wal.pointer import pointed_wals
from wal.schemes import is_local
from wal.stores import use_access

from . import metrics_endpoint
from .connect import (
    filesystems_of,
    is_connect_session,
    tracked_checkpoint,
)
from .listener import CassandraWalListener
from .metrics_endpoint import ServedQuery
from .spark_jobs import SparkJobs

log = logging.getLogger(__name__)

#: How long a stopped query's flusher (and, at interpreter exit, every flusher) keeps retrying
#: a final drain that fails transiently (Cassandra unreachable) before it leaves the rest in
#: the WAL for the next start of the query or ``cassandra-wal recover``.
FINISH_ON_STOP_S = 30.0

#: How often a new query's run looks for its pointer file, which its first batch writes while
#: Spark plans it (``prepare_write``): found, the run's flusher is made and connects its
#: session while the first batch's tasks stage, not after Spark commits it. A checkpoint on a
#: store is looked at less often (each look is a request).
POINTER_POLL_S = {True: 0.1, False: 1.0}     # by "the checkpoint is local"


class FlushRegistry:
    """The flushers of one Spark session's queries, driven by the listener's events.

    One flusher per *run* (``runId``): a query restarted on the same checkpoint in the same
    session is a new run, and Spark may deliver the new run's ``onQueryStarted``
    (synchronous, on the query's thread) before the old run's ``onQueryTerminated``
    (asynchronous, on the listener bus). The new run therefore stops the old run's flusher
    itself (which hands over the WAL's writer lock), and a late termination of the old run
    leaves the new one alone.

    A run that ends finishes its flusher's last drain on a thread of its own (retrying for up
    to :data:`FINISH_ON_STOP_S` if Cassandra is away), which interpreter exit waits for; so
    does :func:`finish_at_exit` for flushers whose run's end Spark has not reported yet. A
    script that stops its query and exits leaves nothing committed unwritten."""

    def __init__(self, spark, session_conf: dict):
        self.spark, self.session_conf = spark, session_conf
        # run id -> WAL location -> its flusher (a foreachBatch function writing several
        # tables has a WAL, and a flusher, for each)
        self.flushers: dict[str, dict[str, QueryFlusher]] = {}
        self.runs: dict[str, tuple[str, str]] = {}        # run id -> (query id, checkpoint)
        # run id -> (query id, its flushers finishing their last drain)
        self.stopping: dict[str, tuple[str, list[QueryFlusher]]] = {}
        self.checkpoints: dict[str, str] = {}             # query id -> checkpoint, kept
        self.names: dict[str, str] = {}                   # query id -> its name ("" if none)
        self.newest: dict[str, list[QueryFlusher]] = {}   # query id -> its newest run's flushers
        # run id -> the first batch the run runs (the highest Spark had committed, + 1)
        self.first_batch: dict[str, int] = {}
        self._lock = threading.Lock()
        self._making = threading.Lock()      # one flusher made and started per run
        self._looking: dict[str, threading.Event] = {}    # run id -> set: stop looking
        self._told_no_target: set = set()    # (WAL, run) said to have no target yet, once
        registries.append(self)
        _register_exit_hook()

    def _checkpoint_of(self, query_id: str) -> str | None:
        query = self.spark.streams.get(query_id)
        if query is None:
            return None
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())

    def _new_flushers(self, run_id: str) -> list[QueryFlusher]:
        """Flushers made now for the run's WALs that have none yet (callers hold
        ``_making``): the pointers are read again, since a foreachBatch function may write a
        table for the first time in any batch, and the run's first batch may have moved its
        WAL (``wal.path`` changed: :mod:`wal.move`), whose old one's flusher then stops."""
        with self._lock:
            if run_id not in self.runs:
                return []     # a run that ended (a late event), or not one we saw start
            checkpoint = self.runs[run_id][1]
            run = (run_id, self.first_batch.get(run_id, 0))
            have = dict(self.flushers.get(run_id, {}))
        pointed = pointed_wals(checkpoint)
        for wal_root in set(have) - set(pointed):    # moved away from, with nothing to write
            with self._lock:
                flusher = self.flushers.get(run_id, {}).pop(wal_root, None)
                query_id = self.runs.get(run_id, ("", ""))[0]
                if flusher is not None and flusher in self.newest.get(query_id, []):
                    self.newest[query_id].remove(flusher)
            if flusher is not None:
                log.info("cassandra_wal: %s: the query's WAL moved away from it: its flusher "
                         "stops", wal_root)
                flusher.stop(final_drain=False)
        made = []
        for wal_root in pointed:
            if wal_root in have:
                continue
            flusher = self._make_flusher(wal_root, checkpoint, run)
            if flusher is None:
                continue
            with self._lock:
                ended = run_id not in self.runs     # its termination came while it was made
                if not ended:
                    self.flushers.setdefault(run_id, {})[wal_root] = flusher
                    query_id = self.runs[run_id][0]
                    newest = self.newest.get(query_id, [])
                    if any(f not in self.flushers[run_id].values() for f in newest):
                        newest = []                 # an older run's: this run's from now on
                    self.newest[query_id] = newest + [flusher]
            if ended:
                flusher.stop()
                continue
            self._serve_metrics(flusher)
            made.append(flusher)
        return made

    def _make_flusher(self, wal_root: str, checkpoint: str,
                      run: tuple[str, int] | None) -> QueryFlusher | None:
        try:
            return QueryFlusher(wal_root, checkpoint, self.session_conf,
                                spark_jobs=self._spark_jobs(), run=run,
                                on_options=self._serve_metrics)
        except TargetNotRecorded:
            # Pointed at before its first batch looked the table up (which failed, or is
            # under way): nothing of it can be written yet; tried again at the next event.
            try:
                if not block_if_lost(wal_root, checkpoint, run) and self._first_told(wal_root, run):
                    log.info("cassandra_wal: %s: no batch recorded its target yet; its "
                             "flusher starts once one has", wal_root)
            except Exception as exc:  # noqa: BLE001 - a store away: looked at again next time
                log.warning("cassandra_wal: %s: cannot read it yet: %s: %s", wal_root,
                            type(exc).__name__, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - each failure is sorted, none is silent
            # The listener cannot fail the query, but the query's next commit can: a flusher
            # that cannot start for a reason no retry cures (the WAL is another query's, its
            # target.json is unreadable) blocks the WAL; the first flusher that starts (on the
            # next event, or the next run) clears it with its first good drain.
            if is_transient(exc):   # e.g. the WAL's lock still held by `cassandra-wal recover`
                log.warning("cassandra_wal: %s: the flusher cannot start yet, tried again at "
                            "the next batch: %s: %s", wal_root, type(exc).__name__, exc)
                return None
            reason = f"{type(exc).__name__}: {exc}"
            log.error("cassandra_wal: %s: the flusher cannot start: %s", wal_root, reason)
            if not isinstance(exc, WalBoundElsewhere):   # that WAL's own query is not at fault
                WalDir.at(wal_root).write_blocked(f"the flusher cannot start: {reason}")
            return None

    def _first_told(self, wal_root: str, run: tuple[str, int] | None) -> bool:
        """Whether ``wal_root`` is said to have no target yet for the first time in ``run``
        (noted: the pointer watch waits for it)."""
        with self._lock:
            told = (wal_root, run) in self._told_no_target
            self._told_no_target.add((wal_root, run))
        return not told

    def _running_flushers(self, run_id: str) -> list[QueryFlusher]:
        """The run's flushers, those of WALs that had none made and started first."""
        with self._making:
            for flusher in self._new_flushers(run_id):
                flusher.start()
            return self.flushers_of(run_id)

    def _await_pointer(self, run_id: str, checkpoint: str) -> None:
        """A new query: its first batch writes the pointer file while Spark plans it. Look for
        it until found (then make the run's flusher, connecting its session, while the batch
        stages), or until the run's first event after its start: a progress or idle event
        (from then on each event looks, as before) or its end. A query of another sink thus
        costs a look every :data:`POINTER_POLL_S` only until its first batch or idle event
        (every 10 s by default). Runs on a daemon thread."""
        interval = POINTER_POLL_S[is_local(checkpoint)]
        stop = self._looking.setdefault(run_id, threading.Event())

        def waiting_for_a_target(pointed: list[str]) -> bool:
            """A WAL pointed at has no flusher only because no batch recorded its target
            yet (any other reason is said, and tried again at the next event)."""
            with self._lock:
                have = set(self.flushers.get(run_id, {}))
                return any(wal not in have and run[0] == run_id
                           for wal, run in self._told_no_target if wal in pointed)

        def watch() -> None:
            # The pointer comes first, the target a moment later (the first batch records it
            # once it has looked the table up): look until every WAL pointed at has its
            # flusher, making each as soon as it can be made.
            try:
                while not stop.is_set():
                    pointed = pointed_wals(checkpoint)
                    if pointed:
                        flushers = self._running_flushers(run_id)
                        if not waiting_for_a_target(pointed):
                            for flusher in flushers:
                                flusher.kick()
                            return
                    if stop.wait(interval):
                        return
            except Exception:  # noqa: BLE001 - the next progress event makes it instead
                log.exception("cassandra_wal: looking for the WAL of run %s failed", run_id)
            finally:
                self._looking.pop(run_id, None)

        threading.Thread(target=watch, name=f"cassandra-wal-pointer-{run_id[:8]}",
                         daemon=True).start()

    def _stop_looking(self, run_id: str) -> None:
        stop = self._looking.get(run_id)
        if stop is not None:
            stop.set()

    def _serve_metrics(self, flusher: QueryFlusher) -> None:
        """Start the metrics endpoint if the run's options name a port (``wal.metrics.port``).
        Asked at the flusher's start, at each batch, and when the flusher takes up new options:
        a restarted query's flusher is made before the run's first batch records the run's
        options, and takes them up (a port newly given included) at its first drain, which
        may come with no batch after it (the run's first commit refused).

        Runs: in the driver process, on the listener's thread or the flusher's."""
        port = flusher.target.config.wal.metrics_port
        if port is not None:
            metrics_endpoint.serve(port, served_queries)

    def served(self) -> list[ServedQuery]:
        """Every query of this session that had a flusher, with its newest run's flushers (a
        WAL each): running, or ended (its WAL's figures read from disk, as long as the WAL is
        there)."""
        with self._lock:
            running = {id(f) for r, fs in self.flushers.items() if r in self.runs
                       for f in fs.values()}
            newest = [(q, f) for q, fs in self.newest.items() for f in fs]
        return [ServedQuery(q, self.names.get(q, ""), f, id(f) in running)
                for q, f in newest if id(f) in running or os.path.isdir(f.wal.root)]

    def _name_of(self, query_id: str) -> str:
        query = self.spark.streams.get(query_id)
        return (query.name or "") if query is not None else ""

    def flushers_of(self, run_id: str) -> list[QueryFlusher]:
        """The run's flushers (one a WAL), running or finishing their last drain."""
        with self._lock:
            if run_id in self.flushers:
                return list(self.flushers[run_id].values())
            return list(self.stopping.get(run_id, (None, []))[1])

    def started(self, query_id: str, run_id: str) -> None:
        with self._lock:
            previous = [r for r, (q, _) in self.runs.items() if q == query_id and r != run_id]
            finishing = [f for q, f in self.stopping.values() if q == query_id]
        for run in previous:      # still running: its flushers let go of the WALs right now
            with self._lock:
                flushers = self.flushers.pop(run, {})
                self.runs.pop(run, None)
            for flusher in flushers.values():
                flusher.stop()
        for flushers in finishing:   # ended: their last drains stop retrying, recovery goes on
            for flusher in flushers:
                flusher.hand_over()
        checkpoint = self._checkpoint_of(query_id)
        if checkpoint is None:
            return
        name = self._name_of(query_id)
        note_run(checkpoint, run_id)    # a foreachBatch writer on a thread of the function's
        first = committed_through(None, checkpoint)[0] + 1
        with self._lock:
            self.runs[run_id] = (query_id, checkpoint)
            self.first_batch[run_id] = first
            self.checkpoints[query_id] = checkpoint
            self.names[query_id] = name
        if not pointed_wals(checkpoint):    # a new query: its first batch names the WAL
            self._await_pointer(run_id, checkpoint)
            return
        with self._making:
            for flusher in self._new_flushers(run_id):
                self._begin(flusher)

    def _begin(self, flusher: QueryFlusher) -> None:
        """A run's flusher at its start, before the run's first batch (Spark calls
        ``onQueryStarted`` synchronously): recover, then run."""
        flusher.recover()
        flusher.start()

    def _spark_jobs(self) -> SparkJobs | None:
        """The runner of ``wal.flush.mode=executors`` jobs (a Connect client's too: DataFrame
        jobs, run by the server's executors)."""
        return SparkJobs(self.spark)

    def track(self, query, checkpoint_location: str) -> str:
        """Nothing to do in a classic session, which finds a query's checkpoint itself (see
        :meth:`ConnectFlushRegistry.track`); returns the checkpoint Spark uses.

        Runs: in the driver process, on the calling thread."""
        return self._checkpoint_of(str(query.id)) or checkpoint_location

    def progressed(self, query_id: str, run_id: str) -> None:
        self._stop_looking(run_id)
        for flusher in self._running_flushers(run_id):
            flusher.kick()
            self._serve_metrics(flusher)

    def terminated(self, query_id: str, run_id: str) -> None:
        self._stop_looking(run_id)
        with self._lock:
            self._told_no_target = {told for told in self._told_no_target
                                    if told[1][0] != run_id}
            flushers = list(self.flushers.pop(run_id, {}).values())
            ended = self.runs.pop(run_id, None)
            if ended is not None:
                forget_run(ended[1], run_id)
            if not flushers:
                return
            self.stopping[run_id] = (query_id, flushers)
        # Not on the listener bus, which would hold every later event meanwhile; not a
        # daemon, so that interpreter exit waits for the drains.
        threading.Thread(target=self._finish_run, args=(run_id, flushers, FINISH_ON_STOP_S),
                         name=f"cassandra-wal-final-flush-{run_id[:8]}").start()

    def _finish_run(self, run_id: str, flushers: list[QueryFlusher], within_s: float,
                    exiting: bool = False) -> None:
        """The run's last drains, one WAL after another, each retried for up to
        ``within_s`` (``exiting``: the interpreter's exit: :meth:`QueryFlusher.stop`)."""
        try:
            for flusher in flushers:
                try:
                    flusher.stop(within_s, exiting=exiting)
                except Exception:  # noqa: BLE001 - a thread's error would go to stderr only
                    log.exception("cassandra_wal: %s: the last drain of run %s failed",
                                  flusher.wal.root, run_id)
        finally:
            with self._lock:
                self.stopping.pop(run_id, None)

    def finish(self, within_s: float, exiting: bool = False) -> None:
        """Stop every running flusher (a last drain, retried for up to ``within_s``) and wait
        as long for those finishing theirs. ``exiting``: the interpreter exits, so a failure
        of these drains is no verdict on a batch (:meth:`QueryFlusher.stop`)."""
        with self._lock:
            running = [(r, list(fs.values())) for r, fs in self.flushers.items()]
            self.flushers.clear()
            self.runs.clear()
            finishing = [f for _, fs in self.stopping.values() for f in fs]
        for run_id, flushers in running:
            self._finish_run(run_id, flushers, within_s, exiting)
        for flusher in finishing:
            if exiting:
                flusher.mark_exiting()
        for flusher in finishing:
            if not flusher.stopped.wait(within_s):
                log.warning("cassandra_wal: %s: exiting before the last drain finished; what "
                            "is not written stays in the WAL", flusher.wal.root)


class ConnectFlushRegistry(FlushRegistry):
    """A Spark Connect client's registry (:mod:`sinks.driver.connect`): the listener runs in the
    client, which cannot ask Spark where a query's checkpoint is, so a query is flushed once
    :meth:`track` was told; a restart of a tracked query (same id, same checkpoint) in this
    session is followed from its ``onQueryStarted`` on. A run's first drain waits for what
    Spark has not committed instead of discarding it: the server's first batch may be
    staging already. Flushes run from this process (``wal.flush.mode=executors``: no
    SparkContext here, so as ``driver``)."""

    def __init__(self, spark, session_conf: dict, filesystems: Filesystems):
        super().__init__(spark, session_conf)
        self.filesystems = filesystems

    def _checkpoint_of(self, query_id: str) -> str | None:
        with self._lock:
            return self.checkpoints.get(query_id)

    def _begin(self, flusher: QueryFlusher) -> None:
        flusher.start()
        flusher.kick()

    def _name_of(self, query_id: str) -> str:
        with self._lock:
            return self.names.get(query_id, "")

    def track(self, query, checkpoint_location: str) -> str:
        """Flush ``query`` (a Connect ``StreamingQuery`` of this session, just started) from
        this process: ``checkpoint_location`` is the ``checkpointLocation`` it was started
        with, checked against the query id Spark wrote there. Returns the checkpoint as Spark
        uses it. Idempotent for a run; raises :class:`~recovery.cql.errors.SinkError` for a location
        that is not the query's checkpoint or that this process cannot see.

        Runs: in the client process, on the calling thread."""
        query_id, run_id = str(query.id), str(query.runId)
        checkpoint = tracked_checkpoint(query_id, checkpoint_location, self.filesystems)
        with self._lock:
            self.checkpoints[query_id] = checkpoint
            self.names[query_id] = query.name or ""
            known = run_id in self.runs
        if not known:
            self.started(query_id, run_id)
        return checkpoint


registries: list[FlushRegistry] = []       # every session's: for wait_flushed and exit


def register_session(spark) -> FlushRegistry:
    """What :func:`sinks.register` does: the data source, baked with the session's
    ``spark.cassandra.*`` conf, the credential channel and the filesystems checkpoints resolve
    against, registered with ``spark``; and the session's registry and listener, made once
    (a second call takes up the session's current conf). A Spark Connect session has no JVM
    here: its filesystems come from the session conf, it has no credential channel, and its
    registry is a :class:`ConnectFlushRegistry`."""
    all_conf = dict(spark.conf.getAll)
    conf = {k: v for k, v in all_conf.items() if k.startswith("spark.cassandra.")}
    connect = is_connect_session(spark)
    if connect:
        base, channel, filesystems = ConnectCassandraWalDataSource, None, filesystems_of(all_conf)
    else:
        base, channel = CassandraWalDataSource, credentials.ensure_server().path
        filesystems = Filesystems.of_session(spark)
    use_access(filesystems.access)       # this process's flushers reach stores as Spark does
    events.make_visible()                # a batch written, blocked...: in the driver's log
    source = type("CassandraWalDataSource", (base,),
                  {"session_conf": conf, "credential_channel": channel,
                   "filesystems": filesystems, "__module__": "sinks",
                   "__qualname__": "CassandraWalDataSource<registered>"})
    spark.dataSource.register(source)
    registry = next((r for r in registries if r.spark is spark), None)
    if registry is None:
        registry = (ConnectFlushRegistry(spark, conf, filesystems) if connect
                    else FlushRegistry(spark, conf))
        spark.streams.addListener(CassandraWalListener(registry))
    else:
        registry.session_conf = conf
        if connect:
            registry.filesystems = filesystems
    return registry


@functools.cache
def _register_exit_hook() -> None:
    # Once, with the first registry. atexit runs the last registered first, and this one must
    # run before two others, both registered when their modules are imported: pyspark's, which
    # kills the JVM, and cassandra-driver's (cassandra.cluster, imported at the top of this
    # module), which stops cassandra-driver's event loop: a last drain after it waits forever for
    # answers that no loop will deliver (the script that stops its query and exits hung so).
    atexit.register(finish_at_exit)


def finish_at_exit() -> None:
    """At interpreter exit (``atexit``): every flusher writes what Spark committed before the
    process goes (its thread is a daemon, which exit would otherwise kill mid-way), for up to
    :data:`FINISH_ON_STOP_S`."""
    busy = [r for r in registries if r.flushers or r.stopping]
    if busy:
        log.info("cassandra_wal: writing what the queries committed before exit (up to %.0f s)",
                 FINISH_ON_STOP_S)
    for registry in busy:
        registry.finish(FINISH_ON_STOP_S, exiting=True)


def served_queries() -> list[ServedQuery]:
    """What the metrics endpoint serves: every query of any session of this process that had
    a flusher (:meth:`FlushRegistry.served`)."""
    return [query for registry in registries for query in registry.served()]


def flushers_of_run(run_id: str) -> list[QueryFlusher]:
    """The flushers of the run ``run_id`` in any session of this process (empty: none)."""
    for registry in registries:
        flushers = registry.flushers_of(run_id)
        if flushers:
            return flushers
    return []


def session_conf_of(query_id: str) -> dict | None:
    """The session conf snapshot of the session that started query ``query_id``."""
    for registry in registries:
        if query_id in registry.checkpoints:
            return registry.session_conf
    return None


def checkpoint_reported(query_id: str) -> str | None:
    """The checkpoint the start of query ``query_id`` reported to a registry of this process."""
    for registry in registries:
        if query_id in registry.checkpoints:
            return registry.checkpoints[query_id]
    return None
