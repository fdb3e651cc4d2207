"""Which values are secret: the one rule, for every floor. Like :mod:`wal.clock`, nothing of
the WAL is in it; it sits on the lowest floor so that each floor asks it: the WAL's store
access (:class:`wal.stores.StoreAccess`, S3 keys), the Cassandra configs
(:mod:`recovery.cql.config`: passwords) and the options (:mod:`sinks.worker.options`, whose
errors redact such a value and whose table, ``docs/options.md``, marks it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: What in a name makes its value secret (matched in the lowered name, so that a field or
#: an option added later is covered without being listed).
_SECRET_MARKERS = ("password", "secret", "access_key")


def is_secret(name: str) -> bool:
    """True when the value of an option, or of a config field, of this name must never be
    shown nor recorded."""
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def shown_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, without its secrets: what its repr, a log line or a
    record may show. Secrets still pickle (an executor needs them to connect)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
            if not is_secret(f.name)}


def repr_without_secrets(obj: Any) -> str:
    """The dataclass's repr without its secrets (use as its ``__repr__``)."""
    shown = ", ".join(f"{name}={value!r}" for name, value in shown_fields(obj).items())
    return f"{type(obj).__qualname__}({shown})"
