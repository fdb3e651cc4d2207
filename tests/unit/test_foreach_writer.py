"""The foreachBatch writer's call (sinks/foreach_batch.py) before anything is staged: its claim
and its entry (issue 30; what the simulation found after the first fix, tests/sim/README.md
F1 and F2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark.sql import types as T

from cql.errors import ConnectionFailed, SinkError
from sinks import foreach_batch, plan
from wal.entries import read_entry
from wal.layout import WalDir
from wal.pointer import pointed_wals

pytestmark = pytest.mark.unit


def test_two_tables_through_one_wal_are_refused_in_any_batches_of_a_run():
    """F2: refused only within one batch, t sealed batch 0 and tc batch 1 into one WAL; a
    table's caught failure could hide behind the other's seal."""
    claims = foreach_batch._Claims()
    claims.claim("/w", "r1", 0, "ks.t")
    with pytest.raises(SinkError, match="written through one WAL"):
        claims.claim("/w", "r1", 1, "ks.tc")
    claims.claim("/w", "r2", 5, "ks.tc")         # another run: another function, maybe
    with pytest.raises(SinkError, match="written twice in one micro-batch"):
        claims.claim("/w", "r2", 5, "ks.tc")
    claims.release("/w", "r2", 5)                # a failed call gives its batch back
    claims.claim("/w", "r2", 5, "ks.tc")


def test_the_entry_is_recorded_before_the_table_is_looked_up(tmp_path, monkeypatch):
    """F1: the writer failed in prepare_write's table lookup (Cassandra away) before recording
    its entry; a function that caught the error made the batch look skipped: lost silently."""
    cp = tmp_path / "cp"
    cp.mkdir()

    def down(connection):
        raise ConnectionFailed(["h"], "refused")

    monkeypatch.setattr(plan, "connect", down)
    call = foreach_batch.WriterCall(3, "run-1", "ks.t")
    schema = T.StructType([T.StructField("id", T.IntegerType())])
    options = {"keyspace": "ks", "table": "t", "checkpointLocation": str(cp)}
    with pytest.raises(ConnectionFailed):
        plan.prepare_write(options, {}, schema, streaming=True, wal_per_table=True,
                           on_wal=call.enter)
    (location,) = pointed_wals(str(cp))          # the listener knows the WAL already
    entry = read_entry(WalDir(location), 3)
    assert (entry.run_id, entry.table) == ("run-1", "ks.t") and location == call.wal


def test_a_wal_whose_first_call_lost_its_batch_blocks_without_a_target(tmp_path):
    """...and no flusher can be made for a WAL no batch recorded the target of: the registry
    blocks it for the lost batch instead of waiting silently."""
    from recovery.flusher import block_if_lost
    from tests.helpers.walfactory import WalFactory

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp", target={}) as f:
        f.entered(0, run_id="r1")
        assert not block_if_lost(f.root, f.checkpoint, ("r1", 0))     # not committed yet
        f.commit(0)
        assert block_if_lost(f.root, f.checkpoint, ("r1", 0))
        assert "batch 0" in f.wal.read_blocked()
