"""A batch is written the way it was sealed (issue 17, items 8 and 9).

* Item 8: the seal records the batch's columns and the options that decide its cells (TTL,
  write time, nulls); a flusher whose query restarted with other options still writes a sealed
  batch with the recorded ones, so a replay writes identical cells.
* Item 9: a row's TTL counts from its seal, not from each write: the first write and any replay
  expire it at the same second, a replay never revives a row whose TTL ran out, and a null in
  the ``ttl`` column is sent unset, so the table's ``default_time_to_live`` applies (it was
  sent as 0: no expiry at all).
* Issue 31, item 6: the batch's age is the driver's measure, counted on on a monotonic clock
  (``recovery.cql.batch_age``); a row whose TTL ran out while it was pending is written as the tombstones
  its expired cells would be, at its sealed timestamp (it was skipped: an older cell of another
  writer stayed visible).

No Cassandra: the Upserter's requests are read back from a session whose ``prepare`` gives the
cassandra-driver's real ``PreparedStatement`` (tests/unit/test_upsert.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct

from pathlib import Path

import pyarrow as pa
import pytest

from cassandra.query import UNSET_VALUE, BoundStatement

import recovery.cql.connection
from recovery.cql.batch_age import BatchAge
from recovery.target import Target
from recovery.cql.upsert import Upserter
from recovery.cql.config import WriteConfig
from recovery import output as recovery_output
from recovery.config import SinkConfig
from wal.seal import Seal
from wal.sealed_write import SEALED_OPTIONS, SealedWrite

from tests.helpers.fake_cassandra import FakeCluster
from tests.helpers.flights import COLUMNS, TABLE, chunk, flights_session

pytestmark = pytest.mark.unit

SECOND = 1_000_000
SEALED_AT = 1_800_000_000 * SECOND
COLUMN_NAMES = [name for name, _ in COLUMNS]


def target(columns=COLUMN_NAMES, **write) -> Target:
    config = SinkConfig(keyspace="ks", table="flights", write=WriteConfig(**write))
    return Target(config, TABLE, tuple(columns))


def sealed(t: Target) -> Seal:
    return Seal(batch=3, segments=(), base_ts_us=SEALED_AT, sealed_at_us=SEALED_AT,
                write=t.write_record())


# -- item 8: the options a batch was sealed with ------------------------------------------

def test_the_seal_records_the_columns_and_the_cell_deciding_options_and_no_secret():
    t = target(ttl_column="ttl", writetime_micros=None, ignore_nulls=True)
    record = t.write_record().to_dict()
    assert set(record) == set(SEALED_OPTIONS) | {"columns", "keyspace", "table",
                                                  "table_schema", "contact"}
    assert record["columns"] == COLUMN_NAMES and record["ttl_column"] == "ttl"
    assert record["ignore_nulls"] is True
    assert "password" not in repr(record)


@pytest.mark.parametrize("now", [
    dict(ttl_seconds=60),                                 # a TTL added
    dict(ignore_nulls=True),                              # nulls no longer written
    dict(columns=COLUMN_NAMES[:5]),                       # fewer columns
    dict(writetime_micros=1_700_000_000 * SECOND),        # a constant write time
], ids=["ttl", "ignore-nulls", "columns", "writetime"])
def test_a_restart_with_other_options_writes_a_sealed_batch_as_sealed(monkeypatch, now):
    then = target()
    seal = sealed(then)
    session = flights_session()
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda connection: (FakeCluster(), session))
    output = recovery_output.CassandraOutput(target(**now))        # the restarted query's options
    as_sealed = output.upserter(seal)
    assert as_sealed.columns == COLUMN_NAMES
    assert as_sealed.write == then.config.write
    assert "TTL" not in as_sealed.statement.query_string
    rows = chunk(20)
    assert as_sealed.parameters(rows, 100) == reference(then).parameters(rows, 100)
    # A batch sealed by the restarted query is written with its own options, on one session.
    assert output.upserter(sealed(target(**now))).write == target(**now).config.write
    assert output.upserter(seal) is as_sealed
    output.close()


def test_a_seal_that_recorded_nothing_is_written_with_the_current_options(monkeypatch):
    monkeypatch.setattr(recovery.cql.connection, "connect", lambda connection: (FakeCluster(), flights_session()))
    output = recovery_output.CassandraOutput(target(ttl_seconds=60))
    old = dataclasses.replace(sealed(target()), write=None)
    assert output.upserter(old).write.ttl_seconds == 60
    output.close()


def reference(t: Target) -> Upserter:
    return Upserter(flights_session(), t.table, t.columns, t.config.write)


# -- item 9: TTLs count from the seal ---------------------------------------------------------

def ttl_rows(ttls) -> pa.RecordBatch:
    rows = chunk(len(ttls))
    return rows.set_column(rows.schema.get_field_index("ttl"), "ttl", pa.array(ttls, pa.int32()))


def bound_rows(requests) -> list[tuple[bytes, list]]:
    """Every row of these requests: (its prepared statement's query id, its bound values)."""
    out = []
    for statement, _ in requests:
        if isinstance(statement, BoundStatement):
            out.append((statement.prepared_statement.query_id, list(statement.values)))
        else:
            out += [(query_id, list(values))
                    for _, query_id, values in statement._statements_and_parameters]
    return out


def ttls_of(requests) -> dict[int, int | str]:
    """Row position (from its write timestamp) -> the TTL its request carries ("unset"), or
    "tombstone" for a row written as the tombstones of its columns (a DELETE: timestamp first)."""
    out = {}
    for query_id, values in bound_rows(requests):
        if query_id.startswith(b"delete:"):
            out[struct.unpack(">q", values[0])[0]] = "tombstone"
            continue
        position = struct.unpack(">q", values[-2])[0]
        out[position] = ("unset" if values[-1] is UNSET_VALUE
                         else struct.unpack(">i", values[-1])[0])
    return out


def sent(upserter: Upserter, rows: pa.RecordBatch) -> dict[int, int | str]:
    return ttls_of(upserter.group_requests([(rows, 0)], sealed_at_us=SEALED_AT))


def upserter_at(seconds_after_seal: float, sealed_at: int = SEALED_AT, **write) -> Upserter:
    clock = lambda: sealed_at + int(seconds_after_seal * SECOND)  # noqa: E731
    return Upserter(flights_session(), TABLE, COLUMN_NAMES, WriteConfig(**write), clock_us=clock)


def test_a_ttl_counts_from_the_seal_so_every_write_expires_the_row_at_the_same_second():
    rows = ttl_rows([100, 100, 3600])
    first = sent(upserter_at(2, ttl_column="ttl"), rows)          # the flush, soon after the seal
    replay = sent(upserter_at(40, ttl_column="ttl"), rows)        # a replay after an outage
    assert first == {0: 98, 1: 98, 2: 3598}
    assert replay == {0: 60, 1: 60, 2: 3560}
    assert {p: 2 + t for p, t in first.items()} == {p: 40 + t for p, t in replay.items()}


def test_a_row_whose_ttl_ran_out_before_its_write_is_written_as_tombstones_at_its_timestamp():
    # What the expired row would have left: a tombstone per column it writes, at its sealed
    # timestamp (an expired cell is one), its other columns untouched. Before: not written.
    rows = ttl_rows([30, 100, 0])
    upserter = upserter_at(45, ttl_column="ttl")
    assert sent(upserter, rows) == {0: "tombstone", 1: 55, 2: 0}        # 0: no expiry
    requests = upserter.group_requests([(rows, 0)], sealed_at_us=SEALED_AT)
    (delete, values), = [(q, v) for q, v in bound_rows(requests) if q.startswith(b"delete:")]
    regular = [c for c in COLUMN_NAMES if c not in TABLE.primary_key]
    assert upserter.session.prepared[delete].query_string.startswith(
        "DELETE " + ", ".join(f'"{c}"' for c in regular) + " FROM ")
    inserted = next(v for q, v in bound_rows(reference(target(ttl_column="ttl")).group_requests(
        [(rows, 0)])) if struct.unpack(">q", v[-2])[0] == 0)
    key = [inserted[COLUMN_NAMES.index(c)] for c in TABLE.primary_key]
    assert values == [struct.pack(">q", 0)] + key        # at its timestamp, for its key
    # A replay, at any later time, writes the very same tombstones.
    assert bound_rows(upserter_at(4000, ttl_column="ttl").group_requests(
        [(rows.slice(0, 1), 0)], sealed_at_us=SEALED_AT)) == [(delete, values)]


def test_with_ignore_nulls_a_tombstone_deletes_only_the_columns_the_row_sets():
    # Row 0 of chunk() has nulls in delay (i % 5 == 0), ok (i % 11 == 0) and tags (i % 4 == 0):
    # with ignoreNulls those cells are not written, so an expired row leaves no tombstone there.
    rows = ttl_rows([30, 30])
    upserter = upserter_at(45, ttl_column="ttl", ignore_nulls=True)
    cql = upserter.session.prepared
    deletes = {struct.unpack(">q", v[0])[0]: cql[q].query_string.split(" FROM ")[0] for q, v in
               bound_rows(upserter.group_requests([(rows, 0)], sealed_at_us=SEALED_AT))}
    assert set(deletes) == {0, 1}
    assert '"delay"' not in deletes[0] and '"ok"' not in deletes[0] \
        and '"tags"' not in deletes[0] and '"seats"' in deletes[0]
    assert '"delay"' in deletes[1] and '"tags"' in deletes[1]


def test_an_expired_row_with_no_cell_to_delete_is_not_written():
    # A row of its key alone (or, with ignoreNulls, of nulls only): an expired row marker is
    # all it would leave, and nothing is sent.
    t = target(columns=list(TABLE.primary_key), ttl_column="ttl")
    upserter = Upserter(flights_session(), t.table, t.columns, t.config.write,
                        clock_us=lambda: SEALED_AT + 45 * SECOND)
    assert ttls_of(upserter.group_requests([(ttl_rows([30, 100]), 0)],
                                           sealed_at_us=SEALED_AT)) == {1: 55}


def test_a_null_ttl_is_sent_unset_so_the_tables_default_applies():
    rows = ttl_rows([None, 100, None])
    assert sent(upserter_at(10, ttl_column="ttl"), rows) == {0: "unset", 1: 90, 2: "unset"}


def test_the_expiry_second_is_the_seals_second_plus_the_ttl_whenever_the_write_lands():
    # Sealed half-way through a second; Cassandra expires a cell at the second it applies the
    # write plus the TTL sent. Two writes in different seconds must land on the same second.
    sealed_at = SEALED_AT + SECOND // 2
    seal_second = sealed_at // SECOND
    for after in (0.2, 0.7, 3.9, 5.2):
        upserter = upserter_at(after, sealed_at=sealed_at, ttl_column="ttl")
        now_second = (sealed_at + int(after * SECOND)) // SECOND
        (ttl,) = sent(upserter, ttl_rows([100])).values()
        assert now_second + ttl == seal_second + 100, after


def test_a_constant_ttl_counts_from_the_seal_too():
    assert set(sent(upserter_at(7, ttl_seconds=600), ttl_rows([1, 2])).values()) == {593}


def test_a_retried_write_sends_the_ttl_left_when_it_is_retried():
    # A request that timed out is sent again after a back-off: its rows must still expire at
    # the seal's second plus their TTL, and a row whose TTL ran out meanwhile is a tombstone.
    upserter = Upserter(flights_session(), TABLE, COLUMN_NAMES, WriteConfig(ttl_column="ttl"))
    built_s = SEALED_AT // SECOND + 1
    pending = upserter.group_requests([(ttl_rows([100, 3, 0]), 0)], SEALED_AT, built_s)
    aged, now_s = upserter._aged(pending, built_s, built_s + 3)   # after a 3 s back-off
    assert now_s == built_s + 3
    # 100 - 1 - 3; the 3 s row expired; 0 stays
    assert ttls_of(aged) == {0: 96, 1: "tombstone", 2: 0}
    again, _ = upserter._aged(aged, now_s, now_s + 200)            # a tombstone stays one
    assert ttls_of(again) == {0: "tombstone", 1: "tombstone", 2: 0}


def test_write_chunks_counts_the_drivers_measure_on_its_monotonic_clock_not_its_wall_clock():
    # Sealed 40 s before the driver measured it; the writing process's wall clock is two hours
    # off, and 5 s pass on its monotonic clock before it writes: 100 - 45 = 55 s are left.
    mono = [7_000 * 10**9]
    age = BatchAge(SEALED_AT, 40 * SECOND, mono[0], "this machine")
    mono[0] += 5 * 10**9
    session = flights_session()
    upserter = Upserter(session, TABLE, COLUMN_NAMES, WriteConfig(ttl_column="ttl"),
                        clock_us=lambda: SEALED_AT + 7200 * SECOND, monotonic_ns=lambda: mono[0])
    assert list(upserter.write_chunks([(ttl_rows([100, 30]), 0, "tag")], 3, age=age)) == ["tag"]
    assert ttls_of([(answer.statement, None) for answer in session.sent]) == \
        {0: 55, 1: "tombstone"}


# -- issue 31, item 1: a batch is written to the table and cluster it was sealed for -----------

def _other_table(t: Target, name: str, cluster: str | None, hosts=("10.0.0.9",)) -> Target:
    from recovery.cql.config import ConnectionConfig

    table = dataclasses.replace(TABLE, table=name,
                                columns=TABLE.columns + (("extra", "text"),))
    config = dataclasses.replace(t.config, table=name,
                                 connection=ConnectionConfig(hosts=hosts, port=9142,
                                                             username="etl"))
    return dataclasses.replace(t, config=config, table=table, cluster_name=cluster)


def test_a_pending_batch_goes_to_the_table_it_was_sealed_for_with_its_schema():
    then = dataclasses.replace(target(), cluster_name="prod")
    record = then.write_record()
    now = _other_table(then, "flights_v2", "prod")            # restarted with another table
    sealed = now.as_sealed(record)
    assert (sealed.config.keyspace, sealed.config.table) == ("ks", "flights")
    assert sealed.table == TABLE and sealed.columns == tuple(COLUMN_NAMES)
    # The same cluster (its name), other contact points: the current ones, credentials too.
    assert sealed.config.connection.hosts == ("10.0.0.9",)
    assert sealed.config.connection.username == "etl"


def test_a_pending_batch_of_another_cluster_goes_to_that_cluster():
    then = dataclasses.replace(target(), cluster_name="old")
    record = then.write_record()
    sealed = _other_table(then, "flights", "new").as_sealed(record)
    assert sealed.config.connection.hosts == then.config.connection.hosts
    assert sealed.config.connection.port == then.config.connection.port
    assert sealed.config.connection.username == "etl"      # this run's credentials
    # Names unknown (a target.json of an earlier release): the contact points decide.
    unnamed = dataclasses.replace(target(), cluster_name=None).write_record()
    assert _other_table(then, "flights", None).as_sealed(unnamed).config.connection.hosts \
        == then.config.connection.hosts
    same = _other_table(then, "flights", None, hosts=then.config.connection.hosts)
    same = dataclasses.replace(same, config=dataclasses.replace(
        same.config, connection=dataclasses.replace(same.config.connection,
                                                    port=then.config.connection.port)))
    assert same.as_sealed(unnamed).config.connection.username == "etl"


def test_a_seal_of_an_earlier_release_is_written_to_the_current_table():
    record = SealedWrite.from_dict({k: v for k, v in target().write_record().to_dict().items()
                                    if k not in ("keyspace", "table", "table_schema", "contact")})
    now = _other_table(target(), "flights_v2", "prod")
    sealed = now.as_sealed(record)
    assert sealed.config.table == "flights_v2" and sealed.config.connection.hosts == ("10.0.0.9",)


# -- the record's one owner: wal/sealed_write.py -------------------------------------------

def test_every_sealed_option_is_a_write_option_a_replay_can_take():
    assert set(SEALED_OPTIONS) <= {f.name for f in dataclasses.fields(WriteConfig)}
    record = target(ttl_seconds=60, ignore_nulls=True).write_record()
    assert WriteConfig(**record.options()).ttl_seconds == 60


def test_the_format_page_lists_exactly_the_fields_a_seal_records():
    """wal/FORMAT.md's seal layout and :class:`SealedWrite` name the same fields: a field added
    to one and not the other fails here."""
    page = (Path(__file__).parents[2] / "wal" / "FORMAT.md").read_text()
    block = page.split('"write": {', 1)[1].split("```", 1)[0]
    block = block.replace("{as target.json's \"table\"}", "")
    contact = re.search(r'"contact": \{([^}]*)\}', block)
    documented = set(re.findall(r'"(\w+)"', block[:contact.start()] + block[contact.end():]))
    record = target().write_record().to_dict()
    assert documented | {"contact"} == set(record)
    assert set(re.findall(r'"(\w+)"', contact.group(1))) == set(record["contact"])


def test_a_record_reads_back_as_written_and_an_earlier_release_s_as_it_was():
    record = target(ttl_column="ttl", lists_at_least_once=("tags",)).write_record()
    assert SealedWrite.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    # A release before seals said where: nothing of where is made up on the way back.
    earlier = {"columns": ["id"], "ttl_seconds": None, "ttl_column": None,
               "writetime_micros": None, "writetime_column": None, "ignore_nulls": False}
    read = SealedWrite.from_dict(earlier)
    assert (read.keyspace, read.table_schema, read.contact, read.op_column) == (None,) * 4
    assert set(read.to_dict()) == set(earlier) | {"lists_at_least_once", "op_column",
                                                  "upsert_values", "delete_values",
                                                  "partition_delete_values"}
