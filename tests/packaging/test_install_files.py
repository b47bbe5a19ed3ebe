"""The install files (sql/install/*.sql): the install script is their concatenation in file-name
order (sql/Makefile), one number per file, so that the order is the one the numbers say and never
the names' tie-break; and every refusal goes through the one error helper, _fail."""

from __future__ import annotations

import collections
from pathlib import Path

INSTALL = Path(__file__).resolve().parents[2] / "sql" / "install"


def test_install_files_have_distinct_numbers() -> None:
    by_number = collections.defaultdict(list)
    for path in INSTALL.glob("*.sql"):
        number, _, _ = path.name.partition("_")
        assert number.isdigit(), path.name
        by_number[number].append(path.name)
    shared = {n: names for n, names in by_number.items() if len(names) > 1}
    assert not shared, shared


def test_refusals_go_through_fail() -> None:
    # One error helper (05_errors.sql): a RAISE EXCEPTION stays only with a comment, just above
    # it, saying why _fail cannot serve there.
    unexplained = []
    for path in sorted(INSTALL.glob("*.sql")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "RAISE EXCEPTION" in line.upper() and not line.lstrip().startswith("--"):
                above = " ".join(lines[max(0, i - 3) : i])
                if "not _fail" not in above:
                    unexplained.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not unexplained, "\n".join(unexplained)


def test_the_docker_image_keeps_the_worker_reserve() -> None:
    # One rule (dpsql/server.py WORKER_RESERVE), written out in the Dockerfile's shell: the two
    # must say the same (issue 41, route 2).
    from dpsql.server import WORKER_RESERVE

    dockerfile = (INSTALL.parents[1] / "docker" / "Dockerfile").read_text(encoding="utf-8")
    for name, value in WORKER_RESERVE.items():
        assert f"{name} = {value}" in dockerfile, name


def test_make_deb_without_server_headers_says_which_package(tmp_path) -> None:
    # Issue 42: a traceback and a gcc error. A pg_config whose headers are missing.
    import stat
    import subprocess
    import sys

    fake = tmp_path / "pg_config"
    fake.write_text(
        "#!/bin/sh\ncase \"$1\" in --version) echo 'PostgreSQL 15.9';;"
        f" --includedir-server) echo '{tmp_path}/none';; esac\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(
        [sys.executable, "-m", "distribution.deb", "--pg-config", str(fake), "--out",
         str(tmp_path / "dist")],
        capture_output=True, text=True, check=False, cwd=INSTALL.parents[1], timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "postgresql-server-dev-15" in out.stderr
