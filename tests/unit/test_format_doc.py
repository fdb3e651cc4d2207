"""``wal/FORMAT.md`` is the WAL's on-disk layout on one page: every file, folder and log key
the code writes (the constants of ``wal/format.py``, where each is defined once) is on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from wal import format as fmt

pytestmark = pytest.mark.unit

PAGE = Path(fmt.__file__).with_name("FORMAT.md")


def _layout_names(module) -> dict[str, str]:
    """The constants naming a file, folder, suffix or log key, by constant name."""
    out = {}
    for name, value in vars(module).items():
        if name.endswith(("_FILE", "_DIR", "_SUFFIX")) or name.startswith("KEY_"):
            out[name] = value.decode() if isinstance(value, bytes) else value
    return out


def test_every_file_folder_and_log_key_the_code_writes_is_on_the_page():
    page = PAGE.read_text()
    names = _layout_names(fmt)
    assert len(names) >= 20           # the page's subject, not an empty module
    missing = {name: value for name, value in names.items() if value not in page}
    assert missing == {}


def test_a_name_missing_from_the_page_is_found():
    fake = type("fake_format", (), {"NEW_FILE": "never-documented.bin", "KEY_X": b"x/never"})
    names = _layout_names(fake)
    page = PAGE.read_text()
    assert {n for n, v in names.items() if v not in page} == {"NEW_FILE", "KEY_X"}
