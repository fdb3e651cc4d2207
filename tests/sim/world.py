"""The simulated world of one schedule: clock, Spark (queries, runs, tasks, batch jobs), the
Cassandra node, and the actions a schedule is made of.

Each action drives the real sink through its seams, as Spark and the driver would:
``prepare_write`` / ``stage_partition`` / ``commit_batch`` for a stream's batch, a
``QueryFlusher`` per run (``recover()`` at query start, ``drain(query_running=True)`` when
kicked, never ``start()``), and ``CassandraWalDataSource.writer()`` then ``write()`` per task and
``commit()`` for a batch ``df.write``. A driver crash abandons the run's flusher (its RocksDB
log closed first, as a killed process releases its lock) and the next start opens a new one.
Everything random comes from ``World.rng``, seeded by the schedule's seed.
"""

from __future__ import annotations

import gc
import os
import random
import uuid
from dataclasses import dataclass, field

from sinks.table import TableSchema

from . import cassandra
from .invariants import (Violation, absorb_writes, check_live, check_table, check_written,
                         exempt_owners)
from .oracle import KEYSPACE, TABLES, Execution, Oracle, RunOptions, WRITETIME_COLUMN
from .patches import SimCrash
from .spark import (Attempt, Checkpoint, InFlight, TaskContext, TaskFailed, plan_attempts,
                    record_batches)

START_US = 1_800_000_000_000_000          # 2027-01-15: the simulated clock's origin
TS_FLOOR_WT = 1_700_000_000_000_000       # user-chosen write timestamps (writetime column)


def _typed(exc: Exception) -> bool:
    """An error the sink means to raise (its own families, or the driver's reporting an
    outage), not a bug surfacing (KeyError, an illegal state transition...)."""
    from recovery.errors import RecoveryError
    from sinks.errors import SinkError
    from wal.errors import IllegalTransition, WalError

    if isinstance(exc, IllegalTransition):
        return False
    return (isinstance(exc, (SinkError, RecoveryError, WalError))
            or type(exc).__module__.split(".")[0] == "cassandra")


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


@dataclass
class Job:
    """A batch ``df.write``: its writer (built once, as Spark's writer-building worker does)."""

    name: str
    writer: object
    inflight: InFlight


@dataclass
class World:
    seed: int
    root: str
    rng: random.Random = None
    clock_us: int = START_US
    step: int = 0
    trace: list[str] = field(default_factory=list)
    verbose: bool = False
    doing: str = "setup"              # the action running now (named when it breaks something)

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.clock_us = START_US + self.rng.randrange(1_000_000)
        self.tables = {name: TableSchema(KEYSPACE, name, cols, pk, ck)
                       for name, (cols, pk, ck) in TABLES.items()}
        self.node = cassandra.SimCassandra(self.tables, self.rng, lambda: self.clock_us)
        self.oracle = Oracle()
        self.table = "tc" if self.rng.random() < 0.25 else "t"
        self.min_retain = self.rng.choice((1, 1, 2, 3, 5))
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.home)
        self.queries: list[Query] = []
        self.jobs: list[Job] = []
        self.job_count = 0
        self.zombies: list[Attempt] = []
        self.task_context = None
        self.armed: tuple[tuple[str, ...], int] | None = None
        self.seals_written: list = []
        self.wal_roots: set[str] = set()
        self.executions_of: dict[tuple[str, int], list[Execution]] = {}
        self.wt_next = TS_FLOOR_WT + self.rng.randrange(1_000_000)
        self._setup()

    # -- the schedule's cast ------------------------------------------------------------------
    def _setup(self) -> None:
        r = self.rng.random()
        streams = 0 if r < 0.15 else 1 if r < 0.75 else 2
        self.jobs_on = streams == 0 or self.rng.random() < 0.3
        shared = os.path.join(self.root, "wal-shared")
        explicit = self.rng.random() < 0.4
        for i in range(streams):
            wal_path = shared if (explicit or (i == 1 and self.rng.random() < 0.6)) else None
            q = Query(f"q{i + 1}", Checkpoint(os.path.join(self.root, f"cp{i + 1}")),
                      self.draw_options(wal_path), self._uuid())
            self.queries.append(q)
        with_shared = [q for q in self.queries if q.options.wal_path == shared]
        if len(with_shared) > 1:
            for q in with_shared:
                q.invalid = "two queries share one wal.path"
        self.say(f"world: table {self.table}, minBatchesToRetain={self.min_retain}, "
                 f"queries: " + "; ".join(f"{q.name} ({q.options.describe()})" for q in self.queries)
                 + (", batch jobs" if self.jobs_on else ""))

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128)))

    def draw_options(self, wal_path: str | None) -> RunOptions:
        rng = self.rng
        return RunOptions(
            table=self.table, with_w=rng.random() < 0.8,
            ttl=rng.choice((None, None, None, 30, 86400)),
            writetime=rng.random() < 0.2, ignore_nulls=rng.random() < 0.3,
            retention_batches=rng.choice((0, 0, 1, 2, 3, 10)),
            retention_seconds=rng.choice((None, None, 0.5, 5.0, 60.0)),
            group_rows=rng.choice((1, 2, 3, 30000)), retry_count=rng.choice((0, 0, 1, 2)),
            grouping=rng.choice(("partition", "none")), wal_path=wal_path)

    def draw_rows(self) -> dict[int, list[dict]]:
        rng = self.rng
        parts = rng.choice((1, 1, 1, 2, 2, 3))
        out = {}
        for p in range(parts):
            rows = []
            for _ in range(rng.choice((0, 1, 1, 2, 2, 3))):
                self.wt_next += rng.randrange(1, 1000)
                rows.append({"k": rng.randrange(5), "c": rng.randrange(2),
                             "v": rng.choice((None, "a", "b", "cc", "")),
                             "w": rng.choice((None, 0, 1, 7, -3)),
                             WRITETIME_COLUMN: self.wt_next})
            out[p] = rows
        return out

    # -- bookkeeping ----------------------------------------------------------------------------
    def say(self, text: str) -> str:
        line = f"{self.step:3d} {text}"
        self.trace.append(line)
        if self.verbose:
            print(line, flush=True)
        return text

    def crash_point(self, name: str) -> None:
        if self.armed is None:
            return
        prefixes, countdown = self.armed
        if not name.startswith(prefixes):
            return
        if countdown > 1:
            self.armed = (prefixes, countdown - 1)
            return
        self.armed = None
        raise SimCrash(name)

    def arm(self, prefixes: tuple[str, ...], probability: float) -> None:
        self.armed = ((prefixes, self.rng.randrange(1, 5))
                      if self.rng.random() < probability else None)

    def new_execution(self, owner: str, batch: int, rows, options: RunOptions,
                      query_id: str | None) -> Execution:
        earlier = self.executions_of.setdefault((owner, batch), [])
        execution = self.oracle.add(Execution(owner, batch, len(earlier) + 1, rows, options,
                                              query_id))
        earlier.append(execution)
        return execution

    # -- streams ----------------------------------------------------------------------------
    def start(self, q: Query) -> str:
        from sinks.plan import read_pointer

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
        from sinks.driver import QueryFlusher
        from sinks.errors import ConnectionFailed, SinkError
        from sinks.plan import read_pointer
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
        from sinks.errors import ConnectionFailed, SinkError
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

    @staticmethod
    def _rows_text(rows) -> str:
        return " ".join(f"p{p}:{len(r)}" for p, r in sorted(rows.items()))

    def task(self, owner_label: str, inflight: InFlight, index: int) -> str:
        attempt = inflight.pending.pop(index)
        message = self.run_attempt(attempt)
        if attempt.fate == "ok":
            if attempt.partition not in inflight.winners:
                inflight.winners[attempt.partition] = message
                if message.segment:
                    inflight.execution.segments[message.segment["name"]] = attempt.partition
                return self.say(f"{owner_label}: task {attempt.label} staged, wins")
            return self.say(f"{owner_label}: task {attempt.label} staged, loses (speculative)")
        if attempt.fate == "fail":
            return self.say(f"{owner_label}: task {attempt.label} failed mid-write")
        return self.say(f"{owner_label}: task {attempt.label} staged, then its executor was lost")

    def run_attempt(self, attempt: Attempt):
        """Stage one task attempt's rows: its commit message (None if it failed mid-write)."""
        from sinks.plan import stage_partition

        e = attempt.execution
        batches = record_batches(e, attempt.partition, attempt.fate == "fail")
        try:
            if e.query_id is None:            # a batch job: through the writer, as Spark does
                self.task_context = TaskContext(attempt.partition, attempt.number)
                try:
                    return attempt.plan.write(batches)
                finally:
                    self.task_context = None
            return stage_partition(attempt.plan, batches, e.batch, attempt.partition,
                                   attempt.number, e.query_id)
        except TaskFailed:
            return None

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
        from sinks.plan import read_pointer

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

    def background(self) -> None:
        """The flusher thread wakes every ``retry_interval_s`` (2 s) and drains, whatever
        Spark is doing meanwhile."""
        for q in self.queries:
            run = q.run
            if run is not None and run.flusher is not None and \
                    self.clock_us - run.last_drain_us >= run.flusher.retry_interval_s * 1e6:
                self._drain(q, periodic=True)

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

    # -- batch jobs -------------------------------------------------------------------------
    def job_start(self) -> str:
        from sinks.errors import ConnectionFailed
        from sinks.source import CassandraWalDataSource

        self.job_count += 1
        name = f"job{self.job_count}"
        options = self.draw_options(None)
        source = CassandraWalDataSource(options.spark_options(None))
        try:
            writer = source.writer(options.spark_schema(), False)
        except ConnectionFailed as exc:
            return self.say(f"{name}: writer() failed, job fails: {exc}")
        except Exception as exc:
            raise Violation("a valid batch job is never refused",
                            f"{name}: writer() raised {type(exc).__name__}: {exc}") from exc
        self.wal_roots.add(writer.plan.wal_root)
        batch = getattr(writer, "batch_id", -1)      # a clock reading, in the older code
        execution = self.new_execution(name, batch, self.draw_rows(), options, None)
        job = Job(name, writer, InFlight(execution, writer))
        job.inflight.pending = plan_attempts(self.rng, execution, writer, self.zombies)
        self.jobs.append(job)
        return self.say(f"{name}: start{f', batch id {batch}' if batch >= 0 else ''} "
                        f"({options.describe()}): {self._rows_text(execution.rows)}")

    def job_commit(self, job: Job) -> str:
        inflight = job.inflight
        e = inflight.execution
        messages = [inflight.winners[p] for p in sorted(inflight.winners)]
        faults, healthy = self.node.faults, self.node.mode == cassandra.UP
        self.seals_written.clear()
        self.arm(("commit.", "flush.", "recover."), 0.1)
        self.jobs.remove(job)
        try:
            job.writer.commit(messages)
            error = None
        except SimCrash as crash:
            error = f"driver crashed at {crash}"
        except Exception as exc:   # noqa: BLE001 - judged below: was anything at fault?
            error = f"{type(exc).__name__}: {exc}"
            if not _typed(exc):
                raise
            if healthy and self.node.faults == faults and self.node.mode == cassandra.UP:
                raise Violation("a batch job fails only for a reason outside the sink",
                                f"{e.label}: commit raised {error}") from exc
        finally:
            self.armed = None
        if self._sealed_meanwhile(e):
            e.committed = True                         # a batch job's seal is its commit point
        if error is not None:
            # Spark's commit worker exits after a failed commit (a crash kills it): whatever
            # still referenced its RocksDB handle goes with it, the lock too.
            gc.collect()
        if error is not None:
            return self.say(f"{job.name}: commit failed ({'after' if e.committed else 'before'} "
                            f"its seal): {error}")
        if not e.committed:
            raise Violation("a batch job's commit seals its rows",
                            f"{e.label}: commit returned without sealing")
        absorb_writes(self)
        missing = self.oracle.missing(e, self.clock_us / 1e6)
        if missing:
            from .oracle import fmt
            raise Violation("a batch job's commit returns only after its rows are written",
                            f"{e.label}: commit returned, {len(missing)} of {len(e.expected)} "
                            f"rows never reached Cassandra (e.g. {fmt(missing[0])})")
        return self.say(f"{job.name}: committed, batch {e.seal.batch} written "
                        f"({len(e.expected)} rows)")

    def _sealed_meanwhile(self, e: Execution) -> bool:
        """Whether a seal of exactly ``e``'s winning segments was written (by the call that
        just ran, even if it crashed before returning); if so the oracle learns its rows."""
        for seal in reversed(self.seals_written):
            if {ref.name for ref in seal.segments} == set(e.segments):
                self.oracle.sealed(e, seal)
                return True
        return False

    def job_abort(self, job: Job) -> str:
        """A task failed for good: Spark aborts the job (its driver stays up)."""
        self.jobs.remove(job)
        messages = [job.inflight.winners[p] for p in sorted(job.inflight.winners)]
        job.writer.abort(messages)
        return self.say(f"{job.name}: aborted by Spark")

    def job_crash(self, job: Job) -> str:
        self.jobs.remove(job)
        gc.collect()                                   # its process is gone, locks too
        return self.say(f"{job.name}: its driver died before the commit")

    def zombie(self, index: int) -> str:
        attempt = self.zombies.pop(index)
        e = attempt.execution
        try:
            self.run_attempt(attempt)
        except Exception as exc:   # noqa: BLE001 - a zombie's own failure hurts nobody
            return self.say(f"{e.label}: zombie {attempt.label} failed: {type(exc).__name__}")
        return self.say(f"{e.label}: zombie task {attempt.label} staged late")

    # -- the node and the clock -------------------------------------------------------------
    def set_node(self, mode: str) -> str:
        self.node.mode = mode
        return self.say(f"cassandra: {mode}")

    def advance(self, seconds: float) -> str:
        self.clock_us += int(seconds * 1e6)
        return self.say(f"clock +{seconds:g}s")

    # -- the end ----------------------------------------------------------------------------
    def finish(self) -> None:
        """Every driver gone, the node up for good, then recovery as a user would run it: each
        stream restarted once (recovery, then a clean stop), and one more batch job on the
        batch WAL, which completes batch jobs that failed after their seal."""
        from sinks.driver import QueryFlusher
        from sinks.errors import SinkError
        from sinks.plan import read_pointer

        self.step += 1
        self.doing = "final recovery"
        self.node.mode = cassandra.UP
        self.say("final: every driver stops, Cassandra up, recovery runs")
        for q in self.queries:
            self.kill(q)
        self.jobs.clear()
        self.zombies.clear()
        for q in self.queries:
            wal_root = read_pointer(q.checkpoint.path) if q.refused is None else None
            if wal_root is None:
                continue
            try:
                flusher = QueryFlusher(wal_root, q.checkpoint.path, {})
            except SinkError as exc:
                self.refuse(q, "the flusher's start (final recovery)", exc)
                continue
            try:
                flusher.recover()
            finally:
                flusher.stop()
                del flusher
                gc.collect()
            self.say(f"{q.owner}: recovered")
        if any(e.owner.startswith("job") for e in self.oracle.executions):
            self._final_job()
        check_written(self)
        if not exempt_owners(self):
            self.clock_us += 2 * 86400 * 1_000_000     # past every TTL
            check_table(self)

    def _final_job(self) -> None:
        from sinks.source import CassandraWalDataSource

        options = self.draw_options(None)
        source = CassandraWalDataSource(options.spark_options(None))
        writer = source.writer(options.spark_schema(), False)
        writer.commit([])
        self.say("final batch job (no rows) committed")
