"""What tests share about the Cassandra node: the node script as a module, JDK 17 for Spark,
and throwaway keyspaces."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import uuid
from pathlib import Path

NODE_MODULE = Path(__file__).resolve().parents[2] / "scripts" / "cassandra_node.py"


def load_cassandra_node_module():
    """Import scripts/cassandra_node.py (stdlib only) as module ``cassandra_node``, once."""
    if "cassandra_node" in sys.modules:
        return sys.modules["cassandra_node"]
    spec = importlib.util.spec_from_file_location("cassandra_node", NODE_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cassandra_node"] = module
    spec.loader.exec_module(module)
    return module


def java_home_env() -> dict:
    """``{"JAVA_HOME": <JDK 17>}`` found the way the node script finds one; ``{}`` if none
    (pyspark then finds ``java`` on the PATH itself)."""
    try:
        return {"JAVA_HOME": str(load_cassandra_node_module().find_java_home())}
    except Exception:  # noqa: BLE001 - see docstring
        return {}


@contextlib.contextmanager
def fresh_keyspace(cql, prefix: str = "t"):
    """A new SimpleStrategy RF 1 keyspace named ``<prefix>_<random>``, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    cql.execute(f"CREATE KEYSPACE {name} WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    try:
        yield name
    finally:
        cql.execute(f"DROP KEYSPACE IF EXISTS {name}")
