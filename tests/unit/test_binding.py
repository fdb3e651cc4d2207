"""A stream's WAL is bound to its query (issue 17, item 3; ``wal/binding.py``).

Batch ids start at 0 in every checkpoint, so a WAL shared by two queries, or kept across a
checkpoint reset, would make new batches look already flushed. Checkpoints here are plain
folders with Spark's ``metadata`` file (``{"id": "<query id>"}``).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest

from wal.binding import bind, query_id_of, read_binding
from wal.errors import WalBoundElsewhere
from wal.layout import WalDir
from wal.seal import seal_batch

pytestmark = pytest.mark.unit


def checkpoint(path, query_id: str | None = None) -> str:
    """A checkpoint folder as Spark creates it: ``metadata`` with a new query id."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metadata"), "w") as f:
        f.write(json.dumps({"id": query_id or str(uuid.uuid4())}) + "\n")
    return str(path)


@pytest.fixture
def wal(tmp_path) -> WalDir:
    return WalDir(str(tmp_path / "wal")).create()


def test_first_use_binds_and_the_same_query_passes(wal, tmp_path):
    cp = checkpoint(tmp_path / "cp")
    first = bind(wal, cp)
    assert first == read_binding(wal) and first.query_id == query_id_of(cp) != ""
    assert bind(wal, cp) == first


def test_a_second_query_on_the_same_wal_is_refused_naming_both_checkpoints(wal, tmp_path):
    cp1, cp2 = checkpoint(tmp_path / "cp1"), checkpoint(tmp_path / "cp2")
    bind(wal, cp1)
    with pytest.raises(WalBoundElsewhere) as info:
        bind(wal, cp2)
    text = str(info.value)
    assert cp1 in text and cp2 in text and wal.root in text
    assert "wal.path" in text and "cassandra-wal inspect" in text


def test_a_reset_checkpoint_at_the_same_path_is_refused(wal, tmp_path):
    cp = checkpoint(tmp_path / "cp")
    bind(wal, cp)
    shutil.rmtree(cp)
    checkpoint(cp)                        # the query started again from scratch: a new id
    with pytest.raises(WalBoundElsewhere):
        bind(wal, cp)


def test_a_moved_checkpoint_keeps_its_wal(wal, tmp_path):
    cp = checkpoint(tmp_path / "cp")
    bind(wal, cp)
    moved = str(tmp_path / "elsewhere")
    shutil.move(cp, moved)
    assert bind(wal, moved).query_id == query_id_of(moved)


def test_a_wal_from_before_bindings_is_bound_unless_its_seals_are_another_querys(wal, tmp_path):
    seal_batch(wal, 0, [], query_id="old-query")
    with pytest.raises(WalBoundElsewhere):
        bind(wal, checkpoint(tmp_path / "cp"))
    assert read_binding(wal) is None
    ours = checkpoint(tmp_path / "ours", query_id="old-query")
    assert bind(wal, ours).query_id == "old-query"


def test_without_spark_metadata_the_checkpoint_path_decides(wal, tmp_path):
    cp1, cp2 = tmp_path / "cp1", tmp_path / "cp2"
    cp1.mkdir()
    cp2.mkdir()
    bind(wal, str(cp1))
    assert bind(wal, str(cp1)).query_id == ""
    with pytest.raises(WalBoundElsewhere):
        bind(wal, str(cp2))
