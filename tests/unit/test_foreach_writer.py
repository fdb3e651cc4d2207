"""The foreachBatch writer's call (sinks/worker/foreach_batch.py) before anything is staged: its
claim and its entry (issue 30; what the simulation found after the first fix,
tests/sim/README.md F1 and F2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark.sql import types as T

import recovery.cql.connection
from recovery.cql.errors import ConnectionFailed, SinkError
from sinks.worker import foreach_batch, plan
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

    monkeypatch.setattr(recovery.cql.connection, "connect", down)
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


def test_a_call_refused_before_its_entry_says_a_caught_error_loses_the_rows_silently(caplog):
    """A refused call records no entry: a function that catches the error and goes on lets
    Spark commit a batch that reads as skipped. The log says that, not that the WAL blocks."""
    refused = foreach_batch.WriterCall(7, "run-1", "ks.t")
    refused.failed(SinkError("written twice"))
    assert "lost without the WAL knowing" in caplog.text and "blocks" not in caplog.text
    caplog.clear()
    entered = foreach_batch.WriterCall(7, "run-1", "ks.t")
    entered.entered, entered.wal = True, "/w"
    entered.failed(ConnectionFailed(["h"], "refused"))
    assert "the WAL at /w blocks" in caplog.text


def _call_writer(cp, table: str, call, monkeypatch, **options):
    """prepare_write as the writer calls it, Cassandra away (it stops after the entry)."""
    def down(connection):
        raise ConnectionFailed(["h"], "refused")

    monkeypatch.setattr(recovery.cql.connection, "connect", down)
    schema = T.StructType([T.StructField("id", T.IntegerType())])
    with pytest.raises((ConnectionFailed, SinkError)):
        plan.prepare_write(dict(options, keyspace="ks", table=table, checkpointLocation=str(cp)),
                           {}, schema, streaming=True, wal_per_table=True,
                           on_wal=call.enter, claim=call.claim)


def test_a_writer_refused_a_shared_wal_leaves_no_pointer_to_it(tmp_path, monkeypatch):
    """Two tables given one wal.path: the second writer's claim is refused. Its pointer named
    the shared WAL all the same, and a later run giving it a WAL of its own took that for a
    move away from the first table's WAL (marked moved: its later batches never written)."""
    from wal.pointer import read_slot

    cp, shared = tmp_path / "cp", tmp_path / "shared"
    cp.mkdir()
    _call_writer(cp, "t", foreach_batch.WriterCall(0, "run-x", "ks.t"), monkeypatch,
                 **{"wal.path": str(shared)})
    refused = foreach_batch.WriterCall(0, "run-x", "ks.u")
    _call_writer(cp, "u", refused, monkeypatch, **{"wal.path": str(shared)})
    assert not refused.entered
    assert read_slot(str(cp), ("ks", "t")) == str(shared)
    assert read_slot(str(cp), ("ks", "u")) is None


def test_a_table_leaving_a_wal_another_table_still_writes_does_not_mark_it_moved(
        tmp_path, monkeypatch):
    """Pointers of two tables name one WAL (written by an earlier release, or by runs that
    each called one writer); table u gets a WAL of its own: t's WAL is not moved away from."""
    from wal.pointer import write_pointer

    cp, shared = tmp_path / "cp", tmp_path / "shared"
    cp.mkdir()
    _call_writer(cp, "t", foreach_batch.WriterCall(0, "run-y", "ks.t"), monkeypatch,
                 **{"wal.path": str(shared)})
    write_pointer(str(cp), str(shared), ("ks", "u"))
    _call_writer(cp, "u", foreach_batch.WriterCall(1, "run-z", "ks.u"), monkeypatch,
                 **{"wal.path": str(tmp_path / "own")})
    assert WalDir(str(shared)).read_moved() is None


def test_a_writer_called_on_a_thread_of_the_function_takes_the_run_the_registry_saw_start(
        monkeypatch):
    """A function writing its tables from a thread pool: the job group (the run's id) is a
    property of the query's thread only. Read as "" there, the claims of every run were one:
    after a restart in the same process, the re-run of a batch the first run had claimed was
    refused as "written twice"."""
    from tests.helpers.spark_fakes import FakeFlusher, FakeSpark, pointing
    from sinks.driver import registry as flush_registry

    FakeFlusher.made = []
    monkeypatch.setattr(flush_registry, "registries", [])
    monkeypatch.setattr(flush_registry, "QueryFlusher", FakeFlusher)
    monkeypatch.setattr(flush_registry, "pointed_wals", pointing(lambda cp: cp + "/cassandra_wal"))
    registry = flush_registry.FlushRegistry(FakeSpark(), {})
    on_a_pool_thread = SimpleNamespace(sparkContext=SimpleNamespace(
        getLocalProperty=lambda key: None))
    registry.started("q", "run-1")
    assert foreach_batch._run_id(on_a_pool_thread, "/cp/q") == "run-1"
    registry.started("q", "run-2")               # a restart in the same process
    assert foreach_batch._run_id(on_a_pool_thread, "file:/cp/q") == "run-2"
    on_the_query_thread = SimpleNamespace(sparkContext=SimpleNamespace(
        getLocalProperty=lambda key: "run-2"))
    assert foreach_batch._run_id(on_the_query_thread, "/elsewhere") == "run-2"
    # A function that sets a job group of its own (sc.setJobGroup("etl", ...)) on the query's
    # thread: the group is not the run, and its batches would be taken for another run's.
    with_a_users_group = SimpleNamespace(sparkContext=SimpleNamespace(
        getLocalProperty=lambda key: "etl"))
    assert foreach_batch._run_id(with_a_users_group, "/cp/q") == "run-2"
    registry.terminated("q", "run-2")            # ended: the group is all there is again
    assert foreach_batch._run_id(with_a_users_group, "/cp/q") == "etl"
