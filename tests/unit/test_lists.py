"""Non-frozen list columns (issue 30, item 1).

Cassandra keeps each element of a non-frozen list in a cell of its own, named by a time-based
id the node picks at each write: ``INSERT ... l = ['a', 'b'] USING TIMESTAMP 1000`` run twice
leaves ``['a', 'b', 'a', 'b']`` (measured on 5.0.8; CASSANDRA-11368). This sink writes a row
again on purpose (cassandra-driver's retry after a timeout, a replay after a crash, a flush task run
again), so such a column is refused before anything is staged unless the user accepts
at-least-once for it (``wal.lists.atLeastOnce``). Sets, maps and frozen collections are
idempotent (a set's or map's cell is named by its element or key; a frozen collection is one
cell), and so is a non-frozen UDT (a cell per field, and Cassandra refuses a non-frozen
collection inside it). The opt-in is recorded in each batch's seal.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pyarrow as pa
import pytest
from cassandra import OperationTimedOut
from pyspark.sql import types as T

import recovery.cql.connection
import recovery.cql.table
from recovery import output
from recovery.config import SinkConfig
from recovery.cql.config import WriteConfig
from recovery.cql.errors import OptionError, SchemaError
from recovery.cql.table import TableSchema
from recovery.flusher import QueryFlusher
from recovery.recover import replay_wal
from recovery.target import RecordedTarget, Target
from sinks.worker import plan
from sinks.worker.options import parse_options
from sinks.worker.validation import validate_schema
from tests.helpers.fake_cassandra import FakeCluster, Metadata
from tests.helpers.walfactory import WalFactory
from wal.layout import WalDir
from wal.recovery_policy import RecoveryPolicy
from wal.seal import Seal, decode_seal, encode_seal
from wal.sealed_write import SealedWrite
from wal.states import BatchState

pytestmark = pytest.mark.unit

OPTION = "wal.lists.atLeastOnce"
WITH_LIST = ("withlist", (("name", "text"), ("l", "list<text>")))  # as cassandra-driver reports it
WITH_FROZEN_LIST = ("withflist", (("name", "text"), ("l", "frozen<list<text>>")))
TABLE = TableSchema(
    "ks", "t",
    (("k", "int"), ("l", "list<text>"), ("fl", "frozen<list<text>>"), ("st", "set<text>"),
     ("m", "map<text, int>"), ("ml", "map<text, frozen<list<int>>>"),
     ("tl", "frozen<tuple<int, list<text>>>"), ("u", "frozen<withlist>"), ("nu", "withflist"),
     ("v", "text"), ("other", "list<int>")),
    ("k",), user_types=(WITH_LIST, WITH_FROZEN_LIST))
TEXTS = T.ArrayType(T.StringType())
UDT = T.StructType([T.StructField("name", T.StringType()), T.StructField("l", TEXTS)])
SPARK = {"k": T.IntegerType(), "l": TEXTS, "fl": TEXTS, "st": TEXTS,
         "m": T.MapType(T.StringType(), T.IntegerType()),
         "ml": T.MapType(T.StringType(), T.ArrayType(T.IntegerType())),
         "tl": T.StructType([T.StructField("_1", T.IntegerType()), T.StructField("_2", TEXTS)]),
         "u": UDT, "nu": UDT, "v": T.StringType(), "other": T.ArrayType(T.IntegerType())}


def df(*names: str) -> T.StructType:
    return T.StructType([T.StructField(n, SPARK[n.lower()]) for n in ("k",) + names])


def opted(*columns: str) -> WriteConfig:
    return WriteConfig(lists_at_least_once=columns)


# -- validation ---------------------------------------------------------------------------------

def test_a_non_frozen_list_column_is_refused_naming_the_remedies():
    with pytest.raises(SchemaError) as info:
        validate_schema(df("v", "l"), TABLE, WriteConfig())
    assert info.value.column == "l"
    reason = info.value.reason
    for remedy in ("frozen<list<text>>", "set<text>", f"{OPTION}=l"):
        assert remedy in reason, reason
    assert "list<text>" in reason and "replay" in reason


@pytest.mark.parametrize("column", ["fl", "st", "m", "ml", "tl", "u", "nu"], ids=[
    "frozen-list", "set", "map", "frozen-lists-in-a-map", "list-in-a-tuple",
    "list-in-a-frozen-udt", "frozen-list-in-a-non-frozen-udt"])
def test_frozen_lists_sets_maps_and_lists_inside_frozen_types_are_accepted(column):
    assert validate_schema(df(column), TABLE, WriteConfig()) == ["k", column]


def test_the_opt_in_lets_the_named_list_columns_through_and_no_other():
    assert validate_schema(df("l", "v"), TABLE, opted("l")) == ["k", "l", "v"]
    assert validate_schema(df("L"), TABLE, opted("l")) == ["k", "L"]       # the table's name
    assert validate_schema(df("l"), TABLE, opted("L")) == ["k", "l"]       # matched as columns are
    with pytest.raises(SchemaError) as info:
        validate_schema(df("l", "other"), TABLE, opted("l"))
    assert info.value.column == "other" and f"{OPTION}=l,other" in info.value.reason


def test_a_list_column_the_dataframe_does_not_write_is_not_refused():
    assert validate_schema(df("v"), TABLE, WriteConfig()) == ["k", "v"]
    assert validate_schema(df("v"), TABLE, opted("l", "other")) == ["k", "v"]


@pytest.mark.parametrize("named, why", [
    ("v", "text, not a non-frozen list"),
    ("fl", "frozen<list<text>>, not a non-frozen list"),
    ("st", "set<text>, not a non-frozen list"),
    ("nope", "not a column of ks.t"),
])
def test_the_opt_in_naming_anything_but_a_non_frozen_list_column_is_refused(named, why):
    with pytest.raises(OptionError) as info:
        validate_schema(df("l"), TABLE, opted("l", named))
    assert info.value.option == OPTION and named in str(info.value), str(info.value)
    assert why in info.value.reason, info.value.reason


def test_the_option_is_comma_separated_column_names():
    base = {"keyspace": "ks", "table": "t"}
    assert parse_options(base).write.lists_at_least_once == ()
    assert parse_options({**base, OPTION.lower(): " l , Other,l "}).write.lists_at_least_once \
        == ("l", "Other")
    assert parse_options({**base, OPTION: "l,,other,"}).write.lists_at_least_once == ("l", "other")
    for bad in ("", " , "):
        with pytest.raises(OptionError) as info:
            parse_options({**base, OPTION: bad})
        assert info.value.option == OPTION


# -- the seal records it ------------------------------------------------------------------------

def target(*opted_in: str, columns=("k", "l")) -> Target:
    return Target(SinkConfig("ks", "t", write=opted(*opted_in)), TABLE, columns)


def test_the_seal_records_the_opt_in_and_a_replay_writes_as_sealed():
    record = target("l").write_record()
    assert record.lists_at_least_once == ("l",)
    seal = decode_seal(encode_seal(Seal(3, (), 1, write=record)), "s")   # through JSON
    restarted = target()                                                  # the option dropped
    assert restarted.as_sealed(seal.write).config.write.lists_at_least_once == ("l",)
    assert target("l").as_sealed(target().write_record()).config.write == WriteConfig()


def test_a_seal_written_before_the_option_existed_opts_nothing_in():
    earlier = SealedWrite.from_dict({k: v for k, v in target().write_record().to_dict().items()
                                     if k != "lists_at_least_once"})
    assert target("l").as_sealed(earlier).config.write.lists_at_least_once == ()


def test_a_query_upgraded_with_a_list_column_is_refused_at_its_next_batch(tmp_path, monkeypatch):
    """The release before this one let the list through and recorded the query's target with
    the fingerprint of its options, which knew no opt-in. The fingerprint of the same options
    differs now, so the next batch validates the DataFrame again, and is refused."""
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    options = {"keyspace": "ks", "table": "t", "checkpointLocation": str(cp)}
    config = parse_options(options)
    earlier = config.public_dict()
    earlier["write"].pop("lists_at_least_once", None)
    earlier_config = SimpleNamespace(public_dict=lambda: earlier)
    recorded = Target(config, TABLE, ("k", "l")).to_dict()
    recorded["config"]["write"].pop("lists_at_least_once", None)
    wal = WalDir(str(cp / plan.DEFAULT_STREAM_WAL)).create()
    RecordedTarget(recorded, plan._fingerprint(earlier_config, df("l").json()),
                   str(cp)).write(wal)
    assert RecordedTarget.read(wal).target.config.write.lists_at_least_once == ()

    looked_up = []
    cluster = FakeCluster(Metadata(cluster_name="Test Cluster"))
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda connection: (cluster, None))
    monkeypatch.setattr(recovery.cql.table, "fetch_table_schema",
                        lambda c, ks, t: looked_up.append(t) or TABLE)
    with pytest.raises(SchemaError) as info:
        plan.prepare_write(options, {}, df("l"), streaming=True)
    assert info.value.column == "l" and looked_up == ["t"]
    assert wal.staged_batch_ids() == [] and wal.sealed_batch_ids() == []


# -- batches an earlier release sealed with a list column -----------------------------------------

EARLIER = TableSchema("ks", "t", (("id", "bigint"), ("tags", "list<text>"), ("name", "text")),
                      ("id",))
#: The write record of the release before wal.lists.atLeastOnce: no opt-in recorded.
EARLIER_RECORD = {"columns": ["id", "tags"], "ttl_seconds": None, "ttl_column": None,
                  "writetime_micros": None, "writetime_column": None, "ignore_nulls": False}


def tagged_rows(n: int, start: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "tags": pa.array([["a", "b"]] * n, pa.list_(pa.string()))})


class Node:
    """The fake Cassandra of these tests: what was written, and a timeout to raise once."""

    def __init__(self, fail_at: tuple[int, int] | None = None):
        self.written: list[tuple[int, list[int]]] = []
        self.fail_at = fail_at                      # (batch, chunks written before it)

    def upserter(self, session, table, columns, write, *args, **kwargs):
        node = self

        class Upserter:
            def write_chunks(self, chunks, batch_id, **_):
                for rb, _first_ts, tag in chunks:
                    done = sum(1 for b, _ in node.written if b == batch_id)
                    if node.fail_at == (batch_id, done):
                        node.fail_at = None
                        raise OperationTimedOut(last_host="node")
                    node.written.append((batch_id, rb.column("id").to_pylist()))
                    yield tag

        return Upserter()


@pytest.fixture
def flusher_log():
    """The records of the flusher's log (``cassandra_wal``; it may not propagate to pytest's
    handler once ``sinks.register`` made it visible)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("cassandra_wal")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def earlier_wal(tmp_path, record: dict | None) -> Target:
    """A WAL an earlier release left: batches 0 and 1 write the list without an opt-in
    recorded (``record``), batch 2 with one; all sealed, Spark committed them."""
    cp = tmp_path / "cp"
    earlier = Target(SinkConfig("ks", "t", checkpoint_location=str(cp)), EARLIER, ("id", "tags"))
    recorded = earlier.to_dict()
    recorded["config"]["write"].pop("lists_at_least_once")
    with WalFactory(tmp_path / "wal", checkpoint=cp,
                    target={"fingerprint": "earlier", "target": recorded}) as f:
        f.sealed(0, rows=[tagged_rows(4, 0)], chunk_rows=1, write=record)
        f.sealed(1, rows=[tagged_rows(2, 10)], chunk_rows=1, write=record)
        f.sealed(2, rows=[tagged_rows(2, 20)],                    # opted in: nothing to say
                 write=dict(EARLIER_RECORD, lists_at_least_once=["tags"]))
    return earlier


def fake_node(monkeypatch, fail_at=None) -> Node:
    node = Node(fail_at)
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda connection: (
        FakeCluster(), SimpleNamespace(execute=lambda cql, parameters=None: [])))
    monkeypatch.setattr(output, "Upserter", node.upserter)
    return node


def list_warnings(records) -> list[str]:
    return [r.getMessage() for r in records if "wal.lists.atLeastOnce" in r.getMessage()]


@pytest.mark.parametrize("record", [EARLIER_RECORD, None], ids=["earlier-release", "first-release"])
def test_a_batch_sealed_with_a_list_column_by_an_earlier_release_drains_with_one_warning(
        tmp_path, monkeypatch, flusher_log, record):
    """After the upgrade, recovery at query start (which validates nothing) writes what the
    earlier release sealed and Spark committed: lists and all, at least once, saying so once per
    batch, whichever drain writes it and however many chunks it has."""
    cp = tmp_path / "cp"
    earlier_wal(tmp_path, record)
    node = fake_node(monkeypatch, fail_at=(0, 2))
    flusher = QueryFlusher(str(tmp_path / "wal"), str(cp), retry_interval_s=0.01)
    try:
        flusher.recover()                    # the query's start: batch 0 half written
        assert isinstance(flusher.last_error, OperationTimedOut)
        flusher.drain(RecoveryPolicy.QUERY_FLUSHER)    # the rest
        assert flusher.last_error is None
        assert [r.state for r in flusher.wal_log.records()] == [BatchState.FLUSHED] * 3
    finally:
        flusher.stop()
    assert sorted(i for _, ids in node.written for i in ids) == [0, 1, 2, 3, 10, 11, 20, 21]
    warnings = list_warnings(flusher_log)
    assert len(warnings) == 2, warnings
    for batch, text in zip((0, 1), warnings):
        assert f"batch {batch} " in text and "'tags'" in text and "at least once" in text, text


def test_cassandra_wal_recover_writes_such_a_wal_with_the_same_warning(
        tmp_path, monkeypatch, flusher_log):
    target = earlier_wal(tmp_path, EARLIER_RECORD)
    node = fake_node(monkeypatch)
    report = replay_wal(WalDir(str(tmp_path / "wal")), str(tmp_path / "cp"), target,
                        policy=RecoveryPolicy.OFFLINE)
    assert report.replayed == [0, 1, 2] and len(node.written) == 7
    assert [w.split(" writes ")[0].rsplit(": ", 1)[1] for w in list_warnings(flusher_log)] \
        == ["batch 0", "batch 1"]
