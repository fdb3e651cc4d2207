"""``cassandra-wal`` (recovery/cli/): inspect, dump, verify -- output, exit codes, read-only-ness.

Most tests run the CLI in-process (``main(argv)`` returns the exit code); a few run it as a
real process (``python -m recovery.cli.main``) to check what a shell sees. WALs are built with
``tests/helpers/walfactory.py`` through the real ``wal`` API; damage is done to copies.

Golden files live in ``tests/unit/golden/``; regenerate them with
``CASSANDRA_WAL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_cli.py``.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:           # `pytest` run without `python -m` from elsewhere
    sys.path.insert(0, str(REPO))

from rocksdict import Options, Rdict  # noqa: E402

from tests.helpers.walfactory import WalFactory, typed_rows  # noqa: E402
from wal import format as fmt  # noqa: E402
from wal.retention import RetentionPolicy, apply_retention, remove_batch_files  # noqa: E402
from recovery.cli import dump_cmd, verify_cmd  # noqa: E402
from recovery.cli.main import main  # noqa: E402

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = os.environ.get("CASSANDRA_WAL_UPDATE_GOLDEN") == "1"
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))


# -- helpers ------------------------------------------------------------------------------
@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines()]


def cli(capsys, *argv) -> Result:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def cli_process(*argv, timeout: float = 60) -> Result:
    proc = subprocess.run([sys.executable, "-m", "recovery.cli.main", *map(str, argv)],
                          capture_output=True, text=True, env=ENV, cwd=REPO, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: Result, code: int, *needles: str) -> None:
    assert result.code == code, result
    assert "Traceback" not in result.err
    errors = [line for line in result.err.splitlines() if line.startswith("cassandra-wal: error: ")]
    assert len(errors) == 1, result.err
    for needle in needles:
        assert needle in errors[0], errors[0]


def snapshot(root: str) -> dict:
    """Every file and folder under ``root``: sha256, size, mode and mtime (folders: mtime)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        st = os.stat(dirpath)
        out[os.path.relpath(dirpath, root) + "/"] = (st.st_mode, st.st_mtime_ns)
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(path, root)] = (digest, st.st_size, st.st_mode, st.st_mtime_ns)
    return out


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE_GOLDEN or not path.exists():
        if not UPDATE_GOLDEN:
            pytest.fail(f"golden file {path} missing: run with CASSANDRA_WAL_UPDATE_GOLDEN=1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"differs from {path} (CASSANDRA_WAL_UPDATE_GOLDEN=1)"


def segments_of(wal: str, batch: int) -> list[str]:
    return sorted(glob.glob(os.path.join(wal, "segments", fmt.batch_name(batch), "*.seg")))


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@dataclass
class Every:
    root: Path
    wal: str
    cp: str
    ids: dict

    def copy(self, dest: Path) -> str:
        shutil.copytree(self.root, dest, symlinks=True)
        return str(dest / "wal")


TYPED = 5           # typed rows, sealed and committed: read from its segments
TYPED_LOG = 6       # the same rows, ingested: read from the log
GARBAGE = 7         # sealed, with a losing task attempt beside the winners
UNCOMMITTED = 8     # every_state's uncommitted batches: above every committed one


@pytest.fixture(scope="module")
def every(tmp_path_factory) -> Every:
    """A WAL with a batch in every state, plus typed batches. Never modified by tests."""
    root = tmp_path_factory.mktemp("every")
    typed = [typed_rows(4), typed_rows(3, start=1)]
    with WalFactory(root / "wal", checkpoint=root / "cp") as f:
        f.sealed(TYPED, rows=typed, chunk_rows=2, committed=True)
        f.ingested(TYPED_LOG, rows=typed, chunk_rows=2)
        f.sealed(GARBAGE, committed=True, losing_attempts=1)
        ids = f.every_state(uncommitted_from=UNCOMMITTED)
    return Every(root, str(root / "wal"), str(root / "cp"), ids)


# -- inspect ------------------------------------------------------------------------------
def stable_inspect(doc: dict) -> dict:
    """Drop what changes from run to run (ages, clocks, paths, byte sizes of Arrow/RocksDB)."""
    doc = copy.deepcopy(doc)
    doc["wal"]["path"], doc["wal"]["checkpoint"] = "<wal>", "<cp>"
    doc.pop("size"), doc.pop("health")
    for b in doc["batches"]:
        del b["age_s"], b["bytes"]
        if b["seal"]:
            del b["seal"]["sealed_at_us"]
        if b["log"]:
            del b["log"]["updated_at_us"]
    return doc


def test_inspect_json_every_state_matches_golden(capsys, every):
    result = cli(capsys, "inspect", every.wal, "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert set(doc) == {"wal", "health", "batches", "totals", "size"}
    assert doc["wal"]["checkpoint"] == every.cp and doc["wal"]["checkpoint_source"] == "target.json"
    size = doc["size"]
    assert size["total"] == size["segments"] + size["log"] + size["seals"] > 0
    check_golden("inspect_every_state.json", json.dumps(stable_inspect(doc), indent=2) + "\n")


def test_inspect_table_every_state(capsys, every):
    result = cli(capsys, "inspect", every.wal)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "health      healthy"      # its pending batches were sealed just now
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("WAL ")):]
    assert lines[0].startswith("WAL ") and every.wal in lines[0]
    assert f"{every.cp} (from target.json)" in lines[1]
    assert "flushed through batch 0" in lines[2]
    header = next(line for line in lines if line.startswith("BATCH"))
    assert header.split() == ["BATCH", "STATE", "PARTS", "ROWS", "BYTES", "AGE", "FLUSHED",
                              "COMMITTED", "ACTION", "DETAIL"]
    rows = {int(line.split()[0]): line for line in lines[lines.index(header) + 1:]
            if line.strip() and line.split()[0].isdigit()}
    ids = every.ids
    assert "flushed" in rows[ids["flushed"]] and "5/5 (100%)" in rows[ids["flushed"]]
    assert "discarded" in rows[ids["discarded"]] and "nothing" in rows[ids["discarded"]]
    assert "flushing" in rows[ids["flushing"]] and "4/20 (20%)" in rows[ids["flushing"]]
    assert "replay" in rows[ids["flushing"]] and "resume at row 4" in rows[ids["flushing"]]
    assert " yes " in rows[ids["sealed_committed"]]
    uncommitted = rows[ids["sealed_uncommitted"]]
    assert " no " in uncommitted and "discard" in uncommitted
    assert "staged" in rows[ids["staged"]] and "not sealed" in rows[ids["staged"]]
    assert any(line.startswith("batches ") and "1 staged" in line and "1 flushing" in line
               for line in lines)
    pending = 16 + 7 + 5 + 7 + 7 + 5          # batches 2, 3, 4, 7, 8, 9
    assert f"rows pending  {pending}" in lines
    assert any(line.startswith("size ") and "segments" in line for line in lines)


def test_inspect_checkpoint_option_and_unknown_checkpoint(capsys, every, tmp_path):
    other = tmp_path / "other-cp"
    (other / "commits").mkdir(parents=True)
    doc = cli(capsys, "inspect", every.wal, "--checkpoint", other, "--json").json()
    assert doc["wal"]["checkpoint_source"] == "option"
    views = {b["batch"]: b for b in doc["batches"]}
    assert views[every.ids["sealed_committed"]]["committed"] is False
    assert views[every.ids["sealed_committed"]]["action"] == "discard"

    wal = every.copy(tmp_path / "copy")
    Path(wal, "target.json").write_text("{}")             # no checkpoint_location
    result = cli(capsys, "inspect", wal)
    assert result.code == 0 and "checkpoint  unknown" in result.out
    views = {b["batch"]: b for b in cli(capsys, "inspect", wal, "--json").json()["batches"]}
    assert views[every.ids["sealed_committed"]]["committed"] is None
    assert views[every.ids["sealed_committed"]]["action"] == "wait"

    Path(wal, "target.json").write_text("{not json")
    result = cli(capsys, "inspect", wal)
    assert result.code == 0 and "cassandra-wal: warning: cannot read" in result.err
    doc = cli(capsys, "verify", wal, "--json").json()
    assert doc["ok"] and [p["segment"] for p in doc["problems"]
                          if p["severity"] == "warning"] == ["target.json"]

    missing = cli(capsys, "inspect", every.wal, "--checkpoint", tmp_path / "nope")
    assert missing.code == 2 and "no such directory" in missing.err and "hint:" in missing.err


def test_inspect_empty_wal_and_no_log(capsys, tmp_path):
    with WalFactory(tmp_path / "wal") as f:
        f.staged(0)
    result = cli(capsys, "inspect", tmp_path / "wal")
    assert result.code == 0, result.err
    assert "log         none yet" in result.out and "discard" in result.out
    (tmp_path / "empty").mkdir()
    WalFactory(tmp_path / "empty" / "wal")
    result = cli(capsys, "inspect", tmp_path / "empty" / "wal")
    assert result.code == 0 and "no batches" in result.out


# -- dump ---------------------------------------------------------------------------------
def test_dump_typed_rows_from_log_matches_golden(capsys, every):
    result = cli(capsys, "dump", every.wal, "--batch", TYPED_LOG)
    assert result.code == 0, result.err
    assert result.err == ""
    check_golden("dump_typed.jsonl", result.out)


def test_dump_renders_every_type(capsys, every):
    rows = cli(capsys, "dump", every.wal, "--batch", TYPED).lines()
    assert [r["_row"] for r in rows] == list(range(7))
    assert [r["_partition"] for r in rows] == [0, 0, 0, 0, 1, 1, 1]
    base = rows[0]["_writetime_us"]
    assert all(r["_writetime_us"] == base + r["_row"] for r in rows)
    ordinary, edges, nulls, infinite = rows[0], rows[1], rows[2], rows[3]
    assert ordinary["s"] == 'héllo "quoted"\n'
    assert (ordinary["i"], ordinary["l"], ordinary["d"], ordinary["f"]) == (1, 2**40, 1.5, 0.1)
    assert ordinary["b"] is True and edges["b"] is False
    assert ordinary["ts"] == "2024-02-29T23:59:59.123456+00:00"
    assert ordinary["ts_ntz"] == "2024-02-29T23:59:59.123456"
    assert ordinary["day"] == "2024-02-29"
    assert ordinary["dec"] == "12345678.9012" and edges["dec"] == "-0.0001"
    assert ordinary["bin"] == {"$base64": "AAH+/w=="} and edges["bin"] == {"$base64": ""}
    assert ordinary["tags"] == ["a", "b"] and ordinary["uniq"] == [3, 1, 2]
    assert ordinary["attrs"] == {"x": 1, "y": None}
    assert ordinary["by_id"] == [[1, "one"], [2, "two"]]
    assert ordinary["point"] == {"x": 1.0, "y": -2.5, "label": "p"}
    assert ordinary["nested"] == [{"k": "a", "v": ["1.10", None]}]
    assert ordinary["id"] == "3f2a9c01-b7de-4c1a-9e1b-22c04f10aa7e"
    assert (edges["i"], edges["l"]) == (-2**31, -2**63)
    assert edges["d"] == "NaN" and str(edges["f"]) == "-0.0"
    assert edges["ts"] == "0001-01-01T00:00:00.000000+00:00"
    assert edges["ts_ntz"] == "9999-12-31T23:59:59.000000" and edges["day"] == "0001-01-01"
    assert edges["tags"] == [] and edges["attrs"] == {} and edges["by_id"] == []
    assert edges["point"] == {"x": None, "y": None, "label": None}
    assert all(v is None for k, v in nulls.items() if not k.startswith("_"))
    assert infinite["d"] == "Infinity" and infinite["f"] == "-Infinity"
    assert infinite["l"] == 2**63 - 1 and infinite["tags"] == [None, "z"]
    assert infinite["nested"] == [None, {"k": None, "v": []}]


def test_dump_log_and_segments_agree(capsys, every):
    from_segments = cli(capsys, "dump", every.wal, "--batch", TYPED).lines()
    from_log = cli(capsys, "dump", every.wal, "--batch", TYPED_LOG).lines()
    strip = [{k: v for k, v in r.items() if k != "_writetime_us"} for r in from_segments]
    assert strip == [{k: v for k, v in r.items() if k != "_writetime_us"} for r in from_log]


def test_dump_same_rows_before_and_after_ingest(capsys, tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        built = f.sealed(0, rows=[typed_rows(5), 3], chunk_rows=2)
        before = cli(capsys, "dump", tmp_path / "wal", "--batch", 0)
        f.wal_log.ingest(built.seal)
        after = cli(capsys, "dump", tmp_path / "wal", "--batch", 0)
    assert before.code == after.code == 0
    assert before.out == after.out and len(before.lines()) == 8


def test_dump_partition_and_limit(capsys, every):
    batch = every.ids["flushing"]        # 2 partitions x 5 chunks of 2 rows, in the log
    rows = cli(capsys, "dump", every.wal, "--batch", batch, "--partition", 1).lines()
    assert [r["_row"] for r in rows] == list(range(10, 20))
    assert {r["_partition"] for r in rows} == {1}
    assert [r["id"] for r in rows] == list(range(2010, 2020))
    rows = cli(capsys, "dump", every.wal, "--batch", batch, "--limit", 3).lines()
    assert [r["_row"] for r in rows] == [0, 1, 2]
    assert cli(capsys, "dump", every.wal, "--batch", batch, "--limit", 0).out == ""
    rows = cli(capsys, "dump", every.wal, "--batch", TYPED, "--partition", 1,
               "--limit", 2).lines()
    assert [(r["_partition"], r["_row"]) for r in rows] == [(1, 4), (1, 5)]


def test_dump_streams_one_chunk_at_a_time(capsys, every, monkeypatch):
    decoded = []
    real = dump_cmd._decode
    monkeypatch.setattr(dump_cmd, "_decode", lambda *a: decoded.append(1) or real(*a))
    result = cli(capsys, "dump", every.wal, "--batch", every.ids["flushing"], "--limit", 3)
    assert result.code == 0 and len(result.lines()) == 3
    assert len(decoded) == 2             # chunks of 2 rows: never the 10 chunks of the batch


def test_dump_staged_batch_reads_unsealed_segments(capsys, every):
    result = cli(capsys, "dump", every.wal, "--batch", every.ids["staged"])
    assert result.code == 0
    assert "has no seal" in result.err and "unsealed segment file(s)" in result.err
    rows = result.lines()
    assert len(rows) == 3 + 2 + 1        # winners (3 + 2 rows) and the losing attempt (1)
    assert all("_writetime_us" not in r and r["_segment"].endswith(".seg") for r in rows)
    assert [r["_row"] for r in rows] == list(range(6))


def test_dump_missing_and_discarded_batches(capsys, every, tmp_path):
    result = cli(capsys, "dump", every.wal, "--batch", 99)
    assert_one_line_error(result, 1, "batch 99 is not in")
    assert "hint: run 'cassandra-wal inspect" in result.err
    with WalFactory(tmp_path / "wal") as f:
        f.discarded(0, reason="Spark re-ran it")
        f.discarded(1, sealed=True, reason="never committed", keep_files=True)
        f.discarded(2, reason="never committed", keep_files=True)
    result = cli(capsys, "dump", tmp_path / "wal", "--batch", 0)
    assert_one_line_error(result, 1, "batch 0 was discarded (Spark re-ran it)")
    result = cli(capsys, "dump", tmp_path / "wal", "--batch", 1)
    assert result.code == 0 and len(result.lines()) == 5
    assert "batch 1 was discarded (never committed); this seal is from a later run" in result.err
    result = cli(capsys, "dump", tmp_path / "wal", "--batch", 2)
    assert result.code == 0 and len(result.lines()) == 5
    assert "batch 2 was discarded (never committed) and has no seal" in result.err
    doc = cli(capsys, "verify", tmp_path / "wal", "--json").json()
    assert doc["ok"] and {(p["batch"], p["detail"]) for p in doc["problems"]} == {
        (2, "segment of a discarded batch (garbage)")}


def test_batches_removed_by_retention(capsys, tmp_path):
    from wal.retention import RetentionPolicy, apply_retention
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        for batch in range(3):
            f.flushed(batch)
        apply_retention(f.wal, f.wal_log, RetentionPolicy(keep_batches=0))
    wal = tmp_path / "wal"
    assert os.path.exists(os.path.join(wal, "seals", fmt.batch_name(2) + fmt.SEAL_SUFFIX))
    views = {b["batch"]: b for b in cli(capsys, "inspect", wal, "--json").json()["batches"]}
    assert views[2]["state"] == "flushed" and views[2]["progress"] == "5/5 (100%)"
    assert_one_line_error(cli(capsys, "dump", wal, "--batch", 2), 1, "retention removed")
    assert_one_line_error(cli(capsys, "dump", wal, "--batch", 0), 1, "batch 0 is not in")
    doc = cli(capsys, "verify", wal, "--json").json()
    assert doc["ok"] and doc["warnings"] == 0


def test_dump_json_schema(capsys, every):
    result = cli(capsys, "dump", every.wal, "--batch", TYPED, "--json-schema")
    assert result.code == 0, result.err
    schema = result.json()
    assert schema["$schema"].endswith("2020-12/schema")
    props = schema["properties"]
    assert list(props)[-3:] == ["_partition", "_row", "_writetime_us"]
    assert props["ts"]["format"] == "date-time" and props["ts"]["type"] == ["string", "null"]
    assert props["dec"]["x-arrow-type"] == "decimal128(20, 4)"
    assert props["bin"]["type"] == ["object", "null"] and props["bin"]["required"] == ["$base64"]
    assert props["attrs"]["type"] == ["object", "null"]
    assert props["by_id"]["type"] == ["array", "null"]
    assert props["d"]["anyOf"][1] == {"type": "null"}           # number or "NaN"..., or null
    unsealed = cli(capsys, "dump", every.wal, "--batch", every.ids["staged"], "--json-schema")
    assert "_segment" in unsealed.json()["properties"]


def test_dump_damaged_segment_is_corruption(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    seg = segments_of(wal, TYPED)[1]
    flip_byte(seg, os.path.getsize(seg) // 2)
    result = cli(capsys, "dump", wal, "--batch", TYPED)
    assert_one_line_error(result, 3, f"batch {TYPED}", os.path.basename(seg))
    os.unlink(seg)
    os.mkdir(seg)                        # unreadable: a folder where the file should be
    result = cli(capsys, "dump", wal, "--batch", TYPED)
    assert result.code == 3 and "Traceback" not in result.err


# -- verify -------------------------------------------------------------------------------
def test_verify_every_state_is_clean(capsys, every):
    result = cli(capsys, "verify", every.wal)
    assert result.code == 0, result.out
    assert "result   OK: no corruption found" in result.out
    doc = cli(capsys, "verify", every.wal, "--json").json()
    assert doc["ok"] is True and doc["errors"] == 0
    problems = doc["problems"]
    assert {p["severity"] for p in problems} == {"info"}
    garbage = [p for p in problems if p["detail"].startswith("unsealed (garbage)")]
    assert len(garbage) == 1 and garbage[0]["batch"] == GARBAGE
    assert "-000-" in garbage[0]["segment"]        # the losing attempt 0 (attempt 1 won)
    leftovers = [p for p in problems if "leftover .tmp" in p["detail"]]
    assert len(leftovers) == 1 and leftovers[0]["batch"] == every.ids["staged"]
    assert doc["checked"]["log"] is True and doc["checked"]["log_chunks"] > 0
    assert doc["checked"]["segments"] == 19      # batches 0 and 1 hold no files any more


def test_verify_flipped_byte_in_segment(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    seg = segments_of(wal, every.ids["sealed_committed"])[0]
    flip_byte(seg, 120)                  # inside the first chunk's payload
    result = cli(capsys, "verify", wal)
    assert result.code == 3
    name = f"{fmt.batch_name(every.ids['sealed_committed'])}/{os.path.basename(seg)}"
    error = next(line for line in result.out.splitlines() if line.startswith("error"))
    assert f" {every.ids['sealed_committed']} " in error and name in error
    assert "checksum mismatch" in error
    assert "CORRUPTED: 1 error" in result.out


def test_verify_flipped_byte_in_ingested_segment_and_footer(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    seg = segments_of(wal, every.ids["ingested"])[0]
    flip_byte(seg, os.path.getsize(seg) - 2)        # the whole-file CRC in the footer
    doc = cli(capsys, "verify", wal, "--json").json()
    errors = [p for p in doc["problems"] if p["severity"] == "error"]
    assert doc["ok"] is False and len(errors) == 1
    assert errors[0]["batch"] == every.ids["ingested"]
    assert errors[0]["segment"].endswith(os.path.basename(seg))


def test_verify_truncated_segment(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    seg = segments_of(wal, TYPED)[0]
    with open(seg, "r+b") as f:
        f.truncate(os.path.getsize(seg) - 10)
    doc = cli(capsys, "verify", wal, "--json").json()
    errors = [p for p in doc["problems"] if p["severity"] == "error"]
    assert len(errors) == 1 and errors[0]["batch"] == TYPED
    assert errors[0]["segment"].endswith(os.path.basename(seg))
    assert cli(capsys, "verify", wal).code == 3


def test_verify_missing_segment(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    seg = segments_of(wal, every.ids["sealed_committed"])[1]
    os.unlink(seg)
    doc = cli(capsys, "verify", wal, "--json").json()
    errors = [p for p in doc["problems"] if p["severity"] == "error"]
    assert [(e["batch"], e["detail"]) for e in errors] == [
        (every.ids["sealed_committed"], "segment named by the seal is missing")]
    # A segment of an ingested batch: the log holds its rows, so it is only a warning.
    os.unlink(segments_of(wal, every.ids["ingested"])[0])
    doc = cli(capsys, "verify", wal, "--json").json()
    warnings = [p for p in doc["problems"] if p["severity"] == "warning"]
    assert [w["batch"] for w in warnings] == [every.ids["ingested"]]


def test_verify_beside_a_sink_that_flushes_and_removes_batches_while_it_reads(
        capsys, tmp_path, monkeypatch):
    """What a running sink does while verify reads (flush a batch and remove its files,
    discard an uncommitted one) is no corruption. Verify reported a segment that vanished
    between listing and reading as an error (exit 3) beside the writer of
    test_inspect_beside_a_running_writer, one run in five; a monitoring check would page."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0)
        f.ingested(1)                   # held by the log when verify reads it
        f.sealed(2)                     # committed, not yet ingested when verify reads the log
        f.sealed(3, committed=False)    # discarded meanwhile
        f.sealed(4)                     # flushed after verify lists its files
        f.sealed(5)                     # pending throughout
        wal = f.wal

        def flush_1_2_discard_3():
            f.flush(1)
            f.flush(2)
            f.wal_log.discard(3, "never committed by Spark")
            remove_batch_files(wal, 3)

        races = {wal.segments: flush_1_2_discard_3,     # after the log was read
                 wal.batch_segments(4): lambda: f.flush(4)}
        listdir = verify_cmd._listdir

        def racing_listdir(path):
            names = listdir(path)
            race = races.pop(path, None)
            if race is not None:
                race()
            return names

        monkeypatch.setattr(verify_cmd, "_listdir", racing_listdir)
        result = cli(capsys, "verify", wal.root, "--json")
        assert not races, "a race did not run"
        doc = result.json()
        assert result.code == 0 and doc["errors"] == 0 and doc["warnings"] == 0, result.out
        removed = {p["batch"] for p in doc["problems"] if "while verify read" in p["detail"]}
        assert removed == {1, 2, 3, 4}
        # Nothing excuses a segment the sink did not remove: batch 5 is still pending.
        monkeypatch.setattr(verify_cmd, "_listdir", listdir)
        os.unlink(wal.segment_path(f.built[5].segments[0].name))
        doc = cli(capsys, "verify", wal.root, "--json").json()
        assert [(p["batch"], p["detail"]) for p in doc["problems"] if p["severity"] == "error"] \
            == [(5, "segment named by the seal is missing")]


def _live_wal(root: Path) -> WalFactory:
    """A WAL as a running sink has it, with the sink's next steps still to come."""
    f = WalFactory(root / "wal", checkpoint=root / "cp", deterministic=False)
    f.flushed(0)
    f.flushed(1)
    f.ingested(2)
    f.sealed(3)
    f.sealed(4, committed=False)
    f.sealed(5)
    return f


#: The running sink's steps after ``_live_wal``, in its order: flush 2 and 3, discard the
#: batch Spark never committed, Spark's re-run of it sealed and committed, flushes, retention.
SINK_STEPS = (
    ("flush 2", lambda f: f.flush(2)),
    ("flush 3", lambda f: f.flush(3)),
    ("discard 4", lambda f: (f.wal_log.discard(4, "never committed by Spark"),
                             remove_batch_files(f.wal, 4))),
    ("re-run of 4 sealed", lambda f: f.sealed(4)),
    ("flush 4", lambda f: f.flush(4)),
    ("flush 5", lambda f: f.flush(5)),
    ("retention", lambda f: apply_retention(f.wal, f.wal_log, RetentionPolicy(keep_batches=1))),
)


def test_verify_finds_no_corruption_whichever_sink_step_lands_between_two_of_its_reads(
        capsys, tmp_path, monkeypatch):
    """Every step of a running sink, played between any two of verify's reads (each listing,
    seal read, and segment file it opens), with the steps before it done first: never an
    error or a warning. The exploration that finds the class of the race above."""
    points = [0]
    step_at: list = [None]

    def hooked(fn):
        def call(*args, **kwargs):
            points[0] += 1
            if step_at[0] is not None and points[0] == step_at[0][0]:
                step_at[0][1]()
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(verify_cmd, "_listdir", hooked(verify_cmd._listdir))
    monkeypatch.setattr(verify_cmd, "read_seal", hooked(verify_cmd.read_seal))
    monkeypatch.setattr(verify_cmd.WalLog, "open_reader", hooked(verify_cmd.WalLog.open_reader))
    monkeypatch.setattr(verify_cmd.Verifier, "check_segment",
                        hooked(verify_cmd.Verifier.check_segment))
    cases = 0
    for i, (name, step) in enumerate(SINK_STEPS):
        points[0], step_at[0] = 0, None
        with _live_wal(tmp_path / f"count-{i}") as f:
            for _, before in SINK_STEPS[:i]:
                before(f)
            assert cli(capsys, "verify", f.root).code == 0
        reads = points[0]
        for k in range(1, reads + 2):
            root = tmp_path / f"{i}-{k}"
            with _live_wal(root) as f:
                for _, before in SINK_STEPS[:i]:
                    before(f)
                points[0], step_at[0] = 0, (k, lambda: step(f))
                result = cli(capsys, "verify", f.root, "--json")
            doc = result.json()
            bad = [p for p in doc["problems"] if p["severity"] != "info"]
            assert result.code == 0 and not bad, (name, k, reads, bad)
            cases += 1
            shutil.rmtree(root)
    assert cases > 100, cases


def test_dump_of_a_batch_the_sink_flushes_meanwhile_says_run_again(capsys, tmp_path,
                                                                  monkeypatch):
    """dump reading a sealed batch's segments while the running sink flushes it and removes
    them: exit 1 saying to run again (the log now holds the rows), not corruption (exit 3)."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3, 2))
        choose = dump_cmd.choose_source

        def racing_choose(wal, wal_log, batch):
            source = choose(wal, wal_log, batch)
            f.flush(batch)
            return source

        monkeypatch.setattr(dump_cmd, "choose_source", racing_choose)
        result = cli(capsys, "dump", f.root, "--batch", 0)
        assert_one_line_error(result, 1, "batch 0 was flushed or removed by the running sink")
        assert "hint: run the same dump again" in result.err
        monkeypatch.setattr(dump_cmd, "choose_source", choose)
        again = cli(capsys, "dump", f.root, "--batch", 0)
        assert again.code == 0 and len(again.lines()) == 5


def test_verify_damaged_seal(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    batch = every.ids["sealed_uncommitted"]
    seal = os.path.join(wal, "seals", fmt.batch_name(batch) + fmt.SEAL_SUFFIX)
    flip_byte(seal, 30)
    result = cli(capsys, "verify", wal)
    assert result.code == 3
    error = next(line for line in result.out.splitlines() if line.startswith("error"))
    assert f" {batch} " in error and "seal checksum mismatch" in error
    assert os.path.basename(seal) in error
    # inspect still works and says which batch cannot proceed
    views = {b["batch"]: b for b in cli(capsys, "inspect", wal, "--json").json()["batches"]}
    assert views[batch]["action"] == "error" and "checksum" in views[batch]["detail"]


def test_verify_damaged_log_rows(capsys, every, tmp_path):
    """A row chunk in the log whose bytes no longer match its CRC (written through RocksDB,
    into a copy, so RocksDB's own checksums stay valid and ours must catch it)."""
    wal = every.copy(tmp_path / "copy")
    batch = every.ids["flushing"]
    db = Rdict(os.path.join(wal, "log"), Options(raw_mode=True))
    try:
        key = fmt.rows_key(batch, 1, 3)
        value = bytearray(db[key])
        value[40] ^= 0xFF
        db[key] = bytes(value)
        del db[fmt.rows_key(every.ids["ingested"], 2, 0)]
    finally:
        db.close()
    doc = cli(capsys, "verify", wal, "--json").json()
    errors = {p["batch"]: p for p in doc["problems"] if p["severity"] == "error"}
    assert set(errors) == {batch, every.ids["ingested"]}
    assert "log chunk 1/3 checksum mismatch" in errors[batch]["detail"]
    assert errors[batch]["segment"] == fmt.batch_key(batch).decode()
    assert "log holds 0 rows" in errors[every.ids["ingested"]]["detail"]
    assert cli(capsys, "verify", wal).code == 3
    result = cli(capsys, "dump", wal, "--batch", batch)
    assert_one_line_error(result, 3, f"batch {batch}", "checksum mismatch")


def test_damaged_rocksdb_files(capsys, every, tmp_path):
    """Bytes flipped inside the log's SST files: RocksDB's checksums catch it; every command
    fails with one line and exit 3 instead of a traceback."""
    wal = every.copy(tmp_path / "copy")
    db = Rdict(os.path.join(wal, "log"), Options(raw_mode=True))
    db.flush()
    db.close()
    ssts = glob.glob(os.path.join(wal, "log", "*.sst"))
    assert ssts
    for sst in ssts:
        for offset in range(64, os.path.getsize(sst) // 2, 64):
            flip_byte(sst, offset)
    assert_one_line_error(cli(capsys, "inspect", wal), 3, "RocksDB log")
    assert_one_line_error(cli(capsys, "dump", wal, "--batch", TYPED_LOG), 3)
    result = cli(capsys, "verify", wal)
    assert result.code == 3 and "Traceback" not in result.err
    assert "cannot open the RocksDB log" in result.out or "RocksDB" in result.out


def test_verify_progress_on_stderr(capsys, every, monkeypatch):
    monkeypatch.setattr(verify_cmd, "PROGRESS_EVERY_S", 0)
    result = cli(capsys, "verify", every.wal)
    assert result.code == 0
    assert "cassandra-wal: verified " in result.err and " MB / " in result.err


# -- bad input and exit codes ------------------------------------------------------------
@pytest.mark.parametrize("command", [["inspect"], ["dump", "--batch", "0"], ["verify"]])
def test_newer_format_version(capsys, every, tmp_path, command):
    wal = every.copy(tmp_path / "copy")
    newer = fmt.FORMAT_CHANGES + 1
    Path(wal, "WAL_FORMAT").write_text(f'{{"format": "cassandra-wal", "version": {newer}}}\n')
    result = cli(capsys, command[0], wal, *command[1:])
    assert_one_line_error(result, 3, f"format version {newer} is not supported", "upgrade")


def test_newer_log_format_version(capsys, every, tmp_path):
    wal = every.copy(tmp_path / "copy")
    db = Rdict(os.path.join(wal, "log"), Options(raw_mode=True))
    newer = str(fmt.LOG_FORMAT_VERSION + 1)
    db[fmt.KEY_META_FORMAT] = newer.encode()
    db.close()
    assert_one_line_error(cli(capsys, "inspect", wal), 3, f"'{newer}' is not supported")
    assert_one_line_error(cli(capsys, "verify", wal), 3, f"'{newer}' is not supported")


@pytest.mark.parametrize("command", [["inspect"], ["dump", "--batch", "0"], ["verify"]])
def test_not_a_wal_and_missing_folder(capsys, tmp_path, command):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    result = cli(capsys, command[0], tmp_path / "plain", *command[1:])
    assert_one_line_error(result, 3, "is not a cassandra-wal directory", "no WAL_FORMAT")
    result = cli(capsys, command[0], tmp_path / "nowhere", *command[1:])
    assert_one_line_error(result, 3, "no such directory")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["inspect"], ["dump", "WAL"], ["dump", "WAL", "--batch", "-1"],
    ["dump", "WAL", "--batch", "x"], ["dump", "WAL", "--batch", "1", "--limit", "ten"],
    ["verify", "WAL", "--bogus"],
])
def test_bad_usage_exits_2_with_hint(capsys, argv):
    result = cli(capsys, *argv)
    assert result.code == 2
    assert "cassandra-wal: error: " in result.err and "hint: run 'cassandra-wal" in result.err
    assert result.err.startswith("usage: cassandra-wal")


@pytest.mark.parametrize("command", [[], ["inspect"], ["dump"], ["verify"]])
def test_help_has_examples(capsys, command):
    result = cli(capsys, *command, "--help")
    assert result.code == 0
    assert "Examples:\n  cassandra-wal " in result.out
    if not command:
        assert "exit codes:" in result.out and "3  corruption found" in result.out
    if command == ["dump"]:
        assert '{"$base64": ' in result.out        # the binary rendering is documented


@pytest.mark.parametrize("command", [[], ["inspect"], ["dump"], ["verify"], ["recover"],
                                     ["repair"]])
def test_help_is_plain_text(capsys, command):
    """What --help prints is for a terminal: no reST markup from the modules' docstrings
    (``recover --help`` once showed ``:class:`~recovery.replay.Replayer```)."""
    result = cli(capsys, *command, "--help")
    assert result.code == 0
    for markup in ("``", ":class:", ":func:", ":mod:", ":meth:", ":data:"):
        assert markup not in result.out, f"{markup!r} in {' '.join(['cassandra-wal', *command])} --help"
    if command == ["recover"]:
        assert "Replay what Spark committed" in result.out


def test_real_process_exit_codes(every, tmp_path):
    ok = cli_process("inspect", every.wal, "--json")
    assert ok.code == 0 and json.loads(ok.out)["totals"]["batches"] == 10
    usage = cli_process("dump", every.wal)
    assert usage.code == 2 and "--batch" in usage.err
    not_wal = cli_process("verify", tmp_path)
    assert_one_line_error(not_wal, 3, "is not a cassandra-wal directory")
    unknown = cli_process("dump", every.wal, "--batch", 12345)
    assert_one_line_error(unknown, 1, "batch 12345 is not in")
    head = subprocess.run(f'"{sys.executable}" -m recovery.cli.main dump "{every.wal}" --batch 2 '
                          f'| head -n 1', shell=True, capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=60)
    assert head.returncode == 0 and head.stdout.count("\n") == 1
    assert "Traceback" not in head.stderr and "Error" not in head.stderr


def test_relative_wal_path(capsys, every, monkeypatch):
    monkeypatch.chdir(every.root)
    assert cli(capsys, "inspect", "wal").code == 0
    assert cli(capsys, "verify", "wal").code == 0
    assert len(cli(capsys, "dump", "wal", "--batch", TYPED_LOG).lines()) == 7


# -- read-only --------------------------------------------------------------------------
def test_commands_never_change_the_wal(capsys, every):
    before = snapshot(str(every.root))
    runs = [["inspect", every.wal], ["inspect", every.wal, "--json"],
            ["verify", every.wal], ["verify", every.wal, "--json"],
            ["dump", every.wal, "--batch", TYPED], ["dump", every.wal, "--batch", TYPED_LOG],
            ["dump", every.wal, "--batch", every.ids["staged"]],
            ["dump", every.wal, "--batch", every.ids["flushing"], "--json-schema"]]
    for argv in runs:
        assert cli(capsys, *argv).code == 0, argv
    assert snapshot(str(every.root)) == before


# -- beside a live writer, and on a copy from a crashed machine --------------------------
WRITER = textwrap.dedent("""
    import os, sys, time
    import pyarrow as pa
    from wal import SegmentWriter, WalDir, WalLog
    from wal.retention import RetentionPolicy, apply_retention, remove_batch_files
    from wal.seal import seal_batch

    root, cp, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    wal = WalDir(root).create()
    os.makedirs(os.path.join(cp, "commits"), exist_ok=True)
    wal.write_target({"keyspace": "ks", "table": "t", "checkpoint_location": cp})
    wal_log = WalLog.open_writer(wal)
    deadline = time.monotonic() + 60
    batch = 0
    while not os.path.exists(stop) and time.monotonic() < deadline:
        refs = []
        for partition in range(2):
            with SegmentWriter(wal, batch, partition, 0) as writer:
                for c in range(3):
                    writer.append(pa.record_batch({"id": pa.array(range(c * 10, c * 10 + 10),
                                                                  pa.int64())}))
                refs.append(writer.finish())
        seal = seal_batch(wal, batch, refs)
        with open(os.path.join(cp, "commits", str(batch)), "w") as f:
            f.write("v1\\n")
        wal_log.ingest(seal)
        wal_log.begin_flush(batch)
        wal_log.record_progress(batch, 1, 0, 30)
        wal_log.mark_flushed(batch)
        wal.write_flushed_through(batch)                # as recovery.replay does
        remove_batch_files(wal, batch, keep_seal=True)
        apply_retention(wal, wal_log, RetentionPolicy(keep_batches=4))
        print(f"batch {batch}", flush=True)
        batch += 1
    wal_log.close()
    print("done", flush=True)
""")


def start_writer(tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    wal, stop = str(tmp_path / "wal"), tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(script), wal, str(tmp_path / "cp"), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=REPO)
    return proc, wal, stop


def wait_for_batches(proc: subprocess.Popen, n: int) -> None:
    for line in proc.stdout:
        if line.startswith("batch ") and int(line.split()[1]) >= n - 1:
            return
    pytest.fail(f"writer ended early: {proc.wait()} {proc.stderr.read()}")


def test_inspect_beside_a_running_writer(capsys, tmp_path):
    proc, wal, stop = start_writer(tmp_path)
    try:
        wait_for_batches(proc, 3)
        seen = []
        for _ in range(6):
            result = cli(capsys, "inspect", wal, "--json")
            assert result.code == 0, result.err
            doc = result.json()
            assert doc["totals"]["batches"] >= 1
            seen.append(doc["wal"]["flushed_through"])
            time.sleep(0.05)
        assert seen[-1] >= 2
        result = cli_process("inspect", wal, "--json")
        assert result.code == 0, result.err
        assert json.loads(result.out)["batches"]
        for _ in range(2):                  # races with retention are notes, not errors
            result = cli(capsys, "verify", wal, "--json")
            assert result.code == 0 and result.json()["errors"] == 0, result.out
        assert cli(capsys, "dump", wal, "--batch", 0, "--limit", 1).code in (0, 1)
        stop.write_text("stop")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "done" in out


def test_inspect_and_verify_a_copy_from_a_crashed_machine(capsys, tmp_path):
    proc, wal, _stop = start_writer(tmp_path)
    try:
        wait_for_batches(proc, 6)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    copy_root = tmp_path / "copy"
    shutil.copytree(tmp_path / "wal", copy_root / "wal", symlinks=True)
    shutil.copytree(tmp_path / "cp", copy_root / "cp")
    before = snapshot(str(copy_root))
    wal_copy = str(copy_root / "wal")
    inspected = cli(capsys, "inspect", wal_copy, "--json", "--checkpoint", copy_root / "cp")
    assert inspected.code == 0, inspected.err
    doc = inspected.json()
    assert doc["wal"]["flushed_through"] >= 5 and doc["batches"]
    verified = cli(capsys, "verify", wal_copy, "--json")
    assert verified.code == 0, verified.out
    assert verified.json()["errors"] == 0
    flushed = [b["batch"] for b in doc["batches"] if b["state"] == "flushed"]
    rows = cli(capsys, "dump", wal_copy, "--batch", flushed[-1]).lines()
    assert len(rows) == 60 and rows[-1]["_row"] == 59
    assert snapshot(str(copy_root)) == before
