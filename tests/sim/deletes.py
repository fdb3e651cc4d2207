"""Change streams (issue 35): worlds whose streams, batch jobs and foreachBatch writers write
upserts and deletes, each row's operation in the column ``op`` (``op.column=op``).

In a deletes world (one in four: :data:`ENV_DELETES_SHARE`) every run is a change stream:
each row is an upsert (``c``, ``u``, ``r``), a delete of its row (``d``), or, where the table
has a clustering column, now and then a delete of its whole partition (``P``, with
``op.partitionDeleteValues=P``; its clustering column null half the time, which only a
partition delete may have). A delete carries values in its other columns, as a change
record's before-image does: the sink must not write them (held back with a ``writetime``
column, below). Rows often change a key an earlier row of the batch changed, so a key is
upserted, deleted and upserted again within a batch as well as across batches; Spark hands a
task its rows in Arrow batches of 1 to 3 rows (chunks of the segment: :meth:`chunk_rows`).

The order a key's changes take is the source's, as the user guide asks ("Change streams"):

* without a ``writetime`` column, each key's changes of a batch stay in one partition, in
  source order (partitioned by the partition key ``k``, as a topic keyed by it): the sealed
  order, and so the sealed timestamps, follow the source;
* or every run of the world writes with a source-order ``writetime`` column (``wt``, strictly
  increasing in source order) and the rows go to any partition; then now and then a delete
  takes the timestamp of its key's change before it: a tie, which the tombstone wins.

The world keeps its source of write timestamps for good (the sink refuses a change stream
that switches it once its WAL sealed a batch). What Cassandra must then show is the committed
batches' changes applied at their sealed timestamps (``oracle.py``): per cell the highest
write, shown only above its row's and its partition's highest deletion (a tie goes to the
tombstone: ``invariants.check_table``); every delete is written exactly as sealed, at its
timestamp, by its key (``Oracle.judge``), so a replay or a retry leaves the same state.

Everything a deletes world draws comes from an RNG of its own (``deletes:<seed>``), as the
store's and the lists' do: a world without deletes draws from the others exactly what it drew
before. :data:`ENV_DELETES`: ``1`` (the default) draws deletes worlds when the code under test
has change streams (``recovery/cql/changes.py``), holding back the case the sink fails today (README.md,
"Deletes: what it finds": with a ``writetime`` column a delete carries nulls, not values, in
its other columns); ``all`` draws it too; ``0`` none.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter

from .oracle import (OP_COLUMN, PARTITION_DELETE_VALUE, ROW_DELETE_VALUE, WRITETIME_COLUMN,
                     RunOptions)
from .marker import knows_marker
from .patches import has_module

ENV_DELETES = "CASSANDRA_WAL_SIM_DELETES"
#: 1 world in this many is a deletes world (CASSANDRA_WAL_SIM_DELETES_SHARE=1: every world).
ENV_DELETES_SHARE = "CASSANDRA_WAL_SIM_DELETES_SHARE"
UPSERT_VALUES = ("c", "u", "r")
#: The columns a delete's before-image may fill (those of the tables that have them).
VALUE_COLUMNS = ("v", "w", "l", "fl")


def knows_deletes() -> bool:
    """The code under test has change streams (``op.column``: ``recovery/cql/changes.py``)."""
    return has_module("recovery.cql.changes")


class Deletes:
    """A world's change streams: whether it has them (:attr:`on`), its source of write
    timestamps (:attr:`writetime`), whether it deletes partitions (:attr:`partitions`), and
    its rows' operations (:meth:`rows`)."""

    def __init__(self, seed: int, counts: Counter, clustered: bool):
        self.rng = random.Random(f"deletes:{seed}")
        setting = os.environ.get(ENV_DELETES, "1")
        share = int(os.environ.get(ENV_DELETES_SHARE, "4"))
        self.on = setting != "0" and knows_deletes() and self.rng.randrange(share) == 0
        self.writetime = self.on and self.rng.random() < 0.4
        self.partitions = self.on and clustered and self.rng.random() < 0.7
        # Held back (README.md, "Deletes: what it finds"): with a writetime column, a drop of a
        # column blocks a batch for the values its deletes carry (they write no cell).
        self.before_images = not self.writetime or setting == "all"
        self.counts = counts

    def describe(self) -> str:
        return ("change streams (op.column=op" + (", partition deletes" if self.partitions else "")
                + (", a source-order writetime" if self.writetime else ", sealed timestamps")
                + ")")

    def options(self, options: RunOptions) -> RunOptions:
        """A run's options in this world: a change stream, with the world's source of write
        timestamps (whatever the run drew otherwise)."""
        if not self.on:
            return options
        return dataclasses.replace(options, op_column=True, partition_deletes=self.partitions,
                                   writetime=self.writetime, marker=knows_marker())

    def rows(self, drawn: dict[int, list[dict]]) -> dict[int, list[dict]]:
        """The batch's rows (partition -> rows, as Spark gives them) as a change stream: each
        with its operation, some changing a key an earlier row changed, each key's changes in
        one partition unless a source-order ``writetime`` decides."""
        if not self.on:
            return drawn
        rng = self.rng
        source = [row for p in sorted(drawn) for row in drawn[p]]    # the source's order
        for i, row in enumerate(source):
            row[OP_COLUMN] = self._operation()
            if i and rng.random() < 0.4:
                earlier = rng.choice(source[:i])
                row["k"], row["c"] = earlier["k"], earlier["c"]
            if row[OP_COLUMN] == PARTITION_DELETE_VALUE:
                row["c"] = None if rng.random() < 0.5 else row["c"]
            elif row["c"] is None:          # a key taken from a partition delete's
                row["c"] = rng.randrange(2)
            if row[OP_COLUMN] in (ROW_DELETE_VALUE, PARTITION_DELETE_VALUE) and \
                    not self.before_images:
                row.update({c: None for c in VALUE_COLUMNS if c in row})
        if self.writetime:
            self._ties(source)
            out = {p: [] for p in drawn}
            for row in source:
                out[rng.choice(sorted(drawn))].append(row)
        else:
            out = {p: [row for row in source if sorted(drawn)[row["k"] % len(drawn)] == p]
                   for p in drawn}
        self._count(out)
        return out

    def chunk_rows(self) -> int:
        """The rows of each Arrow batch Spark hands a task of an execution: in a deletes
        world 1 to 3, so that a chunk's rows have timestamps and operations of their own
        (:func:`tests.sim.spark.record_batches`); else 1, as before."""
        return self.rng.choice((1, 2, 3)) if self.on else 1

    def _operation(self) -> str:
        """A row's operation: a partition delete 1 in 10 (where the world has them), a row
        delete up to 4 in 10, else an upsert."""
        r = self.rng.random()
        if self.partitions and r < 0.1:
            return PARTITION_DELETE_VALUE
        return ROW_DELETE_VALUE if r < 0.4 else self.rng.choice(UPSERT_VALUES)

    def _ties(self, source: list[dict]) -> None:
        """Now and then a delete at the timestamp of its key's change before it (the tombstone
        wins the tie): a row delete of the same row, a partition delete of the same partition."""
        for i, row in enumerate(source):
            op = row[OP_COLUMN]
            if op not in (ROW_DELETE_VALUE, PARTITION_DELETE_VALUE) or self.rng.random() >= 0.2:
                continue
            before = [r for r in source[:i] if r["k"] == row["k"] and
                      (op == PARTITION_DELETE_VALUE or r["c"] == row["c"])]
            if before:
                row[WRITETIME_COLUMN] = before[-1][WRITETIME_COLUMN]
                self.counts["deletes: a delete tied with its key's change before it"] += 1

    def _count(self, rows: dict[int, list[dict]]) -> None:
        for partition in rows.values():
            ops = Counter(row[OP_COLUMN] for row in partition)
            self.counts["deletes: row deletes"] += ops[ROW_DELETE_VALUE]
            self.counts["deletes: partition deletes"] += ops[PARTITION_DELETE_VALUE]
            keys = Counter((row["k"], row["c"]) for row in partition)
            if any(n > 1 for n in keys.values()):
                self.counts["deletes: a key changed twice in a partition of a batch"] += 1
