"""The Python package as users get it: `python -m build` makes an sdist and, from it, a wheel;
the wheel installs into a fresh virtualenv away from the repository, imports its C core, and
its `dpsql install-extension --pg-config ...` builds the extension from the sources it carries
(dpsql/_ext) and installs it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from dpsql import extension, server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("DPSQL_DIST_DIR"):  # what `make dist` built (test_dist.py's too)
        return Path(os.environ["DPSQL_DIST_DIR"])
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build requirements (setuptools, Cython, numpy) are this environment's
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_sdist_carries_the_sources(dists: Path) -> None:
    (sdist,) = dists.glob("dpsql-*.tar.gz")
    names = subprocess.run(
        ["tar", "tzf", str(sdist)], capture_output=True, text=True, check=True
    ).stdout.split()
    top = names[0].split("/")[0]
    for needed in ("sql/Makefile", "sql/dpsql.control", "sql/install/54_api.sql",
                   "sql/upgrade/0.1.0--0.2.0.sql", "core/sgd.c", "cython_ext/_core.pyx",
                   "LICENSE", "CHANGELOG.md", "META.json", "setup.py"):  # fmt: skip
        assert f"{top}/{needed}" in names, needed
    assert not any(n.endswith((".o", ".so", ".pg_build_id")) for n in names)


def test_the_wheel_installs_away_from_the_repo_and_installs_the_extension(
    dists: Path, tmp_path: Path
) -> None:
    (wheel,) = dists.glob("dpsql-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # the dependencies come from this environment (no download), as a plain path: its .pth
    # files (the editable install of the checkout) are not run
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", where], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(purelib),
         str(wheel)],
        check=True,
    )  # fmt: skip
    probe = subprocess.run(
        [str(python), "-c", "import dpsql, dpsql._core, dpsql.extension as e;"
         " print(dpsql.__file__); print(e.source_dir())"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert probe[0].startswith(str(purelib)), probe
    assert probe[1] == str(purelib / "dpsql" / "_ext" / "sql")
    # the C core beside sql/, as in the checkout (sql/Makefile's CORE_DIR = ../core)
    assert (purelib / "dpsql" / "_ext" / "core" / "sgd.c").is_file()
    assert (purelib / "dpsql" / "_ext" / "core" / "sgd.h").is_file()
    # `dpsql install-extension` from the installed package, into the embedded PostgreSQL
    result = subprocess.run(
        [str(python), "-m", "dpsql.cli", "install-extension", "--pg-config",
         str(server.pg_config_path())],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # built in the package's copy for that PostgreSQL (dpsql/extension.py, _build_tree)
    (built,) = (purelib / "dpsql" / "_ext" / "sql" / "build").glob("*/sql")
    assert (built / "dpsql.so").is_file()
    # the upgrade scripts too, from the prologues the wheel carries (no git history there)
    current = extension.control_default_version()
    for version in extension.released_versions():
        assert (built / f"dpsql--{version}--{current}.sql").is_file(), version
