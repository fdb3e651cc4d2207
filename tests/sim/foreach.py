"""A ``foreachBatch`` query in the simulated Spark: the user's function, with a writer
(``sinks.CassandraWalWriter``) for one or two tables of the keyspace, as actions on the world.

The function's code path for a batch is drawn when Spark starts the batch; for each writer:

* **called**: ``prepare_write(..., wal_per_table=True)``, then the adapter's own
  :class:`sinks.worker.foreach_batch.WriterCall` (the claim, the entry), the ``mapInArrow`` job's
  tasks (``stage_partition``, one step each, with Spark's retries, speculation and zombies),
  then ``WriterCall.seal``: exactly what ``CassandraWalWriter.__call__`` does, without a
  DataFrame;
* **skipped**: not called at all (sometimes no writer is, as ``if df.isEmpty(): return``);
* **failed, swallowed**: called, its job fails before the seal, and the function catches the
  error and returns: Spark commits the batch, whose rows for that table are lost. That
  table's WAL must block at that batch (and write nothing after it); no other block is right;
* **failed, raised**: the batch fails, the query fails, and a later run re-runs the batch;
* **twice**: a second call for a table already written in the batch: refused with a
  ``SinkError`` before anything is staged (the user's mistake; the query fails, and the user
  fixes the function).

The registry's side as ``sinks.driver.registry`` does it: a run makes a flusher for every WAL the
checkpoint's pointers name (``wal.pointer.pointed_wals``) and recovers each at its start; a
WAL that first appears in a later batch gets its flusher at that batch's progress event.

Older code (before issue 30's fix, ``wal.entries`` missing) runs in the shape its adapter had:
every writer of the query writes through the query's one WAL (``prepare_write`` without
``wal_per_table``, no claims, no entries), and the registry flushes that WAL.

Everything this module draws comes from ``World.frng`` (seeded from the seed, as the store's
``srng``): a world without a foreachBatch query draws exactly what it drew before.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field

from .invariants import BLOCKED_FILE, Violation
from .oracle import KEYSPACE, Execution, RunOptions
from .patches import SimCrash, has_module
from .spark import InFlight, plan_attempts

#: foreachBatch worlds: 1 (the default) draws them, holding back the cases the sink fails
#: today (README.md, "foreachBatch: what it finds"); all: those too; 0: none.
ENV_FOREACH = "CASSANDRA_WAL_SIM_FOREACH"
#: 1 world in this many has a foreachBatch query (1: every world).
ENV_FOREACH_SHARE = "CASSANDRA_WAL_SIM_FOREACH_SHARE"

PER_TABLE = "a WAL per table"          # the adapter of issue 30's fix (WriterCall)
SHARED = "one WAL per query"           # the adapter before it

CALLED, SKIPPED, SWALLOW, RAISE, TWICE = "called", "skipped", "fails, caught", "fails", "twice"
TODO, STAGING, SEALED, FAILED = "todo", "staging", "sealed", "failed"


def foreach_shape() -> str | None:
    """Which adapter the code under test has (None: foreachBatch worlds are off, or the code
    is the one commit that has entries but no ``WriterCall`` to drive)."""
    if os.environ.get(ENV_FOREACH, "1") == "0" or not has_module("sinks.worker.foreach_batch"):
        return None
    import sinks.worker.foreach_batch as adapter

    if hasattr(adapter, "WriterCall"):
        return PER_TABLE
    return None if has_module("wal.entries") else SHARED


def known_failures() -> bool:
    """Draw the cases the sink fails today too (``CASSANDRA_WAL_SIM_FOREACH=all``)."""
    return os.environ.get(ENV_FOREACH, "1") == "all"


def _writer_hooks(handle) -> dict:
    """``prepare_write``'s keywords as ``CassandraWalWriter.__call__`` gives them (the claim
    before the pointer where the adapter has one)."""
    hooks = {"wal_per_table": True, "on_wal": handle.enter}
    if hasattr(handle, "claim"):
        hooks["claim"] = handle.claim
    return hooks


class SparkJobFailed(Exception):
    """The writer's ``mapInArrow`` job failed (a task failed four times): what the writer
    raises to the user's function."""


@dataclass
class Writer:
    """A ``CassandraWalWriter`` of the function: its table, and the options it was made with
    (drawn again when the query restarts, as the user may change them)."""

    table: str
    options: RunOptions


@dataclass
class Call:
    """One call of a writer in a batch."""

    writer: Writer
    fate: str
    execution: Execution | None = None
    inflight: InFlight | None = None
    handle: object | None = None       # the adapter's WriterCall (PER_TABLE)
    state: str = TODO
    swallowed: bool = False            # it failed, and the function caught the error
    rows: dict | None = None           # its own DataFrame's (a second call's); None: the batch's

    @property
    def owner(self) -> str:
        return self.execution.owner if self.execution is not None else self.writer.table


@dataclass
class FunctionCall:
    """The function's call for one micro-batch: the writer calls it makes, in order."""

    batch: int
    rerun: bool
    rows: dict
    calls: list[Call]
    skipped: list[str] = field(default_factory=list)
    index: int = 0                      # the next call to make

    @property
    def current(self) -> Call | None:
        """The call staging now (its tasks run, or its seal is next), if any."""
        return next((c for c in self.calls if c.state == STAGING), None)

    def live(self):
        """The calls whose staged rows and seal must stay until Spark commits the batch."""
        return [c for c in self.calls if c.state in (STAGING, SEALED) and c.inflight]


class ForeachBatch:
    """The foreachBatch actions of :class:`tests.sim.world.World`."""

    # -- the cast -------------------------------------------------------------------------------
    def make_foreach(self) -> None:
        """q1 becomes a foreachBatch query (one is added if the world drew no stream): one
        writer, or two (a table and its twin, ``t`` and ``tc``, fed the same rows)."""
        from .streams import Query

        f = self.frng
        if not self.queries:
            self.queries.append(Query("q1", self._checkpoint("cp1"), self.draw_options(None),
                                      self._uuid()))
        q = self.queries[0]
        tables = ["t", "tc"]
        f.shuffle(tables)
        count = 2 if f.random() < 0.6 else 1
        q.writers = [Writer(t, self.draw_options(q.options.wal_path, table=t)) for t in tables[:count]]
        if count == 2 and q.options.wal_path is not None:
            q.invalid = q.invalid or "two tables through one wal.path"

    def redraw_writers(self, q) -> None:
        for w in q.writers:
            w.options = self.draw_options(q.options.wal_path, table=w.table)

    @staticmethod
    def describe_query(q) -> str:
        """A query's options as the schedule shows them (a foreachBatch query's writers')."""
        if q.writers is None:
            return q.options.describe()
        return "foreachBatch: " + ", ".join(f"{w.table} [{w.options.describe()}]"
                                            for w in q.writers)

    # -- the WALs: which owners write through each, and which lost a batch ------------------------
    def wal_used(self, q, owner: str, plan) -> str:
        """``plan`` (a writer call's) writes ``owner``'s batches: where, from now on."""
        location = getattr(plan, "wal_store", None) or plan.wal_root
        self.wal_owners.setdefault(location, set()).add(owner)
        self.owner_wal[owner] = location
        self.root_location[plan.wal_root] = location
        self.wal_roots.add(plan.wal_root)
        if getattr(plan, "wal_store", None):
            q.wal_uris.add(plan.wal_store)
            self.store_wals.add(plan.wal_store)
        return location

    def wal_opened(self, location: str, root: str) -> None:
        """A flusher opened the WAL at ``location`` through ``root`` (its host's copy)."""
        self.root_location[root] = location

    def table_of_wal(self, flusher) -> str:
        owners = self.wal_owners.get(flusher.wal.location, ())
        return "+".join(sorted(o.rsplit("/", 1)[-1] for o in owners)) or "?"

    def lost(self) -> list[Execution]:
        """Executions whose rows the user's function lost: caught failures Spark committed."""
        return [e for e in self.oracle.executions if e.lost and e.committed]

    def lost_batches(self, location: str) -> set[int]:
        return {e.batch for e in self.lost() if self.owner_wal.get(e.owner) == location}

    def after_loss(self, e: Execution) -> bool:
        """``e`` comes after a batch its WAL lost: the WAL blocks there, so ``e`` is never
        written (and must not be)."""
        if self.foreach is None:
            return False
        location = self.owner_wal.get(e.owner)
        lost = self.lost_batches(location) if location is not None else set()
        return bool(lost) and e.batch > min(lost)

    def block_allowed(self, where: str, reason: str) -> bool:
        """``blocked.json`` at ``where`` (a WAL's folder or working copy, or its store's URI)
        saying ``reason`` is right: it names a batch this WAL lost."""
        if self.foreach is None:
            return False
        lost = self.lost_batches(self.root_location.get(where, where))
        found = re.search(r"stopped at batch (\d+)", reason)
        return found is not None and int(found.group(1)) in lost

    def expects_block(self, flusher) -> bool:
        return self.foreach is not None and bool(self.lost_batches(flusher.wal.location))

    def _entered(self, c: Call, batch: int) -> bool:
        """Whether the WAL holds an entry of ``batch`` now (where its flusher will read it)."""
        from wal.format import batch_name

        from wal.layout import WalDir

        location = getattr(c.handle, "wal", None)      # the WAL the call entered, if it did
        if location is None:
            return False
        if "://" in location:
            return bool(self.store.raw(location).list(f"entered/{batch_name(batch)}"))
        return os.path.exists(WalDir(location).entry_path(batch))

    # -- the registry --------------------------------------------------------------------------
    def _pointed(self, q) -> list[str] | None:
        """Every WAL the query's pointers name (None: the listener could not read them)."""
        from wal import pointer

        faults = self.store_faults()
        try:
            if hasattr(pointer, "pointed_wals"):
                return pointer.pointed_wals(q.checkpoint.path)
            root = pointer.read_pointer(q.checkpoint.path)
            return [root] if root is not None else []
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise
            self.say(f"{q.owner}: listener error, pointers unreadable: {exc}")
            return None

    def _new_flushers(self, q) -> None:
        """``FlushRegistry._new_flushers``: a flusher for each WAL the pointers name that has
        none yet in this run."""
        for location in self._pointed(q) or []:
            if q.run is None:
                return
            if location not in q.run.flushers:
                self._open_flusher(q, location)

    def foreach_started(self, q) -> str:
        """``onQueryStarted``: a flusher for each WAL, each recovered (``FlushRegistry._begin``);
        a new query's run looks for its first pointer."""
        q.run.run_id = str(uuid.UUID(int=self.frng.getrandbits(128)))
        if self._pointed(q):
            self._new_flushers(q)
            if q.run is not None and q.run.flushers:
                self._drain(q, recover=True)
        elif q.run is not None:
            q.run.awaiting_pointer = True
        return "started"

    def foreach_pointer_found(self, q) -> str:
        if not self._pointed(q):
            return self.say(f"{q.owner}: registry: no pointer yet")
        q.run.awaiting_pointer = False
        self.say(f"{q.owner}: registry: found a pointer, making the flushers")
        self._new_flushers(q)
        if q.run is not None and q.run.flushers:
            return self._drain(q)
        return "no flusher"

    # -- a batch --------------------------------------------------------------------------------
    def _draw_calls(self, q, batch: int, rows: dict) -> tuple[list[Call], list[str]]:
        """The function's code path for this batch."""
        f = self.frng
        empty = (not any(rows.values()) and f.random() < 0.6) or f.random() < 0.06
        calls, skipped = [], []
        for w in q.writers:
            if empty:                               # if df.isEmpty(): return
                fate = SKIPPED
            else:
                r = f.random()
                fate = SKIPPED if r < 0.15 else SWALLOW if r < 0.24 else RAISE if r < 0.31 \
                    else CALLED
            earlier = self._earlier_calls(q, w.table, batch)
            if fate == SKIPPED and earlier and self.store is not None and \
                    not known_failures():
                # Held back: README.md, "foreachBatch: what it finds", F3 on a store: a store
                # refusing the sink's writes (the run's record) while it takes Spark's commit.
                fate = CALLED
            if fate == SKIPPED:
                skipped.append(w.table)
            else:
                calls.append(Call(w, fate))
        called = [c for c in calls if c.fate == CALLED]
        if called and not q.fixed and f.random() < 0.05:       # another DataFrame, same table
            calls.append(Call(f.choice(called).writer, TWICE, rows=self.draw_rows()))
        return calls, skipped

    def _earlier_calls(self, q, table: str, batch: int) -> bool:
        """Whether a writer of ``table`` was called for ``batch`` before, by this query or by
        one of its earlier generations (a checkpoint reset: the new WAL is in the same place,
        where a zombie task of the old query may still stage)."""
        for e in self.oracle.executions:
            if e.batch == batch and "/" in e.owner:
                who, written = e.owner.rsplit("/", 1)
                if written == table and (who == q.name or who.startswith(q.name + "~")):
                    return True
        return False

    def foreach_begin(self, q) -> str:
        """Spark starts a batch (``offsets/N``) and calls the function."""
        if not q.checkpoint.available():
            self.say(f"{q.owner}: Spark cannot write offsets: the store is down, query fails")
            self.kill(q, graceful=True)
            return "failed"
        batch, rerun = q.checkpoint.next_batch()
        q.checkpoint.start_batch(batch, self.min_retain)
        earlier = self.function_rows.get((q.owner, batch))
        if rerun and earlier and self.rng.random() < 0.5:
            rows = earlier                                        # the same rows again
        else:
            rows = self.draw_rows()
        self.function_rows[(q.owner, batch)] = rows
        calls, skipped = self._draw_calls(q, batch, rows)
        q.run.call = FunctionCall(batch, rerun, rows, calls, skipped)
        plan = ", ".join([f"{c.writer.table} {c.fate}"
                          + (f" ({self._rows_text(c.rows)})" if c.rows else "") for c in calls]
                         + [f"{t} skipped" for t in skipped])
        return self.say(f"{q.owner}: batch {batch}{' re-run' if rerun else ''}: "
                        f"{self._rows_text(rows)}; the function: {plan or 'returns at once'}")

    def foreach_call(self, q) -> str:
        """The function calls its next writer: ``prepare_write``, then the adapter's
        ``WriterCall`` (claim, entry); its job's tasks follow as steps of their own."""
        from recovery.cql.errors import ConnectionFailed, SinkError
        from sinks.worker.plan import prepare_write

        fc = q.run.call
        c = fc.calls[fc.index]
        fc.index += 1
        w = c.writer
        label = f"{q.owner}: batch {fc.batch}: {w.table}'s writer"
        c.execution = self.new_execution(q.owner_of(w.table), fc.batch, c.rows or fc.rows,
                                         w.options, "")
        c.state = FAILED                     # until it stages
        self.on_host(q)
        per_table = self.foreach == PER_TABLE
        handle = None
        if per_table:
            from sinks.worker.foreach_batch import WriterCall

            # The claim and the entry come first, inside prepare_write (its claim and on_wal),
            # before the table's lookup, as CassandraWalWriter.__call__ gives them.
            handle = c.handle = WriterCall(fc.batch, q.run.run_id, f"{KEYSPACE}.{w.table}")
        faults = self.store_faults()
        try:
            with self.driver_process(q):
                plan = prepare_write(w.options.spark_options(q.checkpoint.path), {},
                                     w.options.spark_schema(), streaming=True,
                                     **(_writer_hooks(handle) if per_table else {}))
        except ConnectionFailed as exc:
            if handle is not None:
                handle.failed(exc)
            return self._call_failed(q, c, exc, "prepare_write")
        except SinkError as exc:
            if c.fate == TWICE and handle is not None and handle.wal is None:
                q.fixed = True
                self.say(f"{label} called again: refused, nothing staged: {exc}; the "
                         f"function raises, the query fails (the user fixes it)")
                self.kill(q, graceful=True)
                return "refused"
            self.refuse(q, f"prepare_write of batch {fc.batch} ({w.table})", exc)
            return "refused"
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise
            if handle is not None:
                handle.failed(exc)
            return self._call_failed(q, c, exc, "prepare_write")
        if c.fate == TWICE and per_table:
            raise Violation("one table written twice in a batch is refused before anything "
                            "is staged", f"{label} was called again and let through")
        self.wal_used(q, c.execution.owner, plan)
        c.inflight = InFlight(c.execution, plan, [])
        if handle is not None:
            handle.plan = plan
        c.inflight.pending = plan_attempts(self.rng, c.execution, plan, self.zombies)
        if c.fate in (SWALLOW, RAISE):        # the job fails before every task is through
            c.inflight.pending = c.inflight.pending[:self.frng.randrange(
                len(c.inflight.pending) + 1)]
        c.state = STAGING
        return self.say(f"{label} ({c.fate}{', again' if c.fate == TWICE else ''}): "
                        f"execution {c.execution.number}"
                        + (", entered" if per_table else ""))

    def foreach_seal(self, q) -> str:
        """The writer's job is through: ``WriterCall.seal`` (``commit_batch``), or the job
        failed (the fates that fail)."""
        from recovery.cql.errors import SinkError
        from sinks.worker.plan import commit_batch
        from wal.seal import COMMIT_POINT_CHECKPOINT

        fc = q.run.call
        c = fc.current
        e = c.execution
        if c.fate in (SWALLOW, RAISE):
            exc = SparkJobFailed(f"batch {fc.batch}: a task of the writer's job failed 4 times")
            if c.handle is not None:
                c.handle.failed(exc)
            return self._call_failed(q, c, exc, "its job")
        messages = [c.inflight.winners[p] for p in sorted(c.inflight.winners)]
        self.seals_written.clear()
        self.arm(("commit.",), 0.1)
        crashed = failed = None
        faults = self.store_faults()
        try:
            with self.driver_process(q):      # foreachBatch seals in the driver process
                if c.handle is not None:
                    seal = c.handle.seal(messages)
                else:
                    seal = commit_batch(c.inflight.plan, messages, fc.batch,
                                        commit_point=COMMIT_POINT_CHECKPOINT)
        except SimCrash as crash:
            crashed = str(crash)
        except SinkError as exc:
            if not (self.expects_block_of(c) and "blocked" in str(exc)):
                raise Violation("a valid query is never refused",
                                f"{e.label}: the seal was refused: {exc}") from exc
            failed = exc                    # its WAL is blocked, rightly: the call fails
        except Exception as exc:
            if not self.store_failed(exc, faults):
                raise Violation("a commit fails only for a reason outside the sink",
                                f"{e.label}: commit failed: {type(exc).__name__}: {exc}") from exc
            failed = exc
        finally:
            self.armed = None
        if crashed is not None:
            self.say(f"{q.owner}: batch {fc.batch} ({c.writer.table}): driver crashed at "
                     f"{crashed}")
            self._sealed_meanwhile(e)
            self.kill(q)
            return "crashed"
        if failed is not None:
            self._sealed_meanwhile(e)
            return self._call_failed(q, c, failed, "its seal")
        self.oracle.sealed(e, seal)
        c.inflight.sealed = True
        c.state = SEALED
        return self.say(f"{q.owner}: batch {fc.batch} ({c.writer.table}) sealed ({seal.rows} "
                        f"rows at {seal.base_ts_us})")

    def expects_block_of(self, c: Call) -> bool:
        location = self.owner_wal.get(c.execution.owner)
        return location is not None and bool(self.lost_batches(location))

    def _call_failed(self, q, c: Call, exc: Exception, where: str) -> str:
        """The writer raised: the function catches it and goes on (the fate says so), or the
        function raises, the batch fails and with it the query (Spark re-runs the batch)."""
        fc = q.run.call
        e = c.execution
        c.state = FAILED
        what = f"{q.owner}: batch {fc.batch}: {c.writer.table}'s writer failed at {where} " \
               f"({type(exc).__name__}: {exc})"
        location = getattr(c.handle, "wal", None)    # entered before prepare_write failed
        if location is not None and e.owner not in self.owner_wal:
            self.owner_wal[e.owner] = location
            self.wal_owners.setdefault(location, set()).add(e.owner)
        if c.fate == SWALLOW:
            entered = self.foreach == SHARED or self._entered(c, fc.batch)
            if e.seal is not None:
                c.swallowed = True
                return self.say(f"{what}, after its seal was written; the function goes on")
            if entered or known_failures():
                c.swallowed, e.lost, e.entered = True, True, entered
                return self.say(f"{what}; the function catches it and goes on: its rows for "
                                f"{c.writer.table} are lost"
                                + ("" if entered else " (no entry was recorded)"))
            what += " before its entry (held back: README.md, item F1, the function raises)"
        self.say(f"{what}; the function raises, the query fails")
        self.kill(q, graceful=True)
        return "failed"

    def foreach_spark_commit(self, q) -> str:
        """The function returned: Spark writes ``commits/N``; its progress event makes the
        flushers of WALs new to the run (the pointers read again) and kicks them all."""
        fc = q.run.call
        if not q.checkpoint.available():
            self.say(f"{q.owner}: Spark cannot write commits/{fc.batch}: the store is down, "
                     f"query fails")
            self.kill(q, graceful=True)
            return "failed"
        q.checkpoint.commit(fc.batch)
        for c in fc.calls:
            if c.execution is not None and (c.state == SEALED or c.swallowed):
                c.execution.committed = True
        q.run.call = None
        self.say(f"{q.owner}: Spark wrote commits/{fc.batch}")
        q.run.awaiting_pointer = False
        self._new_flushers(q)
        if q.run is not None and q.run.flushers and self.rng.random() < 0.7:
            self._drain(q)
        return "committed"

    def foreach_killed(self, run) -> None:
        """The run ends with the function's call in flight: its staging tasks' executors may
        outlive the driver briefly."""
        for c in run.call.calls:
            if c.state == STAGING and c.inflight is not None:
                for attempt in c.inflight.pending:
                    if self.rng.random() < 0.3:
                        self.zombies.append(attempt)
        run.call = None

    # -- the end ----------------------------------------------------------------------------
    def wals_at_end(self, q) -> list[str]:
        """The WALs the final recovery recovers for ``q``: every one its pointers name."""
        from wal import pointer

        if hasattr(pointer, "pointed_wals"):
            return pointer.pointed_wals(q.checkpoint.path)
        root = pointer.read_pointer(q.checkpoint.path)
        return [root] if root is not None else []

    def check_foreach_end(self) -> None:
        """After the final recovery: every batch the user's function lost blocked its WAL
        (the sink tells a lost batch from a skipped one, and says so), and a committed call
        is sealed or lost, nothing in between."""
        if self.foreach is None:
            return
        for e in self.oracle.executions:
            if e.committed and e.seal is None and not e.lost:
                raise Violation("a committed writer call is sealed or lost",
                                f"{e.label} is committed with no seal and no failure")
        live = {o for q in self.queries if q.refused is None for o in q.owners}
        for e in self.lost():
            location = self.owner_wal.get(e.owner)
            if e.owner not in live or location is None:
                continue
            if not self.final_blocked.get(location):
                raise Violation("a batch the function lost blocks its table's WAL",
                                f"{e.label}: its writer failed, the function caught the error "
                                f"and Spark committed the batch, yet after the final recovery "
                                f"the WAL at {location} is not blocked: its rows for "
                                f"{e.options.table} are lost silently")


def blocked_now(flusher) -> bool:
    return os.path.exists(os.path.join(flusher.wal.root, BLOCKED_FILE))
