"""The WAL's health at a glance: what is committed but not yet in Cassandra, how old it is, how
fast the flusher writes, and whether the sink is blocked. The one owner of these figures:
``sinks.status(query)``, the Prometheus endpoint (:mod:`sinks.driver.metrics_endpoint`),
``cassandra-wal status`` and ``inspect`` all read them from :func:`read_health`.

Why from the WAL on disk rather than from the flusher's memory: the operator's CLI runs in
another process (beside a live sink, or after it died) and must say the same thing as the
running sink. Everything here is derived from :func:`wal.catalog.describe` (the view recovery
plans from), ``blocked.json`` and ``target.json``; only the counts of retries, replays and
batches and rows written since the run started, which the WAL does not record, come from the
live flusher (:class:`FlushCounters`), and are ``None`` when read from outside it.

Runs: wherever it is called (the driver process, or the CLI); it reads the log through a
read-only instance and never takes the WAL's lock.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from enum import Enum

from wal import catalog
from wal import checkpoint as ckpt
from wal.catalog import BatchView, RecoveryAction
from wal.errors import WalCorrupted
from wal.layout import WalDir
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.retention import wal_size
from wal.seal import now_us, read_seal
from wal.states import BatchState

from .marker import Completeness
from .target import RecordedTarget


class HealthState(str, Enum):
    """How a sink is doing, worst last. The value is the word ``cassandra-wal status`` and
    ``inspect`` show (``--json`` too) and the ``sinks.status(query)`` figures hold: never
    changed."""

    HEALTHY = "healthy"     # every committed batch written, or being written in time
    LAGGING = "lagging"     # a committed batch older than ``lag_after_s``, or over wal.maxBytes
    BLOCKED = "blocked"     # no batch can be written until someone acts (``blocked_reason``)


#: A committed batch still unwritten after this long makes the sink "lagging" (the default of
#: ``sinks.status(query, lag_after_s=...)`` and ``cassandra-wal status --lag-after``). Two
#: micro-batches of a few seconds each plus a flush fit well under it; an outage does not.
LAG_AFTER_S = 30.0

#: Rows per second are measured over the batches flushed in the last this many seconds
#: (of those the log still holds: ``wal.retention.batches``).
RATE_WINDOW_S = 60.0


class FlushCounters:
    """What only the live flusher knows, counted since its run started: ``retries``, each
    retry of write requests that failed transiently (in the driver: ``wal.flush.mode=driver``
    and recoveries; flush tasks and worker processes retry on their own, uncounted) and each
    drain that failed transiently and is tried again (every mode); ``replays``, batches a
    replay wrote (recovery at query start, or a drain after a failed one); ``batches_written``
    and ``rows_written``, the batches this run made visible and their rows (a batch resumed
    mid-way counts whole), for a rate over any window (Prometheus's ``rate()``). Thread-safe:
    the flusher's thread counts, any thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.replays = 0
        self.batches_written = 0
        self.rows_written = 0

    def count(self, retries: int = 0, replays: int = 0, batches_written: int = 0,
              rows_written: int = 0) -> None:
        with self._lock:
            self.retries += retries
            self.replays += replays
            self.batches_written += batches_written
            self.rows_written += rows_written

    def snapshot(self) -> tuple[int, int, int, int]:
        """``(retries, replays, batches_written, rows_written)``."""
        with self._lock:
            return self.retries, self.replays, self.batches_written, self.rows_written


@dataclass(frozen=True)
class Health:
    """The figures of one WAL (one query). Sizes in bytes, ages and latencies in seconds."""

    wal: str
    state: str                          # a HealthState's word: healthy | lagging | blocked
    blocked_reason: str | None          # blocked.json: why no batch can be written
    pending_batches: int                # committed by Spark, not yet written to Cassandra
    pending_rows: int                   # ... their rows not yet acknowledged
    pending_bytes: int                  # ... their sealed bytes: what wal.maxBytes caps
    oldest_pending_age_s: float | None  # since the oldest pending batch was sealed
    max_bytes: int | None               # wal.maxBytes (None: target.json unreadable)
    wal_bytes: int                      # the WAL folder's size (segments, log, seals)
    flushed_through: int                # every batch up to this one is written (-1: none)
    last_written_batch: int | None      # the newest batch written, of those the log holds
    last_write_latency_s: float | None  # its seal (Spark's commit) to its flushed mark
    rows_per_s: float                   # rows written per second, recent batches
    retries: int | None = None          # transient failures retried (live flusher only)
    replays: int | None = None          # batches written again by a recovery (live only)
    batches_written: int | None = None  # batches this run's flusher wrote (live only)
    rows_written: int | None = None     # ... their rows (live only)
    failing: str | None = None          # the transient failure drains retry (live only): a
                                        # full disk, Cassandra away; None once one gets through
    #: the newest batch written whole, as the completeness marker records it (marker.table):
    #: its rows, when its commit was seen and its last write acknowledged, its watermark
    last_written: Completeness | None = None

    def __post_init__(self) -> None:
        # The plain word, a str as sinks.status(query) always gave (docs/user-guide.md shows
        # 'lagging'): its repr, a type check or a YAML dump of to_dict() see no enum.
        object.__setattr__(self, "state", HealthState(self.state).value)

    def to_dict(self) -> dict:
        return asdict(self)


def health_of(wal: WalDir, views: list[BatchView], *, blocked_reason: str | None,
              max_bytes: int | None, wal_bytes: int, flushed_through: int,
              counters: FlushCounters | None = None, lag_after_s: float = LAG_AFTER_S,
              now: int | None = None, broken: BatchView | None = None,
              failing: str | None = None, last_written: Completeness | None = None) -> Health:
    """The figures from a catalog's views (pure: every input is given; ``now`` in µs)."""
    now = now_us() if now is None else now
    pending = [v for v in views if v.action == RecoveryAction.REPLAY]
    oldest = max((v.age_s for v in pending), default=None)
    written = _written(views)
    last = max(written, key=lambda v: v.batch, default=None)
    latency = (None if last is None
               else max(0.0, (last.record.updated_at_us - last.seal.sealed_at_us) / 1e6))
    recent = [v for v in written if now - v.record.updated_at_us <= RATE_WINDOW_S * 1e6]
    rate = 0.0
    if recent:
        # Over the span the recent batches cover (from the first one's commit), not the
        # whole window: a stream that started 10 s ago wrote its rows in 10 s, not 60.
        since = max(min(v.seal.sealed_at_us for v in recent), now - RATE_WINDOW_S * 1e6)
        rate = sum(v.rows for v in recent) / max(1.0, (now - since) / 1e6)
    pending_bytes = sum(v.bytes for v in pending)
    if blocked_reason is None and broken is not None:
        # A committed batch recovery cannot write (no seal, a damaged one): the flusher blocks
        # on it at its next drain, and nothing after it is written meanwhile.
        blocked_reason = (f"batch {broken.batch}: {broken.detail}; no later batch is written "
                          f"before it (docs/runbook.md)")
    if blocked_reason is not None:
        state = HealthState.BLOCKED
    elif (oldest is not None and oldest >= lag_after_s) or (
            max_bytes is not None and pending_bytes > max_bytes):
        state = HealthState.LAGGING
    else:
        state = HealthState.HEALTHY
    retries, replays, batches_written, rows_written = (
        counters.snapshot() if counters is not None else (None,) * 4)
    return Health(wal=wal.root, state=state, blocked_reason=blocked_reason,
                  pending_batches=len(pending),
                  pending_rows=sum(max(v.rows - v.flushed_rows, 0) for v in pending),
                  pending_bytes=pending_bytes, oldest_pending_age_s=oldest,
                  max_bytes=max_bytes, wal_bytes=wal_bytes, flushed_through=flushed_through,
                  last_written_batch=None if last is None else last.batch,
                  last_write_latency_s=latency, rows_per_s=rate,
                  retries=retries, replays=replays, batches_written=batches_written,
                  rows_written=rows_written, failing=failing, last_written=last_written)


def combined(healths: list[Health]) -> Health:
    """One query's figures over its WALs (a ``foreachBatch`` function writing several tables
    has one each): sums of the backlogs, sizes, rates and counters, the oldest pending batch,
    the worst state (blocked, then lagging) with every blocked WAL's reason, and the lowest
    ``flushed_through`` (every batch up to it is written to every table). One WAL: its own."""
    if len(healths) == 1:
        return healths[0]

    def total(values):
        values = list(values)
        return None if any(v is None for v in values) else sum(values)

    blocked = [h for h in healths if h.state == HealthState.BLOCKED]
    state = max((h.state for h in healths), key=list(HealthState).index)
    last = max((h for h in healths if h.last_written_batch is not None),
               key=lambda h: h.last_written_batch, default=None)
    return Health(
        wal="; ".join(h.wal for h in healths), state=state,
        blocked_reason="; ".join(f"{h.wal}: {h.blocked_reason}" for h in blocked) or None,
        pending_batches=sum(h.pending_batches for h in healths),
        pending_rows=sum(h.pending_rows for h in healths),
        pending_bytes=sum(h.pending_bytes for h in healths),
        oldest_pending_age_s=max((h.oldest_pending_age_s for h in healths
                                  if h.oldest_pending_age_s is not None), default=None),
        max_bytes=total(h.max_bytes for h in healths),
        wal_bytes=sum(h.wal_bytes for h in healths),
        flushed_through=min(h.flushed_through for h in healths),
        last_written_batch=None if last is None else last.last_written_batch,
        last_write_latency_s=None if last is None else last.last_write_latency_s,
        rows_per_s=sum(h.rows_per_s for h in healths),
        retries=total(h.retries for h in healths), replays=total(h.replays for h in healths),
        batches_written=total(h.batches_written for h in healths),
        rows_written=total(h.rows_written for h in healths),
        failing="; ".join(f"{h.wal}: {h.failing}" for h in healths if h.failing) or None,
        last_written=None if last is None else last.last_written)


def _written(views: list[BatchView]) -> list[BatchView]:
    """The batches the log holds written (FLUSHED), with their seals."""
    return [v for v in views if v.record is not None and v.seal is not None
            and v.record.state is BatchState.FLUSHED]


def _recorded(wal: WalDir) -> RecordedTarget | None:
    """``target.json`` (None: not recorded yet, or unreadable: a health read never fails on
    it)."""
    try:
        return RecordedTarget.read(wal)
    except WalCorrupted:
        return None


def max_bytes_of(recorded: RecordedTarget | None) -> int | None:
    """``wal.maxBytes`` as the query's last batch recorded it (None: not recorded yet)."""
    return recorded.max_bytes if recorded is not None else None


def read_health(wal: WalDir, checkpoint: str | None, counters: FlushCounters | None = None,
                lag_after_s: float = LAG_AFTER_S, wal_log: WalLog | None = None,
                views: list[BatchView] | None = None, failing: str | None = None) -> Health:
    """The WAL's figures now. ``wal_log``: a reader already open (else one is opened and closed
    here); ``views``: the catalog already described with it (``inspect`` shows both)."""
    reader = wal_log if wal_log is not None else WalLog.open_reader(wal)
    try:
        if views is None:
            views = catalog.describe(wal, reader, checkpoint, RecoveryPolicy.QUERY_FLUSHER)
        flushed_through = max(reader.flushed_through() if reader is not None else -1,
                              wal.read_flushed_through())
    finally:
        if wal_log is None and reader is not None:
            reader.close()
    recorded = _recorded(wal)
    return health_of(wal, views, blocked_reason=wal.read_blocked(),
                     max_bytes=max_bytes_of(recorded), wal_bytes=wal_size(wal).total,
                     flushed_through=flushed_through, counters=counters,
                     lag_after_s=lag_after_s, broken=still_broken(wal, views), failing=failing,
                     last_written=_last_written(recorded, views, checkpoint))


def _last_written(recorded: RecordedTarget | None, views: list[BatchView],
                  checkpoint: str | None) -> Completeness | None:
    """The completeness marker's figures of the newest batch the log holds written (None:
    none, or no recorded target to name its table)."""
    written = [v for v in _written(views) if v.record.seal is not None]
    target = recorded.readable_target if recorded is not None else None
    if not written or target is None:
        return None
    last = max(written, key=lambda v: v.batch)
    watermark = (ckpt.open_checkpoint(checkpoint).batch_watermark_ms(last.batch)
                 if checkpoint else None)
    return Completeness.of(last.record, target, watermark)


def still_broken(wal: WalDir, views: list[BatchView]) -> BatchView | None:
    """The first batch recovery cannot write (the catalog's BROKEN), if it still is once its
    seal and the ``flushed_through`` marker are read again: a live sink may seal, flush or
    retire a batch between the catalog's reads. Never on a WAL on a store: a reader's copy of
    its seals may predate the commits it read (a false block would page someone); there the
    flusher's own ``blocked.json`` is what tells."""
    if wal.remote:
        return None
    for view in views:
        if view.action == RecoveryAction.ERROR and view.batch > wal.read_flushed_through():
            try:
                if read_seal(wal, view.batch) is None:
                    return view
            except WalCorrupted:
                return view
    return None
