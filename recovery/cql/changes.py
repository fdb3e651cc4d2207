"""A change stream's operations: which rows are upserts and which are deletes.

With ``op.column`` set (:class:`~recovery.cql.config.WriteConfig`: ``op_column`` and the values of each
operation), every row carries its operation in that column, which is never written as a cell.
A row delete is ``DELETE FROM <table> USING TIMESTAMP ? WHERE <primary key>`` and a partition
delete the same over the partition key only, each at the row's sealed write timestamp, as an
upsert is: a replay writes the same tombstone again, and at equal timestamps Cassandra lets the
tombstone win. A partition delete is only ever asked for by a value of its own, never inferred
from null clustering columns (:mod:`recovery.cql.upsert` writes them; the sink refuses a row whose
operation is none of the values, or whose delete lacks its key, before it is staged).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import WriteConfig

#: Each row's operation, as :func:`operations` gives it.
UPSERT, ROW_DELETE, PARTITION_DELETE, UNKNOWN = 0, 1, 2, -1
NAMES = {UPSERT: "upsert", ROW_DELETE: "row delete", PARTITION_DELETE: "partition delete"}


def operations(column: pa.Array | pa.ChunkedArray, write: WriteConfig) -> np.ndarray:
    """Each row's operation (int8: :data:`UPSERT`, :data:`ROW_DELETE`,
    :data:`PARTITION_DELETE`, or :data:`UNKNOWN` for a null or a value of none) from its
    ``op.column`` value: a string compared exactly, a boolean as ``true`` / ``false``."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    text = column if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) \
        else column.cast(pa.string())
    kinds = np.full(len(text), UNKNOWN, dtype=np.int8)
    for kind, values in ((UPSERT, write.upsert_values), (ROW_DELETE, write.delete_values),
                         (PARTITION_DELETE, write.partition_delete_values)):
        if values:
            found = pc.fill_null(pc.is_in(text, value_set=pa.array(values, pa.string())), False)
            kinds[found.to_numpy(zero_copy_only=False)] = kind
    return kinds
