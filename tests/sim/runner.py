"""One schedule from one seed: pick each step's action from the world's state with the seeded
RNG, run it against the real sink, check the invariants, and at the end recover and check
that everything committed was written. A failure carries the seed, the schedule so far, the
invariant broken and the command that replays it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

from . import cassandra
from .invariants import Violation, check_step
from .patches import Current, Patches
from .world import World

ENV_SEED = "CASSANDRA_WAL_SIM_SEED"
ENV_WORKING_DIR = "CASSANDRA_WAL_WORKING_DIR"     # wal.remote's: where working copies live
WARM_UP = (-1, -2, -3)
TESTS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Outcome:
    seed: int
    steps: int
    invariant: str | None = None
    detail: str = ""
    trace: list[str] = field(default_factory=list)
    error: str = ""                    # the traceback of an unexpected exception
    counts: dict = field(default_factory=dict)   # what the world drew (World.counts)

    @property
    def ok(self) -> bool:
        return self.invariant is None


def actions(w: World) -> list[tuple[float, object, tuple]]:
    """Every action possible now, with its weight."""
    out = []

    def add(weight, fn, *args):
        out.append((weight, fn, args))

    for q in w.queries:
        if q.refused is not None:
            continue
        if q.run is None:
            add(5.0 if q.runs == 0 else 2.5, w.start, q)
            if w.can_reset(q):
                add(0.4, w.reset_checkpoint, q)
            continue
        inflight = q.run.inflight
        if q.writers is not None:
            _function_actions(w, q, add)
        elif inflight is None:
            add(4.0, w.begin_batch, q)
        else:
            if inflight.pending:
                add(5.0, _query_task, w, q)
            elif not inflight.sealed:
                add(5.0, w.commit, q)
            else:
                add(5.0, w.spark_commit, q)
            add(1.5, _whole_batch, w, q)
        if q.run.flushers:
            add(1.2, w.drain, q)
        elif q.run.awaiting_pointer:
            add(1.0, w.pointer_found, q)
        add(0.5, w.crash, q)
        add(0.25, w.stop, q)
    if w.zombies:
        add(0.5, _zombie, w)
    if w.jobs_on:
        if len(w.jobs) < 3:
            add(1.5 if w.jobs else 3.0, w.job_start)
        for job in w.jobs:
            if job.inflight.pending:
                add(3.0, _job_task, w, job)
            else:
                add(3.0, w.job_commit, job)
            add(0.15, w.job_crash, job)
            add(0.1, w.job_abort, job)
    if w.node.mode == cassandra.UP:
        add(0.35, w.set_node, cassandra.DOWN)
        add(0.2, w.set_node, cassandra.FLAKY)
    else:
        add(1.2, w.set_node, cassandra.UP)
    if w.store is not None:
        if w.store.mode == "up":
            add(0.3, w.set_store, "down")
            add(0.3, w.set_store, "flaky")
        else:
            add(1.2, w.set_store, "up")
        if w.zombie_commits:
            add(1.0, _zombie_commit, w)
    add(0.6, _clock_jump, w)
    if w.operators_on:                     # operators.py
        add(0.8, w.operator_recover)
        if w.repairs:
            add(0.3, w.operator_repair)
    if w.changes.schema_eligible(w) and w.node.mode != cassandra.UP and \
            w.changes.pending_streams(w):                           # changes.py
        add(0.4, w.changes.schema_step, w)
    if w.changes.schema_changes and w.changes.drop_blocks(w):
        add(1.0, w.changes.operator_amend, w)
    if w.disk.on:                          # disk.py
        add(1.0, w.disk_room) if w.disk.kind is not None else add(0.3, w.disk_fill)
    return out


def _function_actions(w: World, q, add) -> None:
    """A foreachBatch query's next steps (tests/sim/foreach.py): Spark starts a batch; the
    function calls its next writer; that writer's tasks; its seal (or its job failing);
    Spark's commit once the function returned."""
    call = q.run.call
    if call is None:
        add(4.0, w.begin_batch, q)
        return
    current = call.current
    if current is not None and current.inflight.pending:
        add(5.0, _writer_task, w, q)
    elif current is not None:
        add(5.0, w.foreach_seal, q)
    elif call.index < len(call.calls):
        add(5.0, w.foreach_call, q)
    else:
        add(5.0, w.spark_commit, q)
    add(1.5, _whole_function, w, q)


def _writer_task(w: World, q):
    inflight = q.run.call.current.inflight
    return w.task(f"{q.owner}/{q.run.call.current.writer.table}", inflight,
                  w.rng.randrange(len(inflight.pending)))


def _whole_function(w: World, q):
    """The rest of the function's call and Spark's commit, nothing else happening meanwhile."""
    while q.run is not None and q.run.call is not None:
        call = q.run.call
        current = call.current
        if current is not None and current.inflight.pending:
            if _writer_task(w, q) == "store failed":
                break
        elif current is not None:
            w.foreach_seal(q)
        elif call.index < len(call.calls):
            w.foreach_call(q)
        else:
            w.spark_commit(q)
            break
    return "batch"


def _query_task(w: World, q):
    inflight = q.run.inflight
    return w.task(q.owner, inflight, w.rng.randrange(len(inflight.pending)))


def _job_task(w: World, job):
    return w.task(job.name, job.inflight, w.rng.randrange(len(job.inflight.pending)))


def _zombie(w: World):
    return w.zombie(w.rng.randrange(len(w.zombies)))


def _zombie_commit(w: World):
    return w.zombie_commit(w.rng.randrange(len(w.zombie_commits)))


def _clock_jump(w: World):
    return w.advance(w.rng.choice((1, 1, 5, 30, 120)))


def _whole_batch(w: World, q):
    """The rest of the batch in flight, with nothing else happening meanwhile."""
    while q.run is not None and q.run.inflight is not None:
        inflight = q.run.inflight
        if inflight.pending:
            if _query_task(w, q) == "store failed":
                break            # the store is away: Spark's retries come as other steps
        elif not inflight.sealed:
            w.commit(q)
        else:
            w.spark_commit(q)
            break
    return "batch"


def describe(fn, args) -> str:
    """An action as the schedule shows it: ``q1: spark_commit``."""
    who = next((getattr(a, "owner", None) or getattr(a, "name", None) for a in args
                if hasattr(a, "owner") or hasattr(a, "name")), None)
    name = fn.__name__.strip("_").replace("_", " ")
    return f"{who}: {name}" if who else name


def choose(w: World):
    options = actions(w)
    total = sum(weight for weight, _, _ in options)
    pick = w.rng.random() * total
    for weight, fn, args in options:
        pick -= weight
        if pick < 0:
            return fn, args
    return options[-1][1], options[-1][2]


def run_seed(seed: int, verbose: bool = False, base: str | None = None) -> Outcome:
    """Run schedule ``seed``; patches must be installed (:func:`installed`)."""
    import random as global_random

    base = base or default_base(kept=verbose)
    root = os.path.join(base, f"seed-{seed}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    old_home = os.environ.get("HOME")
    old_working, old_tmp = os.environ.get(ENV_WORKING_DIR), tempfile.tempdir
    global_random.seed(seed)          # tenacity's jitter: replayable too
    w = World(seed, root, verbose=verbose)
    Current.world = w
    os.environ["HOME"] = w.home       # batch jobs' default WAL: ~/.cassandra_wal/<ks>.<table>
    # A WAL on a store: the driver hosts' working copies and the tasks' spools, in the world.
    os.environ[ENV_WORKING_DIR] = os.path.join(root, "hosts", "host-a")
    tempfile.tempdir = os.path.join(root, "tmp")
    os.makedirs(tempfile.tempdir)
    steps = w.rng.randint(8, 32)
    outcome = Outcome(seed, steps)
    try:
        for _ in range(steps):
            w.step += 1
            w.node.step = w.step
            w.clock_us += w.rng.randrange(1_000, 20_000)
            stepped = w.clocks.maybe_step()        # a driver's clock stepping (NTP): clocks.py
            if stepped:
                w.say(stepped)
            fn, args = choose(w)
            w.doing = describe(fn, args)
            fn(*args)
            check_step(w)
            w.doing = "the flusher's periodic wake"
            if w.background():
                check_step(w)
        w.finish()
    except Violation as v:
        outcome.invariant, outcome.detail = v.invariant, v.detail
        w.say(f"{w.doing}: broke the invariant")
    except Exception as exc:   # noqa: BLE001 - an unexpected error is a finding too
        outcome.invariant = "the sink raises only errors it means to"
        outcome.detail = f"{type(exc).__name__}: {exc}"
        outcome.error = traceback.format_exc()
        w.say(f"{w.doing}: raised")
    finally:
        _close(w)
        Current.world = None
        if old_home is not None:
            os.environ["HOME"] = old_home
        tempfile.tempdir = old_tmp
        if old_working is None:
            os.environ.pop(ENV_WORKING_DIR, None)
        else:
            os.environ[ENV_WORKING_DIR] = old_working
        if not verbose:
            shutil.rmtree(root, ignore_errors=True)
    if verbose:
        print(f"the schedule's WALs and checkpoints are kept in {root}", flush=True)
    outcome.trace = w.trace
    outcome.counts = dict(w.counts)
    return outcome


def _close(w: World) -> None:
    """Release every RocksDB log still open (a schedule that failed mid-way)."""
    for q in w.queries:
        for flusher in q.run.flushers.values() if q.run is not None else ():
            try:
                flusher.wal_log.close()
            except Exception:   # noqa: BLE001 - best effort on the way out
                pass


def default_base(kept: bool = False) -> str:
    """The folder for the schedules' WALs and checkpoints: on a tmpfs when there is one
    (fsyncs cost nothing there). This process's own, removed when it exits; a replayed
    schedule's (``kept``) stays for a look at its WAL."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(parent, "cassandra-wal-sim-replay" if kept
                        else f"cassandra-wal-sim-{os.getpid()}")


def _remove_base() -> None:
    shutil.rmtree(default_base(), ignore_errors=True)


def code_root() -> str:
    import wal

    return os.path.dirname(os.path.dirname(os.path.abspath(wal.__file__)))


def replay_command(seed: int) -> str:
    code = code_root()
    env = f"{ENV_SEED}={seed}"
    if code != TESTS_ROOT:
        env = f"PYTHONPATH={code} {env}"
    return (f"cd {code} && {env} {sys.executable} -m pytest {TESTS_ROOT}/tests/sim "
            f"-p no:cacheprovider -s")


def failure_text(outcome: Outcome) -> str:
    lines = [f"seed {outcome.seed} broke the invariant \"{outcome.invariant}\":",
             f"  {outcome.detail}", "schedule so far:"]
    lines += [f"  {line}" for line in outcome.trace]
    if outcome.error:
        lines += ["traceback:", outcome.error]
    lines.append(f"replay: {replay_command(outcome.seed)}")
    return "\n".join(lines)


_patches: Patches | None = None
_since_freeze = 0
FREEZE_EVERY = 200


def installed() -> None:
    """Install the seams once in this process (also the worker processes' initializer)."""
    global _patches
    if _patches is None:
        import logging

        _patches = Patches().install()
        atexit.register(_remove_base)
        # The sink logs every deferred flush: thousands of schedules of outages would drown
        # the output (a replayed seed shows the schedule itself).
        logging.getLogger().setLevel(logging.CRITICAL)
        for seed in WARM_UP:       # first use imports and caches the rest of the world
            run_seed(seed)
        _freeze()


def _freeze() -> None:
    """What survives a collection now is the imported world (modules, caches): frozen, it is
    not walked again by the collection after each simulated process death. Repeated every
    few hundred schedules, since a rare path may import more (pandas, through pyarrow)."""
    import gc

    global _since_freeze
    gc.collect()
    gc.freeze()
    _since_freeze = 0


def run_quiet(seed: int) -> Outcome:
    """A worker's run of one seed: the schedule travels back only when it failed."""
    installed()
    global _since_freeze
    _since_freeze += 1
    if _since_freeze >= FREEZE_EVERY:
        _freeze()
    outcome = run_seed(seed)
    if outcome.ok:
        outcome.trace = []
    return outcome


def summary(failed: list[Outcome], total: int) -> str:
    """The first failure in full, then every failing seed by invariant."""
    by_invariant: dict[str, list[int]] = {}
    for o in failed:
        by_invariant.setdefault(o.invariant, []).append(o.seed)
    lines = [failure_text(failed[0]), "", f"{len(failed)} of {total} schedules failed:"]
    lines += [f"  {len(seeds)}x \"{inv}\": seeds {', '.join(map(str, seeds[:20]))}"
              + (" ..." if len(seeds) > 20 else "") for inv, seeds in by_invariant.items()]
    return "\n".join(lines)
