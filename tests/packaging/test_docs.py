"""The docs stay complete: the Python API page names every public name, and every relative
link in the README and docs/ points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import dpsql

ROOT = Path(__file__).resolve().parents[2]


def test_python_api_page_names_every_public_name() -> None:
    page = (ROOT / "docs" / "python-api.md").read_text()
    missing = [name for name in dpsql.__all__ if not re.search(rf"\b{name}\b", page)]
    assert not missing, f"docs/python-api.md does not mention {missing}"


def test_relative_links_resolve() -> None:
    broken = []
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken
