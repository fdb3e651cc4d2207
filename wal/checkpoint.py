"""What Spark's checkpoint says: batch N is committed exactly when ``<checkpoint>/commits/N``
exists (see ``../docs/guarantees.md``). Read-only: the WAL never writes into the checkpoint.
"""

from __future__ import annotations

import os


def local_path(location: str) -> str:
    """``file:/x`` and ``file:///x`` -> ``/x``. Other schemes are not supported yet."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    if "://" in location:
        raise ValueError(f"checkpointLocation {location!r}: only local or shared (mounted) "
                         f"paths are supported for now")
    return location


def is_committed(checkpoint: str, batch: int) -> bool:
    return os.path.exists(os.path.join(local_path(checkpoint), "commits", str(batch)))


def exists(checkpoint: str) -> bool:
    return os.path.isdir(local_path(checkpoint))


def committed_batches(checkpoint: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(local_path(checkpoint), "commits"))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())
