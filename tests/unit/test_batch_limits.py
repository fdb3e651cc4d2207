"""recovery.cql.batch_limits: the node's batch warning limits, which ``batch.size.bytes=auto`` and
replica-set grouping follow; Cassandra's defaults whenever the node cannot say."""

from __future__ import annotations

import pyarrow as pa
import pytest
from cassandra.query import BatchStatement

from recovery.cql.batch_limits import (BatchLimits, QUERY, limits_from_settings, parse_size,
                                   read_batch_limits)
from recovery.cql.upsert import Upserter
from sinks.worker.options import WriteConfig

from tests.helpers.fake_cassandra import Metadata
from tests.helpers.flights import COLUMNS, TABLE, chunk, flights_session

pytestmark = pytest.mark.unit

#: What Cassandra 5.0.8 answers with its default cassandra.yaml.
CASSANDRA_5_DEFAULTS = {"batch_size_fail_threshold": "50KiB", "batch_size_warn_threshold": "5KiB",
                        "batch_size_warn_threshold_in_kb": "5",
                        "unlogged_batch_across_partitions_warn_threshold": "10"}


@pytest.mark.parametrize("value, unit, expected", [
    ("5KiB", "b", 5120), ("65536B", "b", 65536), ("1MiB", "b", 1 << 20), ("5", "kib", 5120),
    (" 64 KiB ", "b", 65536), ("0KiB", "b", 0), ("", "b", None), ("5KB", "b", None),
    ("lots", "b", None), ("-5KiB", "b", None)])
def test_sizes_parse_as_cassandra_writes_them(value, unit, expected):
    assert parse_size(value, unit) == expected


def test_the_default_node_gives_cassandras_defaults():
    limits = limits_from_settings(CASSANDRA_5_DEFAULTS)
    assert (limits.warn_bytes, limits.partitions) == (5120, 10)
    assert limits.source == "the node's system_views.settings"


def test_raised_thresholds_are_followed_up_to_the_failure_size():
    raised = {**CASSANDRA_5_DEFAULTS, "batch_size_warn_threshold": "64KiB",
              "unlogged_batch_across_partitions_warn_threshold": "25"}
    assert limits_from_settings(raised) == BatchLimits(51200, 25, "the node's system_views.settings")
    raised["batch_size_fail_threshold"] = "1MiB"
    assert limits_from_settings(raised).warn_bytes == 65536


def test_cassandra_4_0_names_in_kilobytes():
    limits = limits_from_settings({"batch_size_warn_threshold_in_kb": "16",
                                   "batch_size_fail_threshold_in_kb": "50",
                                   "unlogged_batch_across_partitions_warn_threshold": "10"})
    assert (limits.warn_bytes, limits.partitions) == (16384, 10)


@pytest.mark.parametrize("settings", [{}, {"batch_size_warn_threshold": "huge"},
                                      {"batch_size_warn_threshold": "0KiB"}])
def test_unreadable_settings_keep_the_defaults(settings):
    limits = limits_from_settings(settings)
    assert (limits.warn_bytes, limits.partitions) == (5120, 10)


def test_the_limits_are_read_with_one_query():
    session = flights_session(settings=CASSANDRA_5_DEFAULTS)
    assert read_batch_limits(session).warn_bytes == 5120
    assert session.queries == [QUERY]
    assert "system_views.settings" in QUERY


def test_a_node_without_system_views_gives_the_defaults():
    error = Exception("table system_views.settings does not exist")   # Cassandra 3.x
    assert read_batch_limits(flights_session(settings_error=error)) == BatchLimits()


def _many_partitions_requests(session) -> tuple[Upserter, list]:
    upserter = Upserter(session, TABLE, [n for n, _ in COLUMNS], WriteConfig())
    rb = chunk(300)
    rb = rb.set_column(0, "carrier", pa.array(["UA"] * 300))
    rb = rb.set_column(1, "flight", pa.array(range(300), pa.int32()))   # one row a partition
    rb = rb.set_column(2, "year", pa.array([2013] * 300, pa.int32()))
    return upserter, upserter.statements(upserter.parameters(rb, first_ts=1))


def _partitions(statement) -> int:
    if not isinstance(statement, BatchStatement):
        return 1
    return len({tuple(values[:3]) for _, _, values in statement._statements_and_parameters})


def test_the_upserter_packs_batches_to_the_nodes_limits():
    ring = Metadata()
    _, default = _many_partitions_requests(flights_session(ring, settings=CASSANDRA_5_DEFAULTS))
    few = {**CASSANDRA_5_DEFAULTS, "unlogged_batch_across_partitions_warn_threshold": "3"}
    upserter, narrow = _many_partitions_requests(flights_session(ring, settings=few))
    assert upserter.limits.partitions == 3
    assert max(_partitions(r) for r, _ in default) == 10
    assert max(_partitions(r) for r, _ in narrow) == 3
    assert len(narrow) > len(default)
    assert sum(_partitions(r) for r, _ in narrow) == sum(_partitions(r) for r, _ in default) == 300


def test_an_explicit_batch_size_wins_over_the_nodes():
    raised = {**CASSANDRA_5_DEFAULTS, "batch_size_warn_threshold": "40KiB"}
    auto = Upserter(flights_session(settings=raised), TABLE, [n for n, _ in COLUMNS], WriteConfig())
    fixed = Upserter(flights_session(settings=raised), TABLE, [n for n, _ in COLUMNS],
                     WriteConfig(batch_size_bytes=2048))
    assert (auto._batch_bytes, fixed._batch_bytes) == (40960, 2048)


def test_partition_grouping_does_not_ask_the_node():
    session = flights_session(settings=CASSANDRA_5_DEFAULTS)
    Upserter(session, TABLE, [n for n, _ in COLUMNS], WriteConfig(batch_grouping_key="partition"))
    assert session.queries == []
