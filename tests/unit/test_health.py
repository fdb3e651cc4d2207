"""The WAL's figures (recovery/health.py), the flusher's counters and log lines
(recovery/events.py), and what ``cassandra-wal status`` and ``inspect --watch`` make of them."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

import pytest
from cassandra.cluster import NoHostAvailable

from recovery.cli.main import main
from recovery import events
from recovery.errors import FlushFailed
from recovery.flusher import QueryFlusher
from recovery.health import FlushCounters, HealthState, combined, health_of, read_health
from tests.helpers.flush_fakes import record_target_capped
from tests.helpers.walfactory import WalFactory
from tests.helpers.outage import Outage, fake_cassandra, flusher_on
from wal import catalog
from wal.catalog import RecoveryAction
from wal import clock
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy

pytestmark = pytest.mark.unit

S = 1_000_000      # µs a second


def views_of(wal: WalDir, checkpoint: str):
    return catalog.describe_read_only(wal, checkpoint, RecoveryPolicy.QUERY_FLUSHER)


@pytest.fixture
def backlog(tmp_path):
    """Batch 0 flushed; batches 1..3 sealed and committed (5 rows each), not written."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0, rows=(3, 2))
        for b in (1, 2, 3):
            f.sealed(b, rows=(3, 2), committed=True)
    return WalDir.at(str(tmp_path / "wal")), str(tmp_path / "cp")


def figures(wal, cp, **kw):
    views = views_of(wal, cp)
    base = dict(blocked_reason=None, max_bytes=10**9, wal_bytes=123, flushed_through=0)
    base.update(kw)
    return health_of(wal, views, **base), views


def test_the_backlog_is_what_spark_committed_and_cassandra_has_not(backlog):
    wal, cp = backlog
    health, views = figures(wal, cp)
    seals = {v.batch: v for v in views}
    assert health.state == HealthState.HEALTHY
    assert (health.pending_batches, health.pending_rows) == (3, 15)
    assert health.pending_bytes == sum(seals[b].bytes for b in (1, 2, 3)) > 0
    assert health.oldest_pending_age_s == pytest.approx(seals[1].age_s)
    assert health.last_written_batch == 0 and health.last_write_latency_s >= 0
    assert (health.retries, health.replays) == (None, None)      # no live flusher
    assert (health.batches_written, health.rows_written) == (None, None)


def test_lagging_once_the_oldest_pending_batch_is_older_than_the_threshold(backlog):
    wal, cp = backlog
    views = views_of(wal, cp)
    oldest = max(v.age_s for v in views if v.action == RecoveryAction.REPLAY)
    kw = dict(blocked_reason=None, max_bytes=10**9, wal_bytes=1, flushed_through=0)
    assert health_of(wal, views, lag_after_s=oldest + 60, **kw).state == HealthState.HEALTHY
    assert health_of(wal, views, lag_after_s=oldest / 2, **kw).state == HealthState.LAGGING


def test_lagging_when_the_backlog_is_over_wal_max_bytes(backlog):
    wal, cp = backlog
    health, _ = figures(wal, cp, max_bytes=1)
    assert health.state == HealthState.LAGGING and health.pending_bytes > health.max_bytes == 1


def test_blocked_wins_over_everything_and_carries_its_reason(backlog):
    wal, cp = backlog
    health, _ = figures(wal, cp, blocked_reason="RecoveryBlocked: batch 1", max_bytes=1)
    assert health.state == HealthState.BLOCKED and health.blocked_reason == "RecoveryBlocked: batch 1"


def test_rows_per_second_count_the_recent_batches_over_the_span_they_cover(backlog):
    wal, cp = backlog
    views = views_of(wal, cp)
    flushed = next(v for v in views if v.batch == 0)
    kw = dict(blocked_reason=None, max_bytes=1, wal_bytes=1, flushed_through=0)
    # 5 rows, sealed 10 s before now: 0.5 rows/s
    now = flushed.seal.sealed_at_us + 10 * S
    assert health_of(wal, views, now=now, **kw).rows_per_s == pytest.approx(0.5)
    # written more than the window ago: nothing recent
    later = flushed.record.updated_at_us + 61 * S
    assert health_of(wal, views, now=later, **kw).rows_per_s == 0.0


def test_read_health_reads_blocked_json_and_the_recorded_cap(tmp_path):
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3,), committed=True)
    wal = WalDir.at(str(tmp_path / "wal"))
    record_target_capped(wal, 4096)
    wal.write_blocked("FlushFailed: refused")
    health = read_health(wal, str(tmp_path / "cp"), FlushCounters())
    assert health.state == HealthState.BLOCKED
    assert health.blocked_reason == "FlushFailed: refused"
    assert health.max_bytes == 4096 and health.wal_bytes > 0
    assert (health.retries, health.replays) == (0, 0)



def test_a_target_this_release_cannot_read_whole_still_gives_its_cap(tmp_path):
    """wal.maxBytes is read from target.json even when the rest is not this release's to read
    (a later release's option): status shows the cap and says lagging over it, as it did
    before health read the target through RecordedTarget.readable_target."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(0, rows=(3,), committed=True)
    wal = WalDir.at(str(tmp_path / "wal"))
    record_target_capped(wal, 1)
    recorded = wal.read_target()
    recorded["target"]["config"]["write"]["an_option_of_a_later_release"] = True
    wal.write_target(recorded)
    health = read_health(wal, str(tmp_path / "cp"))
    assert health.max_bytes == 1 and health.state == HealthState.LAGGING


def test_the_state_is_the_plain_word_the_user_guide_shows(backlog):
    """``sinks.status(q).state`` is a str, as before HealthState: docs/user-guide.md shows
    ``h.state, h.blocked_reason  # 'lagging', None``; a YAML dump of ``to_dict()`` or a check
    of its type sees a str, whatever makes the figures (health_of, combined, the flusher)."""
    wal, cp = backlog
    lagging, _ = figures(wal, cp, max_bytes=1)
    assert repr((lagging.state, lagging.blocked_reason)) == "('lagging', None)"
    blocked = dataclasses.replace(lagging, state=HealthState.BLOCKED, blocked_reason="x")
    for health in (lagging, blocked, combined([lagging, blocked])):
        assert type(health.state) is str and type(health.to_dict()["state"]) is str
    assert combined([lagging, blocked]).state == "blocked"

# -- the live flusher: counters and log lines ------------------------------------------------
def test_the_flusher_counts_retries_and_replays_and_logs_each_batch_and_state_change(
        tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=events.LOGGER_NAME)
    with flusher_on(tmp_path, batches=2) as flusher:
        outage = Outage(NoHostAvailable("down", {}))
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        during = flusher.health()
        assert (during.retries, during.replays) == (2, 0)
        assert (during.batches_written, during.rows_written) == (0, 0)
        assert during.pending_batches == 2 and during.pending_rows == 10
        outage.down = False
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        after = flusher.health()
        assert (after.retries, after.replays) == (2, 2)
        assert (after.batches_written, after.rows_written) == (2, 10)
        assert after.pending_batches == 0 and after.last_written_batch == 1
        assert after.flushed_through == 1 and after.state == HealthState.HEALTHY

    lines = [r.getMessage() for r in caplog.records if r.name == events.LOGGER_NAME]
    written = [line for line in lines if " written: " in line]
    assert len(written) == 2 and all("5 rows" in line and "bytes" in line and
                                     "after its commit" in line for line in written)
    started = [i for i, line in enumerate(lines)
               if "replay started at batch 0 (after NoHostAvailable)" in line]
    # Said before the first batch's own line (it came after it before).
    assert started and started[0] < lines.index(written[0])
    assert any("replay finished: 2 batches, 10 rows" in line for line in lines)


def test_blocked_and_unblocked_are_logged_once_each(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=events.LOGGER_NAME)
    with flusher_on(tmp_path) as flusher:
        outage = Outage(FlushFailed(0, "InvalidRequest: Undefined column name x",
                                    permanent=True))
        fake_cassandra(monkeypatch, flusher, outage)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.health().state == HealthState.BLOCKED
        outage.down = False
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert flusher.health().state == HealthState.HEALTHY
    lines = [r.getMessage() for r in caplog.records if r.name == events.LOGGER_NAME]
    assert len([line for line in lines if ": blocked: " in line]) == 1
    assert len([line for line in lines if ": unblocked" in line]) == 1


def test_a_restart_that_clears_an_earlier_runs_block_says_unblocked(tmp_path, monkeypatch,
                                                                   caplog):
    """The usual remedy of a block is a restart (the block failed the query): its flusher's
    first good drain says "unblocked" too. Before, only the flusher that blocked said it."""
    caplog.set_level(logging.INFO, logger=events.LOGGER_NAME)
    with flusher_on(tmp_path) as first:
        fake_cassandra(monkeypatch, first, Outage(FlushFailed(0, "InvalidRequest: no", permanent=True)))
        first.drain(RecoveryPolicy.QUERY_FLUSHER)
        first.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert first.health().state == HealthState.BLOCKED
    restarted = QueryFlusher(str(tmp_path / "wal"), str(tmp_path / "cp"), retry_interval_s=0.01)
    try:
        cured = Outage(FlushFailed(0, "InvalidRequest: no", permanent=True))
        cured.down = False
        fake_cassandra(monkeypatch, restarted, cured)
        restarted.drain(RecoveryPolicy.QUERY_START)
        assert restarted.health().state == HealthState.HEALTHY
    finally:
        restarted.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == events.LOGGER_NAME]
    assert len([line for line in lines if ": unblocked" in line]) == 1


def test_a_committed_batch_recovery_cannot_write_is_blocked_before_the_flusher_tries(
        capsys, tmp_path):
    """Spark committed batch 1, the WAL holds no seal for it: the flusher will block on it at
    its next drain, and nothing after it is written. status said healthy until then."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0, rows=(3, 2))
        f.staged(1)
        f.commit(1)
    wal, cp = WalDir.at(str(tmp_path / "wal")), str(tmp_path / "cp")
    health = read_health(wal, cp)
    assert health.state == HealthState.BLOCKED
    assert "batch 1: Spark committed it but it has no seal" in health.blocked_reason
    assert main(["status", wal.root, "--checkpoint", cp]) == 2
    assert "batch 1" in capsys.readouterr().out


def test_a_batch_sealed_meanwhile_or_a_wal_on_a_store_is_not_called_blocked(tmp_path):
    """A live sink seals (or flushes) a batch between the catalog's reads: read again, it is
    not broken. A reader's copy of a store's seals may predate the commits it read: there only
    the flusher's blocked.json says blocked (a false block would page someone)."""
    from types import SimpleNamespace

    from recovery.health import still_broken

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.flushed(0, rows=(3, 2))
        built = f.staged(1)
        f.commit(1)
        wal, cp = WalDir.at(str(tmp_path / "wal")), str(tmp_path / "cp")
        views = views_of(wal, cp)
        assert still_broken(wal, views).batch == 1
        assert still_broken(SimpleNamespace(remote=object()), views) is None
        f.seal(1, built.segments)                   # sealed after the catalog's listing
        assert still_broken(wal, views) is None
        assert read_health(wal, cp).state != HealthState.BLOCKED


def test_make_visible_shows_info_on_stderr_unless_the_application_configured_logging(
        monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    fresh = logging.getLogger("cassandra_wal_test_fresh")
    events.make_visible(fresh)
    assert fresh.level == logging.INFO and len(fresh.handlers) == 1 and not fresh.propagate
    events.make_visible(fresh)                      # idempotent
    assert len(fresh.handlers) == 1

    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])
    configured = logging.getLogger("cassandra_wal_test_configured")
    configured.setLevel(logging.WARNING)            # the application's choice stands
    events.make_visible(configured)
    assert configured.level == logging.WARNING and configured.handlers == []


# -- the CLI -------------------------------------------------------------------------------
def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_status_exits_0_healthy_1_lagging_2_blocked(capsys, backlog, tmp_path):
    wal, cp = backlog
    code, out, _ = run_cli(capsys, "status", wal.root, "--checkpoint", cp)
    assert code == 0 and out.startswith("healthy: 3 batches pending (15 rows")
    assert len(out.splitlines()) == 1 and "written through batch 0" in out
    code, out, _ = run_cli(capsys, "status", wal.root, "--checkpoint", cp, "--lag-after", "0.001")
    assert code == 1 and out.startswith("lagging: 3 batches pending")
    copy = tmp_path / "blocked"
    shutil.copytree(wal.root, copy)
    WalDir.at(str(copy)).write_blocked("RecoveryBlocked: batch 1 is damaged")
    code, out, _ = run_cli(capsys, "status", copy, "--checkpoint", cp)
    assert (code, out) == (2, "blocked: RecoveryBlocked: batch 1 is damaged\n")
    code, out, _ = run_cli(capsys, "status", copy, "--checkpoint", cp, "--json")
    doc = json.loads(out)
    assert code == 2 and doc["state"] == "blocked" and doc["pending_rows"] == 15


def test_status_refuses_a_bad_lag_threshold(capsys, backlog):
    wal, cp = backlog
    code, _, err = run_cli(capsys, "status", wal.root, "--lag-after", "0")
    assert code == 2 and "--lag-after 0" in err


def test_status_and_inspect_leave_the_wal_untouched(capsys, backlog):
    wal, cp = backlog

    def tree():
        return sorted((p, os.path.getsize(os.path.join(d, p)), os.path.getmtime(os.path.join(d, p)))
                      for d, _, files in os.walk(wal.root) for p in files)

    before = tree()
    run_cli(capsys, "status", wal.root, "--checkpoint", cp)
    run_cli(capsys, "inspect", wal.root, "--watch", "0.01", "--count", "2")
    assert tree() == before


def test_inspect_shows_the_blocked_reason_first_and_the_backlog_against_the_cap(
        capsys, backlog):
    wal, cp = backlog
    record_target_capped(wal, 10**9, cp)
    wal.write_blocked("FlushFailed: refused")
    code, out, _ = run_cli(capsys, "inspect", wal.root)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "BLOCKED     FlushFailed: refused"
    assert lines[1] == "health      blocked"
    assert lines[2].startswith("backlog     3 batches, 15 rows, ") and \
        "of wal.maxBytes 1.0 GB" in lines[2] and "oldest pending" in lines[2]


def test_inspect_watch_redraws_count_times_and_json_gives_one_object_a_line(capsys, backlog):
    wal, cp = backlog
    code, out, _ = run_cli(capsys, "inspect", wal.root, "--watch", "0.01", "--count", "3",
                           "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(docs) == 3
    assert all(d["health"]["pending_batches"] == 3 for d in docs)
    code, out, _ = run_cli(capsys, "inspect", wal.root, "--watch", "0.01", "--count", "2")
    assert code == 0 and out.count("backlog     3 batches") == 2
    code, _, err = run_cli(capsys, "inspect", wal.root, "--count", "2")
    assert code == 2 and "--count goes with --watch" in err


def test_inspect_watch_shows_what_the_running_sink_did_between_two_redraws(capsys, tmp_path,
                                                                          monkeypatch):
    """Each redraw reads the WAL again: a batch the sink flushed meanwhile leaves the backlog.
    Ctrl-C (KeyboardInterrupt in the wait) ends the watch with exit 0."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        for b in (0, 1):
            f.sealed(b, rows=(3, 2), committed=True)
        waits = []

        def sleep(seconds):
            waits.append(seconds)
            if len(waits) == 1:             # the sink writes batch 0 between the two looks
                f.flush(0)
            else:
                raise KeyboardInterrupt

        monkeypatch.setattr(clock, "sleep", sleep)
        code, out, _ = run_cli(capsys, "inspect", f.root, "--watch", "5", "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and waits == [5.0, 5.0] and len(docs) == 2
    assert [d["health"]["pending_batches"] for d in docs] == [2, 1]
    assert [d["health"]["flushed_through"] for d in docs] == [-1, 0]


def test_sinks_status_stays_the_function_once_its_module_is_loaded():
    """A module ``sinks/status.py`` would replace the function with itself on first call."""
    import sinks
    from recovery.cql.errors import SinkError

    unknown = type("Query", (), {"id": "q-unknown", "runId": "r"})()
    for _ in range(2):
        with pytest.raises(SinkError, match="checkpoint is unknown"):
            sinks.status(unknown)
    assert callable(sinks.status)
