"""The protocol's invariants, checked after every step of a schedule and at its end.

* Every write Cassandra received is exactly a row of a *committed* execution, with the cells,
  timestamp and TTL its seal gives it: nothing of an uncommitted batch is ever written, a
  replay writes identical cells, pending batches keep the options they were sealed with; a
  row with a TTL expires at the instant of its seal plus its TTL, whatever the clocks of the
  hosts say (within the skew tolerated: ``oracle.py``, ``clocks.py``), and once that instant
  is past it is written as a tombstone of each column it writes, at its timestamp.
* The sink never blocks (``blocked.json``) where a retry could proceed: the simulation injects
  no corruption, so any block is wrong, but one: a foreachBatch function that caught its
  writer's error lost that batch's rows for the table, and that table's WAL blocks there
  (and writes nothing after it).
* The staged segments and the seal of a batch still being executed are never removed under
  it (by another job's flush, by retention, by another query's recovery).
* A drain or recovery that met no fault, with the node up, leaves every batch Spark committed
  written (so a flusher never waits forever, and after an outage a drain makes progress).
* At the end, after recovery with the node up, every committed execution is written, and the
  table holds, per cell, the newest expected write (last write wins), unless a change stream
  deleted its row or partition at or above it (``deletes.py``: the tombstone wins a tie).
* The figures an operator is shown agree: after such a drain, nothing is pending and the sink
  is not said to be blocked.
* A non-frozen list holds each committed row's elements once; a whole number of times (at least
  once) only where its batch was sealed with ``wal.lists.atLeastOnce`` naming it. A query
  writing one without that option is refused before anything is staged (by code that has the
  option: :mod:`tests.sim.streams`, :mod:`tests.sim.batch_jobs`).
"""

from __future__ import annotations

import os

from tests.helpers.fake_cassandra import NON_FROZEN, Deletions, ListCells

from .cassandra import bare
from .marker import check_marker, is_marker_write
from .oracle import MARKER_TABLE, fmt

# The file the sink writes when it cannot go on (wal/FORMAT.md). Named here, not imported:
# the simulation also runs against older code, which kept the constant elsewhere.
BLOCKED_FILE = "blocked.json"


class Violation(Exception):
    def __init__(self, invariant: str, detail: str):
        super().__init__(f"{invariant}: {detail}")
        self.invariant, self.detail = invariant, detail


def absorb_writes(world) -> None:
    """Judge every write the node applied since the last look."""
    oracle, writes = world.oracle, world.node.writes
    start = getattr(world, "writes_seen", 0)
    for i, w in enumerate(writes[start:], start):
        if is_marker_write(w):
            why = check_marker(world, w)
            if why is not None:
                world.writes_seen = i + 1
                raise Violation("the completeness marker never runs ahead", why)
            continue
        why, expected = oracle.judge(w)
        if why is not None:
            world.writes_seen = i + 1
            raise Violation("every write is a committed batch's row, as sealed",
                            f"{why}: Cassandra got {fmt(w)} at {w.at_s:.3f}s")
        if world.after_loss(oracle.judged):
            world.writes_seen = i + 1
            raise Violation("a WAL that lost a batch writes nothing after it",
                            f"{oracle.judged.label} comes after a batch its WAL lost (the "
                            f"function caught its writer's error): Cassandra got {fmt(w)} at "
                            f"{w.at_s:.3f}s")
        changes = getattr(world, "changes", None)
        hidden = changes.hidden_on_arrival(world, w, oracle.judged) if changes else None
        if hidden is not None:
            world.writes_seen = i + 1
            raise Violation("no cell a drop hides counts as written", hidden)
        if w.deletion and expected not in oracle.applied:
            world.counts["deletes: deletes Cassandra got"] += 1     # deletes.py
        oracle.first.setdefault((w.table, w.key, w.ts), w)
        oracle.applied.add(expected)
    world.writes_seen = len(writes)


def check_lists(world) -> None:
    """Every non-frozen list's elements of one write timestamp are its committed row's list:
    once, or, where the row's batch accepted at-least-once for it, a whole number of copies.
    (Which rows may be written at all is :func:`absorb_writes`'s to judge.)"""
    now_s = world.clock_us / 1e6
    for (table, key), row in world.node.rows.items():
        for column, cells in row.items():
            if not isinstance(cells, ListCells):
                continue
            for ts, values in cells.live(now_s).items():
                sealed = [(x, e) for x, e in world.oracle.by_stamp.get((table, key, ts), [])
                          if x.committed and dict(e.cells).get(column)]
                if not sealed:
                    continue
                x, e = sealed[0]
                want = list(dict(e.cells)[column])
                copies = len(values) // len(want)
                whole = values == want * copies
                at_least_once = x.options.lists_opt_in
                if whole and (copies == 1 or at_least_once):
                    continue
                what = (f"{table}{list(key)}.{column} holds {values} at {ts}, its row of "
                        f"{x.label} wrote {want}")
                if not at_least_once:
                    raise Violation("a non-frozen list holds a committed row's elements once",
                                    f"{what}: it was written {copies} times and each write "
                                    f"appended the elements again (CASSANDRA-11368)")
                raise Violation("a list written at least once holds whole copies of its row",
                                what)


def check_step(world) -> None:
    absorb_writes(world)
    check_lists(world)
    for root in sorted(world.wal_roots):
        path = os.path.join(root, BLOCKED_FILE)
        if os.path.exists(path):
            with open(path) as f:
                reason = f.read()
            if not world.block_allowed(root, reason):
                raise Violation("the sink never blocks where a retry could proceed",
                                f"{path}: {reason}")
    store = getattr(world, "store", None)
    if store is not None:
        for location in sorted(world.store_wals):
            reason = store.raw(location).read(BLOCKED_FILE)
            if reason is not None and not world.block_allowed(location, reason.decode()):
                raise Violation("the sink never blocks where a retry could proceed",
                                f"{location}/{BLOCKED_FILE} on the store: {reason.decode()}")
    for owner, inflight in _live(world):
        if world.excused(inflight.execution):     # a forced recover took it (operators.py)
            continue
        plan = getattr(inflight.plan, "plan", inflight.plan)
        if getattr(plan, "wal_store", None):
            _check_live_on_store(store, owner, inflight, plan.wal_store)
            continue
        wal = _wal_of(inflight.plan)
        for message in inflight.winners.values():
            if message is not None and message.segment and \
                    not os.path.exists(wal.segment_path(message.segment["name"])):
                raise Violation("a batch's staged rows stay until it is committed",
                                f"{inflight.execution.label}: the winning segment "
                                f"{message.segment['name']} of {owner} was deleted before "
                                f"its commit")
        if inflight.sealed and not os.path.exists(wal.seal_path(inflight.execution.batch)):
            raise Violation("a batch's staged rows stay until it is committed",
                            f"{inflight.execution.label}: its seal was deleted before Spark "
                            f"committed it")


def _check_live_on_store(store, owner: str, inflight, location: str) -> None:
    """A batch in flight on a store: its winning segments are on the store (the working copy
    pulls them only to flush), and once sealed the newest seal version is the one its commit
    returned, until Spark commits it (a later version would be the batch's seal instead)."""
    from wal.seal import encode_seal

    local, e = store.raw(location), inflight.execution
    for message in inflight.winners.values():
        if message is not None and message.segment and \
                local.read(f"segments/{message.segment['name']}") is None:
            raise Violation("a batch's staged rows stay until it is committed",
                            f"{e.label}: the winning segment {message.segment['name']} of "
                            f"{owner} was deleted from the store before its commit")
    if inflight.sealed:
        versions = local.list(f"seals/{_batch_name(e.batch)}")
        if not versions:
            raise Violation("a batch's staged rows stay until it is committed",
                            f"{e.label}: its seal was deleted from the store before Spark "
                            f"committed it")
        if local.read(versions[-1]) != encode_seal(e.seal):
            raise Violation("the newest seal version is the last commit's",
                            f"{e.label}: {versions[-1]} on the store is not the seal its "
                            f"commit returned (a later commit published over it)")


def _batch_name(batch: int) -> str:
    from wal.format import batch_name

    return batch_name(batch)


def check_store_end(world) -> None:
    """After the final recovery, with the store up for good: nothing of a flushed batch stays
    on the store (its segments, its losing attempts', late zombies'), and nothing in the tasks'
    spools (every task, of every host, spools in the world's temp dir)."""
    from .store import leftovers, spool_leftovers

    exempt = {loc for q in world.queries if q.refused or q.invalid for loc in q.wal_uris}
    left = [x for x in leftovers(world) if not any(x.startswith(loc + "/") for loc in exempt)]
    if left:
        raise Violation("a flushed batch's segments are eventually gone from the store",
                        f"{len(left)} left, e.g. {left[0]}")
    spooled = spool_leftovers(world)
    if spooled:
        raise Violation("a task leaves nothing in its spool, published or failed",
                        f"{len(spooled)} segment files left, e.g. {spooled[0]}")


def _live(world):
    for q in world.queries:
        if q.run is not None and q.run.inflight is not None:
            yield q.owner, q.run.inflight
        if q.run is not None and q.run.call is not None:
            for c in q.run.call.live():
                yield c.owner, c.inflight
    for job in world.jobs:
        yield job.name, job.inflight


def _wal_of(plan):
    plan = getattr(plan, "plan", plan)      # a batch job's writer carries its WritePlan
    return plan.wal


def exempt_owners(world) -> set[str]:
    """Streams refused with a clear error (an invalid WAL reuse): what Spark committed for
    them before the error cannot be expected in Cassandra."""
    return {o for q in world.queries if q.refused is not None for o in q.owners | {q.owner}}


def _unwritten(world, owners=None) -> list[tuple]:
    absorb_writes(world)
    exempt = exempt_owners(world)
    now_s = world.clock_us / 1e6
    out = []
    for e in world.oracle.executions:
        if not e.committed or e.owner in exempt or (owners is not None and e.owner not in owners):
            continue
        if world.after_loss(e) or world.excused(e):   # its WAL blocks before it, rightly; or
            continue                                     # a forced recover took it (operators.py)
        missing = world.oracle.missing(e, now_s)
        if missing:
            out.append((e, missing))
    return out


def check_live(world, q, what: str, flusher=None) -> None:
    """After a fault-free drain/recovery of ``q``'s ``flusher`` with the node up: the batches
    of its WAL (a data source's stream's, or a foreachBatch writer's table's)."""
    owners = {q.owner} if q.writers is None else \
        world.wal_owners.get(flusher.wal.location, set())
    unwritten = _unwritten(world, owners)
    if unwritten:
        e, missing = unwritten[0]
        raise Violation("a drain with Cassandra up writes every batch Spark committed",
                        f"after {q.owner}'s {what}, {e.label} is committed but "
                        f"{len(missing)} of {len(e.expected)} rows never reached Cassandra "
                        f"(e.g. {fmt(missing[0])})")
    check_health(world, q, what, flusher)


def check_health(world, q, what: str, flusher=None) -> None:
    """What an operator is shown (``sinks.status``, the endpoint, ``cassandra-wal status``:
    ``recovery/health.py``) after a drain that wrote every committed batch: nothing pending,
    and not blocked (no corruption is injected: a block would page someone for nothing).
    A WAL that lost a batch (a foreachBatch function caught its writer's error): once it
    blocked, it says blocked."""
    if flusher is None or not hasattr(flusher, "health"):      # older code: no figures
        return
    if world.expects_block(flusher):
        if os.path.exists(os.path.join(flusher.wal.root, BLOCKED_FILE)) and \
                flusher.health().state != "blocked":
            raise Violation("the figures shown say what the sink does",
                            f"after {q.owner}'s {what}, the WAL at {flusher.wal.location} is "
                            f"blocked (blocked.json) but the status does not say so")
        return
    health = flusher.health()
    if health.state == "blocked":
        raise Violation("the figures shown say what the sink does",
                        f"after {q.owner}'s {what}, which wrote every committed batch, the "
                        f"status says blocked: {health.blocked_reason}")
    if health.pending_batches:
        raise Violation("the figures shown say what the sink does",
                        f"after {q.owner}'s {what}, which wrote every committed batch, the "
                        f"status says {health.pending_batches} batches are pending")


def check_written(world) -> None:
    check_step(world)
    unwritten = _unwritten(world)
    if unwritten:
        e, missing = unwritten[0]
        raise Violation("every committed batch is written once recovery runs",
                        f"{e.label} is committed but {len(missing)} of {len(e.expected)} "
                        f"rows never reached Cassandra (e.g. {fmt(missing[0])})"
                        + (f"; {len(unwritten) - 1} more batches likewise"
                           if len(unwritten) > 1 else ""))


def check_table(world) -> None:
    """What a SELECT shows against last-write-wins over every committed execution's writes.
    Called once every TTL has run out (the world's clock is moved past them), so expiry
    rounding cannot matter: an expiring winner shows nothing, and neither does a tombstone (a
    row whose TTL ran out before its first write is written as the tombstones of its columns,
    at its timestamp, as its expired cells would be). Only the writes that landed count: the
    completeness check has already made sure that nothing else is missing (only rows of no
    cell, whose TTL ran out, may be: they would leave nothing). A change stream's deletes
    (``deletes.py``) hide every cell of their row or partition at or below their timestamp:
    the committed changes applied at their sealed timestamps, whatever order they landed in."""
    want: dict[tuple, tuple] = {}
    deletions: dict[str, Deletions] = {}         # table -> its rows and partitions deleted
    for e in world.oracle.executions:
        if not e.committed:
            continue
        for w in e.expected + e.earlier:     # an amended batch: its rows written before too
            if w not in world.oracle.applied:
                continue
            if w.deletion:
                deletions.setdefault(w.table, Deletions()).delete(w.deletion, w.key, w.ts)
            for column, value in w.cells:
                cell = (w.table, w.key, column)
                if cell not in want or w.ts > want[cell][0]:
                    want[cell] = (w.ts, value, w.ttl, e)
    shown = {}
    for (table, key, column), (ts, value, ttl, _e) in want.items():
        # A column dropped (and added back) since hides every cell of it at or before the drop.
        if value is None or ttl or world.node.hidden(table, column, ts):
            continue
        if table in deletions and ts <= deletions[table].of(key):
            world.counts["deletes: cells a delete hides at the end"] += 1
            continue
        shown.setdefault((table, key), {})[column] = value
    have = {(table, key): cells for table in set(world.tables) | world.node.table_names()
            if not table.endswith(MARKER_TABLE)
            for key, cells in world.node.visible(table).items()}
    for (table, key, column), (_ts, value, _ttl, e) in want.items():
        # A list written at least once may show the winning row's elements several times
        # (check_lists made sure they are whole copies).
        cells = have.get((table, key), {})
        if e.options.lists_opt_in and \
                world.tables[bare(table)].column_type(column) in NON_FROZEN \
                and value and \
                len(cells.get(column, ())) > len(value) and \
                cells[column] == value * (len(cells[column]) // len(value)):
            cells[column] = value
    if have != shown:
        keys = sorted(set(have) | set(shown), key=repr)
        diff = [(k, have.get(k), shown.get(k)) for k in keys if have.get(k) != shown.get(k)][:3]
        raise Violation("the table ends as last write wins over the committed batches",
                        "rows differ (key, SELECT shows, expected): " + "; ".join(map(str, diff)))
