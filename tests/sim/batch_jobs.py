"""Batch ``df.write`` jobs in the simulated Spark, as actions on the world.

A job is built once (``CassandraWalDataSource.writer()``, in Spark's writer-building worker),
runs a task per partition (``write()``, with retries, speculation and zombies like a stream's)
and commits (``commit()``: seal, then write, in the commit); several may interleave on one
table. A job whose commit returned must have its rows in Cassandra; one whose commit failed
after its seal is completed by the next job (its seal is its commit point).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from . import cassandra
from .clocks import BATCH_JOBS_MACHINE
from .invariants import Violation, absorb_writes
from .patches import SimCrash
from .spark import InFlight, plan_attempts


def _typed(exc: Exception) -> bool:
    """An error the sink means to raise (its own families, or cassandra-driver's reporting an
    outage), not a bug surfacing (KeyError, an illegal state transition...)."""
    from recovery.errors import SINK_ERRORS
    from wal.errors import IllegalTransition

    if isinstance(exc, IllegalTransition):
        return False
    return (isinstance(exc, SINK_ERRORS)
            or type(exc).__module__.split(".")[0] == "cassandra")


@dataclass
class Job:
    """A batch ``df.write``: its writer (built once, as Spark's writer-building worker does)."""

    name: str
    writer: object
    inflight: InFlight


class BatchJobs:
    """The batch job actions of :class:`tests.sim.world.World`."""

    def job_start(self) -> str:
        from recovery.cql.errors import ConnectionFailed
        from sinks.worker.source import CassandraWalDataSource

        self.job_count += 1
        name = f"job{self.job_count}"
        options = self.draw_options(None)
        source = CassandraWalDataSource(options.spark_options(None))
        refusal = self.refuses_lists and options.unaccepted_list
        root = self._jobs_root(options) if refusal else None
        staged = self.staged_files(root) if refusal else None
        faults = self.store_faults()
        try:
            with self.job_process(name):
                writer = source.writer(options.spark_schema(), False)
        except ConnectionFailed as exc:
            return self.say(f"{name}: writer() failed, job fails: {exc}")
        except Exception as exc:
            if self.store_failed(exc, faults):          # the disk (disk.py)
                return self.say(f"{name}: writer() failed, job fails: {exc}")
            if refusal and self.refused_for_lists(exc):
                self.list_refused(name, "its writer()", exc, root, staged)
                return "refused"
            raise Violation("a valid batch job is never refused",
                            f"{name}: writer() raised {type(exc).__name__}: {exc}") from exc
        if refusal:
            raise Violation("a non-frozen list column without wal.lists.atLeastOnce is refused "
                            "before anything is staged", f"{name}: writer() accepted it")
        self.wal_roots.add(writer.plan.wal_root)
        batch = getattr(writer, "batch_id", -1)      # a clock reading, in the older code
        execution = self.new_execution(name, batch, self.draw_rows(), options, None)
        job = Job(name, writer, InFlight(execution, writer))
        job.inflight.pending = plan_attempts(self.rng, execution, writer, self.zombies)
        self.jobs.append(job)
        return self.say(f"{name}: start{f', batch id {batch}' if batch >= 0 else ''} "
                        f"({options.describe()}): {self._rows_text(execution.rows)}")

    @staticmethod
    def _jobs_root(options) -> str:
        """The folder of the batch jobs' WALs to the run's table (``~/.cassandra_wal/...``)."""
        from sinks.worker.options import parse_options
        from sinks.worker.plan import resolve_wal_root

        return resolve_wal_root(parse_options(options.spark_options(None)), False)

    def job_commit(self, job: Job) -> str:
        inflight = job.inflight
        e = inflight.execution
        messages = [inflight.winners[p] for p in sorted(inflight.winners)]
        faults, healthy = self.node.faults, self.node.mode == cassandra.UP
        disk_faults = self.store_faults()
        self.seals_written.clear()
        self.arm(("commit.", "flush.", "recover."), 0.1)
        self.jobs.remove(job)
        try:
            with self.job_process(job.name, flushing=True):   # its commit: seal, then flush
                job.writer.commit(messages)
            error = None
        except SimCrash as crash:
            error = f"driver crashed at {crash}"
        except Exception as exc:   # noqa: BLE001 - judged below: was anything at fault?
            error = f"{type(exc).__name__}: {exc}"
            if not _typed(exc) and not self.store_failed(exc, disk_faults):
                raise
            if healthy and self.node.faults == faults and self.node.mode == cassandra.UP and \
                    self.store_faults() == disk_faults:
                raise Violation("a batch job fails only for a reason outside the sink",
                                f"{e.label}: commit raised {error}") from exc
        finally:
            self.armed = None
        if self._sealed_meanwhile(e):
            e.committed = True                         # a batch job's seal is its commit point
        # The job's commit ran in a one-shot worker of Spark's, which has exited now: whatever
        # still referenced a RocksDB handle it opened (a failed flush's iterators, in reference
        # cycles) goes with it, and so does the lock.
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

    def job_abort(self, job: Job) -> str:
        """A task failed for good: Spark aborts the job (its driver stays up)."""
        self.jobs.remove(job)
        messages = [job.inflight.winners[p] for p in sorted(job.inflight.winners)]
        with self.job_process(job.name):
            job.writer.abort(messages)
        return self.say(f"{job.name}: aborted by Spark")

    def job_process(self, name: str, flushing: bool = False):
        """What follows runs in batch job ``name``'s driver (``World.running``): every job's
        driver is on one machine of its own (clocks.py)."""
        return self.running(name, BATCH_JOBS_MACHINE if self.clocks.on else None, flushing)

    def job_crash(self, job: Job) -> str:
        self.jobs.remove(job)
        gc.collect()                                   # its process is gone, locks too
        return self.say(f"{job.name}: its driver died before the commit")
