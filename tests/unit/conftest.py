"""Fixtures the WAL unit tests share: a fresh WAL directory and its log opened for writing."""

from __future__ import annotations

import pytest

from wal.layout import WalDir
from wal.log import WalLog


@pytest.fixture
def wal(tmp_path) -> WalDir:
    return WalDir(str(tmp_path / "wal")).create()


@pytest.fixture
def log(wal):
    with WalLog.open_writer(wal) as opened:
        yield opened
