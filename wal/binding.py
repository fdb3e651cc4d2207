"""Which query a stream's WAL belongs to: ``WAL_DIR/query.json`` (``wal/FORMAT.md``).

A WAL decides "already flushed" and "committed" by batch id, and batch ids are a query's own:
they start at 0 in every new checkpoint. Two queries sharing one ``wal.path``, or a checkpoint
reset (deleted, or a new ``checkpointLocation``) while ``wal.path`` is kept, would make a query's
new batches look flushed and skip them without a word. So a WAL is bound to its query when it is
first used: the checkpoint folder and the query id Spark keeps in ``<checkpoint>/metadata``
(written when the checkpoint is created, the same for every run of the query). Every write and
every flusher start checks the binding, and a mismatch is refused, naming both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from . import checkpoint as ckpt
from . import format as fmt
from .errors import WalBoundElsewhere, WalCorrupted
from .files import atomic_write
from .layout import WalDir
from .schemes import is_local
from .seal import read_seal


@dataclass(frozen=True)
class Binding:
    checkpoint: str     # the checkpoint: a local absolute path, or a store's URI
    query_id: str       # Spark's query id from <checkpoint>/metadata ("" when unknown)


def query_id_of(checkpoint: str) -> str:
    """The query id Spark recorded in ``<checkpoint>/metadata`` ("" if there is none yet)."""
    return ckpt.open_checkpoint(checkpoint).query_id() or ""


def read_binding(wal: WalDir) -> Binding | None:
    path = os.path.join(wal.root, fmt.BINDING_FILE)
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
        return Binding(d["checkpoint"], d.get("query_id", ""))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WalCorrupted(path, f"unreadable {fmt.BINDING_FILE}: {exc}") from None


def _same_query(bound: Binding, now: Binding) -> bool:
    if bound.query_id and now.query_id:
        # The id follows the query where its checkpoint folder goes (a moved checkpoint keeps
        # its id); a new checkpoint, even at the same path, gets a new one.
        return bound.query_id == now.query_id
    if is_local(bound.checkpoint) and is_local(now.checkpoint):
        return os.path.realpath(bound.checkpoint) == os.path.realpath(now.checkpoint)
    return bound.checkpoint == now.checkpoint


def check(wal: WalDir, checkpoint: str) -> None:
    """Raise :class:`~wal.errors.WalBoundElsewhere` if ``wal`` is bound to another query than
    the one checkpointed at ``checkpoint``; read-only (an unbound WAL passes, and stays
    unbound). For readers and operators: a recovery given the wrong checkpoint would record
    another query's commits as this WAL's."""
    bound = read_binding(wal)
    now = Binding(ckpt.normal_location(checkpoint), query_id_of(checkpoint))
    if bound is not None and not _same_query(bound, now):
        raise WalBoundElsewhere(wal.root, bound, now)


def bind(wal: WalDir, checkpoint: str) -> Binding:
    """Bind ``wal`` to the query checkpointed at ``checkpoint`` (a local folder or a store's
    URI), or check that it is bound to it already. Raises
    :class:`~wal.errors.WalBoundElsewhere` otherwise.

    A WAL written before bindings existed is bound on first use, unless its newest seal names
    another query id (its batches are another query's).
    """
    now = Binding(ckpt.normal_location(checkpoint), query_id_of(checkpoint))
    bound = read_binding(wal)
    if bound is None:
        newest = max(wal.sealed_batch_ids(), default=None)
        seal = read_seal(wal, newest) if newest is not None else None
        if seal is not None and seal.query_id and now.query_id and seal.query_id != now.query_id:
            raise WalBoundElsewhere(wal.root, Binding("(not recorded)", seal.query_id), now)
        body = json.dumps({"checkpoint": now.checkpoint, "query_id": now.query_id},
                          sort_keys=True).encode() + b"\n"
        if wal.remote:      # another host may have bound the WAL since the working copy's pull
            body = wal.remote.publish_once(fmt.BINDING_FILE, body)
        atomic_write(os.path.join(wal.root, fmt.BINDING_FILE), body)
        bound = read_binding(wal)
        if not _same_query(bound, now):
            raise WalBoundElsewhere(wal.root, bound, now)
        return now
    if not _same_query(bound, now):
        raise WalBoundElsewhere(wal.root, bound, now)
    return bound
