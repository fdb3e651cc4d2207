"""A stream's life in the simulated Spark driver, as actions on the world.

A run is one driver process: at its start Spark's ``onQueryStarted`` makes the run's
``QueryFlusher`` (when the checkpoint names the sink's WAL) and recovers; each batch is
``prepare_write`` then a task per partition (``stage_partition``), ``commit_batch``, and
Spark's ``commits/N``, after which ``onQueryProgress`` kicks the flusher (a drain now or
later); the flusher's own thread drains every 2 s of simulated time. A crash abandons the
run (its RocksDB log closed, as a killed process releases its lock); a stop drains once more.
The user may delete a caught-up checkpoint and start over, with the WAL under it or with an
explicit ``wal.path`` that the new query then reuses.

In a world with a store (:mod:`tests.sim.store`) a run's driver is on a host (its working
copies), may come back on another or a new one, fails when the store fails Spark or the sink's
``prepare_write`` and commit, and may be cut off as it commits: its commit goes on as a zombie.

In a world with clocks (:mod:`tests.sim.clocks`) a run's driver is on a machine whose wall
clock is off the world's and may step; a restart may come back on a new machine; with
``wal.flush.mode=executors`` its flush tasks run on executors whose clocks are off by hours.
"""

from __future__ import annotations

import gc
import inspect
import os
from dataclasses import dataclass, field

from . import cassandra
from .invariants import Violation, check_live
from .oracle import RunOptions
from .patches import SimCrash
from .spark import Checkpoint, InFlight, plan_attempts


@dataclass
class Run:
    """One run of a stream: a driver process with its flushers (one per WAL: a data source's
    stream has one, a foreachBatch function one per table) and the batch in flight."""

    number: int
    flushers: dict[str, object] = field(default_factory=dict)    # WAL location -> flusher
    inflight: InFlight | None = None
    last_drain_us: int = 0
    awaiting_pointer: bool = False     # started without a WAL: the registry looks for it
    run_id: str = ""                   # Spark's runId (a foreachBatch writer's claims, entries)
    first_batch: int = 0               # the first batch it runs (the highest committed, + 1)
    call: object | None = None         # a foreachBatch function's call in flight (foreach.py)

    @property
    def flusher(self):
        """The run's flusher (a data source's stream has one WAL), or None."""
        return next(iter(self.flushers.values()), None)


@dataclass
class Query:
    name: str
    checkpoint: Checkpoint
    options: RunOptions
    query_id: str
    generation: int = 0               # checkpoint resets so far
    run: Run | None = None
    runs: int = 0
    refused: str | None = None        # the clear error that refused it (it stops for good)
    invalid: str | None = None        # why its configuration is an invalid WAL reuse
    host: str = "host-a"              # where its driver runs (a WAL on a store: the working copy)
    wal_uris: set[str] = field(default_factory=set)    # its WALs on the store
    lists_refused: bool = False       # its last batch was refused for its list column
    writers: list | None = None       # a foreachBatch function's writers (foreach.py); None: a
                                      # data source's stream
    fixed: bool = False               # the user fixed a function that wrote a table twice

    @property
    def owner(self) -> str:
        return self.name if self.generation == 0 else f"{self.name}~{self.generation}"

    def owner_of(self, table: str) -> str:
        """The owner of a foreachBatch writer's executions: one per (query, table)."""
        return f"{self.owner}/{table}"

    @property
    def owners(self) -> set[str]:
        """Whose executions this query's are now (a writer's of each table, or the stream's)."""
        if self.writers is None:
            return {self.owner}
        return {self.owner_of(w.table) for w in self.writers}

    def owns(self, owner: str) -> bool:
        return owner == self.owner or owner.startswith(self.owner + "/")


@dataclass
class ZombieCommit:
    """The commit of a run whose driver was cut off, not dead (a split brain): it goes on
    after a new run started, and publishes its seal whenever the world lets it."""

    owner: str
    run: int
    host: str
    plan: object
    messages: list
    execution: object


class Streams:
    """The stream actions of :class:`tests.sim.world.World`."""

    def start(self, q: Query) -> str:
        if q.lists_refused:               # the user fixes what the sink refused
            q.options, q.lists_refused = self.fixed_lists(q.options), False
        elif q.runs and self.rng.random() < 0.35:
            q.options = self.draw_options(q.options.wal_path)
            if q.writers is not None:
                self.redraw_writers(q)
        self.changes.at_restart(self, q)      # another table or wal.path (changes.py)
        if not q.checkpoint.available():
            return self.say(f"{q.owner}: start failed: its checkpoint's store is down")
        if self.store is not None and q.runs and q.wal_uris and self.srng.random() < 0.3:
            self.move_host(q)
        if not q.checkpoint.exists():
            q.checkpoint.create(q.query_id)
        q.runs += 1
        q.run = Run(q.runs, last_drain_us=self.clock_us,
                    first_batch=q.checkpoint.next_batch()[0] if q.checkpoint.exists() else 0)
        moved = self.clocks.restart(q.name)
        self.say(f"{q.owner}: start run {q.runs} ({self.describe_query(q)})"
                 + (f" on {q.host}" if self.store is not None else "") + moved)
        if q.writers is not None:
            return self.foreach_started(q)
        if self._pointer(q) is not None:   # onQueryStarted, as FlushRegistry
            self._open_flusher(q)
            if q.run is not None and q.run.flusher is not None:
                self._drain(q, recover=True)
        else:
            q.run.awaiting_pointer = True
        return "started"

    def pointer_found(self, q: Query) -> str:
        """A run that started without a WAL (a new query) looks for the pointer its first
        batch's ``prepare_write`` writes, at any moment (FlushRegistry's watcher): found, its
        flusher is made, started and kicked, whatever the batch in flight is doing."""
        if q.writers is not None:
            return self.foreach_pointer_found(q)
        if self._pointer(q) is None:
            return self.say(f"{q.owner}: registry: no pointer yet")
        q.run.awaiting_pointer = False
        self.say(f"{q.owner}: registry: found the pointer, making the flusher")
        self._open_flusher(q)
        if q.run is not None and q.run.flusher is not None:
            return self._drain(q)
        return "no flusher"

    def _pointer(self, q: Query) -> str | None:
        """The WAL the query's checkpoint points at, as the listener reads it (an error there
        is logged by Spark's listener bus: no flusher for now)."""
        from wal.pointer import read_pointer

        faults = self.store_faults()
        try:
            return read_pointer(q.checkpoint.path)
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise
            self.say(f"{q.owner}: listener error, pointer unreadable: {exc}")
            return None

    def driver_process(self, q: Query, flushing: bool = False, run: Run | None = None):
        """What follows runs in ``q``'s driver process (``World.running``)."""
        run = run or q.run
        return self.running(f"{q.owner} run {run.number}", self.clocks.driver(q.name),
                            flushing)

    def on_host(self, q: Query) -> None:
        """The calls that follow run on ``q``'s driver host (its working copies)."""
        if self.store is not None:
            from .store import on_host

            on_host(self, q.host)

    def move_host(self, q: Query, *locations: str) -> None:
        """The driver of ``q`` comes back elsewhere: on a new host (the working copies of its
        WALs lost, RocksDB logs and all), or on the other host (whatever copy it kept there,
        however stale)."""
        from .store import HOSTS, drop_working_copy

        if self.srng.random() < 0.5:
            shared = {loc for p in self.queries if p is not q and p.run is not None
                      and p.host == q.host for loc in p.wal_uris}
            lost = [loc for loc in sorted(set(locations) | q.wal_uris) if loc not in shared
                    and drop_working_copy(self, q.host, loc)]
            self.zombie_commits = [z for z in self.zombie_commits
                                   if not (z.host == q.host and z.plan.wal_store in lost)]
            self.say(f"{q.owner}: the driver moves to a new host: the working copy of "
                     f"{', '.join(lost) or 'nothing'} is gone")
        else:
            q.host = HOSTS[1 - HOSTS.index(q.host)]
            self.say(f"{q.owner}: the driver restarts on {q.host} (with what working copy "
                     f"it kept there)")

    def _open_flusher(self, q: Query, wal_root: str | None = None) -> None:
        """The run's flusher of the WAL at ``wal_root`` (default: the one the pointer names)."""
        import recovery.flusher as flushers
        import recovery.target as targets
        from recovery.cql.errors import ConnectionFailed, SinkError
        from recovery.flusher import QueryFlusher
        from wal.errors import WalError

        # Older code (the simulation runs against it too) has neither: nothing to catch.
        TargetNotRecorded = getattr(targets, "TargetNotRecorded", ())
        block_if_lost = getattr(flushers, "block_if_lost", None)

        wal_root = wal_root or self._pointer(q)
        if wal_root is None:
            return
        self.on_host(q)
        # wal.flush.mode=executors: flush tasks on simulated executors (World.flush_jobs).
        jobs = ({"spark_jobs": self.flush_jobs(self.clocks.driver(q.name))}
                if q.options.flush_mode != "driver" else {})
        if "run" in inspect.signature(QueryFlusher).parameters:   # older code has none
            jobs["run"] = (q.run.run_id, q.run.first_batch)        # as the registry gives it
        try:
            with self.driver_process(q):
                flusher = QueryFlusher(wal_root, q.checkpoint.path, {}, **jobs)
            q.run.flushers[wal_root] = flusher
            self.wal_roots.add(flusher.wal.root)
            self.wal_opened(wal_root, flusher.wal.root)
        except ConnectionFailed as exc:
            self.say(f"{q.owner}: flusher not started: {exc}")
        except TargetNotRecorded:          # as the registry: tried again at the next event
            faults = self.store_faults()
            try:
                with self.driver_process(q):
                    blocked = block_if_lost(wal_root, q.checkpoint.path,
                                            (q.run.run_id, q.run.first_batch))
            except Exception as exc:
                if not self.store_failed(exc, faults):
                    raise
                self.say(f"{q.owner}: listener error, no flusher: {exc}")
                return
            self.say(f"{q.owner}: no flusher yet: no batch recorded its target"
                     + (" (a batch its writer entered is lost: blocked)" if blocked else ""))
        except SinkError as exc:
            self.refuse(q, "the flusher's start", exc)
        except WalError as exc:   # Spark's listener bus logs it; the query goes on without one
            self.say(f"{q.owner}: listener error, no flusher: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the disk (disk.py): as the registry sorts it
            if not self.disk_error(exc):
                raise
            self.flusher_failed_on_disk(q, exc)

    def refuse(self, q: Query, where: str, exc: Exception) -> None:
        self.say(f"{q.owner}: REFUSED at {where}: {type(exc).__name__}: {exc}")
        if q.invalid is None:
            raise Violation("a valid query is never refused",
                            f"{q.owner} was refused at {where}: {type(exc).__name__}: {exc}")
        q.refused = f"{type(exc).__name__}: {exc}"
        self.kill(q, graceful=True)

    def begin_batch(self, q: Query) -> str:
        from recovery.cql.errors import ConnectionFailed, SinkError
        from sinks.worker.plan import prepare_write

        if q.writers is not None:
            return self.foreach_begin(q)
        if not q.checkpoint.available():
            self.say(f"{q.owner}: Spark cannot write offsets: the store is down, query fails")
            self.kill(q, graceful=True)
            return "failed"
        batch, rerun = q.checkpoint.next_batch()
        q.checkpoint.start_batch(batch, self.min_retain)
        earlier = self.executions_of.get((q.owner, batch), [])
        if rerun and earlier and self.rng.random() < 0.5:
            rows = earlier[-1].rows                               # the same rows again
        else:
            rows = self.draw_rows()
        self.on_host(q)
        faults = self.store_faults()
        refusal = self.refuses_lists and q.options.unaccepted_list
        staged = self.staged_files(self.stream_wal_location(q)) if refusal else None
        moving = self.changes.staged_before(self, q)
        try:
            with self.driver_process(q):
                plan = prepare_write(q.options.spark_options(q.checkpoint.path), {},
                                     q.options.spark_schema(), streaming=True)
        except ConnectionFailed as exc:
            self.say(f"{q.owner}: batch {batch}: prepare_write failed, query stops: {exc}")
            self.kill(q, graceful=True)
            return "failed"
        except SinkError as exc:
            if refusal and self.refused_for_lists(exc):
                self.list_refused(q.owner, f"batch {batch}", exc, self.stream_wal_location(q),
                                  staged, self.changes.timestamp_seal(self, q, moving))
                q.lists_refused = True
                self.kill(q, graceful=True)
                return "refused"
            if self.changes.refused(self, q, exc, moving):
                return "refused"
            self.refuse(q, f"prepare_write of batch {batch}", exc)
            return "refused"
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise
            self.say(f"{q.owner}: batch {batch}: prepare_write failed, query stops: {exc}")
            self.kill(q, graceful=True)
            return "failed"
        if refusal:
            raise Violation("a non-frozen list column without wal.lists.atLeastOnce is refused "
                            "before anything is staged",
                            f"{q.owner}: batch {batch}: prepare_write accepted it")
        self.wal_roots.add(plan.wal_root)
        if getattr(plan, "wal_store", None):
            q.wal_uris.add(plan.wal_store)
            self.store_wals.add(plan.wal_store)
        execution = self.new_execution(q.owner, batch, rows, q.options, q.query_id)
        q.run.inflight = InFlight(execution, plan,
                                  plan_attempts(self.rng, execution, plan, self.zombies))
        return self.say(f"{q.owner}: batch {batch}{' re-run' if rerun else ''} "
                        f"(execution {execution.number}): {self._rows_text(rows)}")

    def stream_wal_location(self, q: Query) -> str:
        """Where ``q``'s next batch would stage: its WAL's folder or store URI."""
        from sinks.worker.options import parse_options
        from sinks.worker.plan import resolve_wal_root

        return resolve_wal_root(parse_options(q.options.spark_options(q.checkpoint.path)), True)

    def commit(self, q: Query) -> str:
        from sinks.worker.plan import commit_batch

        inflight = q.run.inflight
        e = inflight.execution
        messages = [inflight.winners[p] for p in sorted(inflight.winners)]
        if getattr(inflight.plan, "wal_store", None) and self.store.known_failures and \
                self.srng.random() < 0.15:      # held back: README.md, item D
            self.zombie_commits.append(ZombieCommit(q.owner, q.run.number, q.host,
                                                    inflight.plan, messages, e))
            q.run.inflight = None
            self.kill(q)
            return self.say(f"{q.owner}: batch {e.batch}: the driver is cut off (a split "
                            f"brain) as it commits: its commit goes on as a zombie")
        self.seals_written.clear()
        self.arm(("commit.",), 0.1)
        crashed = failed = None
        faults = self.store_faults()
        try:
            with self.driver_process(q):          # the commit worker, on the driver's host
                seal = commit_batch(inflight.plan, messages, e.batch)
        except SimCrash as crash:
            crashed = str(crash)   # not the exception: its traceback holds the dead frames
        except Exception as exc:
            if not self.store_failed(exc, faults) and not self.changes.commit_blocked(exc):
                raise Violation("a commit fails only for a reason outside the sink",
                                f"{e.label}: commit failed: {type(exc).__name__}: {exc}") from exc
            failed = str(exc)          # the store away, or the WAL blocked on a drop, rightly
        finally:
            self.armed = None
        if failed is not None:       # the batch fails, and with it the query (Spark re-runs it)
            self.say(f"{q.owner}: batch {e.batch}: commit failed, query fails: {failed}")
            self._sealed_meanwhile(e)
            self.kill(q, graceful=True)
            return "failed"
        if crashed is not None:
            self.say(f"{q.owner}: batch {e.batch}: driver crashed at {crashed}")
            self._sealed_meanwhile(e)      # known, never committed: its rows must not show
            self.kill(q)
            return "crashed"
        self.oracle.sealed(e, seal)
        inflight.sealed = True
        return self.say(f"{q.owner}: batch {e.batch} sealed ({seal.rows} rows at "
                        f"{seal.base_ts_us})")

    def spark_commit(self, q: Query) -> str:
        if q.writers is not None:
            return self.foreach_spark_commit(q)
        e = q.run.inflight.execution
        if not q.checkpoint.available():
            self.say(f"{q.owner}: Spark cannot write commits/{e.batch}: the store is down, "
                     f"query fails")
            self.kill(q, graceful=True)
            return "failed"
        q.checkpoint.commit(e.batch)
        e.committed = True
        q.run.inflight = None
        self.say(f"{q.owner}: Spark wrote commits/{e.batch}")
        q.run.awaiting_pointer = False        # the progress event: the registry stops looking
        self.changes.follow_pointer(self, q)
        if q.run.flusher is None and self._pointer(q) is not None:
            self._open_flusher(q)                         # onQueryProgress, as FlushRegistry
        if q.run is not None and q.run.flusher is not None and self.rng.random() < 0.7:
            self._drain(q)
        return "committed"

    def drain(self, q: Query) -> str:
        return self._drain(q)

    def background(self) -> bool:
        """The flusher thread wakes every ``retry_interval_s`` (2 s) and drains, whatever
        Spark is doing meanwhile. Whether any drained."""
        drained = False
        for q in self.queries:
            run = q.run
            if run is not None and run.flushers and \
                    self.clock_us - run.last_drain_us >= run.flusher.retry_interval_s * 1e6:
                self._drain(q, periodic=True)
                drained = True
        return drained

    def _drain(self, q: Query, recover: bool = False, periodic: bool = False) -> str:
        """Each of the run's flushers drains (a kick wakes them all; a foreachBatch function's
        run has one per table), or recovers (at the run's start, as the registry does)."""
        what = "recover" if recover else "periodic drain" if periodic else "drain"
        q.run.last_drain_us = self.clock_us
        for location in list(q.run.flushers):
            if self._drain_one(q, location, what) == "crashed":
                return "crashed"
        return what

    def _drain_one(self, q: Query, location: str, what: str) -> str:
        flusher = q.run.flushers[location]
        recover = what == "recover"
        faults, healthy = self.node.faults, self.node.mode == cassandra.UP
        store_faults, disk_faults = self.store_faults(), self.disk.faults
        self.arm(("flush.", "recover."), 0.12)
        crashed = None
        try:
            with self.driver_process(q, flushing=True):
                flusher.recover() if recover else _drain_as_running(flusher)
        except SimCrash as crash:
            crashed = str(crash)   # not the exception: its traceback holds the dead frames
        finally:
            self.armed = None
        if crashed is not None:
            del flusher
            self.say(f"{q.owner}: {what}: driver crashed at {crashed}")
            self.kill(q)
            return "crashed"
        error = getattr(flusher, "last_error", None)
        of = f" of {self.table_of_wal(flusher)}" if q.writers is not None else ""
        self.say(f"{q.owner}: {what}{of}" + (f" ({type(error).__name__})" if error else ""))
        # A scale-out start leaves the committed backlog to the flusher's thread (its next
        # drains here), as the registry starts it right after: nothing to check yet.
        left = recover and getattr(flusher, "backlog_from", None) is not None
        if healthy and self.node.faults == faults and self.node.mode == cassandra.UP and \
                self.store_calm_since(store_faults) and not left:
            check_live(self, q, what, flusher)
        self.check_disk_drain(q, flusher, what, disk_faults)      # disk.py
        return what

    def kill(self, q: Query, graceful: bool = False) -> None:
        """The run ends: ``graceful`` (the query stopped or failed: Spark's onQueryTerminated
        stops the flusher, which drains once more) or a crash (the process is gone)."""
        run, q.run = q.run, None
        if run is None:
            return
        if run.call is not None:
            self.foreach_killed(run)
        if run.inflight is not None:
            for attempt in run.inflight.pending:   # executors outliving their driver, briefly
                if self.rng.random() < 0.3:
                    self.zombies.append(attempt)
            inflight = run.inflight
            if not graceful and getattr(inflight.plan, "wal_store", None) and \
                    self.store.known_failures and \
                    inflight.ready() and inflight.execution.seal is None and \
                    self.srng.random() < 0.4:
                self.zombie_commits.append(ZombieCommit(
                    q.owner, run.number, q.host, inflight.plan,
                    [inflight.winners[p] for p in sorted(inflight.winners)],
                    inflight.execution))
        flushers = list(run.flushers.values())
        run.flushers.clear()
        if not flushers:
            return
        for flusher in flushers:
            if graceful:
                with self.driver_process(q, flushing=True, run=run):
                    flusher.stop()
            else:
                flusher.wal_log.close()                # a killed process releases its lock
        # The process is gone, and with it whatever still referenced its RocksDB handle (an
        # iterator in a kept exception's traceback would otherwise hold the lock until a GC).
        del flusher, flushers, run
        gc.collect()

    def zombie_commit(self, index: int) -> str:
        """A cut-off run's commit goes on: it seals its batch now, through its own host's
        working copy, whatever happened since."""
        from sinks.worker.plan import commit_batch

        z = self.zombie_commits.pop(index)
        e = z.execution
        if not os.path.isdir(z.plan.wal_root):
            return self.say(f"{e.label}: the zombie commit of {z.owner}'s run {z.run} is gone "
                            f"with its host")
        self.seals_written.clear()
        try:
            seal = commit_batch(z.plan, z.messages, e.batch)
        except Exception as exc:   # noqa: BLE001 - a zombie's own failure hurts nobody
            self._sealed_meanwhile(e)
            return self.say(f"{e.label}: zombie commit of {z.owner}'s run {z.run} failed: "
                            f"{type(exc).__name__}: {exc}")
        self.oracle.sealed(e, seal)          # never committed: its rows must never show
        return self.say(f"{e.label}: zombie commit of {z.owner}'s run {z.run} sealed it late "
                        f"({seal.rows} rows at {seal.base_ts_us})")

    def crash(self, q: Query) -> str:
        self.kill(q)
        return self.say(f"{q.owner}: driver crashed")

    def stop(self, q: Query) -> str:
        self.kill(q, graceful=True)
        return self.say(f"{q.owner}: query stopped")

    def reset_checkpoint(self, q: Query) -> str:
        """The user deletes the checkpoint folder (and the WAL in it, unless ``wal.path``
        puts it elsewhere: then the new query reuses a WAL another query wrote)."""
        q.checkpoint.wipe()
        q.generation += 1
        q.query_id = self._uuid()
        if q.options.wal_path is None:
            return self.say(f"{q.name}: checkpoint deleted (its WAL with it); the query "
                            f"restarts as {q.owner}")
        q.invalid = q.invalid or "checkpoint reset with the same wal.path"
        return self.say(f"{q.name}: checkpoint deleted; the query restarts as {q.owner} "
                        f"with the same wal.path")

    def can_reset(self, q: Query) -> bool:
        """A user resets a checkpoint once the stream has caught up (nothing of it pending)."""
        if self.store is not None and not self.store.known_failures and \
                "://" in q.checkpoint.path:
            return False       # held back: README.md, "Stores: what it finds", item B
        return (q.run is None and q.refused is None and q.runs > 0
                and all(not self.oracle.missing(e) and not e.lost
                        for e in self.oracle.executions if q.owns(e.owner) and e.committed))


def _drain_as_running(flusher) -> None:
    """A drain of the running query's flusher (``RecoveryPolicy.QUERY_FLUSHER``); older code,
    which the simulation runs against too, names it by a boolean."""
    try:
        from wal.recovery_policy import RecoveryPolicy
    except ImportError:
        flusher.drain(query_running=True)
        return
    flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
