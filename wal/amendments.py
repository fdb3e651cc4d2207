"""Amendments: an operator's decision to write a sealed batch otherwise than sealed (layout:
``wal/FORMAT.md``, "Amendments").

A seal is final once Spark committed its batch, and every write of the batch repeats it: that
is what makes replays write the same cells. One thing can make a sealed batch impossible to
land as sealed: a column it writes was dropped after it was sealed. Cassandra hides every cell
of a dropped column written at or before the drop (``system_schema.dropped_columns``), even
once the column is added again. No retry cures that, and both ways out lose something, so the
sink blocks and an operator chooses (``cassandra-wal amend``), batch by batch:

* ``without_columns``: write the batch without those columns (their values are lost);
* ``base_ts_us``: write the batch at timestamps from this one on, above the drop (its rows
  then win over what was written to their keys since).

The choice is recorded here, durably, before the flusher writes the batch again, so every
later write of the batch (a crash in the middle, a restart) makes the same cells. It goes with
the batch's files once the batch is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol, TypeVar

from . import format as fmt
from .errors import WalCorrupted
from .files import atomic_write, make_private_dirs
from .layout import WalDir
from .clock import now_us
from .sealed_write import SealedWrite


class Sealed(Protocol):
    """What an amendment reads of a seal (:class:`wal.seal.Seal`, which imports this module
    for the timestamps a re-stamped batch takes)."""

    batch: int
    seal_id: str
    base_ts_us: int
    write: SealedWrite | None


S = TypeVar("S", bound=Sealed)    # a seal, amended or not


@dataclass(frozen=True)
class Amendment:
    """How batch ``batch`` is written from now on, instead of as sealed."""

    batch: int
    without_columns: tuple[str, ...] = ()   # DataFrame columns left out of every write
    base_ts_us: int | None = None           # the first row's write timestamp (None: sealed)
    reason: str = ""                        # what the operator was told, for inspect
    at_us: int = field(default_factory=now_us)
    seal_id: str = ""                       # the seal it amends ("": any seal of the batch)

    def amends(self, seal: Sealed) -> bool:
        """Whether this amendment is of ``seal``: not of another run's seal of the batch (a
        repair or a discard let Spark run the batch again with other rows)."""
        return seal.batch == self.batch and (not self.seal_id or self.seal_id == seal.seal_id)

    def apply(self, seal: S) -> S:
        """``seal`` as this amendment writes it: a seal of the same segments and rows, with
        fewer columns in its ``write`` record and/or another base timestamp."""
        write = seal.write
        if self.without_columns and write is not None:
            write = write.without_columns(self.without_columns)
        return replace(seal, write=write,
                       base_ts_us=seal.base_ts_us if self.base_ts_us is None else self.base_ts_us)

    def encode(self) -> bytes:
        return json.dumps(dict(asdict(self), without_columns=list(self.without_columns)),
                          sort_keys=True).encode() + b"\n"


def write_amendment(wal: WalDir, amendment: Amendment) -> None:
    """Record ``amendment`` durably (on a store, published there first); a later one for the
    same batch replaces it."""
    make_private_dirs(wal.amendments)
    data = amendment.encode()
    if wal.remote:
        wal.remote.publish_amendment(amendment.batch, data)
    atomic_write(wal.amendment_path(amendment.batch), data)


def read_amendment(wal: WalDir, batch: int) -> Amendment | None:
    path = wal.amendment_path(batch)
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
        return Amendment(int(d["batch"]), tuple(d.get("without_columns", ())),
                         d.get("base_ts_us"), str(d.get("reason", "")), int(d.get("at_us", 0)),
                         str(d.get("seal_id", "")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WalCorrupted(path, f"unreadable amendment: {exc}", batch=batch) from None


def amended(wal: WalDir, seal: S) -> S:
    """``seal`` as its batch is to be written: amended if an operator said so of this seal."""
    amendment = read_amendment(wal, seal.batch)
    return amendment.apply(seal) if amendment is not None and amendment.amends(seal) else seal


def amended_batch_ids(wal: WalDir) -> list[int]:
    try:
        names = os.listdir(wal.amendments)
    except FileNotFoundError:
        return []
    stems = (n[: -len(fmt.AMENDMENT_SUFFIX)] for n in names if n.endswith(fmt.AMENDMENT_SUFFIX))
    return sorted(int(s) for s in stems if s.isdigit())


def remove_amendment(wal: WalDir, batch: int) -> None:
    if not os.path.exists(wal.amendment_path(batch)):
        return
    if wal.remote:
        wal.remote.delete_amendment(batch)
    os.unlink(wal.amendment_path(batch))
