"""Network odds and ends of the tests: the servers' scripts own how a free port is found."""

from __future__ import annotations

from tests.helpers.node import load_script_module


def free_port(exclude: tuple[int, ...] = ()) -> int:
    """A TCP port free on 127.0.0.1 now (``scripts/local_server.py``'s pick)."""
    return load_script_module("local_server").free_port(exclude)
