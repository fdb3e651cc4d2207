"""wal.files.make_private_dirs: new folders are private and their entries durable."""

from __future__ import annotations

import os
import stat

import pytest

import wal.files as files

pytestmark = pytest.mark.unit


@pytest.fixture
def calls(monkeypatch):
    """Record os.mkdir and fsync_dir calls, in order (both still run)."""
    seen: list[tuple[str, str]] = []
    real_mkdir, real_fsync_dir = os.mkdir, files.fsync_dir

    def mkdir(path, mode=0o777):
        seen.append(("mkdir", os.fspath(path)))
        real_mkdir(path, mode)

    def fsync_dir(path):
        seen.append(("fsync", os.fspath(path)))
        real_fsync_dir(path)

    monkeypatch.setattr(files.os, "mkdir", mkdir)
    monkeypatch.setattr(files, "fsync_dir", fsync_dir)
    return seen


def test_each_new_folder_is_followed_by_an_fsync_of_its_parent(tmp_path, calls):
    # A segment renamed into segments/<batch> is durable only if <batch> is, in segments/.
    root = tmp_path / "wal"
    batch = root / "segments" / "00000000000000000007"
    files.make_private_dirs(str(batch))
    assert calls == [("mkdir", str(root)), ("fsync", str(tmp_path)),
                     ("mkdir", str(root / "segments")), ("fsync", str(root)),
                     ("mkdir", str(batch)), ("fsync", str(root / "segments"))]
    for folder in (root, root / "segments", batch):
        assert stat.S_IMODE(os.stat(folder).st_mode) == files.DIR_MODE


def test_an_existing_folder_is_left_alone(tmp_path, calls):
    files.make_private_dirs(str(tmp_path))
    assert calls == []


def test_a_folder_created_meanwhile_by_another_task_is_taken_and_synced(tmp_path, monkeypatch):
    # Another task wins the race between our isdir and our mkdir. Its creator may not have
    # synced the parent yet when our segment is sealed, so we sync it too.
    target = tmp_path / "segments" / "b"
    (tmp_path / "segments").mkdir()
    synced: list[str] = []
    real_mkdir = os.mkdir

    def racing_mkdir(path, mode=0o777):
        real_mkdir(path, mode)            # the other task
        raise FileExistsError(path)       # ours, a moment later

    monkeypatch.setattr(files.os, "mkdir", racing_mkdir)
    monkeypatch.setattr(files, "fsync_dir", synced.append)
    files.make_private_dirs(str(target))
    assert target.is_dir() and synced == [str(tmp_path / "segments")]


def test_a_file_in_the_way_still_fails(tmp_path):
    (tmp_path / "segments").write_text("not a folder")
    with pytest.raises(FileExistsError):
        files.make_private_dirs(str(tmp_path / "segments"))
