"""The joined view of files, log and checkpoint (wal/catalog.py): the action for every case.

Checkpoints are plain folders with ``commits/N`` files, as Spark writes them.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from wal.catalog import LATE_ATTEMPT, RecoveryAction, ViewState, describe
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy
from wal.retention import RetentionPolicy, apply_retention, remove_batch_files
from wal.seal import COMMIT_POINT_SEAL, seal_batch
from wal.segment import SegmentWriter
from wal.states import BatchState

NOTHING, REPLAY, DISCARD, WAIT, ERROR = (RecoveryAction.NOTHING, RecoveryAction.REPLAY,
                                          RecoveryAction.DISCARD, RecoveryAction.WAIT,
                                          RecoveryAction.ERROR)

pytestmark = pytest.mark.unit


@pytest.fixture
def checkpoint(tmp_path) -> str:
    path = tmp_path / "checkpoint"
    (path / "commits").mkdir(parents=True)
    return str(path)


def commit(checkpoint: str, *batches: int) -> None:
    for b in batches:
        with open(os.path.join(checkpoint, "commits", str(b)), "w") as f:
            f.write('v1\n{"nextBatchWatermarkMs":0}\n')


def stage(wal: WalDir, batch: int, partition: int = 0, rows: int = 4):
    with SegmentWriter(wal, batch, partition, 0) as writer:
        writer.append(pa.record_batch({"id": pa.array(range(rows), pa.int64())}))
        return writer.finish()


def seal(wal: WalDir, batch: int, partitions: int = 2, rows: int = 4, **kw):
    return seal_batch(wal, batch, [stage(wal, batch, p, rows) for p in range(partitions)], **kw)


def view(wal, wal_log, checkpoint, batch, policy=RecoveryPolicy.QUERY_START):
    views = {v.batch: v for v in describe(wal, wal_log, checkpoint, policy)}
    return views[batch]


# -- staged only (segments, no seal) ------------------------------------------------------

def test_staged_only_is_discarded(wal, wal_log, checkpoint):
    stage(wal, 3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.committed, v.detail) == ("staged", DISCARD, False, "not sealed")
    assert (v.rows, v.partitions, v.seal, v.record) == (0, 0, None, None)


def test_staged_only_waits_while_the_query_runs(wal, wal_log, checkpoint):
    stage(wal, 3)
    assert view(wal, wal_log, checkpoint, 3, RecoveryPolicy.QUERY_FLUSHER).action == WAIT


def test_staged_only_without_a_checkpoint_is_discarded(wal, wal_log):
    stage(wal, 3)
    v = view(wal, wal_log, None, 3)
    assert (v.action, v.committed) == (DISCARD, None)


def test_committed_with_segments_but_no_seal_is_an_error(wal, wal_log, checkpoint):
    stage(wal, 3)
    commit(checkpoint, 3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.committed) == ("staged", ERROR, True)
    assert "no seal" in v.detail


# -- sealed, not in the log yet -----------------------------------------------------------

def test_sealed_and_committed_is_replayed(wal, wal_log, checkpoint):
    s = seal(wal, 3, partitions=2, rows=4)
    commit(checkpoint, 3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.committed, v.detail) == ("sealed", REPLAY, True, "")
    assert (v.rows, v.partitions, v.bytes, v.seal) == (8, 2, s.bytes, s)
    assert v.age_s >= 0


def test_sealed_not_committed_is_discarded(wal, wal_log, checkpoint):
    seal(wal, 3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.committed) == ("sealed", DISCARD, False)
    assert "never committed" in v.detail


def test_sealed_not_committed_waits_while_the_query_runs(wal, wal_log, checkpoint):
    seal(wal, 3)
    v = view(wal, wal_log, checkpoint, 3, RecoveryPolicy.QUERY_FLUSHER)
    assert (v.action, v.committed) == (WAIT, False)
    assert "waiting for Spark" in v.detail


def test_sealed_with_checkpoint_unknown_waits(wal, wal_log):
    seal(wal, 3)
    v = view(wal, wal_log, None, 3)
    assert (v.action, v.committed) == (WAIT, None)
    assert "checkpoint unknown" in v.detail


def test_sealed_with_checkpoint_unknown_waits_even_when_no_query_runs(wal, wal_log):
    seal(wal, 3)
    assert view(wal, wal_log, None, 3, RecoveryPolicy.QUERY_START).action == WAIT


def test_seal_commit_point_is_replayed_without_a_checkpoint(wal, wal_log):
    seal(wal, 3, commit_point=COMMIT_POINT_SEAL)
    v = view(wal, wal_log, None, 3)
    assert (v.state, v.action, v.committed) == ("sealed", REPLAY, True)


def test_seal_commit_point_is_replayed_even_if_the_checkpoint_lacks_it(wal, wal_log, checkpoint):
    seal(wal, 3, commit_point=COMMIT_POINT_SEAL)
    assert view(wal, wal_log, checkpoint, 3).action == REPLAY


def test_corrupted_seal_is_an_error(wal, wal_log, checkpoint):
    seal(wal, 3)
    commit(checkpoint, 3)
    with open(wal.seal_path(3), "r+b") as f:
        f.seek(5)
        f.write(b"~")
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.seal) == ("sealed", ERROR, None)
    assert "corrupted" in v.detail and "checksum" in v.detail


def test_corrupted_seal_of_an_ingested_batch_uses_the_log_copy(wal, wal_log, checkpoint):
    s = seal(wal, 3)
    commit(checkpoint, 3)
    wal_log.ingest(s)
    with open(wal.seal_path(3), "wb") as f:
        f.write(b"garbage")
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.action, v.seal) == (REPLAY, s)


# -- in the log ---------------------------------------------------------------------------

def test_ingested_sealed_batch_is_replayed_from_the_start(wal, wal_log, checkpoint):
    s = seal(wal, 3)
    commit(checkpoint, 3)
    record = wal_log.ingest(s)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.detail) == ("sealed", REPLAY, "resume at row 0")
    assert (v.record, v.seal, v.rows) == (record, s, 8)


def test_ingested_flushing_batch_is_replayed_from_its_progress(wal, wal_log, checkpoint):
    wal_log.ingest(seal(wal, 3))
    commit(checkpoint, 3)
    wal_log.begin_flush(3)
    wal_log.record_progress(3, 1, 0, 4)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.detail, v.flushed_rows) == \
        ("flushing", REPLAY, "resume at row 4", 4)


def test_a_flushing_batch_names_the_segments_acknowledged_beyond_its_progress(wal, wal_log,
                                                                           checkpoint):
    wal_log.ingest(seal(wal, 3, partitions=3))
    commit(checkpoint, 3)
    wal_log.begin_flush(3)
    wal_log.record_progress(3, 1, 0, 4)                # segment 0 written
    wal_log.record_acknowledged(3, 2, 4)               # segment 2 too, segment 1 failed
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.action, v.flushed_rows) == (REPLAY, 8)
    assert v.detail == "resume at row 4, 1 later segment(s) (4 rows) acknowledged already"


def test_ingested_batch_is_replayed_even_if_the_checkpoint_is_unknown(wal, wal_log):
    wal_log.ingest(seal(wal, 3))
    assert view(wal, wal_log, None, 3).action == REPLAY


def test_flushed_batch_needs_nothing(wal, wal_log, checkpoint):
    wal_log.ingest(seal(wal, 3))
    commit(checkpoint, 3)
    wal_log.begin_flush(3)
    wal_log.mark_flushed(3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.flushed_rows) == ("flushed", NOTHING, 8)


def test_discarded_batch_needs_nothing_and_says_why(wal, wal_log, checkpoint):
    stage(wal, 3)
    wal_log.discard(3, "Spark never committed it")
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.detail) == ("discarded", NOTHING, "Spark never committed it")


def test_discarded_batch_without_files_is_still_listed(wal, wal_log, checkpoint):
    wal_log.discard(3, "x")
    assert [(v.batch, v.action) for v in describe(wal, wal_log, checkpoint)] == [(3, NOTHING)]


def test_discarded_batch_sealed_again_by_a_rerun_is_replayed_once_committed(
        wal, wal_log, checkpoint):
    stage(wal, 3)
    wal_log.discard(3, "never committed")
    s = seal(wal, 3)                 # Spark re-ran batch 3 with the same id
    commit(checkpoint, 3)
    v = view(wal, wal_log, checkpoint, 3)
    assert (v.state, v.action, v.seal) == ("sealed", REPLAY, s)


def test_discarded_batch_sealed_again_but_not_committed_waits_while_the_query_runs(
        wal, wal_log, checkpoint):
    wal_log.discard(3, "never committed")
    seal(wal, 3)
    assert view(wal, wal_log, checkpoint, 3, RecoveryPolicy.QUERY_FLUSHER).action == WAIT
    assert view(wal, wal_log, checkpoint, 3).action == DISCARD


def test_flushed_batch_forgotten_by_retention_with_its_seal_kept_needs_nothing(
        wal, wal_log, checkpoint):
    """Retention keeps the newest seal (for timestamps) but removes its segments and record."""
    for b in (0, 1):
        wal_log.ingest(seal(wal, b))
        commit(checkpoint, b)
        wal_log.begin_flush(b)
        wal_log.mark_flushed(b)
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0))
    assert wal.sealed_batch_ids() == [1] and wal_log.get(1) is None
    assert [(v.batch, v.action) for v in describe(wal, wal_log, checkpoint)] == [(1, NOTHING)]


def test_shared_flushed_through_stands_in_for_a_lost_log(wal, wal_log, checkpoint):
    """The log is a working copy: rebuilt empty, the shared marker still says what is done."""
    for b in (0, 1):
        wal_log.ingest(seal(wal, b))
        commit(checkpoint, b)
        wal_log.begin_flush(b)
        wal_log.mark_flushed(b)
    wal.write_flushed_through(1)
    apply_retention(wal, wal_log, RetentionPolicy(keep_batches=0))
    seal(wal, 2)
    commit(checkpoint, 2)
    got = [(v.batch, v.action) for v in describe(wal, None, checkpoint)]
    assert got == [(1, NOTHING), (2, REPLAY)]


# -- committed batches the WAL does not hold ----------------------------------------------

def test_committed_batch_with_nothing_in_the_wal_is_an_error(wal, wal_log, checkpoint):
    seal(wal, 3)
    commit(checkpoint, 3, 4)
    v = view(wal, wal_log, checkpoint, 4)
    assert (v.state, v.action, v.committed) == ("missing", ERROR, True)
    assert "no seal" in v.detail


def test_committed_batches_before_the_first_wal_batch_are_not_ours(wal, wal_log, checkpoint):
    seal(wal, 5)
    commit(checkpoint, 0, 1, 2, 5)
    assert [v.batch for v in describe(wal, wal_log, checkpoint)] == [5]


def flushed_with_1_forgotten(wal, wal_log, checkpoint) -> None:
    """Batches 1 and 2 flushed and committed; retention forgot 1 (record and files)."""
    for b in (1, 2):
        wal_log.ingest(seal(wal, b))
        wal_log.begin_flush(b)
        wal_log.mark_flushed(b)
    wal_log.forget(1)
    remove_batch_files(wal, 1)
    commit(checkpoint, 1, 2)


def test_committed_batches_already_flushed_are_not_missing(wal, wal_log, checkpoint):
    wal_log.discard(0, "never committed")
    flushed_with_1_forgotten(wal, wal_log, checkpoint)
    assert [(v.batch, v.action) for v in describe(wal, wal_log, checkpoint)] == \
        [(0, NOTHING), (2, NOTHING)]


def test_empty_wal_reports_nothing_even_with_commits(wal, wal_log, checkpoint):
    commit(checkpoint, 0, 1)
    assert describe(wal, wal_log, checkpoint) == []


# -- the listing as a whole ---------------------------------------------------------------

def test_every_case_at_once_in_batch_order(wal, wal_log, checkpoint):
    # Spark commits in order, so every committed batch is below every uncommitted one (a
    # committed batch missing from the WAL has a test of its own above).
    wal_log.ingest(seal(wal, 1))
    wal_log.begin_flush(1)
    wal_log.mark_flushed(1)              # flushed
    stage(wal, 0)                    # a late task attempt's segments of a finished batch
    wal_log.ingest(seal(wal, 2))         # ingested
    seal(wal, 3)                     # sealed, committed
    seal(wal, 4)                     # sealed, not committed
    stage(wal, 5)                    # staged only
    commit(checkpoint, 1, 2, 3)
    got = [(v.batch, v.state, v.action) for v in describe(wal, wal_log, checkpoint)]
    assert got == [(0, "staged", NOTHING), (1, "flushed", NOTHING), (2, "sealed", REPLAY),
                   (3, "sealed", REPLAY), (4, "sealed", DISCARD), (5, "staged", DISCARD)]


# -- what Spark and operators do ----------------------------------------------------------

def purge(checkpoint, *batches):
    """Spark's purge of old ``commits/N`` (it keeps ``minBatchesToRetain`` of them)."""
    for b in batches:
        os.unlink(os.path.join(checkpoint, "commits", str(b)))


@pytest.mark.parametrize("policy", list(RecoveryPolicy), ids=lambda p: p.name.lower())
def test_committed_batches_whose_commit_files_spark_purged_are_replayed(
        wal, wal_log, checkpoint, policy):
    # An outage longer than minBatchesToRetain batches: Spark purged commits/3 and commits/4
    # while the WAL still held them. Spark commits in order, so they are committed: the live
    # flusher must not wait on them forever, nor a restart discard them.
    for b in (3, 4, 5):
        seal(wal, b)
    commit(checkpoint, 3, 4, 5)
    purge(checkpoint, 3, 4)
    views = describe(wal, wal_log, checkpoint, policy)
    assert [(v.batch, v.action, v.committed) for v in views] == \
        [(3, REPLAY, True), (4, REPLAY, True), (5, REPLAY, True)]


def test_the_log_remembers_what_spark_committed(wal, wal_log, checkpoint):
    # Seen committed once, a batch stays committed for the catalog even when the checkpoint
    # is not at hand (cassandra-wal without --checkpoint) or lists nothing older.
    seal(wal, 4)
    seal(wal, 5)
    wal_log.note_committed(4)
    assert [(v.batch, v.action) for v in describe(wal, wal_log, None)] == [(4, REPLAY), (5, WAIT)]
    wal_log.note_committed(2)    # never lowered
    assert wal_log.committed_through() == 4


def test_late_attempt_segments_of_a_flushed_and_forgotten_batch_are_garbage(
        wal, wal_log, checkpoint):
    # A zombie or speculative task of batch 1 finishes after batch 1 was flushed and forgotten
    # by retention: its segments must not make the committed batch look broken.
    flushed_with_1_forgotten(wal, wal_log, checkpoint)
    stage(wal, 1)
    v = view(wal, wal_log, checkpoint, 1)
    assert (v.state, v.action, v.detail) == ("staged", NOTHING, LATE_ATTEMPT)


def test_describe_without_a_log(wal, checkpoint):
    seal(wal, 3)
    commit(checkpoint, 3)
    stage(wal, 4)
    assert [(v.batch, v.action) for v in describe(wal, None, checkpoint)] == \
        [(3, REPLAY), (4, DISCARD)]


def test_checkpoint_given_as_a_file_url(wal, wal_log, checkpoint):
    seal(wal, 3)
    commit(checkpoint, 3)
    assert view(wal, wal_log, "file://" + checkpoint, 3).action == REPLAY
    assert view(wal, wal_log, "file:" + checkpoint, 3).action == REPLAY


def test_checkpoint_without_a_commits_folder_commits_nothing(wal, wal_log, tmp_path):
    seal(wal, 3)
    (tmp_path / "fresh-checkpoint").mkdir()
    v = view(wal, wal_log, str(tmp_path / "fresh-checkpoint"), 3)
    assert (v.action, v.committed) == (DISCARD, False)


def test_a_checkpoint_folder_that_does_not_exist_is_unknown_not_uncommitted(wal, wal_log, tmp_path):
    # A mistyped --checkpoint must never turn a committed batch into a discard.
    seal(wal, 3)
    v = view(wal, wal_log, str(tmp_path / "no-such-checkpoint"), 3)
    assert (v.action, v.committed) == (WAIT, None)


def test_to_dict_leaves_out_seal_and_record(wal, wal_log, checkpoint):
    wal_log.ingest(seal(wal, 3))
    d = view(wal, wal_log, checkpoint, 3).to_dict()
    assert "seal" not in d and "record" not in d
    assert d["batch"] == 3 and d["action"] == REPLAY and d["rows"] == 8


# -- the words users see -------------------------------------------------------------------
def test_actions_and_states_keep_the_words_inspect_shows():
    """``inspect`` (text and ``--json``), ``recover --dry-run`` and ``repair``'s recorded plan
    show these words: the enums name them once in code, and never change them."""
    assert {a.name: a.value for a in RecoveryAction} == {
        "NOTHING": "nothing", "REPLAY": "replay", "DISCARD": "discard", "WAIT": "wait",
        "ERROR": "error"}
    assert [s.value for s in ViewState] == [
        "staged", "entered", "sealed", "flushing", "flushed", "discarded", "skipped", "moved",
        "missing"]
    for word in [*RecoveryAction, *ViewState]:
        assert (str(word), f"{word}", f"{word:>9}".strip()) == (word.value,) * 3
        assert json.loads(json.dumps({word: word})) == {word.value: word.value}


def test_a_batch_the_log_records_is_viewed_in_the_logs_word():
    for state in BatchState:
        assert ViewState.of(state).value == state.value


def test_a_view_as_json_holds_the_plain_words(wal, wal_log, checkpoint):
    seal(wal, 3)
    (seen,) = describe(wal, wal_log, checkpoint)
    assert (seen.state, seen.action) == (ViewState.SEALED, RecoveryAction.DISCARD)
    got = json.loads(json.dumps(seen.to_dict()))
    assert (got["state"], got["action"]) == ("sealed", "discard")
