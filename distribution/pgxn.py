"""``make dist``: the PGXN zip, ``dist/dpsql-<version>.zip``.

Everything under one top directory ``dpsql-<version>/``, as PGXN wants: META.json, the docs, the
extension's sources (sql/, core/) and a top-level Makefile (pgxn.mk) that builds sql/ with PGXS,
so that ``pgxn install dpsql`` (or ``make && make install`` in the unpacked zip) works.
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path

from distribution.sources import ROOT, tracked
from dpsql.extension import control_default_version

TOP_FILES = ("META.json", "README.md", "LICENSE", "CHANGELOG.md")


def build(out_dir: Path) -> Path:
    """Write the zip into ``out_dir`` and return its path."""
    version = control_default_version()
    meta = json.loads((ROOT / "META.json").read_text(encoding="utf-8"))
    if meta["version"] != version:
        raise RuntimeError(f"META.json says {meta['version']}, sql/dpsql.control {version}")
    top = f"dpsql-{version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{top}.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in [Path(f) for f in TOP_FILES] + tracked("sql", "core"):
            archive.write(ROOT / name, f"{top}/{name}")
        archive.write(Path(__file__).with_name("pgxn.mk"), f"{top}/Makefile")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output directory")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
