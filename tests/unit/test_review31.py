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
