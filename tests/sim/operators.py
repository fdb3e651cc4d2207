"""Operators: ``cassandra-wal recover`` run at any step, on a query's WAL, beside the live query
or after it stopped (issue 31, item 4).

The recover runs the real command (``recovery.cli.main.main(["recover", ...])``, the function the
``cassandra-wal`` entry point calls: its checks, its lock, ``recovery.recover.replay_wal``),
not a subprocess, with its output captured. What is drawn, from an RNG of its own
(``operators:<seed>``, so a world without operators draws what it drew before):

* which query's WAL (every WAL its checkpoint's pointers name), whatever the query is doing:
  live (its run holds a flusher, or not yet), or stopped;
* for a WAL on a store, the host it runs on: the query's driver host (the same working copy)
  or the other one (another working copy, whose lock sees nothing of the live run);
* ``--force`` (1 in 4 on a store; never drawn on a local WAL).

What the oracle holds it to (``docs/runbook.md``, "Recover", and ``recover --help``):

* a local WAL whose query's run holds it (its flusher has the RocksDB log open): refused, exit
  1, with an error naming the lock; nothing changed;
* a local WAL whose query is stopped or whose run has no flusher up yet, or any WAL on a store
  without ``--force``: it runs; with
  Cassandra up and nothing failing it exits 0, and every batch Spark had committed by then is
  written (as a drain must);
* without ``--force`` it never discards: a batch the live run sealed (or is staging) keeps its
  seal and segments (invariant 3), and once Spark commits it it is written (invariants 4 and
  6);
* ``--force`` beside a live run is the operator's own risk: the runbook says to add it "only
  once no run of the query is live anywhere". What the oracle allows then: the batch the run
  had in flight (staged or sealed, not yet committed by Spark) may be discarded; if Spark then
  commits it, its rows are lost, and the WAL must say so (block at that batch, naming it) and
  write nothing after it. Nothing else: no row of an uncommitted batch is ever written, and
  every batch committed before the recover is written by it.

Held back for code whose recover discarded on a local WAL without ``--force`` (drawn with
``CASSANDRA_WAL_SIM_OPERATORS=all``): recover on a local WAL beside a live run whose flusher is
not up (README.md, "Operators": what it found).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re

from . import cassandra
from .invariants import Violation, _unwritten

#: Operator worlds: unset or 1 (the default) draws them, holding back what the sink fails on
#: main (README.md, "Operators"); all: those too; 0: none.
ENV_OPERATORS = "CASSANDRA_WAL_SIM_OPERATORS"
SHARE = 4


def operators_setting() -> str:
    return os.environ.get(ENV_OPERATORS, "1")


def knows_force() -> bool:
    """The code under test's recover has ``--force`` (50d266b on): read from its tree, as
    ``patches.has_module`` reads modules (older code: recover always discards)."""
    import recovery.cli.recover_cmd

    with open(recovery.cli.recover_cmd.__file__) as f:
        return '"--force"' in f.read()


def leaves_uncommitted() -> bool:
    """The code under test's recover leaves what Spark never committed on a local WAL too,
    unless ``--force`` (older code discarded it there: held back, below)."""
    import recovery.cli.recover_cmd

    with open(recovery.cli.recover_cmd.__file__) as f:
        return "LEFT_NOTE" in f.read()


def knows_repair() -> bool:
    """The code under test has ``cassandra-wal repair`` (7692ecc on)."""
    from .patches import has_module

    return has_module("recovery.cli.repair_cmd")


class Operators:
    """The operator actions of :class:`tests.sim.world.World`."""

    def init_operators(self) -> None:
        self.orng = random.Random(f"operators:{self.seed}")
        setting = operators_setting()
        self.operators_on = setting != "0" and self.orng.randrange(SHARE) == 0
        self.operators_all = setting == "all"
        self.repairs = self.operators_on and knows_repair()
        self.forced: dict[int, str] = {}       # id() of executions a forced recover took -> WAL
        if self.operators_on:
            self.counts["operators: worlds"] += 1

    # -- the oracle's hooks -----------------------------------------------------------------------
    def forced_lost(self, location: str | None, owner: str | None = None) -> set[int]:
        """Batches of the WAL at ``location`` (of ``owner``, if named) that a forced recover
        beside the live run took and Spark then committed: lost, by the operator's choice."""
        return {e.batch for e in self.oracle.executions
                if e.committed and self.forced.get(id(e)) == location
                and (owner is None or e.owner == owner)}

    def block_allowed(self, where: str, reason: str) -> bool:
        if super().block_allowed(where, reason) or \
                self.changes.block_allowed(self, where, reason):      # a drop: changes.py
            return True
        if not self.forced:
            return False
        lost = self.forced_lost(self.root_location.get(where, where))
        found = re.search(r"batch (\d+)", reason)
        return found is not None and int(found.group(1)) in lost

    def after_loss(self, e) -> bool:
        """``e`` comes after a batch a forced recover took from its WAL: the WAL blocks
        there (or must), so ``e`` is never written."""
        if super().after_loss(e):
            return True
        if not self.forced:
            return False
        lost = {b for loc in set(self.forced.values()) for b in self.forced_lost(loc, e.owner)}
        return bool(lost) and e.batch > min(lost)

    def excused(self, e) -> bool:
        """``e`` is exempt from "every committed batch is written": a forced recover beside
        its live run may have discarded it before Spark committed it; or it waits behind a
        batch of its stream a dropped column hides, until an operator amends it (changes.py)."""
        return id(e) in self.forced or self.changes.held(self, e)

    def expects_block(self, flusher) -> bool:
        return super().expects_block(flusher) or bool(self.forced and self.forced_lost(
            flusher.wal.location)) or self.changes.expects_block(flusher)

    # -- the action -------------------------------------------------------------------------------
    def operator_recover(self) -> str:
        """An operator runs ``cassandra-wal recover`` on a query's WAL."""
        rng = self.orng
        candidates = [q for q in self.queries if q.runs and q.refused is None]
        if not candidates:
            return self.say("operator: no query to recover")
        q = rng.choice(candidates)
        wals, why = self._wals_of(q, "no WAL yet")
        if not wals:
            return why
        location = rng.choice(wals)
        on_store = "://" in location
        live = q.run is not None
        holds = live and location in q.run.flushers
        if not on_store and live and not holds and not self.operators_all \
                and not leaves_uncommitted():
            return self.say(f"operator: would recover {q.owner}'s WAL beside its live run "
                            f"without a flusher (held back: README.md, \"Operators\")")
        if self.changes.held_back and self.changes.pending_drop(
                self, self.wal_owners.get(location) or {q.owner}):
            return self.say(f"operator: would recover {q.owner}'s WAL, which a dropped column "
                            f"blocks (held back: README.md, \"Changes\")")
        force = on_store and rng.random() < 0.25 and knows_force()
        host = None
        if on_store:
            from .store import HOSTS

            host = q.host if rng.random() < 0.5 else HOSTS[1 - HOSTS.index(q.host)]
        argv = ["recover", location, "--checkpoint", q.checkpoint.path]
        if force:
            argv.append("--force")
        what = (f"operator: cassandra-wal recover of {q.owner}'s WAL"
                f"{' on ' + host if host else ''}{' --force' if force else ''}, "
                f"the query {'live' if live else 'stopped'}")
        inflight = self._inflight_of(q) if live else []
        node_up, faults = self.node.mode == cassandra.UP, self.node.faults
        store_faults = self.store_faults()
        before = os.environ.get("CASSANDRA_WAL_WORKING_DIR")
        out, err = io.StringIO(), io.StringIO()
        try:
            if host is not None:
                from .store import on_host

                on_host(self, host)
            with self.running(f"operator recover {self.step}",
                              self.clocks.driver(q.name) if self.clocks.on else None,
                              flushing=True), \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                from recovery.cli.main import main

                code = main(argv)
        finally:
            if before is not None:
                os.environ["CASSANDRA_WAL_WORKING_DIR"] = before
        said = (err.getvalue().strip().splitlines() or out.getvalue().strip().splitlines()
                or [""])[-1]
        self.say(f"{what}: exit {code}: {said[:200]}")
        where = f"store, {'same host' if host == q.host else 'other host'}" if on_store else "local"
        kind = f"{where}, {'live' if live else 'stopped'}{', --force' if force else ''}"
        calm = node_up and self.node.mode == cassandra.UP and self.node.faults == faults \
            and self.store_calm_since(store_faults)
        if holds and (not on_store or host == q.host):    # the lock of the same copy
            self.counts[f"operators: recover, {kind}: refused"] += 1
            if code != 1 or "open for writing by another process" not in err.getvalue():
                raise Violation("recover is refused while a query holds its local WAL",
                                f"{what}: exit {code}, said {err.getvalue().strip()!r}")
            return "refused"
        if code == 1 and not calm:
            self.counts[f"operators: recover, {kind}: failed"] += 1
            return "failed"                  # Cassandra or the store away: said, exit 1
        if code == 2 and "records no target" in err.getvalue():
            # a WAL no batch recorded a target in yet: nothing to write, said plainly
            self.counts[f"operators: recover, {kind}: no target"] += 1
            return "no target"
        owners = self.wal_owners.get(location) or {q.owner}
        if code == 3 and re.search(r"batch \d+ writes .+, dropped after", err.getvalue()) \
                and "cassandra-wal amend" in err.getvalue() \
                and self.changes.pending_drop(self, owners):
            # a batch a drop hides: recover writes up to it and says so (README.md, "Changes")
            self.counts[f"operators: recover, {kind}: blocked on a drop"] += 1
            return "blocked on a drop"
        if code != 0:
            if calm and (code != 3 or not self._may_block(location)):
                raise Violation("recover runs when nothing holds the WAL",
                                f"{what}, with Cassandra and the store up: exit {code}: "
                                f"{err.getvalue().strip()!r}")
            self.counts[f"operators: recover, {kind}: failed"] += 1
            return "failed"
        self.counts[f"operators: recover, {kind}: done"] += 1
        discarded = re.search(r"discarded (\d+)", out.getvalue())
        if force and inflight and (discarded is None or int(discarded.group(1)) > 0):
            self.forced.update((id(e), location) for e in inflight)   # it may have taken them
        if calm:
            owners = self.wal_owners.get(location) or {q.owner}
            unwritten = _unwritten(self, owners)
            if unwritten:
                e, missing = unwritten[0]
                raise Violation("recover writes every batch Spark committed",
                                f"after {what}, {e.label} is committed but {len(missing)} "
                                f"of {len(e.expected)} rows never reached Cassandra")
        return "recovered"

    def _wals_of(self, q, none: str) -> tuple[list[str], str | None]:
        """Every WAL ``q``'s pointers name, sorted; or none and what the operator was told
        (the store away: pointers unreadable; or ``none``)."""
        faults = self.store_faults()
        try:
            wals = sorted(self.wals_at_end(q))
        except Exception as exc:   # noqa: BLE001 - the store away: the operator tries later
            if not self.store_failed(exc, faults):
                raise
            return [], self.say(f"operator: {q.owner}'s pointers unreadable: {exc}")
        if not wals:
            return [], self.say(f"operator: {q.owner} has {none}")
        return wals, None

    def _may_block(self, location: str) -> bool:
        return bool(self.lost_batches(location)) or bool(self.forced_lost(location))

    @staticmethod
    def _inflight_of(q) -> list:
        """The executions ``q``'s run has in flight (staged or sealed, Spark has not committed
        them): what a forced recover beside it may discard."""
        out = []
        if q.run.inflight is not None:
            out.append(q.run.inflight.execution)
        if q.run.call is not None:
            out += [c.execution for c in q.run.call.calls if c.execution is not None]
        return [e for e in out if not e.committed]

    # -- repair -----------------------------------------------------------------------------------
    def operator_repair(self) -> str:
        """An operator runs ``cassandra-wal repair --from K`` on a stopped query's WAL (its
        checkpoint local; on a store it must refuse); sometimes over a stateful checkpoint
        (a ``state/`` folder: refused), sometimes with ``--rewrite``. After it, Spark runs K..
        again from the source: the sim's checkpoint has lost ``offsets/K..`` and
        ``commits/K..``, so the next run plans K anew, with rows drawn again."""
        rng = self.orng
        if self.disk.kind is not None:
            return self.say("operator: the disk is full: room first, the repair later")
        candidates = [q for q in self.queries if q.run is None and q.runs and q.refused is None]
        if not candidates:
            return self.say("operator: no stopped query to repair")
        q = rng.choice(candidates)
        wals, why = self._wals_of(q, "no WAL to repair")
        if not wals:
            return why
        location = wals[0]
        offsets = q.checkpoint._ids("offsets")
        batch = rng.choice(offsets) if offsets and rng.random() < 0.9 else rng.randrange(5)
        rewrite = rng.random() < 0.5
        stateful = "://" not in q.checkpoint.path and rng.random() < 0.15
        argv = ["repair", location, "--checkpoint", q.checkpoint.path, "--from", str(batch)]
        if rewrite:
            argv.append("--rewrite")
        what = (f"operator: cassandra-wal repair of {q.owner}'s WAL --from {batch}"
                f"{' --rewrite' if rewrite else ''}{' (a stateful query)' if stateful else ''}")
        state = os.path.join(q.checkpoint.path, "state", "0")
        if stateful:
            os.makedirs(state)
        before = self._repair_view(q, wals)
        out, err = io.StringIO(), io.StringIO()
        try:
            with self.running(f"operator repair {self.step}", None), \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                from recovery.cli.main import main

                code = main(argv)
        finally:
            if stateful:
                import shutil

                shutil.rmtree(os.path.dirname(state))
        said = (err.getvalue().strip().splitlines() or [""])[-1]
        self.say(f"{what}: exit {code}" + (f": {said[:200]}" if code else ""))
        on_store = "://" in location or "://" in q.checkpoint.path
        if code != 0:
            why = "store" if on_store else "stateful" if stateful else "checks"
            self.counts[f"operators: repair refused ({why})"] += 1
            if self._repair_view(q, wals) != before:
                raise Violation("a refused repair changes nothing",
                                f"{what}: exit {code}, yet the WAL or the checkpoint changed")
            if stateful and not on_store and "state/" not in err.getvalue() and code != 2:
                raise Violation("repair refuses a stateful query's checkpoint",
                                f"{what}: exit {code}: {err.getvalue().strip()!r}")
            return "refused"
        if on_store or stateful:
            raise Violation("repair refuses a store and a stateful checkpoint",
                            f"{what}: it ran")
        self.counts["operators: repair done" + (" --rewrite" if rewrite else "")] += 1
        # Spark re-runs K.. from the source: what it had committed of them is no longer
        # expected in Cassandra (it may be there, written before: --rewrite).
        for e in self.oracle.executions:
            if q.owns(e.owner) and e.batch >= batch:
                self.forced[id(e)] = "repaired"
        return "repaired"

    def _repair_view(self, q, wals: list[str]) -> tuple:
        """What a refused repair must leave as it was: the WALs' staged files and seals, and
        Spark's offsets and commits."""
        return (tuple(tuple(self.staged_files(w)) for w in wals if "://" not in w),
                tuple(q.checkpoint._ids("offsets")), tuple(q.checkpoint._ids("commits")))
