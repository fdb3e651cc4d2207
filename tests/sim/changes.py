"""What users change between runs of a stream: its table, or its ``wal.path`` (issue 31, items
1 and 2), possibly while batches are pending.

In a change world (one in four: :data:`ENV_CHANGES`) a data source's stream, at a restart,
may (4 in 10 restarts) come back with

* **another table**: the twin of its own (``t2`` for ``t``: the same columns, a table of its
  own in the simulated node), or back to its own. Every committed batch must land in the table
  it was sealed for (a seal carries its table: ``recovery.target``), so a batch staged for
  ``t`` and written after the restart is in ``t``, never in ``t2``: the oracle keys each
  expected write by table, and a write to another table is one no sealed row explains;
* **another ``wal.path``**: a new explicit one, back to one it used before (in this
  checkpoint's life), or from explicit to the default (under the checkpoint). The sink refuses
  the move, before anything is staged, while the old WAL holds committed batches not written
  (``wal/move.py``): that refusal must be an ``OptionError`` on ``wal.path``, only when the
  old WAL has such batches, leaving the new WAL as it was; the user then does what it says
  (restarts with the old ``wal.path``, and moves later). The registry reads the pointers at
  every progress event and stops the flusher of a WAL the run moved away from (older code
  did not: its flusher stays on the old WAL, as it did then). Across a move a later batch
  never loses to an earlier one: the committed batches of a stream are sealed at rising
  timestamps (:func:`check_rising`).

Half the changes come with the node down or flaky across the restart, so that batches are
pending when it starts. Every draw comes from an RNG of its own (``changes:<seed>``): a world
without changes draws from the world's RNG exactly what it drew before.

:data:`ENV_CHANGES`: unset, table changes are drawn when the code under test has a seal that
carries its table (``Target.is_cluster_of``), moves when it has ``wal.move``; ``1`` both, for
older code too; ``tables`` or ``moves``: only that kind, for older code too; ``all`` every world
a change world; ``0`` none.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections import Counter

from . import cassandra
from .invariants import Violation
from .patches import has_module

ENV_CHANGES = "CASSANDRA_WAL_SIM_CHANGES"
SHARE = 4
TWIN = "2"                      # t2 is t's twin: the same columns, another table
MOVE_REFUSED = "Moving now would leave them behind"


def seals_carry_table() -> bool:
    """The code under test writes a pending batch to the table it was sealed for (issue 31,
    item 1: b622864)."""
    try:
        from recovery.target import Target
    except ImportError:
        return False
    return hasattr(Target, "is_cluster_of")


def follows_moves() -> bool:
    """The code under test follows a move of ``wal.path`` (issue 31, item 2: 764e76b)."""
    return has_module("wal.move")


def twin(table: str) -> str:
    return table[:-len(TWIN)] if table.endswith(TWIN) else table + TWIN


class Changes:
    def __init__(self, seed: int, counts: Counter):
        self.rng = random.Random(f"changes:{seed}")
        setting = os.environ.get(ENV_CHANGES, "")
        forced = setting in ("1", "all", "tables", "moves")
        self.tables = setting not in ("0", "moves") and (forced or seals_carry_table())
        self.moves = setting not in ("0", "tables") and (forced or follows_moves())
        self.follow = follows_moves()
        self.on = (self.tables or self.moves) and \
            (setting == "all" or self.rng.randrange(SHARE) == 0)
        self.counts = counts                  # the world's tally (World.counts)
        self.used: dict[tuple[str, int], list[str | None]] = {}   # (query, generation) -> paths
        self.moving: dict[str, str | None] = {}   # query -> the wal.path it moves away from
        self.moved = False                        # a move or a table change happened

    # -- at a restart ----------------------------------------------------------------------------
    def at_restart(self, w, q) -> None:
        """``q`` (a data source's stream) starts again: maybe with another table or
        ``wal.path``, maybe with the node down or flaky across the restart."""
        used = self.used.setdefault((q.name, q.generation), [q.options.wal_path])
        if q.options.wal_path not in used:
            used.append(q.options.wal_path)
        if q.name in self.moving and self._arrived(w, q):
            del self.moving[q.name]           # the move went through (or was given up)
        if not self.on or q.writers is not None or q.runs == 0 or q.invalid is not None or \
                self.rng.random() >= 0.4:
            return
        kinds = (["table"] if self.tables else []) + (["wal"] if self.moves and
                                                      w.store is None else [])
        if not kinds:
            return
        kind = self.rng.choice(kinds)
        if kind == "table":
            table = twin(q.options.table)
            q.options = dataclasses.replace(q.options, table=table)
            self.count(f"table changed to {table}")
            w.say(f"{q.owner}: the user restarts it with table={table}")
        else:
            old = q.options.wal_path
            choices = ["new"] + (["default"] if old is not None else []) + \
                (["back"] if any(p != old for p in used) else [])
            how = self.rng.choice(choices)
            if how == "new":
                new = os.path.join(w.root, f"wal-{q.name}g{q.generation}-{len(used)}")
            elif how == "default":
                new = None
            else:
                new = self.rng.choice([p for p in used if p != old])
            q.options = dataclasses.replace(q.options, wal_path=new)
            self.moving.setdefault(q.name, old)     # a move not made yet: from where it was
            self.count(f"wal.path moved: {how}")
            w.say(f"{q.owner}: the user restarts it with wal.path="
                  f"{new.rsplit('/', 1)[-1] if new else '(default)'} ({how})")
        self.moved = True
        if self.rng.random() < 0.5 and w.node.mode == cassandra.UP:
            # Flaky more often than down for a move: its first batch then gets to the sink's
            # check (a node down fails prepare_write first).
            away = (cassandra.DOWN, cassandra.FLAKY) + ((cassandra.FLAKY,) if kind == "wal"
                                                         else ())
            w.set_node(self.rng.choice(away))
            self.count("node away across the restart")

    @staticmethod
    def _arrived(w, q) -> bool:
        """The pointer names the WAL ``q``'s options put it in (or names none yet)."""
        from wal.pointer import read_pointer

        pointed = read_pointer(q.checkpoint.path) if q.checkpoint.exists() else None
        return pointed is None or pointed == w.stream_wal_location(q)

    def count(self, what: str) -> None:
        self.counts[what] += 1

    # -- a refused move --------------------------------------------------------------------------
    def refused(self, w, q, exc: Exception, staged: list[str] | None) -> bool:
        """The sink refused ``q``'s first batch after a move: right only while the old WAL
        holds committed batches not written (the refusal then names ``wal.path``, and nothing
        was staged in the new WAL); the user restarts with the old ``wal.path``. Whether it
        was such a refusal."""
        from cql.errors import OptionError

        if q.name not in self.moving or not (isinstance(exc, OptionError)
                                             and MOVE_REFUSED in str(exc)):
            return False
        # The batches it names are batches Spark committed (their rows may all have landed,
        # a crash before the WAL recorded it: only a flush can tell), and at least one.
        named = {int(b) for b in re.findall(r"batch (\d+) \(\d+ rows\)", str(exc))}
        committed = {e.batch for e in w.oracle.executions if e.owner == q.owner and e.committed}
        pending = sorted(named)
        if not named or not named <= committed:
            raise Violation("a move with nothing to write is never refused",
                            f"{q.owner}: batches committed {sorted(committed)}: "
                            f"{type(exc).__name__}: {exc}")
        location = w.stream_wal_location(q)
        now = w.staged_files(location)
        if now != staged:
            raise Violation("a refused query stages nothing",
                            f"{q.owner}: the move refused, left {sorted(set(now) - set(staged))}"
                            f" and removed {sorted(set(staged) - set(now))} in {location}")
        old = self.moving.pop(q.name)
        w.say(f"{q.owner}: the move is refused, as it must be ({len(pending)} batches "
              f"pending): the user restarts with wal.path="
              f"{old.rsplit('/', 1)[-1] if old else '(default)'}")
        self.count("moves refused")
        q.options = dataclasses.replace(q.options, wal_path=old)
        w.kill(q, graceful=True)
        return True

    def staged_before(self, w, q) -> list[str] | None:
        """What the WAL ``q`` moves to holds before its first batch (None: no move)."""
        if q.name not in self.moving:
            return None
        return w.staged_files(w.stream_wal_location(q))

    @staticmethod
    def floor_seal(w, q, moving: list[str] | None) -> str | None:
        """The floor a move followed in ``q``'s first ``prepare_write`` writes in the new WAL
        before anything can refuse the batch (``wal.move.follow_move``: a seal of no rows at
        the last batch Spark committed), or None when no move was pending."""
        if moving is None:
            return None
        from wal.format import batch_name

        committed = [e.batch for e in w.oracle.executions if e.owner == q.owner and e.committed]
        return os.path.join("seals", batch_name(max(committed)) + ".seal") if committed else None

    # -- the registry at a progress event --------------------------------------------------------
    def follow_pointer(self, w, q) -> None:
        """The registry reads the pointer at a progress event: a flusher of a WAL the run moved
        away from stops, without a last drain (older code kept it: ``follows_moves``)."""
        if not self.moved or not self.follow or q.run is None or not q.run.flushers:
            return
        from wal.pointer import pointed_wals

        pointed = pointed_wals(q.checkpoint.path)
        for location in [loc for loc in q.run.flushers if loc not in pointed]:
            flusher = q.run.flushers.pop(location)
            with w.driver_process(q):
                flusher.stop(final_drain=False)
            self.count("flushers stopped after a move")
            w.say(f"{q.owner}: registry: the WAL moved away from "
                  f"{location.rsplit('/', 1)[-1]}: its flusher stops")


def check_rising(w) -> None:
    """Across a move or a table change, a later batch of a stream never loses to an earlier
    one: its committed batches are sealed at rising timestamps (the sink's own, not a
    ``writetime`` column's)."""
    changes = getattr(w, "changes", None)
    if changes is None or not changes.moved:
        return
    last: dict[str, tuple[int, str]] = {}
    for e in sorted((e for e in w.oracle.executions if e.committed and e.seal is not None
                     and e.query_id is not None and e.expected),
                    key=lambda e: (e.owner, e.batch)):
        if e.options.writetime:
            last.pop(e.owner, None)
            continue
        low, high = min(x.ts for x in e.expected), max(x.ts for x in e.expected)
        before = last.get(e.owner)
        if before is not None and low <= before[0]:
            raise Violation("a later batch never loses to an earlier one",
                            f"{e.label} is sealed at {low}, at or below {before[1]}'s last "
                            f"timestamp {before[0]}")
        last[e.owner] = (high, e.label)
