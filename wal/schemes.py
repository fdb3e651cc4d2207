"""Which location schemes the sink knows, and what each names: the one table of them.

A location is local (a path without a scheme, or ``file:``) or on a store that a
:class:`~wal.store.Store` reaches without a JVM: HDFS, over WebHDFS (``hdfs://namenode``: at the
namenode's HTTP address, which the session's Hadoop configuration gives, :mod:`wal.stores`;
``webhdfs://host:port``: at that address), or S3 (``s3://``, ``s3a://``). Any other scheme
(``viewfs://``, ``abfss://``, ``gs://``, ``dbfs:``) is a filesystem no store reaches, which the
sink refuses before anything is staged (``sinks/worker/plan.py``).

Everything that asks which schemes exist asks here: :func:`wal.stores.open_store` (which store
serves a scheme), :class:`wal.stores.StoreAccess` (what reaching it takes),
:mod:`wal.checkpoint` (a location as Spark resolves it), the sink's and the offline tool's
messages that list them (:func:`store_schemes_text`). ``tests/unit/test_schemes.py`` finds a
second spelled-out copy of the set anywhere else.
"""

from __future__ import annotations

import re

#: What a scheme names: the local filesystem, or the store that serves it.
LOCAL = "local"        # file calls on this host (or a mount every node sees)
HDFS = "hdfs"          # WebHdfsStore, at the namenode's HTTP address the configuration gives
WEBHDFS = "webhdfs"    # WebHdfsStore, at the host:port the URI names
S3 = "s3"              # S3Store

LOCAL_SCHEME = "file"

#: Each scheme the sink reaches -> what it names, in the order messages list them. A scheme
#: not here is a filesystem no store reaches. Read on every call, never copied: the protocol
#: simulation adds its ``simstore`` here (tests/sim/patches.py).
SCHEMES: dict[str, str] = {
    LOCAL_SCHEME: LOCAL,
    "hdfs": HDFS,
    "webhdfs": WEBHDFS,
    "s3": S3,
    "s3a": S3,
}

# Hadoop's Path: a scheme is what comes before the first ':' when no '/' comes earlier.
_HADOOP_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def kind_of(scheme: str | None) -> str | None:
    """What ``scheme`` names (:data:`LOCAL`, :data:`HDFS`, ...): no scheme is local; None for
    a scheme no store reaches."""
    return SCHEMES.get(scheme.lower()) if scheme else LOCAL


def is_local_scheme(scheme: str | None) -> bool:
    """``scheme`` is none at all, or the local filesystem's (``file``)."""
    return kind_of(scheme) == LOCAL


def is_store_scheme(scheme: str) -> bool:
    """``scheme`` names a store :func:`wal.stores.open_store` reaches (not the local one)."""
    return kind_of(scheme) not in (None, LOCAL)


def split(uri: str) -> tuple[str | None, str, str]:
    """(scheme or None, authority, path) as Hadoop's Path parses a string: the scheme
    lowercased; a single letter is a Windows drive, not a scheme."""
    match = _HADOOP_SCHEME.match(uri)
    if match is None or len(match.group(1)) == 1:
        return None, "", uri
    rest = uri[match.end():]
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        return match.group(1).lower(), authority, slash + path
    return match.group(1).lower(), "", rest


def uri_scheme(location: str) -> str | None:
    """The scheme of ``location`` written as ``scheme://...`` (as given, maybe empty); None
    when it has no ``://`` or a ``/`` comes before it."""
    head, sep, _ = location.partition("://")
    return head if sep and "/" not in head else None


def is_local(location: str) -> bool:
    """``location`` names no scheme but ``file:`` (a path an operator typed, or Spark's
    resolved ``file:/...``), as Hadoop's Path parses it."""
    return is_local_scheme(split(location.strip())[0])


def is_remote(location: str) -> bool:
    """``location`` names a filesystem (``scheme://``) other than the local one: a store's
    URI, or one no store reaches (opening it says so)."""
    scheme = uri_scheme(location)
    return scheme is not None and not is_local_scheme(scheme)


def store_schemes_text(suffix: str = "://") -> str:
    """The stores' schemes for a message: ``hdfs://, webhdfs://, s3:// or s3a://``."""
    names = [f"{scheme}{suffix}" for scheme in SCHEMES if is_store_scheme(scheme)]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)
