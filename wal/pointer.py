"""The pointer file: ``<checkpoint>/cassandra_wal_sink.json``, which tells the driver's listener
that a query writes through this sink and where its WAL is (layout: ``wal/FORMAT.md``).

Written by each batch's ``prepare_write`` (unchanged content: not rewritten), read when a
query starts and by ``sinks.wait_flushed``.
"""

from __future__ import annotations

import json
import os

from . import checkpoint as ckpt
from .files import atomic_write
from .format import POINTER_FILE


def write_pointer(cp: str, wal_root: str) -> None:
    """Tell the driver's listener where the WAL of the query checkpointed at ``cp`` (a local
    folder, resolved) is."""
    os.makedirs(cp, exist_ok=True)
    path = os.path.join(cp, POINTER_FILE)
    body = json.dumps({"wal_path": wal_root}).encode()
    try:
        with open(path, "rb") as f:
            if f.read() == body:
                return
    except FileNotFoundError:
        pass
    atomic_write(path, body)


def read_pointer(checkpoint: str) -> str | None:
    """The WAL of the query checkpointed at ``checkpoint`` (Spark's resolved URI); None if the
    query does not write through this sink. A checkpoint on another filesystem (HDFS) is never
    this sink's: ``prepare_write`` refuses one before a batch is staged."""
    try:
        cp = ckpt.local_path(checkpoint)
    except ckpt.NotLocal:
        return None
    try:
        with open(os.path.join(cp, POINTER_FILE), "rb") as f:
            return json.loads(f.read())["wal_path"]
    except FileNotFoundError:
        return None
