"""``wal.files.atomic_write`` from several threads of one process at once (a foreachBatch
function's two writers recording the same run): the temporary name was per process, so one
thread renamed another's temporary away and the other failed with FileNotFoundError (seen in
tests/integration/test_sink_streaming.py's foreachBatch aggregation)."""

from __future__ import annotations

import threading

import pytest

from wal.files import atomic_write

pytestmark = pytest.mark.unit


def test_threads_writing_one_file_at_once_all_succeed(tmp_path):
    path = str(tmp_path / "run")
    errors, start = [], threading.Barrier(8)

    def write(i):
        start.wait()
        try:
            for _ in range(200):
                atomic_write(path, f"writer {i}".encode())
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert open(path).read().startswith("writer ")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
