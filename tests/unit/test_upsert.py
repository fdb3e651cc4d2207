"""recovery.cql.upsert.Upserter builds, from an Arrow chunk, exactly the requests ``bind`` would.

No Cassandra: a session whose ``prepare`` returns a real cassandra-driver ``PreparedStatement`` for
the ``INSERT ... USING TIMESTAMP ? [AND TTL ?]`` with cassandra-driver's CQL types. Each row the
Upserter builds must carry the same serialized values and the same routing key as
``PreparedStatement.bind(row + (timestamp,))``, every row must appear once, and each UNLOGGED
batch must hold one partition only.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from cassandra.query import UNSET_VALUE, BatchStatement, BoundStatement, PreparedStatement

from recovery.cql.upsert import Upserter, size_model
from recovery.cql.convert import row_converter
from sinks.worker.options import WriteConfig
from recovery.cql.table import TableSchema
from tests.helpers.fake_cassandra import Metadata
from tests.helpers.flights import COLUMNS, TABLE, chunk, flights_session

pytestmark = pytest.mark.unit


def routing_key(values) -> bytes:
    first = BoundStatement(statement_prepared)
    first.values = values
    return first.routing_key


def flattened(statements, ring: Metadata | None = None, max_rows: int = 32,
              upserter: Upserter | None = None) -> list[BoundStatement]:
    """Every request's rows; checks each batch holds one partition (or, given ``ring``, one
    replica set of at most 10 partitions, under 5120 bytes as Cassandra counts them when it
    holds several), and at most ``max_rows`` rows."""
    out = []
    for statement, _ in statements:
        if isinstance(statement, BatchStatement):
            rows = statement._statements_and_parameters
            assert all(prepared for prepared, _, _ in rows)
            assert 1 < len(rows) <= max_rows
            keys = {tuple(values[i] for i in (0, 1, 2)) for _, _, values in rows}
            if len(keys) > 1 and upserter is not None:
                assert upserter.batch_size([values for _, _, values in rows]) <= 5120
            if ring is None:
                assert len(keys) == 1, "an UNLOGGED batch must hold one partition"
            else:
                assert len(keys) <= 10
                owners = {tuple(ring.get_replicas("ks", routing_key(values))) for _, _, values in rows}
                assert len(owners) == 1, "an UNLOGGED batch must hold one replica set"
            first = BoundStatement(statement_prepared)
            first.values = rows[0][2]
            assert statement.routing_key == first.routing_key
            out.extend(values for _, _, values in rows)
        else:
            out.append(statement.values)
    return out


statement_prepared: PreparedStatement


@pytest.mark.parametrize("write", [WriteConfig(), WriteConfig(batch_grouping_key="partition"),
                                   WriteConfig(batch_grouping_key="none"),
                                   WriteConfig(batch_size_rows=5, ttl_seconds=3600),
                                   WriteConfig(ttl_column="ttl", ignore_nulls=True)],
                         ids=["replica-set", "partition", "ungrouped", "batch5-ttl", "ttlcolumn-ignorenulls"])
def test_requests_carry_exactly_what_bind_gives(write):
    global statement_prepared
    columns = [name for name, _ in COLUMNS]
    ring = Metadata()
    upserter = Upserter(flights_session(ring), TABLE, columns, write)
    statement_prepared = upserter.statement
    rb = chunk()
    requests = upserter.statements(upserter.parameters(rb, first_ts=1_000_000))
    replica_set = write.batch_grouping_key == "replica_set"
    built = flattened(requests, ring if replica_set else None, write.batch_size_rows or 32, upserter)

    rows = row_converter(TABLE, columns, ignore_nulls=write.ignore_nulls)(rb.select(columns))
    ttls = rb.column("ttl").to_pylist()
    expected = []
    for i, row in enumerate(rows):
        extra = (1_000_000 + i,)
        if write.ttl_seconds:
            extra += (write.ttl_seconds,)
        elif write.ttl_column:   # a null TTL is sent unset: the table's default applies
            extra += (UNSET_VALUE if ttls[i] is None else ttls[i],)
        bound = upserter.statement.bind(row + extra)
        expected.append(tuple(bound.values))
    assert sorted(map(tuple, built), key=repr) == sorted(expected, key=repr)
    assert len(built) == rb.num_rows


def test_rows_are_grouped_into_single_partition_batches_with_their_routing_key():
    global statement_prepared
    upserter = Upserter(flights_session(), TABLE, [n for n, _ in COLUMNS],
                        WriteConfig(batch_grouping_key="partition"))
    statement_prepared = upserter.statement
    rb = chunk()
    statements = upserter.statements(upserter.parameters(rb, first_ts=7))
    batches = [s for s, _ in statements if isinstance(s, BatchStatement)]
    sizes = Counter(zip(*(rb.column(k).to_pylist() for k in TABLE.partition_key))).values()
    assert len(sizes) == 16 and min(sizes) > 1
    assert len(batches) == sum(-(-n // 32) for n in sizes)    # at most 32 rows a batch
    assert all(b.is_idempotent and b.routing_key for b in batches)
    flattened(statements)        # one partition per batch, routing key of its rows


def test_a_constant_writetime_is_the_same_cell_for_every_row():
    write = WriteConfig(writetime_micros=1_700_000_000_000_000)
    upserter = Upserter(flights_session(), TABLE, [n for n, _ in COLUMNS], write)
    params = upserter.parameters(chunk(6), first_ts=1)
    assert {p[len(COLUMNS)] for p in params} == {(1_700_000_000_000_000).to_bytes(8, "big")}


@pytest.mark.parametrize("rows_per_partition", [1, 3, 40])
def test_replica_set_batches_hold_partitions_of_one_replica_set(rows_per_partition):
    global statement_prepared
    ring = Metadata()
    upserter = Upserter(flights_session(ring), TABLE, [n for n, _ in COLUMNS], WriteConfig())
    statement_prepared = upserter.statement
    rb = chunk(300)
    # flight numbers make 300 // rows_per_partition partitions of rows_per_partition rows
    rb = rb.set_column(0, "carrier", pa.array(["UA"] * 300))
    rb = rb.set_column(1, "flight", pa.array([i // rows_per_partition for i in range(300)], pa.int32()))
    rb = rb.set_column(2, "year", pa.array([2013] * 300, pa.int32()))
    requests = upserter.statements(upserter.parameters(rb, first_ts=1))
    # the Upserter asks once a partition, with cassandra-driver's routing key
    asked = set(ring.asked)
    built = flattened(requests, ring, upserter=upserter)
    assert len(built) == 300
    assert asked == {routing_key(values) for values in built}
    partitions = len(asked)
    assert partitions == 300 // rows_per_partition + (300 % rows_per_partition > 0)
    if rows_per_partition < 32:   # several partitions share a request: fewer requests than partitions
        assert len(requests) < partitions


def test_without_a_token_map_each_partition_is_grouped_alone():
    global statement_prepared
    ring = Metadata(known=False)
    upserter = Upserter(flights_session(ring), TABLE, [n for n, _ in COLUMNS], WriteConfig())
    statement_prepared = upserter.statement
    built = flattened(upserter.statements(upserter.parameters(chunk(), first_ts=1)))
    assert len(built) == 300


def test_batches_of_several_partitions_stay_under_cassandras_warning_size():
    """Cassandra counts a multi-partition batch's size against batch_size_warn_threshold
    (5 KiB) and logs a warning for each larger one; single-partition batches are exempt."""
    global statement_prepared
    ring = Metadata()
    upserter = Upserter(flights_session(ring), TABLE, [n for n, _ in COLUMNS], WriteConfig())
    statement_prepared = upserter.statement
    rb = chunk(64).set_column(11, "photo", pa.array([b"p" * 600] * 64))   # ~0.9 KB a row
    rb = rb.set_column(0, "carrier", pa.array(["UA"] * 64))
    rb = rb.set_column(2, "year", pa.array([2013] * 64, pa.int32()))
    one_partition = rb.set_column(1, "flight", pa.array([1] * 64, pa.int32()))
    requests = upserter.statements(upserter.parameters(one_partition, first_ts=1))
    assert [len(r) for r, _ in requests] == [32, 32]             # exempt: full batches
    many = rb.set_column(1, "flight", pa.array(range(64), pa.int32()))
    requests = upserter.statements(upserter.parameters(many, first_ts=1))
    assert len(flattened(requests, ring, upserter=upserter)) == 64
    assert all(len(r) <= 5 for r, _ in requests if isinstance(r, BatchStatement))


FLIGHTS_CELLS = [("year", "int", 4), ("month", "int", 4), ("day", "int", 4), ("dep_time", "int", 4),
                 ("sched_dep_time", "int", 4), ("dep_delay", "double", 8), ("arr_time", "int", 4),
                 ("sched_arr_time", "int", 4), ("arr_delay", "double", 8), ("carrier", "text", 2),
                 ("flight", "int", 4), ("tailnum", "text", 6), ("origin", "text", 3),
                 ("dest", "text", 3), ("air_time", "double", 8), ("distance", "int", 4),
                 ("hour", "int", 4), ("minute", "int", 4), ("time_hour", "timestamp", 8)]
#: What Cassandra 5.0.8 counted per row of multi-partition batches (BatchStatement's
#: "Batch for [...] is of size N" warning, 40-60 rows a batch): (columns with their CQL type
#: and serialized length, partition key, clustering key, bytes a row).
MEASURED = {
    "flights": (FLIGHTS_CELLS, ("carrier", "flight", "year"), ("time_hour", "origin"), 410),
    "kv": ([("k", "int", 4), ("c", "int", 4), ("v", "text", 100)], ("k",), ("c",), 174),
    "wide, with a TTL": ([("k", "int", 4), ("c", "int", 4), ("a", "int", 4), ("b", "int", 4),
                          ("d", "double", 8), ("e", "text", 3), ("f", "bigint", 8), ("g", "boolean", 1)],
                         ("k",), ("c",), 214),
    "blob": ([("k", "int", 4), ("v", "blob", 200)], ("k",), (), 270),
    "list<int> of 20": ([("k", "int", 4), ("l", "list<int>", 164)], ("k",), (), 862),
    "map<text, int> of 10": ([("k", "int", 4), ("m", "map<text, int>", 144)], ("k",), (), 322),
    "set<text> of 10": ([("k", "int", 4), ("s", "set<text>", 64)], ("k",), (), 282),
    "frozen<list<int>> of 20": ([("k", "int", 4), ("l", "frozen<list<int>>", 164)], ("k",), (), 234),
}


@pytest.mark.parametrize("case", MEASURED, ids=list(MEASURED))
def test_the_batch_size_estimate_is_above_what_cassandra_measured(case):
    cells, pk, ck, measured = MEASURED[case]
    table = TableSchema("ks", "t", columns=tuple((n, t) for n, t, _ in cells), partition_key=pk,
                        clustering_key=ck)
    upserter = Upserter.__new__(Upserter)
    upserter.columns = [n for n, _, _ in cells]
    upserter._weights, upserter._row_overhead = size_model(table, upserter.columns)
    row = tuple(b"x" * size for _, _, size in cells) + (b"\x00" * 8,)   # + USING TIMESTAMP
    estimate = upserter.batch_size([row])
    assert measured <= estimate, f"{case}: estimated {estimate} < {measured} measured"
    if "list" not in case and "map" not in case and "set" not in case:
        assert estimate <= measured * 1.5, f"{case}: {estimate} is needlessly far above {measured}"


@pytest.mark.parametrize("write", [WriteConfig(), WriteConfig(ignore_nulls=True, ttl_column="ttl")],
                         ids=["default", "ignorenulls-ttl"])
def test_requests_size_rows_as_the_reference_does(write):
    """write_chunk sizes rows while encoding; the result must equal the row-by-row reference."""
    global statement_prepared
    ring = Metadata()
    upserter = Upserter(flights_session(ring), TABLE, [n for n, _ in COLUMNS], write)
    statement_prepared = upserter.statement
    rb = chunk(300).set_column(11, "photo", pa.array([b"q" * (i % 400) for i in range(300)]))
    rows, value_bytes, _ = upserter._encoded(rb, 1)
    assert (value_bytes + upserter._row_overhead).tolist() == [upserter.batch_size([r]) for r in rows]
    fast = [[tuple(v) for _, _, v in s._statements_and_parameters] if isinstance(s, BatchStatement)
            else [tuple(s.values)] for s, _ in upserter.requests(rb, 1)]
    reference = [[tuple(v) for _, _, v in s._statements_and_parameters] if isinstance(s, BatchStatement)
                 else [tuple(s.values)] for s, _ in upserter.statements(upserter.parameters(rb, 1))]
    assert fast == reference
    flattened(upserter.requests(rb, 1), ring, upserter=upserter)
