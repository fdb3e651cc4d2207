"""A chain of real runs of ``tests/cluster/cluster_program.py`` on one checkpoint, and the
checks of what they wrote: shared by the cluster tests (``tests/cluster/``), which say what
each run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tests.helpers import processes
from tests.helpers.node import java_home_env
from wal.layout import WalDir
from wal.log import WalLog
from wal.seal import Seal, read_seal
from wal.segment import SegmentReader, decode_chunk

PROGRAM = Path(__file__).resolve().parents[1] / "cluster" / "cluster_program.py"
REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "CASSANDRA_WAL_CLUSTER_RUN"
ROWS_PER_FILE = 200
PAD = 4000          # bytes a row: a stalled task's first Arrow batches get through Spark's
                    # buffers to the sink's writer, so it is killed mid-staging. At 1,000
                    # an Arrow batch of 32 rows was about half of a 64 KiB buffer (the
                    # mapInArrow worker's output, the JVM's stream to the writer): now and
                    # then what the stalled task had yielded stayed in one, no segment of
                    # the slow attempt was begun, and test_speculative_execution saw none
                    # (twice in 45 runs of the suite). One batch now fills both buffers.
TABLE_DDL = ("CREATE TABLE {ks}.{table} (id int PRIMARY KEY, batch_tag int, payload text, "
             "amount bigint, part int, attempt int)")
COLUMNS = ("batch_tag", "payload", "amount", "part", "attempt")
RUN_DEADLINE_S = float(os.environ.get("CASSANDRA_WAL_CLUSTER_DEADLINE", "900"))



def log_step(msg: str) -> None:
    print(f"[cluster-test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def expected_row(row_id: int, batch: int) -> dict:
    return {"id": row_id, "batch_tag": batch,
            "payload": f"row {row_id} of batch {batch} " + "x" * (row_id % 23) + "p" * PAD,
            "amount": row_id * 1_000_003 - 7}


# -- processes ---------------------------------------------------------------------------------
# Bound to this module's token variable: see tests/helpers/processes.py.
processes_with_token = partial(processes.processes_with_token, TOKEN_ENV)
kill_run = partial(processes.kill_run, TOKEN_ENV, timeout_s=30.0)


def _java_home() -> dict:
    return {} if os.environ.get("JAVA_HOME") else java_home_env()


@dataclass
class Run:
    name: str
    log_path: Path
    returncode: int | None = None
    seconds: float = 0.0
    crashed: bool = False

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        keep = [ln for ln in self.text().splitlines() if not ln.lstrip().startswith("at ")]
        return "\n".join(keep[-lines:])


@dataclass
class Chain:
    """Both runs' facts, collected for the tests."""

    workdir: Path
    keyspace: str
    table: str
    checkpoint: str
    node: object = None
    cql: object = None
    expected: dict[int, dict] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    # after run A (before the log was deleted)
    seals_a: dict[int, Seal] = field(default_factory=dict)
    positions: dict[int, list[int]] = field(default_factory=dict)   # batch -> ids in order
    rows_a: dict[int, tuple] = field(default_factory=dict)
    # after run B
    seals_b: dict[int, Seal] = field(default_factory=dict)
    rows_b: dict[int, tuple] = field(default_factory=dict)

    @property
    def events_path(self) -> Path:
        return self.workdir / "events.jsonl"

    def events(self, ev: str | None = None) -> list[dict]:
        out = []
        with open(self.events_path) as f:
            for line in f:
                e = json.loads(line)
                if ev is None or e["ev"] == ev:
                    out.append(e)
        return out

    def wal(self) -> WalDir:
        return WalDir(os.path.join(self.checkpoint, "cassandra_wal"))

    def segments_seen(self, batch: int) -> list[str]:
        return [e["name"] for e in self.events("segment") if e["batch"] == batch]

    def segment_rows(self, batch: int) -> dict[str, int | None]:
        return {e["name"]: e.get("rows") for e in self.events("segment") if e["batch"] == batch}


# -- the chain of runs -------------------------------------------------------------------------
def _launch(chain: Chain, name: str, args: list[str], env_extra: dict) -> tuple[Run, subprocess.Popen, str]:
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSANDRA_WAL_CRASH")}
    env.update(_java_home())
    env.update(env_extra)
    env[TOKEN_ENV] = token
    env["PYTHONUNBUFFERED"] = "1"
    run = Run(name, chain.workdir / f"run-{len(chain.runs)}-{name}.log")
    chain.runs.append(run)
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    cmd = [str(venv) if venv.exists() else sys.executable, str(PROGRAM),
           "--keyspace", chain.keyspace, "--table", chain.table,
           "--checkpoint", chain.checkpoint, "--input", str(chain.workdir / "input"),
           "--pending", str(chain.workdir / "pending"), "--markers", str(chain.workdir / "markers"),
           "--events", str(chain.events_path), "--deadline-s", str(RUN_DEADLINE_S)] + args
    log_step(f"run {name}: {' '.join(args)}")
    with open(run.log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(REPO_ROOT), start_new_session=True)
    return run, proc, token


def read_rows(cql, chain: Chain) -> dict[int, tuple]:
    from cassandra.query import SimpleStatement

    wts = ", ".join(f"writetime({c})" for c in COLUMNS)
    stmt = SimpleStatement(f"SELECT id, {', '.join(COLUMNS)}, {wts} FROM "
                           f"{chain.keyspace}.{chain.table}", fetch_size=5000)
    return {r[0]: tuple(r[1:]) for r in cql.execute(stmt, timeout=60)}


def positions_from_log(wal: WalDir) -> dict[int, list[int]]:
    """Row ids per batch in flush order (the log's chunk keys are in flush order), of the
    batches whose rows the log holds (a scale-out writer's batches it does not:
    :func:`positions_from_segments` while their segments are there, else
    :func:`check_batches` checks each row within its segment's range)."""
    reader = WalLog.open_reader(wal)
    assert reader is not None, f"{wal.root} has no log"
    try:
        out = {}
        for record in reader.records():
            if not record.rows_in_log:
                continue
            ids = []
            for chunk in reader.chunks(record.batch):
                ids += decode_chunk(chunk.payload).column("id").to_pylist()
            if ids:
                out[record.batch] = ids
        return out
    finally:
        reader.close()


def positions_from_segments(wal: WalDir, seal: Seal) -> list[int]:
    ids = []
    for seg in seal.segments:      # in the seal's order: row i of the batch is written at base + i
        for chunk in SegmentReader(wal.segment_path(seg.name), seal.batch, seg.partition).chunks():
            ids += chunk.record_batch().column("id").to_pylist()
    return ids


def seals_of(wal: WalDir) -> dict[int, Seal]:
    return {b: read_seal(wal, b) for b in wal.sealed_batch_ids()}


def write_pending(chain: Chain, batches, rows_per_file: int = ROWS_PER_FILE) -> None:
    """``pending/in-NNNN.json`` for every batch: :func:`expected_row` lines, remembered in
    ``chain.expected``."""
    (chain.workdir / "pending").mkdir(exist_ok=True)
    for batch in batches:
        with open(chain.workdir / "pending" / f"in-{batch:04d}.json", "w") as f:
            for i in range(rows_per_file):
                row = expected_row(batch * 1000 + i, batch)
                chain.expected[row["id"]] = row
                f.write(json.dumps(row) + "\n")


def run_until_crash(chain: Chain, name: str, args: list[str], env_extra: dict,
                    once: Path) -> Run:
    """Launch, wait for the armed crash point's once-file, then SIGKILL every process of the
    run (the crash point took its own process group only). ``run.crashed``: it was reached."""
    run, proc, token = _launch(chain, name, args, env_extra)
    started = time.monotonic()
    try:
        while proc.poll() is None and not once.exists():
            assert time.monotonic() - started < RUN_DEADLINE_S + 60, f"run {name} hangs:\n{run.tail()}"
            time.sleep(0.02)
        run.crashed = once.exists()
    finally:
        kill_run(token, proc.pid)
    run.returncode = proc.wait(timeout=30)
    run.seconds = time.monotonic() - started
    log_step(f"run {name}: {run.seconds:.0f}s, crashed={run.crashed}, rc {run.returncode}")
    assert not processes_with_token(token)
    return run


def run_to_end(chain: Chain, name: str, args: list[str], env_extra: dict) -> Run:
    """Launch and wait for the program to exit; then make sure nothing of the run is left."""
    run, proc, token = _launch(chain, name, args, env_extra)
    started = time.monotonic()
    try:
        run.returncode = proc.wait(timeout=RUN_DEADLINE_S + 120)
    except subprocess.TimeoutExpired:
        run.returncode = None
    run.seconds = time.monotonic() - started
    until = time.monotonic() + 20       # a clean exit leaves workers winding down
    while processes_with_token(token) and time.monotonic() < until:
        time.sleep(0.2)
    kill_run(token, None)
    log_step(f"run {name}: {run.seconds:.0f}s, rc {run.returncode}")
    return run


def check_batches(chain: Chain, rows: dict[int, tuple], seals: dict[int, Seal],
                  batches) -> list[str]:
    """Every expected row of ``batches`` exactly once with its values; ``part``/``attempt``
    name the sealed (winning) segment of its partition; write time = base_ts_us + position
    (a batch whose order is not known, its rows never in the log and its segments gone: each
    row's write time within its segment's positions, and no two rows of the batch at one)."""
    problems = []
    for batch in batches:
        seal = seals.get(batch)
        if seal is None:
            problems.append(f"batch {batch}: no seal")
            continue
        want = {i for i, r in chain.expected.items() if r["batch_tag"] == batch}
        got = {i for i, r in rows.items() if r[0] == batch}
        if got != want:
            problems.append(f"batch {batch}: {len(want - got)} rows missing, "
                            f"{len(got - want)} unexpected")
        winners = {s.partition: s.attempt for s in seal.segments}
        if len(winners) != len(seal.segments):
            problems.append(f"batch {batch}: seal names two segments of one partition: "
                            f"{[s.name for s in seal.segments]}")
        if seal.rows != len(want):
            problems.append(f"batch {batch}: seal has {seal.rows} rows, expected {len(want)}")
        order = chain.positions.get(batch)
        position = {rid: i for i, rid in enumerate(order or [])}
        offsets = dict(zip((s.partition for s in seal.segments), seal.row_offsets()))
        sizes = {s.partition: s.rows for s in seal.segments}
        stamps: dict[int, int] = {}
        for rid in sorted(want & got):
            tag, payload, amount, part, attempt, *wts = rows[rid]
            exp = chain.expected[rid]
            if (payload, amount) != (exp["payload"], exp["amount"]):
                problems.append(f"row {rid}: wrong values")
            if winners.get(part) != attempt:
                problems.append(f"row {rid} (batch {batch}, partition {part}) was staged by "
                                f"attempt {attempt}; the seal's winner is {winners.get(part)}")
            if order is None and part in offsets:
                low = seal.base_ts_us + offsets[part]
                if len(set(wts)) != 1 or not low <= wts[0] < low + sizes[part]:
                    problems.append(f"row {rid}: write times {sorted(set(wts))}, expected one "
                                    f"in [{low}, {low + sizes[part]}) (its segment's)")
                elif wts[0] in stamps:
                    problems.append(f"rows {stamps[wts[0]]} and {rid} of batch {batch} share "
                                    f"write time {wts[0]}")
                stamps[wts[0]] = rid
            elif rid not in position:
                problems.append(f"row {rid}: no position known for batch {batch}")
            elif set(wts) != {seal.base_ts_us + position[rid]}:
                problems.append(f"row {rid}: write times {sorted(set(wts))}, expected "
                                f"base_ts_us {seal.base_ts_us} + position {position[rid]}")
    return problems[:30]


def assert_restart_completed(chain: Chain, crash_batch: int, last_batch: int) -> None:
    """After the restart: ``crash_batch`` kept its seal (same id, same timestamps), rows seen
    before the restart kept their cells, and batches 0..``last_batch`` are exactly the expected
    rows at their sealed write times."""
    before, after = chain.seals_a[crash_batch], chain.seals_b[crash_batch]
    assert (after.seal_id, after.base_ts_us) == (before.seal_id, before.base_ts_us)
    for rid, row in chain.rows_a.items():
        assert chain.rows_b[rid] == row, f"row {rid} changed: {row} -> {chain.rows_b[rid]}"
    # Seals of batches flushed before the crash may be gone (retention keeps the newest
    # flushed seal only, once a rebuilt log forgot them): use the ones read before as well.
    seals = {**chain.seals_a, **chain.seals_b}
    problems = check_batches(chain, chain.rows_b, seals, range(last_batch + 1))
    assert not problems, "\n".join(problems)
    assert set(chain.rows_b) == set(chain.expected)
