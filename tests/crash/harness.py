"""Run the crash driver program, kill it, restart it, and check every promise of the sink.

One :class:`CrashHarness` per test: its own input files, table and checkpoint. A test calls
:meth:`CrashHarness.crash_at` (a named crash point) and/or :meth:`CrashHarness.kill_randomly`
(SIGKILL from outside at a seeded instant) any number of times, then
:meth:`CrashHarness.finish` (a clean run to the end) and :meth:`CrashHarness.check`.

What is checked (``check`` raises one AssertionError listing every problem found):

* **No early visibility** (invariant 1): a sampler thread reads the table, *then* lists
  ``<checkpoint>/commits``, over and over while the program runs. A row visible in the read
  whose input file's batch has no commits file in the listing that followed was visible
  before its batch was committed (commits files are only ever added, so the check is sound).
* **Values**: every visible row, at any sample and at the end, equals the row computed
  independently from the input files. At the end every expected id is there (nothing lost;
  the primary key makes "exactly once" a question of presence and values).
* **Identical replays** (invariant 7): the write time of each row (of every written column)
  at the end equals the first one the sampler saw: a replay rewrote the same cells, never new
  ones. Within a batch the write times are distinct, they are exactly
  ``seal.base_ts_us + 0 .. rows-1`` of the batch's final seal, and they strictly increase
  from batch to batch.
* **Nothing pending**: the WAL's catalog says "nothing" for every batch, ``blocked.json`` is
  absent and no staged segment is left behind. A WAL on a store is read through a private
  read-only copy (``recovery.cli.location.read_only_wal``), and the store itself must list no segment.
* **No survivors**: after every crash, no process of the killed run is left (the driver, its
  JVM, Spark's Python daemon and workers, the commit worker), found by an environment token
  every descendant inherits.

Which input file went into which batch is read from Spark's own checkpoint (``offsets/N`` and
the file source's log, see ``driver_program.files_by_batch``): batch N is file N in a first
run, but a batch re-planned after a crash may read two files.

**A change stream** (``changes=True``, the program's ``--changes``): each file also updates and
deletes rows of the file before and of its own, in source order (``lsn``, which the program
gives ``writetime``), with the completeness marker on (:func:`change_lines`). Then the values
are checked against the source applied in order, each row's write time against the ``lsn`` of
its last upsert, the sampler's rows against the versions of committed files (a version of an
uncommitted file seen is early visibility), and the marker against the WAL.

**Stores** (``storage.py``): the checkpoint, and so the WAL, may be on HDFS or S3; every read
of them above goes through the store. With ``lose_working_copy`` each run after a crash starts
"on another host": the driver's working copy of the WAL (under the ``CASSANDRA_WAL_WORKING_DIR``
the harness gives the program) and the tasks' spool are deleted first. Retention then forgets
the seals of batches flushed before the loss (the rebuilt log never knew them; FORMAT.md, "On
a store"), so the write-time check uses, for those, the seal the store held when the copy was
lost.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from unittest import mock

import pytest

from recovery.cli.location import read_only_wal
from tests.helpers import processes
from tests.helpers.node import java_home_env
from wal import catalog, stores
from wal.catalog import RecoveryAction
from wal import checkpoint as ckpt
from wal.crashpoints import ENV_ONCE, ENV_POINT, ENV_SCOPE
from wal.errors import NotAWal, StoreUnavailable
from wal.format import BLOCKED_FILE, SEGMENTS_DIR
from wal.layout import WalDir
from wal.pointer import read_pointer
from wal.remote import ENV_WORKING_DIR, spool_dir, working_copy_of
from wal.schemes import is_remote
from wal.seal import Seal, read_seal

from .driver_program import MARKER_TABLE, committed_files, files_by_batch
from .storage import LOCAL_STORAGE, STORE_ENV, Storage

DRIVER = Path(__file__).resolve().with_name("driver_program.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "CASSANDRA_WAL_CRASH_RUN"          # marks every process of one driver run
TABLE_DDL = ("CREATE TABLE {ks}.{table} (id int PRIMARY KEY, batch_tag int, payload text, "
             "amount bigint)")
WRITTEN_COLUMNS = ("batch_tag", "payload", "amount")


def _log(msg: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- processes ---------------------------------------------------------------------------------
# Bound to this harness's token variable: see tests/helpers/processes.py.
processes_with_token = partial(processes.processes_with_token, TOKEN_ENV)
kill_run = partial(processes.kill_run, TOKEN_ENV)


_java_home = java_home_env


# -- expected data -----------------------------------------------------------------------------
def file_name(tag: int) -> str:
    return f"part-{tag:05d}.json"


def file_tag(name: str) -> int:
    return int(name[len("part-"):-len(".json")])


FIRST_ID = 100_000


def expected_row(row_id: int, tag: int) -> dict:
    """Row ``row_id`` of input file ``tag``. Every JSON line has the same length (for ids of
    6 digits and fewer than 10 files), so each file splits into 101 + 99 rows, i.e. 4 + 4
    chunks of at most 32 rows: every batch is 8 chunks and ``flush.mid@n`` is exact."""
    return {"id": row_id, "batch_tag": tag,
            "payload": f"row {row_id:06d} of file {tag:03d} "
                       + "abcdefghijklmnopqrstuvw"[row_id % 23] * 16,
            "amount": 10**12 + row_id * 1_000_003}


#: A change stream's file: creates, then changes of the file before and of its own.
CHANGE_FILE_ROWS = 200


def change_lines(tag: int) -> list[dict]:
    """Input file ``tag`` of a change stream, in source order (``lsn``): 150 new rows; 15
    updates and 10 deletes of the previous file's rows; 10 deletes of its own new rows, 5 of
    its own rows updated twice, and 5 rows the previous file deleted created again (file 0:
    of its own rows throughout). Every line has the same length, as :func:`expected_row`'s,
    so a file splits into the same tasks and chunks."""
    def own(file_tag: int, i: int) -> int:
        return FIRST_ID + file_tag * CHANGE_FILE_ROWS + i

    prev = max(tag - 1, 0)
    plan = ([("c", own(tag, i)) for i in range(150)]
            + [("u", own(prev, 3 * i)) for i in range(15)]
            + [("d", own(prev, 3 * i + 1)) for i in range(10)]
            + [("d", own(tag, 100 + i)) for i in range(10)]
            + [("u", own(tag, 120 + i // 2)) for i in range(10)]
            + [("c", own(prev, 100 + i)) for i in range(5)])
    return [{"id": row_id, "batch_tag": tag,
             "payload": f"row {row_id:06d} of file {tag:03d} line {index:03d} "
                        + "abcdefghijklmnopqrstuvw"[(row_id + index) % 23] * 8,
             "amount": 10**12 + row_id * 1_000_003 + index, "op": op,
             "lsn": 10**12 + tag * 1_000 + index}
            for index, (op, row_id) in enumerate(plan)]


@dataclass
class Phase:
    """One run of the driver program."""

    name: str
    env: dict
    log_path: Path
    returncode: int | None = None
    fired: bool = False            # the crash point / the external kill happened
    killed_extra: list = field(default_factory=list)
    seconds: float = 0.0
    lost_working_copy: bool = False   # started "on another host": the working copy deleted

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])


class Sampler(threading.Thread):
    """Reads the table, then lists commits/, until stopped; records every violation seen."""

    def __init__(self, harness: "CrashHarness", interval_s: float = 0.1):
        super().__init__(name="crash-sampler", daemon=True)
        self.h, self.interval_s = harness, interval_s
        self.stop_event = threading.Event()
        self.first_seen: dict[int, tuple] = {}    # id -> (writetimes, batch_tag, sample no.)
        self.violations: list[str] = []
        self.violation_count = 0
        self.samples = 0
        self.nonempty_samples = 0
        self.errors: list[str] = []
        self._cache: dict = {}
        from cassandra.query import SimpleStatement

        cols = ", ".join(f"writetime({c})" for c in WRITTEN_COLUMNS[1:])
        self.statement = SimpleStatement(
            f"SELECT id, batch_tag, payload, amount, {cols} FROM {harness.keyspace}.{harness.table}",
            fetch_size=10_000)

    def _violation(self, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 30:
            self.violations.append(text)

    def sample_once(self) -> None:
        rows = list(self.h.cql.execute(self.statement, timeout=30))
        # After the read, so sound: commits/ only grows, and a row's file is in a committed
        # batch now if it was when the row was read.
        committed = {file_tag(n) for n in committed_files(self.h.checkpoint, self._cache)}
        self.samples += 1
        if rows:
            self.nonempty_samples += 1
        for r in rows:
            row_id, tag, payload, amount, *wts = r
            wts = tuple(wts)
            if self.h.changes:
                self._check_version(row_id, tag, payload, amount, committed)
                continue
            want = self.h.expected.get(row_id)
            if want is None or (tag, payload, amount) != (want["batch_tag"], want["payload"],
                                                          want["amount"]):
                self._violation(f"sample {self.samples}: row {row_id} = {(tag, payload, amount)}, "
                                f"expected {want}")
                continue
            if tag not in committed:
                self._violation(f"sample {self.samples}: row {row_id} of input file {tag} "
                                f"visible while only the batches of files {sorted(committed)} "
                                f"are committed")
            if len(set(wts)) != 1:
                self._violation(f"sample {self.samples}: row {row_id} columns have different "
                                f"write times {wts}")
            first = self.first_seen.setdefault(row_id, (wts, tag, self.samples))
            if first[0] != wts:
                self._violation(f"sample {self.samples}: row {row_id} (batch {tag}) write time "
                                f"changed from {first[0]} (sample {first[2]}) to {wts}")

    def _check_version(self, row_id: int, tag: int, payload: str, amount: int,
                       committed: set[int]) -> None:
        """A change stream's row: some upsert of it in the source, from a committed file."""
        if (tag, payload, amount) not in self.h.versions.get(row_id, ()):
            self._violation(f"sample {self.samples}: row {row_id} = {(tag, payload, amount)}, "
                            f"no upsert of the source")
        elif tag not in committed:
            self._violation(f"sample {self.samples}: row {row_id} as input file {tag} wrote it "
                            f"visible while only the batches of files {sorted(committed)} are "
                            f"committed")

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - a slow read is no violation; counted
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=60)


class CrashHarness:
    def __init__(self, cql, host: str, port: int, keyspace: str, workdir: Path,
                 files: int = 8, rows_per_file: int = 200, table: str = "events",
                 run_deadline_s: float = 600.0, flush_mode: str = "driver",
                 storage: Storage = LOCAL_STORAGE, changes: bool = False,
                 change_order: str = "lsn"):
        self.cql, self.host, self.port = cql, host, port
        self.keyspace, self.table = keyspace, table
        self.workdir = Path(workdir)
        self.input = self.workdir / "input"
        self.storage = storage
        self.checkpoint = storage.checkpoint_for(self.workdir)
        # On a store: where the program keeps its working copies (set in its environment).
        self.working_dir = self.workdir / "working" if storage.remote else None
        self.lose_working_copy = False        # see restart_on_another_host
        # batch -> its seal when a working copy was lost (committed batches only).
        self.seals_at_loss: dict[int, Seal] = {}
        self.files, self.rows_per_file = files, rows_per_file
        self.run_deadline_s = run_deadline_s
        self.flush_mode = flush_mode
        self.expected: dict[int, dict] = {}
        self.changes = changes
        self.change_order = change_order          # the program's --change-order
        self.versions: dict[int, set[tuple]] = {}     # a change stream's upserts of each id
        self.last_lsn: dict[int, int] = {}            # ... the lsn of each id's last one
        self.phases: list[Phase] = []
        self.sampler: Sampler | None = None
        self.started = time.monotonic()

    # -- set-up ------------------------------------------------------------------------------
    def prepare(self) -> "CrashHarness":
        self.input.mkdir(parents=True)
        now = time.time() - 3600
        for batch in range(self.files):
            path = self.input / file_name(batch)
            with open(path, "w") as f:
                for row in self._file_rows(batch):
                    f.write(json.dumps(row) + "\n")
            os.utime(path, (now + 10 * batch, now + 10 * batch))   # read in this order
        self.cql.execute(TABLE_DDL.format(ks=self.keyspace, table=self.table))
        self.sampler = Sampler(self)
        self.sampler.start()
        return self

    def _file_rows(self, batch: int) -> list[dict]:
        """Input file ``batch``'s lines, as :attr:`expected` (the table at the end) learns
        them."""
        if not self.changes:
            rows = [expected_row(FIRST_ID + batch * self.rows_per_file + i, batch)
                    for i in range(self.rows_per_file)]
            self.expected.update((row["id"], row) for row in rows)
            return rows
        rows = change_lines(batch)
        for row in rows:
            if row["op"] == "d":
                self.expected.pop(row["id"], None)
                continue
            self.expected[row["id"]] = {k: row[k] for k in ("id", "batch_tag", "payload",
                                                            "amount")}
            self.versions.setdefault(row["id"], set()).add(
                (row["batch_tag"], row["payload"], row["amount"]))
            self.last_lsn[row["id"]] = row["lsn"]
        return rows

    def close(self) -> None:
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
        if self.storage.remote:         # the tasks' spool is in the shared temp folder
            try:
                uri = self.wal_uri()
            except StoreUnavailable:
                uri = None
            if uri is not None:
                shutil.rmtree(spool_dir(uri), ignore_errors=True)

    def __enter__(self) -> "CrashHarness":
        return self.prepare()

    def __exit__(self, *exc) -> None:
        self.close()

    def restart_on_another_host(self) -> None:
        """From now on, every run after a crash starts without the driver's working copy (and
        the tasks' spool), as on another host: only the store is left."""
        if not self.storage.remote:
            raise ValueError("a lost working copy means something only for a WAL on a store")
        self.lose_working_copy = True

    # -- runs --------------------------------------------------------------------------------
    def _python(self) -> str:
        venv = REPO_ROOT / ".venv" / "bin" / "python"
        return str(venv) if venv.exists() else sys.executable

    def _launch(self, name: str, crash_env: dict) -> tuple[Phase, subprocess.Popen, str]:
        token = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items()
               if k not in (ENV_POINT, ENV_SCOPE, ENV_ONCE, TOKEN_ENV)}
        env.update(crash_env)
        env[TOKEN_ENV] = token
        env["PYTHONUNBUFFERED"] = "1"
        if not env.get("JAVA_HOME"):
            env.update(_java_home())
        if self.storage.remote:
            for var in STORE_ENV:           # the store only as the session's conf says
                env.pop(var, None)
            env[ENV_WORKING_DIR] = str(self.working_dir)
        lost = False
        if self.lose_working_copy and self.phases and self.phases[-1].name != "finish":
            lost = self._lose_working_copy()
        if self.phases:
            self._remove_sparks_torn_first_offset()
        index = len(self.phases)
        phase = Phase(name, dict(crash_env), self.workdir / f"run-{index}-{name.replace('@', '_')}.log",
                      lost_working_copy=lost)
        self.phases.append(phase)
        cmd = [self._python(), str(DRIVER), "--keyspace", self.keyspace, "--table", self.table,
               "--checkpoint", self.checkpoint, "--input", str(self.input),
               "--host", self.host, "--port", str(self.port),
               "--deadline-s", str(self.run_deadline_s), "--flush-mode", self.flush_mode]
        if self.changes:
            cmd += ["--changes", "--change-order", self.change_order]
        for key, value in self.storage.spark_conf.items():
            cmd += ["--conf", f"{key}={value}"]
        _log(f"run {index}: {name}" + (" (on another host: working copy lost)" if lost else ""))
        with open(phase.log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=str(REPO_ROOT),
                                    start_new_session=True)
        return phase, proc, token

    def _reap(self, phase: Phase, proc: subprocess.Popen, token: str, started: float) -> None:
        """The machine is down: kill the whole run, reap the driver, prove nothing survives."""
        phase.killed_extra = kill_run(token, proc.pid)
        phase.returncode = proc.wait(timeout=30)
        phase.seconds = time.monotonic() - started
        left = processes_with_token(token)
        assert not left, f"{phase.name}: processes survived the crash: {left}"
        _log(f"run {phase.name}: down after {phase.seconds:.1f}s (rc {phase.returncode}, "
             f"also killed {len(phase.killed_extra)} processes)")

    def crash_at(self, point: str) -> Phase:
        """Run until the named crash point fires (``point`` or ``point@n``), then make sure the
        whole run is dead. Fails if the program ends without reaching the point."""
        once = self.workdir / f"once-{len(self.phases)}"
        phase, proc, token = self._launch(point, {ENV_POINT: point, ENV_SCOPE: "group",
                                                  ENV_ONCE: str(once)})
        started = time.monotonic()
        deadline = started + self.run_deadline_s + 30
        while True:
            if once.exists():          # fired: whatever the point's group missed dies now
                phase.fired = True
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self._reap(phase, proc, token, started)
        phase.fired = phase.fired or once.exists()
        assert phase.fired, (f"crash point {point} was never reached (driver exit code "
                             f"{phase.returncode}):\n{phase.tail()}")
        return phase

    def kill_randomly(self, rng: random.Random, seed_note: str = "") -> Phase:
        """SIGKILL the run's process group from outside at a random instant: after the k-th
        batch this run commits plus up to one second (k drawn so that at least two batches
        are left), or, for k = 0, up to 8 s after Spark is up (recovery at query start, the
        first batch's staging and commit)."""
        base = len(ckpt.committed_batches(self.checkpoint))
        remaining = self.files - len(committed_files(self.checkpoint))
        k = rng.randrange(0, max(1, remaining - 2))
        delay = rng.uniform(0.0, 8.0 if k == 0 else 1.0)
        name = f"kill-after-commit{k}+{delay:.2f}s" if k else f"kill-after-spark-up+{delay:.2f}s"
        phase, proc, token = self._launch(name, {})
        started = time.monotonic()
        deadline = started + self.run_deadline_s + 30
        anchor_at = None
        while proc.poll() is None and time.monotonic() < deadline:
            if anchor_at is None:
                if k == 0:
                    reached = "spark up" in phase.log_path.read_text(errors="replace")
                else:
                    reached = len(ckpt.committed_batches(self.checkpoint)) >= base + k
                if reached:
                    anchor_at = time.monotonic()
            elif time.monotonic() >= anchor_at + delay:
                phase.fired = True
                break
            time.sleep(0.01)
        self._reap(phase, proc, token, started)
        assert phase.fired, (f"{seed_note}: the run ended (exit code {phase.returncode}) before "
                             f"the kill instant {name}:\n{phase.tail()}")
        return phase

    def finish(self, crash_env: dict | None = None) -> Phase:
        """A run on the same checkpoint, to the end: a clean one, or one whose ``crash_env``
        kills a process the run survives (a flush worker, not the driver)."""
        phase, proc, token = self._launch("finish", crash_env or {})
        started = time.monotonic()
        try:
            phase.returncode = proc.wait(timeout=self.run_deadline_s + 60)
        except subprocess.TimeoutExpired:
            phase.returncode = None
        phase.seconds = time.monotonic() - started
        # A clean exit leaves the JVM and workers to wind down on their own; give them time.
        until = time.monotonic() + 15
        while processes_with_token(token) and time.monotonic() < until:
            time.sleep(0.1)
        phase.killed_extra = kill_run(token, None)
        _log(f"run finish: rc {phase.returncode} after {phase.seconds:.1f}s")
        return phase

    # -- checks ------------------------------------------------------------------------------
    def final_rows(self) -> dict[int, tuple]:
        from cassandra.query import SimpleStatement

        cols = ", ".join(f"writetime({c})" for c in WRITTEN_COLUMNS[1:])
        stmt = SimpleStatement(f"SELECT id, batch_tag, payload, amount, {cols} "
                               f"FROM {self.keyspace}.{self.table}", fetch_size=10_000)
        return {r[0]: tuple(r[1:]) for r in self.cql.execute(stmt, timeout=60)}

    # -- the WAL ------------------------------------------------------------------------------
    def wal_uri(self) -> str | None:
        """Where the checkpoint's pointer says the WAL is (None: no batch prepared yet)."""
        return read_pointer(self.checkpoint)

    def working_copy(self) -> str:
        """The program's working copy of the WAL on the store, as the program computes it."""
        with mock.patch.dict(os.environ, {ENV_WORKING_DIR: str(self.working_dir)}):
            return working_copy_of(self.wal_uri())

    def wal_dir(self) -> WalDir | None:
        """The WAL to read: a local folder, or a private read-only copy of a store's (with
        the segments of batches not flushed yet)."""
        root = self.wal_uri()
        if root and is_remote(root):
            return read_only_wal(root, segments=True)
        return WalDir(root) if root else None

    def _remove_sparks_torn_first_offset(self) -> None:
        """What an operator does after Spark itself was killed while writing ``offsets/0``: a
        run killed between Spark's temp file and its rename leaves ``offsets/.0.<uuid>.tmp``,
        and Spark 4.1+ then refuses to start the query (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY,
        SPARK-53103's check sees the offsets folder not empty at batch 0), whatever its sink.
        Removed here, and logged, on a local checkpoint with no batch planned: the sink's
        guarantee is not at stake (nothing was planned, staged or sealed)."""
        if self.storage.remote:
            return
        folder = Path(self.checkpoint) / ckpt.OFFSETS
        if not folder.is_dir() or any(p.name.isdigit() for p in folder.iterdir()):
            return
        torn = [p for p in folder.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
        for path in torn:
            path.unlink()
        if torn:
            _log(f"Spark's torn first offset removed before the restart: {[p.name for p in torn]}")

    def _lose_working_copy(self) -> bool:
        """The next run starts on another host: delete the working copy and the tasks' spool
        (the killed run is down). Returns whether there was a working copy to lose. First the
        seals of the committed batches are kept for the write-time check (see the module's
        docstring)."""
        uri = self.wal_uri()
        if uri is None:                 # killed before the first batch was prepared
            return False
        committed = set(ckpt.committed_batches(self.checkpoint))
        try:
            wal = self.wal_dir()
        except NotAWal:                 # killed before the WAL was made on the store
            wal = None
        for batch in wal.sealed_batch_ids() if wal else ():
            seal = read_seal(wal, batch)
            if batch in committed and seal is not None:
                self.seals_at_loss[batch] = seal
        copy = self.working_copy()
        existed = os.path.isdir(copy)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(spool_dir(uri), ignore_errors=True)
        _log(f"working copy {copy} {'deleted' if existed else 'absent'}; seals kept of "
             f"batches {sorted(self.seals_at_loss)}")
        return existed

    def check(self, context: str = "") -> None:
        if self.sampler is not None:
            self.sampler.stop()
        problems: list[str] = []
        finish = self.phases[-1] if self.phases else None
        if finish is None or finish.name != "finish" or finish.returncode != 0:
            problems.append(f"the final clean run did not end well (exit code "
                            f"{finish.returncode if finish else None}):\n"
                            f"{finish.tail() if finish else ''}")
        batch_of, mapping_problems = self._check_batch_mapping()
        problems += mapping_problems
        problems += self._check_sampler()
        rows = self.final_rows()
        wal = self.wal_dir()
        problems += self._check_rows(rows)
        if self.changes:
            problems += self._check_change_writetimes(rows)
            problems += self._check_marker(wal)
        else:
            problems += self._check_writetimes(rows, batch_of, wal)
        problems += self._check_wal(wal)
        runs = ", ".join(f"{p.name} ({p.seconds:.0f}s, rc {p.returncode}"
                         f"{', working copy lost' if p.lost_working_copy else ''})"
                         for p in self.phases)
        _log(f"{context}: runs {runs}; sampler {self.sampler.samples if self.sampler else 0} "
             f"samples; total {time.monotonic() - self.started:.0f}s")
        assert not problems, (f"{context}: {len(problems)} problem(s) after runs [{runs}] "
                              f"(logs in {self.workdir}):\n- " + "\n- ".join(problems))

    def _check_batch_mapping(self) -> tuple[dict[int, int], list[str]]:
        """Input file tag -> Spark batch id, and what is wrong with Spark's record of it."""
        out = []
        by_batch = files_by_batch(self.checkpoint)
        committed = set(ckpt.committed_batches(self.checkpoint))
        batch_of: dict[int, int] = {}
        for batch, names in sorted(by_batch.items()):
            if batch not in committed:
                out.append(f"batch {batch} (files {names}) planned but never committed")
            if not names:
                out.append(f"harness: batch {batch} read no input file")
            for name in names:
                if file_tag(name) in batch_of:
                    out.append(f"file {name} read by batches {batch_of[file_tag(name)]} and "
                               f"{batch}")
                batch_of[file_tag(name)] = batch
        unread = sorted(set(range(self.files)) - set(batch_of))
        if unread:
            out.append(f"input files never read by a batch: {unread}")
        return batch_of, out

    def _check_sampler(self) -> list[str]:
        s = self.sampler
        if s is None:
            return ["harness: no sampler"]
        out = [f"early/incorrect visibility: {v}" for v in s.violations]
        if s.violation_count > len(s.violations):
            out.append(f"... {s.violation_count - len(s.violations)} more sampler violations")
        if s.nonempty_samples == 0:
            out.append(f"harness: the sampler never saw a row ({s.samples} samples, errors "
                       f"{s.errors}): visibility was not checked")
        return out

    def _check_rows(self, rows: dict[int, tuple]) -> list[str]:
        out = []
        missing = sorted(set(self.expected) - set(rows))
        extra = sorted(set(rows) - set(self.expected))
        if missing:
            by_batch: dict[int, int] = {}
            for i in missing:
                by_batch[self.expected[i]["batch_tag"]] = by_batch.get(
                    self.expected[i]["batch_tag"], 0) + 1
            out.append(f"lost rows: {len(missing)} missing, by batch {by_batch}")
        if extra:
            out.append(f"unexpected ids in the table: {extra[:20]}")
        wrong = [i for i, r in rows.items() if i in self.expected and r[:3] != (
            self.expected[i]["batch_tag"], self.expected[i]["payload"], self.expected[i]["amount"])]
        if wrong:
            out.append(f"rows with wrong values: {wrong[:20]}")
        return out

    def _check_writetimes(self, rows: dict[int, tuple], batch_of: dict[int, int],
                          wal: WalDir | None) -> list[str]:
        """Write times per Spark batch: the seal's ``base_ts_us + 0 .. rows-1``, increasing."""
        out = []
        changed = []
        per_batch: dict[int, list[int]] = {}
        for row_id, r in rows.items():
            wts = tuple(r[3:])
            if len(set(wts)) != 1:
                out.append(f"row {row_id}: columns have different write times {wts}")
            first = self.sampler.first_seen.get(row_id) if self.sampler else None
            if first is not None and first[0] != wts:
                changed.append((row_id, first[0][0], wts[0]))
            if r[0] in batch_of:       # else: reported by the mapping check
                per_batch.setdefault(batch_of[r[0]], []).append(wts[0])
        if changed:
            out.append(f"{len(changed)} rows rewritten with a new write time (id, first seen, "
                       f"final): {changed[:10]}")
        previous_max = None
        for batch in sorted(per_batch):
            stamps = sorted(per_batch[batch])
            if len(set(stamps)) != len(stamps):
                out.append(f"batch {batch}: {len(stamps) - len(set(stamps))} write times repeat")
            if previous_max is not None and stamps[0] <= previous_max:
                out.append(f"batch {batch}: write times do not increase across batches "
                           f"({stamps[0]} <= previous batch's {previous_max})")
            previous_max = stamps[-1]
            seal = read_seal(wal, batch) if wal else None
            if seal is None:            # forgotten by a rebuilt working copy's retention
                seal = self.seals_at_loss.get(batch)
            if seal is None:
                out.append(f"batch {batch}: no seal file left to compare write times with")
            elif stamps != list(range(seal.base_ts_us, seal.base_ts_us + seal.rows)):
                out.append(f"batch {batch}: write times {stamps[0]}..{stamps[-1]} "
                           f"({len(stamps)} rows) are not the seal's base_ts_us "
                           f"{seal.base_ts_us} + 0..{seal.rows - 1}")
        return out

    def _check_change_writetimes(self, rows: dict[int, tuple]) -> list[str]:
        """A change stream's rows: every column at the ``lsn`` of the row's last upsert; in
        sealed order (no ``writetime``), every column at one sealed timestamp, its upsert's."""
        if self.change_order == "sealed":
            wrong = [(row_id, r[3:]) for row_id, r in rows.items() if len(set(r[3:])) != 1]
            return [f"{len(wrong)} rows whose columns have different write times (id, write "
                    f"times): {wrong[:10]}"] if wrong else []
        wrong = [(row_id, r[3:], self.last_lsn.get(row_id)) for row_id, r in rows.items()
                 if set(r[3:]) != {self.last_lsn.get(row_id)}]
        return [f"{len(wrong)} rows not at their last upsert's lsn (id, write times, lsn): "
                f"{wrong[:10]}"] if wrong else []

    def _check_marker(self, wal: WalDir | None) -> list[str]:
        """The completeness marker names the last committed batch, as the WAL holds it: its
        rows, its last sealed timestamp as the row's write time, the query's id."""
        target = f"{self.keyspace}.{self.table}"
        found = [r for r in self.cql.execute(
            f"SELECT query_id, target_table, batch_id, rows, commit_seen_at, acknowledged_at, "
            f"writetime(batch_id) AS written_at FROM {self.keyspace}.{MARKER_TABLE}")
            if r.target_table == target]
        if len(found) != 1:
            return [f"the marker table holds {len(found)} rows for {target}"]
        (row,) = found
        out = []
        last = max(ckpt.committed_batches(self.checkpoint))
        seal = read_seal(wal, last) if wal else None
        query_id = ckpt.open_checkpoint(self.checkpoint).query_id()
        if (row.query_id, row.batch_id) != (query_id, last):
            out.append(f"the marker names query {row.query_id} batch {row.batch_id}, not "
                       f"{query_id} batch {last}, the last committed")
        if seal is None:
            out.append(f"batch {last}: no seal left to compare the marker with")
        elif (row.rows, row.written_at) != (seal.rows, seal.last_ts_us):
            out.append(f"the marker of batch {last} says {row.rows} rows at {row.written_at}; "
                       f"its seal {seal.rows} rows, last timestamp {seal.last_ts_us}")
        if row.commit_seen_at is None or row.acknowledged_at < row.commit_seen_at:
            out.append(f"the marker's times: commit seen {row.commit_seen_at}, acknowledged "
                       f"{row.acknowledged_at}")
        return out

    def _check_wal(self, wal: WalDir | None) -> list[str]:
        if wal is None:
            return ["the checkpoint names no WAL (cassandra_wal_sink.json)"]
        out = []
        if os.path.exists(os.path.join(wal.root, BLOCKED_FILE)):
            with open(os.path.join(wal.root, BLOCKED_FILE)) as f:
                out.append(f"the WAL is blocked: {f.read()}")
        views = catalog.describe_read_only(wal, self.checkpoint)
        pending = [f"batch {v.batch}: {v.state}, action {v.action} {v.detail}".strip()
                   for v in views if v.action != RecoveryAction.NOTHING]
        if pending:
            out.append(f"the WAL still has work: {pending}")
        leftovers = wal.staged_batch_ids()
        if leftovers:
            out.append(f"staged segments left behind for batches {leftovers}")
        if wal.remote:
            on_store = stores.open_store(wal.location).list(SEGMENTS_DIR)
            if on_store:
                out.append(f"segments left on the store: {on_store[:10]}")
            if not os.path.isdir(os.path.join(self.working_copy(), "log")):
                out.append(f"harness: the program's working copy is not {self.working_copy()} "
                           f"(CASSANDRA_WAL_WORKING_DIR not taken up): losing it lost nothing")
        return out


@pytest.fixture
def change_order() -> str:
    """Which of the two orders the user guide gives a change stream keeps: ``lsn``, a
    source-order ``writetime`` column; ``sealed``, sealed timestamps, each batch one task
    (a test module parametrizes it)."""
    return "lsn"


@pytest.fixture
def change_stream_harness(cql, cassandra_node, keyspace, tmp_path, change_order):
    """A prepared harness of a change stream (:func:`change_lines`) on a local checkpoint."""
    with CrashHarness(cql, cassandra_node.host, cassandra_node.port, keyspace,
                      tmp_path / "crash", changes=True, change_order=change_order) as harness:
        yield harness


@pytest.fixture
def crash_harness(cql, cassandra_node, keyspace, tmp_path, crash_storage, request, monkeypatch):
    """A prepared harness: input files, a fresh table in the test's keyspace, a sampler; the
    checkpoint on ``crash_storage`` (``local``, ``hdfs``, ``s3``: the session's server of the
    ``crash_<name>`` fixture), which this process then reaches as the program's Spark does."""
    storage = LOCAL_STORAGE if crash_storage == LOCAL_STORAGE.name else \
        request.getfixturevalue(f"crash_{crash_storage}")
    if storage.access is not None:
        monkeypatch.setattr(stores, "_access", storage.access)
    with CrashHarness(cql, cassandra_node.host, cassandra_node.port, keyspace,
                      tmp_path / "crash", storage=storage) as harness:
        yield harness
