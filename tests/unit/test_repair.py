"""``cassandra-wal repair`` (``wal/repair.py``, ``recovery/cli/repair_cmd.py``; issue 31, item 5): make
Spark run batch K and every later one again, and make the WAL ready for it.

The runbook's old manual step 4 (delete ``commits/K..`` and the damaged batch's files) left two
faults, each shown here against that step (``strict`` xfail: the step is what fails) and fixed
by the verb: ``m/committed_through`` kept its higher value, so Spark's re-run of K counted as
committed as soon as it was sealed and was written before Spark committed it; and Spark
re-plans from its newest ``offsets/N``, so batches K..N-1 never ran again (measured with a real
stream in ``tests/integration/test_repair.py``; here: the offsets go, and a lost batch K is not
even reported). Then: what is kept, what is lowered, every refusal changing nothing, the fence
of a repair cut short, the dry run, JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from recovery.cli.main import main
from recovery.errors import is_transient
from tests.helpers.walfactory import WalFactory
from wal import catalog
from wal.catalog import RecoveryAction
from wal import format as fmt
from wal import repair as repair_mod
from wal.errors import RepairRefused, WalLocked, WalRepairing
from wal.log import WalLog
from wal.recovery_policy import RecoveryPolicy
from wal.repair import repair

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------ helpers
def spark_planned(cp: Path, batch: int) -> None:
    """Spark's ``offsets/N`` and the ``.N.crc`` its checksummed filesystem writes beside it."""
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n')
    (cp / "offsets" / f".{batch}.crc").write_bytes(b"crc of offsets/%d" % batch)


def spark_committed(f: WalFactory, batch: int) -> None:
    f.commit(batch)
    (Path(f.checkpoint) / "commits" / f".{batch}.crc").write_bytes(b"crc of commits/%d" % batch)


def build(tmp_path: Path, flushed: int = 1, ingested: tuple[int, ...] = ()) -> tuple[WalFactory, Path]:
    """A stream's WAL and checkpoint as a damaged batch leaves them: batches 0..flushed-1
    flushed, the later ones sealed (``ingested``: also SEALED in the log), 0..3 committed by
    Spark, batch 4 planned and sealed but not committed (the query stopped during it); the log
    recorded committed_through 3. The factory's log is closed."""
    cp = tmp_path / "cp"
    f = WalFactory(tmp_path / "wal", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(5):
        spark_planned(cp, b)
        if b < flushed:
            f.flushed(b)
        else:
            f.sealed(b, committed=False)
        if b < 4:
            spark_committed(f, b)
        if b in ingested:
            f.wal_log.ingest(f.built[b].seal)
    f.wal_log.note_committed(3)
    f.close()
    return f, cp


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256."""
    out = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def everything(f: WalFactory, cp: Path) -> tuple:
    """The WAL's files (but RocksDB's, which any open rewrites), what its log holds, and the
    checkpoint's files."""
    with WalLog.open_writer(f.wal, repairing=True) as wal_log:
        held = ([r.to_json() for r in wal_log.records()], wal_log.committed_through(),
                wal_log.flushed_through(), wal_log.repair_under_way())
    files = {p: h for p, h in tree(Path(f.root)).items() if not p.startswith("log/")}
    return files, held, tree(cp)


def views(f: WalFactory, policy: RecoveryPolicy = RecoveryPolicy.QUERY_FLUSHER
          ) -> dict[int, catalog.BatchView]:
    with WalLog.open_writer(f.wal) as wal_log:
        return {v.batch: v for v in catalog.describe(f.wal, wal_log, f.checkpoint, policy)}


def old_runbook_step_4(f: WalFactory, cp: Path, k: int) -> None:
    """docs/runbook.md before the verb: remove commits/K and later, and the damaged batch's
    seal and segments."""
    for name in os.listdir(cp / "commits"):
        stem = name.lstrip(".").split(".")[0]
        if stem.isdigit() and int(stem) >= k:
            os.unlink(cp / "commits" / name)
    os.unlink(f.wal.seal_path(k))
    shutil.rmtree(f.wal.batch_segments(k))


def the_verb(f: WalFactory, cp: Path, k: int) -> None:
    repair(f.wal, str(cp), k)


def spark_reruns(f: WalFactory, cp: Path, batch: int) -> None:
    """Spark plans ``batch`` again and the sink seals it; Spark has not committed it yet."""
    spark_planned(cp, batch)
    f.sealed(batch, committed=False)
    f.close()


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------- the two faults of the manual step
@pytest.mark.parametrize("procedure", [
    pytest.param(old_runbook_step_4, id="old-runbook-step",
                 marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                         reason="m/committed_through keeps batch 3")),
    pytest.param(the_verb, id="repair")])
def test_a_rerun_of_k_waits_for_sparks_commit_and_is_then_written(tmp_path, procedure):
    f, cp = build(tmp_path)
    procedure(f, cp, 1)
    spark_reruns(f, cp, 1)
    rerun = views(f)[1]
    assert rerun.action == RecoveryAction.WAIT, \
        f"Spark's re-run of batch 1 is {rerun.action} before Spark committed it"
    spark_committed(f, 1)
    f.close()
    assert views(f)[1].action == RecoveryAction.REPLAY


@pytest.mark.parametrize("procedure", [
    pytest.param(old_runbook_step_4, id="old-runbook-step",
                 marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                         reason="offsets/1..4 stay: Spark re-runs batch 4 only")),
    pytest.param(the_verb, id="repair")])
def test_spark_is_left_to_plan_k_from_the_offsets_of_k_minus_1(tmp_path, procedure):
    """Spark re-plans from its newest offsets/N (measured on 4.3.0: with commits/ lagging it
    re-runs offsets/N only). After the repair the newest offsets and commits are K-1's, so it
    plans a new batch K from there; after the old step it would re-run batch 4 alone, and batch
    1, whose files the step removed, would be gone without a word: nothing reports it."""
    f, cp = build(tmp_path)
    procedure(f, cp, 1)
    assert sorted(int(n) for n in os.listdir(cp / "offsets") if n.isdigit()) == [0]
    assert sorted(int(n) for n in os.listdir(cp / "commits") if n.isdigit()) == [0]


def test_after_the_old_step_a_lost_batch_is_not_even_reported(tmp_path):
    """Why the old step loses rows silently: Spark re-runs only batch 4 and commits it, batch 1
    has no file and no commits/1 any more, so the WAL reports nothing missing."""
    f, cp = build(tmp_path)
    old_runbook_step_4(f, cp, 1)
    spark_reruns(f, cp, 4)
    spark_committed(f, 4)
    f.close()
    seen = views(f, RecoveryPolicy.QUERY_START)
    assert 1 not in seen and all(v.action != RecoveryAction.ERROR for v in seen.values())


# ----------------------------------------------------------------------------- the verb
def test_repair_keeps_what_it_removes_lowers_the_markers_and_unblocks(tmp_path):
    f, cp = build(tmp_path, flushed=1, ingested=(1,))
    f.wal.write_blocked("batch 1: WAL corrupted (segment ...)")
    wal_before, cp_before = tree(Path(f.root)), tree(cp)
    report = repair(f.wal, str(cp), 1)

    keep = Path(report.keep)
    assert keep.parent == Path(f.root) and keep.name.startswith(fmt.REPAIR_DIR_PREFIX)
    moved = {p: h for p, h in wal_before.items()
             if p.startswith(("seals/", "segments/", "entered/"))
             and int(p.split("/")[1][:20]) >= 1}
    assert {p for p in moved} == set(report.plan.wals[0].wal_files) and len(moved) == 4 + 4 * 2
    kept = tree(keep / "wal")
    assert kept == moved, "the kept copy differs from what was removed"
    assert not any(p in tree(Path(f.root)) for p in moved)
    assert sorted(os.listdir(f.wal.segments)) == []          # batch 0 flushed: no segments
    assert f.wal.sealed_batch_ids() == [0]

    ckpt_moved = {p: h for p, h in cp_before.items()
                  if p.startswith(("offsets/", "commits/")) and p.split("/")[1].lstrip(".")[:1] in "1234"}
    assert tree(keep / "checkpoint") == ckpt_moved and len(ckpt_moved) == 2 * (4 + 3)
    assert sorted(os.listdir(cp / "offsets")) == [".0.crc", "0"]
    assert sorted(os.listdir(cp / "commits")) == [".0.crc", "0"]

    with WalLog.open_writer(f.wal) as wal_log:          # no fence left
        assert [r.batch for r in wal_log.records()] == [0]
        assert list(wal_log.chunks(1)) == []
        assert wal_log.committed_through() == 0 and wal_log.flushed_through() == 0
        assert wal_log.repair_under_way() is None
    assert f.wal.read_flushed_through() == 0
    assert f.wal.read_blocked() is None and report.unblocked

    manifest = json.loads((keep / fmt.REPAIR_FILE).read_text())
    assert manifest["status"] == "done" and manifest["plan"]["from_batch"] == 1
    assert [r["batch"] for r in manifest["log_records"][f.root]] == [1]
    assert manifest["plan"]["wals"][0]["markers"]["m/committed_through"] == [3, 0]
    assert os.stat(keep).st_mode & 0o777 == 0o700


def test_lowering_the_flushed_markers_takes_rewrite_and_then_lowers_them(tmp_path):
    f, cp = build(tmp_path, flushed=3)          # 0..2 flushed: flushed_through 2
    with pytest.raises(RepairRefused) as refused:
        repair(f.wal, str(cp), 1)
    assert "batches 1..2" in refused.value.reason and "--rewrite" in refused.value.hint
    assert not refused.value.usage
    report = repair(f.wal, str(cp), 1, rewrite=True)
    assert report.plan.wals[0].written == ((1, 2),)
    with WalLog.open_writer(f.wal) as wal_log:
        assert wal_log.flushed_through() == 0 and wal_log.committed_through() == 0
    assert f.wal.read_flushed_through() == 0
    spark_reruns(f, cp, 1)
    assert views(f)[1].action == RecoveryAction.WAIT, "the re-run of 1 would be taken for written"


def test_a_flushing_batch_counts_as_written(tmp_path):
    f, cp = build(tmp_path, flushed=1, ingested=(1,))
    with WalLog.open_writer(f.wal) as wal_log:
        wal_log.begin_flush(1)                  # rows of it may be in Cassandra
    with pytest.raises(RepairRefused, match="batch 1 "):
        repair(f.wal, str(cp), 1)


def test_repair_from_0_forgets_every_batch_and_every_marker(tmp_path):
    f, cp = build(tmp_path, flushed=1)
    repair(f.wal, str(cp), 0, rewrite=True)
    assert not (cp / "offsets").exists() or os.listdir(cp / "offsets") == []
    assert f.wal.sealed_batch_ids() == [] and f.wal.read_flushed_through() == -1
    assert not os.path.exists(os.path.join(f.root, fmt.FLUSHED_THROUGH_FILE))
    with WalLog.open_writer(f.wal) as wal_log:
        assert wal_log.records() == [] and wal_log.committed_through() == -1
        assert wal_log.flushed_through() == -1


def test_a_batch_a_foreach_batch_function_lost_is_repaired(tmp_path):
    """The runbook's other remedy: batch 2 entered, never sealed, committed: broken; a repair
    from 2 moves its entry and Spark runs it again."""
    cp = tmp_path / "cp"
    f = WalFactory(tmp_path / "wal", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(3):
        spark_planned(cp, b)
        f.entered(b)
        if b < 2:
            f.flushed(b)
        spark_committed(f, b)
    f.close()
    assert views(f, RecoveryPolicy.QUERY_START)[2].detail == catalog.ENTERED_NOT_SEALED
    report = repair(f.wal, str(cp), 2)
    assert report.plan.wals[0].wal_files == ("entered/00000000000000000002.json",)
    assert (Path(report.keep) / "wal" / "entered" / "00000000000000000002.json").exists()
    assert all(v.action == RecoveryAction.NOTHING
               for v in views(f, RecoveryPolicy.QUERY_START).values())


def two_tables(tmp_path: Path) -> tuple[WalFactory, WalFactory, Path]:
    """A function writing two tables: one WAL each, one checkpoint. Table a's writer lost
    batch 2 (entered, nothing sealed, committed); table b wrote it."""
    cp = tmp_path / "cp"
    (cp / fmt.POINTERS_DIR).mkdir(parents=True)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    a = WalFactory(tmp_path / "cp" / "cassandra_wal.ks.a", checkpoint=cp)
    b = WalFactory(tmp_path / "cp" / "cassandra_wal.ks.b", checkpoint=cp)
    for f, table in ((a, "a"), (b, "b")):
        (cp / fmt.POINTERS_DIR / f"ks.{table}.json").write_text(
            json.dumps({"wal_path": f.root}))
    for batch in range(3):
        spark_planned(cp, batch)
        for f in (a, b):
            f.entered(batch)
            if batch < 2 or f is b:
                f.flushed(batch)
        spark_committed(a, batch)
    a.close(), b.close()
    return a, b, cp


def test_every_wal_of_a_foreach_batch_functions_checkpoint_is_repaired(tmp_path):
    """Spark re-runs batch 2 for both tables, so b's batch 2 is written again (--rewrite)
    and both WALs are made ready for the re-run."""
    a, b, cp = two_tables(tmp_path)
    assert views(a, RecoveryPolicy.QUERY_START)[2].detail == catalog.ENTERED_NOT_SEALED
    b.wal.write_blocked("stale")

    with pytest.raises(RepairRefused, match=f"batch 2 of {b.root}"):
        repair(a.wal, str(cp), 2)
    report = repair(a.wal, str(cp), 2, rewrite=True)
    assert [p.wal for p in report.plan.wals] == [a.root, b.root]
    keep = Path(report.keep)
    assert (keep / "wal" / "entered" / "00000000000000000002.json").exists()
    kept_b = keep / "wals" / "cassandra_wal.ks.b"
    assert sorted(os.listdir(kept_b / "seals")) == ["00000000000000000002.seal"]
    for f in (a, b):
        assert f.wal.read_flushed_through() == 1 and f.wal.read_blocked() is None
        with WalLog.open_writer(f.wal) as wal_log:
            assert wal_log.flushed_through() == 1 and wal_log.committed_through() <= 1
            assert [r.batch for r in wal_log.records()] == [0, 1]
    spark_reruns(b, cp, 2)
    assert views(b)[2].action == RecoveryAction.WAIT


def test_a_repair_of_two_wals_cut_short_between_them_is_finished_from_either(
        tmp_path, monkeypatch):
    a, b, cp = two_tables(tmp_path)
    real_rewind, calls = WalLog.rewind, []

    def crash_at_the_second(self, batch):
        calls.append(self.wal.root)
        if len(calls) == 2:
            raise KeyboardInterrupt("the machine went down")
        return real_rewind(self, batch)

    monkeypatch.setattr(WalLog, "rewind", crash_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        repair(a.wal, str(cp), 2, rewrite=True)
    monkeypatch.setattr(WalLog, "rewind", real_rewind)
    WalLog.open_writer(a.wal).close()               # a is done: its fence is lifted
    with pytest.raises(WalRepairing):
        WalLog.open_writer(b.wal)
    report = repair(a.wal, str(cp), 2, rewrite=True)
    assert report.resumed
    with WalLog.open_writer(b.wal) as wal_log:
        assert wal_log.flushed_through() == 1 and [r.batch for r in wal_log.records()] == [0, 1]
    assert json.loads((Path(report.keep) / fmt.REPAIR_FILE).read_text())["status"] == "done"


def test_a_broken_batch_before_k_is_said_and_keeps_the_block(tmp_path):
    f, cp = build(tmp_path, flushed=1)
    os.unlink(f.wal.seal_path(2))       # batch 2 committed, its seal gone: broken
    f.wal.write_blocked("batch 2: no seal")
    report = repair(f.wal, str(cp), 3)
    assert any("batch 2" in w and "repair from batch 2" in w for w in report.plan.warnings)
    assert not report.unblocked and f.wal.read_blocked() is not None


# --------------------------------------------------------------------------- refusals
def test_every_refusal_changes_nothing(tmp_path):
    f, cp = build(tmp_path, flushed=2)
    before = everything(f, cp)

    def refused(k, match, usage=False, **kw):
        now = everything(f, cp)
        with pytest.raises(RepairRefused, match=match) as exc:
            repair(f.wal, str(cp), k, **kw)
        assert exc.value.usage is usage and exc.value.hint
        assert everything(f, cp) == now, f"--from {k} changed something"

    refused(5, "planned batches up to 4 only", usage=True)
    refused(1, "already written to Cassandra")                 # batch 1 flushed
    for name in ("offsets/0", "offsets/.0.crc"):              # Spark purged batch 0
        os.rename(cp / name, tmp_path / name.replace("/", "_"))
    refused(1, "no longer keeps batch 0", rewrite=True)
    for name in ("offsets/0", "offsets/.0.crc"):
        os.rename(tmp_path / name.replace("/", "_"), cp / name)
    (cp / "state" / "0").mkdir(parents=True)
    refused(2, "stateful")
    shutil.rmtree(cp / "state")
    (cp / fmt.POINTERS_DIR).mkdir()
    (cp / fmt.POINTERS_DIR / "ks.other.json").write_text(json.dumps(
        {"wal_path": "s3a://bucket/other"}))
    refused(2, "is on a store")
    shutil.rmtree(cp / fmt.POINTERS_DIR)
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    with pytest.raises(RepairRefused, match="not a Spark checkpoint"):
        repair(f.wal, str(empty), 2)
    Path(f.root, fmt.BINDING_FILE).write_text(json.dumps({"checkpoint": "/elsewhere",
                                                          "query_id": "q-2"}))
    refused(2, "belongs to the query checkpointed at /elsewhere", usage=True)
    os.unlink(os.path.join(f.root, fmt.BINDING_FILE))
    assert everything(f, cp) == before


def test_the_clock_behind_the_batches_written_again_is_refused(tmp_path, monkeypatch):
    f, cp = build(tmp_path, flushed=2)       # the factory's timestamps start in 2026-11-22
    monkeypatch.setattr(repair_mod, "now_us", lambda: 1_700_000_000_000_000)
    with pytest.raises(RepairRefused, match="clock is behind"):
        repair(f.wal, str(cp), 1, rewrite=True)


def test_a_running_sink_holds_the_lock(tmp_path):
    f, cp = build(tmp_path)
    with WalLog.open_writer(f.wal):
        with pytest.raises(WalLocked):
            repair(f.wal, str(cp), 1)


# ----------------------------------------------------------------- a repair cut short
def test_a_repair_cut_short_fences_the_wal_until_it_is_run_again(tmp_path, monkeypatch):
    f, cp = build(tmp_path)
    wal_before, cp_before = tree(Path(f.root)), tree(cp)
    real_move, moves = repair_mod._move, []

    def crash_after_some(src_root, relative, dest_root):
        if len(moves) == 9:             # the WAL's files moved, and one of the checkpoint's
            raise KeyboardInterrupt("the machine went down")
        moves.append(relative)
        return real_move(src_root, relative, dest_root)

    monkeypatch.setattr(repair_mod, "_move", crash_after_some)
    with pytest.raises(KeyboardInterrupt):
        repair(f.wal, str(cp), 1)
    monkeypatch.setattr(repair_mod, "_move", real_move)

    with pytest.raises(WalRepairing) as fenced:     # the flusher, recover: refused
        WalLog.open_writer(f.wal)
    assert "--from 1" in str(fenced.value) and not is_transient(fenced.value)
    with pytest.raises(RepairRefused, match="began and did not finish"):
        repair(f.wal, str(cp), 2)
    report = repair(f.wal, str(cp), 1)
    assert report.resumed
    keep = Path(report.keep)
    moved = {p for p in wal_before if p.startswith(("seals/", "segments/"))
             and int(p.split("/")[1][:20]) >= 1}
    assert set(tree(keep / "wal")) == moved
    assert set(tree(keep / "checkpoint")) == {p for p in cp_before if p.startswith(
        ("offsets/", "commits/")) and p.split("/")[1].lstrip(".")[:1] in "1234"}
    manifest = json.loads((keep / fmt.REPAIR_FILE).read_text())
    assert manifest["status"] == "done" and len(manifest["resumed_at"]) == 1
    with WalLog.open_writer(f.wal) as wal_log:
        assert wal_log.committed_through() == 0 and [r.batch for r in wal_log.records()] == [0]


# -------------------------------------------------------------------------------- CLI
def test_cli_dry_run_prints_the_plan_and_changes_nothing(capsys, tmp_path):
    f, cp = build(tmp_path)
    before = everything(f, cp)
    code, out, err = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1, "--dry-run")
    assert code == 0, err
    assert "repair of " in out and "from batch 1" in out and "dry run: nothing was changed" in out
    for needle in ("BATCH", "m/committed_through 3 -> 0", "files to move: 12",
                   "checkpoint files to move: 14", "would keep in: "):
        assert needle in out, out
    code, out, _ = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1, "--dry-run",
                       "--json")
    doc = json.loads(out)
    assert code == 0 and doc["dry_run"] is True and doc["plan"]["from_batch"] == 1
    assert [b["batch"] for b in doc["plan"]["wals"][0]["batches"]] == [1, 2, 3, 4]
    assert "end offsets of batch 0" in doc["plan"]["rerun"]
    assert everything(f, cp) == before


def test_cli_repairs_with_json_and_the_checkpoint_from_target_json(capsys, tmp_path):
    f, cp = build(tmp_path)
    keep = tmp_path / "kept"
    code, out, err = cli(capsys, "repair", f.root, "--from", 1, "--keep", keep, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] is False and doc["keep"] == str(keep) and doc["unblocked"] is True
    assert doc["plan"]["checkpoint"] == str(cp)
    assert (keep / fmt.REPAIR_FILE).exists() and f.wal.sealed_batch_ids() == [0]


def test_cli_text_says_what_to_do_next(capsys, tmp_path):
    f, cp = build(tmp_path)
    code, out, _ = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1)
    assert code == 0
    assert "kept in: " in out and "next: start the query" in out
    assert "the source must still hold those rows" in out


@pytest.mark.parametrize("argv, code, needle", [
    (["--from", "9"], 2, "planned batches up to 4 only"),
    (["--from", "0"], 1, "already written to Cassandra"),
    (["--from", "-1"], 2, "batch ids start at 0"),
    (["--from", "x"], 2, "not a batch id"),
    ([], 2, "--from"),
])
def test_cli_refusals_exit_with_a_hint(capsys, tmp_path, argv, code, needle):
    f, cp = build(tmp_path)
    got, out, err = cli(capsys, "repair", f.root, "--checkpoint", cp, *argv)
    assert got == code, err
    assert "Traceback" not in err and f"cassandra-wal: error: " in err and needle in err, err
    assert "hint: " in err


def test_cli_refuses_a_store_and_a_held_lock(capsys, tmp_path):
    f, cp = build(tmp_path)
    code, _, err = cli(capsys, "repair", "s3a://bucket/wal", "--checkpoint", cp, "--from", 1)
    assert code == 1 and "not supported on a store yet" in err
    code, _, err = cli(capsys, "repair", f.root, "--checkpoint", "hdfs://nn:8020/cp",
                       "--from", 1)
    assert code == 1 and "not supported on a store yet" in err
    with WalLog.open_writer(f.wal):
        code, _, err = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1)
    assert code == 1 and "open for writing by another process" in err and "hint: stop" in err


def test_cli_help_has_examples_and_says_what_it_refuses(capsys):
    code, out, _ = cli(capsys, "repair", "--help")
    assert code == 0 and "Examples:\n  cassandra-wal repair " in out
    for needle in ("state/", "--rewrite", "offsets/K..", "not supported yet", "exit codes:"):
        assert needle in out
    code, out, _ = cli(capsys, "--help")
    assert "cassandra-wal repair " in out


# -------------------------------------- what a foreachBatch WAL records of its runs, and amendments
def test_a_repair_takes_the_run_records_of_the_batches_it_forgets(tmp_path):
    """Run r1 ran batches 0..2, run r2 batch 3 (``entered/runs/3``). A repair from 2 forgets
    batches 2 and 3; the next run r3 records its start at 2 and re-runs 2 and 3. Left behind,
    r2's record would name r2 the run of batch 3: r3's call for it would count as another
    run's leftover, be skipped and its files deleted: a committed batch lost."""
    from wal.entries import read_runs, record_run, run_of
    cp = tmp_path / "cp"
    f = WalFactory(tmp_path / "wal", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    record_run(f.wal, 0, "r1")
    for b in range(4):
        if b == 3:
            record_run(f.wal, 3, "r2")
        spark_planned(cp, b)
        f.entered(b, run_id="r1" if b < 3 else "r2")
        f.flushed(b)
        spark_committed(f, b)
    f.close()
    report = repair(f.wal, str(cp), 2, rewrite=True)
    assert "entered/runs/00000000000000000003.run" in report.plan.wals[0].wal_files
    assert (Path(report.keep) / "wal" / "entered" / "runs" / "00000000000000000003.run").exists()
    record_run(f.wal, 2, "r3")                   # the next run starts at batch 2
    assert run_of(read_runs(f.wal), 3) == "r3"
    spark_reruns(f, cp, 3)
    f.entered(3, run_id="r3")
    spark_committed(f, 3)
    f.close()
    assert views(f)[3].action == RecoveryAction.REPLAY


def test_a_repair_takes_the_amendments_of_the_batches_it_forgets(tmp_path):
    """An operator amended batch 2 (written without a column); a repair from 1 forgets it, and
    Spark's re-run of batch 2 seals other rows: the amendment is not the re-run's."""
    from wal.amendments import Amendment, read_amendment, write_amendment
    f, cp = build(tmp_path)
    write_amendment(f.wal, Amendment(2, without_columns=("v",), reason="dropped"))
    report = repair(f.wal, str(cp), 1)
    assert "amended/00000000000000000002.json" in report.plan.wals[0].wal_files
    assert read_amendment(f.wal, 2) is None
    assert (Path(report.keep) / "wal" / "amended" / "00000000000000000002.json").exists()




def test_a_repair_below_since_lowers_it_so_a_batch_the_rerun_skips_is_skipped(tmp_path):
    """Table u's writer was first called at batch 3 (``since`` 3); another table's loss made
    the operator repair the checkpoint from 1. The re-run's writer records batch 1 and is not
    called for batch 2: with ``since`` left at 3, batch 2 read as missing and blocked the WAL
    for good, though nothing was lost."""
    from wal.entries import entries_since, record_run

    cp = tmp_path / "cp"
    f = WalFactory(tmp_path / "wal_u", checkpoint=cp, deterministic=False)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(5):
        spark_planned(cp, b)
    for b in range(3):                   # table u not written by the function in 0..2
        f.commit(b)
    record_run(f.wal, 0, "r1")
    for b in (3, 4):                     # first written at batch 3: since = 3
        f.entered(b, run_id="r1")
        f.flushed(b)
    f.close()
    repair(f.wal, str(cp), 1, rewrite=True)
    assert entries_since(f.wal) == 1
    record_run(f.wal, 1, "r2")           # run r2 starts at batch 1
    spark_planned(cp, 1)
    f.entered(1, run_id="r2")            # the writer is called for the re-run's batch 1 ...
    f.sealed(1, committed=True)
    spark_planned(cp, 2)
    f.commit(2)                          # ... and not for batch 2 (empty for this table)
    f.close()
    seen = views(f)
    assert seen[1].action == RecoveryAction.REPLAY
    assert seen[2].action == RecoveryAction.NOTHING, (seen[2].state, seen[2].detail)


def test_the_clock_check_counts_the_amended_timestamps(tmp_path):
    """A batch re-stamped above a drop (on Cassandra's clock) may be above this machine's
    clock: its re-run would be written below it, and the old cells win."""
    from wal.amendments import Amendment, write_amendment
    from wal.seal import now_us, read_seal

    cp = tmp_path / "cp"
    f = WalFactory(tmp_path / "wal", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(3):
        spark_planned(cp, b)
        f.flushed(b)
    write_amendment(f.wal, Amendment(2, (), now_us() + 3_600_000_000, "re-stamped",
                                     seal_id=read_seal(f.wal, 2).seal_id))
    f.close()
    with pytest.raises(RepairRefused, match="clock is behind"):
        repair(f.wal, str(cp), 2, rewrite=True)


def test_a_repair_of_the_wal_moved_away_from_lowers_its_moved_marker(tmp_path):
    """Review 31, finding 4. X wrote batches 0-3, the stream moved to Y (wal.path changed),
    which wrote 4-5. Cassandra lost rows (a restore from an old backup): the operator
    re-delivers from batch 2 with 'cassandra-wal repair X --from 2 --rewrite', naming X, which
    wrote batch 2. Before, the repair lowered X's flushed_through to 1 and left X's moved.json
    at 'after 3'; once Spark re-ran 2.. through Y (the pointer's WAL), X called batches 2-3
    committed and missing (BROKEN: status blocked), and a move back to X was refused for
    batches no one can ever write. The repair now lowers moved.json's 'after' to K-1 too."""
    from wal.errors import WalMoveRefused
    from wal.move import follow_move
    from wal.pointer import write_pointer

    cp = tmp_path / "cp"
    x = WalFactory(tmp_path / "x", checkpoint=cp)
    (cp / "metadata").write_text('{"id":"q-1"}\n')
    for b in range(4):
        spark_planned(cp, b)
        x.flushed(b)
        spark_committed(x, b)
    x.wal_log.note_committed(3)
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

    report = repair(x.wal, str(cp), 2, rewrite=True)
    assert x.wal.read_moved() == (y.wal.location, 1)
    assert report.plan.wals[0].markers["moved.json after"] == [3, 1]
    for b in range(2, 6):                            # Spark re-runs 2.. through Y
        spark_planned(cp, b)
        y.sealed(b)
        spark_committed(y, b)
        y.flush(b)
    y.close()
    with WalLog.open_writer(x.wal) as wal_log:
        broken = [(v.batch, v.detail) for v in catalog.describe(x.wal, wal_log, str(cp))
                  if v.action == RecoveryAction.ERROR]
    refused = None
    try:
        follow_move(y.wal, x.wal, str(cp))           # a move back to X
    except WalMoveRefused as exc:
        refused = exc.pending
    assert (broken, refused) == ([], None), (
        f"X, moved away from after batch 3, now blocks on {broken}; a move back to it is "
        f"refused for {refused}")
    assert x.wal.read_flushed_through() == 5


def test_a_wal_of_the_checkpoint_with_no_target_yet_is_a_run_the_lock_cannot_see(tmp_path,
                                                                               capsys):
    """The repair's lock is the flusher's, and a live run whose flusher has not started (its
    first batch through a WAL still staging: no target recorded yet) holds none (the gap
    c8f8d06 closed for recover). Here a foreachBatch function writes table u for the first
    time: u's WAL is pointed at and stages batch 4, no target yet. The repair moved that
    batch's segments and Spark's offsets/4 from under the live run. It now refuses, changing
    nothing, unless --force says no run of the query is live."""
    from wal.pointer import write_pointer

    f, cp = build(tmp_path)
    u = WalFactory(tmp_path / "u", checkpoint=cp)
    os.unlink(u.wal.target_file)                      # no batch recorded its target yet
    write_pointer(str(cp), u.wal.location, ("ks", "u"))
    live = u.staged(4, rows=(2,))                     # the live run's batch, still staging
    u.close()

    def u_files():
        return {p: h for p, h in tree(tmp_path / "u").items() if not p.startswith("log/")}

    before = everything(f, cp), u_files()
    with pytest.raises(RepairRefused) as info:
        repair(f.wal, str(cp), 1)
    assert "no target" in info.value.reason and "--force" in info.value.hint
    assert (everything(f, cp), u_files()) == before
    code, _out, err = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1,
                          "--dry-run")
    assert code == 1 and "--force" in err
    assert all(os.path.exists(u.wal.segment_path(s.name)) for s in live.segments)
    code, _out, _err = cli(capsys, "repair", f.root, "--checkpoint", cp, "--from", 1,
                           "--force")
    assert code == 0
    assert not any(os.path.exists(u.wal.segment_path(s.name)) for s in live.segments)
