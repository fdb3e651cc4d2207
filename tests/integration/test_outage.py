"""Cassandra goes away in the middle of a stream (real node, real Spark): the WAL absorbs it.

The node here is the module's own (not the session's), stopped and started again on the same
port and data (``tests/helpers/node.py: RestartableNode``):

* an outage of more than 30 s: the query keeps running and committing, ``cassandra-wal
  inspect`` shows the backlog, and once the node is back every batch drains, in batch order,
  with the timestamps of its seal, nothing lost and nothing twice; all along, the metrics
  endpoint (``wal.metrics.port``, scraped every second), ``sinks.status`` and ``cassandra-wal
  status`` show the backlog rising during the outage and draining after it
  (``CASSANDRA_WAL_OUTAGE_SAMPLES=file.json`` keeps the scrapes: bench/plot_outage.py draws
  docs/img/outage-backlog.png from them);
* back-pressure at ``wal.maxBytes``: ``block`` holds the commit (the query waits, nothing is
  sealed, ``status`` says lagging with the backlog over the cap) until the flusher has
  drained the backlog; ``fail`` fails the query with
  ``WalFull`` naming the cap, and a restart loses nothing;
* an outage with the flush in worker processes never blocks the sink (``blocked.json`` is
  sampled all along, the node's restart included);
* Spark purging old ``commits/N`` (``spark.sql.streaming.minBatchesToRetain=2``) while the
  backlog is longer than that: the running query, and a restart after ``kill -9``, still
  write every committed row;
* a script that calls ``query.stop()`` and exits leaves no committed row unwritten.

Input: one JSON file per micro-batch (``maxFilesPerTrigger=1``), so batch k is file k.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sinks
from sinkutil import (EVENTS_TABLE, REPO_ROOT, cassandra_wal, committed_batches, error_text,
                      event_rows, flushed_through, free_port, running, scrape,
                      start_events_stream, stream_wal, wait_all_flushed,
                      wait_for, write_json_files)
from tests.crash.harness import CrashHarness

from tests.helpers.node import RestartableNode, java_home_env
from wal.log import WalLog
from wal.seal import read_seal
from wal.states import BatchState

pytestmark = pytest.mark.integration

ROWS_PER_FILE = 20
OUTAGE_S = 35.0


@pytest.fixture(scope="module")
def node():
    node = RestartableNode("outage")
    try:
        yield node.start()
    finally:
        node.purge()


@pytest.fixture
def keyspace(node):
    """A keyspace on the node with an empty ``events`` table."""
    with node.keyspace("outage", EVENTS_TABLE) as name:
        yield name


def file_rows(k: int) -> list[dict]:
    return event_rows(k, ROWS_PER_FILE, stride=1000)


start_stream = start_events_stream


class BlockedSampler(threading.Thread):
    """Looks for ``blocked.json`` every 50 ms until stopped; keeps what it found."""

    def __init__(self, cp: Path):
        super().__init__(name="blocked-sampler", daemon=True)
        self.path = os.path.join(stream_wal(cp).root, "blocked.json")
        self.seen: list[str] = []
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.samples += 1
            try:
                with open(self.path) as f:
                    self.seen.append(f.read())
            except FileNotFoundError:
                continue

    def stop(self) -> list[str]:
        self.done.set()
        self.join(10)
        return self.seen


class MetricsScraper(threading.Thread):
    """Scrapes the endpoint every second, as Prometheus would; keeps ``(seconds, samples)``."""

    def __init__(self, port: int, query_id: str):
        super().__init__(name="metrics-scraper", daemon=True)
        self.port, self.query_id = port, query_id
        self.started_at = time.monotonic()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                got = scrape(self.port, self.query_id)
            except OSError as exc:
                self.errors.append(repr(exc))
                continue
            self.samples.append((time.monotonic() - self.started_at, got))

    def at(self) -> float:
        return time.monotonic() - self.started_at

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self.done.set()
        self.join(10)
        return self.samples


def keep_samples(samples, down_s: float, up_s: float) -> None:
    """For the user guide's picture: ``CASSANDRA_WAL_OUTAGE_SAMPLES=file.json``."""
    path = os.environ.get("CASSANDRA_WAL_OUTAGE_SAMPLES")
    if path:
        Path(path).write_text(json.dumps({"node_stopped_s": down_s, "node_started_s": up_s,
                                          "samples": samples}, indent=1))


def status_cli(cp: Path, *extra: str) -> subprocess.CompletedProcess:
    """``cassandra-wal status`` beside the running sink."""
    return cassandra_wal("status", stream_wal(cp).root, "--checkpoint", str(cp), *extra)


@pytest.fixture
def retain_two_batches(spark):
    """``spark.sql.streaming.minBatchesToRetain=2`` for the queries started meanwhile (Spark
    reads it when a query starts); the session's setting is restored afterwards."""
    key = "spark.sql.streaming.minBatchesToRetain"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "2")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def count_rows(node, keyspace: str, table: str = "events") -> int:
    with node.session() as cql:
        return cql.execute(f"SELECT COUNT(*) FROM {keyspace}.{table}").one()[0]


def inspect_json(cp: Path) -> dict:
    """``cassandra-wal inspect --json`` beside the running sink (it never takes the lock)."""
    result = cassandra_wal("inspect", stream_wal(cp).root, "--checkpoint", str(cp), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_table_holds(node, keyspace: str, cp: Path, files: int) -> None:
    """Exactly the rows of files 0..files-1, each written with its batch's sealed timestamps
    (row i of batch k: base_ts_us of seal k + i; one file is one task, one segment)."""
    wal = stream_wal(cp)
    with node.session() as cql:   # a fresh session: the node was restarted
        rows = list(cql.execute(f"SELECT id, file, name, WRITETIME(name) AS wt "
                                f"FROM {keyspace}.events"))
    got = {r.id: (r.file, r.name) for r in rows}
    expected = {r["id"]: (r["file"], r["name"]) for k in range(files) for r in file_rows(k)}
    assert got == expected
    for r in rows:
        seal = read_seal(wal, r.file)      # file k is batch k
        assert seal is not None, f"batch {r.file} has no seal"
        assert seal.base_ts_us <= r.wt < seal.base_ts_us + seal.rows, (
            f"row {r.id} of batch {r.file}: WRITETIME {r.wt} is not one of its seal's "
            f"timestamps [{seal.base_ts_us}, {seal.base_ts_us + seal.rows})")


def flushed_records(cp: Path) -> dict[int, int]:
    """Batch -> when the log marked it FLUSHED (microseconds), for every FLUSHED batch."""
    reader = WalLog.open_reader(stream_wal(cp))
    assert reader is not None
    try:
        return {r.batch: r.updated_at_us for r in reader.records()
                if r.state is BatchState.FLUSHED}
    finally:
        reader.close()


def test_a_cassandra_outage_is_absorbed_and_drained_in_order(spark, node, keyspace, tmp_path,
                                                            caplog):
    caplog.set_level(logging.INFO, logger="cassandra_wal")
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0), file_rows(1)])
    port = free_port()
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.metrics.port": str(port)})
    scraper = MetricsScraper(port, str(query.id))
    with running(query):
        wait_all_flushed(cp, at_least=1)
        # Spark's progress has no figure of a Python sink's (docs/user-guide.md, "Operating
        # the sink"): what the endpoint and sinks.status are for.
        wait_for(lambda: query.lastProgress is not None, what="a first progress report")
        assert not query.lastProgress["sink"].get("metrics"), query.lastProgress["sink"]
        before = sinks.status(query)
        assert (before.state, before.pending_batches, before.last_written_batch) == \
            ("healthy", 0, 1), before
        scraper.start()
        wait_for(lambda: scraper.samples, timeout=30, what="a first scrape of the endpoint")

        node.stop()
        down_at, down_s = time.monotonic(), scraper.at()
        write_json_files(src, [file_rows(k) for k in range(2, 6)], first_index=2)
        # The query goes on: Spark commits every batch while Cassandra is away.
        wait_for(lambda: committed_batches(cp)[-1] >= 5, timeout=120,
                 what="batches 2..5 to be committed during the outage")
        assert query.isActive and query.exception() is None
        assert flushed_through(stream_wal(cp)) == 1, "nothing can be flushed while the node is down"

        report = inspect_json(cp)
        backlog = {b["batch"]: b for b in report["batches"] if b["batch"] >= 2}
        assert sorted(backlog) == [2, 3, 4, 5]
        assert all(b["committed"] is True and b["action"] == "replay" for b in backlog.values())
        assert report["totals"]["rows_pending"] == 4 * ROWS_PER_FILE
        assert report["health"]["pending_rows"] == 4 * ROWS_PER_FILE

        time.sleep(max(0.0, OUTAGE_S - 5 - (time.monotonic() - down_at)))
        during = sinks.status(query, lag_after_s=10)
        assert (during.state, during.pending_batches, during.pending_rows) == \
            ("lagging", 4, 4 * ROWS_PER_FILE), during
        assert during.oldest_pending_age_s >= 10 and during.flushed_through == 1
        assert during.retries > 0 and during.blocked_reason is None, during
        lagging = status_cli(cp, "--lag-after", "10")
        assert lagging.returncode == 1, lagging.stdout + lagging.stderr
        assert lagging.stdout.startswith("lagging: 4 batches pending (80 rows"), lagging.stdout
        scraped = scrape(port, str(query.id))
        assert scraped["cassandra_wal_pending_rows"] == 4 * ROWS_PER_FILE
        assert scraped["cassandra_wal_oldest_pending_age_seconds"] >= 10
        assert scraped["cassandra_wal_blocked"] == 0
        assert scraped["cassandra_wal_retries_total"] > 0

        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert query.isActive and query.exception() is None, "the outage failed the query"
        assert not os.path.exists(os.path.join(stream_wal(cp).root, "blocked.json"))
        node.start()
        up_s = scraper.at()

        wait_all_flushed(cp, at_least=5)
        assert query.exception() is None
        after = sinks.status(query)
        assert (after.state, after.pending_batches, after.pending_rows) == ("healthy", 0, 0)
        assert after.last_written_batch == 5 and after.flushed_through == 5
        # Batch 5 was committed during the outage: visible once the node was back.
        assert after.last_write_latency_s > 5, after
        assert after.replays >= 4 and after.rows_per_s > 0, after
        # Batches 0..5, each written once by this run's flusher (a replay is not a rewrite).
        assert (after.batches_written, after.rows_written) == (6, 6 * ROWS_PER_FILE), after
        healthy = status_cli(cp)
        assert healthy.returncode == 0 and healthy.stdout.startswith("healthy: 0 batches")
        wait_for(lambda: scraper.samples[-1][0] > scraper.at() - 1.5
                 and scraper.samples[-1][1].get("cassandra_wal_pending_rows") == 0,
                 timeout=30, what="a scrape after the drain")
        samples = scraper.stop()
    keep_samples(samples, down_s, up_s)
    lines = [r.getMessage() for r in caplog.records if r.name == "cassandra_wal"]
    assert any("batch 5 written: 20 rows" in line and "after its commit" in line
               for line in lines), lines
    assert any("replay started at batch 2" in line for line in lines), lines
    assert any("replay finished: 4 batches, 80 rows" in line for line in lines), lines
    assert scraper.errors == [] and len(samples) > OUTAGE_S / 2, scraper.errors[:3]
    pending = [(t, m.get("cassandra_wal_pending_rows")) for t, m in samples]
    outage = [rows for t, rows in pending if down_s <= t < up_s]
    assert outage == sorted(outage) and outage[-1] == 4 * ROWS_PER_FILE, pending
    assert max(rows for t, rows in pending if t < down_s) == 0, pending
    assert pending[-1][1] == 0, pending
    assert samples[-1][1]["cassandra_wal_rows_written_total"] == 6 * ROWS_PER_FILE
    assert_table_holds(node, keyspace, cp, files=6)
    flushed_at = flushed_records(cp)
    assert sorted(flushed_at) == [0, 1, 2, 3, 4, 5]
    assert [flushed_at[b] for b in range(6)] == sorted(flushed_at[b] for b in range(6)), (
        f"batches were not marked flushed in batch order: {flushed_at}")
    assert inspect_json(cp)["totals"]["rows_pending"] == 0


def test_block_holds_the_commit_while_the_backlog_is_over_the_cap(spark, node, keyspace,
                                                                  tmp_path):
    """``wal.maxBytes=1``: any unflushed earlier batch fills the WAL. With the node down, batch 1
    commits (nothing before it is pending) and batch 2's commit waits, unsealed, until the
    node is back and batch 1 is flushed."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.maxBytes": "1",
                                                            "wal.backpressure": "block"})
    wal = stream_wal(cp)
    with running(query):
        wait_all_flushed(cp, at_least=0)
        node.stop()
        write_json_files(src, [file_rows(1), file_rows(2)], first_index=1)
        wait_for(lambda: committed_batches(cp)[-1] >= 1, timeout=120, what="batch 1's commit")
        wait_for(lambda: 2 in wal.staged_batch_ids(), timeout=120, what="batch 2 to be staged")
        time.sleep(15)       # batch 2's commit is held all this time
        assert committed_batches(cp)[-1] == 1 and read_seal(wal, 2) is None
        assert query.isActive and query.exception() is None
        held = {b["batch"]: b for b in inspect_json(cp)["batches"]}
        assert held[1]["action"] == "replay" and held[2]["state"] == "staged"
        holding = sinks.status(query)     # the backlog over the cap is what holds the commit
        assert holding.state == "lagging" and holding.blocked_reason is None, holding
        assert holding.pending_batches == 1 and holding.pending_bytes > holding.max_bytes == 1
        assert status_cli(cp).returncode == 1
        node.start()
        wait_all_flushed(cp, at_least=2)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=3)


def test_fail_stops_the_query_naming_the_cap_and_a_restart_loses_nothing(
        spark, node, keyspace, tmp_path):
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.maxBytes": "1",
                                                            "wal.backpressure": "fail"})
    with running(query):
        wait_all_flushed(cp, at_least=0)
        node.stop()
        write_json_files(src, [file_rows(1), file_rows(2)], first_index=1)
        wait_for(lambda: not query.isActive, what="batch 2's commit to fail the query")
    text = error_text(query.exception())
    assert "WalFull" in text and "wal.maxBytes=1" in text, text
    assert committed_batches(cp)[-1] == 1
    assert read_seal(stream_wal(cp), 2) is None

    node.start()
    query = start_stream(spark, node, keyspace, src, cp)     # default cap
    with running(query):
        wait_all_flushed(cp, at_least=2)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=3)


def test_an_outage_with_the_flush_in_worker_processes_never_blocks_the_sink(spark, node, keyspace,
                                                                         tmp_path):
    """``wal.flush.mode=processes``: the workers meet the outage (no host, then, while the node
    starts, connections and ``prepare`` that fail) and return their errors to the driver; none
    of them may block the sink."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.flush.mode": "processes",
                                                            "wal.flush.processes": "2"})
    sampler = BlockedSampler(cp)
    with running(query):
        wait_all_flushed(cp, at_least=0)
        sampler.start()
        node.stop()
        write_json_files(src, [file_rows(k) for k in range(1, 5)], first_index=1)
        wait_for(lambda: committed_batches(cp)[-1] >= 4, timeout=120,
                 what="batches 1..4 to be committed during the outage")
        time.sleep(5)        # a few more failed drains while the node is away
        assert query.isActive and query.exception() is None
        node.start()
        sinks.wait_flushed(query, timeout=120)
        assert query.exception() is None
    seen = sampler.stop()
    assert sampler.samples > 100 and seen == [], f"the sink was blocked by the outage: {seen[:3]}"
    assert_table_holds(node, keyspace, cp, files=5)


def test_commits_spark_purged_during_an_outage_are_still_written_by_the_running_query(
        spark, node, keyspace, tmp_path, retain_two_batches):
    """Spark keeps 2 entries of ``commits/``: once the node is back, the backlog's batches have
    lost their commit files, and the running query must still write every row."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    files = 12
    write_json_files(src, [file_rows(0)])
    query = start_stream(spark, node, keyspace, src, cp, **{"wal.retention.batches": "100"})
    with running(query):
        wait_all_flushed(cp, at_least=0)
        node.stop()
        write_json_files(src, [file_rows(k) for k in range(1, files)], first_index=1)
        wait_for(lambda: committed_batches(cp)[-1] >= files - 1, timeout=120,
                 what=f"batches 1..{files - 1} to be committed during the outage")
        assert committed_batches(cp)[0] > 1, (
            f"Spark kept commits {committed_batches(cp)}: minBatchesToRetain was not applied")
        node.start()
        expected = files * ROWS_PER_FILE
        wait_for(lambda: count_rows(node, keyspace) == expected, timeout=90, interval=2,
                 what=f"all {expected} rows of the {files} committed batches in Cassandra")
        sinks.wait_flushed(query, timeout=60)
        assert query.exception() is None
    assert_table_holds(node, keyspace, cp, files=files)


def test_commits_spark_purged_during_an_outage_survive_kill_9_and_a_restart(
        node, keyspace, tmp_path, monkeypatch):
    """The crash tests' driver program (``tests/crash/driver_program.py``) with
    ``minBatchesToRetain=2``: a first run writes file 0; with the node down a second run
    commits the 11 other files and is killed with its whole process group; once the node is
    back a third run on the same checkpoint must write every row, exactly once."""
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS",
                       "--conf spark.sql.streaming.minBatchesToRetain=2 pyspark-shell")
    files = 12
    sessions = contextlib.ExitStack()
    harness = CrashHarness(sessions.enter_context(node.session()), node.host, node.port,
                           keyspace, tmp_path / "crash", files=files, rows_per_file=100,
                           table="crash_events", run_deadline_s=240).prepare()
    try:
        held = tmp_path / "held"      # the program runs until every file it saw is written
        held.mkdir()
        later = sorted(p for p in harness.input.iterdir() if p.name != "part-00000.json")
        for path in later:
            path.rename(held / path.name)  # a rename keeps the modification time (the order)
        first = harness.finish()           # batch 0, written; the table is validated
        assert first.returncode == 0, first.tail()
        node.stop()
        for path in later:
            (held / path.name).rename(harness.input / path.name)
        phase, proc, token = harness._launch("kill-9-after-the-outage-commits", {})
        started = time.monotonic()
        try:
            wait_for(lambda: committed_batches(harness.checkpoint)[-1] >= files - 1,
                     timeout=180, what=f"batches 1..{files - 1} to be committed in the outage")
            assert committed_batches(harness.checkpoint)[0] > 1, (
                f"Spark kept commits {committed_batches(harness.checkpoint)}: "
                "minBatchesToRetain was not applied")
            phase.fired = True
        finally:
            harness._reap(phase, proc, token, started)
        node.start()
        harness.cql = sessions.enter_context(node.session())   # not one still reconnecting
        finish = harness.finish()
        assert finish.returncode == 0, finish.tail()
        rows = harness.final_rows()
        missing = sorted(set(harness.expected) - set(rows))
        assert not missing, (f"{len(missing)} of {len(harness.expected)} rows missing after the "
                             f"restart, of files {sorted({harness.expected[i]['batch_tag'] for i in missing})}")
        assert all(rows[i][:3] == (e["batch_tag"], e["payload"], e["amount"])
                   for i, e in harness.expected.items())
        assert harness.sampler.violations == []
        report = json.loads(cassandra_wal("inspect", harness.wal_dir().root, "--checkpoint",
                                          harness.checkpoint, "--json").stdout)
        assert [b["batch"] for b in report["batches"] if b["state"] == "discarded"] == []
        assert report["totals"]["rows_pending"] == 0
    finally:
        harness.close()
        sessions.close()


def test_a_script_that_stops_its_query_and_exits_leaves_no_committed_row_unwritten(
        node, keyspace, tmp_path):
    """No restart: the rows of every committed batch are in Cassandra when the process is
    gone. The batches are large enough that the last ones are still being flushed when the
    script calls ``query.stop()``."""
    src, cp = tmp_path / "src", tmp_path / "cp"
    rows_per_file = 20_000
    write_json_files(src, [[{"id": k * 100_000 + i, "file": k, "name": f"row {i}"}
                            for i in range(rows_per_file)] for k in range(3)])
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT), **java_home_env())
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("stop_and_exit_program.py")),
         "--input", str(src), "--checkpoint", str(cp), "--keyspace", keyspace,
         "--table", "events", "--host", node.host, "--port", str(node.port)],
        capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    committed = committed_batches(cp)
    assert committed and committed[-1] == 2, f"Spark committed {committed}"
    assert count_rows(node, keyspace) == 3 * rows_per_file
