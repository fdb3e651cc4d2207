"""Build WALs in any state for tests, through the real ``wal`` API (no hand-made bytes).

One :class:`WalFactory` per WAL directory. Each state method builds batch ``N`` up to that
state, doing every step before it the way the sink does (write segments -> seal -> Spark
commit -> ingest -> begin flush -> progress -> mark flushed)::

    from tests.helpers.walfactory import WalFactory, typed_rows

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.staged(0)                                   # segments only, no seal
        f.sealed(1, committed=False)                  # seal file; Spark never committed it
        f.ingested(2)                                 # commits/2 written; SEALED in the log
        f.flushing(3, rows=[5000], chunk_rows=100, progress_rows=1200)
        f.flushed(4)
        f.discarded(5, reason="Spark re-ran it")
        f.sealed(6, rows=[typed_rows(4)])             # every Spark type, with nulls

``rows`` is one entry per partition: an ``int`` (that many :func:`simple_rows`), a
``pyarrow.RecordBatch`` or a ``pyarrow.Table``. ``chunk_rows`` splits each partition into
chunks of that many rows (several chunks per segment). Seals get deterministic timestamps
(``base_ts_us``) and ids unless ``deterministic=False``, so dumps can be compared with golden
files; ``sealed_at_us`` is the real clock (ages stay small).

The factory opens the RocksDB log for writing lazily and keeps it open (RocksDB allows one
writer per process): call :meth:`close`, or use it as a context manager, before another
process writes the same WAL. Readers (``cassandra-wal``, ``WalLog.open_reader``) may run while
it is open.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

import pyarrow as pa

from wal import BatchRecord, BatchState, Seal, SegmentRef, SegmentWriter, WalDir, WalLog
from wal.entries import Entry, record_entry
from wal.retention import remove_batch_files
from wal.seal import COMMIT_POINT_CHECKPOINT, next_base_timestamp, now_us, seal_batch, write_seal
from wal.sealed_write import SealedWrite

Rows = Union[int, pa.RecordBatch, pa.Table]

#: Write timestamp of the first sealed batch when ``deterministic`` (2026-11-22T00:00:00Z).
BASE_TS_US = 1_795_305_600_000_000


# ---------------------------------------------------------------------------------- rows
def simple_rows(n: int, start: int = 0) -> pa.RecordBatch:
    """``n`` rows of (id bigint, name string, value double): ids ``start .. start+n-1``."""
    ids = list(range(start, start + n))
    return pa.record_batch({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([f"row-{i}" for i in ids], pa.string()),
        "value": pa.array([i * 0.5 for i in ids], pa.float64()),
    })


TYPED_SCHEMA = pa.schema([
    ("s", pa.string()),
    ("i", pa.int32()),
    ("l", pa.int64()),
    ("d", pa.float64()),
    ("f", pa.float32()),
    ("b", pa.bool_()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("ts_ntz", pa.timestamp("us")),
    ("day", pa.date32()),
    ("dec", pa.decimal128(20, 4)),
    ("bin", pa.binary()),
    ("tags", pa.list_(pa.string())),                      # a CQL list
    ("uniq", pa.list_(pa.int32())),                       # a CQL set (Spark: array)
    ("attrs", pa.map_(pa.string(), pa.int64())),
    ("by_id", pa.map_(pa.int32(), pa.string())),          # non-string keys
    ("point", pa.struct([("x", pa.float64()), ("y", pa.float64()), ("label", pa.string())])),
    ("nested", pa.list_(pa.struct([("k", pa.string()),
                                   ("v", pa.list_(pa.decimal128(10, 2)))]))),
    ("id", pa.string()),                                  # a UUID, as Spark sends it
])


def typed_rows(n: int = 4, start: int = 0) -> pa.RecordBatch:
    """``n`` rows over :data:`TYPED_SCHEMA`: every type the sink stages, edge values, nulls.

    Row ``k`` (counting from ``start``) cycles through 4 shapes: ordinary values, edge values
    (NaN, -0.0, huge/negative numbers, empty collections), all nulls, and infinities.
    """
    utc = dt.timezone.utc
    shapes = [
        dict(s="héllo \"quoted\"\n", i=1, l=2**40, d=1.5, f=0.1, b=True,
             ts=dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=utc),
             ts_ntz=dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
             day=dt.date(2024, 2, 29), dec=decimal.Decimal("12345678.9012"),
             bin=b"\x00\x01\xfe\xff", tags=["a", "b"], uniq=[3, 1, 2],
             attrs=[("x", 1), ("y", None)], by_id=[(1, "one"), (2, "two")],
             point={"x": 1.0, "y": -2.5, "label": "p"},
             nested=[{"k": "a", "v": [decimal.Decimal("1.10"), None]}],
             id="3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e"),
        dict(s="", i=-2**31, l=-2**63, d=float("nan"), f=-0.0, b=False,
             ts=dt.datetime(1, 1, 1, tzinfo=utc), ts_ntz=dt.datetime(9999, 12, 31, 23, 59, 59),
             day=dt.date(1, 1, 1), dec=decimal.Decimal("-0.0001"), bin=b"",
             tags=[], uniq=[], attrs=[], by_id=[], point={"x": None, "y": None, "label": None},
             nested=[], id="00000000-0000-0000-0000-000000000000"),
        {},  # all nulls
        dict(s="∞", i=2**31 - 1, l=2**63 - 1, d=float("inf"), f=float("-inf"), b=None,
             ts=dt.datetime(1970, 1, 1, tzinfo=utc), ts_ntz=None, day=dt.date(1970, 1, 1),
             dec=decimal.Decimal("9999999999999999.9999"), bin=bytes(range(8)),
             tags=[None, "z"], uniq=None, attrs=None, by_id=None, point=None,
             nested=[None, {"k": None, "v": []}], id=None),
    ]
    rows = [shapes[(start + k) % len(shapes)] for k in range(n)]
    columns = {}
    for f in TYPED_SCHEMA:
        columns[f.name] = pa.array([r.get(f.name) for r in rows], f.type)
    return pa.record_batch(columns, schema=TYPED_SCHEMA)


def _as_batches(rows: Rows, start: int, chunk_rows: int | None) -> list[pa.RecordBatch]:
    if isinstance(rows, int):
        table = pa.Table.from_batches([simple_rows(rows, start)])
    elif isinstance(rows, pa.RecordBatch):
        table = pa.Table.from_batches([rows])
    else:
        table = rows
    batches = table.to_batches(max_chunksize=chunk_rows) if chunk_rows else table.to_batches()
    return [b for b in batches if b.num_rows]


def _num_rows(rows: Rows) -> int:
    return rows if isinstance(rows, int) else rows.num_rows


# ------------------------------------------------------------------------------ factory
@dataclass
class BuiltBatch:
    """What the factory made for one batch (names are relative to ``segments/``)."""

    batch: int
    segments: list[SegmentRef] = field(default_factory=list)   # winners, partition order
    losers: list[SegmentRef] = field(default_factory=list)     # losing attempts (unsealed)
    seal: Seal | None = None
    record: BatchRecord | None = None


class WalFactory:
    """Builds batches of one WAL in chosen states. See the module docstring."""

    def __init__(self, root: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                 target: dict | None = None, deterministic: bool = True):
        """``checkpoint``: a Spark checkpoint folder (created) whose ``commits/N`` files say
        which batches Spark committed. ``target``: the ``target.json`` to write; by default
        one naming ``checkpoint`` as its ``checkpoint_location`` (pass ``{}`` for none)."""
        self.wal = WalDir(str(root)).create()
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        if self.checkpoint is not None:
            os.makedirs(os.path.join(self.checkpoint, "commits"), exist_ok=True)
        if target is None:
            target = {"keyspace": "ks", "table": "t", "checkpoint_location": self.checkpoint}
        self.wal.write_target(target)
        self.deterministic = deterministic
        self.built: dict[int, BuiltBatch] = {}
        self._wal_log: WalLog | None = None

    # -- plumbing ----------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self.wal.root

    @property
    def wal_log(self) -> WalLog:
        """The log, opened for writing on first use (held until :meth:`close`)."""
        if self._wal_log is None:
            self._wal_log = WalLog.open_writer(self.wal)
        return self._wal_log

    def close(self) -> None:
        if self._wal_log is not None:
            self._wal_log.close()
            self._wal_log = None

    def __enter__(self) -> "WalFactory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def commit(self, batch: int) -> None:
        """Play Spark: write ``<checkpoint>/commits/<batch>``."""
        if self.checkpoint is None:
            raise ValueError("this factory has no checkpoint: pass checkpoint=...")
        path = os.path.join(self.checkpoint, "commits", str(batch))
        with open(path, "w") as f:
            f.write('v1\n{"nextBatchWatermarkMs":0}\n')

    # -- building blocks ---------------------------------------------------------------
    def segment(self, batch: int, partition: int, rows: Rows = 3, attempt: int = 0,
                chunk_rows: int | None = None, start: int = 0) -> SegmentRef:
        """Write one complete segment file (one task attempt) and return its reference."""
        header = {"query_id": "test-query", "columns": None}
        with SegmentWriter(self.wal, batch, partition, attempt, header=header) as writer:
            for chunk in _as_batches(rows, start, chunk_rows):
                writer.append(chunk)
            return writer.finish()

    def leftover_tmp(self, batch: int, partition: int = 9, data: bytes = b"CWALSEG1") -> str:
        """A ``.seg.tmp`` file as a crashed task leaves it. Returns its path."""
        folder = self.wal.batch_segments(batch)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{partition:05d}-000-deadbeef0000.seg.tmp")
        with open(path, "wb") as f:
            f.write(data)
        return path

    def seal(self, batch: int, segments: Sequence[SegmentRef],
             commit_point: str = COMMIT_POINT_CHECKPOINT, write: SealedWrite | dict | None = None,
             sealed_at_us: int | None = None) -> Seal:
        """Seal ``segments`` as batch ``batch`` (deterministic timestamps and id if asked);
        ``write``: the seal's record of how its rows are written (``Target.write_record``, or
        a dict as a seal file holds it, an earlier release's, read as a seal file is);
        ``sealed_at_us``: when it was sealed (default: now), which its rows' TTLs count from."""
        if isinstance(write, dict):
            write = SealedWrite.from_dict(write) if write else None
        if not self.deterministic:
            return seal_batch(self.wal, batch, list(segments), "test-query", commit_point,
                              write=write)
        ordered = tuple(sorted(segments, key=lambda s: (s.partition, s.attempt, s.name)))
        base = next_base_timestamp(self.wal, batch, clock_us=BASE_TS_US + batch * 1_000_000)
        seal = Seal(batch=batch, segments=ordered, base_ts_us=base, query_id="test-query",
                    commit_point=commit_point, seal_id=f"seal-{batch:04d}",
                    sealed_at_us=now_us() if sealed_at_us is None else sealed_at_us,
                    write=write)
        write_seal(self.wal, seal)
        return seal

    def entered(self, batch: int, run_id: str = "run-1", table: str = "ks.t",
                seal_id: str = "") -> None:
        """A foreachBatch writer was called for ``batch`` (:mod:`wal.entries`), before it
        staged anything; the WAL keeps entries from its first one on. ``seal_id``: the seal
        the call writes if it seals (the factory's seals are ``seal-<batch:04d>``)."""
        record_entry(self.wal, Entry(batch, run_id, table, seal_id=seal_id))

    # -- states ------------------------------------------------------------------------
    def staged(self, batch: int, rows: Iterable[Rows] = (3, 2), chunk_rows: int | None = None,
               losing_attempts: int = 0) -> BuiltBatch:
        """Segments only (tasks ran, no seal): partition ``p`` gets ``rows[p]``.

        ``losing_attempts``: that many extra, earlier attempts of partition 0 (never sealed).
        Row ids are batch-wide: ``batch * 1000 + position``.
        """
        built = BuiltBatch(batch)
        start = batch * 1000
        for p, part_rows in enumerate(rows):
            attempt = losing_attempts if p == 0 else 0
            built.segments.append(self.segment(batch, p, part_rows, attempt, chunk_rows, start))
            start += _num_rows(part_rows)
        for attempt in range(losing_attempts):
            built.losers.append(self.segment(batch, 0, 1, attempt, None, batch * 1000 + 999))
        self.built[batch] = built
        return built

    def sealed(self, batch: int, rows: Iterable[Rows] = (3, 2), chunk_rows: int | None = None,
               committed: bool | None = True, commit_point: str = COMMIT_POINT_CHECKPOINT,
               losing_attempts: int = 0, write: SealedWrite | dict | None = None,
               sealed_at_us: int | None = None) -> BuiltBatch:
        """Staged, then sealed (seal file). ``committed``: write ``commits/N`` (True), or not
        (False / None: None also needs no checkpoint). ``write``, ``sealed_at_us``: as in
        :meth:`seal`."""
        built = self.staged(batch, rows, chunk_rows, losing_attempts)
        built.seal = self.seal(batch, built.segments, commit_point, write, sealed_at_us)
        if committed:
            self.commit(batch)
        return built

    def ingested(self, batch: int, rows: Iterable[Rows] = (3, 2),
                 chunk_rows: int | None = None, losing_attempts: int = 0,
                 write: SealedWrite | dict | None = None, sealed_at_us: int | None = None,
                 copy_rows: bool = True) -> BuiltBatch:
        """Sealed, committed by Spark, ingested: SEALED in the log, rows copied into it
        (``copy_rows`` False: the seal alone, as for a scale-out writer)."""
        built = self.sealed(batch, rows, chunk_rows, committed=self.checkpoint is not None,
                            losing_attempts=losing_attempts, write=write,
                            sealed_at_us=sealed_at_us)
        built.record = self.wal_log.ingest(built.seal, copy_rows=copy_rows)
        return built

    def flushing(self, batch: int, rows: Iterable[Rows] = (3, 2),
                 chunk_rows: int | None = None, progress_rows: int | None = None,
                 write: SealedWrite | dict | None = None, sealed_at_us: int | None = None) -> BuiltBatch:
        """Ingested, flush begun; ``progress_rows``: chunks covering at least that many rows
        acknowledged (whole chunks, in flush order; None: no progress recorded). ``write``,
        ``sealed_at_us``: as in :meth:`seal`."""
        built = self.ingested(batch, rows, chunk_rows, write=write, sealed_at_us=sealed_at_us)
        built.record = self.wal_log.begin_flush(batch)
        if progress_rows is not None:
            next_segment, next_chunk, done = 0, 0, 0
            for chunk in self.wal_log.chunks(batch):
                if done >= progress_rows:
                    next_segment, next_chunk = chunk.segment_index, chunk.chunk_index
                    break
                done += chunk.rows
            else:
                next_segment, next_chunk = len(built.seal.segments), 0
            built.record = self.wal_log.record_progress(batch, next_segment, next_chunk, done)
        return built

    def flushed(self, batch: int, rows: Iterable[Rows] = (3, 2),
                chunk_rows: int | None = None, keep_segments: bool = False) -> BuiltBatch:
        """Flushed to Cassandra, left as the flusher (``recovery.replay``) leaves it: FLUSHED
        in the log (rows kept there for retention), the shared ``flushed_through`` marker
        written, segment files removed, seal kept. ``keep_segments``: leave the files too."""
        self.flushing(batch, rows, chunk_rows)
        return self.flush(batch, keep_segments)

    def flush(self, batch: int, keep_segments: bool = False) -> BuiltBatch:
        """Play the flusher on a batch built here (sealed, ingested or flushing), as
        ``recovery.replay`` leaves it: ingested if the log has not its seal (a re-run of a
        discarded batch included), FLUSHED, the ``flushed_through`` marker, its files removed
        (seal kept) unless ``keep_segments``."""
        built = self.built[batch]
        record = self.wal_log.get(batch)
        if record is None or record.state == BatchState.DISCARDED:
            record = self.wal_log.ingest(built.seal)
        if record.state == BatchState.SEALED:
            self.wal_log.begin_flush(batch)
        built.record = self.wal_log.mark_flushed(batch)
        self.wal.write_flushed_through(batch)
        if not keep_segments:
            remove_batch_files(self.wal, batch, keep_seal=True)
        return built

    def discarded(self, batch: int, rows: Iterable[Rows] = (3, 2), sealed: bool = False,
                  reason: str = "Spark never committed it", keep_files: bool = False
                  ) -> BuiltBatch:
        """Staged (or sealed when ``sealed``, never committed), then DISCARDED, left as recovery
        leaves it: the batch's segments and seal removed. ``keep_files``: leave them (a
        discard cut short by a crash, or, with a seal, what a re-run of the batch looks like)."""
        built = (self.sealed(batch, rows, committed=False) if sealed
                 else self.staged(batch, rows))
        built.record = self.wal_log.discard(batch, reason)
        if not keep_files:
            remove_batch_files(self.wal, batch)
        return built

    # -- every state at once -------------------------------------------------------------
    def every_state(self, uncommitted_from: int = 5) -> dict[str, int]:
        """One batch per state; returns state -> batch id. Needs a checkpoint.

        0 flushed (segments removed), 1 discarded (files removed), 2 flushing (2 partitions x
        5 chunks of 2 rows, 4 rows done), 3 ingested (sealed in the log), 4 sealed and
        committed (not ingested yet); then, from ``uncommitted_from`` on (Spark commits in
        order: every committed batch a test adds must come below them), sealed and not
        committed, and staged (plus a losing attempt and a ``.tmp`` leftover).
        """
        sealed, staged = uncommitted_from, uncommitted_from + 1
        self.flushed(0)
        self.discarded(1)
        self.flushing(2, rows=(10, 10), chunk_rows=2, progress_rows=4)
        self.ingested(3, rows=(4, 1, 2))
        self.sealed(4, committed=True)
        self.sealed(sealed, committed=False)
        self.staged(staged, losing_attempts=1)
        self.leftover_tmp(staged)
        return {"flushed": 0, "discarded": 1, "flushing": 2, "ingested": 3,
                "sealed_committed": 4, "sealed_uncommitted": sealed, "staged": staged}
