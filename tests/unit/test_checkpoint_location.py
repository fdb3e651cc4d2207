"""Where a checkpoint is (wal/checkpoint.py: ``Filesystems``), as Spark resolves it, and the
sink's refusal of one it cannot read (sinks/worker/plan.py), before anything is staged.

Issue 17, item 5: with HDFS as Spark's default filesystem, a checkpoint given without a
scheme is ``hdfs://...`` to Spark; the sink used it as a local folder, so nothing was ever
flushed and ``cassandra-wal recover`` discarded the batches."""

from __future__ import annotations

import getpass
import json
import os

import pytest

from recovery.cql.errors import OptionError
from sinks.worker.options import parse_options
from sinks.worker.plan import prepare_write, resolve_wal_root
from wal.pointer import POINTER_FILE, read_pointer
from tests.helpers.walfactory import WalFactory
from wal import checkpoint as ckpt
from wal.checkpoint import Filesystems, NotLocal
from recovery.cli.main import main
from wal.seal import COMMIT_POINT_CHECKPOINT

pytestmark = pytest.mark.unit

HDFS = Filesystems("hdfs://nn:8020", working_dir="/home/etl")
LOCAL = Filesystems("file:///", working_dir="/home/etl")


# -- resolution ----------------------------------------------------------------------------

def test_no_scheme_on_a_hdfs_default_is_hdfs():
    loc = HDFS.resolve("/data/cp")
    assert (loc.uri, loc.local) == ("hdfs://nn:8020/data/cp", None)
    with pytest.raises(NotLocal) as info:
        HDFS.local_path("/data/cp")
    assert info.value.uri == "hdfs://nn:8020/data/cp"


def test_no_scheme_on_the_local_default_is_local():
    assert LOCAL.resolve("/data/cp") == ckpt.Location("file:/data/cp", "/data/cp")
    assert Filesystems("file:/").local_path("/data/cp/") == "/data/cp"


@pytest.mark.parametrize("uri", ["file:///data/cp", "file:/data/cp", "FILE:///data/cp",
                                 "file://localhost/data/cp"])
def test_explicit_file_uris_are_local_whatever_the_default(uri):
    assert HDFS.resolve(uri) == ckpt.Location("file:/data/cp", "/data/cp")


@pytest.mark.parametrize("uri,spark_uri", [
    ("hdfs://other:9000/cp", "hdfs://other:9000/cp"),
    ("s3a://bucket/cp", "s3a://bucket/cp"),
    ("hdfs:/cp", "hdfs://nn:8020/cp"),        # Hadoop takes the default's authority
])
def test_explicit_remote_uris_are_not_local(uri, spark_uri):
    assert HDFS.resolve(uri) == ckpt.Location(spark_uri, None)
    with pytest.raises(NotLocal):
        HDFS.local_path(uri)


def test_a_relative_path_is_under_the_working_directory_of_its_filesystem(monkeypatch):
    assert LOCAL.resolve("cp/q1") == ckpt.Location("file:/home/etl/cp/q1", "/home/etl/cp/q1")
    # Hadoop's remote filesystems start in /user/<user>, as Spark's URI then says.
    monkeypatch.delenv("HADOOP_USER_NAME", raising=False)
    assert HDFS.resolve("cp/q1").uri == f"hdfs://nn:8020/user/{getpass.getuser()}/cp/q1"
    monkeypatch.setenv("HADOOP_USER_NAME", "etl")
    assert HDFS.resolve("cp/q1").uri == "hdfs://nn:8020/user/etl/cp/q1"


def test_without_a_working_directory_this_process_is_used(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Filesystems().local_path("cp") == str(tmp_path / "cp")


def test_the_module_local_path_keeps_reading_what_spark_resolved():
    assert ckpt.local_path("file:/data/cp") == "/data/cp"      # resolvedCheckpointRoot
    with pytest.raises(NotLocal):
        ckpt.local_path("hdfs://nn:8020/data/cp")


# -- the sink refuses before anything is staged --------------------------------------------

def _config(**options):
    return parse_options(dict({"keyspace": "ks", "table": "t"}, **options), {})


def test_a_stream_checkpoint_on_hdfs_is_the_store_spark_uses_and_so_is_its_wal():
    """Issue 19: a checkpoint on HDFS (or S3) is read there; its WAL defaults to beside it."""
    assert resolve_wal_root(_config(checkpointLocation="/data/cp"), True, HDFS) == \
        "hdfs://nn:8020/data/cp/cassandra_wal"
    assert resolve_wal_root(_config(checkpointLocation="s3a://b/cp"), True, HDFS) == \
        "s3a://b/cp/cassandra_wal"
    assert resolve_wal_root(_config(checkpointLocation="/data/cp", **{"wal.path": "file:///w"}),
                            True, HDFS) == "/w"


@pytest.mark.parametrize("location", ["abfss://c@acct.dfs.core.windows.net/cp", "gs://b/cp",
                                      "dbfs:/cp"])
def test_a_checkpoint_on_a_filesystem_the_sink_cannot_reach_is_refused_naming_the_uri(location):
    with pytest.raises(OptionError) as info:
        resolve_wal_root(_config(checkpointLocation=location), True, HDFS)
    err = info.value
    assert err.option == "checkpointLocation" and err.value == location
    text = str(err)
    assert "fs.defaultFS" in text and "hdfs://" in text and "s3a://" in text


def test_a_batch_job_wal_path_on_hdfs_is_refused():
    with pytest.raises(OptionError) as info:
        resolve_wal_root(_config(**{"wal.path": "/data/wal"}), False, HDFS, "j1")
    assert info.value.option == "wal.path"
    assert "hdfs://nn:8020/data/wal" in str(info.value)


def test_a_stream_wal_on_a_store_flushes_from_executors_too():
    # Refused until the flush tasks read their segments from the store (recovery/executors.py).
    root = resolve_wal_root(_config(checkpointLocation="s3a://b/cp",
                                    **{"wal.flush.mode": "executors"}), True, HDFS)
    assert root == "s3a://b/cp/cassandra_wal"


def test_a_stream_needs_a_checkpoint_location_even_with_a_wal_path():
    # The driver's flusher finds a query's WAL through its checkpoint: a stream with wal.path
    # and no checkpointLocation option staged and sealed batches that were never flushed.
    with pytest.raises(OptionError) as info:
        resolve_wal_root(_config(**{"wal.path": "/w"}), True, Filesystems())
    assert info.value.option == "checkpointLocation"


def test_local_locations_resolve_as_before(tmp_path):
    cp = str(tmp_path / "cp")
    assert resolve_wal_root(_config(checkpointLocation=cp), True, Filesystems()) == \
        os.path.join(cp, "cassandra_wal")
    assert resolve_wal_root(_config(checkpointLocation="file://" + cp), True, HDFS) == \
        os.path.join(cp, "cassandra_wal")
    assert resolve_wal_root(_config(**{"wal.path": "file://" + cp}), False, HDFS, "j1") == \
        os.path.join(cp, "jobs", "j1")


def test_prepare_write_refuses_before_creating_anything(tmp_path):
    from pyspark.sql.types import IntegerType, StructField, StructType

    schema = StructType([StructField("id", IntegerType())])
    cp = tmp_path / "cp"
    with pytest.raises(OptionError, match="checkpointLocation"):
        prepare_write({"keyspace": "ks", "table": "t", "checkpointlocation": str(cp)}, {},
                      schema, streaming=True, filesystems=Filesystems("gs://bucket"))
    assert os.listdir(tmp_path) == []     # no WAL, no pointer: nothing staged anywhere


def test_the_listener_finds_no_wal_for_a_checkpoint_on_another_filesystem(tmp_path):
    """Queries of other sinks may checkpoint where this sink cannot read: not ours."""
    assert read_pointer("gs://bucket/data/cp") is None
    (tmp_path / POINTER_FILE).write_text(json.dumps({"wal_path": "/w"}))
    assert read_pointer("file:" + str(tmp_path)) == "/w"


# -- cassandra-wal recover: a usage error, never "discard" ---------------------------------

def _recover(capsys, *argv):
    capsys.readouterr()
    code = main(["recover", *map(str, argv)])
    return code, capsys.readouterr().err


def _stream_wal(tmp_path, checkpoint_location):
    factory = WalFactory(tmp_path / "wal", target={"checkpoint_location": checkpoint_location})
    factory.sealed(0, committed=None, commit_point=COMMIT_POINT_CHECKPOINT)
    return factory.wal


@pytest.fixture
def unreachable_stores(monkeypatch):
    """S3 and HDFS that answer nothing, at once (no retries, no instance metadata)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "none")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "none")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("CASSANDRA_WAL_WEBHDFS", "http://127.0.0.1:1")


@pytest.mark.parametrize("given", ["hdfs://nn:8020/data/cp", "s3a://bucket/cp"])
def test_recover_with_an_unreachable_checkpoint_changes_nothing(tmp_path, capsys, given,
                                                                unreachable_stores):
    """Issue 19: recover reads a checkpoint on HDFS or S3 through the store (it refused any
    before); one it cannot reach is an error naming it, and nothing is discarded."""
    pytest.importorskip("boto3")
    wal = _stream_wal(tmp_path, None)
    code, err = _recover(capsys, wal.root, "--checkpoint", given)
    assert code == 1, err
    assert "127.0.0.1:1" in err and "nothing was changed" in err
    assert wal.sealed_batch_ids() == [0]


def test_recover_with_a_recorded_checkpoint_no_store_reaches_is_a_usage_error(tmp_path, capsys):
    wal = _stream_wal(tmp_path, "gs://bucket/data/cp")
    code, err = _recover(capsys, wal.root, "--dry-run")
    assert code == 2 and "target.json" in err and "gs://bucket/data/cp" in err
    assert "nothing was changed" in err and wal.sealed_batch_ids() == [0]


def test_recover_refuses_a_local_folder_spark_never_wrote(tmp_path, capsys):
    """What the earlier release left when Spark's checkpoint was on HDFS: a local folder of
    the same name holding only the sink's pointer. Its missing commits/ is no evidence that
    Spark never committed the batches."""
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / POINTER_FILE).write_text(json.dumps({"wal_path": str(tmp_path / "wal")}))
    wal = _stream_wal(tmp_path, str(cp))
    code, err = _recover(capsys, wal.root)
    assert code == 2 and "is not a Spark checkpoint" in err and "fs.defaultFS" in err
    assert wal.sealed_batch_ids() == [0]


def test_recover_force_refuses_a_checkpoint_that_does_not_exist(tmp_path, capsys):
    """Issue 34's review: with the query's checkpoint gone, every batch looks uncommitted and
    --force would discard batches Spark committed; without --force they are left."""
    gone = tmp_path / "cp-deleted"
    wal = _stream_wal(tmp_path, str(gone))
    code, err = _recover(capsys, wal.root, "--force")
    assert code == 2 and str(gone) in err and "does not exist" in err
    assert "nothing was changed" in err and wal.sealed_batch_ids() == [0]


def test_recover_refuses_the_checkpoint_of_another_query(tmp_path, capsys):
    """A WAL bound to its query (wal/binding.py): recover given another query's checkpoint
    would record that query's commits as this WAL's for good (m/committed_through) and replay
    batches Spark never committed."""
    from wal.binding import bind
    from wal.log import WalLog

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    # WalFactory seals as the query "test-query".
    for cp, query_id in ((ours, "test-query"), (theirs, "their-query")):
        (cp / "commits").mkdir(parents=True)
        (cp / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for b in range(11):
        (theirs / "commits" / str(b)).write_text("v1\n{}\n")
    wal = _stream_wal(tmp_path, str(ours))
    bind(wal, str(ours))
    code, err = _recover(capsys, wal.root, "--checkpoint", theirs)
    assert code == 2 and str(theirs) in err and str(ours) in err and "nothing was changed" in err
    with WalLog.open_writer(wal) as wal_log:
        assert wal_log.committed_through() == -1
