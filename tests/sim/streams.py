"""A stream's life in the simulated Spark driver, as actions on the world.

A run is one driver process: at its start Spark's ``onQueryStarted`` makes the run's
``QueryFlusher`` (when the checkpoint names the sink's WAL) and recovers; each batch is
``prepare_write`` then a task per partition (``stage_partition``), ``commit_batch``, and
Spark's ``commits/N``, after which ``onQueryProgress`` kicks the flusher (a drain now or
later); the flusher's own thread drains every 2 s of simulated time. A crash abandons the
run (its RocksDB log closed, as a killed process releases its lock); a stop drains once more.
The user may delete a caught-up checkpoint and start over, with the WAL under it or with an
explicit ``wal.path`` that the new query then reuses.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from . import cassandra
from .invariants import Violation, check_live
from .oracle import RunOptions
from .patches import SimCrash
from .spark import Checkpoint, InFlight, plan_attempts


@dataclass
class Run:
    """One run of a stream: a driver process with its flusher and the batch in flight."""

    number: int
    flusher: object | None = None
    inflight: InFlight | None = None
    last_drain_us: int = 0


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

    @property
    def owner(self) -> str:
        return self.name if self.generation == 0 else f"{self.name}~{self.generation}"


class Streams:
    """The stream actions of :class:`tests.sim.world.World`."""

    def start(self, q: Query) -> str:
        from wal.pointer import read_pointer

        if q.runs and self.rng.random() < 0.35:
            q.options = self.draw_options(q.options.wal_path)
        if not os.path.exists(os.path.join(q.checkpoint.path, "metadata")):
            q.checkpoint.create(q.query_id)
        q.runs += 1
        q.run = Run(q.runs, last_drain_us=self.clock_us)
        self.say(f"{q.owner}: start run {q.runs} ({q.options.describe()})")
        if read_pointer(q.checkpoint.path) is not None:   # onQueryStarted, as FlushRegistry
            self._open_flusher(q)
            if q.run is not None and q.run.flusher is not None:
                self._drain(q, recover=True)
        return "started"

    def _open_flusher(self, q: Query) -> None:
        from recovery.flusher import QueryFlusher
        from cql.errors import ConnectionFailed, SinkError
        from wal.pointer import read_pointer
        from wal.errors import WalError

        wal_root = read_pointer(q.checkpoint.path)
        try:
            q.run.flusher = QueryFlusher(wal_root, q.checkpoint.path, {})
            self.wal_roots.add(wal_root)
        except ConnectionFailed as exc:
            self.say(f"{q.owner}: flusher not started: {exc}")
        except SinkError as exc:
            self.refuse(q, "the flusher's start", exc)
        except WalError as exc:   # Spark's listener bus logs it; the query goes on without one
            self.say(f"{q.owner}: listener error, no flusher: {type(exc).__name__}: {exc}")

    def refuse(self, q: Query, where: str, exc: Exception) -> None:
        self.say(f"{q.owner}: REFUSED at {where}: {type(exc).__name__}: {exc}")
        if q.invalid is None:
            raise Violation("a valid query is never refused",
                            f"{q.owner} was refused at {where}: {type(exc).__name__}: {exc}")
        q.refused = f"{type(exc).__name__}: {exc}"
        self.kill(q, graceful=True)

    def begin_batch(self, q: Query) -> str:
        from cql.errors import ConnectionFailed, SinkError
        from sinks.plan import prepare_write

        batch, rerun = q.checkpoint.next_batch()
        q.checkpoint.start_batch(batch, self.min_retain)
        earlier = self.executions_of.get((q.owner, batch), [])
        if rerun and earlier and self.rng.random() < 0.5:
            rows = earlier[-1].rows                               # the same rows again
        else:
            rows = self.draw_rows()
        try:
            plan = prepare_write(q.options.spark_options(q.checkpoint.path), {},
                                 q.options.spark_schema(), streaming=True)
        except ConnectionFailed as exc:
            self.say(f"{q.owner}: batch {batch}: prepare_write failed, query stops: {exc}")
            self.kill(q, graceful=True)
            return "failed"
        except SinkError as exc:
            self.refuse(q, f"prepare_write of batch {batch}", exc)
            return "refused"
        self.wal_roots.add(plan.wal_root)
        execution = self.new_execution(q.owner, batch, rows, q.options, q.query_id)
        q.run.inflight = InFlight(execution, plan,
                                  plan_attempts(self.rng, execution, plan, self.zombies))
        return self.say(f"{q.owner}: batch {batch}{' re-run' if rerun else ''} "
                        f"(execution {execution.number}): {self._rows_text(rows)}")

    def commit(self, q: Query) -> str:
        from sinks.plan import commit_batch

        inflight = q.run.inflight
        e = inflight.execution
        messages = [inflight.winners[p] for p in sorted(inflight.winners)]
        self.seals_written.clear()
        self.arm(("commit.",), 0.1)
        crashed = None
        try:
            seal = commit_batch(inflight.plan, messages, e.batch)
        except SimCrash as crash:
            crashed = str(crash)   # not the exception: its traceback holds the dead frames
        except Exception as exc:
            raise Violation("a commit fails only for a reason outside the sink",
                            f"{e.label}: commit failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.armed = None
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
        from wal.pointer import read_pointer

        e = q.run.inflight.execution
        q.checkpoint.commit(e.batch)
        e.committed = True
        q.run.inflight = None
        self.say(f"{q.owner}: Spark wrote commits/{e.batch}")
        if q.run.flusher is None and read_pointer(q.checkpoint.path) is not None:
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
            if run is not None and run.flusher is not None and \
                    self.clock_us - run.last_drain_us >= run.flusher.retry_interval_s * 1e6:
                self._drain(q, periodic=True)
                drained = True
        return drained

    def _drain(self, q: Query, recover: bool = False, periodic: bool = False) -> str:
        flusher = q.run.flusher
        q.run.last_drain_us = self.clock_us
        faults, healthy = self.node.faults, self.node.mode == cassandra.UP
        self.arm(("flush.", "recover."), 0.12)
        what = "recover" if recover else "periodic drain" if periodic else "drain"
        crashed = None
        try:
            flusher.recover() if recover else flusher.drain(query_running=True)
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
        self.say(f"{q.owner}: {what}" + (f" ({type(error).__name__})" if error else ""))
        if healthy and self.node.faults == faults and self.node.mode == cassandra.UP:
            check_live(self, q, what)
        return what

    def kill(self, q: Query, graceful: bool = False) -> None:
        """The run ends: ``graceful`` (the query stopped or failed: Spark's onQueryTerminated
        stops the flusher, which drains once more) or a crash (the process is gone)."""
        run, q.run = q.run, None
        if run is None:
            return
        if run.inflight is not None:
            for attempt in run.inflight.pending:   # executors outliving their driver, briefly
                if self.rng.random() < 0.3:
                    self.zombies.append(attempt)
        flusher, run.flusher = run.flusher, None
        if flusher is None:
            return
        if graceful:
            flusher.stop()
        else:
            flusher.log.close()                    # a killed process releases its lock
        # The process is gone, and with it whatever still referenced its RocksDB handle (an
        # iterator in a kept exception's traceback would otherwise hold the lock until a GC).
        del flusher, run
        gc.collect()

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
        return (q.run is None and q.refused is None and q.runs > 0
                and all(not self.oracle.missing(e) for e in self.oracle.executions
                        if e.owner == q.owner and e.committed))
