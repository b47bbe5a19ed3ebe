"""``make deb PG_CONFIG=...``: the Debian package ``postgresql-<major>-dpsql`` for the
PostgreSQL that ``pg_config`` names, into ``dist/``.

The extension is compiled against that PostgreSQL's headers (Debian's, or the embedded 16/18:
one major's headers give one major's ABI) and laid out as Debian's PostgreSQL packages are
(``/usr/lib/postgresql/<major>/lib``, ``/usr/share/postgresql/<major>/extension``), whatever
the build tree's own paths; the package Depends on ``postgresql-<major>``. The accountant
(Python) is not in it: see docs/install.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

from distribution.sources import ROOT, copy_tracked
from dpsql.extension import control_default_version

DESCRIPTION = """\
Description: differentially private machine learning inside PostgreSQL {major}
 dpsql trains differentially private models in the database: SGD epochs as C
 aggregates, private SGD (bolt-on and white-box), DP linear regression, private
 ERM, and a privacy budget enforced by the database. This package holds the
 extension for PostgreSQL {major}; its accountant runs from the Python package
 (the dpsql wheel, installed with pip; then dpsql configure-accountant).
"""


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed (exit {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-3000:]}"
        )
    return result.stdout


def major_of(pg_config: Path) -> int:
    """The PostgreSQL major version ``pg_config`` builds for ("PostgreSQL 15.20 (Debian...)")."""
    text = _run([str(pg_config), "--version"])
    match = re.match(r"PostgreSQL (\d+)", text)
    if match is None:
        raise RuntimeError(f"{pg_config} --version: {text.strip()!r} names no PostgreSQL major")
    return int(match.group(1))


def _install_tree(pg_config: Path, major: int, work: Path) -> Path:
    """Build in a private copy of the sources and install under ``work/root`` at Debian's paths."""
    copy_tracked(work / "src", "sql", "core")
    sql = work / "src" / "sql"
    root = work / "root"
    paths = [f"pkglibdir=/usr/lib/postgresql/{major}/lib", f"datadir=/usr/share/postgresql/{major}"]
    # rpath=: no run path into the build tree (an embedded PostgreSQL's lib/)
    make = ["make", "-C", str(sql), f"PG_CONFIG={pg_config}", "rpath=", *paths]
    _run([*make, f"-j{os.cpu_count() or 1}"])
    _run([*make, "install", f"DESTDIR={root}"])
    library = root / f"usr/lib/postgresql/{major}/lib/dpsql.so"
    _run(["strip", "--strip-unneeded", str(library)])
    if "PATH" in _run(["readelf", "-d", str(library)]):
        raise RuntimeError(f"{library} has a run path: it would load libraries from the build tree")
    return root


def _require_headers(pg_config: Path, major: int) -> None:
    """A clear refusal before any compiler runs (issue 42: a traceback and a gcc error)."""
    headers = Path(_run([str(pg_config), "--includedir-server"]).strip())
    if not (headers / "postgres.h").exists():
        raise SystemExit(
            f"make deb: PostgreSQL {major}'s server headers are missing ({headers}/postgres.h):"
            f" install them first, e.g. `sudo apt-get install postgresql-server-dev-{major}`"
            " (docs/install.md)"
        )


def build(pg_config: Path, out_dir: Path) -> Path:
    """Build ``postgresql-<major>-dpsql_<version>-1_<arch>.deb`` into ``out_dir``; its path."""
    major = major_of(pg_config)
    _require_headers(pg_config, major)
    version = f"{control_default_version()}-1"
    package = f"postgresql-{major}-dpsql"
    arch = _run(["dpkg", "--print-architecture"]).strip()
    work = ROOT / "build" / "deb" / f"pg{major}"
    shutil.rmtree(work, ignore_errors=True)
    root = _install_tree(pg_config, major, work)
    doc = root / "usr" / "share" / "doc" / package
    doc.mkdir(parents=True)
    shutil.copy2(ROOT / "LICENSE", doc / "copyright")
    size_kb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) // 1024 + 1
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\n"
        f"Maintainer: dpsql maintainers <maintainers@dpsql.invalid>\n"
        f"Depends: postgresql-{major}\nSection: database\nPriority: optional\n"
        f"Installed-Size: {size_kb}\n" + DESCRIPTION.format(major=major),
        encoding="utf-8",
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{package}_{version}_{arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(path)])
    return path


def at_hand() -> list[Path]:
    """Every PostgreSQL to build for: Debian's with server headers, then the embedded 16 and 18
    of majors Debian does not have here."""
    found = {
        major_of(p): p
        for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_config"))
        if Path(f"/usr/include/postgresql/{p.parts[-3]}/server/postgres.h").exists()
    }
    from dpsql import server

    for version in server.SUPPORTED_PG_VERSIONS:
        found.setdefault(version, server.pg_config_path(version))
    return [found[major] for major in sorted(found)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-config", type=Path, help="its pg_config (default: all at hand)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output directory")
    args = parser.parse_args()
    for pg_config in [args.pg_config] if args.pg_config else at_hand():
        print(build(pg_config, args.out))


if __name__ == "__main__":
    main()
