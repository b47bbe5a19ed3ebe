"""The files a distribution of the extension carries: the checkout's tracked files (what
``git archive`` would pack), read from the working tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tracked(*folders: str) -> list[Path]:
    """Tracked files under ``folders`` (relative to the checkout), sorted.

    Raises
    ------
    RuntimeError
        If this is not a git checkout (a distribution is built from one).
    """
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--", *folders],
            capture_output=True, check=True, text=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(f"distributions are built from a git checkout ({ROOT}): {err}") from err
    return sorted(Path(name) for name in out.split("\0") if name)


def copy_tracked(target: Path, *folders: str) -> None:
    """Copy the tracked files under ``folders`` into ``target`` (same relative paths)."""
    for name in tracked(*folders):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
