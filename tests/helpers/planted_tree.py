"""A copy of the packages' layout with one module planted in it: how a source check (a seam
gone around, a second copy of a fact) shows it catches what it is for."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def plant(root: Path, packages: Iterable[str], module: str, source: str) -> Path:
    """Empty folders for ``packages`` under ``root``, and ``module`` (a path relative to it)
    holding ``source``; ``root``."""
    for package in packages:
        (root / package).mkdir(exist_ok=True)
    path = root / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + "\n")
    return root
