"""Fixtures the unit tests share: a fresh WAL directory and its log opened for writing, and the
recording Upserter's writes emptied around every test (``tests.helpers.flush_fakes``)."""

from __future__ import annotations

import pytest

from tests.helpers import flush_fakes
from wal.layout import WalDir
from wal.log import WalLog


@pytest.fixture
def wal(tmp_path) -> WalDir:
    return WalDir(str(tmp_path / "wal")).create()


@pytest.fixture
def wal_log(wal):
    with WalLog.open_writer(wal) as wal_log:
        yield wal_log


@pytest.fixture(autouse=True)
def _recorded_writes_emptied():
    flush_fakes.WRITES.clear()
    flush_fakes.FAIL_IDS.clear()
    yield
    flush_fakes.WRITES.clear()
    flush_fakes.FAIL_IDS.clear()
