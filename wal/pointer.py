"""The pointer file: ``<checkpoint>/cassandra_wal_sink.json``, which tells the driver's listener
that a query writes through this sink and where its WAL is (layout: ``wal/FORMAT.md``).

Written by each batch's ``prepare_write`` (unchanged content: not rewritten), read when a
query starts and by ``sinks.wait_flushed``. A checkpoint on a store (HDFS, S3) holds it too,
written and read through the store (:func:`wal.checkpoint.open_checkpoint`).
"""

from __future__ import annotations

import json
import os

from . import checkpoint as ckpt
from .files import atomic_write
from .format import POINTER_FILE


def write_pointer(cp: str, wal_location: str) -> None:
    """Tell the driver's listener where the WAL of the query checkpointed at ``cp`` (a local
    folder or a store's URI, resolved) is: a local folder or a store's URI."""
    body = json.dumps({"wal_path": wal_location}).encode()
    if not ckpt.is_local(cp):
        store = ckpt.open_checkpoint(cp).store
        if store.read(POINTER_FILE) != body:
            store.delete(POINTER_FILE)      # a moved wal.path: a reader in between sees none
            store.create(POINTER_FILE, body)
        return
    os.makedirs(cp, exist_ok=True)
    path = os.path.join(cp, POINTER_FILE)
    try:
        with open(path, "rb") as f:
            if f.read() == body:
                return
    except FileNotFoundError:
        pass
    atomic_write(path, body)


def read_pointer(checkpoint: str) -> str | None:
    """Where the WAL of the query checkpointed at ``checkpoint`` (Spark's resolved URI) is; None
    if the query does not write through this sink (or the checkpoint is on a filesystem the
    sink cannot reach, which ``prepare_write`` refuses before a batch is staged)."""
    try:
        raw = ckpt.open_checkpoint(checkpoint).store.read(POINTER_FILE)
    except ValueError:          # no store for the scheme: never this sink's
        return None
    return json.loads(raw)["wal_path"] if raw is not None else None
