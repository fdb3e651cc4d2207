"""Preparing a write, staging a task's rows, and sealing a batch: the sink's three steps.

``prepare_write`` runs where Spark builds the writer (a Python worker on the driver host), once
per micro-batch: it parses the options, resolves the WAL, validates the DataFrame against the
live table (cached in ``target.json`` by a fingerprint of schema and options, so the table is
read once per query, not once per batch) and returns a picklable :class:`WritePlan`.
``stage_partition`` runs in every task; ``commit_batch`` in Spark's commit worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

import recovery.cql.connection
import recovery.cql.table
from recovery.cql import credentials
from recovery.cql.config import WriteConfig
from recovery.cql.convert import row_converter
from recovery.cql.errors import OptionError, SinkError
from recovery.cql.marker_table import prepare_table as prepare_marker_table
from recovery.config import SinkConfig
from recovery.target import RecordedTarget, Target
from wal import checkpoint as ckpt
from wal import clock
from wal.batch_jobs import TableJobs, TableTimestamps
from wal.binding import bind
from wal.crashpoints import crash_point
from wal.errors import WalBoundElsewhere, WalError, WalFull, WalMoveRefused
from wal.files import others_can_write
from wal.format import POINTER_FILE, SEGMENTS_DIR, batch_name
from wal.layout import WalDir
from wal.move import confirm_current, follow_move
from wal.pointer import (
    pointed_wals,
    pointer_name,
    read_pointers,
    read_slot,
    table_slug,
    write_pointer,
)
from wal.remote import spool_dir
from wal.schemes import LOCAL_SCHEME, is_remote, is_store_scheme, store_schemes_text
from wal.stores import StoreAccess, use_access
from wal.seal import COMMIT_POINT_CHECKPOINT, Seal, read_seal, seal_batch
from wal.segment import SegmentRef, SegmentWriter

from .key_order import KeyCollector, KeyColumns, check_one_task_per_key, keys_checked
from .options import parse_options
from .validation import (
    check_operations_and_keys,
    check_partition_key_not_empty,
    check_ttl_and_writetime,
    validate_schema,
)

log = logging.getLogger(__name__)

DEFAULT_STREAM_WAL = "cassandra_wal"         # <checkpointLocation>/cassandra_wal


@dataclass(frozen=True)
class WritePlan:
    """Everything a task and the commit need; picklable, built once per batch."""

    config: SinkConfig
    wal_root: str
    target: Target
    stored_columns: tuple[str, ...]     # written columns + ttl/writetime columns, staged as is
    wal_store: str | None = None        # the store's URI when the WAL is on one (wal_root is
                                        # then the driver host's working copy)
    access: StoreAccess = field(default_factory=StoreAccess)   # how tasks and the commit reach
                                                               # it (the session's)
    checkpoint: str | None = None       # a stream's checkpoint, resolved (a path or a URI)

    @property
    def wal(self) -> WalDir:
        """The WAL as the driver host works on it (the commit)."""
        return WalDir(self.wal_root)

    @property
    def task_wal(self) -> WalDir:
        """Where a task stages its segment: the WAL's folder, or, for a WAL on a store, a spool
        on the task's own host, published to the store from there."""
        if self.wal_store is None:
            return self.wal
        return WalDir(spool_dir(self.wal_store), spool_for=self.wal_store)


@dataclass
class StageMessage(WriterCommitMessage):
    """A task's commit message: the segment it wrote (None when its partition was empty) and,
    for a change stream in sealed order, the keys it staged (:mod:`.key_order`)."""

    segment: dict | None
    query_id: str = ""
    keys: bytes | None = None


#: Raised when what a target records of its table grows (2: its static columns), so that a
#: query's first batch after an upgrade reads its table again instead of the older record.
_TARGET_RECORD_REVISION = 2


def _fingerprint(config: SinkConfig, schema_json: str) -> str:
    body = json.dumps([config.public_dict(), schema_json, _TARGET_RECORD_REVISION],
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def resolve_location(option: str, location: str,
                     filesystems: ckpt.Filesystems = ckpt.LOCAL) -> str:
    """Where Spark uses ``location`` (a location without a scheme is on the session's default
    filesystem): a local path, or the URI of a store the sink can reach (HDFS, S3); an
    OptionError naming ``option`` for any other filesystem, before anything is staged."""
    resolved = filesystems.resolve(location)
    if resolved.local is not None:
        return resolved.local
    if not is_store_scheme(resolved.uri.split(":", 1)[0]):
        raise OptionError(
            option, location,
            f"Spark uses it as {resolved.uri} (the session's fs.defaultFS is "
            f"{filesystems.default_fs}), a filesystem this sink cannot reach: use a local or "
            f"mounted path, {store_schemes_text()} (docs/user-guide.md, 'Deployment')")
    return resolved.uri


def resolve_wal_root(config: SinkConfig, streaming: bool,
                     filesystems: ckpt.Filesystems = ckpt.LOCAL, job_id: str | None = None,
                     wal_per_table: bool = False) -> str:
    """Where the WAL of a stream is (``wal.path``, else ``<checkpointLocation>/cassandra_wal``,
    on the checkpoint's filesystem; for a ``foreachBatch`` writer, ``wal_per_table``, one WAL
    per table: :func:`table_wal_location`), or of batch job ``job_id`` (under the table's root:
    ``wal.path``, else ``~/.cassandra_wal/<keyspace>.<table>``; see :mod:`wal.batch_jobs`): a local
    path or a store's URI. Refuses a location the sink cannot reach before anything is staged;
    touches nothing, and reads only to find a foreachBatch writer's WAL."""
    checkpoint = None
    if streaming:
        if not config.checkpoint_location:
            # Also with wal.path: the driver's flusher finds a query's WAL through its
            # checkpoint, so without one nothing would ever be flushed.
            raise OptionError("checkpointLocation", None,
                              "required: the sink flushes a batch only once Spark's checkpoint "
                              "has committed it")
        checkpoint = resolve_location("checkpointLocation", config.checkpoint_location,
                                      filesystems)
    if config.wal.path:
        root = resolve_location("wal.path", config.wal.path, filesystems)
    elif streaming:
        root = _in_checkpoint(checkpoint, DEFAULT_STREAM_WAL)
        if wal_per_table:
            root = table_wal_location(checkpoint, config.keyspace, config.table)
    else:
        root = os.path.join(os.path.expanduser("~"), ".cassandra_wal",
                            f"{config.keyspace}.{config.table}")
    if job_id is None:
        return root
    if is_remote(root):
        raise OptionError("wal.path", config.wal.path,
                          f"a batch df.write keeps its WAL in a local or mounted folder, and "
                          f"Spark resolves this one (against the session's fs.defaultFS) to "
                          f"{root}, on a store: only streams' WALs can be there for now; give "
                          f"a {LOCAL_SCHEME}:///... path")
    return TableJobs(root).job_root(job_id)


def _in_checkpoint(checkpoint: str, name: str) -> str:
    return checkpoint.rstrip("/") + "/" + name if is_remote(checkpoint) \
        else os.path.join(checkpoint, name)


def table_wal_location(checkpoint: str, keyspace: str, table: str) -> str:
    """A ``foreachBatch`` writer's WAL: one per (query, table), so that a function writing
    several tables keeps each table's batches, seals and timestamps apart
    (``<checkpoint>/cassandra_wal.<keyspace>.<table>``; a name CQL would need quoting becomes a
    hash). Except where ``<checkpoint>/cassandra_wal``, this query's WAL (an earlier release
    kept a foreachBatch writer's WAL there), already writes this very table: it stays the
    table's WAL, pending batches and all."""
    shared = _in_checkpoint(checkpoint, DEFAULT_STREAM_WAL)
    if shared in pointed_wals(checkpoint):
        recorded = RecordedTarget.read(WalDir.at(shared))
        config = recorded.target.config if recorded and recorded.target_fields else None
        if config is not None and (config.keyspace, config.table) == (keyspace, table):
            return shared
    return _in_checkpoint(checkpoint, f"{DEFAULT_STREAM_WAL}.{table_slug(keyspace, table)}")


def open_wal_dir(location: str) -> WalDir:
    """The WAL at ``location``, created if new: a local folder, or this host's working copy of
    a WAL on a store (:meth:`WalDir.at`)."""
    wal = WalDir.at(location).create()
    _check_private(wal.root)
    wal.check()
    return wal


def _check_private(root: str) -> None:
    if others_can_write(root):
        raise OptionError("wal.path", root, "the WAL directory is writable by group or others; "
                          "it holds rows in plain form: chmod 700 it or choose another path")


def prepare_write(options, session_conf, spark_schema, streaming: bool,
                  credential_channel: str | None = None,
                  filesystems: ckpt.Filesystems = ckpt.LOCAL,
                  job_id: str | None = None, wal_per_table: bool = False,
                  on_wal: Callable[[WalDir], None] | None = None,
                  claim: Callable[[WalDir], None] | None = None) -> WritePlan:
    """Parse, resolve, validate. Raises a SinkError naming the option/column at fault.

    A stream whose *options* carry credentials hands them to the driver's flusher over
    ``credential_channel`` (:mod:`recovery.cql.credentials`; in memory only, never in the WAL).
    ``filesystems``: what Spark resolves the checkpoint against (the session's default
    filesystem). ``job_id``: a batch job's id; its WAL is its own (:mod:`wal.batch_jobs`).
    ``wal_per_table``: a ``foreachBatch`` writer's (:func:`table_wal_location`). ``on_wal``:
    called with the WAL once it is resolved, bound to the stream and pointed at, before the
    table is looked up (a foreachBatch writer records its entry there: a lookup that fails,
    Cassandra away, must not make the call look like no call). ``claim``: called with the WAL
    before the checkpoint's pointer names it (a foreachBatch writer refused a WAL another
    table writes leaves no pointer to it).
    """
    options = dict(options)
    use_access(filesystems.access)
    config = parse_options(options, session_conf)
    if config.wal.marker_table is not None and not streaming:
        raise OptionError("marker.table", config.wal.marker_table,
                          "a batch job has no query whose batches a marker could count: "
                          "drop the option (its save() returns once every row is written)")
    wal = open_wal_dir(resolve_wal_root(config, streaming, filesystems, job_id, wal_per_table))
    if job_id is not None:
        _check_private(TableJobs.of_job(wal.root).root)
    # Resolved (and refused if unreachable) by resolve_wal_root; a stream always has one.
    checkpoint = resolve_location("checkpointLocation", config.checkpoint_location,
                                  filesystems) if streaming else None
    if checkpoint is not None:
        _check_bound(wal, checkpoint)
        if claim is not None:
            claim(wal)
        # Pointed at before anything else can fail (the table's lookup): a WAL that holds
        # anything (an entry) is one the driver's listener knows.
        slot = (config.keyspace, config.table) if wal_per_table else None
        moved_from = _follow_a_move(wal, checkpoint, slot)
        write_pointer(checkpoint, wal.location, slot)
    else:
        moved_from = None
    if on_wal is not None:
        on_wal(wal)
    if config.write.op_column is not None:
        wal.hold_changes()
    fingerprint = _fingerprint(config, spark_schema.json())
    recorded = RecordedTarget.read(wal)
    if recorded is not None and recorded.fingerprint == fingerprint:
        target = recorded.target
    else:
        earlier = recorded or (RecordedTarget.read(moved_from) if moved_from else None)
        timestamps = _kept_source_of_timestamps(earlier, config.write,
                                                [w for w in (wal, moved_from) if w])
        cluster, session = recovery.cql.connection.connect(config.connection)
        try:
            table = recovery.cql.table.fetch_table_schema(cluster, config.keyspace, config.table)
            cluster_name = cluster.metadata.cluster_name
            if config.wal.marker_table is not None:
                prepare_marker_table(cluster, session, config.wal.marker_table,
                                     config.keyspace, config.wal.marker_create)
        finally:
            cluster.shutdown()
        columns = validate_schema(spark_schema, table, config.write)
        target = Target(config, table, tuple(columns), cluster_name)
        RecordedTarget.of(target, fingerprint, timestamps).write(wal)
    if streaming and credentials.given_in(options):
        credentials.hand_over(credential_channel, wal.root, config.connection)
    write = config.write
    extra = tuple(c for c in (write.ttl_column, write.writetime_column, write.op_column) if c)
    return WritePlan(config, wal.root, target, target.columns + extra,
                     wal.remote.uri if wal.remote else None, filesystems.access, checkpoint)


def _source_order(write: WriteConfig) -> str:
    if write.writetime_column is not None:
        return f"the column {write.writetime_column!r}"
    if write.writetime_micros is not None:
        return f"the constant {write.writetime_micros}"
    return "sealed timestamps (writetime unset)"


def _kept_source_of_timestamps(earlier: RecordedTarget | None, write: WriteConfig,
                               wals: list[WalDir]) -> str | None:
    """Where a change stream of this WAL takes its write timestamps from (what ``target.json``
    keeps, once one wrote it: :attr:`RecordedTarget.change_stream_timestamps`). Refuses
    another source, now or at any later write of the WAL, a plain stream's too, once a batch
    was sealed (``wals``: the WAL, and the one it moved from): sealed timestamps are each
    seal's time, a ``writetime`` column the source's, and the two need not be comparable, so
    every new write, a delete too, could lose to (or hide) the older cells of the other kind.
    A plain stream that was never a change stream may change its ``writetime``, as before."""
    now = _source_order(write)
    if earlier is None or not earlier.target_fields:
        return now if write.op_column else None
    before = earlier.target.config.write
    kept = earlier.change_stream_timestamps or (_source_order(before) if before.op_column
                                                else None)
    reference = kept or _source_order(before)
    if (kept is not None or write.op_column) and now != reference and any(
            w.read_flushed_through() >= 0 or w.sealed_batch_ids() for w in wals):
        given = write.writetime_column or (None if write.writetime_micros is None
                                           else str(write.writetime_micros))
        raise OptionError("writetime", given,
                          f"this WAL's batches were written at {reference}"
                          f"{' by a change stream' if kept else ''}, and now would be at "
                          f"{now}: a write at the one need not be later than a cell at the "
                          "other, so updates and deletes could lose to older cells. Keep the "
                          "earlier writetime, or start the new one on a new checkpoint and "
                          "table (docs/user-guide.md, 'Change streams')")
    return kept or (now if write.op_column else None)


def _follow_a_move(wal: WalDir, checkpoint: str, slot: tuple[str, str] | None
                   ) -> WalDir | None:
    """``wal`` is where the stream's WAL (for ``slot``) is now; if the pointer names another,
    the WAL moved: refused while the old one has committed batches to write, else the new one
    starts where the old one ended (:func:`wal.move.follow_move`). Returns the old one (None:
    no move)."""
    previous = read_slot(checkpoint, slot)
    if previous == wal.location:
        confirm_current(wal)        # a move to another WAL that failed before its pointer
        return None
    if previous is None:
        return None
    # Another table's pointer naming the old WAL too (not the data source's pointer, which an
    # earlier release's foreachBatch writers shared): it stays that table's WAL, neither
    # checked nor told of the move (a writer refused a shared wal.path never had it to itself).
    others = {name: location for name, location in read_pointers(checkpoint).items()
              if name not in (POINTER_FILE, pointer_name(slot))}
    shared = slot is not None and previous in others.values()
    old = WalDir.at(previous)
    try:
        follow_move(old, wal, checkpoint, leave_old=not shared)
    except WalMoveRefused as exc:
        raise OptionError("wal.path", wal.location, str(exc)) from None
    return old


def _check_bound(wal: WalDir, checkpoint: str) -> None:
    """The stream's WAL is its own (:mod:`wal.binding`), before anything is recorded in it."""
    try:
        bind(wal, checkpoint)
    except WalBoundElsewhere as exc:
        raise OptionError("wal.path", wal.root, str(exc)) from None


# -- tasks ----------------------------------------------------------------------------------
def _select(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.RecordBatch:
    return batch.select(list(columns)) if tuple(batch.schema.names) != columns else batch


def stage_partition(plan: WritePlan, batches: Iterable[pa.RecordBatch], batch_id: int,
                    partition: int, attempt: int, query_id: str = "") -> StageMessage:
    """Stage one task's rows as a segment. Nothing is left behind if anything fails."""
    use_access(plan.access)
    keys = KeyColumns.of(plan.target)
    key_columns, partition_key = list(keys.primary), list(keys.partition)
    single_partition_key = partition_key[0] if len(partition_key) == 1 else None
    values = row_converter(plan.target.table, plan.target.columns)
    write = plan.config.write
    collector = KeyCollector(keys, write) if keys_checked(write) else None
    header = {"query_id": query_id, "columns": list(plan.stored_columns)}
    writer: SegmentWriter | None = None
    try:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            rb = _select(rb, plan.stored_columns)
            check_operations_and_keys(rb, key_columns, partition_key, write)
            check_ttl_and_writetime(rb, write)
            if single_partition_key is not None:
                check_partition_key_not_empty(rb, single_partition_key)
            values.validate(rb)
            if collector is not None:
                collector.add(rb)
            if writer is None:
                writer = SegmentWriter(plan.task_wal, batch_id, partition, attempt, header)
            writer.append(rb)
            if writer.chunks == 1:
                crash_point("stage.mid")
        ref = writer.finish() if writer is not None else None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    crash_point("stage.after")
    if ref is None:
        return StageMessage(None, query_id)
    return StageMessage(ref.to_dict(), query_id, collector.finish() if collector else None)


# -- commit ---------------------------------------------------------------------------------
def check_not_blocked(wal: WalDir) -> None:
    if wal.remote:      # the flusher's word, wherever its working copy is
        wal.remote.pull_state(wal.root)
    reason = wal.read_blocked()
    if reason is None:
        return
    raise SinkError(f"the WAL at {wal.root} is blocked and no new batch is accepted: {reason}")


def backlog_bytes(wal: WalDir, committing: int) -> int:
    """What ``wal.maxBytes`` caps: the bytes the seals name of every batch sealed above the
    highest flushed batch but ``committing`` (what the flusher has yet to write). From the
    seals' own byte counts (decoded once per process, :func:`wal.seal.read_seal`), never a
    walk of the segment files: one look per pending batch, not per segment, at every commit
    and every second a commit is held. Staged files no seal names are not counted: a losing
    attempt's or an aborted batch's leftovers are never written, and the next drain removes
    them (and a flushed batch's, should a crash have kept them). On a store, its seals and
    its ``flushed_through`` marker (whichever host's working copy the flusher pulls into)."""
    if wal.remote:
        wal.remote.pull_state(wal.root)
        wal.remote.pull_seals(wal.root)
    through = wal.read_flushed_through()
    seals = (read_seal(wal, b) for b in wal.sealed_batch_ids()
             if b > through and b != committing)
    return sum(seal.bytes for seal in seals if seal is not None)


def wait_for_room(plan: WritePlan, batch_id: int, sleep=clock.sleep,
                  monotonic=clock.monotonic) -> None:
    """Back-pressure: hold the commit of ``batch_id`` while the backlog before it (segment
    bytes of earlier batches, sealed but not yet flushed) exceeds ``wal.maxBytes``.

    The batch being committed is not counted: it is on disk already, and a batch larger than
    the cap must not fail forever (Spark re-runs it with the same rows). So the WAL's segments
    stay under ``wal.maxBytes`` plus one batch.

    ``wal.backpressure=block`` waits (up to ``wal.backpressure.timeoutSeconds``) for the
    flusher to drain; ``fail`` fails at once. Either way the failure is a WalFull naming the
    cap, the batch is not sealed, and Spark re-runs it on restart: nothing is lost.
    """
    cap = plan.config.wal.max_bytes
    size = backlog_bytes(plan.wal, batch_id)
    if size <= cap:
        return
    started = monotonic()
    timeout = 0.0 if plan.config.wal.backpressure == "fail" else plan.config.wal.backpressure_timeout_s
    while size > cap:
        waited = monotonic() - started
        if waited >= timeout:
            raise WalFull(plan.wal_root, size, cap, waited)
        log.warning("batch %d: WAL backlog over its cap (%d > %d bytes): holding the commit",
                    batch_id, size, cap)
        sleep(min(1.0, timeout - waited))
        size = backlog_bytes(plan.wal, batch_id)


def check_segments_visible(wal: WalDir, refs: list[SegmentRef], batch_id: int,
                           wait_s: float = 5.0, sleep=clock.sleep) -> None:
    """Every segment about to be sealed is where the flusher will read it, at the size its
    task reported: in the WAL's folder as the driver host sees it, or on the WAL's store.
    Tasks stage on executors; if the WAL path is not one filesystem that every executor and
    the driver share, a segment is on some executor's local disk and nothing could replay it:
    fail the commit (before Spark writes ``commits/N``, so Spark re-runs the batch) instead of
    sealing data the flusher cannot reach."""
    def absent() -> list[str]:
        if wal.remote:      # one listing: a store publishes a segment whole or not at all
            prefix = f"{SEGMENTS_DIR}/"
            there = {key[len(prefix):] for key in
                     wal.remote.store.list(f"{SEGMENTS_DIR}/{batch_name(batch_id)}")}
            return [ref.name for ref in refs if ref.name not in there]
        out = []
        for ref in refs:
            try:
                size = os.path.getsize(wal.segment_path(ref.name))
            except FileNotFoundError:
                size = None
            if size != ref.bytes:
                out.append(ref.name)
        return out

    missing = absent()
    deadline = clock.monotonic() + wait_s
    while missing and clock.monotonic() < deadline:   # a shared filesystem's caches catching up
        sleep(0.2)
        missing = absent()
    if missing:
        raise SinkError(
            f"batch {batch_id}: {len(missing)} of {len(refs)} staged segments are not visible "
            f"in {wal.location}/{SEGMENTS_DIR} from the driver host (e.g. {missing[0]}): the "
            f"WAL path must be a store or a filesystem that every executor and the driver "
            f"share, mounted at the same path (see 'Deployment' in docs/user-guide.md)")


def check_not_committed(checkpoint: str, batch_id: int) -> None:
    """Spark never runs the commit of a batch it has committed: one that comes after
    ``commits/N`` is a run that lost its query to another driver (a zombie), and its seal would
    replace the one Spark committed (the newest seal wins). Refused, nothing sealed. (A zombie
    that checks just before the other driver's commit still gets through: two live drivers of
    one query are not fenced, here or by Spark.)"""
    if ckpt.is_committed(checkpoint, batch_id):
        raise SinkError(f"batch {batch_id}: Spark has committed it already (in {checkpoint}): "
                        f"this commit comes from a run of the query that another driver "
                        f"replaced; nothing was sealed")


def commit_batch(plan: WritePlan, messages: Iterable[StageMessage | None], batch_id: int,
                 commit_point: str = COMMIT_POINT_CHECKPOINT,
                 shared_timestamps: TableTimestamps | None = None,
                 seal_id: str | None = None) -> Seal:
    """Seal the batch: the winning segments and the write timestamps, durably, before return.
    ``shared_timestamps``: a batch job's table's last timestamp; ``seal_id``: the one
    announced (both :func:`wal.seal.seal_batch`)."""
    use_access(plan.access)
    messages = [m for m in messages if m is not None]
    staged = [m for m in messages if m.segment]
    refs = [SegmentRef.from_dict(m.segment) for m in staged]
    query_id = next((m.query_id for m in messages if m.query_id), "")
    check_not_blocked(plan.wal)
    check_segments_visible(plan.wal, refs, batch_id)
    if keys_checked(plan.config.write):
        check_one_task_per_key(plan.wal, KeyColumns.of(plan.target), batch_id,
                               [(ref, m.keys) for ref, m in zip(refs, staged)])
    wait_for_room(plan, batch_id)
    if commit_point == COMMIT_POINT_CHECKPOINT and plan.checkpoint is not None:
        check_not_committed(plan.checkpoint, batch_id)
    crash_point("commit.before_seal")
    seal = seal_batch(plan.wal, batch_id, refs, query_id=query_id, commit_point=commit_point,
                      write=plan.target.write_record(), shared_timestamps=shared_timestamps,
                      seal_id=seal_id)
    crash_point("commit.after_seal")
    return seal


__all__ = ["WritePlan", "StageMessage", "prepare_write", "stage_partition", "commit_batch",
           "resolve_wal_root", "WalError"]
