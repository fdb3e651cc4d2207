"""The location schemes have one owner, ``wal/schemes.py`` (issue 36).

Which schemes exist and what each names (``file:`` or none: local; ``hdfs``, ``webhdfs``,
``s3``, ``s3a``: a store) was written in four places: ``sinks/worker/plan.py`` and its message,
``wal/stores.py`` twice, ``wal.remote.is_remote``, ``wal.checkpoint.is_local``; a store added
in one would have been refused, or opened, or called local, in another. Now the table is
``wal.schemes.SCHEMES`` and everything asks it. This test reads the source of ``wal``,
``recovery`` and ``sinks`` and finds a second spelled-out copy: a string that is a scheme's
name (``"s3a"``) or names one (``"hdfs://"``, ``"file:"``), outside docstrings and the owner, or
a second definition of its helpers. Spark's configuration keys (``fs.s3a.endpoint``), prose
(``HDFS``, ``S3``, ``WebHDFS``) and boto3's service name (``boto3.client("s3")``) are not
schemes and are not found; the few legitimate mentions
left are :data:`ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.planted_tree import PACKAGES, parsed_modules, plant
from wal import schemes
from wal.checkpoint import Filesystems, NotLocal
from wal.schemes import (
    HDFS,
    LOCAL,
    S3,
    SCHEMES,
    WEBHDFS,
    is_local,
    is_remote,
    is_store_scheme,
    kind_of,
    store_schemes_text,
)
from wal.stores import StoreAccess, open_store

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
OWNER = "wal/schemes.py"
#: The helpers that read the table: defined in the owner only.
HELPERS = {"kind_of", "is_local_scheme", "is_store_scheme", "is_local", "is_remote",
           "uri_scheme", "store_schemes_text"}

#: (module, mention) -> why it may spell a scheme out.
ALLOWED = {
    ("wal/s3.py", "s3://"): "S3Store names itself: its uri, and the bucket in its errors",
    ("wal/webhdfs.py", "webhdfs://"): "WebHdfsStore names itself: its uri",
    ("recovery/cli/recover_cmd.py", "hdfs://nn:8020/wal"): "an example command in the help",
    ("recovery/cli/recover_cmd.py", "hdfs://nn:8020/cp"): "an example command in the help",
}


def _mention_pattern(names) -> re.Pattern:
    """A scheme written as one (``hdfs:``, ``s3a://bucket``), not inside a longer word or a
    configuration key (``fs.s3a.endpoint``); the mention runs to the next space or quote."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(r"(?<![\w.+-])(?:" + alternatives + r"):[^\s'\"`()]*")


def _not_schemes(tree: ast.AST) -> set[int]:
    """The strings that are no location: docstrings, and a service's name in a client
    factory's call (``boto3.client("s3")``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            found.add(id(node.body[0].value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "client" and node.args:
            found.add(id(node.args[0]))
    return found


def mentions(root: Path, names=tuple(SCHEMES)) -> list[tuple[str, int, str]]:
    """(path, line, what) of each place under ``root``'s packages, but the owner, that spells
    out a scheme of ``names`` (``'hdfs'``, ``'s3a://'``) or defines a helper of the table."""
    pattern = _mention_pattern(names)
    found = []
    for rel, tree in parsed_modules(root):
        if rel == OWNER:
            continue
        skipped = _not_schemes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.name in HELPERS:
                found.append((rel, node.lineno, f"def {node.name}"))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in skipped:
                text = node.value
                found += [(rel, node.lineno, mention) for mention in
                          ([text.strip()] if text.strip() in names else [])
                          + pattern.findall(text)]
    return found


def copies(root: Path) -> list[str]:
    """Each mention under ``root`` that :data:`ALLOWED` does not excuse, as ``path:line: what``."""
    return [f"{rel}:{line}: {what!r} (wal.schemes has it)"
            for rel, line, what in mentions(root) if (rel, what) not in ALLOWED]


def test_the_schemes_are_spelled_out_in_wal_schemes_only():
    assert copies(REPO) == []


def test_every_allowed_mention_is_still_there():
    """An allowance whose mention went away is removed, so that it cannot excuse a new one."""
    assert set(ALLOWED) <= {(rel, what) for rel, _line, what in mentions(REPO)}


@pytest.mark.parametrize("module, planted, caught", [
    ("sinks/worker/plan.py", 'STORES = ("hdfs", "s3a")', "'hdfs'"),
    ("wal/remote.py", 'def is_remote(location):\n    return location.startswith("s3a://")',
     "def is_remote"),
    ("wal/remote.py", 'def remote(location):\n    return location.startswith("s3a://")',
     "'s3a://'"),
    ("recovery/cli/inspect_cmd.py", 'HINT = "a local folder, hdfs:// or s3a://"', "'hdfs://'"),
    ("wal/checkpoint.py", 'LOCAL = "file"', "'file'"),
    ("sinks/worker/option_values.py", 'def f(p):\n    return p.removeprefix(f"file://{p}")',
     "'file://'"),
    ("wal/stores.py", 'WEB = "webhdfs"', "'webhdfs'"),
    ("wal/stores.py", 'def f(scheme):\n    return scheme in ("s3", "s3a")', "'s3'"),
])
def test_a_second_copy_of_the_schemes_is_found(tmp_path, module, planted, caught):
    found = copies(plant(tmp_path, PACKAGES, module, planted))
    assert found and all(f.startswith(f"{module}:") for f in found)
    assert any(caught in f for f in found), found


def test_docstrings_configuration_keys_and_prose_are_not_copies(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "wal" / "stores.py").write_text(
        '"""Opens hdfs://, webhdfs://, s3:// and s3a:// locations."""\n'
        'KEY = "fs.s3a.endpoint"\nS3 = boto3.client("s3", region_name="x")\n'
        'def f():\n    """A file: URI."""\n    return "on HDFS or S3: WebHDFS"\n')
    (tmp_path / "wal" / "schemes.py").write_text('SCHEMES = {"hdfs": "hdfs"}\n')
    assert copies(tmp_path) == []


# -- the table's meaning, as each old copy had it ---------------------------------------------

def test_the_table():
    assert SCHEMES == {"file": LOCAL, "hdfs": HDFS, "webhdfs": WEBHDFS, "s3": S3, "s3a": S3}
    assert [s for s in SCHEMES if is_store_scheme(s)] == ["hdfs", "webhdfs", "s3", "s3a"]
    assert is_store_scheme("S3A") and not is_store_scheme("file") and not is_store_scheme("")
    assert not is_store_scheme("gs") and kind_of("gs") is None and kind_of(None) == LOCAL
    assert store_schemes_text() == "hdfs://, webhdfs://, s3:// or s3a://"


@pytest.mark.parametrize("location, local, remote", [
    ("/data/wal", True, False),
    ("data/wal", True, False),
    ("file:/data/wal", True, False),
    ("file:///data/wal", True, False),
    ("FILE:///data/wal", True, False),
    ("C:/data/wal", True, False),              # a Windows drive, as Hadoop's Path reads it
    ("hdfs://nn:8020/cp", False, True),
    ("HDFS://nn:8020/cp", False, True),
    ("s3a://bucket/wal", False, True),
    ("gs://bucket/wal", False, True),          # no store reaches it: opening it says so
    ("hdfs:/cp", False, False),                # a scheme, but no authority to reach
    ("/data/x://y", True, False),
    ("://x", True, False),                     # no scheme to Hadoop; no store's either
])
def test_local_and_remote(location, local, remote):
    assert (is_local(location), is_remote(location)) == (local, remote)


def test_each_scheme_opens_the_store_the_table_names(monkeypatch):
    monkeypatch.delenv("CASSANDRA_WAL_WEBHDFS", raising=False)
    assert open_store("file:/data/wal").root == "/data/wal"
    assert type(open_store("webhdfs://h:1/w")).__name__ == "WebHdfsStore"
    assert open_store("hdfs://nn:8020/w").base == "http://nn:9870"
    for scheme in ("s3", "s3a", "S3A"):
        assert type(open_store(f"{scheme}://b/w", s3_client=object())).__name__ == "S3Store"
    with pytest.raises(ValueError, match=r"'gs' \(supported: a local path, file:, hdfs:, "
                                         r"webhdfs:, s3:, s3a:\)"):
        open_store("gs://b/w")


def test_what_reaching_a_store_takes_follows_its_kind():
    access = StoreAccess(webhdfs=(("*", "http://nn:9870"),), s3_region="eu-west-1")
    assert access.for_uri("webhdfs://h:1/w") == access.for_uri("hdfs://nn/w") == \
        StoreAccess(webhdfs=access.webhdfs)
    assert access.for_uri("s3://b/w") == access.for_uri("s3a://b/w") == \
        StoreAccess(s3_region="eu-west-1")
    assert access.for_uri("/data/w") == access.for_uri("gs://b/w") == StoreAccess()
    conf = {"dfs.namenode.http-address": "0.0.0.0:9870"}.get
    assert StoreAccess.of_hadoop_conf(conf, "HDFS://nn:8020").webhdfs == \
        (("nn:8020", "http://127.0.0.1:9870"),)
    assert StoreAccess.of_hadoop_conf(conf, "webhdfs://nn:8020").webhdfs[0][0] == "*"
    assert StoreAccess.of_hadoop_conf(conf, "file:///").webhdfs[0][0] == "*"


def test_a_scheme_added_to_the_table_is_a_store_everywhere(monkeypatch):
    """What the simulation does with its ``simstore``: one entry, and the sink accepts the
    new store's locations, calls them remote and lists it where it lists the stores."""
    from recovery.cql.errors import OptionError
    from sinks.worker.plan import resolve_location

    with pytest.raises(OptionError, match="s3a:// "):
        resolve_location("wal.path", "memfs://x/w")
    monkeypatch.setitem(schemes.SCHEMES, "memfs", "memfs")
    assert resolve_location("wal.path", "memfs://x/w") == "memfs://x/w"
    assert is_store_scheme("MEMFS") and is_remote("memfs://x/cp")
    assert store_schemes_text().endswith("s3a:// or memfs://")
    with pytest.raises(NotLocal):
        Filesystems().local_path("memfs://x/cp")
