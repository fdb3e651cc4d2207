"""What the sink must write: every execution of every batch, and the cells it must become.

An *execution* is one run of batch N by one owner (a stream, or a batch ``df.write`` job):
the rows Spark gave each partition, and the options in force when it was sealed. Once sealed,
its rows are known as the writes Cassandra must receive once it is committed: row *i* of the
seal (segments in seal order) at ``base_ts_us + i`` (or at its ``writetime`` column), with the
sealed TTL, and a cell per written column (a tombstone for a null, nothing with
``ignoreNulls``). In a change stream (``deletes.py``) a row marked a delete is expected as the
delete of its row (its primary key) or of its partition (its partition key) at its timestamp,
with no cell. A write seen by the simulated node is legal only if it is exactly one of the
expected writes of a committed execution; that is how "nothing uncommitted is visible" and
"replays write identical cells" are checked. A row with a TTL must expire at its seal's
instant plus its TTL (:meth:`Oracle.timing`, with the slack ``clocks.py`` explains); once that
instant is past it is written as a tombstone of each column it writes, at its timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .clocks import ROUNDING_S

from pyspark.sql import types as T

from tests.helpers.fake_cassandra import PARTITION_DELETE, ROW_DELETE

KEYSPACE = "ks"
#: The list columns of the list tables: "l" a non-frozen list (each write appends its elements
#: under new cell ids: CASSANDRA-11368), "fl" a frozen one (one cell).
LIST_COLUMNS = (("l", "list<text>"), ("fl", "frozen<list<text>>"))
# Table -> (columns with CQL types, primary key). "tc" is the clustering variant; "tl" and
# "tcl" the same with list columns (a list world's: world.py).
TABLES = {
    "t": ((("k", "int"), ("v", "text"), ("w", "int")), ("k",), ()),
    "tc": ((("k", "int"), ("c", "int"), ("v", "text"), ("w", "int")), ("k",), ("c",)),
}
TABLES.update({name + "l": (columns + LIST_COLUMNS, pk, ck)
               for name, (columns, pk, ck) in list(TABLES.items())})
# Each table's twin ("t2" for "t": the same columns, another table), which a stream may be
# restarted with (tests/sim/changes.py).
TABLES.update({name + "2": shape for name, shape in list(TABLES.items())})
SPARK_TYPES = {"int": T.IntegerType(), "text": T.StringType(),
               "list<text>": T.ArrayType(T.StringType()),
               "frozen<list<text>>": T.ArrayType(T.StringType())}
WRITETIME_COLUMN = "wt"
#: A change stream's column of operations (deletes.py) and the values of its deletes: a row's
#: (the sink's default ``op.deleteValues``) and a partition's (``op.partitionDeleteValues``).
OP_COLUMN = "op"
ROW_DELETE_VALUE, PARTITION_DELETE_VALUE = "d", "P"
#: The completeness marker's table (marker.py: the option, its schema and its invariant).
MARKER_TABLE = "progress"
#: The option of the sink accepting at-least-once for non-frozen lists (named here: the
#: simulation also runs against older code, which has none).
LISTS_OPTION = "wal.lists.atLeastOnce"


@dataclass(frozen=True)
class RunOptions:
    """The write options of one run of a query, or of one batch job: what the user set."""

    table: str
    with_w: bool                       # the column list: (k, [c,] v, w) or (k, [c,] v)
    ttl: int | None
    writetime: bool                    # option writetime = "wt", a bigint column of the rows
    ignore_nulls: bool
    retention_batches: int
    retention_seconds: float | None
    group_rows: int
    retry_count: int
    grouping: str
    wal_path: str | None
    with_lists: bool = False           # the list columns (l, fl) of a list table are written
    lists_opt_in: bool = False         # wal.lists.atLeastOnce=l
    flush_mode: str = "driver"         # wal.flush.mode (a clock world's: clocks.py)
    cluster: str = ""                  # "" the first cluster; "b" the other (changes.py)
    op_column: bool = False            # a change stream: op.column=op (deletes.py)
    partition_deletes: bool = False    # op.partitionDeleteValues=P
    marker: bool = False               # marker.table (a stream's; marker.py)

    @property
    def where(self) -> str:
        """The table as the simulated node keeps it: ``b:t`` on the other cluster."""
        return f"{self.cluster}:{self.table}" if self.cluster else self.table

    @property
    def key(self) -> tuple[str, ...]:
        return TABLES[self.table][1] + TABLES[self.table][2]

    @property
    def written(self) -> tuple[str, ...]:
        """The table columns written, in table order."""
        lists = {c for c, _ in LIST_COLUMNS}
        return tuple(c for c, _ in TABLES[self.table][0] if (self.with_w or c != "w")
                     and (self.with_lists or c not in lists))

    @property
    def unaccepted_list(self) -> bool:
        """It writes the non-frozen list "l" without accepting at-least-once for it: the sink
        must refuse it before anything is staged (or, if it takes it, write it exactly once)."""
        return "l" in self.written and not self.lists_opt_in

    def spark_schema(self) -> T.StructType:
        types = dict(TABLES[self.table][0])
        fields = [T.StructField(c, SPARK_TYPES[types[c]]) for c in self.written]
        if self.writetime:
            fields.append(T.StructField(WRITETIME_COLUMN, T.LongType()))
        if self.op_column:
            fields.append(T.StructField(OP_COLUMN, T.StringType()))
        return T.StructType(fields)

    def deletion(self, row: dict) -> str:
        """What ``row`` deletes (``fake_cassandra.ROW_DELETE``, ``PARTITION_DELETE``), or ""
        for an upsert. A partition delete of a table without clustering columns is its row's
        (the same statement, the same tombstone)."""
        if not self.op_column:
            return ""
        op = row[OP_COLUMN]
        if op == PARTITION_DELETE_VALUE and self.partition_deletes and TABLES[self.table][2]:
            return PARTITION_DELETE
        if op == ROW_DELETE_VALUE or (op == PARTITION_DELETE_VALUE and self.partition_deletes):
            return ROW_DELETE
        return ""

    def spark_options(self, checkpoint: str | None) -> dict[str, str]:
        out = {"keyspace": KEYSPACE, "table": self.table,
               "spark.cassandra.output.batch.grouping.key": self.grouping,
               "spark.cassandra.query.retry.count": str(self.retry_count),
               "spark.cassandra.output.ignoreNulls": str(self.ignore_nulls).lower(),
               "wal.retention.batches": str(self.retention_batches),
               "wal.flush.groupRows": str(self.group_rows)}
        if checkpoint is not None:
            out["checkpointLocation"] = checkpoint
        if self.ttl is not None:
            out["ttl"] = str(self.ttl)
        if self.writetime:
            out["writetime"] = WRITETIME_COLUMN
        if self.retention_seconds is not None:
            out["wal.retention.seconds"] = str(self.retention_seconds)
        if self.wal_path is not None:
            out["wal.path"] = self.wal_path
        if self.lists_opt_in:
            out[LISTS_OPTION] = "l"
        if self.flush_mode != "driver":
            out["wal.flush.mode"] = self.flush_mode
        if self.cluster:
            out["spark.cassandra.connection.host"] = f"cluster-{self.cluster}"
        if self.op_column:
            out["op.column"] = OP_COLUMN
        if self.partition_deletes:
            out["op.partitionDeleteValues"] = PARTITION_DELETE_VALUE
        if self.marker and checkpoint is not None:      # a stream's (marker.py)
            out["marker.table"] = MARKER_TABLE
        return out

    def describe(self) -> str:
        parts = [f"table={self.table}", "cols=" + ",".join(self.written)]
        if self.ttl is not None:
            parts.append(f"ttl={self.ttl}")
        if self.writetime:
            parts.append("writetime=wt")
        if self.ignore_nulls:
            parts.append("ignoreNulls")
        parts.append(f"retention={self.retention_batches}"
                     + (f"/{self.retention_seconds}s" if self.retention_seconds else ""))
        parts.append(f"groupRows={self.group_rows} retries={self.retry_count} {self.grouping}")
        if self.wal_path:
            parts.append(f"wal.path={self.wal_path.rsplit('/', 1)[-1]}")
        if self.lists_opt_in:
            parts.append(f"{LISTS_OPTION}=l")
        if self.flush_mode != "driver":
            parts.append(f"wal.flush.mode={self.flush_mode}")
        if self.cluster:
            parts.append(f"connection.host=cluster-{self.cluster}")
        if self.op_column:
            parts.append(f"op.column={OP_COLUMN}"
                         + (f" op.partitionDeleteValues={PARTITION_DELETE_VALUE}"
                            if self.partition_deletes else ""))
        return " ".join(parts)


class Expected(NamedTuple):
    """One row write: the shape of :class:`tests.sim.cassandra.Write` without its step."""

    table: str
    key: tuple
    ts: int
    ttl: int | None
    cells: tuple
    deletion: str = ""      # a change stream's delete of the row or partition ``key``: no cells


@dataclass(eq=False)
class Execution:
    owner: str
    batch: int
    number: int                        # the n-th execution of this batch by this owner
    rows: dict[int, list[dict]]        # partition -> Spark's rows for it
    options: RunOptions
    query_id: str | None               # a stream's (Spark's checkpoint id); None: a batch job
    seal: object | None = None
    committed: bool = False
    expected: tuple[Expected, ...] = ()
    segments: dict[str, int] = field(default_factory=dict)   # winning segment name -> partition
    # A foreachBatch writer's call that failed without a seal, its error caught by the user's
    # function (which went on, so Spark commits the batch): its rows for the table are lost.
    # ``entered``: the call had recorded its entry (wal/entries.py) when it failed.
    lost: bool = False
    entered: bool = False
    # An operator's amendment (changes.py, ``cassandra-wal amend``): its expected writes are
    # the amended seal's; ``earlier``, what was expected before (rows written then count).
    amendment: object | None = None
    earlier: tuple[Expected, ...] = ()
    # The rows of each Arrow batch Spark hands a task (a chunk of its segment): 1, but in a
    # deletes world (deletes.py), where a chunk's rows differ in timestamp and operation.
    chunk_rows: int = 1

    @property
    def label(self) -> str:
        if self.batch < 0:          # a batch job of a WAL of its own: no batch id to show
            return f"{self.owner}'s batch"
        return f"{self.owner} batch {self.batch} (execution {self.number})"

    def row_count(self) -> int:
        return sum(len(r) for r in self.rows.values())


def expected_writes(execution: Execution, seal, without=()) -> tuple[Expected, ...]:
    """The writes of a sealed execution: its rows in seal order at the sealed timestamps, with
    the options in force when it was sealed (``without``: columns an amendment leaves out)."""
    o = execution.options
    out, position = [], 0
    for ref in seal.segments:
        rows = execution.rows[ref.partition]
        assert len(rows) == ref.rows, f"{execution.label}: seal counts {ref.rows} rows for " \
                                      f"partition {ref.partition}, Spark gave it {len(rows)}"
        for row in rows:
            ts = row[WRITETIME_COLUMN] if o.writetime else seal.base_ts_us + position
            position += 1
            deletion = o.deletion(row)
            if deletion:
                key = o.key if deletion == ROW_DELETE else TABLES[o.table][1]
                out.append(Expected(o.where, tuple(row[c] for c in key), ts, None, (), deletion))
                continue
            cells = tuple(sorted((c, row[c]) for c in o.written
                                 if c not in o.key and not (o.ignore_nulls and row[c] is None)
                                 and c not in without))
            out.append(Expected(o.where, tuple(row[c] for c in o.key), ts, o.ttl or None, cells))
    return tuple(out)


def ttl_fits(sent: int | None, sealed: int | None) -> bool:
    """A TTL counts from the seal, so a later write may send less of it, never more; a row
    sealed without one gets none."""
    if sealed is None:
        return sent is None
    return sent is not None and 0 < sent <= sealed


class Oracle:
    """Every execution, and an index of their expected writes by (table, key, timestamp)."""

    def __init__(self):
        self.executions: list[Execution] = []
        self.by_stamp: dict[tuple, list[tuple[Execution, Expected]]] = {}
        self.applied: set[Expected] = set()
        self.first: dict[tuple, object] = {}        # (table, key, ts) -> the first write seen
        self.judged: Execution | None = None        # the execution of the last legal write
        # seal id -> (when it was sealed on the world's clock, the sealing clock's offset), µs
        self.seal_clocks: dict[str, tuple[int, int]] = {}
        # (process, id(execution)) -> the offset of that process's clock when it first took
        # the batch in hand (a drain, a recovery, a job's commit), µs (world.see)
        self.anchors: dict[tuple[str, int], int] = {}
        # A row whose TTL ran out before its write is written as tombstones (False: it may be
        # skipped, as older code did: clocks.ENV_CLOCKS).
        self.tombstones = True

    def add(self, execution: Execution) -> Execution:
        self.executions.append(execution)
        return execution

    def sealed(self, execution: Execution, seal) -> None:
        execution.seal = seal
        execution.expected = expected_writes(execution, seal)
        for e in execution.expected:
            self.by_stamp.setdefault(e[:3], []).append((execution, e))

    def amend(self, execution: Execution, amendment) -> bool:
        """``execution`` is written as an operator's amendment says from now on (without some
        columns, or at another base timestamp): its expected writes become the amended seal's
        (a row written before counts for its amended twin). Whether that changed anything."""
        if execution.amendment == amendment:
            return False
        before = execution.earlier or execution.expected
        now = expected_writes(execution, amendment.apply(execution.seal),
                              amendment.without_columns)
        for old, new in zip(execution.expected, now):
            if old in self.applied:
                self.applied.add(new)
            self.by_stamp.setdefault(new[:3], []).append((execution, new))
        execution.amendment, execution.earlier, execution.expected = amendment, before, now
        return True

    def sealed_s(self, execution: Execution) -> float:
        """When ``execution`` was sealed, on the world's clock (seconds)."""
        seal = execution.seal
        true_us, _ = self.seal_clocks.get(seal.seal_id, (seal.sealed_at_us, 0))
        return true_us / 1e6

    def missing(self, execution: Execution, now_s: float | None = None) -> list[Expected]:
        """Expected writes of ``execution`` Cassandra has not received; with ``now_s``, not
        counting rows of no cell (a key alone, or nulls left out) whose TTL may have run out:
        an expired row marker is all they would leave, so nothing is written. Every other row
        is written, as tombstones once its TTL ran out (unless :attr:`tombstones` is off: then
        any row whose TTL ran out may be skipped)."""
        out = [e for e in execution.expected if e not in self.applied]
        if now_s is not None and out:
            sealed_s = self.sealed_s(execution)
            if not self.tombstones:
                return [e for e in out if not (e.ttl and sealed_s + e.ttl <= now_s)]
            out = [e for e in out
                   if not (e.ttl and not e.cells and sealed_s + e.ttl <= now_s + MAX_SKEW_S)]
        return out

    def timing(self, write, execution: Execution, expected: Expected) -> str | None:
        """Why ``write`` of a row with a TTL does not expire as its seal says, or None.

        It must expire at the instant it was sealed plus its TTL: Cassandra expires it at the
        second it applied the write plus the TTL sent. Slack: 2 s (whole seconds on two
        clocks), plus how far the clock of the writing process's driver had moved from the
        sealing clock when that process first took the batch in hand (``anchors``), plus
        the time a flush task on another machine waited after its job started
        (``write.uncounted_s``). A row written as tombstones must have expired by then."""
        true_us, seal_offset = self.seal_clocks.get(execution.seal.seal_id,
                                                    (execution.seal.sealed_at_us, 0))
        anchor = self.anchors.get((write.proc, id(execution)), seal_offset)
        slack = ROUNDING_S + abs(anchor - seal_offset) / 1e6 + write.uncounted_s
        due = true_us / 1e6 + expected.ttl
        where = (f"sealed at {true_us / 1e6:.3f}s with ttl={expected.ttl}, so due to expire at "
                 f"{due:.3f}s, give or take {slack:.1f}s")
        if write.deleted:
            if write.at_s + slack < due - 1e-6:
                return (f"the row of {execution.label} was written as tombstones at "
                        f"{write.at_s:.0f}s, {due - write.at_s:.1f}s before its TTL ran out "
                        f"({where})")
            return None
        expires = write.at_s + write.ttl
        if abs(expires - due) > slack + 1e-6:
            return (f"the row of {execution.label} expires at {expires:.0f}s, "
                    f"{expires - due:+.1f}s off the instant its seal gives it ({where})")
        return None

    def judge(self, write) -> tuple[str | None, Expected | None]:
        """(why ``write`` is illegal, None) or (None, the committed row it writes); the
        execution of that row is :attr:`judged`."""
        stamp = (write.table, write.key, write.ts)
        candidates = self.by_stamp.get(stamp, [])
        if write.deleted:
            return self._judge_tombstones(write, candidates)
        if write.deletion:
            return self._judge_deletion(write, candidates)
        exact = [(x, e) for x, e in candidates if not e.deletion and e.cells == write.cells
                 and ttl_fits(write.ttl, e.ttl)]
        committed = [(x, e) for x, e in exact if x.committed]
        first = self.first.get(stamp)
        if committed:
            x, e = committed[0]
            why = self.timing(write, x, e) if e.ttl else None
            if why is not None:
                return why, None
            # One process's writes count on from one measure (a flush task elsewhere from
            # when it started: what it waited is its uncounted_s).
            if first is not None and first.proc == write.proc and not first.deleted and \
                    first.ttl and write.ttl and \
                    abs((first.at_s + first.ttl) - (write.at_s + write.ttl)) > \
                    1.5 + first.uncounted_s + write.uncounted_s:
                return (f"a replay of the row of {x.label} expires at another time than its "
                        f"first write by the same process (first {fmt(first)} written at "
                        f"{first.at_s:.3f}s)"), None
            self.judged = x
            return None, e
        if exact:
            return (f"a row of {exact[0][0].label}, which Spark never committed, reached "
                    f"Cassandra"), None
        deletes = [(x, e) for x, e in candidates if e.deletion]
        if deletes:
            x, e = deletes[0]
            return (f"the delete of {x.label} was written as an upsert (sealed {fmt(e)})"), None
        if first is not None and (first.cells, first.ttl) != (write.cells, write.ttl):
            return (f"a replay wrote other cells at the same timestamp than the first write "
                    f"(first {fmt(first)})"), None
        if candidates:
            x, e = candidates[0]
            return (f"the row of {x.label} was written with other cells or TTL than sealed "
                    f"(sealed {fmt(e)})"), None
        same = [(x, e) for x in self.executions if x.committed for e in x.expected
                if e.table == write.table and e.key == write.key and e.cells == write.cells]
        if same:
            x, e = same[0]
            return (f"the row of {x.label} was written at a timestamp its seal does not give "
                    f"it (sealed {fmt(e)})"), None
        alike = [(x, e) for x in self.executions for e in x.expected
                 if e.table == write.table and e.key == write.key and _agree(e.cells, write.cells)]
        if alike:
            x, e = alike[-1]
            return (f"looks like the row of {x.label} written with other options (sealed "
                    f"{fmt(e)})"), None
        return "a write that no sealed row explains", None


    def _judge_deletion(self, write, candidates) -> tuple[str | None, Expected | None]:
        """A change stream's delete of a row or partition at a timestamp: legal only as the
        delete of a committed execution's row of that kind, for that key, at that timestamp."""
        fits = [(x, e) for x, e in candidates if e.deletion == write.deletion]
        committed = [(x, e) for x, e in fits if x.committed]
        if committed:
            self.judged, e = committed[0]
            return None, e
        if fits:
            return (f"the delete of a row of {fits[0][0].label}, which Spark never committed, "
                    f"reached Cassandra"), None
        if candidates:
            x, e = candidates[0]
            return (f"a delete where the row of {x.label} is sealed otherwise (sealed "
                    f"{fmt(e)})"), None
        return "a delete that no sealed row explains", None

    def _judge_tombstones(self, write, candidates) -> tuple[str | None, Expected | None]:
        """A DELETE of columns at a timestamp: legal only as the row of a committed execution
        whose TTL ran out, deleting exactly the columns that row writes."""
        columns = tuple(c for c, _ in write.cells)
        fits = [(x, e) for x, e in candidates if e.ttl and tuple(c for c, _ in e.cells) == columns]
        committed = [(x, e) for x, e in fits if x.committed]
        if committed:
            x, e = committed[0]
            why = self.timing(write, x, e)
            if why is None:
                self.judged = x
            return (why, None) if why is not None else (None, e)
        if fits:
            return (f"the tombstones of a row of {fits[0][0].label}, which Spark never "
                    f"committed, reached Cassandra"), None
        if candidates:
            x, e = candidates[0]
            return (f"tombstones of other columns than the row of {x.label} writes, or of a "
                    f"row with no TTL (sealed {fmt(e)})"), None
        return "tombstones that no sealed row explains", None


#: The largest difference between two driver clocks of a world (clocks.py): offsets and steps.
MAX_SKEW_S = 1500


def _agree(a: tuple, b: tuple) -> bool:
    """Cells that hold the same values wherever both name a value (a null, written as a
    tombstone or left out with ignoreNulls, and a missing column agree with anything)."""
    x, y = dict(a), dict(b)
    return all(x[c] == y[c] for c in x.keys() & y.keys() if x[c] is not None and y[c] is not None)


def fmt(write) -> str:
    if getattr(write, "deletion", ""):
        what = "row" if write.deletion == ROW_DELETE else "partition"
        return f"DELETE {what} {write.table}{list(write.key)} @{write.ts}"
    if getattr(write, "deleted", False):
        return (f"DELETE {', '.join(c for c, _ in write.cells)} of {write.table}"
                f"{list(write.key)} @{write.ts}")
    cells = ", ".join(f"{c}={v!r}" for c, v in write.cells)
    ttl = f" ttl={write.ttl}" if write.ttl else ""
    return f"{write.table}{list(write.key)} @{write.ts}{ttl} {{{cells}}}"
