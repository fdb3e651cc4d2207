"""Pointer files, in a stream's checkpoint: they tell the driver's listener that the query writes
through this sink, and where its WALs are (layout: ``wal/FORMAT.md``).

* ``<checkpoint>/cassandra_wal_sink.json``: the WAL of a data source's stream (one WAL a
  query), rewritten when ``wal.path`` moves.
* ``<checkpoint>/cassandra_wal_sinks/<keyspace>.<table>.json``: the WAL of each table a
  ``foreachBatch`` function writes (one WAL per table:
  :func:`sinks.worker.plan.table_wal_location`); one file per table, so two writers of one query adding theirs at once never lose one.

Written by each batch's ``prepare_write`` (unchanged content: not rewritten), read when a
query starts, at each of its progress events (a function may write a table for the first
time in any batch), and by ``sinks.wait_flushed`` and ``sinks.status``. A checkpoint on a
store (HDFS, S3) holds them too, written and read through the store
(:func:`wal.checkpoint.open_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from . import checkpoint as ckpt
from .files import atomic_write
from .format import POINTER_FILE, POINTERS_DIR
from .schemes import is_local


def table_slug(keyspace: str, table: str) -> str:
    """``<keyspace>.<table>`` as a file name: as is for names CQL needs no quotes for, else the
    first 16 hex digits of its sha256."""
    name = f"{keyspace}.{table}"
    if _PLAIN_NAME.fullmatch(keyspace) and _PLAIN_NAME.fullmatch(table):
        return name
    return hashlib.sha256(name.encode()).hexdigest()[:16]


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]{1,48}")


def pointer_name(table: tuple[str, str] | None) -> str:
    """The pointer file's name in the checkpoint (as :func:`read_pointers` keys it): the data
    source's (``table`` None) or a foreachBatch writer's for ``table``."""
    return POINTER_FILE if table is None else f"{POINTERS_DIR}/{table_slug(*table)}.json"


def read_slot(cp: str, table: tuple[str, str] | None = None) -> str | None:
    """Where the pointer of the data source's WAL (``table`` None), or of a foreachBatch
    writer's WAL for ``table``, says the WAL is now (None: nowhere yet)."""
    raw = ckpt.open_checkpoint(cp).store.read(pointer_name(table))
    return json.loads(raw)["wal_path"] if raw is not None else None


def write_pointer(cp: str, wal_location: str, table: tuple[str, str] | None = None) -> None:
    """Tell the driver's listener where a WAL of the query checkpointed at ``cp`` (a local
    folder or a store's URI, resolved) is: a local folder or a store's URI. ``table``
    (keyspace, table): a foreachBatch writer's WAL for that table; None: the data source's.
    A WAL moved (``wal.path`` changed) is followed (:mod:`wal.move`) before this."""
    name = pointer_name(table)
    body = json.dumps({"wal_path": wal_location}).encode()
    if not is_local(cp):
        store = ckpt.open_checkpoint(cp).store
        if store.read(name) != body:
            store.delete(name)      # a moved wal.path: a reader in between sees none
            store.create(name, body)
        return
    path = os.path.join(cp, *name.split("/"))
    try:
        with open(path, "rb") as f:
            if f.read() == body:
                return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, body)


def read_pointers(checkpoint: str) -> dict[str, str]:
    """The pointer files of the query checkpointed at ``checkpoint`` (Spark's resolved URI):
    file name -> WAL location, the data source's first; empty if the query does not write
    through this sink (or its checkpoint is on a filesystem the sink cannot reach, which
    ``prepare_write`` refuses before a batch is staged). On a store: a listing and a read a
    file."""
    try:
        store = ckpt.open_checkpoint(checkpoint).store
    except ValueError:          # no store for the scheme: never this sink's
        return {}
    found: dict[str, str] = {}
    for name in [POINTER_FILE] + [k for k in store.list(POINTERS_DIR) if k.endswith(".json")]:
        raw = store.read(name)
        if raw is not None:
            found[name] = json.loads(raw)["wal_path"]
    return found


def pointed_wals(checkpoint: str) -> list[str]:
    """Every WAL the query checkpointed at ``checkpoint`` writes through (each once), the data
    source's first (:func:`read_pointers`)."""
    return list(dict.fromkeys(read_pointers(checkpoint).values()))


def read_pointer(checkpoint: str) -> str | None:
    """The query's first WAL (:func:`pointed_wals`): its only one, for a data source's stream
    or a foreachBatch function writing one table; None if it has none."""
    wals = pointed_wals(checkpoint)
    return wals[0] if wals else None
