"""One word, one thing (``docs/architecture.md``, "Words"): the names that gave a word a second
meaning do not come back. Identifiers only, read from the syntax trees of the packages; the
prose follows by review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.planted_tree import parsed_modules

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
#: Identifiers of libraries that are what they are.
LIBRARY_NAMES = {"floor_divide"}
A_WAL_LOG = re.compile(r"^['\"]?WalLog( \| None)?['\"]?$")


def _identifiers(tree: ast.AST):
    """``(name, node)`` of every name the code gives or uses."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node
        elif isinstance(node, ast.arg):
            yield node.arg, node
        elif isinstance(node, ast.Name):
            yield node.id, node
        elif isinstance(node, ast.Attribute):
            yield node.attr, node
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg, node


def _offending(predicate) -> list[str]:
    return sorted({f"{path}:{node.lineno}: {name}" for path, tree in parsed_modules(REPO)
                   for name, node in _identifiers(tree) if predicate(name, node)})


def test_floor_is_a_layer_only():
    """The table's last write timestamp is ``TableTimestamps``, the oldest PySpark supported
    is called that: no name of the code says floor."""
    assert _offending(lambda name, _: "floor" in name.lower()
                      and name not in LIBRARY_NAMES) == []


def test_a_wal_log_is_held_in_a_wal_log():
    """``log`` is the Python logger: a parameter given a ``WalLog`` is named ``wal_log``."""
    def wal_log_named_otherwise(name, node):
        return (isinstance(node, ast.arg) and node.annotation is not None
                and A_WAL_LOG.match(ast.unparse(node.annotation)) and name != "wal_log")
    assert _offending(wal_log_named_otherwise) == []
    loggers = _offending(lambda name, node: name == "log" and isinstance(node, ast.arg))
    assert loggers == [], "a parameter named log: the logger is module-level"


def test_the_cassandra_client_is_cassandra_driver_in_names():
    """``driver`` alone is the Spark driver process (and the flush mode named after it): a
    name for the Cassandra client says ``cassandra_driver`` or what it is (its CQL types,
    its table metadata)."""
    client = re.compile(r"(?<!cassandra_)driver_(types?|errors|metadata|session|cluster)")
    assert _offending(lambda name, _: bool(client.search(name.lower()))) == []
