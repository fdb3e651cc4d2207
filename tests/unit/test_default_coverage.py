"""The default run's coverage is the one ``docs/testing.md`` lists ("What the default run
reaches"): a change that trims the suite (issue 33) must keep every crash point, storage and
flush mode the README's test command reaches, or say in that list what it drops."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers.matrix import ENV

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
PATHS = ("tests/crash", "tests/cluster", "tests/integration/test_sink_stores.py",
         "tests/integration/test_sink_s3.py", "tests/integration/test_spark_connect.py",
         "tests/integration/test_cassandra_cluster.py", "tests/integration/test_outage.py")


def documented() -> list[str]:
    text = (REPO / "docs" / "testing.md").read_text()
    section = text.split("### What the default run reaches", 1)[1]
    return re.search(r"```text\n(.*?)\n```", section, re.S).group(1).split("\n")


def collected() -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "CASSANDRA_WAL_CRASH_SEEDS")}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", "not full_matrix", *PATHS],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_default_run_reaches_what_docs_testing_lists():
    listed, run = documented(), collected()
    assert run == listed, (
        f"the default run differs from docs/testing.md's list: not run any more "
        f"{sorted(set(listed) - set(run))}, new {sorted(set(run) - set(listed))}")
