"""The release metadata agree: control file, META.json (PGXN), pyproject, the Python package,
the CHANGELOG (every released version and the current one) and the LICENSE pyproject names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dpsql
from dpsql import extension

ROOT = Path(__file__).resolve().parents[2]


def _pyproject(key: str) -> str:
    """A top-level string of pyproject's [project] table (tomllib is Python 3.11+)."""
    match = re.search(
        rf'^{key}\s*=\s*(?:\{{\s*text\s*=\s*)?"([^"]+)"',
        (ROOT / "pyproject.toml").read_text(),
        re.M,
    )
    assert match, key
    return match.group(1)


def _control_version() -> str:
    text = (ROOT / "sql" / "dpsql.control").read_text()
    match = re.search(r"default_version\s*=\s*'([^']+)'", text)
    assert match
    return match.group(1)


def test_one_version_everywhere() -> None:
    version = _control_version()
    meta = json.loads((ROOT / "META.json").read_text())
    assert meta["version"] == meta["provides"]["dpsql"]["version"] == version
    assert meta["provides"]["dpsql"]["file"] == "sql/dpsql.control"  # in the PGXN zip
    assert _pyproject("version") == dpsql.__version__ == version


def test_changelog_lists_every_released_version() -> None:
    released = set(extension.released_versions())
    listed = set(re.findall(r"^## (\d+\.\d+\.\d+) ", (ROOT / "CHANGELOG.md").read_text(), re.M))
    assert listed == released | {_control_version()}


def test_license_is_the_declared_one() -> None:
    assert _pyproject("license") == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert json.loads((ROOT / "META.json").read_text())["license"] == "apache_2_0"
