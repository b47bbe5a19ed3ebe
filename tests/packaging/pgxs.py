"""PGXS builds of the extension in private copies of the sources (the packaging tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_sources(where: Path) -> Path:
    """A private copy of sql/ and core/ without build products (the checkout's objects belong to
    the installed build): where/sql."""
    ignore = shutil.ignore_patterns("*.o", "*.so", "*.bc", "build", ".pg_build_id")
    shutil.copytree(REPO / "sql", where / "sql", ignore=ignore)
    shutil.copytree(REPO / "core", where / "core", ignore=ignore)
    return where / "sql"


def make(sql: Path, pg_config: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(sql), "-j2", f"PG_CONFIG={pg_config}", *targets],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def copy_built(sql: Path, where: Path) -> Path:
    """A copy of a built tree (sql/ beside its core/), objects and build stamp as they are
    (copy2 keeps their times, so make sees the tree as the build left it): where/sql."""
    shutil.copytree(sql, where / "sql", symlinks=True)
    shutil.copytree(sql.parent / "core", where / "core", symlinks=True)
    return where / "sql"
