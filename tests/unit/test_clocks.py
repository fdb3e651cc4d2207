"""The age a row's TTL counts down from is measured on one host (issue 31, item 6;
``recovery/cql/batch_age.py``): the driver process reads its wall clock once per batch, when it first takes
the batch in hand, and counts on on its monotonic clock; a process on another machine counts
on from when it received that measure. What each writer does with it: the row writer contract
(``tests/unit/test_row_writer_contract.py``, ``ttl_writer``).
"""

from __future__ import annotations

import pickle

import pytest

from recovery.cql import batch_age
from recovery.cql.batch_age import BatchAge
from recovery.cql.errors import FlushFailed
from recovery.replay import Acknowledged, Replayer
from tests.helpers.skewed_clock import skewed_clock
from tests.helpers.walfactory import WalFactory
from wal import clock
from wal.recovery_policy import RecoveryPolicy
from wal.seal import now_us
from wal.states import BatchState

pytestmark = pytest.mark.unit

S = 1_000_000
NS = 1_000_000_000
HOUR = 3600


def test_the_age_is_never_negative_and_counts_on_on_the_monotonic_clock():
    sealed = 1_800_000_000 * S
    behind = batch_age.measure(sealed, wall_us=sealed - 30 * S, mono_ns=5 * NS, machine="m")
    assert behind.age_us == 0                      # a clock behind the sealing one: 0, not -30 s
    ahead = batch_age.measure(sealed, wall_us=sealed + 12 * S, mono_ns=5 * NS, machine="m")
    assert ahead.age_at(9 * NS) == 16 * S
    assert ahead.now_s(9 * NS) == sealed // S + 16
    assert ahead.age_at(4 * NS) == 12 * S          # never less than measured
    assert ahead.rebased(9 * NS) == BatchAge(sealed, 16 * S, 9 * NS, "m")


def test_a_process_on_another_machine_counts_from_when_it_received_the_measure():
    age = BatchAge(1_800_000_000 * S, 40 * S, 1_000 * NS, "driver's machine")
    assert age.received("driver's machine", 3 * NS) is age      # one monotonic clock: on
    elsewhere = age.received("an executor", 3 * NS)             # another: from now
    assert elsewhere.age_at(8 * NS) == 45 * S
    assert pickle.loads(pickle.dumps(age)) == age               # it travels in the closure


def test_the_machine_is_this_boots():
    assert clock.machine_id() == clock.machine_id()
    assert batch_age.measure(0).machine == clock.machine_id()


class Recording:
    """A row writer that records the age it was handed; fails while ``failing``."""

    reads_log = reads_store = False

    def __init__(self):
        self.ages: dict[int, list[BatchAge]] = {}
        self.failing = False

    def write(self, wal_log, seal, record, age=None):
        self.ages.setdefault(seal.batch, []).append(age)
        if self.failing:
            raise FlushFailed(seal.batch, "injected: Cassandra away")
        yield Acknowledged(len(seal.segments), 0, seal.rows)

    def reset(self):
        pass


def test_the_driver_measures_each_pending_batch_once_and_a_clock_step_later_changes_nothing(
        tmp_path):
    """An outage: batch 3 fails, batch 4 waits behind it; the driver's wall clock then steps
    two hours ahead (NTP). Both batches' ages were measured at the first drain, which saw
    them both, and are counted on from there: the step moves neither batch's rows' expiry."""
    with WalFactory(tmp_path / "wal", checkpoint=tmp_path / "cp") as f:
        f.sealed(3, sealed_at_us=now_us() - 60 * S)
        f.sealed(4, sealed_at_us=now_us() - 30 * S)
        writer = Recording()
        replayer = Replayer(f.wal, f.wal_log, None, f.checkpoint, writer=writer)
        writer.failing = True
        with pytest.raises(FlushFailed):
            replayer.run(RecoveryPolicy.QUERY_FLUSHER)
        (first,) = writer.ages[3]
        assert 60 * S <= first.age_us < 70 * S
        writer.failing = False
        with skewed_clock(2 * HOUR):
            replayer.run(RecoveryPolicy.QUERY_FLUSHER)
        assert writer.ages[3][1] == first            # the same measure, counted on
        (fourth,) = writer.ages[4]                   # measured at the first drain too
        assert 30 * S <= fourth.age_at(clock.monotonic_ns()) < 40 * S
        assert f.wal_log.get(4).state is BatchState.FLUSHED
        assert replayer._ages == {}                  # written: forgotten
