"""What a source check reads, and a copy of the packages' layout with one module planted in
it: how such a check (a seam gone around, a second copy of a fact, a word given a second
meaning) reads every module, and shows it catches what it is for."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

PACKAGES = ("wal", "recovery", "sinks")


def parsed_modules(root: Path, packages: Iterable[str] = PACKAGES
                   ) -> Iterator[tuple[str, ast.Module]]:
    """Each module of ``packages`` under ``root``, in order: its path relative to ``root``
    (``wal/seal.py``) and its syntax tree."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            yield rel, ast.parse(path.read_text(encoding="utf-8"), rel)


def plant(root: Path, packages: Iterable[str], module: str, source: str) -> Path:
    """Empty folders for ``packages`` under ``root``, and ``module`` (a path relative to it)
    holding ``source``; ``root``."""
    for package in packages:
        (root / package).mkdir(exist_ok=True)
    path = root / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + "\n")
    return root
