"""A WAL on a store, worked on through a local working copy (``wal/remote.py``).

The store here is a second local folder behind the same :class:`~wal.store.Store` contract the
HDFS and S3 stores pass against real servers (``tests/integration/test_store_servers.py``); the
working copies are folders standing for driver hosts. Tasks stage into a spool and publish; the
commit publishes versioned seals; the flusher pulls; a working copy lost with its RocksDB log
("the driver on another host") is rebuilt from the store without writing a flushed row again.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from recovery.replay import Replayer
from tests.helpers.walfactory import simple_rows
from tests.helpers.flush_fakes import WRITES, RecordingUpserter
from wal import WalDir, WalLog
from wal.binding import bind, read_binding
from wal.errors import WalBoundElsewhere
from wal.pointer import read_pointer, write_pointer
from wal.recovery_policy import RecoveryPolicy
from wal.remote import RemoteWal, make_working_copy, spool_dir, working_copy_of
from wal.schemes import is_remote
from wal.seal import read_seal, seal_batch
from wal.states import BatchState
from wal.segment import SegmentWriter
from wal.store import LocalStore

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))      # where tasks spool
    WRITES.clear()
    yield
    WRITES.clear()


class Stream:
    """One stream's WAL on a store, a checkpoint, and a driver host's working copy."""

    def __init__(self, tmp_path, host: str = "host-a"):
        self.tmp = tmp_path
        self.store_dir = tmp_path / "store"
        self.uri = f"file:{self.store_dir}"
        self.store = LocalStore(str(self.store_dir))
        self.checkpoint = str(tmp_path / "cp")
        os.makedirs(os.path.join(self.checkpoint, "commits"), exist_ok=True)
        self.host(host)

    def host(self, name: str) -> WalDir:
        """Work on the WAL from the driver host ``name`` (its own working copy)."""
        root = str(self.tmp / name)
        make_working_copy(root, self.uri)
        self.wal = WalDir(root).create()
        self.wal.remote.pull_state(root)
        return self.wal

    def stage(self, batch: int, partition: int, rows: int, start: int, attempt: int = 0):
        """A task: spools its segment on its own host, publishes it to the store."""
        task_wal = WalDir(spool_dir(self.uri), spool_for=self.uri)
        writer = SegmentWriter(task_wal, batch, partition, attempt, {"columns": ["id"]})
        writer.append(simple_rows(rows, start))
        return writer.finish()

    def seal(self, batch: int, refs):
        return seal_batch(self.wal, batch, list(refs))

    def commit(self, batch: int) -> None:
        open(os.path.join(self.checkpoint, "commits", str(batch)), "w").close()

    def flush(self, policy: RecoveryPolicy = RecoveryPolicy.QUERY_START):
        wal_log = WalLog.open_writer(self.wal)
        try:
            return Replayer(self.wal, wal_log, lambda seal: RecordingUpserter(),
                            self.checkpoint).run(policy)
        finally:
            wal_log.close()


def test_a_task_publishes_its_segment_and_keeps_nothing_in_its_spool(tmp_path):
    s = Stream(tmp_path)
    ref = s.stage(0, 0, 5, 0)
    assert s.store.list("segments") == [f"segments/{ref.name}"]
    assert s.store.read(f"segments/{ref.name}") is not None
    spool = spool_dir(s.uri)
    assert not any(files for _, _, files in os.walk(spool))     # published, then removed
    assert s.wal.staged_batch_ids() == []                         # the working copy has none yet


def test_a_rerun_of_a_batch_publishes_a_new_seal_version_and_never_replaces_one(tmp_path):
    s = Stream(tmp_path)
    first = s.seal(0, [s.stage(0, 0, 3, 0)])
    second = s.seal(0, [s.stage(0, 0, 3, 0, attempt=1)])          # Spark re-ran batch 0
    keys = s.store.list("seals")
    assert [k.rsplit("/", 1)[-1][:9] for k in keys] == ["00000001-", "00000002-"]
    assert first.seal_id != second.seal_id
    other = s.host("host-b")
    other.remote.pull_seals(other.root)
    assert read_seal(other, 0).seal_id == second.seal_id          # the newest version wins


def test_the_flusher_pulls_writes_and_cleans_the_store(tmp_path):
    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3)])
    s.commit(0)
    report = s.flush()
    assert report.replayed == [0]
    assert sorted(i for _, _, ids in WRITES for i in ids) == [0, 1, 2, 3, 4]
    assert s.store.list("segments") == []                 # flushed: gone from the store
    assert s.store.list("flushed") == ["flushed/00000000000000000000"]
    assert [k.split("/")[1] for k in s.store.list("seals")] == ["00000000000000000000"]  # kept


def test_a_driver_on_another_host_rebuilds_from_the_store_and_writes_no_flushed_row_again(
        tmp_path):
    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0)])
    s.commit(0)
    s.flush()
    s.seal(1, [s.stage(1, 0, 4, 100)])
    s.commit(1)
    s.seal(2, [s.stage(2, 0, 2, 200)])             # sealed, never committed
    shutil.rmtree(s.wal.root)                              # the host is gone, log and all
    WRITES.clear()

    s.host("host-b")
    report = s.flush(RecoveryPolicy.QUERY_START)
    assert report.replayed == [1]
    assert sorted(i for _, _, ids in WRITES for i in ids) == [100, 101, 102, 103]
    assert report.discarded == [2]
    assert not [k for k in s.store.list("segments") if "/00000000000000000002/" in f"/{k}"]
    # Batch 2 re-run on host B: its timestamps start above batch 1's, which host B never sealed.
    again = s.seal(2, [s.stage(2, 0, 2, 200, attempt=1)])
    assert again.base_ts_us > read_seal(s.wal, 1).last_ts_us


def test_the_binding_and_the_pointer_live_on_the_store(tmp_path):
    s = Stream(tmp_path)
    bind(s.wal, s.checkpoint)
    assert s.store.read("query.json") is not None
    other = s.host("host-b")
    assert read_binding(other).checkpoint == s.checkpoint     # pulled with the state
    elsewhere = str(tmp_path / "cp2")
    os.makedirs(elsewhere)
    with pytest.raises(WalBoundElsewhere):
        bind(other, elsewhere)
    write_pointer(s.checkpoint, s.uri)
    assert read_pointer(s.checkpoint) == s.uri


def test_target_blocked_and_flushed_markers_reach_the_store(tmp_path):
    s = Stream(tmp_path)
    s.wal.write_target({"a": 1})
    s.wal.write_target({"a": 2})
    assert [k.rsplit("/", 1)[-1][:9] for k in s.store.list("targets")] == ["00000001-",
                                                                           "00000002-"]
    s.wal.write_blocked("Cassandra refused the rows")
    other = s.host("host-b")
    assert other.read_target() == {"a": 2}
    assert other.read_blocked() == "Cassandra refused the rows"
    other.write_blocked(None)
    s.wal.remote.pull_state(s.wal.root)
    assert s.wal.read_blocked() is None
    other.write_flushed_through(4)
    other.write_flushed_through(7)
    assert s.store.list("flushed") == ["flushed/00000000000000000007"]


def test_locations_and_working_copies(tmp_path, monkeypatch):
    assert is_remote("s3a://bucket/wal") and is_remote("hdfs://nn:8020/cp")
    assert not is_remote("/data/wal") and not is_remote("file:///data/wal")
    monkeypatch.setenv("CASSANDRA_WAL_WORKING_DIR", str(tmp_path / "w"))
    a, b = working_copy_of("s3a://bucket/wal"), working_copy_of("s3a://bucket/wal2")
    assert a != b and a.startswith(str(tmp_path / "w"))
    assert RemoteWal.at(f"file:{tmp_path}").uri == f"file:{tmp_path}"


def test_a_wal_keeps_the_uri_it_was_given_so_commit_and_flusher_share_one_working_copy():
    """The pointer file names the WAL by ``WalDir.location``; the flusher opens that. An s3a://
    WAL once went by its store's s3:// spelling: the flusher then worked on another working
    copy than the commit (found by test_sink_s3.py)."""
    pytest.importorskip("boto3")
    assert RemoteWal.at("s3a://bucket/wal").uri == "s3a://bucket/wal"
    assert RemoteWal.at("hdfs://nn:8020/cp/wal").uri == "hdfs://nn:8020/cp/wal"


def test_a_seal_pulled_before_spark_committed_its_batch_is_never_the_one_written(
        tmp_path, monkeypatch):
    """Review finding 1: the flusher pulled an aborted run's seal of batch 1 (v1); the re-run's
    seal (v2) and commits/1 appeared before the drain read the checkpoint, so the old order
    (pull, then read commits) wrote v1's rows and deleted v2's segments from the store."""
    s = Stream(tmp_path)
    s.seal(1, [s.stage(1, 0, 2, 100)])                   # run 1: sealed, never committed
    real_pull = RemoteWal.pull

    def pull_then_rerun(self, root, segments=True, fetch=True):
        real_pull(self, root, segments, fetch)
        monkeypatch.setattr(RemoteWal, "pull", real_pull)
        flusher_copy = s.wal
        s.host("commit-host")                           # the re-run's commit, elsewhere
        s.seal(1, [s.stage(1, 0, 2, 500, attempt=1)])
        s.commit(1)
        s.wal = flusher_copy

    monkeypatch.setattr(RemoteWal, "pull", pull_then_rerun)
    report = s.flush(RecoveryPolicy.QUERY_FLUSHER)
    assert report.replayed == [] and WRITES == []        # not committed when commits/ was read
    report = s.flush(RecoveryPolicy.QUERY_FLUSHER)
    assert report.replayed == [1]
    assert sorted(i for _, _, ids in WRITES for i in ids) == [500, 501]


def test_a_flushed_marker_the_store_refused_is_published_before_the_segments_go(
        tmp_path, monkeypatch):
    """Review finding 6: the local flushed_through was written before the store's marker; a
    failed publish was never retried, the next drain deleted the batch's segments, and a
    working copy rebuilt elsewhere found batch 0 committed, unflushed and without segments."""
    from wal.errors import StoreUnavailable

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0)])
    s.commit(0)
    real = RemoteWal.publish_flushed

    def refused(self, batch):
        monkeypatch.setattr(RemoteWal, "publish_flushed", real)
        raise StoreUnavailable(self.uri, "injected: PUT flushed/ timed out")

    monkeypatch.setattr(RemoteWal, "publish_flushed", refused)
    with pytest.raises(StoreUnavailable):
        s.flush()
    s.flush()
    assert s.store.list("flushed") == ["flushed/00000000000000000000"]
    assert s.store.list("segments") == []
    shutil.rmtree(s.wal.root)
    WRITES.clear()
    s.host("host-b")
    assert s.flush().replayed == [] and WRITES == []     # nothing to replay, nothing blocked


def test_a_pull_reads_each_seal_version_once_and_flushed_batches_leave_no_folders(
        tmp_path, monkeypatch):
    """bench/store_cost.py found every pull re-reading every kept seal (20 of a commit's 24
    GETs) and HDFS listings walking the empty folders of every batch ever flushed."""
    s = Stream(tmp_path)
    for batch in range(3):
        s.seal(batch, [s.stage(batch, 0, 2, batch * 10)])
        s.commit(batch)
    s.flush()
    assert not os.path.exists(s.store_dir / "segments" / "00000000000000000000")
    reads = []
    real_read = LocalStore.read
    monkeypatch.setattr(LocalStore, "read",
                        lambda self, key: reads.append(key) or real_read(self, key))
    s.wal.remote.pull(s.wal.root)
    assert [k for k in reads if k.startswith("seals/")] == []


@pytest.mark.parametrize("on_store, last_error, kicks, drains", [
    (True, None, 0, 0),                      # idle on a store: the timer does nothing
    (True, None, 2, 2),                      # every kick (a commit, an idle event) drains
    (True, RuntimeError("down"), 0, None),   # a failure is retried on the timer
    (False, None, 0, None),                  # a local WAL drains on the timer, as before
])
def test_the_flusher_drains_a_store_when_kicked_and_retries_on_its_timer(
        tmp_path, on_store, last_error, kicks, drains):
    """bench/store_cost.py: each idle drain of a store costs ~7 requests (5 LISTs), every 2 s:
    210 a minute for nothing. None: at least 3 drains in the 0.3 s (timer every 0.05 s)."""
    import threading
    import time as time_

    from recovery.flusher import QueryFlusher

    s = Stream(tmp_path)
    f = QueryFlusher.__new__(QueryFlusher)
    f.wal = s.wal if on_store else WalDir(str(tmp_path / "local"))
    f.last_error, f._blocked_reason, f.retry_interval_s = last_error, None, 0.05
    f._wake, f._stop = threading.Event(), threading.Event()
    f._commits_dir = None             # a store's checkpoint: no commit watch
    f.warm_up = lambda: None          # no session to connect here
    count = []
    f.drain = lambda policy: count.append(1)
    thread = threading.Thread(target=f._loop)
    thread.start()
    for kick in range(kicks):
        f.kick()
        # Kicks coalesce while the thread is off the CPU (a loaded machine): wait for each
        # kick's drain before the next, so the count below means drains, not scheduling.
        deadline = time_.monotonic() + 5
        while len(count) <= kick and time_.monotonic() < deadline:
            time_.sleep(0.01)
    time_.sleep(0.3)
    f._stop.set()
    f._wake.set()
    thread.join(5)
    if drains is None:
        assert len(count) >= 3
    else:
        assert len(count) == drains


# -- found by the simulation's store schedules (tests/sim/README.md, A-D) ------------------------
def test_a_late_attempts_segment_of_a_flushed_batch_is_removed_from_the_store(tmp_path):
    """Sim A (seeds 42, 81...): a zombie task published into batch 0 after it was flushed;
    the pull skipped batches at or below the flushed marker, so it stayed on the store."""
    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0)])
    s.commit(0)
    s.flush()
    s.stage(0, 1, 2, 50, attempt=3)                       # the zombie, late
    assert s.store.list("segments")
    s.flush()
    assert s.store.list("segments") == []
    assert not os.path.exists(s.store_dir / "segments" / "00000000000000000000")


def test_a_failed_publish_leaves_nothing_in_the_tasks_spool(tmp_path, monkeypatch):
    """Sim C (seeds 25, 54...): the spool file, renamed into place, stayed when the publish
    failed (abort removed only the .tmp)."""
    from wal.errors import StoreUnavailable

    s = Stream(tmp_path)

    def refused(self, name, path):
        raise StoreUnavailable(self.uri, "injected: PUT timed out")

    monkeypatch.setattr(RemoteWal, "publish_segment", refused)
    with pytest.raises(StoreUnavailable):
        s.stage(0, 0, 3, 0)
    assert not any(files for _, _, files in os.walk(spool_dir(s.uri)))


def test_a_working_copy_of_a_wal_deleted_on_the_store_is_rebuilt_not_trusted(tmp_path,
                                                                              monkeypatch):
    """Sim B (seeds 208, 465...): the checkpoint (and the WAL under it) deleted on the store
    and the query started again; the old working copy's query.json refused the new query,
    and its RocksDB log would have taken the new batches for flushed."""
    import wal.layout as layout

    s = Stream(tmp_path)
    bind(s.wal, s.checkpoint)
    s.seal(0, [s.stage(0, 0, 3, 0)])
    s.commit(0)
    s.flush()
    root = s.wal.root
    shutil.rmtree(s.store_dir)                             # the user's reset
    shutil.rmtree(s.checkpoint)
    os.makedirs(os.path.join(s.checkpoint, "commits"))
    with open(os.path.join(s.checkpoint, "metadata"), "w") as f:
        f.write('{"id":"a-new-query"}\n')
    # WalDir.at as for an hdfs:// or s3a:// location (file: is a local WAL), on this copy.
    monkeypatch.setattr(layout, "is_remote", lambda location: True)
    monkeypatch.setattr(layout, "working_copy_of", lambda uri: root)
    fresh = WalDir.at(s.uri).create()
    assert fresh.root == root and not os.path.exists(os.path.join(root, "log"))
    bind(fresh, s.checkpoint)                              # the new query: not refused
    WRITES.clear()
    s.wal = fresh
    s.seal(0, [s.stage(0, 0, 2, 70)])
    s.commit(0)
    assert s.flush().replayed == [0]                       # not taken for flushed
    assert sorted(i for _, _, ids in WRITES for i in ids) == [70, 71]


def test_a_commit_after_spark_committed_its_batch_is_refused(tmp_path):
    """Sim D (seed 992): a cut-off driver's commit of batch 0 published its seal after the
    re-run's was committed, and the newest version (its) was written."""
    from recovery.cql.errors import SinkError
    from sinks.worker.plan import check_not_committed

    s = Stream(tmp_path)
    check_not_committed(s.checkpoint, 0)                   # not committed: nothing to say
    s.commit(0)
    with pytest.raises(SinkError, match="batch 0: Spark has committed it already"):
        check_not_committed(s.checkpoint, 0)


def test_two_versions_of_one_number_are_ordered_alike_by_every_reader(tmp_path):
    """Two writers publishing one version number at once both succeed (the token makes the
    keys differ); the seal pull and latest_version must pick the same one."""
    s = Stream(tmp_path)
    remote = s.wal.remote
    for token in ("aaaaaaaaaaaa", "ffffffffffff"):
        s.store.create(f"seals/00000000000000000004/00000001-{token}.seal", token.encode())
        s.store.create(f"targets/00000001-{token}.json", token.encode())
    remote.pull_seals(s.wal.root)
    with open(s.wal.seal_path(4), "rb") as f:
        assert f.read() == b"ffffffffffff"
    assert remote.latest_version("targets") == b"ffffffffffff"


def test_the_flusher_writes_a_batch_when_spark_commits_it_without_waiting_for_the_listener(
        tmp_path):
    """Issue 22: the listener's progress event reached the flusher 0.3-0.9 s after Spark wrote
    ``commits/N`` (bench/batch_timeline.py). On a local checkpoint the flusher looks for the
    next batch's ``commits/N`` itself; a commit it cannot get past (a failure, flushing off)
    never makes it spin."""
    import threading
    import time as time_
    from types import SimpleNamespace

    from recovery import flusher as flusher_mod
    from recovery.config import SinkConfig
    from recovery.flusher import QueryFlusher

    commits = tmp_path / "checkpoint" / "commits"
    commits.mkdir(parents=True)
    flushed = {"through": 4}
    f = QueryFlusher.__new__(QueryFlusher)
    f.wal = WalDir(str(tmp_path / "local"))
    f.last_error, f._blocked_reason, f.retry_interval_s = None, None, 30.0
    f._wake, f._stop = threading.Event(), threading.Event()
    f._commits_dir, f._seen_committed = str(commits), None
    f.target = SimpleNamespace(config=SinkConfig("ks", "t"))
    f.wal_log = SimpleNamespace(flushed_through=lambda: flushed["through"])
    f.warm_up = lambda: None
    drains = []

    def drain(policy):
        drains.append(time_.monotonic())
        if f.advance:
            flushed["through"] += 1

    f.drain, f.advance = drain, True
    thread = threading.Thread(target=f._loop)
    thread.start()

    def drains_after(action, wait=1.0):
        before = len(drains)
        action()
        time_.sleep(wait)
        return len(drains) - before

    try:
        assert drains_after(lambda: None, 0.2) == 0                     # nothing committed
        assert drains_after(lambda: (commits / "5").write_text("v1")) == 1
        f.advance = False                                             # it cannot get past 6
        assert drains_after(lambda: (commits / "6").write_text("v1")) == 1    # once, no spin
        f.last_error = RuntimeError("down")            # a failure waits for the retry timer
        f.advance, f._seen_committed = True, None
        assert drains_after(lambda: None, 0.3) == 0
        assert flusher_mod.COMMIT_POLL_S <= 0.05
    finally:
        f._stop.set()
        f._wake.set()
        thread.join(5)


def test_recover_on_a_store_writes_what_spark_committed_and_discards_nothing_without_force(
        tmp_path, monkeypatch, capsys):
    """Issue 31, item 4: recover's lock is this host's working copy; a query live on another
    host has sealed batch 1 and Spark is about to commit it. recover took it for uncommitted
    and deleted its seal and segments on the store: Spark committed it, its rows were lost."""
    import recovery.cli.recover_cmd as recover_cmd
    from recovery.cli.main import main

    s = Stream(tmp_path)
    s.wal.write_target({"fingerprint": "f", "target": _target_fields(s.checkpoint)})
    s.seal(0, [s.stage(0, 0, 3, 0)])
    s.commit(0)
    live = s.seal(1, [s.stage(1, 0, 2, 100)])       # the live query's batch, not committed yet
    monkeypatch.setattr(recover_cmd, "replay_wal", _replaying(monkeypatch))
    other = s.host("host-b")                          # recover runs on another host
    assert main(["recover", other.root, "--checkpoint", s.checkpoint]) == 0
    err = capsys.readouterr().err
    assert "left batch 1" in err and "--force" in err
    assert sorted(i for _, _, ids in WRITES for i in ids) == [0, 1, 2]
    assert [r.name for r in live.segments][0] in "".join(s.store.list("segments"))
    assert any("/00000000000000000001/" in f"/{k}/" for k in s.store.list("seals"))
    s.commit(1)                                     # Spark commits it: it is still there
    WRITES.clear()
    assert s.flush(RecoveryPolicy.QUERY_FLUSHER).replayed == [1]
    s.seal(2, [s.stage(2, 0, 1, 200)])              # a stopped query's leftover: --force
    assert main(["recover", other.root, "--checkpoint", s.checkpoint, "--force"]) == 0
    assert not any("/00000000000000000002/" in f"/{k}/" for k in s.store.list("seals"))


def _target_fields(checkpoint: str) -> dict:
    from tests.helpers.flush_fakes import target

    return target().to_dict()


def _replaying(monkeypatch):
    """recover's replay_wal with the recording Upserter (no Cassandra)."""
    import recovery.recover as recover_module

    real = recover_module.replay_wal

    class Output:
        def __init__(self, target, wal_root=None):
            pass

        def upserter(self, seal=None):
            return RecordingUpserter()

        def check_not_dropped(self, seal, wal_location, rows=None):
            pass

        def close(self):
            pass

    monkeypatch.setattr(recover_module, "CassandraOutput", Output)
    return real


class CountingStore:
    """A store that records every call that deletes (method, first key, how many keys)."""

    def __init__(self, store):
        self.store, self.uri, self.deletes = store, store.uri, []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def delete(self, key):
        self.deletes.append(("delete", key, 1))
        self.store.delete(key)

    def delete_many(self, keys):
        self.deletes.append(("delete_many", keys[0] if keys else "", len(keys)))
        self.store.delete_many(keys)

    def delete_folder(self, prefix, recursive=False):
        self.deletes.append(("delete_folder" + (" recursive" if recursive else ""), prefix, 0))
        self.store.delete_folder(prefix, recursive)


def segment_keys(batch: int, count: int) -> list[str]:
    return [f"segments/{batch:020d}/{p:05d}-0-x.seg" for p in range(count)]


def test_a_batch_that_goes_whole_is_deleted_in_one_request_not_one_per_segment(tmp_path):
    """Issue 32: on a store, a flushed or discarded batch's segments were deleted one request
    at a time (2,000 segments: 2,000 deletes). Its folder goes whole: one request."""
    store = CountingStore(LocalStore(str(tmp_path / "store")))
    for key in segment_keys(7, 2000) + segment_keys(8, 1):
        store.create(key, b"x")
    RemoteWal(store).delete_segments(7)
    assert store.deletes == [("delete_folder recursive", "segments/00000000000000000007", 0)]
    assert store.list("segments") == segment_keys(8, 1)


def test_a_batch_in_flight_keeps_its_winners_and_its_losers_go_in_one_request(tmp_path):
    store = CountingStore(LocalStore(str(tmp_path / "store")))
    keys = segment_keys(7, 300)
    for key in keys:
        store.create(key, b"x")
    winners = {k[len("segments/"):] for k in keys[::3]}
    RemoteWal(store).delete_segments(7, winners)
    assert [(m, n) for m, _, n in store.deletes] == [("delete_many", 200), ("delete_folder", 0)]
    assert store.list("segments") == keys[::3]
    RemoteWal(store).delete_segments(7, set())          # a seal of no segments: all go
    assert store.list("segments") == []


def test_a_flush_deletes_a_batch_of_many_segments_in_a_bounded_number_of_requests(
        tmp_path, monkeypatch):
    """End to end (stage, seal, pull, flush, retention): the requests that delete do not grow
    with the batch's segments."""
    import wal.remote as remote_module

    stores = []

    def counting_open(uri):
        stores.append(CountingStore(LocalStore(uri[len("file:"):])))
        return stores[-1]

    monkeypatch.setattr(remote_module, "open_store", counting_open)
    s = Stream(tmp_path)
    refs = [s.stage(0, p, 1, p) for p in range(60)]
    refs.append(s.stage(0, 0, 1, 0, attempt=1))          # a losing attempt
    s.seal(0, refs[:60])
    s.commit(0)
    assert s.flush().replayed == [0]
    assert s.store.list("segments") == []
    deletes = [d for store in stores for d in store.deletes]
    assert not [d for d in deletes if d[0] == "delete" and d[1].startswith("segments/")]
    assert len([d for d in deletes if d[1].startswith("segments/")]) <= 3, deletes


def test_recover_on_a_local_wal_beside_a_run_it_cannot_see_discards_nothing_without_force(
        tmp_path, monkeypatch, capsys):
    """The lock recover takes is the flusher's: a live run whose flusher has not started yet
    (its first batch still staging) holds none. recover took the run's batch in flight for one
    Spark never commits and discarded it, segments and all (the simulation's operators, seed
    154). Now it leaves what Spark has not committed, as on a store; --force discards it."""
    from recovery.cli.main import main
    from tests.helpers.walfactory import WalFactory

    monkeypatch.setattr("recovery.cli.recover_cmd.replay_wal", _replaying(monkeypatch))
    cp = tmp_path / "cp"
    with WalFactory(tmp_path / "wal", checkpoint=cp,
                    target={"fingerprint": "f", "target": _target_fields(str(cp))}) as f:
        f.sealed(0, rows=(3,))
        live = f.staged(1, rows=(2,))                # the live run's batch, still staging
    wal = f.wal
    assert main(["recover", wal.root, "--checkpoint", str(cp)]) == 0
    err = capsys.readouterr().err
    assert "left batch 1" in err and "--force" in err
    assert sorted(i for _, _, ids in WRITES for i in ids) == [0, 1, 2]
    assert all(os.path.exists(wal.segment_path(s.name)) for s in live.segments)
    assert main(["recover", wal.root, "--checkpoint", str(cp), "--force"]) == 0
    assert not any(os.path.exists(wal.segment_path(s.name)) for s in live.segments)


# -- a scale-out writer on a store: the tasks read the segments there, the driver fetches none --
def tasks_on_the_store(s: Stream):
    from recovery.executors import ExecutorsWriter
    from tests.helpers.flush_fakes import LocalJob, recording_upserter, target

    return ExecutorsWriter(LocalJob(), s.wal.root, target, open_upserter=recording_upserter,
                           store_uri=s.uri)


def working_copy_segments(s: Stream) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), s.wal.segments)
                  for d, _, files in os.walk(s.wal.segments) for f in files)


def test_tasks_that_read_the_store_get_every_row_and_no_segment_reaches_the_driver(tmp_path):
    """Before, the driver pulled every segment into its working copy and copied every row
    into its log, then the tasks read the same segments from the store."""
    from wal import format as fmt

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3)])
    s.commit(0)
    s.seal(1, [s.stage(1, 0, 4, 100)])        # sealed, never committed: waits
    wal_log = WalLog.open_writer(s.wal)
    try:
        report = Replayer(s.wal, wal_log, None, s.checkpoint,
                          writer=tasks_on_the_store(s)).run(RecoveryPolicy.QUERY_FLUSHER)
        assert report.replayed == [0] and report.waiting_at == 1
        assert sorted(i for _, _, ids in WRITES for i in ids) == [0, 1, 2, 3, 4]
        assert working_copy_segments(s) == []            # not one segment fetched
        assert s.wal.staged_batch_ids() == [1]           # yet the copy sees what is staged
        assert not wal_log.get(0).rows_in_log
        assert not [k for k in wal_log._db.keys(from_key=b"r/") if k.startswith(b"r/")]
    finally:
        wal_log.close()
    assert s.store.list("segments") == [k for k in s.store.list("segments")
                                         if "/" + fmt.batch_name(1) + "/" in "/" + k]


def test_the_drivers_writer_takes_over_a_store_batch_the_tasks_began(tmp_path):
    """Spark stopped after the tasks wrote part of a batch: the driver's writer fetches the
    segments then, copies the rows into its log and writes only what is not acknowledged."""
    from recovery.replay import DriverWriter
    from tests.helpers.flush_fakes import FAIL_IDS

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3), s.stage(0, 2, 2, 5)])
    s.commit(0)
    FAIL_IDS.add(3)                                         # segment 1 fails
    wal_log = WalLog.open_writer(s.wal)
    try:
        replayer = Replayer(s.wal, wal_log, lambda seal: RecordingUpserter(), s.checkpoint,
                            writer=tasks_on_the_store(s))
        with pytest.raises(Exception):
            replayer.run(RecoveryPolicy.QUERY_FLUSHER)
        assert working_copy_segments(s) == [] and wal_log.get(0).acknowledged == ((2, 2),)
        first = len(WRITES)
        FAIL_IDS.clear()
        report = replayer.run(RecoveryPolicy.QUERY_FLUSHER,
                              writer=DriverWriter(lambda seal: RecordingUpserter()))
        assert report.replayed == [0] and wal_log.get(0).rows_in_log
        assert sorted(i for _, _, ids in WRITES[first:] for i in ids) == [3, 4]
    finally:
        wal_log.close()


def test_a_batch_another_host_flushed_since_is_marked_here_not_blocked_on_its_gone_segments(
        tmp_path):
    """Simulation seed 2967: host A's tasks began batch 0 (its log holds the seal alone), then
    `cassandra-wal recover` on host B wrote it whole and removed its segments from the
    store. Host A, started again, found a FLUSHING batch whose segments are gone and blocked
    on corruption; the store's flushed marker says it is written."""
    from recovery.replay import DriverWriter
    from tests.helpers.flush_fakes import FAIL_IDS

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3)])
    s.commit(0)
    host_a = s.wal
    FAIL_IDS.add(3)
    wal_log = WalLog.open_writer(host_a)
    try:
        with pytest.raises(Exception):
            Replayer(host_a, wal_log, None, s.checkpoint,
                     writer=tasks_on_the_store(s)).run(RecoveryPolicy.QUERY_FLUSHER)
    finally:
        wal_log.close()
    FAIL_IDS.clear()
    s.host("host-b")
    assert s.flush().replayed == [0]                      # host B's recover: every row
    assert s.store.list("segments") == []
    WRITES.clear()
    s.wal = host_a
    wal_log = WalLog.open_writer(host_a)
    try:
        report = Replayer(host_a, wal_log, None, s.checkpoint,
                          writer=DriverWriter(lambda seal: RecordingUpserter())
                          ).run(RecoveryPolicy.QUERY_START)
        assert wal_log.get(0).state is BatchState.FLUSHED and report.replayed == []
        assert WRITES == []
    finally:
        wal_log.close()


def test_a_batch_another_host_finishes_while_the_tasks_read_it_is_marked_not_blocked(tmp_path):
    """The review of the change above: host A's tasks are about to read batch 0 from the store
    when `cassandra-wal recover` on host B writes it whole and removes its segments. Host A's
    tasks found them missing and the sink blocked on corruption (the query's next commit
    failed) though the store's flushed marker said the batch was written."""
    from recovery.executors import ExecutorsWriter
    from tests.helpers.flush_fakes import LocalJob, recording_upserter, target

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3)])
    s.commit(0)
    host_a = s.wal

    class OvertakenJob(LocalJob):
        def __call__(self, batch, tasks, fn):
            s.host("host-b")
            assert s.flush(RecoveryPolicy.QUERY_FLUSHER).replayed == [0]     # B writes it whole
            s.wal = host_a
            return super().__call__(batch, tasks, fn)

    writer = ExecutorsWriter(OvertakenJob(), host_a.root, target,
                             open_upserter=recording_upserter, store_uri=s.uri)
    wal_log = WalLog.open_writer(host_a)
    try:
        report = Replayer(host_a, wal_log, None, s.checkpoint, writer=writer).run(
            RecoveryPolicy.QUERY_FLUSHER)
        assert report.replayed == [] and wal_log.get(0).state is BatchState.FLUSHED
        assert host_a.read_blocked() is None and s.store.read("blocked.json") is None
    finally:
        wal_log.close()


def test_a_segment_lost_from_the_store_still_blocks_naming_it(tmp_path):
    """The same missing segment with no flusher having written the batch: real damage."""
    from recovery.errors import RecoveryBlocked

    s = Stream(tmp_path)
    ref = s.stage(0, 1, 2, 3)
    s.seal(0, [s.stage(0, 0, 3, 0), ref])
    s.commit(0)
    s.store.delete(f"segments/{ref.name}")
    wal_log = WalLog.open_writer(s.wal)
    try:
        with pytest.raises(RecoveryBlocked) as info:
            Replayer(s.wal, wal_log, None, s.checkpoint,
                     writer=tasks_on_the_store(s)).run(RecoveryPolicy.QUERY_FLUSHER)
        assert ref.name in str(info.value) and wal_log.get(0).state is BatchState.FLUSHING
        assert "wal.flush.mode=driver" not in str(info.value)
    finally:
        wal_log.close()


def test_verify_and_dump_of_a_scale_out_working_copy_read_its_segments_from_the_store(
        tmp_path, capsys):
    """The review of the change above: a working copy whose tasks read the store holds no
    segment; `verify` and `dump` of its folder reported a healthy batch as corrupted (exit
    3). They read the store's objects for it now, without writing to the working copy."""
    import json as json_

    from recovery.cli.main import main
    from tests.helpers.flush_fakes import FAIL_IDS

    s = Stream(tmp_path)
    s.seal(0, [s.stage(0, 0, 3, 0), s.stage(0, 1, 2, 3)])
    s.commit(0)
    FAIL_IDS.add(3)                          # the drain stops part-way: batch 0 FLUSHING
    wal_log = WalLog.open_writer(s.wal)
    try:
        with pytest.raises(Exception):
            Replayer(s.wal, wal_log, None, s.checkpoint,
                     writer=tasks_on_the_store(s)).run(RecoveryPolicy.QUERY_FLUSHER)
    finally:
        wal_log.close()
    assert working_copy_segments(s) == []
    capsys.readouterr()
    assert main(["verify", s.wal.root]) == 0
    assert main(["dump", s.wal.root, "--batch", "0"]) == 0
    rows = [json_.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3, 4]
    assert working_copy_segments(s) == []
