"""The machines of a world and their clocks: the sink's wall clocks differ between hosts and
step, its monotonic clocks are each machine's own, and Cassandra's is the world's.

In a clock world (half the worlds: :data:`ENV_CLOCKS`) every process the sink runs in
is on a machine: a query's driver (its commit worker seals there, its flusher flushes there;
a restart may bring it back on a new machine, 3 in 10), the machine of the batch jobs' drivers,
and two executors on which the flush tasks of ``wal.flush.mode=executors`` run (a task may run
on the driver's machine too, as a local Spark's or a worker process does). Each machine's wall
clock is off the world's by an offset drawn here: drivers by up to minutes, executors by up to
two hours; at any step a driver's clock may step (NTP) by up to five minutes either way. Each
machine's monotonic clock has an origin of its own (it is the world's clock plus that origin:
it never steps), and a boot id of its own (:func:`wal.clock.machine_id`). The node's clock,
which expires cells, is the world's.

Every draw comes from an RNG of its own (``clocks:<seed>``), as the store's and the lists' do:
a world without clocks draws from the world's RNG exactly what it drew before (its machine is
none: no offset, no origin).

:data:`ENV_CLOCKS`: unset, clock worlds are drawn, and a row whose TTL ran out before it was
written must be written as tombstones, when the code under test measures a batch's age on one
host (it has ``recovery.cql.batch_age``); older code skipped such rows, and gets neither (the seeds of
README.md replay as before). ``1``: both, for older code too; ``all``: every world a clock
world; ``0``: neither.

What the invariants hold the sink to (``oracle.py``, ``Oracle.timing``): a row's TTL counts
from its seal, so the second a write of it expires (the node's second it applied the write,
plus the TTL sent) is the true instant of the seal plus the TTL, to within 2 s (whole seconds
on both clocks) plus how far the clock of the driver process that writes had moved from the
sealing one's when that process first took the batch in hand (``docs/guarantees.md``, the skew
tolerated); a row written as tombstones must have expired by then, to within the same; an
executor's clock counts for nothing.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager

#: Clock worlds, and tombstones for rows that expired while pending (module docstring).
ENV_CLOCKS = "CASSANDRA_WAL_SIM_CLOCKS"
SHARE = 2
S = 1_000_000
DRIVER_OFFSETS_S = (0, 0, 0.4, -0.7, 3, -5, 40, -45, 200, -170)
EXECUTOR_OFFSETS_S = (0, 7200, -7200, 1800, -1800, 300, -300)
STEPS_S = (1, -1, 12, -12, 70, -70, 300, -300)
EXECUTORS = ("exec-1", "exec-2")
BATCH_JOBS_MACHINE = "jobs"           # the machine of the batch jobs' driver
#: The slack of the timing checks: whole seconds on the sealing clock and on the node's.
ROUNDING_S = 2.0


def measures_on_one_host() -> bool:
    """The code under test measures a batch's age on one host, and writes a row that expired
    while pending as tombstones (issue 31, item 6)."""
    from .patches import has_module

    return has_module("recovery.cql.batch_age") or has_module("cql.clock")   # cql.clock: its older name


def clocks_on() -> bool:
    """Clock worlds are drawn, and expired rows must be tombstones (:data:`ENV_CLOCKS`)."""
    setting = os.environ.get(ENV_CLOCKS, "")
    return setting in ("1", "all") or (setting != "0" and measures_on_one_host())


class Clocks:
    def __init__(self, seed: int):
        self.rng = random.Random(f"clocks:{seed}")
        self.tombstones = clocks_on()
        every = os.environ.get(ENV_CLOCKS) == "all"
        self.on = self.tombstones and (every or self.rng.randrange(SHARE) == 0)
        self.current: str | None = None        # the machine running the sink's code now
        self.offsets: dict[str, int] = {}      # machine -> wall clock - world's clock (µs)
        self.origins: dict[str, int] = {}      # machine -> monotonic clock - world's (µs)
        self.machines_of: dict[str, int] = {}  # query name -> how many machines it had
        if self.on:
            for name in EXECUTORS:
                self._new(name, EXECUTOR_OFFSETS_S)
            self._new(BATCH_JOBS_MACHINE, DRIVER_OFFSETS_S)

    def _new(self, name: str, offsets) -> str:
        self.offsets[name] = int((self.rng.choice(offsets) + self.rng.random()) * S)
        self.origins[name] = self.rng.randrange(10**6) * S
        return name

    # -- which machine runs what ---------------------------------------------------------------
    def driver(self, query: str, moved: bool = False) -> str | None:
        """The machine of ``query``'s driver (a new one if it ``moved``)."""
        if not self.on:
            return None
        if query not in self.machines_of or moved:
            self.machines_of[query] = self.machines_of.get(query, 0) + 1
            return self._new(f"{query}@{self.machines_of[query]}", DRIVER_OFFSETS_S)
        return f"{query}@{self.machines_of[query]}"

    def restart(self, query: str) -> str:
        """A run of ``query`` starts: its first on a machine of its own, a later one 3 in 10
        on a new machine. What the schedule says of it."""
        if not self.on:
            return ""
        if query not in self.machines_of:
            machine = self.driver(query)
            return f" on {machine} (clock {self.offsets[machine] / S:+.1f}s)"
        if self.rng.random() >= 0.3:
            return ""
        machine = self.driver(query, moved=True)
        return f" on a new machine, {machine} (clock {self.offsets[machine] / S:+.1f}s)"

    def executor(self, driver: str | None) -> str | None:
        """Where a flush task runs: an executor, or the driver's machine (3 in 10)."""
        if not self.on:
            return None
        return driver if self.rng.random() < 0.3 else self.rng.choice(EXECUTORS)

    @contextmanager
    def on_machine(self, machine: str | None):
        before, self.current = self.current, machine
        try:
            yield
        finally:
            self.current = before

    # -- what the sink reads -------------------------------------------------------------------
    def wall_offset(self, machine: str | None = None) -> int:
        machine = self.current if machine is None else machine
        return self.offsets.get(machine, 0) if machine else 0

    def mono_origin(self) -> int:
        return self.origins.get(self.current, 0) if self.current else 0

    def machine_id(self) -> str:
        return f"sim:{self.current or 'world'}"

    # -- steps -----------------------------------------------------------------------------------
    def maybe_step(self) -> str | None:
        """At a step of the schedule, a driver's clock may step (1 in 25): a line, or None."""
        if not self.on or self.rng.random() >= 0.04:
            return None
        drivers = sorted(m for m in self.offsets if m not in EXECUTORS)
        machine = self.rng.choice(drivers)
        step = int(self.rng.choice(STEPS_S) * S)
        self.offsets[machine] += step
        return f"clock of {machine} steps {step / S:+g}s (now {self.offsets[machine] / S:+.1f}s)"

    def describe(self) -> str:
        return "clocks: " + ", ".join(f"{m} {o / S:+.1f}s" for m, o in sorted(self.offsets.items()))
