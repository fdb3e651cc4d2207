"""recovery.cql.upsert.Upserter.write_chunks: chunks pipelined, acknowledged in order, retried.

No Cassandra: the Upserter runs on cassandra-driver's real ``execute_concurrent_async`` over a
session whose ``execute_async`` returns futures the test answers itself (at once, or when it
releases them from another thread). What must hold:

* a chunk's tag is yielded only after every request of that chunk (and of every chunk before
  it) was acknowledged;
* the next chunk is built while the previous one is in flight, but only one chunk's requests
  are ever in flight;
* transient failures are retried (only the failed requests), permanent ones fail at once, a
  spent retry budget fails the batch;
* nothing is left in flight when ``write_chunks`` stops, whether it finished, raised or was
  closed early;
* with ``group_rows`` above a chunk's rows, consecutive chunks are written as one group: their
  rows share requests, and their tags come together once the whole group is acknowledged.
"""

from __future__ import annotations

import threading
import time

import pytest
from cassandra import InvalidRequest, WriteTimeout

from recovery.errors import FlushFailed
from recovery.cql.upsert import Upserter
from sinks.worker.options import WriteConfig
from wal.errors import WalCorrupted

from tests.helpers.fake_cassandra import FakeSession
from tests.helpers.flights import COLUMNS, TABLE, chunk, flights_session

pytestmark = pytest.mark.unit


class Recording(Upserter):
    """The Upserter, recording which statements each group's requests are. Groups of one chunk
    (``group_rows=1``) unless the test asks otherwise: then a group is a chunk, as the tests
    of pipelining below name it."""

    def __init__(self, session, on_retry=None, **write):
        super().__init__(session, TABLE, [n for n, _ in COLUMNS],
                         WriteConfig(**{"group_rows": 1, **write}), sleep=lambda s: None,
                         on_retry=on_retry)
        self.built: list[list] = []
        self.grouped: list[int] = []   # chunks in each group

    def group_requests(self, chunks, *when):
        pending = super().group_requests(chunks, *when)
        self.built.append([statement for statement, _ in pending])
        self.grouped.append(len(chunks))
        return pending


def chunks(count: int, rows: int = 60):
    return [(chunk(rows), 1_000 * k, f"chunk-{k}") for k in range(count)]


def wait_until(condition, what: str, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def consume_in_thread(generator):
    """Iterate ``generator`` in a thread (it blocks on Cassandra's answers); returns the tags
    list it fills and the thread."""
    tags, errors = [], []

    def run():
        try:
            for tag in generator:
                tags.append(tag)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return tags, errors, thread


def sent_ids(session: FakeSession) -> set[int]:
    with session.lock:
        return {id(f.statement) for f in session.sent}


def test_a_tag_comes_after_its_chunk_is_acknowledged_and_the_next_chunk_is_built_meanwhile():
    session = flights_session(hold=True)
    upserter = Recording(session, concurrent_writes=1000)
    tags, errors, thread = consume_in_thread(upserter.write_chunks(chunks(3), batch_id=4))

    wait_until(lambda: len(upserter.built) == 2, "chunk 1 to be built")
    first = {id(s) for s in upserter.built[0]}
    assert sent_ids(session) == first          # chunk 0 in flight, chunk 1 built, not sent
    assert tags == []

    session.release(len(first) - 1)            # all of chunk 0 but one request
    time.sleep(0.1)
    assert tags == [] and sent_ids(session) == first

    session.release(1)                         # chunk 0 acknowledged: its tag, chunk 1 sent
    wait_until(lambda: tags == ["chunk-0"], "chunk 0's tag")
    wait_until(lambda: len(upserter.built) == 3, "chunk 2 to be built")
    second = {id(s) for s in upserter.built[1]}
    wait_until(lambda: sent_ids(session) == first | second, "chunk 1 to be sent")

    session.release()
    wait_until(lambda: tags == ["chunk-0", "chunk-1"], "chunk 1's tag")
    session.release()
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert tags == ["chunk-0", "chunk-1", "chunk-2"]
    assert all(f.answered for f in session.sent)
    assert len(session.sent) == sum(len(b) for b in upserter.built)   # each request once


def test_concurrent_writes_bounds_the_requests_in_flight():
    session = flights_session(hold=True)
    upserter = Recording(session, concurrent_writes=3)
    tags, errors, thread = consume_in_thread(upserter.write_chunks(chunks(2), batch_id=1))
    wait_until(lambda: len(session.sent) == 3, "3 requests in flight")
    time.sleep(0.1)
    assert len(session.sent) == 3
    while thread.is_alive():
        session.release(1)
        in_flight = sum(1 for f in session.sent if f.outcome is None)
        assert in_flight <= 3
        time.sleep(0.001)
    assert errors == [] and tags == ["chunk-0", "chunk-1"]


def test_only_the_requests_that_failed_transiently_are_retried():
    flaky = set()

    def script(statement, attempt):
        if attempt == 1 and len(flaky) < 3 and id(statement) not in flaky:
            flaky.add(id(statement))
            return WriteTimeout("injected", consistency=1, required_responses=1,
                                received_responses=0, write_type=0)
        return None

    session = flights_session(script=script)
    upserter = Recording(session, retry_count=2)
    assert list(upserter.write_chunks(chunks(2), batch_id=2)) == ["chunk-0", "chunk-1"]
    retried = {k for k, n in session.attempts.items() if n > 1}
    assert retried == flaky and all(session.attempts[k] == 2 for k in flaky)
    assert len(session.sent) == sum(len(b) for b in upserter.built) + 3


def test_a_spent_retry_budget_fails_the_batch_and_yields_nothing_more():
    timeout = WriteTimeout("injected", consistency=1, required_responses=1,
                           received_responses=0, write_type=0)
    session = flights_session(script=lambda statement, attempt: timeout)
    retries = []
    upserter = Recording(session, on_retry=lambda: retries.append(1), retry_count=2)
    written = upserter.write_chunks(chunks(2), batch_id=9)
    with pytest.raises(FlushFailed, match=r"batch 9.*retry budget spent \(2 retries\): WriteTimeout"):
        next(written)
    first = {id(s) for s in upserter.built[0]}
    assert sent_ids(session) == first           # chunk 1 was built, never sent
    assert set(session.attempts.values()) == {3}
    assert len(retries) == 2                    # each retry told (the flusher's metrics)


def test_a_permanent_error_fails_at_once():
    session = flights_session(
        script=lambda statement, attempt: InvalidRequest("injected: bad value"))
    upserter = Recording(session)
    with pytest.raises(FlushFailed, match="InvalidRequest: injected: bad value") as failure:
        list(upserter.write_chunks(chunks(2), batch_id=3))
    assert failure.value.permanent
    assert set(session.attempts.values()) == {1}
    assert sent_ids(session) == {id(s) for s in upserter.built[0]}


def test_closing_early_waits_for_the_chunk_in_flight():
    session = flights_session(hold=True)
    upserter = Recording(session)
    written = upserter.write_chunks(chunks(3), batch_id=5)
    releaser = threading.Timer(0.05, session.release)
    releaser.start()
    assert next(written) == "chunk-0"            # chunk 1 is in flight now
    assert any(f.outcome is None for f in session.sent)
    threading.Timer(0.2, session.release).start()
    written.close()
    assert all(f.answered for f in session.sent), "close returned with requests in flight"
    assert len(upserter.built) == 2              # chunk 2 was never read


def test_a_corrupted_next_chunk_stops_after_the_one_in_flight_without_its_tag():
    session = flights_session(hold=True)
    upserter = Recording(session)

    def source():
        yield chunk(60), 0, "chunk-0"
        threading.Timer(0.2, session.release).start()
        raise WalCorrupted("log", "injected: chunk 1 checksum mismatch", batch=6)

    with pytest.raises(WalCorrupted, match="chunk 1"):
        next(upserter.write_chunks(source(), batch_id=6))
    assert session.sent and all(f.answered for f in session.sent)


def test_an_empty_chunk_is_acknowledged_without_a_request():
    session = flights_session()
    upserter = Recording(session)
    empty = chunk(10).slice(0, 0)
    assert list(upserter.write_chunks([(empty, 0, "empty"), (chunk(10), 0, "full")], 7)) == \
        ["empty", "full"]
    assert upserter.write_chunk(empty, 0, 7) == 0
    # The empty chunk waits for rows to group with (group_rows=1): one group of both, then
    # write_chunk's empty group, which sends nothing.
    assert upserter.grouped == [2, 1] and upserter.built[1] == []
    assert len(session.sent) == len(upserter.built[0])


def test_write_chunk_writes_one_chunk_through_the_same_path():
    session = flights_session()
    upserter = Recording(session)
    assert upserter.write_chunk(chunk(50), 0, 8) == 50
    assert len(session.sent) == len(upserter.built[0]) > 0


def test_consecutive_chunks_are_grouped_up_to_group_rows_and_tagged_after_the_whole_group():
    session = flights_session(hold=True)
    upserter = Recording(session, concurrent_writes=1000, group_rows=120)
    tags, errors, thread = consume_in_thread(upserter.write_chunks(chunks(5, rows=60), batch_id=2))

    wait_until(lambda: len(upserter.built) == 2, "the second group to be built")
    assert upserter.grouped[:2] == [2, 2]        # 60 + 60 rows reach group_rows=120
    first = {id(s) for s in upserter.built[0]}
    assert sent_ids(session) == first            # only the first group in flight
    session.release(len(first) - 1)
    time.sleep(0.1)
    assert tags == []                            # no tag before the whole group is answered
    session.release(1)
    wait_until(lambda: tags == ["chunk-0", "chunk-1"], "the first group's two tags")
    while thread.is_alive():
        session.release()
        thread.join(0.05)
    assert errors == [] and upserter.grouped == [2, 2, 1]
    assert tags == [f"chunk-{k}" for k in range(5)]
    assert len(session.sent) == sum(len(b) for b in upserter.built)


def test_a_partitions_rows_from_several_chunks_share_requests_when_grouped():
    """The same partitions in every chunk: one chunk at a time, each chunk needs its own
    requests for them; grouped, the partitions' rows of four chunks share requests."""
    def requests_for(group_rows: int) -> tuple[int, int]:
        session = flights_session()
        upserter = Recording(session, concurrent_writes=1000, group_rows=group_rows,
                             batch_grouping_key="partition")
        written = list(upserter.write_chunks(chunks(4, rows=28), batch_id=0))
        assert written == [f"chunk-{k}" for k in range(4)]
        rows = sum(len(s._statements_and_parameters) if hasattr(s, "_statements_and_parameters")
                   else 1 for s in (f.statement for f in session.sent))
        return len(session.sent), rows

    rb = chunk(28)
    partitions = len(set(zip(*(rb.column(c).to_pylist() for c in ("carrier", "flight", "year")))))
    assert 1 < partitions and 4 * 28 / partitions <= 32   # grouped, a partition fits one request
    alone, alone_rows = requests_for(1)
    grouped, grouped_rows = requests_for(1000)
    assert alone_rows == grouped_rows == 4 * 28     # every row once, either way
    assert (alone, grouped) == (4 * partitions, partitions)


def test_a_group_built_before_the_one_in_flight_was_retried_is_sent_with_the_ttl_left():
    # Group 2 is built while group 1 is in flight; group 1 then waits out a back-off. Group 2
    # is sent seconds after it was built: its rows' TTLs must count from the seal still.
    from cassandra.query import BatchStatement
    import struct

    from recovery.cql.batch_age import BatchAge

    now = [1_800_000_000_000_000]
    sealed_at = now[0]
    TIMEOUT = WriteTimeout("injected", consistency=1, required_responses=1, received_responses=0,
                           write_type=0)

    def sleep(seconds):
        now[0] += int(seconds * 1_000_000) + 2_000_000   # each back-off takes 2 s more

    sends = []

    def first_send_times_out(statement, attempt):
        sends.append(statement)
        return TIMEOUT if len(sends) == 1 else None

    session = flights_session(script=first_send_times_out)
    # The back-offs move the monotonic clock the driver's measure of the batch's age is
    # counted on (recovery.cql.batch_age): measured at the seal, here.
    upserter = Upserter(session, TABLE, [n for n, _ in COLUMNS],
                        WriteConfig(group_rows=1, ttl_column="ttl"), sleep=sleep,
                        monotonic_ns=lambda: now[0] * 1000)
    age = BatchAge(sealed_at, 0, now[0] * 1000, "this machine")
    groups = []
    for _ in upserter.write_chunks([(chunk(4), 0, "one"), (chunk(4), 100, "two")], 1, age):
        groups.append(_)
    ttls = []
    for answer in session.sent:
        statement = answer.statement
        rows = ([v for _, _, v in statement._statements_and_parameters]
                if isinstance(statement, BatchStatement) else [statement.values])
        ttls += [(struct.unpack(">q", v[-2])[0], struct.unpack(">i", v[-1])[0])
                 for v in rows if isinstance(v[-1], bytes)]
    late = {ts: ttl for ts, ttl in ttls if ts >= 100}
    waited = now[0] // 1_000_000 - sealed_at // 1_000_000
    assert waited >= 2 and groups == ["one", "two"]
    # chunk(): ttl 60 + i for rows i = 1, 2, 3 (row 0's is null: unset)
    assert late == {100 + i: 60 + i - waited for i in (1, 2, 3)}
