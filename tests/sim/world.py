"""The simulated world of one schedule: its clock, seeded RNG, Cassandra node, oracle, the
cast (streams, batch jobs) and the actions a schedule is made of.

The actions drive the real sink through its seams as Spark and the driver would: streams in
:mod:`tests.sim.streams`, batch jobs in :mod:`tests.sim.batch_jobs`; here the parts both share (a
task attempt, zombie tasks, the node and the clock) and the end: every driver stops, the node
comes up for good, recovery runs as a user would run it, and everything committed must be in
Cassandra. Everything random comes from ``World.rng``, seeded by the schedule's seed.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from recovery.cql.table import TableSchema

from . import cassandra
from .foreach import ENV_FOREACH_SHARE, ForeachBatch, blocked_now, foreach_shape
from .changes import Changes, check_rising
from .clocks import BATCH_JOBS_MACHINE, Clocks
from .deletes import Deletes
from .marker import knows_marker, marker_schema
from .invariants import Violation, check_store_end, check_table, check_written, exempt_owners
from .batch_jobs import BatchJobs, Job
from .disk import Disk
from .operators import Operators
from .oracle import (KEYSPACE, LISTS_OPTION, MARKER_TABLE, OP_COLUMN, TABLES, WRITETIME_COLUMN,
                     Execution, Oracle, RunOptions)
from .patches import SimCrash, has_module
from .spark import (
    Attempt,
    Checkpoint,
    InFlight,
    StoreCheckpoint,
    TaskContext,
    TaskFailed,
    record_batches,
)
from .streams import Query, Streams

#: Worlds with a store (tests/sim/store.py): 1 (the default) draws them, holding back the two
#: cases the sink fails today (README.md, "Stores: what it finds"); all: those too; 0: none.
ENV_STORES = "CASSANDRA_WAL_SIM_STORES"
#: 1 world in this many has a store (CASSANDRA_WAL_SIM_STORE_SHARE=1: every world).
ENV_STORE_SHARE = "CASSANDRA_WAL_SIM_STORE_SHARE"
#: Worlds whose table has list columns (README.md, "Lists"): unset, the default, draws them when
#: the code under test has wal.lists.atLeastOnce; 1 also for older code (never with the
#: option, which it does not know); 0: none.
ENV_LISTS = "CASSANDRA_WAL_SIM_LISTS"
#: 1 world in this many has list columns.
LIST_SHARE = 4
#: A list cell's values (never empty: an empty non-frozen list is no list at all).
LISTS = (None, ("a",), ("a", "b"), ("b", "a", "b"))
START_US = 1_800_000_000_000_000          # 2027-01-15: the simulated clock's origin
FIRST_USER_WT = 1_700_000_000_000_000     # user-chosen write timestamps (writetime column)


def stores_on() -> bool:
    """Store worlds are drawn: switched on, and the code under test has stores (older code
    has no ``wal/remote.py``)."""
    return os.environ.get(ENV_STORES, "all") != "0" and has_module("wal.remote")


def knows_lists_option() -> bool:
    """The code under test has ``wal.lists.atLeastOnce``, and so refuses a non-frozen list
    column without it."""
    import sinks.worker.options

    return LISTS_OPTION in getattr(sinks.worker.options, "KNOWN_NAMES", ())


def lists_on() -> bool:
    """List worlds are drawn (:data:`ENV_LISTS`)."""
    setting = os.environ.get(ENV_LISTS, "")
    return setting == "1" or (setting != "0" and knows_lists_option())


def executors_read_stores() -> bool:
    """The code under test flushes a WAL on a store from the executors (its flush tasks read
    their segments from the store); older code refused ``wal.flush.mode=executors`` there."""
    import recovery.executors

    return "store_uri" in getattr(recovery.executors.SegmentJob, "__dataclass_fields__", {})


def store_uri(path: str) -> str:
    from .store import uri

    return uri(path)


def is_store(location: str | None) -> bool:
    return bool(location) and "://" in location


@dataclass
class World(Streams, BatchJobs, Operators, ForeachBatch, Disk):
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
        if knows_marker():                  # the completeness marker's table (marker.py)
            self.tables[MARKER_TABLE] = marker_schema()
        self.node = cassandra.SimCassandra(self.tables, self.rng, lambda: self.clock_us)
        self.oracle = Oracle()
        # The machines' clocks, from an RNG of their own too (clocks.py): a world without
        # clocks draws from self.rng what it drew before they were simulated.
        self.clocks = Clocks(self.seed)
        self.oracle.tombstones = self.clocks.tombstones
        # What the world's classes drew (changes, operators, disks), summed over a run's
        # schedules and printed by test_protocol_sim: each draw is seen to be reached.
        self.counts: Counter = Counter()
        # What users change between runs (changes.py), from an RNG of its own too.
        self.changes = Changes(self.seed, self.counts)
        self.seal_clocks = self.oracle.seal_clocks       # filled by patches._spy_write_seal
        self.table = "tc" if self.rng.random() < 0.25 else "t"
        # Lists from an RNG of their own, as the store's: a world without lists draws from
        # self.rng exactly what it drew before they were simulated.
        self.lrng = random.Random(f"lists:{self.seed}")
        self.lists = lists_on() and self.lrng.randrange(LIST_SHARE) == 0
        self.refuses_lists = self.lists and knows_lists_option()
        if self.lists:
            self.table += "l"
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
        self.wt_next = FIRST_USER_WT + self.rng.randrange(1_000_000)
        # The store's draws come from an RNG of their own: a world without a store draws
        # from self.rng exactly what it drew before stores were simulated (the seeds named in
        # README.md replay the same schedules).
        self.srng = random.Random(f"store:{self.seed}")
        self.store = None
        self.store_wals: set[str] = set()        # the simstore:// URIs of WALs used
        self.zombie_commits: list = []
        share = int(os.environ.get(ENV_STORE_SHARE, "4"))
        if stores_on() and self.srng.randrange(share) == 0:
            from .store import StoreState

            self.store = StoreState(os.path.join(self.root, "store"), self.srng,
                                    known_failures=os.environ.get(ENV_STORES, "all") == "all")
        # A foreachBatch query (tests/sim/foreach.py) is drawn, like the store, from an RNG of
        # its own: a world without one draws from self.rng what it drew before.
        self.frng = random.Random(f"foreach:{self.seed}")
        self.xrng = random.Random(f"executors-on-store:{self.seed}")
        self.foreach = None              # the adapter's shape, in a foreachBatch world
        self.wal_owners: dict[str, set[str]] = {}     # WAL location -> writers' owners
        self.owner_wal: dict[str, str] = {}           # a writer's owner -> its WAL location
        self.root_location: dict[str, str] = {}       # a WAL folder or working copy -> location
        self.final_blocked: dict[str, bool] = {}      # WAL location -> blocked at the end
        self.function_rows: dict[tuple[str, int], dict] = {}   # the function's DataFrame
        shape = foreach_shape()
        if shape is not None and self.frng.randrange(int(os.environ.get(ENV_FOREACH_SHARE,
                                                                          "4"))) == 0:
            self.foreach = shape
        # Change streams (deletes.py), from an RNG of their own too; partition deletes where
        # a table written has a clustering column (foreachBatch: t and tc).
        self.deletes = Deletes(self.seed, self.counts,
                               clustered=self.table.startswith("tc") or self.foreach is not None)
        self.init_operators()            # operators.py, disk.py: RNGs of their own
        self.init_disk()
        self._setup()

    # -- the schedule's cast ------------------------------------------------------------------
    def _setup(self) -> None:
        r = self.rng.random()
        streams = 0 if r < 0.15 else 1 if r < 0.75 else 2
        self.jobs_on = streams == 0 or self.rng.random() < 0.3
        shared = os.path.join(self.root, "wal-shared")
        if self.store is not None and self.srng.random() < 0.6:
            shared = store_uri("wal-shared")
        explicit = self.rng.random() < 0.4
        for i in range(streams):
            wal_path = shared if (explicit or (i == 1 and self.rng.random() < 0.6)) else None
            q = Query(f"q{i + 1}", self._checkpoint(f"cp{i + 1}"),
                      self.draw_options(wal_path), self._uuid())
            self.queries.append(q)
        with_shared = [q for q in self.queries if q.options.wal_path == shared]
        if len(with_shared) > 1:
            for q in with_shared:
                q.invalid = "two queries share one wal.path"
        if self.foreach is not None:
            self.make_foreach()
        self.say(f"world: table {self.table}, minBatchesToRetain={self.min_retain}, "
                 f"queries: " + "; ".join(f"{q.name} ({self.describe_query(q)}"
                                          f"{', checkpoint ' + q.checkpoint.path if is_store(q.checkpoint.path) else ''})"
                                          for q in self.queries)
                 + (", batch jobs" if self.jobs_on else "")
                 + (f"; a store ({self.store.describe()})" if self.store is not None else "")
                 + (f"; {self.deletes.describe()}" if self.deletes.on else "")
                 + (f"; {self.clocks.describe()}" if self.clocks.on else ""))

    def _checkpoint(self, name: str) -> Checkpoint:
        if self.store is not None and self.srng.random() < 0.75:
            return StoreCheckpoint(store_uri(name), self.store)
        return Checkpoint(os.path.join(self.root, name))

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128)))

    def draw_options(self, wal_path: str | None, valid: bool = False,
                     table: str | None = None) -> RunOptions:
        """A run's options (of ``table``: a foreachBatch writer's); in a list world, whether it
        writes the lists and accepts at-least-once for "l" (``valid``: never a write the sink
        refuses); in a deletes world, a change stream (deletes.py)."""
        rng = self.rng
        options = RunOptions(
            table=table or self.table, with_w=rng.random() < 0.8,
            ttl=rng.choice((None, None, None, 30, 86400)),
            writetime=rng.random() < 0.2, ignore_nulls=rng.random() < 0.3,
            retention_batches=rng.choice((0, 0, 1, 2, 3, 10)),
            retention_seconds=rng.choice((None, None, 0.5, 5.0, 60.0)),
            group_rows=rng.choice((1, 2, 3, 30000)), retry_count=rng.choice((0, 0, 1, 2)),
            grouping=rng.choice(("partition", "none")), wal_path=wal_path)
        if self.clocks.on and self.store is None and self.clocks.rng.random() < 0.5:
            # Flush tasks on the executors (clocks.py), asked for or chosen by ``auto`` (the
            # simulated Spark runs executors apart from the driver).
            options = dataclasses.replace(options, flush_mode=self._scale_out_mode())
        elif (self.clocks.on and self.store is not None and executors_read_stores()
              and self.xrng.random() < 0.5):
            # With a WAL on the store too, where the tasks read their segments (code that
            # refused the mode there is not asked): drawn from an RNG of its own, so that a
            # store world draws from the others what it drew before.
            options = dataclasses.replace(options, flush_mode=self._scale_out_mode())
        if self.lists and "l" in dict(TABLES[options.table][0]):    # not a writer's t
            options = dataclasses.replace(
                options, with_lists=self.lrng.random() < 0.8,
                lists_opt_in=self.refuses_lists and (valid or self.lrng.random() < 0.6))
        return self.deletes.options(options)

    def fixed_lists(self, options: RunOptions) -> RunOptions:
        """What the user changes once the sink refused their list column: they accept
        at-least-once for it, or stop writing it."""
        if self.lrng.random() < 0.7:
            return dataclasses.replace(options, lists_opt_in=True)
        return dataclasses.replace(options, with_lists=False)

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
                if self.lists:
                    rows[-1].update(l=self.lrng.choice(LISTS), fl=self.lrng.choice(LISTS))
            out[p] = rows
        return self.deletes.rows(out)        # a change stream's operations (deletes.py)

    def _scale_out_mode(self) -> str:
        """``executors``, or ``auto`` where the code under test has it (it picks the
        executors here: the simulated Spark runs them apart from the driver); from the
        executors' own RNG, as the store worlds' choice."""
        from sinks.worker.options import OPTION_SPECS

        has_auto = any(s.name == "wal.flush.mode" and s.default == "auto" for s in OPTION_SPECS)
        return "auto" if has_auto and self.xrng.random() < 0.5 else "executors"

    # -- processes, machines and clocks ----------------------------------------------------------
    @contextmanager
    def running(self, proc: str, machine: str | None, flushing: bool = False):
        """What follows is the sink's process ``proc`` on ``machine``: it reads that machine's
        clocks, and what it writes to Cassandra is its (``Write.proc``). ``flushing``: it takes
        every sealed batch in hand now (its first drain, recovery or commit since the seal:
        the instant whose clock a batch's age is measured on, ``Oracle.anchors``)."""
        if flushing:
            offset = self.clocks.wall_offset(machine)
            for e in self.oracle.executions:
                if e.seal is not None:
                    self.oracle.anchors.setdefault((proc, id(e)), offset)
        before = self.node.proc
        self.node.proc = proc
        try:
            with self.clocks.on_machine(machine):
                yield
        finally:
            self.node.proc = before

    def flush_jobs(self, machine: str | None) -> "SimSparkJobs":
        return SimSparkJobs(self, machine)

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
                                              query_id, chunk_rows=self.deletes.chunk_rows()))
        earlier.append(execution)
        return execution

    @staticmethod
    def _rows_text(rows) -> str:
        """Each partition's row count; a change stream's with its rows' operations in order
        (``p0:3(udP)``: an upsert, a row delete, a partition delete)."""
        return " ".join(f"p{p}:{len(r)}" + (f"({''.join(row[OP_COLUMN] for row in r)})"
                                             if r and OP_COLUMN in r[0] else "")
                        for p, r in sorted(rows.items()))

    def task(self, owner_label: str, inflight: InFlight, index: int) -> str:
        attempt = inflight.pending.pop(index)
        faults = self.store_faults()
        try:
            message = self.run_attempt(attempt)
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise
            self.say(f"{owner_label}: task {attempt.label} failed: {exc}"
                     + self._retry_task(inflight, attempt))
            return "store failed"
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

    def _retry_task(self, inflight: InFlight, attempt: Attempt) -> str:
        """Spark runs another attempt of a task that failed, unless one is still to come."""
        p = attempt.partition
        if p in inflight.winners or any(a.partition == p and a.fate == "ok"
                                        for a in inflight.pending):
            return ""
        number = 1 + max([a.number for a in inflight.pending + self.zombies
                          if a.execution is attempt.execution and a.partition == p]
                         + [attempt.number])
        inflight.pending.append(Attempt(attempt.execution, p, number, "ok", attempt.plan))
        return f"; Spark retries it as attempt {number}"

    # -- lists ----------------------------------------------------------------------------------
    def staged_files(self, location: str) -> list[str]:
        """What a query or job has staged or recorded under ``location`` (a WAL, or a table's
        root of batch-job WALs): its segments, seals and target.json, on a store or not."""
        def kept(path: str) -> bool:
            parts = path.split("/")
            return "segments" in parts or "seals" in parts or parts[-1] == "target.json"

        if "://" in location:
            return sorted(k for k in self.store.raw(location).list() if kept(k))
        out = []
        for folder, _dirs, files in os.walk(location):
            rel = os.path.relpath(folder, location)
            out += [os.path.normpath(os.path.join(rel, f)) for f in files]
        return sorted(p for p in out if kept(p))

    @staticmethod
    def refused_for_lists(exc: Exception) -> bool:
        """The sink's refusal of the non-frozen list "l": it names the column and the option.
        (Any other refusal of a valid query is a violation: :meth:`refuse`.)"""
        from recovery.cql.errors import SchemaError

        return isinstance(exc, SchemaError) and exc.column == "l" and \
            f"{LISTS_OPTION}=l" in str(exc)

    def list_refused(self, owner: str, what: str, exc: Exception, location: str,
                     staged: list[str], timestamp_seal: str | None = None) -> None:
        """The sink refused a write of the non-frozen list "l" without the opt-in, as it must:
        nothing was staged or recorded meanwhile (but ``timestamp_seal``: the seal of no rows
        a move of the WAL followed before the table's lookup leaves in the new WAL,
        changes.py)."""
        self.say(f"{owner}: {what} refused, as it must be: {type(exc).__name__}: {exc}")
        now = [p for p in self.staged_files(location) if p != timestamp_seal]
        if now != staged:
            raise Violation("a refused query stages nothing",
                            f"{owner}: {what}, refused, left {sorted(set(now) - set(staged))} "
                            f"and removed {sorted(set(staged) - set(now))} in {location}")

    # -- the store ------------------------------------------------------------------------------
    def store_faults(self) -> int:
        """The store's faults so far, and the disk's (disk.py): both outside the sink."""
        return (self.store.faults if self.store is not None else 0) + self.disk.faults

    def store_failed(self, exc: Exception, faults_before: int) -> bool:
        """``exc`` is the sink reporting a store (or disk) failure the world injected since."""
        from wal.errors import StoreUnavailable

        return self.store_faults() != faults_before and \
            (isinstance(exc, StoreUnavailable) or self.disk_error(exc))

    def store_calm_since(self, faults_before: int) -> bool:
        from .store import UP

        return (self.store is None or self.store.mode == UP) and \
            self.store_faults() == faults_before

    def set_store(self, mode: str) -> str:
        self.store.mode = mode
        return self.say(f"store: {mode}")

    def run_attempt(self, attempt: Attempt):
        """Stage one task attempt's rows: its commit message (None if it failed mid-write)."""
        from sinks.worker.plan import stage_partition

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

    def _sealed_meanwhile(self, e: Execution) -> bool:
        """Whether a seal of exactly ``e``'s winning segments was written (by the call that
        just ran, even if it crashed before returning); if so the oracle learns its rows."""
        for seal in reversed(self.seals_written):
            if {ref.name for ref in seal.segments} == set(e.segments):
                self.oracle.sealed(e, seal)
                return True
        return False

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
        stream restarted once (recovery of every WAL its checkpoint's pointers name, then a
        clean stop), and one more batch job on the batch WAL, which completes batch jobs that
        failed after their seal."""
        from recovery.cql.errors import SinkError
        from recovery.flusher import QueryFlusher

        self.step += 1
        self.doing = "final recovery"
        self.node.mode = cassandra.UP
        self.disk.room()
        if self.store is not None:
            self.store.mode, self.store.calm = "up", True
        self.say("final: every driver stops, Cassandra up" + (", the store up" if self.store
                                                              else "") + ", recovery runs")
        for q in self.queries:
            self.kill(q)
        self.jobs.clear()
        self.zombies.clear()
        self.zombie_commits.clear()
        for q in self.queries:
            wals = self.wals_at_end(q) if q.refused is None else ()
            moved = self.clocks.restart(q.name) if wals else ""
            for wal_root in wals:
                if q.refused is not None:
                    break
                self._final_recovery(q, wal_root, QueryFlusher, SinkError, moved)
                for _ in range(3):       # blocked on a drop: the operator amends (changes.py)
                    if q.refused is not None or not self.changes.amend_at_end(self, wal_root):
                        break
                    self._final_recovery(q, wal_root, QueryFlusher, SinkError, moved)
        self.changes.final = True
        if any(e.owner.startswith("job") for e in self.oracle.executions):
            self._final_job()
        check_written(self)
        check_rising(self)
        self.check_foreach_end()
        if self.store is not None and self.store.known_failures:
            check_store_end(self)
        if not exempt_owners(self):
            self.clock_us += 2 * 86400 * 1_000_000     # past every TTL
            check_table(self)

    def _final_recovery(self, q: Query, wal_root: str, QueryFlusher, SinkError,
                        moved: str) -> None:
        import recovery.flusher as flushers
        import recovery.target as targets

        # Older code (the simulation runs against it too) has neither: nothing to catch.
        TargetNotRecorded = getattr(targets, "TargetNotRecorded", ())
        block_if_lost = getattr(flushers, "block_if_lost", None)
        if self.store is not None:
            if is_store(wal_root) and self.srng.random() < 0.3:
                self.move_host(q, wal_root)
            self.on_host(q)
        with self.running(f"{q.owner}: final recovery", self.clocks.driver(q.name),
                          flushing=True):
            try:
                flusher = QueryFlusher(wal_root, q.checkpoint.path, {})
            except TargetNotRecorded:       # as the registry: nothing it could write
                self.final_blocked[wal_root] = block_if_lost(wal_root, q.checkpoint.path)
                self.say(f"{q.owner}: no target recorded in {wal_root.rsplit('/', 1)[-1]}")
                return
            except SinkError as exc:
                self.refuse(q, "the flusher's start (final recovery)", exc)
                return
            self.wal_opened(wal_root, flusher.wal.root)
            try:
                flusher.recover()
                self.final_blocked[wal_root] = blocked_now(flusher)
            finally:
                flusher.stop()
                del flusher
                gc.collect()
        self.say(f"{q.owner}: recovered" + (f" {wal_root.rsplit('/', 1)[-1]}"
                                            if q.writers is not None else "") + moved)

    def _final_job(self) -> None:
        from sinks.worker.source import CassandraWalDataSource

        options = self.draw_options(None, valid=True)
        machine = BATCH_JOBS_MACHINE if self.clocks.on else None
        with self.running("final batch job", machine, flushing=True):
            source = CassandraWalDataSource(options.spark_options(None))
            writer = source.writer(options.spark_schema(), False)
            writer.commit([])
        self.say("final batch job (no rows) committed")


class SimSparkJobs:
    """Spark running the flush jobs of ``wal.flush.mode=executors`` (``recovery.executors``):
    the tasks one after the other, each on an executor or on the driver's machine
    (:meth:`tests.sim.clocks.Clocks.executor`). A task on another machine than the driver's
    counts the batch's age on from when it starts: how long it waited since the job began is
    its writes' ``uncounted_s``."""

    label = "simulated flush tasks"

    def __init__(self, world: World, driver: str | None):
        self.world, self.driver = world, driver

    def carries_secrets(self) -> bool:
        return True

    def active(self) -> bool:
        return True

    def on_a_cluster(self) -> bool:
        return True          # the executors are machines of their own (clocks.py)

    def __call__(self, batch: int, tasks: list, fn) -> list:
        world, began, out = self.world, self.world.clock_us, []
        for task in tasks:
            machine = world.clocks.executor(self.driver)
            world.node.uncounted_s = ((world.clock_us - began) / 1e6
                                      if machine != self.driver else 0.0)
            try:
                with world.clocks.on_machine(machine):
                    out += list(fn(iter([task])))
            finally:
                world.node.uncounted_s = 0.0
        return out
