"""How long ago a batch was sealed, measured on one host: what its rows' TTLs count down from.

A row's TTL counts from its batch's seal (``docs/guarantees.md``, "TTLs count from the seal"):
every write of it sends the TTL less the batch's age, so that Cassandra, which expires a cell
at the second it applies the write plus the TTL sent, expires every write of the row at the
seal's second plus its TTL. That age has to be measured on one clock, or the skew between two
clocks is added to it.

``sealed_at_us`` is the wall clock of the commit worker, on the driver's host. The driver
process that flushes reads its own wall clock once, when it first takes the batch in hand
(:func:`measure`, never less than the seal: a clock behind gives an age of 0, not less), and
counts on from there on its monotonic clock, which no step of the wall clock moves. What writes
the rows gets that measure (:class:`BatchAge`) and never reads its own wall clock for a TTL: a
flush task on an executor, or a worker process, whose clock runs ahead of or behind the
driver's writes the TTL left that the driver would.

A :class:`BatchAge` names the machine whose monotonic clock it was read on (the kernel's boot
id). A process on that machine (the driver's flush worker processes; the executors of a local
Spark) counts on from the driver's reading; a process elsewhere (an executor on another host:
monotonic clocks of two machines cannot be compared) counts from when it received the measure
(:meth:`BatchAge.received`), so the time between the two, a flush task waiting for a free
executor after the driver started its job, is not counted: a row may live that much longer.

What no measure on one host removes: a step of the driver host's wall clock between the seal
and the moment a driver process first takes the batch in hand (a driver restarted on a host
whose clock differs, or whose clock was stepped while it was down) moves the row's expiry by
that step (earlier if the clock moved ahead, later if it moved back, by no more than the
batch's age then).
"""

from __future__ import annotations

from dataclasses import dataclass

from wal import clock as wal_clock


@dataclass(frozen=True)
class BatchAge:
    """A batch's age as the driver measured it: ``age_us`` microseconds after its seal (at
    ``sealed_at_us``, the sealing host's wall clock) when the monotonic clock of ``machine``
    read ``mono_ns``. Pickled into flush tasks and worker processes."""

    sealed_at_us: int
    age_us: int
    mono_ns: int
    machine: str

    def age_at(self, mono_ns: int) -> int:
        """The age, in microseconds, when this machine's monotonic clock reads ``mono_ns``."""
        return self.age_us + max(0, mono_ns - self.mono_ns) // 1000

    def now_s(self, mono_ns: int) -> int:
        """The second it is then on the clock that sealed the batch (the seal's second plus
        the whole seconds since, as :meth:`recovery.cql.upsert.Upserter._expiring` counts them)."""
        return (self.sealed_at_us + self.age_at(mono_ns)) // 1_000_000

    def rebased(self, mono_ns: int) -> "BatchAge":
        """The same measure, read again at ``mono_ns`` (a flush job's start: a process on
        another machine counts from there)."""
        return BatchAge(self.sealed_at_us, self.age_at(mono_ns), mono_ns, self.machine)

    def received(self, machine: str | None = None, mono_ns: int | None = None) -> "BatchAge":
        """This measure as a process on ``machine`` (default: this one) counts it on: as it is
        on the machine that read it; elsewhere, from now (``mono_ns``) on."""
        machine = wal_clock.machine_id() if machine is None else machine
        if machine == self.machine:
            return self
        return BatchAge(self.sealed_at_us, self.age_us,
                        wal_clock.monotonic_ns() if mono_ns is None else mono_ns, machine)


def measure(sealed_at_us: int, wall_us: int | None = None, mono_ns: int | None = None,
            machine: str | None = None) -> BatchAge:
    """The age of a batch sealed at ``sealed_at_us``, on this process's wall clock, now (never
    negative: a clock behind the one that sealed gives 0)."""
    wall_us = wal_clock.now_us() if wall_us is None else wall_us
    return BatchAge(sealed_at_us, max(0, wall_us - sealed_at_us),
                    wal_clock.monotonic_ns() if mono_ns is None else mono_ns,
                    wal_clock.machine_id() if machine is None else machine)
