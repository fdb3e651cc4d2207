"""The value parsers of the option table (:data:`sinks.worker.options.OPTION_SPECS`): each takes the
raw string a user gave and returns the value, or raises ``ValueError(reason)``, which
:func:`sinks.worker.options.parse_options` turns into an :class:`~recovery.cql.errors.OptionError` naming the
option (its value redacted for secrets).

And their inverses for a default (:func:`shown` and the ``shown_*`` below): a default is written
once, as the config dataclass's field default, and the option table shows it as the text a
user would type (a unit test parses each shown default back to the field's).
"""

from __future__ import annotations

import importlib.util

import math
import os.path
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cassandra import ConsistencyLevel

from recovery.cql.config import MAX_TTL_SECONDS, contact_point, format_contact_point, tls_protocol
from wal.schemes import LOCAL_SCHEME

_MIN_PLAUSIBLE_MICROS = 10**14  # 1973-03-03 in microseconds; smaller values are ms or s.
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_NUMBER_RE = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_SIZE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b)?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_WRITE_CONSISTENCIES = tuple(
    n for n in ConsistencyLevel.name_to_value if n not in ("ANY", "SERIAL", "LOCAL_SERIAL")
)
_MAX_BIGINT = 2**63 - 1  # a write timestamp is sent as a signed 64-bit integer


@dataclass(frozen=True)
class PerRow:
    """Value of the DataFrame options ``ttl`` / ``writetime``: a constant or a column name."""

    constant: int | None = None
    column: str | None = None


def shown(value: object) -> str | None:
    """A config value as the text a user would type for it (None: unset, no text)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def shown_auto(value: int | None) -> str | None:
    """Inverse of :func:`auto_or_positive`: None is ``auto``."""
    return "auto" if value is None else shown(value)


def shown_ttl(value: int | None) -> str | None:
    """Inverse of :func:`ttl_seconds`: None (no TTL) is ``0``."""
    return "0" if value is None else shown(value)


def shown_millis(seconds: float) -> str | None:
    """Inverse of :func:`millis_as_seconds`."""
    return shown(round(seconds * 1000))


def shown_size(size: int) -> str | None:
    """Inverse of :func:`byte_size`: the largest unit that divides the size (``10g``)."""
    suffix, unit = max(((s, u) for s, u in _SIZE_UNITS.items() if size % u == 0),
                       key=lambda item: item[1])
    return f"{size // unit}{suffix}"


def text(raw: str) -> str:
    return raw


def nonempty(raw: str) -> str:
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


def boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError("expected true or false")


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not _INT_RE.match(raw.strip()):
            raise ValueError("expected a whole number")
        value = int(raw.strip())
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ValueError(f"must be {bound}")
        return value

    return parse


def metrics_port(raw: str) -> int:
    """A TCP port for the metrics endpoint, and prometheus-client installed to serve it: a
    missing library fails the query's first batch here, not silently in the driver later."""
    port = int_in(1, 65535)(raw)
    if importlib.util.find_spec("prometheus_client") is None:
        raise ValueError("needs the prometheus-client library: pip install "
                         "'cassandra-wal-sink[metrics]' (or prometheus-client) where the "
                         "driver runs")
    return port


def positive_float(raw: str) -> float:
    if not _NUMBER_RE.match(raw.strip()):
        raise ValueError("expected a number")
    value = float(raw.strip())
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def millis_as_seconds(raw: str) -> float:
    return int_in(1)(raw) / 1000.0


def hosts(raw: str) -> tuple[str, ...]:
    """Contact points, each ``host``, ``host:port`` or ``[ipv6]:port`` (SCC's form), in their
    canonical spelling; empty entries (a trailing comma) are skipped."""
    entries = [h.strip() for h in raw.split(",") if h.strip()]
    if not entries:
        raise ValueError("expected a comma-separated list of host names or addresses")
    return tuple(format_contact_point(*contact_point(entry)) for entry in entries)


def column_names(raw: str) -> tuple[str, ...]:
    """Table column names, comma-separated, each once, as given (matched to the table's
    columns later, as DataFrame columns are); empty entries are skipped."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        raise ValueError("expected one or more column names, comma-separated")
    return tuple(dict.fromkeys(names))


def operation_values(raw: str) -> tuple[str, ...]:
    """A change stream's values of one operation (``op.*Values``), comma-separated, each once,
    compared exactly (a boolean column's values are ``true`` and ``false``); empty: none."""
    return tuple(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))


def ssl_protocol(raw: str) -> str:
    return tls_protocol(raw)


_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def cloud_bundle(raw: str) -> str:
    """A secure connect bundle: an absolute local path (cassandra-driver opens it as a file).
    SCC also takes URLs and bare ``spark.files`` names; cassandra-driver cannot fetch the first, and
    the second would resolve against each process's working directory, not Spark's files."""
    path = nonempty(raw)
    local = f"{LOCAL_SCHEME}://"
    if _URL_RE.match(path) and not path.startswith(local):
        raise ValueError("a URL is not supported: cassandra-driver reads the bundle from a local "
                         "file; copy it to the same absolute path on every node")
    path = path.removeprefix(local)
    if not os.path.isabs(path):
        raise ValueError("expected an absolute path (the bundle at the same path on every node); "
                         "a spark.files name is not resolved through Spark's files here")
    return path


def consistency(raw: str) -> str:
    name = raw.strip().upper()
    if name in ("SERIAL", "LOCAL_SERIAL"):
        raise ValueError(f"{name} applies only to lightweight transactions, which this sink never sends")
    if name == "ANY":
        raise ValueError(
            "ANY acknowledges a write that may exist only as a hint on the coordinator, so the "
            "WAL would mark the batch flushed and delete rows it cannot know are stored; use "
            "ONE or stronger (LOCAL_QUORUM, the default)")
    if name not in _WRITE_CONSISTENCIES:
        raise ValueError(f"expected one of {', '.join(_WRITE_CONSISTENCIES)}")
    return name


def choice(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    aliases = dict(aliases or {})

    def parse(raw: str) -> str:
        lowered = raw.strip().lower()
        lowered = aliases.get(lowered, lowered)
        if lowered not in choices:
            raise ValueError(f"expected one of {', '.join(choices + tuple(aliases))}")
        return lowered

    return parse


def auto_or_positive(raw: str) -> int | None:
    if raw.strip().lower() == "auto":
        return None
    try:
        return int_in(1)(raw)
    except ValueError:
        raise ValueError("expected 'auto' or a positive whole number") from None


def ttl_seconds(raw: str) -> int | None:
    return int_in(0, MAX_TTL_SECONDS)(raw) or None


def byte_size(raw: str) -> int:
    match = _SIZE_RE.match(raw.strip())
    if not match:
        raise ValueError("expected a size such as 1048576, 512m or 2g")
    number, unit = match.group(1), match.group(2).lower()
    if not unit and "." in number:
        raise ValueError("a size in bytes must be a whole number")
    size = int(float(number) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError("must be positive")
    return size


def per_row(constant: Callable[[str], int | None]) -> Callable[[str], PerRow]:
    def parse(raw: str) -> PerRow:
        stripped = raw.strip()
        if _NUMBER_RE.match(stripped):
            return PerRow(constant=constant(stripped))
        if not stripped:
            raise ValueError("expected a whole number or a column name")
        return PerRow(column=stripped)

    return parse


def writetime_constant(raw: str) -> int:
    value = int_in(0, _MAX_BIGINT)(raw)
    if value < _MIN_PLAUSIBLE_MICROS:
        raise ValueError(
            "looks like seconds or milliseconds; writetime is microseconds since the epoch "
            "(e.g. 1700000000000000)"
        )
    return value


def ignored(raw: str) -> None:
    return None


JKS_REASON = ("Java key stores (JKS/PKCS12) are not readable by Python's ssl; give PEM files "
               "through spark.cassandra.connection.ssl.trustStore.path / keyStore.path")


def refused(reason: str, *harmless: str) -> Callable[[str], None]:
    """Refuse an option unless it is set to a value that changes nothing (SCC's default)."""

    def parse(raw: str) -> None:
        if raw.strip().lower() in harmless:
            return None
        raise ValueError(reason)

    return parse
