"""wal/store.py on the local filesystem: the store contract (tests/helpers/store_contract.py),
and what only a folder has (fsynced, private, no temp file left)."""

from __future__ import annotations

import os
import stat

import pytest

from recovery.errors import is_transient
from tests.helpers.store_contract import StoreContract
from wal.errors import StoreUnavailable
from wal.store import LocalStore

pytestmark = pytest.mark.unit


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalStore(str(tmp_path / "wal"))


def test_local_objects_are_private_and_no_temp_file_stays(tmp_path):
    store = LocalStore(str(tmp_path / "wal"))
    store.create("seals/1.seal", b"s")
    store.create("seals/1.seal", b"t")
    assert os.listdir(tmp_path / "wal" / "seals") == ["1.seal"]
    assert stat.S_IMODE(os.stat(tmp_path / "wal" / "seals").st_mode) == 0o700


def test_a_local_create_fsyncs_the_object_and_its_folder(tmp_path, monkeypatch):
    import wal.store as store_module

    synced_files, synced_dirs = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: (synced_files.append(fd),
                                                              real_fsync(fd)))
    monkeypatch.setattr(store_module, "fsync_dir", synced_dirs.append)
    LocalStore(str(tmp_path / "wal")).create("a/b", b"x")
    assert synced_files and synced_dirs == [str(tmp_path / "wal" / "a")]


def test_a_store_that_cannot_answer_is_transient():
    assert is_transient(StoreUnavailable("s3://b/p", "EndpointConnectionError"))
