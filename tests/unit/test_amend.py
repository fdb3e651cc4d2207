"""A column dropped after a batch was sealed (issue 31, item 3): the flusher's check
(``CassandraOutput.dropped_after_seal``), the operator's amendments (``wal/amendments.py``) and
``cassandra-wal amend``. No Cassandra: a session answering the dropped-columns query."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from types import SimpleNamespace

import pytest

import recovery.cql.connection
from recovery.cli.main import main
from recovery.errors import ColumnDroppedAfterSeal, is_transient
from recovery.output import CassandraOutput
from recovery.replay import Replayer
from tests.helpers.walfactory import WalFactory
from tests.helpers.flush_fakes import WRITES, RecordingUpserter, target
from wal.amendments import Amendment, amended, read_amendment, write_amendment
from wal.seal import Seal
from wal.sealed_write import SealedWrite

pytestmark = pytest.mark.unit

SEALED_AT = 1_800_000_000_000_000


class Dropped:
    """A session whose system_schema.dropped_columns holds ``columns`` (name -> drop µs)."""

    def __init__(self, **columns: int):
        self.columns, self.asked = columns, []

    def execute(self, cql, parameters=None):
        self.asked.append(parameters)
        return [SimpleNamespace(column_name=name, dropped_time=dt.datetime.fromtimestamp(
            us / 1e6, dt.timezone.utc)) for name, us in self.columns.items()]


def output_with(monkeypatch, session, **write) -> CassandraOutput:
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None), session))
    t = target()
    t = dataclasses.replace(t, config=dataclasses.replace(
        t.config, write=dataclasses.replace(t.config.write, **write)))
    return CassandraOutput(t)


def seal_of(output: CassandraOutput, base_ts_us: int = SEALED_AT, rows: int = 3) -> Seal:
    from wal.segment import SegmentRef

    ref = SegmentRef(name="x", partition=0, attempt=0, rows=rows, chunks=1, bytes=10, crc32=0)
    return Seal(batch=4, segments=(ref,), base_ts_us=base_ts_us, sealed_at_us=SEALED_AT,
                write=output.target.write_record())


def test_a_column_dropped_after_the_seal_blocks_naming_it_and_the_two_ways_out(monkeypatch):
    session = Dropped(id=SEALED_AT + 5_000_000)       # dropped five seconds after the seal
    out = output_with(monkeypatch, session)
    hidden = out.dropped_after_seal(seal_of(out))
    assert [c for c, _ in hidden] == ["id"] and hidden[0][1] >= SEALED_AT + 5_000_000
    assert session.asked == [("ks", "t")]
    with pytest.raises(ColumnDroppedAfterSeal) as info:
        out.check_not_dropped(seal_of(out), "/data/wal")
    text = str(info.value)
    assert "batch 4 writes id, dropped after the batch was sealed" in text
    assert "cassandra-wal amend /data/wal --batch 4 --without-column id" in text
    assert "--restamp" in text and "added again" in text
    assert not is_transient(info.value)


def test_a_drop_before_the_batchs_timestamps_hides_nothing(monkeypatch):
    out = output_with(monkeypatch, Dropped(id=SEALED_AT - 2_000))   # 2 ms before
    assert out.dropped_after_seal(seal_of(out)) == []


def test_the_drop_time_counts_to_the_end_of_its_millisecond(monkeypatch):
    """system_schema keeps the drop time to the millisecond; Cassandra hides to the µs. A
    batch written within the drop's millisecond is hidden all the same."""
    out = output_with(monkeypatch, Dropped(id=SEALED_AT // 1000 * 1000))
    assert out.dropped_after_seal(seal_of(out, base_ts_us=SEALED_AT // 1000 * 1000 + 999))


def test_with_the_users_own_timestamps_a_drop_after_the_seal_counts(monkeypatch):
    out = output_with(monkeypatch, Dropped(id=SEALED_AT + 1), writetime_column="wt")
    with pytest.raises(ColumnDroppedAfterSeal) as info:
        out.check_not_dropped(seal_of(out, base_ts_us=1), "/w")
    assert "--restamp" not in str(info.value)       # not the sink's to re-stamp


def test_cassandra_drivers_naive_drop_time_is_utc_whatever_the_machines_zone(monkeypatch):
    """cassandra-driver hands a ``timestamp`` back as a naive datetime in UTC: read in the machine's
    zone, a drop east of Greenwich would look hours earlier (hiding nothing), west of it hours
    later (blocking batches it never hid)."""
    import time

    from recovery.cql.table import dropped_columns

    drop_us = SEALED_AT + 123_000
    naive = dt.datetime.fromtimestamp(drop_us / 1e6, dt.timezone.utc).replace(tzinfo=None)
    session = SimpleNamespace(execute=lambda cql, params: [
        SimpleNamespace(column_name="id", dropped_time=naive)])
    for zone in ("America/New_York", "Asia/Tokyo", "UTC"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        try:
            assert dropped_columns(session, "ks", "t") == {"id": drop_us + 999}, zone
        finally:
            monkeypatch.delenv("TZ")
            time.tzset()


def test_an_amendment_of_another_seal_of_the_batch_is_not_applied(tmp_path):
    """An amendment names the seal it amends: a re-run of the batch (after a repair or a
    discard) seals other rows, and is written as sealed."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=(3,), write=SealedWrite(("id", "name", "value")))
        write_amendment(f.wal, Amendment(0, ("name",), SEALED_AT + 9, seal_id="another-seal"))
        assert amended(f.wal, built.seal) == built.seal
        write_amendment(f.wal, Amendment(0, ("name",), SEALED_AT + 9,
                                         seal_id=built.seal.seal_id))
        assert amended(f.wal, built.seal).write.columns == ("id", "value")


def test_an_amendment_is_applied_to_every_later_write_of_the_batch(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=(3,), write=SealedWrite(("id", "name", "value")))
        write_amendment(f.wal, Amendment(0, ("name",), SEALED_AT + 9))
        seal = amended(f.wal, built.seal)
        assert seal.write.columns == ("id", "value") and seal.base_ts_us == SEALED_AT + 9
        assert seal.segments == built.seal.segments and seal.rows == 3
        WRITES.clear()
        Replayer(f.wal, f.wal_log, lambda s: RecordingUpserter(), f.checkpoint).run(True)
        assert [first for _, first, _ in WRITES] == [SEALED_AT + 9]
        # The newest flushed seal stays for the next batch's timestamps, and so does its
        # amendment: the next batch starts above the re-stamped rows, not the sealed ones.
        assert read_amendment(f.wal, 0) is not None
        from wal.seal import next_base_timestamp
        assert next_base_timestamp(f.wal, 1, clock_us=SEALED_AT) == SEALED_AT + 9 + 3


def test_a_restamped_batchs_amendment_goes_with_its_seal(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=(3,), write=SealedWrite(("id", "name", "value")))
        write_amendment(f.wal, Amendment(0, (), SEALED_AT + 9, seal_id=built.seal.seal_id))
        f.flushed(0)
        f.flushed(1)
        from wal.retention import RetentionPolicy, apply_retention
        apply_retention(f.wal, f.wal_log, RetentionPolicy(keep_batches=0))
        assert read_amendment(f.wal, 0) is None and f.wal.sealed_batch_ids() == [1]


def _wal_with_pending(tmp_path, monkeypatch, uncommitted: tuple[int, ...] = ()):
    import recovery.target as target_module

    f = WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                   target={"fingerprint": "f", "target": target().to_dict(),
                           "checkpoint_location": str(tmp_path / "cp")})
    record = target().write_record()
    for batch in (0, 1):
        f.sealed(batch, rows=(3,), write=record)
    for batch in uncommitted:
        f.sealed(batch, rows=(3,), write=record, committed=False)
    f.close()
    session = Dropped(id=4_000_000_000_000_000)       # long after both seals (2096)
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None), session))
    return f, target_module


def test_amend_without_a_column_records_each_pending_batch_that_writes_it(
        tmp_path, monkeypatch, capsys):
    f, _ = _wal_with_pending(tmp_path, monkeypatch)
    assert main(["amend", f.root, "--pending", "--without-column", "id", "--dry-run",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [a["batch"] for a in plan["amendments"]] == [0, 1] and plan["dry_run"]
    assert read_amendment(f.wal, 0) is None            # a dry run changes nothing
    assert main(["amend", f.root, "--pending", "--without-column", "id"]) == 0
    assert read_amendment(f.wal, 1).without_columns == ("id",)
    assert main(["amend", f.root, "--batch", "0", "--without-column", "nope"]) == 1
    assert "does not write nope" in capsys.readouterr().err


def test_amend_restamp_puts_each_batch_above_the_drop_in_batch_order(
        tmp_path, monkeypatch, capsys):
    f, _ = _wal_with_pending(tmp_path, monkeypatch)
    assert main(["amend", f.root, "--pending", "--restamp", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["amendments"]
    first, second = got
    assert first["base_ts_us"] > 4_000_000_000_000_000
    assert second["base_ts_us"] == first["base_ts_us"] + 3      # after batch 0's three rows
    assert read_amendment(f.wal, 1).base_ts_us == second["base_ts_us"]


def test_restamp_keeps_the_later_batches_above_the_one_it_restamps(tmp_path, monkeypatch, capsys):
    """Batch 0 writes id, dropped after both seals; batch 1 was amended to go without id
    before. Re-stamping batch 0 above the drop put its rows above batch 1's, sealed earlier:
    on a key both write, batch 0's value would win over the later batch's. Batch 1 is
    re-stamped after it; a batch sealed above the drop keeps its own."""
    f, _ = _wal_with_pending(tmp_path, monkeypatch, uncommitted=(2,))
    from wal.seal import read_seal
    one = read_seal(f.wal, 1)
    write_amendment(f.wal, Amendment(1, ("id",), None, seal_id=one.seal_id))
    assert main(["amend", f.root, "--batch", "0", "--restamp", "--json"]) == 0
    got = {a["batch"]: a for a in json.loads(capsys.readouterr().out)["amendments"]}
    assert sorted(got) == [0, 1, 2]
    assert got[1]["base_ts_us"] == got[0]["base_ts_us"] + 3
    assert got[2]["base_ts_us"] == got[1]["base_ts_us"] + 3     # sealed, not yet committed
    assert got[1]["without_columns"] == ["id"]                   # the earlier choice stays
    assert "to stay above batch 0" in got[1]["reason"]


# -- what review 7 found ------------------------------------------------------------------------
def _factory(tmp_path):
    return WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp",
                      target={"fingerprint": "f", "target": target().to_dict(),
                              "checkpoint_location": str(tmp_path / "cp")})


def _dropped(monkeypatch, **columns):
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None), Dropped(**columns)))


def test_restamp_starts_above_a_batch_restamped_before(tmp_path, monkeypatch, capsys):
    """Batch 0 was re-stamped above the drop by an earlier amend and written (its amendment
    stays with its seal, what the next batch starts above); batch 1 was sealed below the drop
    meanwhile. Started at drop+1 again, batch 1 overlapped batch 0's re-stamped rows: on a key
    both write, the earlier batch won."""
    from wal.seal import last_written_ts_us, read_seal

    drop_us = 4_000_000_000_000_000
    f = _factory(tmp_path)
    f.flushed(0, rows=(3,))
    f.sealed(1, rows=(3,), write=target().write_record())
    write_amendment(f.wal, Amendment(0, (), (drop_us // 1000 + 1) * 1000, "re-stamped",
                                     seal_id=read_seal(f.wal, 0).seal_id))
    f.close()
    _dropped(monkeypatch, id=drop_us)
    assert main(["amend", f.root, "--pending", "--restamp", "--json"]) == 0
    got = {a["batch"]: a for a in json.loads(capsys.readouterr().out)["amendments"]}
    assert got[1]["base_ts_us"] > last_written_ts_us(f.wal, read_seal(f.wal, 0))


def test_a_restamp_cut_short_leaves_no_later_batch_below_an_earlier_one(tmp_path, monkeypatch):
    """Batch 0 is hidden by the drop, batch 1 (sealed after it) is not, but falls below batch
    0 re-stamped. The amendments were written oldest first: cut after the first (Ctrl-C, a
    store's error), batch 0 was written above batch 1."""
    import recovery.cli.amend_cmd as amend_cmd
    from wal.seal import read_seal

    f = _factory(tmp_path)
    record = target().write_record()
    f.sealed(0, rows=(3,), write=record)
    f.sealed(1, rows=(3,), write=record)
    f.close()
    _dropped(monkeypatch, id=read_seal(f.wal, 1).base_ts_us - 1000)    # hides batch 0 only
    real, written = amend_cmd.write_amendment, []

    def cut_after_one(wal, amendment):
        if written:
            raise KeyboardInterrupt
        written.append(amendment.batch)
        real(wal, amendment)

    monkeypatch.setattr(amend_cmd, "write_amendment", cut_after_one)
    assert main(["amend", f.root, "--pending", "--restamp"]) == 130     # Ctrl-C
    s0, s1 = (amended(f.wal, read_seal(f.wal, b)) for b in (0, 1))
    assert written == [1] and s1.base_ts_us > s0.last_ts_us


def test_amend_does_not_take_over_an_amendment_of_another_seal(tmp_path, monkeypatch):
    """A stale amendment of an earlier seal of the batch (a working copy of a store WAL keeps
    one the store dropped) said "without name": a re-stamp of this seal inherited it, and
    dropped a column the operator never chose."""
    f = _factory(tmp_path)
    f.sealed(0, rows=(3,), write=target().write_record())
    f.close()
    write_amendment(f.wal, Amendment(0, ("name",), None, "of an earlier seal",
                                     seal_id="an-earlier-seal-of-batch-0"))
    _dropped(monkeypatch, id=4_000_000_000_000_000)
    assert main(["amend", f.root, "--batch", "0", "--restamp"]) == 0
    got = read_amendment(f.wal, 0)
    assert got.seal_id == "seal-0000" and got.without_columns == ()


# -- review 31: --restamp for a column the table no longer has ------------------------------
def test_the_block_says_restamp_needs_the_column_added_again_first(monkeypatch):
    """Review 31, finding 3. The column was dropped and not added again (as the runbook
    said: 'do not add the column back to cure it'). The block named two ways out,
    --without-column and --restamp; but a re-stamped batch still writes the column, which
    the table no longer has: Cassandra refuses every write of it (Undefined column name), and
    the operator who chose --restamp met a second block. The reason now says the column must
    exist again first, and how (the ALTER TABLE, with its type as sealed)."""
    t = dataclasses.replace(target(), columns=("id", "name"))

    class DroppedAndGone:
        """system_schema: ``name`` dropped 5 s after the seal, not added again."""

        def execute(self, cql, parameters=None):
            if "dropped_columns" in cql:
                return [SimpleNamespace(column_name="name", dropped_time=dt.datetime.fromtimestamp(
                    (SEALED_AT + 5_000_000) / 1e6, dt.timezone.utc))]
            if "system_schema.columns" in cql:       # the table as it is now
                return [SimpleNamespace(column_name=c, kind="regular", type="bigint")
                        for c in ("id", "value")]
            return []

    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None, metadata=None), DroppedAndGone()))
    out = CassandraOutput(t)
    with pytest.raises(ColumnDroppedAfterSeal) as info:
        out.check_not_dropped(seal_of(out), "/data/wal")
    text = str(info.value)
    offered = text[text.index("--restamp"):] if "--restamp" in text else ""
    assert not offered or "ADD" in text or "add the column" in text, (
        f"--restamp is offered for name, which the table no longer has: {text}")
    assert "add it again first" in offered and "ALTER TABLE ks.t ADD name text" in offered
    again = ColumnDroppedAfterSeal(*info.value.args)         # as it travels (pickled)
    assert str(again) == text


def test_amend_restamp_says_the_column_must_exist_again(tmp_path, monkeypatch, capsys):
    from wal.seal import read_seal

    f = _factory(tmp_path)
    f.sealed(0, rows=(3,), write=target().write_record())
    f.close()
    _dropped(monkeypatch, id=read_seal(f.wal, 0).base_ts_us + 1000)
    assert main(["amend", f.root, "--pending", "--restamp", "--dry-run"]) == 0
    assert "add it again before the flusher writes the batch" in capsys.readouterr().err
    assert main(["amend", f.root, "--pending", "--without-column", "id", "--dry-run"]) == 0
    assert "add it again" not in capsys.readouterr().err


# -- the tools' errors (issue 31, item 3, after the simulation's changes) --------------------------
def test_recover_of_a_wal_a_drop_blocks_names_the_batch_the_column_and_amend(
        tmp_path, monkeypatch, capsys):
    """recover met ColumnDroppedAfterSeal, neither a RecoveryBlocked nor a WalError: it left
    recovery.cli.main as a traceback, with no exit code. It is recover's 'a batch cannot be replayed'
    (exit 3), naming the batch, the column and the command that unblocks it."""
    f, _ = _wal_with_pending(tmp_path, monkeypatch)
    code = main(["recover", f.root, "--checkpoint", str(tmp_path / "cp")])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "batch 0 writes id, dropped after" in err
    assert f"cassandra-wal amend {f.root} --batch 0 --without-column id" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    from wal.seal import read_seal
    assert read_seal(f.wal, 0) is not None             # nothing written, nothing dropped


def test_a_drop_block_is_a_recovery_block_that_survives_pickling():
    import pickle

    from recovery.errors import RecoveryBlocked

    exc = ColumnDroppedAfterSeal(3, "/w", [("v", 5)], user_timestamps=False)
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back, RecoveryBlocked) and str(back) == str(exc)
    assert back.columns == [("v", 5)] and not is_transient(back)


@pytest.mark.parametrize("away", ["connect", "query"])
def test_amend_restamp_with_cassandra_away_says_where_and_that_nothing_changed(
        tmp_path, monkeypatch, capsys, away):
    """--restamp asks the cluster for the drop times. Cassandra away, ConnectionFailed (or
    cassandra-driver's NoHostAvailable on the query) left recovery.cli.main as a traceback."""
    from cassandra.cluster import NoHostAvailable

    from recovery.cql.errors import ConnectionFailed

    f, _ = _wal_with_pending(tmp_path, monkeypatch)

    def refused(conn):
        raise ConnectionFailed(conn.hosts, "Connection refused")

    class Away:
        def execute(self, cql, parameters=None):
            raise NoHostAvailable("Unable to complete the operation", {"127.0.0.1": "down"})

    monkeypatch.setattr(recovery.cql.connection, "connect", refused if away == "connect" else (
        lambda conn: (SimpleNamespace(shutdown=lambda: None), Away())))
    code = main(["amend", f.root, "--pending", "--restamp"])
    err = capsys.readouterr().err
    assert code == 1, err
    hosts = ", ".join(target().config.connection.hosts)
    assert f"Cassandra at {hosts}" in err and "nothing was recorded" in err
    assert "Traceback" not in err
    assert read_amendment(f.wal, 0) is None and read_amendment(f.wal, 1) is None


def test_recover_with_cassandra_away_at_the_dropped_columns_query_exits_1(
        tmp_path, monkeypatch, capsys):
    """cassandra-driver's NoHostAvailable on the dropped-columns query (connected, then the node
    went away) left recover as a traceback."""
    from cassandra.cluster import NoHostAvailable

    f, _ = _wal_with_pending(tmp_path, monkeypatch)

    class Away:
        def execute(self, cql, parameters=None):
            raise NoHostAvailable("Unable to complete the operation", {"127.0.0.1": "down"})

    monkeypatch.setattr(recovery.cql.connection, "connect", lambda conn: (
        SimpleNamespace(shutdown=lambda: None), Away()))
    code = main(["recover", f.root, "--checkpoint", str(tmp_path / "cp")])
    err = capsys.readouterr().err
    assert code == 1 and "Cassandra did not answer" in err and "Traceback" not in err


def test_amend_on_a_full_disk_says_so_and_exits_as_a_storage_error(
        tmp_path, monkeypatch, capsys):
    """The disk refusing the amendment's write exited 3, which amend --help calls 'the WAL
    cannot be read'. It is a storage error, exit 1 as the log's are (WalStorageError): the
    path, the disk's answer, what was recorded (nothing) and to run it again with room."""
    import errno

    import wal.amendments as amendments_module

    f, _ = _wal_with_pending(tmp_path, monkeypatch)

    def full(path, data, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(amendments_module, "atomic_write", full)
    code = main(["amend", f.root, "--pending", "--without-column", "id"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "No space left on device" in err and f.wal.amendment_path(1) in err
    assert "nothing was recorded" in err and "room" in err and "cannot be read" not in err
    assert read_amendment(f.wal, 0) is None and read_amendment(f.wal, 1) is None


# -- the user's own writetime: decided by the rows' timestamps, not the sealing clock ----------
def _wt_rows(stamps: list[int], values: list | None = None):
    import pyarrow as pa

    n = len(stamps)
    return pa.record_batch({
        "id": pa.array(range(n), pa.int64()),
        "name": pa.array(values if values is not None else [f"r{i}" for i in range(n)],
                         pa.string()),
        "value": pa.array([0.5] * n, pa.float64()),
        "wt": pa.array(stamps, pa.int64())})


def _wt_wal(tmp_path, monkeypatch, rows, sealed_at_us: int, drop_us: int,
            copy_rows: bool = True):
    f = WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp")
    out = output_with(monkeypatch, Dropped(name=drop_us), writetime_column="wt")
    out.target = dataclasses.replace(out.target, columns=("id", "name", "value"))
    f.wal.write_target({"fingerprint": "f", "target": out.target.to_dict(),
                        "checkpoint_location": str(tmp_path / "cp")})
    built = f.ingested(0, rows=(rows,), write=out.target.write_record(),
                       sealed_at_us=sealed_at_us, copy_rows=copy_rows)
    return f, out, built.seal


USER_TS = 1_700_000_000_000_000        # the rows' own write timestamps, long before the drop


@pytest.mark.parametrize("copy_rows", [True, False], ids=["rows-in-log", "rows-in-segments"])
def test_a_writetime_batch_sealed_by_a_clock_ahead_blocks_on_its_rows_timestamps(
        tmp_path, monkeypatch, capsys, copy_rows):
    """Seeds 218 and 332 of the simulation: the driver's clock 40 s ahead seals the batch
    'after' a drop that came after it; its rows carry their own timestamps, long before the
    drop, so Cassandra hides their values of the re-added column. The check compared the drop
    with sealed_at_us and let the batch land without them, silently. The rows are read where
    they are: the log's copy, or (a scale-out writer's batch) its segments."""
    from recovery.output import sealed_rows

    drop_us = SEALED_AT + 5_000_000
    f, out, seal = _wt_wal(tmp_path, monkeypatch, _wt_rows([USER_TS, USER_TS + 1]),
                           sealed_at_us=drop_us + 40_000_000, drop_us=drop_us,
                           copy_rows=copy_rows)
    hidden = out.dropped_after_seal(seal, lambda: sealed_rows(f.wal, f.wal_log, seal))
    assert [c for c, _ in hidden] == ["name"]
    with pytest.raises(ColumnDroppedAfterSeal) as info:
        out.check_not_dropped(seal, f.root, rows=lambda: sealed_rows(f.wal, f.wal_log, seal))
    assert "batch 0 writes name, dropped after" in str(info.value)
    assert "--restamp" not in str(info.value)
    f.close()
    # recover writes nothing of it and says so
    code = main(["recover", f.root, "--checkpoint", str(tmp_path / "cp")])
    err = capsys.readouterr().err
    assert code == 3 and "batch 0 writes name" in err and "--without-column name" in err


def test_a_writetime_batch_whose_values_are_above_the_drop_lands(tmp_path, monkeypatch):
    """Sealed before the drop (by its clock), but every row with a value in the column is
    written above it: nothing is hidden, nothing blocks (the sealing clock said blocked)."""
    from recovery.output import sealed_rows

    drop_us = SEALED_AT + 5_000_000
    rows = _wt_rows([USER_TS, drop_us + 1_000, drop_us + 2_000], values=[None, "a", "b"])
    f, out, seal = _wt_wal(tmp_path, monkeypatch, rows, sealed_at_us=SEALED_AT,
                           drop_us=drop_us)
    # the row below the drop has no value in name: no cell of it to hide
    assert out.dropped_after_seal(seal, lambda: sealed_rows(f.wal, f.wal_log, seal)) == []
    f.close()


def test_amend_restamp_reads_a_writetime_batchs_rows_from_its_segments(
        tmp_path, monkeypatch, capsys):
    """amend --restamp refuses a writetime batch its rows' timestamps put below the drop,
    whatever the sealing clock said."""
    drop_us = SEALED_AT + 5_000_000
    f, out, seal = _wt_wal(tmp_path, monkeypatch, _wt_rows([USER_TS]),
                           sealed_at_us=drop_us + 40_000_000, drop_us=drop_us)
    f.close()
    code = main(["amend", f.root, "--pending", "--restamp"])
    err = capsys.readouterr().err
    assert code == 1 and "own write timestamps" in err, err
