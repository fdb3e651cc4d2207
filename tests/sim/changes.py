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

* **contact points of another cluster** (``spark.cassandra.connection.host``): the simulated
  node stands for two clusters (``cassandra.OTHER_HOST``, another cluster name); each committed
  batch must land on the cluster it was sealed for (the seal carries it: b622864), new ones on
  the new one: the oracle keys expected writes by (cluster, table);
* **a schema change** on the table a pending batch writes (worlds with no store, no batch job
  and no foreachBatch query): a column (``v`` or ``w``) dropped and added back at once (the
  node records the drop time, answers ``system_schema.dropped_columns``, and hides every cell
  of the column at or before it), or a new column added. The flusher must block on a batch
  the drop would hide, naming the batch, the column and ``cassandra-wal amend``, and write
  nothing of it or later batches until an operator runs the real ``cassandra-wal amend``
  (``--pending``, ``--without-column`` or ``--restamp``, drawn at random; ``--restamp`` refused
  for a batch with its own ``writetime`` or partly written: then ``--without-column``), and
  then within a drain write it as amended (the oracle reads the amendments the command
  recorded). No cell a drop hides is ever written as if it landed (:meth:`hidden_on_arrival`),
  and a re-stamped batch stays above earlier batches and below later ones
  (:func:`check_rising`). Re-adding the column cures nothing (Cassandra keeps the drop), so no
  revert is drawn: the final recovery has the operator choose too.

Half the changes come with the node down or flaky across the restart, so that batches are
pending when it starts. Every draw comes from an RNG of its own (``changes:<seed>``; schema
changes and clusters from ``changes-x:<seed>``): a world without changes draws from the
world's RNG exactly what it drew before, and a change world without schema or cluster changes
what it drew before them.

:data:`ENV_CHANGES`: unset, table and cluster changes are drawn when the code under test has a
seal that carries its table and cluster (``Target.is_cluster_of``), moves when it has
``wal.move``, schema changes when it has ``cassandra-wal amend``; ``1`` every kind, for older
code too; ``tables``, ``moves``, ``schema``, ``clusters`` (or several, comma-separated): only
those kinds, for older code too; ``all`` every kind, every world a change world; ``0`` none.
:data:`ENV_SCHEMA` ``all`` also draws what the sink fails today (README.md, "Changes").
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import re
from collections import Counter

from . import cassandra
from .invariants import BLOCKED_FILE, Violation
from .oracle import fmt
from .patches import has_module

ENV_CHANGES = "CASSANDRA_WAL_SIM_CHANGES"
#: all: draw too what older code fails (an operator's recover of a WAL a drop blocks, an
#: amend --restamp with Cassandra away, a writetime batch's block decided by the sealing
#: clock: README.md, "Changes"); drawn anyway when the code under test has the fixes.
ENV_SCHEMA = "CASSANDRA_WAL_SIM_SCHEMA"
KINDS = ("tables", "moves", "schema", "clusters")
SHARE = 4
MAX_SCHEMA = 3                  # schema changes per world at most
DROPPED = re.compile(r"ColumnDroppedAfterSeal: batch (\d+) writes (.+?), dropped after")
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


def knows_amend() -> bool:
    """The code under test blocks a batch a dropped column would hide, and has ``cassandra-wal
    amend`` (issue 31, item 3: 90cd5cb, 2f888c9)."""
    return has_module("wal.amendments") and has_module("recovery.cli.amend_cmd")


def decides_by_cells() -> bool:
    """The code under test decides a drop's block of a batch with the user's own ``writetime``
    from the rows' timestamps, not from the sealing driver's clock (README.md, "Changes")."""
    import inspect

    try:
        from recovery.output import CassandraOutput
    except ImportError:
        return False
    method = getattr(CassandraOutput, "dropped_after_seal", None)
    return method is not None and "rows" in inspect.signature(method).parameters


def drop_errors_typed() -> bool:
    """The code under test's ``recover`` says a drop's block with an exit code (a
    ``RecoveryBlocked``), and ``amend --restamp`` says Cassandra is away (README.md,
    "Changes")."""
    try:
        from recovery.errors import ColumnDroppedAfterSeal, RecoveryBlocked
        import recovery.cli.amend_cmd
    except ImportError:
        return False
    with open(recovery.cli.amend_cmd.__file__) as f:
        return issubclass(ColumnDroppedAfterSeal, RecoveryBlocked) and \
            "is_transient_answer" in f.read()


def twin(table: str) -> str:
    return table[:-len(TWIN)] if table.endswith(TWIN) else table + TWIN


class Changes:
    def __init__(self, seed: int, counts: Counter):
        self.rng = random.Random(f"changes:{seed}")
        self.xrng = random.Random(f"changes-x:{seed}")      # schema changes, clusters
        setting = os.environ.get(ENV_CHANGES, "")
        parts = set(setting.split(","))
        named = parts & set(KINDS)
        forced = bool(parts & {"1", "all"})

        def kind(name: str, supported) -> bool:
            if named:
                return name in named
            return setting != "0" and (forced or supported())

        self.tables = kind("tables", seals_carry_table)
        self.moves = kind("moves", follows_moves)
        self.schema = kind("schema", knows_amend)
        self.clusters = kind("clusters", seals_carry_table)
        self.follow = follows_moves()
        self.on = (self.tables or self.moves or self.schema or self.clusters) and \
            ("all" in parts or self.rng.randrange(SHARE) == 0)
        self.by_cells = decides_by_cells()
        self.held_back = os.environ.get(ENV_SCHEMA, "") != "all" and not (
            self.by_cells and drop_errors_typed())
        self.schema_changes = 0
        self.allowed: set[tuple[str, str]] = set()   # drop blocks found right (where, reason)
        self.final = False                # after the final recovery: nothing is held any more
        self.rising = False               # a batch re-stamped: check_rising
        self.counts = counts                  # the world's tally (World.counts)
        self.used: dict[tuple[str, int], list[str | None]] = {}   # (query, generation) -> paths
        self.moving: dict[str, str | None] = {}   # query -> the wal.path it moves away from
        self.moved = False                        # a move or a table change happened

    # -- at a restart ----------------------------------------------------------------------------
    def at_restart(self, w, q) -> None:
        """``q`` (a data source's stream) starts again: maybe with another table or
        ``wal.path``, cluster or schema, maybe with the node down or flaky across the
        restart."""
        self._table_or_wal(w, q)
        self._schema_or_cluster(w, q)

    def _table_or_wal(self, w, q) -> None:
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

    def _schema_or_cluster(self, w, q) -> None:
        """From an RNG of its own: another cluster, or a schema change on the table the
        query's last batch was sealed for."""
        if not self.on or not (self.schema or self.clusters) or q.writers is not None or \
                q.runs == 0 or q.invalid is not None:
            return
        rng = self.xrng
        if rng.random() >= 0.4:
            return
        kinds = (["cluster"] if self.clusters else []) + \
            (["schema"] if self.schema_eligible(w) else [])
        if not kinds:
            return
        if rng.choice(kinds) == "cluster":
            cluster = "" if q.options.cluster else cassandra.OTHER
            q.options = dataclasses.replace(q.options, cluster=cluster)
            self.count("cluster changed" + (" back" if not cluster else ""))
            w.say(f"{q.owner}: the user restarts it with spark.cassandra.connection.host="
                  f"{cassandra.OTHER_HOST if cluster else 'localhost'}")
        else:
            self._schema_change(w, q)
        if rng.random() < 0.5 and w.node.mode == cassandra.UP:
            w.set_node(rng.choice((cassandra.DOWN, cassandra.FLAKY)))
            self.count("node away across the restart (schema, cluster)")

    def schema_eligible(self, w) -> bool:
        """Schema changes are drawn in this world (its kind on, no store, no batch job, no
        foreachBatch query, fewer than :data:`MAX_SCHEMA` so far)."""
        return self.on and self.schema and self.schema_changes < MAX_SCHEMA and \
            w.store is None and not w.jobs_on and w.foreach is None

    def pending_streams(self, w) -> list:
        """Streams (data sources) with a committed batch not written yet, while a run is up."""
        owners = {e.owner for e in w.oracle.executions if e.committed and e.seal is not None
                  and w.oracle.missing(e)}
        return [q for q in w.queries if q.writers is None and q.owner in owners
                and q.invalid is None and q.refused is None]

    def schema_step(self, w) -> str:
        """At a step, batches pending (the node away): the user changes the schema of the
        table a pending batch writes, while the query runs or not."""
        streams = self.pending_streams(w)
        if not streams:
            return w.say("the user: nothing pending")
        q = self.xrng.choice(streams)
        self.count("schema: at a step")
        self._schema_change(w, q)
        return "schema"

    def _schema_change(self, w, q) -> None:
        """A column of the table ``q``'s last sealed batch writes is dropped and added back
        (Cassandra keeps the drop time), or a new column is added."""
        from recovery.cql.table import TableSchema

        rng = self.xrng
        sealed = [e for e in w.oracle.executions if e.owner == q.owner and e.seal is not None]
        options = sealed[-1].options if sealed else q.options
        where, table = options.where, options.table
        self.schema_changes += 1
        if rng.random() < 0.75:
            column = rng.choice(("v", "w"))
            w.node.dropped[(where, column)] = w.clock_us
            self.count(f"schema: {column} dropped and added back")
            w.say(f"{q.owner}: the user drops {where}.{column} and adds it back "
                  f"(dropped_time {w.clock_us} µs)")
            return
        schema = w.tables[table]
        name = f"x{len(schema.columns)}"
        columns = tuple(schema.columns) + ((name, "int"),)
        w.tables[table] = TableSchema(schema.keyspace, table, columns, schema.partition_key,
                                      schema.clustering_key)
        self.count("schema: a column added")
        w.say(f"{q.owner}: the user adds a column {name} int to {table}")

    # -- dropped columns: the oracle's hooks -------------------------------------------------------
    def hides(self, w, e) -> list[str]:
        """The columns of ``e`` (as amended) that a drop since hides, as the sink computes
        it (``recovery.output.dropped_after_seal``): dropped at or after its first write
        timestamp (with its own ``writetime``: the smallest of a row with a value in the
        column; before the fix, :func:`decides_by_cells`: after it was sealed), the drop time
        to the end of its millisecond."""
        if not w.node.dropped or e.seal is None or not e.expected:
            return []
        o = e.options
        drops = _bounds(w.node, o)
        if not drops:
            return []
        without = e.amendment.without_columns if e.amendment is not None else ()
        if o.writetime and self.by_cells:
            # the rows' own timestamps: per column, the smallest of a row with a value in it
            first = {}
            for x in e.expected:
                for c, value in x.cells:
                    if value is not None and x.ts < first.get(c, 2**63):
                        first[c] = x.ts
            return [c for c in o.written if c in drops and c not in without and c in first
                    and drops[c] >= first[c]]
        first = e.seal.sealed_at_us if o.writetime else min(x.ts for x in e.expected)
        return [c for c in o.written if c in drops and c not in without and drops[c] >= first]

    def held(self, w, e) -> bool:
        """``e`` waits, rightly, behind a batch of its stream a drop hides (not written yet),
        until an operator amends it (never after the final recovery: the operator chose)."""
        if self.final or not w.node.dropped or not e.committed:
            return False
        return any(x.owner == e.owner and x.committed and x.batch <= e.batch and
                   self.hides(w, x) and w.oracle.missing(x)
                   for x in w.oracle.executions)

    def pending_drop(self, w, owners) -> bool:
        """A committed batch of ``owners`` a drop hides is not written yet."""
        return bool(w.node.dropped) and any(
            x.owner in owners and x.committed and self.hides(w, x) and w.oracle.missing(x)
            for x in w.oracle.executions)

    def block_allowed(self, w, where: str, reason: str) -> bool:
        """``blocked.json`` saying a drop hides batch N's column C is right when a sealed
        batch N writes C and a drop since hides it (right once, it stays right until the next
        drain clears it: the operator's amendment comes in between)."""
        found = DROPPED.search(reason)
        if found is None:
            return False
        if (where, reason) in self.allowed:
            return True
        batch, columns = int(found.group(1)), set(found.group(2).split(", "))
        if any(e.batch == batch and columns <= set(self.hides(w, e))
               for e in w.oracle.executions if e.seal is not None):
            self.allowed.add((where, reason))
            self.count("schema: blocked on a drop")
            return True
        return False

    @staticmethod
    def drop_block(root: str) -> str | None:
        """The reason of the drop block ``blocked.json`` at ``root`` holds, or None."""
        try:
            with open(os.path.join(root, BLOCKED_FILE)) as f:
                reason = f.read()
        except FileNotFoundError:
            return None
        return reason if DROPPED.search(reason) else None

    def expects_block(self, flusher) -> bool:
        return self.schema_changes > 0 and self.drop_block(flusher.wal.root) is not None

    def commit_blocked(self, exc: Exception) -> bool:
        """A commit refused because the WAL is blocked on a drop (blocked.json): the query
        fails, rightly, until the operator amends."""
        return self.schema_changes > 0 and "is blocked" in str(exc) and \
            DROPPED.search(str(exc)) is not None

    def hidden_on_arrival(self, w, write, e) -> str | None:
        """Why ``write`` (a row of ``e``, legal as sealed) loses a value to a drop without a
        word: a cell of it at or below the drop time of its column, which Cassandra hides.
        Rows with the user's own ``writetime`` sealed after the drop are the user's."""
        if write.deleted or not w.node.dropped:
            return None
        for column, value in write.cells:
            if value is None or not w.node.hidden(write.table, column, write.ts):
                continue
            drop = w.node.dropped[(write.table, column)]
            if e is not None and e.options.writetime and not self.by_cells and \
                    self._sealed_after(w, e, column, drop):
                continue
            return (f"{e.label if e else 'a row'}: Cassandra got {fmt(write)}, whose {column} "
                    f"is hidden by the drop of {column} at {drop} µs: its value is lost "
                    f"without a block")
        return None

    def _sealed_after(self, w, e, column: str, drop: int) -> bool:
        """``e`` (with the user's own ``writetime``) was sealed after the drop of ``column``:
        its rows' timestamps are the user's to choose. Held back (:data:`ENV_SCHEMA`), as the
        sink tells it: its sealing clock's reading against the drop time to the end of its
        millisecond; else at the true instant (a driver's clock ahead of Cassandra's makes a
        batch sealed before the drop look sealed after it: README.md, "Changes")."""
        if self.held_back:
            bound = _bounds(w.node, e.options).get(column, drop)
            return e.seal.sealed_at_us > bound
        return w.oracle.seal_clocks.get(e.seal.seal_id, (e.seal.sealed_at_us,))[0] > drop

    # -- the operator's amendment ----------------------------------------------------------------
    def drop_blocks(self, w) -> list[tuple[str, str]]:
        """The WALs blocked on a drop now: (root, reason)."""
        if not self.schema_changes:
            return []
        out = []
        for root in sorted(w.wal_roots):
            reason = self.drop_block(root)
            if reason is not None:
                out.append((root, reason))
        return out

    def operator_amend(self, w, root: str | None = None) -> str:
        """An operator runs ``cassandra-wal amend`` on a WAL blocked on a drop: ``--pending``
        with ``--without-column`` (each column the reason names) or ``--restamp``."""
        blocks = self.drop_blocks(w)
        if not blocks:
            return w.say("operator: nothing blocked on a drop")
        if root is not None:
            blocks = [b for b in blocks if b[0] == root] or blocks
        root, reason = self.xrng.choice(blocks)
        columns = DROPPED.search(reason).group(2).split(", ")
        restamp = self.xrng.random() < 0.5
        if restamp and w.node.mode != cassandra.UP and self.held_back:
            restamp = False                  # held back: README.md, "Changes"
        code = self._amend(w, root, columns, restamp)
        if code == 1 and restamp:            # refused (writetime, partly written): the other way
            code = self._amend(w, root, columns, False)
        return "amended" if code == 0 else "failed"

    def _amend(self, w, root: str, columns: list[str], restamp: bool) -> int:
        from recovery.cli.main import main

        how = ["--restamp"] if restamp else [a for c in columns
                                             for a in ("--without-column", c)]
        argv = ["amend", root, "--pending", *how]
        faults, disk = w.node.faults, w.store_faults()
        out, err = io.StringIO(), io.StringIO()
        with w.running(f"operator amend {w.step}", None), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        said = (err.getvalue().strip().splitlines() or out.getvalue().strip().splitlines()
                or [""])[-1]
        what = "--restamp" if restamp else " ".join(how)
        w.say(f"operator: cassandra-wal amend {root.rsplit('/', 1)[-1]} --pending {what}: "
              f"exit {code}: {said[:160]}")
        if code == 0:
            self.count(f"schema: amend {'--restamp' if restamp else '--without-column'}")
            self.record_amendments(w, root)
        elif code != 0 and w.store_faults() != disk:     # the disk full: tried again later
            self.count("schema: amend failed on the disk")
        elif code == 1 and (restamp and ("writetime" in err.getvalue()
                                         or "partly written" in err.getvalue())
                            or w.node.faults != faults or w.node.mode != cassandra.UP):
            self.count(f"schema: amend {'--restamp' if restamp else '--without-column'} "
                       f"refused")
        else:
            raise Violation("cassandra-wal amend does what the runbook says",
                            f"{' '.join(argv)}: exit {code}: {err.getvalue().strip()!r}")
        return code

    def record_amendments(self, w, root: str) -> None:
        """The oracle learns every amendment the WAL at ``root`` records (of the seal it
        names): those batches are expected as amended from now on."""
        from wal.amendments import amended_batch_ids, read_amendment
        from wal.layout import WalDir

        wal = WalDir(root)
        by_seal = {e.seal.seal_id: e for e in w.oracle.executions if e.seal is not None}
        for batch in amended_batch_ids(wal):
            amendment = read_amendment(wal, batch)
            e = by_seal.get(amendment.seal_id) if amendment is not None else None
            if e is not None and w.oracle.amend(e, amendment):
                self.rising = self.rising or amendment.base_ts_us is not None
                w.say(f"  {e.label} is written " + (
                    f"without {', '.join(amendment.without_columns)}"
                    if amendment.without_columns else "")
                    + (f" from {amendment.base_ts_us}" if amendment.base_ts_us else ""))

    def amend_at_end(self, w, root: str) -> bool:
        """The final recovery left ``root`` blocked on a drop: the operator amends (the node
        is up). Whether it did (the recovery then runs again)."""
        if not self.schema_changes or self.drop_block(root) is None:
            return False
        self.operator_amend(w, root)
        return True

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
        from recovery.cql.errors import OptionError

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
    def timestamp_seal(w, q, moving: list[str] | None) -> str | None:
        """The timestamp seal a move followed in ``q``'s first ``prepare_write`` writes in the
        new WAL before anything can refuse the batch (``wal.move.follow_move``: a seal of no
        rows at the last batch Spark committed), or None when no move was pending."""
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
    if changes is None or not (changes.moved or changes.rising):
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


def _bounds(node, options) -> dict[str, int]:
    """Each column of ``options``' table the node records as dropped -> the last timestamp
    its drop hides, as the sink reads it (``recovery.cql.table.dropped_columns``: to the end of the
    millisecond); older code has no such function: the same bound."""
    rows = node.dropped_rows(options.table, options.cluster)
    if not rows:
        return {}
    try:
        from recovery.cql.table import dropped_columns
    except ImportError:
        return {r.column_name: (int(r.dropped_time.timestamp() * 1000) + 1) * 1000 - 1
                for r in rows}

    class Session:
        @staticmethod
        def execute(_cql, _parameters):
            return rows

    return dropped_columns(Session, "ks", options.table)
