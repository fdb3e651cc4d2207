"""Review 31 (issue 31, "what users change and operators do"): failing tests of what the
review found. Each test names its finding; each fails on the code as it is."""

from __future__ import annotations

import pytest

from recovery.replay import Replayer
from tests.helpers.flush_fakes import WRITES, RecordingUpserter
from tests.helpers.walfactory import WalFactory
from wal import catalog
from wal import move as move_mod
from wal.errors import WalMoveRefused
from wal.move import follow_move

pytestmark = pytest.mark.unit


# -- finding 3: --restamp offered for a column that is gone -----------------------------------
def test_finding3_the_block_offers_restamp_for_a_column_not_in_the_table_any_more(monkeypatch):
    """The column was dropped and not added again, as the runbook says ('do not add the column
    back to cure it'). The block names two ways out, --without-column and --restamp; but a
    re-stamped batch still writes the column, which the table no longer has: Cassandra refuses
    every write of it (Undefined column name), and the operator who chose --restamp meets a
    second block. The reason (and amend --restamp) should say the column must exist again
    first, or not offer --restamp for a column that is gone."""
    import datetime as dt
    from types import SimpleNamespace

    from recovery import output as output_module
    from recovery.errors import ColumnDroppedAfterSeal
    from recovery.output import CassandraOutput
    from tests.helpers.flush_fakes import target
    from wal.seal import Seal
    from wal.segment import SegmentRef

    sealed_at = 1_800_000_000_000_000
    import dataclasses

    t = dataclasses.replace(target(), columns=("id", "name"))
    column = "name"                                  # a column the batch writes

    class DroppedAndGone:
        """system_schema: ``column`` dropped 5 s after the seal, not added again."""

        def execute(self, cql, parameters=None):
            if "dropped_columns" in cql:
                return [SimpleNamespace(column_name=column, dropped_time=dt.datetime.fromtimestamp(
                    (sealed_at + 5_000_000) / 1e6, dt.timezone.utc))]
            if "system_schema.columns" in cql:       # the table as it is now
                return [SimpleNamespace(column_name=c, kind="regular", type="bigint")
                        for c in ("id", "value")]
            return []

    monkeypatch.setattr(output_module, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None, metadata=None), DroppedAndGone()))
    out = CassandraOutput(t)
    ref = SegmentRef(name="x", partition=0, attempt=0, rows=3, chunks=1, bytes=10, crc32=0)
    seal = Seal(batch=4, segments=(ref,), base_ts_us=sealed_at, sealed_at_us=sealed_at,
                write=t.write_record())
    with pytest.raises(ColumnDroppedAfterSeal) as info:
        out.check_not_dropped(seal, "/data/wal")
    text = str(info.value)
    offered = text[text.index("--restamp"):] if "--restamp" in text else ""
    assert not offered or "ADD" in text or "add the column" in text, (
        f"--restamp is offered for {column}, which the table no longer has: {text}")


# -- finding 4: a repair naming the WAL the stream moved away from --------------------------
def spark_planned(cp, batch: int) -> None:
    """Spark's ``offsets/N`` (as tests/unit/test_repair.py writes it)."""
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "offsets" / str(batch)).write_text(
        f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n')


def spark_committed(f: WalFactory, batch: int) -> None:
    f.commit(batch)


def test_finding4_a_repair_of_the_wal_moved_away_from_leaves_it_missing_the_rerun(tmp_path):
    """X wrote batches 0-3, the stream moved to Y (wal.path changed), which wrote 4-5. Cassandra
    lost rows (a restore from an old backup): the operator re-delivers from batch 2 with
    'cassandra-wal repair X --from 2 --rewrite', naming X, which wrote batch 2. The repair
    lowers X's flushed_through to 1 though X stays moved away (moved.json: after batch 3);
    Spark re-runs 2.. through Y (the pointer's WAL) and commits them: X now calls batches 2-3
    committed and missing ('Spark committed it but the WAL holds no seal', BROKEN): status
    says blocked, and a move back to X is refused for batches no one can ever write."""
    from wal.log import WalLog
    from wal.pointer import write_pointer
    from wal.repair import repair

    cp = tmp_path / "cp"
    x = WalFactory(tmp_path / "x", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(4):
        spark_planned(cp, b)
        x.flushed(b)
        spark_committed(x, b)
    x.log.note_committed(3)
    x.close()
    y = WalFactory(tmp_path / "y", checkpoint=cp)
    follow_move(x.wal, y.wal, str(cp))
    write_pointer(str(cp), y.wal.location)
    for b in (4, 5):
        spark_planned(cp, b)
        y.sealed(b)
        spark_committed(y, b)
        y.flush(b)
    y.close()

    repair(x.wal, str(cp), 2, rewrite=True)
    for b in range(2, 6):                            # Spark re-runs 2.. through Y
        spark_planned(cp, b)
        y.sealed(b)
        spark_committed(y, b)
        y.flush(b)
    y.close()
    with WalLog.open_writer(x.wal) as log:
        broken = [(v.batch, v.detail) for v in catalog.describe(x.wal, log, str(cp))
                  if v.action == catalog.BROKEN]
    refused = None
    try:
        follow_move(y.wal, x.wal, str(cp))           # a move back to X
    except WalMoveRefused as exc:
        refused = exc.pending
    assert (broken, refused) == ([], None), (
        f"X, moved away from after batch 3, now blocks on {broken}; a move back to it is "
        f"refused for {refused}")
