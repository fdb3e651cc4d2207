"""The Prometheus endpoint (sinks/driver/metrics_endpoint.py): a real HTTP server on a free port,
scraped with a real request; its metric names are the ones docs/user-guide.md lists."""

from __future__ import annotations

import logging
import re
import socket
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.net import free_port
from recovery.config import SinkConfig
from recovery.health import Health
from sinks.driver import metrics_endpoint
from sinks.driver.metrics_endpoint import ServedQuery

pytestmark = pytest.mark.unit

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide.md"


def health(**kw) -> Health:
    base = dict(wal="/w", state="lagging", blocked_reason=None, pending_batches=4,
                pending_rows=80, pending_bytes=5000, oldest_pending_age_s=41.5,
                max_bytes=10 * 2**30, wal_bytes=9000, flushed_through=1,
                last_written_batch=1, last_write_latency_s=0.8, rows_per_s=12.5,
                retries=7, replays=0, batches_written=3, rows_written=60)
    base.update(kw)
    return Health(**base)


class Flusher:
    def __init__(self, figures: Health | Exception):
        self.figures = figures
        self.wal = type("W", (), {"root": "/w"})()
        self.target = SimpleNamespace(config=SinkConfig("ks", "t"))

    def health(self) -> Health:
        if isinstance(self.figures, Exception):
            raise self.figures
        return self.figures


def scrape(port: int) -> dict:
    """``{(metric name, query_id): value}`` from ``GET /metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("query_id"))] = sample.value
            assert set(sample.labels) >= {"query_id", "query_name", "table"}
            assert sample.labels["table"] == "ks.t"
    return out


def test_a_scrape_gives_every_figure_of_every_running_query(caplog):
    port = free_port()
    queries = [ServedQuery("q1", "events", Flusher(health()), running=True),
               ServedQuery("q2", "", Flusher(health(state="blocked", blocked_reason="x",
                                                    oldest_pending_age_s=None,
                                                    last_written_batch=None,
                                                    last_write_latency_s=None)),
                           running=False),
               ServedQuery("q3", "", Flusher(OSError("gone")), running=True)]
    assert metrics_endpoint.serve(port, lambda: queries)
    assert metrics_endpoint.serve(port, lambda: [])      # this process serves it already
    got = scrape(port)
    assert got[("cassandra_wal_pending_batches", "q1")] == 4
    assert got[("cassandra_wal_pending_rows", "q1")] == 80
    assert got[("cassandra_wal_pending_bytes", "q1")] == 5000
    assert got[("cassandra_wal_max_bytes", "q1")] == 10 * 2**30
    assert got[("cassandra_wal_oldest_pending_age_seconds", "q1")] == 41.5
    assert got[("cassandra_wal_last_write_latency_seconds", "q1")] == 0.8
    assert got[("cassandra_wal_rows_written_per_second", "q1")] == 12.5
    assert got[("cassandra_wal_retries_total", "q1")] == 7
    assert got[("cassandra_wal_batches_written_total", "q1")] == 3
    assert got[("cassandra_wal_rows_written_total", "q1")] == 60
    assert got[("cassandra_wal_lagging", "q1")] == 1 and got[("cassandra_wal_blocked", "q1")] == 0
    assert got[("cassandra_wal_blocked", "q2")] == 1
    assert got[("cassandra_wal_query_running", "q1")] == 1
    assert got[("cassandra_wal_query_running", "q2")] == 0     # ended: its WAL still shown
    assert ("cassandra_wal_last_write_latency_seconds", "q2") not in got   # nothing written
    assert not any(query == "q3" for _, query in got)     # its failure hides no other query


def test_a_port_that_cannot_be_bound_is_logged_naming_the_option_and_tried_once_a_minute(
        caplog):
    """serve is asked at every batch: a taken port logged an error at every batch before."""
    now = [1000.0]
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR):
            assert not metrics_endpoint.serve(port, lambda: [], monotonic=lambda: now[0])
            for _ in range(5):                      # the next batches, within the minute
                now[0] += 2
                assert not metrics_endpoint.serve(port, lambda: [], monotonic=lambda: now[0])
            assert caplog.text.count(f"wal.metrics.port={port}") == 1
            now[0] += metrics_endpoint.BIND_RETRY_S
            assert not metrics_endpoint.serve(port, lambda: [], monotonic=lambda: now[0])
            assert caplog.text.count(f"wal.metrics.port={port}") == 2
    now[0] += metrics_endpoint.BIND_RETRY_S             # the port is free now: served
    assert metrics_endpoint.serve(port, lambda: [], monotonic=lambda: now[0])
    assert scrape(port) == {}


def test_the_user_guide_lists_every_metric_with_its_type():
    """The guide's metric table and the endpoint's metrics are the same names and types."""
    text = GUIDE.read_text()
    documented = dict(re.findall(r"^\| `(cassandra_wal_[a-z_]+)` \| (gauge|counter) \|", text,
                                 re.MULTILINE))
    served = {f"cassandra_wal_{name}" + ("_total" if kind == "counter" else ""): kind
              for name, (kind, _, _) in metrics_endpoint.METRICS.items()}
    name, kind, _ = metrics_endpoint.QUERY_RUNNING
    served[f"cassandra_wal_{name}"] = kind
    assert documented == served
    assert all(f"`{label}`" in text for label in metrics_endpoint.LABELS)   # labels named
