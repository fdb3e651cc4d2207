"""The completeness marker in the simulation (issue 35; ``recovery/marker.py``).

Every change stream's run (``deletes.py``: a deletes world's streams and foreachBatch writers;
batch jobs have no marker) sets ``marker.table`` to :data:`MARKER_TABLE`, which the simulated
node holds with the marker's schema (``recovery/cql/marker_table.py``). The flusher writes the marker
through the node like any write, with its faults.

The invariant, checked on each marker row the node applies (:func:`check_marker`): **the
marker never runs ahead.** A row naming batch N of a query's table comes only after every
committed execution of that query's table up to N has every row in Cassandra (what the
completeness checks count as written), so a reader that sees N there sees all of it.
"""

from __future__ import annotations

from recovery.cql.marker_table import COLUMNS, CLUSTERING_KEY, PARTITION_KEY
from recovery.cql.table import TableSchema

from .oracle import KEYSPACE, MARKER_TABLE
from .patches import has_module


def knows_marker() -> bool:
    """The code under test has the completeness marker (older code refuses the option)."""
    return has_module("recovery.marker")


def marker_schema() -> TableSchema:
    return TableSchema(KEYSPACE, MARKER_TABLE, COLUMNS, PARTITION_KEY, CLUSTERING_KEY)


def is_marker_write(write) -> bool:
    return write.table.rsplit(":", 1)[-1] == MARKER_TABLE


def check_marker(world, write) -> str | None:
    """Why this marker row runs ahead of the rows it vouches for (None: it does not)."""
    query_id, target_table = write.key
    batch = dict(write.cells)["batch_id"]
    world.counts["marker: rows written"] += 1
    now_s = world.clock_us / 1e6
    for e in world.oracle.executions:
        if not e.committed or e.query_id != query_id or e.batch > batch or \
                f"{KEYSPACE}.{e.options.table}" != target_table:
            continue
        if world.after_loss(e) or world.excused(e):
            continue
        missing = world.oracle.missing(e, now_s)
        if missing:
            return (f"the marker of {target_table} names batch {batch} while {e.label} has "
                    f"{len(missing)} of {len(e.expected)} rows not in Cassandra")
    return None
