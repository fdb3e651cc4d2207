"""wal/recovery_policy.py: one RecoveryPolicy per situation recovery runs in, in place of the
two booleans that travelled before (``query_running``, ``executors_allowed``). Each policy does
what its pair did; each caller picks the policy of its situation (issue 36)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pyarrow as pa
import pytest

from tests.helpers.flush_fakes import flusher_for, recover_job_asked, target
from tests.helpers.spark_fakes import FakeSpark
from tests.helpers.walfactory import WalFactory
from wal.catalog import RecoveryAction, describe
from wal.recovery_policy import RecoveryPolicy
from wal.seal import seal_batch
from wal.segment import SegmentWriter

pytestmark = pytest.mark.unit

#: What each situation passed before, as (query_running, executors_allowed); None: the
#: situation never reached the flusher's drain, which alone read executors_allowed.
BEFORE = {
    RecoveryPolicy.QUERY_FLUSHER: (True, True),     # drain(query_running=True)
    RecoveryPolicy.QUERY_START: (False, False),     # recover(): drain(False, ..., False)
    RecoveryPolicy.OFFLINE: (True, None),           # replay_wal(discard_uncommitted=False)
    RecoveryPolicy.OFFLINE_FORCED: (False, None),   # replay_wal(discard_uncommitted=True)
    RecoveryPolicy.BATCH_JOB: (False, None),        # replay_wal's default
}


def test_every_situation_is_named_once():
    assert set(BEFORE) == set(RecoveryPolicy)


@pytest.mark.parametrize("policy", list(RecoveryPolicy), ids=lambda p: p.name.lower())
def test_each_policy_does_what_its_booleans_did(policy):
    query_running, executors_allowed = BEFORE[policy]
    assert policy.discards_uncommitted is (not query_running)
    assert policy.writes_through_flush_mode is bool(executors_allowed)


def _stage(wal, batch: int):
    with SegmentWriter(wal, batch, 0, 0) as writer:
        writer.append(pa.record_batch({"id": pa.array(range(3), pa.int64())}))
        return writer.finish()


@pytest.mark.parametrize("policy", list(RecoveryPolicy), ids=lambda p: p.name.lower())
def test_a_batch_spark_never_committed_is_discarded_or_waits_by_policy(wal, wal_log, tmp_path,
                                                                       policy):
    cp = tmp_path / "cp"
    (cp / "commits").mkdir(parents=True)
    (cp / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    for batch in (0, 1):
        seal_batch(wal, batch, [_stage(wal, batch)])    # 0 committed, 1 not
    _stage(wal, 2)                                      # 2 staged only
    views = {v.batch: v.action for v in describe(wal, wal_log, str(cp), policy)}
    undecided = RecoveryAction.DISCARD if BEFORE[policy][0] is False else RecoveryAction.WAIT
    assert views == {0: RecoveryAction.REPLAY, 1: undecided, 2: undecided}


def test_the_flusher_writes_through_its_mode_only_while_the_query_runs(tmp_path):
    """QUERY_START never hands the batches to Spark tasks (executors_allowed=False before);
    QUERY_FLUSHER does when the mode says so."""
    from recovery.executors import ExecutorsWriter

    flusher, runs = flusher_for(tmp_path, "executors", FakeSpark())
    try:
        flusher.drain(RecoveryPolicy.QUERY_START)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)
        assert runs[0] is None and isinstance(runs[1], ExecutorsWriter)
    finally:
        flusher.wal_log.close()


def test_a_batch_jobs_flush_is_the_batch_job_policy(tmp_path, monkeypatch):
    import recovery.batch_jobs as batch_jobs

    asked = []
    monkeypatch.setattr(batch_jobs, "replay_wal", lambda *a, **kw: asked.append(kw["policy"]))
    batch_jobs.flush_sealed(SimpleNamespace(root=str(tmp_path)), target())
    assert asked == [RecoveryPolicy.BATCH_JOB]


@pytest.mark.parametrize("force, policy", [(False, RecoveryPolicy.OFFLINE),
                                           (True, RecoveryPolicy.OFFLINE_FORCED)])
def test_sinks_recover_is_offline_forced_only_with_force(tmp_path, monkeypatch, force, policy):
    import sinks.driver.recover_job as recover_job

    root, asked = recover_job_asked(tmp_path, monkeypatch, "policy")
    recover_job.recover(FakeSpark(), root, force=force)
    assert asked == [policy]


@pytest.mark.parametrize("force, action", [(False, "wait"), (True, "discard")])
def test_recover_dry_run_shows_what_its_policy_does(tmp_path, capsys, force, action):
    """``cassandra-wal recover`` is OFFLINE, ``--force`` OFFLINE_FORCED: the words its plan
    shows for a batch Spark never committed are those of before."""
    import json

    from recovery.cli.main import main

    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.wal.write_target({"fingerprint": "f", "target": target().to_dict()})
        seal_batch(f.wal, 0, [_stage(f.wal, 0)])
        root, cp = f.root, f.checkpoint
    os.makedirs(os.path.join(cp, "offsets"))        # Spark planned batch 0, never committed it
    with open(os.path.join(cp, "offsets", "0"), "w") as out:
        out.write('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0}\n')
    argv = ["recover", root, "--checkpoint", cp, "--dry-run", "--json"]
    capsys.readouterr()
    assert main(argv + (["--force"] if force else [])) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [(v["batch"], v["action"]) for v in plan] == [(0, action)]


def test_no_boolean_or_bare_word_stands_in_for_a_policy_an_action_or_a_state():
    """The pair of booleans (and replay_wal's discard_uncommitted) is gone for good, and code
    compares RecoveryAction / ViewState members, never the words they show."""
    import re

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stand_ins = re.compile(r"\b(query_running|executors_allowed|discard_uncommitted)\s*[:=,)]"
                           r"|\w\.(state|action)\s*(==|!=|in)\s*\(?\s*[\"']"
                           r"|(==|!=)\s*BatchState\.\w+\.value\b")
    found = []
    for package in ("wal", "recovery", "sinks"):
        for folder, _, names in os.walk(os.path.join(repo, package)):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as source:
                    found += [f"{os.path.relpath(path, repo)}:{n}: {line.strip()}"
                              for n, line in enumerate(source, 1) if stand_ins.search(line)]
    assert found == []
