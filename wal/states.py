"""The batch state machine (drawn in ``wal/FORMAT.md``, "States").

    (absent) --ingest--> SEALED --begin_flush--> FLUSHING --progress--> FLUSHING --mark--> FLUSHED
        |                                                                                   |
        +--discard--> DISCARDED --ingest (Spark re-ran the batch)--> SEALED        retention removes
    STAGED is the state of a batch whose segments exist but that has no seal yet; it is derived
    from the files (tasks cannot write the log) and may be recorded by recovery before a discard.

A batch enters the log as SEALED only once it is final: Spark wrote ``commits/N`` (streaming),
or the seal itself is the commit point (batch writes, foreachBatch). So SEALED -> DISCARDED is
illegal: a committed batch is never thrown away.
"""

from __future__ import annotations

from enum import Enum

from .errors import IllegalTransition


class BatchState(str, Enum):
    STAGED = "staged"
    SEALED = "sealed"
    FLUSHING = "flushing"
    FLUSHED = "flushed"
    DISCARDED = "discarded"

    def __str__(self) -> str:
        return self.value


ABSENT = None

TRANSITIONS: dict[BatchState | None, frozenset[BatchState]] = {
    ABSENT: frozenset({BatchState.STAGED, BatchState.SEALED, BatchState.DISCARDED}),
    BatchState.STAGED: frozenset({BatchState.SEALED, BatchState.DISCARDED}),
    BatchState.SEALED: frozenset({BatchState.FLUSHING}),
    BatchState.FLUSHING: frozenset({BatchState.FLUSHING, BatchState.FLUSHED}),
    BatchState.FLUSHED: frozenset(),
    BatchState.DISCARDED: frozenset({BatchState.STAGED, BatchState.SEALED, BatchState.DISCARDED}),
}

WHY_ILLEGAL = {
    (BatchState.SEALED, BatchState.DISCARDED): "a sealed batch is committed: it is never discarded",
    (BatchState.FLUSHING, BatchState.DISCARDED): "a batch being flushed is committed",
    (BatchState.FLUSHED, BatchState.DISCARDED): "a flushed batch is committed",
    (BatchState.SEALED, BatchState.SEALED): "a sealed batch is final; its seal cannot be replaced",
    (BatchState.FLUSHING, BatchState.SEALED): "a sealed batch is final; its seal cannot be replaced",
    (BatchState.FLUSHED, BatchState.SEALED): "a sealed batch is final; its seal cannot be replaced",
    (BatchState.SEALED, BatchState.FLUSHED): "flush must begin before it ends",
}


def check_transition(batch: int, current: BatchState | None, wanted: BatchState) -> None:
    """Raise IllegalTransition unless ``current -> wanted`` is an edge of the machine."""
    if wanted not in TRANSITIONS[current]:
        raise IllegalTransition(batch, current.value if current else None, wanted.value,
                                WHY_ILLEGAL.get((current, wanted), ""))
