"""``cassandra-wal --version``: the installed distribution's version.

Here the version comes from the dev venv's editable install; the installed wheel's console
script in a clean venv is checked by ``tests/integration/test_wheel.py``.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recovery.cli import main as cli_main
from recovery.cli.main import DISTRIBUTION, main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def pyproject_field(name: str) -> str:
    """``[project] name = "..."`` from pyproject.toml (tomllib is 3.11+; the project runs on 3.10)."""
    project = REPO.joinpath("pyproject.toml").read_text().split("[project]", 1)[1]
    return re.search(rf'^{name}\s*=\s*"([^"]+)"', project, re.M).group(1)


def test_the_distribution_name_is_the_one_pyproject_declares():
    assert DISTRIBUTION == pyproject_field("name")


def test_version_prints_the_installed_version_and_exits_0(capsys):
    code = main(["--version"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out == f"cassandra-wal {importlib.metadata.version(DISTRIBUTION)}\n"
    # The dev venv is an editable install of this tree (scripts/bootstrap reinstalls it when
    # pyproject.toml changes), so the version printed is the tree's.
    assert out == f"cassandra-wal {pyproject_field('version')}\n"


def test_version_needs_no_command(capsys):
    """``COMMAND`` is required, but ``--version`` alone is not a usage error (exit 2)."""
    assert main(["--version"]) == 0
    assert main([]) == 2


def test_not_installed_says_so_instead_of_failing(capsys, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli_main, "installed_version", not_installed)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == "cassandra-wal unknown (not installed)\n"


def test_help_lists_version(capsys):
    assert main(["--help"]) == 0
    assert "--version" in capsys.readouterr().out


def test_console_script_prints_the_version():
    """What a shell sees, through the installed entry point of this venv."""
    script = Path(sys.executable).with_name("cassandra-wal")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"cassandra-wal {importlib.metadata.version(DISTRIBUTION)}\n"
