"""One key, one task (issue 35): a change stream in sealed order whose key has changes in two
tasks of a batch is refused at the commit, before its seal, naming the key and the remedies
(:mod:`sinks.worker.key_order`); its keys as Cassandra tells them apart
(:mod:`recovery.cql.key_identity`). Through real Spark: ``tests/integration/test_change_streams.py``."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid

import numpy as np
import pyarrow as pa
import pytest

from recovery.config import SinkConfig
from recovery.cql.config import WriteConfig
from recovery.cql.convert import row_converter
from recovery.cql.key_identity import key_hashes
from recovery.cql.table import TableSchema
from recovery.target import Target
from sinks.worker.key_order import KeyInTwoTasksError, TaskKeys
from sinks.worker.plan import WritePlan, commit_batch, stage_partition
from wal.layout import WalDir

pytestmark = pytest.mark.unit

TABLE = TableSchema("ks", "t", (("k", "text"), ("c", "int"), ("v", "text")), ("k",), ("c",))
COLUMNS = ("k", "c", "v", "op")


def plan_for(tmp_path, write: WriteConfig) -> WritePlan:
    wal = WalDir(str(tmp_path / "wal")).create()
    config = SinkConfig(keyspace="ks", table="t", write=write)
    target = Target(config, TABLE, ("k", "c", "v"))
    return WritePlan(config=config, wal_root=wal.root, target=target, stored_columns=COLUMNS)


def rows(*values) -> pa.RecordBatch:
    k, c, v, op = zip(*values)
    return pa.record_batch({"k": pa.array(k, pa.string()), "c": pa.array(c, pa.int32()),
                            "v": pa.array(v, pa.string()), "op": pa.array(op, pa.string())})


def run_batch(plan: WritePlan, *tasks: pa.RecordBatch, batch_id: int = 0):
    messages = [stage_partition(plan, [rb], batch_id, partition, 0)
                for partition, rb in enumerate(tasks)]
    return commit_batch(plan, messages, batch_id, commit_point="seal")


STREAM = WriteConfig(op_column="op", partition_delete_values=("P",))


def test_a_key_changed_in_two_tasks_is_refused_before_the_seal_naming_it(tmp_path):
    plan = plan_for(tmp_path, STREAM)
    with pytest.raises(KeyInTwoTasksError) as info:
        run_batch(plan, rows(("a", 1, "x", "c"), ("b", 1, "y", "c")),
                  rows(("c", 1, "z", "u"), ("b", 1, None, "d")))
    message = str(info.value)
    assert "key (k='b', c=1)" in message and "Spark partitions 0 and 1" in message
    assert "batch 0" in message and "`writetime`" in message and "one partition" in message
    assert "on a new checkpoint and table" in message       # the switch is refused otherwise
    assert "a repartition by key after reading does not restore" in message
    assert info.value.partitions == (0, 1)
    assert plan.wal.sealed_batch_ids() == []      # nothing sealed: Spark never commits it


def test_a_key_changed_twice_in_one_task_and_keys_apart_pass(tmp_path):
    plan = plan_for(tmp_path, STREAM)
    seal = run_batch(plan, rows(("a", 1, "x", "c"), ("a", 1, None, "d"), ("a", 2, "w", "u")),
                     rows(("b", 1, "y", "c"), ("b", 1, "y2", "u")))
    assert seal.rows == 5 and plan.wal.sealed_batch_ids() == [0]


@pytest.mark.parametrize("write", [
    WriteConfig(op_column="op", writetime_column="ts"),   # the column decides: no check
    WriteConfig(),                                        # an upsert stream: last sealed wins
], ids=["writetime-column", "no-op-column"])
def test_streams_that_need_no_check_report_no_keys_and_pass(tmp_path, write):
    plan = plan_for(tmp_path, write)
    if write.writetime_column:
        plan = WritePlan(config=plan.config, wal_root=plan.wal_root, target=plan.target,
                         stored_columns=COLUMNS + ("ts",))
    one = rows(("b", 1, "y", "c")).append_column("ts", pa.array([1], pa.int64()))
    two = rows(("b", 1, "z", "u")).append_column("ts", pa.array([2], pa.int64()))
    messages = [stage_partition(plan, [rb], 0, p, 0) for p, rb in enumerate((one, two))]
    assert [m.keys for m in messages] == [None, None]
    commit_batch(plan, messages, 0, commit_point="seal")
    assert plan.wal.sealed_batch_ids() == [0]


def test_a_partition_deleted_in_one_task_and_written_in_another_is_refused(tmp_path):
    plan = plan_for(tmp_path, STREAM)
    with pytest.raises(KeyInTwoTasksError) as info:
        run_batch(plan, rows(("a", 1, "x", "c")), rows(("b", 2, "y", "c"), ("a", None, None, "P")))
    assert info.value.kind == "partition-delete" and info.value.partitions == (1, 0)
    assert "partition (k='a') is deleted in one task and written in another" in str(info.value)
    assert plan.wal.sealed_batch_ids() == []


def test_rows_of_one_partition_in_two_tasks_pass_without_partition_deletes(tmp_path):
    plan = plan_for(tmp_path, STREAM)
    run_batch(plan, rows(("a", 1, "x", "c")), rows(("a", 2, "y", "c"), ("b", None, None, "P")))
    assert plan.wal.sealed_batch_ids() == [0]


def test_keys_are_told_apart_as_cassandra_stores_them():
    table = TableSchema("ks", "t", (("ts", "timestamp"), ("id", "uuid"), ("n", "bigint")),
                        ("ts",), ("id", "n"))
    columns = ("ts", "id", "n")
    u = uuid.uuid4()
    batch = pa.record_batch({
        # a timestamp keeps milliseconds: the first two are one key
        "ts": pa.array([1_000_001, 1_000_999, 1_001_000, 1_000_001], pa.timestamp("us")),
        # a uuid in any case of its letters is one uuid
        "id": pa.array([str(u), str(u).upper(), str(u), str(u)], pa.string()),
        "n": pa.array([7, 7, 7, 8], pa.int64())})
    hashed = key_hashes(batch, columns, row_converter(table, columns))
    assert hashed[0] == hashed[1]
    assert len({int(h) for h in hashed}) == 3


def test_a_key_hashes_alike_in_every_process():
    """Tasks run in other processes (Python's own string hash differs between them)."""
    code = ("import pyarrow as pa; from recovery.cql.convert import row_converter; "
            "from recovery.cql.key_identity import key_hashes; from recovery.cql.table import TableSchema; "
            "t = TableSchema('ks', 't', (('k', 'text'), ('c', 'int')), ('k',), ('c',)); "
            "b = pa.record_batch({'k': pa.array(['é', 'b']), 'c': pa.array([1, 2], pa.int32())}); "
            "print(' '.join(str(int(h)) for h in key_hashes(b, ('k', 'c'), "
            "row_converter(t, ('k', 'c')))))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(runs) == 1 and len(next(iter(runs)).split()) == 2


def test_task_keys_travel_as_bytes():
    keys = TaskKeys(np.array([1, 2**64 - 1], np.uint64), np.array([5], np.uint64),
                    np.array([], np.uint64), np.array([7, 9], np.uint64))
    back = TaskKeys.from_bytes(keys.to_bytes())
    assert [a.tolist() for a in (back.rows, back.partitions, back.deleted, back.statics)] == \
        [[1, 2**64 - 1], [5], [], [7, 9]]


def test_text_hashes_are_the_bytes_polynomial_wherever_arrow_keeps_the_value():
    """The vectorised text hash against its definition, value by value: empty values between
    others, nulls, a slice of an array (offsets not from 0), large strings, non-ASCII."""
    from recovery.cql.key_identity import _BASE, _GOLDEN, _bytes_hashes, _mix

    def reference(value: bytes) -> int:
        total = 0
        for byte in value:
            total = (total * int(_BASE) + byte) % 2**64
        return int(_mix(np.array([total ^ (len(value) * int(_GOLDEN)) % 2**64], np.uint64))[0])

    values = ["", "a", "", "", "ab", "é" * 40, None, "\x00a", "a", ""]
    whole = pa.array(values, pa.string())
    for array in (whole, whole.slice(3, 5), pa.array(values, pa.large_string())):
        target = pa.large_binary() if array.type == pa.large_string() else pa.binary()
        got = _bytes_hashes(array.cast(target)).tolist()
        want = [reference((v or "").encode()) for v in array.to_pylist()]
        assert got == want
    hashed = _bytes_hashes(whole.cast(pa.binary()))
    assert hashed[1] == hashed[8] and hashed[1] != hashed[7]     # "\x00a" is not "a"


# -- found by an adversarial review: each failed before its fix -------------------------------
def one_key_plan(tmp_path, cql_type: str, write: WriteConfig = STREAM) -> WritePlan:
    wal = WalDir(str(tmp_path / "wal")).create()
    table = TableSchema("ks", "t", (("k", cql_type), ("v", "text")), ("k",), ())
    config = SinkConfig(keyspace="ks", table="t", write=write)
    return WritePlan(config=config, wal_root=wal.root, target=Target(config, table, ("k", "v")),
                     stored_columns=("k", "v", "op"))


def one_key(values, arrow_type=None, ops=None) -> pa.RecordBatch:
    n = len(values)
    return pa.record_batch({"k": pa.array(values, arrow_type), "v": pa.array(["x"] * n),
                            "op": pa.array(ops or ["c"] * n)})


def test_a_date_key_is_hashed(tmp_path):
    """Arrow casts no date32 to int64: every task of such a stream failed."""
    plan = one_key_plan(tmp_path, "date")
    day = dt.date(2024, 1, 1)
    with pytest.raises(KeyInTwoTasksError):
        run_batch(plan, one_key([day], pa.date32()), one_key([day], pa.date32(), ["d"]))
    run_batch(plan, one_key([day], pa.date32()), one_key([dt.date(2024, 1, 2)], pa.date32()),
              batch_id=1)
    assert plan.wal.sealed_batch_ids() == [1]


@pytest.mark.parametrize("cql_type, arrow_type, one, other", [
    ("inet", pa.string(), "::1", "0:0:0:0:0:0:0:1"),
    ("frozen<map<text, int>>", pa.map_(pa.string(), pa.int32()),
     [("a", 1), ("b", 2)], [("b", 2), ("a", 1)]),
    ("frozen<set<int>>", pa.list_(pa.int32()), [8, 0], [0, 8]),
    ("frozen<set<frozen<map<int, int>>>>", pa.list_(pa.map_(pa.int32(), pa.int32())),
     [[(1, 1)], [(2, 2)]], [[(2, 2)], [(1, 1)], [(1, 1)]]),
], ids=["inet-spellings", "map-order", "set-order", "set-of-maps-repeats"])
def test_one_cassandra_key_spelt_two_ways_is_one_key(tmp_path, cql_type, arrow_type, one, other):
    """The value Cassandra stores decides, not the value Spark holds (they passed before)."""
    plan = one_key_plan(tmp_path, cql_type)
    with pytest.raises(KeyInTwoTasksError):
        run_batch(plan, one_key([one], arrow_type), one_key([other], arrow_type, ["d"]))
    assert plan.wal.sealed_batch_ids() == []


def thue_morse(bits: int, letters: str) -> str:
    return "".join(letters[bin(i).count("1") % 2] for i in range(bits))


@pytest.mark.parametrize("one, other", [
    (thue_morse(1024, "ab"), thue_morse(1024, "ba")),        # any odd base
    ("faaafaaaaaalaadbad", "aadhaflcecaafbaaaa"),              # a lattice reduction's pair
], ids=["thue-morse", "short"])
def test_two_keys_with_one_hash_are_two_keys(tmp_path, one, other):
    """The text hash is no cryptographic hash: equal hashes are candidates, and the keys read
    back from the segments decide (both batches were refused before)."""
    from recovery.cql.key_identity import _bytes_hashes
    assert len(set(_bytes_hashes(pa.array([one, other]).cast(pa.binary())).tolist())) == 1
    plan = one_key_plan(tmp_path, "text")
    run_batch(plan, one_key([one]), one_key([other]))
    assert plan.wal.sealed_batch_ids() == [0]


def test_integer_keys_made_to_share_a_hash_are_two_keys(tmp_path):
    from recovery.cql.key_identity import _GOLDEN
    table = TableSchema("ks", "t", (("p", "bigint"), ("c", "bigint"), ("v", "text")),
                        ("p",), ("c",))
    ones = key_hashes(pa.record_batch({"p": pa.array([1, 2], pa.int64())}), ("p",),
                      row_converter(table, ("p",)))
    with np.errstate(over="ignore"):
        shift = int(np.array([(ones[0] - ones[1]) * _GOLDEN], np.uint64).view(np.int64)[0])
    wal = WalDir(str(tmp_path / "wal")).create()
    config = SinkConfig(keyspace="ks", table="t", write=STREAM)
    plan = WritePlan(config=config, wal_root=wal.root, stored_columns=("p", "c", "v", "op"),
                     target=Target(config, table, ("p", "c", "v")))
    batch = lambda p, c: pa.record_batch({"p": pa.array([p], pa.int64()),  # noqa: E731
                                          "c": pa.array([c], pa.int64()),
                                          "v": pa.array(["x"]), "op": pa.array(["c"])})
    run_batch(plan, batch(1, 0), batch(2, shift))
    assert plan.wal.sealed_batch_ids() == [0]


def test_a_static_cell_written_by_two_tasks_is_refused(tmp_path):
    """Upserts of two rows of one partition write its one static cell: the later task would
    win, whatever the source's order (passed before: the schema did not know statics)."""
    table = TableSchema("ks", "t", (("k", "text"), ("c", "int"), ("s", "text")), ("k",), ("c",),
                        static_columns=("s",))
    wal = WalDir(str(tmp_path / "wal")).create()
    config = SinkConfig(keyspace="ks", table="t", write=STREAM)
    plan = WritePlan(config=config, wal_root=wal.root, stored_columns=("k", "c", "s", "op"),
                     target=Target(config, table, ("k", "c", "s")))
    batch = lambda c, s, op="c": pa.record_batch({  # noqa: E731
        "k": pa.array(["a"]), "c": pa.array([c], pa.int32()), "s": pa.array([s]),
        "op": pa.array([op])})
    with pytest.raises(KeyInTwoTasksError) as info:
        run_batch(plan, batch(1, "new"), batch(2, "old"))
    assert info.value.kind == "static" and "partition (k='a')" in str(info.value)
    run_batch(plan, batch(1, "new"), batch(2, None, "d"), batch_id=1)   # a delete writes none
    assert plan.wal.sealed_batch_ids() == [1]
    assert TableSchema.from_dict(table.to_dict()).static_columns == ("s",)
    assert "static_columns" not in TABLE.to_dict()       # a table without: its record as before


def test_a_task_without_its_keys_refuses_the_batch(tmp_path):
    plan = plan_for(tmp_path, STREAM)
    messages = [stage_partition(plan, [rows(("a", 1, "x", "c"))], 0, 0, 0)]
    messages[0] = type(messages[0])(messages[0].segment, messages[0].query_id, None)
    with pytest.raises(KeyInTwoTasksError) as info:
        commit_batch(plan, messages, 0, commit_point="seal")
    assert info.value.kind == "unread" and "holds no keys" in str(info.value)


def test_long_text_keys_are_hashed_a_few_mb_at_a_time():
    from recovery.cql import key_identity
    values = ["x" * 1000 + str(i) for i in range(3000)] + ["", "y" * 5_000_000, ""]
    array = pa.array(values).cast(pa.binary())
    whole = key_identity._bytes_hashes(array).tolist()
    saved = key_identity._BYTES_AT_ONCE
    try:
        key_identity._BYTES_AT_ONCE = 10_000
        assert key_identity._bytes_hashes(array).tolist() == whole
    finally:
        key_identity._BYTES_AT_ONCE = saved
    assert len(set(whole)) == 3002


def test_the_refusal_travels_pickled():
    import pickle
    error = KeyInTwoTasksError(3, "(k='a')", (1, 2), "partition-delete")
    back = pickle.loads(pickle.dumps(error))
    assert str(back) == str(error) and back.partitions == (1, 2)


def test_a_real_key_after_collisions_is_still_found(tmp_path, monkeypatch):
    """Candidates are compared a few at a time: a collision's does not end the search."""
    from sinks.worker import key_order
    monkeypatch.setattr(key_order, "_CANDIDATES_AT_ONCE", 1)
    plan = one_key_plan(tmp_path, "text")
    one, other = thue_morse(1024, "ab"), thue_morse(1024, "ba")
    with pytest.raises(KeyInTwoTasksError) as info:
        run_batch(plan, one_key([one, "same"]), one_key([other, "same"], ops=["c", "d"]))
    assert "key (k='same')" in str(info.value)


def test_a_batch_sharing_every_key_is_refused_after_reading_a_few(tmp_path):
    """A shuffled stream shares most keys between tasks: the commit compares the first few,
    not every one (each segment read once)."""
    plan = plan_for(tmp_path, STREAM)
    keys = [(f"k{i}", 1, "x", "c") for i in range(20_000)]
    with pytest.raises(KeyInTwoTasksError):
        run_batch(plan, rows(*keys), rows(*[(k, c, v, "u") for k, c, v, _ in keys]))
