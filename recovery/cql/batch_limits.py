"""The node's limits for multi-partition batches, which ``batch.size.bytes=auto`` follows.

Cassandra warns (on the node and to the client) about every batch that spans several
partitions and exceeds ``batch_size_warn_threshold`` or
``unlogged_batch_across_partitions_warn_threshold``; it refuses one above
``batch_size_fail_threshold``. Clusters that raise these settings accept larger batches, and
larger batches mean fewer requests: the node's CPU per row falls with its requests. So the
writer asks the node it is connected to (the virtual table ``system_views.settings``, Cassandra
4.0 and later) and keeps under what it says; where the table cannot be read (an older
Cassandra, no permission, a timeout) it keeps Cassandra's defaults, 5 KiB and 10 partitions.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Cassandra's defaults: ``batch_size_warn_threshold`` 5 KiB,
#: ``unlogged_batch_across_partitions_warn_threshold`` 10.
DEFAULT_WARN_BYTES = 5120
DEFAULT_PARTITIONS = 10

_SETTINGS = ("batch_size_warn_threshold", "batch_size_warn_threshold_in_kb",
             "batch_size_fail_threshold", "batch_size_fail_threshold_in_kb",
             "unlogged_batch_across_partitions_warn_threshold")
QUERY = ("SELECT name, value FROM system_views.settings WHERE name IN ("
         + ", ".join(f"'{name}'" for name in _SETTINGS) + ")")
_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class BatchLimits:
    """How large a multi-partition batch may be without a warning from the node."""

    warn_bytes: int = DEFAULT_WARN_BYTES
    partitions: int = DEFAULT_PARTITIONS
    source: str = "Cassandra's defaults"


def parse_size(value: str, default_unit: str = "b") -> int | None:
    """Bytes of a Cassandra data-storage setting: ``5KiB``, ``65536B``, ``1MiB``, or a bare
    number in ``default_unit`` (the ``*_in_kb`` settings). None for what is not a size."""
    found = _SIZE.match(value or "")
    if not found:
        return None
    unit = (found.group(2) or default_unit).lower()
    return int(found.group(1)) * _UNITS[unit] if unit in _UNITS else None


def limits_from_settings(settings: dict[str, str]) -> BatchLimits:
    """The limits these ``system_views.settings`` rows give (name -> value). The warning
    size is capped by the failure size; missing or unreadable values keep the defaults."""
    warn = (parse_size(settings.get("batch_size_warn_threshold", ""))
            or parse_size(settings.get("batch_size_warn_threshold_in_kb", ""), "kib"))
    fail = (parse_size(settings.get("batch_size_fail_threshold", ""))
            or parse_size(settings.get("batch_size_fail_threshold_in_kb", ""), "kib"))
    partitions = settings.get("unlogged_batch_across_partitions_warn_threshold", "").strip()
    if warn is None and not partitions.isdigit():
        return BatchLimits()
    warn = warn or DEFAULT_WARN_BYTES
    if fail:
        warn = min(warn, fail)
    return BatchLimits(warn_bytes=warn,
                       partitions=max(1, int(partitions)) if partitions.isdigit()
                       else DEFAULT_PARTITIONS,
                       source="the node's system_views.settings")


def read_batch_limits(session, timeout: float = 5.0) -> BatchLimits:
    """The limits the node answering this query reports; Cassandra's defaults where it
    cannot say (logged at debug level: an older Cassandra has no ``system_views``)."""
    try:
        rows = session.execute(QUERY, timeout=timeout)
        return limits_from_settings({row[0]: row[1] for row in rows})
    except Exception as exc:   # any failure here only means: keep the defaults
        log.debug("batch limits: system_views.settings not readable (%s: %s); using "
                  "Cassandra's defaults", type(exc).__name__, exc)
        return BatchLimits()
